// Kernels compiled for AVX-512 (F, BW, VL, DQ) with the 512-bit half conversions.
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
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,prefer-vector-width=512")
// GCC 12 flags the deliberately undefined source of _mm512_cvtph_ps/_mm512_cvtps_ph.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define CHORUS_VEC_BYTES 64
#define CHORUS_F16C_WIDTH 16
#define CHORUS_ISA_NAME "avx512"
// The pragma does not define __AVX512DQ__ under GCC: reduce_isa.hpp asks this.
#define CHORUS_ISA_AVX512DQ 1

namespace chorus::kernels::isa_avx512 {
#include "kernels/reduce_isa.hpp"
}  // namespace chorus::kernels::isa_avx512

#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif  // CHORUS_KERNELS_X86
