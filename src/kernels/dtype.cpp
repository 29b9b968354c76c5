#include "kernels/dtype.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/convert.hpp"

namespace chorus::kernels {

namespace {

template <typename T>
T load(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void store(void* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// double -> integer without UB: NaN -> 0, truncation toward zero, saturation
// at the type's ends (a double cannot name most int64 values anyway).
template <typename T>
T saturatingFromDouble(double v) {
  if (std::isnan(v)) return 0;
  constexpr double kLo = static_cast<double>(std::numeric_limits<T>::min());
  // 2^(bits) for unsigned / 2^(bits-1) for signed: the first value out of range.
  constexpr double kHiExcl = std::numeric_limits<T>::is_signed
                                 ? -kLo
                                 : 2.0 * static_cast<double>(T(1) << (sizeof(T) * 8 - 1));
  if (v <= kLo) return std::numeric_limits<T>::min();
  if (v >= kHiExcl) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

}  // namespace

float halfToFloat(uint16_t h) { return convert::halfToFloat(h); }
uint16_t floatToHalf(float f) { return convert::floatToHalf(f); }
float bf16ToFloat(uint16_t b) { return convert::bf16ToFloat(b); }
uint16_t floatToBf16(float f) { return convert::floatToBf16(f); }
float fp8e4m3ToFloat(uint8_t v) { return convert::fp8e4m3ToFloat(v); }
uint8_t floatToFp8e4m3(float f) { return convert::floatToFp8e4m3(f); }
float fp8e5m2ToFloat(uint8_t v) { return convert::fp8e5m2ToFloat(v); }
uint8_t floatToFp8e5m2(float f) { return convert::floatToFp8e5m2(f); }

double loadAsDouble(const void* p, chorusDataType_t d) {
  switch (d) {
    case chorusInt8: return load<int8_t>(p);
    case chorusUint8: return load<uint8_t>(p);
    case chorusInt32: return load<int32_t>(p);
    case chorusUint32: return load<uint32_t>(p);
    case chorusInt64: return static_cast<double>(load<int64_t>(p));
    case chorusUint64: return static_cast<double>(load<uint64_t>(p));
    case chorusFloat16: return convert::halfToFloat(load<uint16_t>(p));
    case chorusBfloat16: return convert::bf16ToFloat(load<uint16_t>(p));
    case chorusFloat32: return load<float>(p);
    case chorusFloat64: return load<double>(p);
    case chorusFloat8e4m3: return convert::fp8e4m3ToFloat(load<uint8_t>(p));
    case chorusFloat8e5m2: return convert::fp8e5m2ToFloat(load<uint8_t>(p));
    default: return 0.0;
  }
}

// The narrow floats go double -> float -> narrow, each rounding to nearest
// even: the narrow value is the one of the fp32 value, the kernels' compute
// precision.  (A double within 2^-24 relative of a narrow tie can therefore
// round differently than a direct double -> narrow rounding would; a value
// that is itself a float, or a sum/product of two narrow values, cannot.)
void storeFromDouble(void* p, chorusDataType_t d, double v) {
  switch (d) {
    case chorusInt8: store(p, saturatingFromDouble<int8_t>(v)); break;
    case chorusUint8: store(p, saturatingFromDouble<uint8_t>(v)); break;
    case chorusInt32: store(p, saturatingFromDouble<int32_t>(v)); break;
    case chorusUint32: store(p, saturatingFromDouble<uint32_t>(v)); break;
    case chorusInt64: store(p, saturatingFromDouble<int64_t>(v)); break;
    case chorusUint64: store(p, saturatingFromDouble<uint64_t>(v)); break;
    case chorusFloat16: store(p, convert::floatToHalf(static_cast<float>(v))); break;
    case chorusBfloat16: store(p, convert::floatToBf16(static_cast<float>(v))); break;
    case chorusFloat32: store(p, static_cast<float>(v)); break;
    case chorusFloat64: store(p, v); break;
    case chorusFloat8e4m3: store(p, convert::floatToFp8e4m3(static_cast<float>(v))); break;
    case chorusFloat8e5m2: store(p, convert::floatToFp8e5m2(static_cast<float>(v))); break;
    default: break;
  }
}

}  // namespace chorus::kernels
