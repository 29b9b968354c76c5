// Data types: the 16-bit / 8-bit float conversions and the generic element
// <-> double conversion.  The types' facts (sizes, names, which are floats)
// are common/dtype.hpp's, named here too (kernels::dtypeSize, ...).
//
// fp16, bf16, fp8 e4m3 and fp8 e5m2 are computed in fp32 and rounded back to
// nearest-even.  e4m3 follows the OCP FP8 spec (no infinities, 0x7f/0xff are
// NaN, max finite 448, overflow saturates to NaN like NVIDIA's __nv_fp8_e4m3
// with SATFINITE off: |x| > 464 -> NaN, see convert.hpp); e5m2 is IEEE-like
// (infinities, NaN).
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/dtype.hpp"

namespace chorus::kernels {

using chorus::dtypeName;
using chorus::dtypeSize;
using chorus::isFloatType;
using chorus::isValidDtype;
using chorus::parseDtype;

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);  // round to nearest even
float bf16ToFloat(uint16_t b);
uint16_t floatToBf16(float f);  // round to nearest even; NaN stays NaN
float fp8e4m3ToFloat(uint8_t v);
uint8_t floatToFp8e4m3(float f);  // round to nearest even
float fp8e5m2ToFloat(uint8_t v);
uint8_t floatToFp8e5m2(float f);  // round to nearest even

// Generic element <-> double conversion (slow path: tests, scalars, bench checks).
double loadAsDouble(const void* p, chorusDataType_t d);
void storeFromDouble(void* p, chorusDataType_t d, double v);

}  // namespace chorus::kernels
