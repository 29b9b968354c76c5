// Kernels compiled for AVX2 with F16C (every AVX2 CPU has F16C).
// See reduce_isa.hpp for the code and dispatch.hpp for how a table is chosen.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/convert.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/reduce.hpp"

#if CHORUS_KERNELS_X86
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#define CHORUS_VEC_BYTES 32
#define CHORUS_F16C_WIDTH 8
#define CHORUS_ISA_NAME "avx2"

namespace chorus::kernels::isa_avx2 {
#include "kernels/reduce_isa.hpp"
}  // namespace chorus::kernels::isa_avx2

#pragma GCC pop_options
#endif  // CHORUS_KERNELS_X86
