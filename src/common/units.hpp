// Units as types: a Bytes is not a Seconds, and dividing one by a
// BytesPerSecond (or multiplying it by a SecondsPerByte) is the only way to
// get the other.  The convention: every value is a double in SI base units
// (bytes, seconds, FLOPs, and their quotients), whatever unit a file or a
// flag spells it in; the helpers name the decimal (GB = 1e9, us = 1e-6) and
// binary (MiB = 2^20, GiB = 2^30) multiples explicitly, to and from.  In
// common/, the bottom layer, so that every folder may use it (the simulator,
// the tuner's cost model): it includes nothing of chorus's own.
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
struct SecondsPerByteTag {};
using Bytes = Quantity<BytesTag>;
using Seconds = Quantity<SecondsTag>;
using BytesPerSecond = Quantity<BytesPerSecondTag>;
using Flops = Quantity<FlopsTag>;
using FlopsPerSecond = Quantity<FlopsPerSecondTag>;
// Inverse bandwidth, the α-β-γ model's β and γ: a latency-bound model adds
// b·β to an α, so it keeps time per byte rather than bytes per time.
using SecondsPerByte = Quantity<SecondsPerByteTag>;

constexpr Seconds operator/(Bytes b, BytesPerSecond r) { return Seconds(b.v / r.v); }
constexpr BytesPerSecond operator/(Bytes b, Seconds t) { return BytesPerSecond(b.v / t.v); }
constexpr Bytes operator*(BytesPerSecond r, Seconds t) { return Bytes(r.v * t.v); }
constexpr Seconds operator/(Flops f, FlopsPerSecond r) { return Seconds(f.v / r.v); }
constexpr FlopsPerSecond operator/(Flops f, Seconds t) { return FlopsPerSecond(f.v / t.v); }
constexpr Seconds operator*(Bytes b, SecondsPerByte k) { return Seconds(b.v * k.v); }
constexpr Seconds operator*(SecondsPerByte k, Bytes b) { return Seconds(b.v * k.v); }
constexpr SecondsPerByte operator/(Seconds t, Bytes b) { return SecondsPerByte(t.v / b.v); }
constexpr SecondsPerByte inverse(BytesPerSecond r) { return SecondsPerByte(1.0 / r.v); }
constexpr BytesPerSecond inverse(SecondsPerByte k) { return BytesPerSecond(1.0 / k.v); }

constexpr Bytes mib(double x) { return Bytes(x * 1048576.0); }
constexpr Bytes gib(double x) { return Bytes(x * 1073741824.0); }
constexpr Bytes gb(double x) { return Bytes(x * 1e9); }
constexpr Seconds us(double x) { return Seconds(x * 1e-6); }
constexpr BytesPerSecond gbytePerS(double x) { return BytesPerSecond(x * 1e9); }
constexpr BytesPerSecond gbitPerS(double x) { return BytesPerSecond(x * 1e9 / 8); }
constexpr FlopsPerSecond tflops(double x) { return FlopsPerSecond(x * 1e12); }

constexpr double toUs(Seconds s) { return s.v * 1e6; }
constexpr double toGib(Bytes b) { return b.v / 1073741824.0; }
constexpr double toGbytePerS(BytesPerSecond r) { return r.v / 1e9; }
// The bandwidth k is the inverse of, in GB/s: 1e-9 / k in one rounding, not
// toGbytePerS(inverse(k))'s two, so that the tuning profiles (which have
// always been written so) print the same digits for the same figure.
constexpr double toGbytePerS(SecondsPerByte k) { return 1e-9 / k.v; }

}  // namespace chorus
