// Kernels compiled for the baseline ISA of the build (SSE2 on x86-64), no F16C.
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

#if defined(__SSE2__)
#include <emmintrin.h>  // baseline x86-64: the bf16 pack/unpack
#endif

#define CHORUS_VEC_BYTES 16
#define CHORUS_F16C_WIDTH 0
#define CHORUS_ISA_NAME "generic"

namespace chorus::kernels::isa_generic {
#include "kernels/reduce_isa.hpp"
}  // namespace chorus::kernels::isa_generic
