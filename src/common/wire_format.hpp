// A compressed collective's wire format (issue 19 sec. 2) as a value: its
// kind and fp8 block, how it is spelled, checked and sized.  The formats
// themselves -- the layout, the fp8 block scale rule, the error bounds -- and
// the kernels that quantize and dequantize are kernels/quantize.hpp's (which
// also names these kernels::WireFormat, kernels::wireBytes, ...).
//
//   bf16       2 B per element.
//   fp8 e4m3   1 B per element plus one fp32 scale per block of `block`
//              consecutive elements (32 <= block <= 1024, default 128), the
//              scales first: wireBytes = 4 ceil(n / block) + n.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace chorus {

inline constexpr int kFp8MinBlock = 32;
inline constexpr int kFp8MaxBlock = 1024;
inline constexpr int kFp8DefaultBlock = 128;

struct WireFormat {
  enum Kind : uint8_t { Bf16, Fp8E4m3 };
  Kind kind = Bf16;
  int block = kFp8DefaultBlock;  // fp8: elements per scale; ignored for bf16

  friend bool operator==(const WireFormat&, const WireFormat&) = default;
};

// Ok, or an invalid-argument error naming `arg`, the bad value and the
// supported values (block outside [32, 1024], or an unknown kind).
Status checkWireFormat(const WireFormat& fmt, std::string_view arg = "wire format");
// "bf16", "fp8" (block 128) or "fp8:BLOCK"; the error names `arg` and the
// supported spellings.
Result<WireFormat> parseWireFormat(std::string_view text, std::string_view arg = "wire format");
// "bf16" or "fp8:BLOCK" (parseWireFormat's inverse).
std::string wireFormatName(const WireFormat& fmt);

// Scales of an fp8 buffer of `count` elements: ceil(count / block); 0 for bf16.
size_t wireScales(const WireFormat& fmt, size_t count);
// Exact bytes of `count` elements on the wire, scales included.
size_t wireBytes(const WireFormat& fmt, size_t count);

}  // namespace chorus
