#include "kernels/reduce.hpp"

#include <cstring>

#include "kernels/dispatch.hpp"
#if CHORUS_KERNELS_X86
#include <cpuid.h>
#endif
#include "kernels/dtype.hpp"

namespace chorus::kernels {

#if CHORUS_KERNELS_X86
namespace {
// F16C from CPUID leaf 1 (ECX bit 29): clang before 16 rejects
// __builtin_cpu_supports("f16c"), and the fuzz build compiles with clang.
bool hasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
}  // namespace
#endif

const KernelTable* kernelTable(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Generic: return &isa_generic::table();
#if CHORUS_KERNELS_X86
    case KernelIsa::Avx2:
      __builtin_cpu_init();
      if (__builtin_cpu_supports("avx2") && hasF16c()) return &isa_avx2::table();
      return nullptr;
    case KernelIsa::Avx512:
      // libgcc's probe also checks that the OS saves the zmm state (XCR0).
      __builtin_cpu_init();
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
          hasF16c()) {
        return &isa_avx512::table();
      }
      return nullptr;
#endif
    default: return nullptr;
  }
}

const KernelTable& activeKernels() {
  // Function-local, initialised once (thread-safe) and never changed.
  static const KernelTable* const kActive = [] {
    for (KernelIsa isa : {KernelIsa::Avx512, KernelIsa::Avx2}) {
      if (const KernelTable* t = kernelTable(isa)) return t;
    }
    return &isa_generic::table();
  }();
  return *kActive;
}

Reducer::Reducer(chorusDataType_t dtype, BinOp op) : dtype_(dtype), op_(op) {
  const auto opIndex = static_cast<size_t>(op);
  if (!isValidDtype(dtype) || opIndex >= static_cast<size_t>(kNumBinOps)) return;  // valid() == false
  fn_ = activeKernels().reduce[dtype][opIndex];
  elem_size_ = dtypeSize(dtype);
}

void scale(void* dst, const void* src, size_t count, chorusDataType_t dtype, const Scalar& s) {
  if (!isValidDtype(dtype) || count == 0) return;
  // The kernel wants the scalar as one element of `dtype`; convert if the
  // caller gave another type (via double: exact for every scalar of a
  // narrower type, and for integers up to 2^53).
  alignas(8) unsigned char same[8];
  if (s.dtype == dtype) {
    std::memcpy(same, s.bytes, sizeof same);
  } else {
    storeFromDouble(same, dtype, loadAsDouble(s.bytes, s.dtype));
  }
  activeKernels().scale[dtype](dst, src, count, same);
}

void divide(void* dst, const void* src, size_t count, chorusDataType_t dtype, uint64_t n) {
  if (!isValidDtype(dtype) || count == 0) return;
  // n == 0 never comes from Avg (n is the rank count); treat it as 1 rather
  // than divide by zero.
  activeKernels().divide[dtype](dst, src, count, n == 0 ? 1 : n);
}

}  // namespace chorus::kernels
