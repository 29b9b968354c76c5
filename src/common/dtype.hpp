// The data types' facts: which values of chorusDataType_t are types, their
// sizes, which are floating point, and their names.  Pure functions of the
// type; the arithmetic on elements is the kernels' (kernels/dtype.hpp, which
// also names these chorus::kernels::dtypeSize, ...).
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <string_view>

namespace chorus {

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

}  // namespace chorus
