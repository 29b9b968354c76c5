// Data types: sizes, names and the 16-bit / 8-bit float conversions.
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

namespace chorus::kernels {

constexpr bool isValidDtype(int d) { return d >= 0 && d < chorusNumTypes; }

constexpr size_t dtypeSize(chorusDataType_t d) {
  switch (d) {
    case chorusInt8:
    case chorusUint8:
    case chorusFloat8e4m3:
    case chorusFloat8e5m2: return 1;
    case chorusFloat16:
    case chorusBfloat16: return 2;
    case chorusInt32:
    case chorusUint32:
    case chorusFloat32: return 4;
    case chorusInt64:
    case chorusUint64:
    case chorusFloat64: return 8;
    default: return 0;
  }
}

constexpr bool isFloatType(chorusDataType_t d) {
  return d == chorusFloat16 || d == chorusBfloat16 || d == chorusFloat32 || d == chorusFloat64 ||
         d == chorusFloat8e4m3 || d == chorusFloat8e5m2;
}

std::string_view dtypeName(chorusDataType_t d);  // "float32", "bfloat16", ...
// Parses "float", "float32", "half", "bf16", "int32", ... (chorus-bench -d).
bool parseDtype(std::string_view name, chorusDataType_t* out);

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
