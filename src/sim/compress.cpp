#include "sim/compress.hpp"

#include <charconv>

namespace chorus::sim {

std::string Compression::describe() const {
  switch (wire) {
    case Wire::None: return "none";
    case Wire::Bf16: return "bf16";
    case Wire::Fp8: return fmt::format("fp8 (e4m3, block {})", block);
  }
  return "none";
}

Result<Compression> parseCompression(std::string_view text, std::string_view flag) {
  Compression c;
  if (text == "none" || text.empty()) return c;
  if (text == "bf16") {
    c.wire = Compression::Wire::Bf16;
    return c;
  }
  if (text.substr(0, 3) == "fp8") {
    c.wire = Compression::Wire::Fp8;
    if (text.size() == 3) return c;
    if (text[3] != ':')
      return invalidArgument("{} '{}': one of none, bf16, fp8, fp8:BLOCK (BLOCK in [32, 1024])", flag, text);
    const std::string_view b = text.substr(4);
    int block = 0;
    auto [ptr, ec] = std::from_chars(b.data(), b.data() + b.size(), block);
    if (ec != std::errc() || ptr != b.data() + b.size() || block < 32 || block > 1024)
      return invalidArgument("{} '{}': the fp8 block size must be an integer in [32, 1024] (elements per scale)", flag, text);
    c.block = block;
    return c;
  }
  return invalidArgument("{} '{}': one of none, bf16, fp8, fp8:BLOCK (BLOCK in [32, 1024])", flag, text);
}

Status checkCompression(const Compression& c, plan::Collective coll, double data_bytes, std::string_view flag) {
  if (!c.on()) return {};
  if (coll != plan::Collective::AllReduce && coll != plan::Collective::ReduceScatter &&
      coll != plan::Collective::AllGather)
    return invalidArgument("{} {}: compressed {} is not supported (allreduce, reducescatter and allgather are)", flag,
                           c.describe(), plan::collectiveName(coll));
  if (!(c.wireBytes() < data_bytes))
    return invalidArgument("{} {}: the data are {}-byte elements already; a compressed wire must be narrower (fp32 "
                           "data: bf16 or fp8; bf16 data: fp8)", flag, c.describe(), data_bytes);
  return {};
}

int quantizations(plan::Collective coll) { return coll == plan::Collective::AllReduce ? 2 : 1; }

double quantizeHbmBytes(plan::Collective coll, double bytes, double r, int64_t n) {
  const double S = bytes, shard = bytes / static_cast<double>(n);
  switch (coll) {
    case plan::Collective::AllReduce:
      return S * (1 + r) + S * r + 2 * shard + shard * (1 + r) + S * (1 + r);
    case plan::Collective::ReduceScatter: return S * (1 + r) + S * r + 2 * shard;
    case plan::Collective::AllGather: return shard * (1 + r) + S * (1 + r);
    default: return 0;
  }
}

int quantizeKernels(plan::Collective coll) {
  switch (coll) {
    case plan::Collective::AllReduce: return 4;  // quantize, dequantize + sum, quantize the shard, dequantize
    case plan::Collective::ReduceScatter: return 2;
    case plan::Collective::AllGather: return 2;
    default: return 0;
  }
}

}  // namespace chorus::sim
