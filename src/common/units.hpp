// Units as types: a Bytes is not a Seconds, and dividing one by a
// BytesPerSecond is the only way to get the other.  All values are doubles in
// SI base units (bytes, seconds, FLOPs); the helpers name the decimal
// (GB = 1e9) and binary (GiB = 2^30) multiples explicitly.  In common/, the
// bottom layer, so that every folder may use it: it includes nothing of
// chorus's own.
#pragma once

#include <compare>

namespace chorus {

template <typename Tag>
struct Quantity {
  double v = 0;
  constexpr Quantity() = default;
  constexpr explicit Quantity(double x) : v(x) {}
  [[nodiscard]] constexpr double value() const { return v; }
  constexpr Quantity& operator+=(Quantity o) { v += o.v; return *this; }
  constexpr Quantity& operator-=(Quantity o) { v -= o.v; return *this; }
  friend constexpr Quantity operator+(Quantity a, Quantity b) { return Quantity(a.v + b.v); }
  friend constexpr Quantity operator-(Quantity a, Quantity b) { return Quantity(a.v - b.v); }
  friend constexpr Quantity operator*(Quantity a, double k) { return Quantity(a.v * k); }
  friend constexpr Quantity operator*(double k, Quantity a) { return Quantity(a.v * k); }
  friend constexpr Quantity operator/(Quantity a, double k) { return Quantity(a.v / k); }
  friend constexpr double operator/(Quantity a, Quantity b) { return a.v / b.v; }
  friend constexpr auto operator<=>(Quantity, Quantity) = default;
};

struct BytesTag {};
struct SecondsTag {};
struct BytesPerSecondTag {};
struct FlopsTag {};
struct FlopsPerSecondTag {};
using Bytes = Quantity<BytesTag>;
using Seconds = Quantity<SecondsTag>;
using BytesPerSecond = Quantity<BytesPerSecondTag>;
using Flops = Quantity<FlopsTag>;
using FlopsPerSecond = Quantity<FlopsPerSecondTag>;

constexpr Seconds operator/(Bytes b, BytesPerSecond r) { return Seconds(b.v / r.v); }
constexpr BytesPerSecond operator/(Bytes b, Seconds t) { return BytesPerSecond(b.v / t.v); }
constexpr Bytes operator*(BytesPerSecond r, Seconds t) { return Bytes(r.v * t.v); }
constexpr Seconds operator/(Flops f, FlopsPerSecond r) { return Seconds(f.v / r.v); }
constexpr FlopsPerSecond operator/(Flops f, Seconds t) { return FlopsPerSecond(f.v / t.v); }

constexpr Bytes gib(double x) { return Bytes(x * 1073741824.0); }
constexpr Bytes gb(double x) { return Bytes(x * 1e9); }
constexpr Seconds us(double x) { return Seconds(x * 1e-6); }
constexpr BytesPerSecond gbytePerS(double x) { return BytesPerSecond(x * 1e9); }
constexpr BytesPerSecond gbitPerS(double x) { return BytesPerSecond(x * 1e9 / 8); }
constexpr FlopsPerSecond tflops(double x) { return FlopsPerSecond(x * 1e12); }

constexpr double toUs(Seconds s) { return s.v * 1e6; }
constexpr double toGib(Bytes b) { return b.v / 1073741824.0; }
constexpr double toGbytePerS(BytesPerSecond r) { return r.v / 1e9; }

}  // namespace chorus
