// The per-ISA kernel tables and the one-time choice among them (src/kernels,
// its tests, exec's local operations and the tuner's rate probe).
//
// The same kernel source (reduce_isa.hpp) is compiled three times, under
// `#pragma GCC target` for AVX-512, for AVX2+F16C, and for the baseline, each
// into its own namespace (reduce_isa_*.cpp).  activeKernels() picks the best
// table the CPU (and OS) supports, once; Reducer copies a function pointer out
// of it, so a call is one indirect jump with no switch.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace chorus::kernels {

using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);
// dst[i] = src[i] * *scalar, where scalar points at one element of the dtype.
using ScaleFn = void (*)(void* dst, const void* src, size_t count, const void* scalar);
using DivideFn = void (*)(void* dst, const void* src, size_t count, uint64_t n);

// CHORUS_REPRODUCIBLE=exact's float32 conversions for one-word layouts
// (kernels/exact.hpp): the common case, vectorised; exact.cpp falls back to
// its general loops when one returns false.
struct ExactFloatFns {
  // acc[i] = x[i] / 2^lsb_exp, an integer: false (acc partly written) when a
  // value is not finite or not a multiple of 2^lsb_exp below 2^(lsb_exp + 62)
  // (wider words take the general loop, as from_word's do).
  bool (*to_word)(int64_t* acc, const float* x, size_t count, int lsb_exp);
  // y[i] = acc[i] * 2^lsb_exp rounded to float (nearest, ties to even): false
  // (y partly written) when some |acc[i]| >= lim.  Needs lim <= 2^62 and
  // -1022 <= lsb_exp <= 1023 - 62, so every step but the one rounding (made
  // round-to-odd first, then to float) is exact.
  bool (*from_word)(float* y, const int64_t* acc, size_t count, int lsb_exp, int64_t lim);
  // The largest and smallest exponent field among the finite nonzero values
  // (subnormals count as 1); 0 and 256 when there is none.
  void (*range)(const float* x, size_t count, uint32_t* max_e, uint32_t* min_e);
};

// MoE combine's float32 accumulators (exec::LocalOp Accumulate, ToFloat,
// FromFloat): acc[i] = acc[i] + w * x[i] with the product and the sum each
// rounded (never fused: the reduce_isa_*.cpp files are built with
// -ffp-contract=off), x float32 or bf16; and bf16 <-> float32 over arrays
// (convert.hpp's rounding, lane-wise).  Bitwise the scalar loops.
struct FloatAccumFns {
  void (*accumulate_f32)(float* acc, const float* x, size_t count, float w);
  void (*accumulate_bf16)(float* acc, const uint16_t* x, size_t count, float w);
  void (*bf16_to_float)(float* dst, const uint16_t* src, size_t count);
  void (*float_to_bf16)(uint16_t* dst, const float* src, size_t count);
};

struct KernelTable {
  std::string_view isa;                   // "avx512", "avx2", "generic"
  ReduceFn reduce[chorusNumTypes][4];     // [dtype][BinOp]
  ScaleFn scale[chorusNumTypes];
  DivideFn divide[chorusNumTypes];
  ExactFloatFns exact;
  FloatAccumFns accum;
};

enum class KernelIsa : uint8_t { Generic, Avx2, Avx512 };

// The table for `isa`, or nullptr when this CPU cannot run it (or the build
// has no such variant, e.g. on a non-x86 host).  Thread-safe, no state.
const KernelTable* kernelTable(KernelIsa isa);

// The best table for this CPU, chosen on first use (thread-safe; immutable after).
const KernelTable& activeKernels();

namespace isa_generic {
const KernelTable& table();
}
#if defined(__x86_64__) && defined(__GNUC__)
#define CHORUS_KERNELS_X86 1
namespace isa_avx2 {
const KernelTable& table();
}
namespace isa_avx512 {
const KernelTable& table();
}
#endif

}  // namespace chorus::kernels
