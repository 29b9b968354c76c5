#include "common/dtype.hpp"

#include <array>

namespace chorus {

namespace {

constexpr std::array<std::string_view, chorusNumTypes> kNames = {
    "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
    "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2",
};
static_assert(chorusInt8 == 0 && chorusFloat32 == 7 && chorusBfloat16 == 9 && chorusFloat8e5m2 == 11,
              "kNames follows the enum order of chorus.h");

struct Alias {
  std::string_view name;
  chorusDataType_t dtype;
};
// Short names, and the ones nccl-tests' -d accepts.
constexpr Alias kAliases[] = {
    {"char", chorusInt8},         {"uchar", chorusUint8},       {"int", chorusInt32},
    {"uint", chorusUint32},       {"long", chorusInt64},        {"ulong", chorusUint64},
    {"half", chorusFloat16},      {"fp16", chorusFloat16},      {"f16", chorusFloat16},
    {"float", chorusFloat32},     {"fp32", chorusFloat32},      {"f32", chorusFloat32},
    {"double", chorusFloat64},    {"fp64", chorusFloat64},      {"f64", chorusFloat64},
    {"bf16", chorusBfloat16},     {"fp8_e4m3", chorusFloat8e4m3}, {"e4m3", chorusFloat8e4m3},
    {"f8e4m3", chorusFloat8e4m3}, {"fp8_e5m2", chorusFloat8e5m2}, {"e5m2", chorusFloat8e5m2},
    {"f8e5m2", chorusFloat8e5m2},
};

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace

std::string_view dtypeName(chorusDataType_t d) {
  return isValidDtype(d) ? kNames[static_cast<size_t>(d)] : std::string_view("invalid-dtype");
}

bool parseDtype(std::string_view name, chorusDataType_t* out) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (equalsIgnoreCase(name, kNames[i])) {
      *out = static_cast<chorusDataType_t>(i);
      return true;
    }
  }
  for (const Alias& a : kAliases) {
    if (equalsIgnoreCase(name, a.name)) {
      *out = a.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace chorus
