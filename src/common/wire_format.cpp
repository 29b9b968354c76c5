#include "common/wire_format.hpp"

#include <charconv>

namespace chorus {

Status checkWireFormat(const WireFormat& fmt, std::string_view arg) {
  switch (fmt.kind) {
    case WireFormat::Bf16: return Status::ok();
    case WireFormat::Fp8E4m3:
      if (fmt.block < kFp8MinBlock || fmt.block > kFp8MaxBlock) {
        return invalidArgument("{}: fp8 block size {} is out of range; supported: an integer in [{}, {}] (elements per fp32 scale, default {})",
                               arg, fmt.block, kFp8MinBlock, kFp8MaxBlock, kFp8DefaultBlock);
      }
      return Status::ok();
  }
  return invalidArgument("{}: unknown wire format kind {}; supported: bf16, fp8 (e4m3 with a per-block scale)", arg,
                         static_cast<int>(fmt.kind));
}

Result<WireFormat> parseWireFormat(std::string_view text, std::string_view arg) {
  if (text == "bf16") return WireFormat{WireFormat::Bf16, kFp8DefaultBlock};
  if (text == "fp8") return WireFormat{WireFormat::Fp8E4m3, kFp8DefaultBlock};
  if (text.starts_with("fp8:")) {
    const std::string_view b = text.substr(4);
    int block = 0;
    auto [ptr, ec] = std::from_chars(b.data(), b.data() + b.size(), block);
    if (ec != std::errc() || ptr != b.data() + b.size() || b.empty()) {
      return invalidArgument("{} '{}': the fp8 block size must be an integer in [{}, {}]", arg, text, kFp8MinBlock, kFp8MaxBlock);
    }
    WireFormat fmt{WireFormat::Fp8E4m3, block};
    if (Status s = checkWireFormat(fmt, arg); !s) return s;
    return fmt;
  }
  return invalidArgument("{} '{}': unsupported; one of bf16, fp8, fp8:BLOCK (BLOCK an integer in [{}, {}])", arg, text,
                         kFp8MinBlock, kFp8MaxBlock);
}

std::string wireFormatName(const WireFormat& fmt) {
  return fmt.kind == WireFormat::Bf16 ? std::string("bf16") : fmt::format("fp8:{}", fmt.block);
}

size_t wireScales(const WireFormat& fmt, size_t count) {
  if (fmt.kind != WireFormat::Fp8E4m3) return 0;
  const size_t b = static_cast<size_t>(fmt.block);
  return (count + b - 1) / b;
}

size_t wireBytes(const WireFormat& fmt, size_t count) {
  return fmt.kind == WireFormat::Bf16 ? 2 * count : 4 * wireScales(fmt, count) + count;
}

}  // namespace chorus
