// Compressed reductions as chorus-sim prices them (issue 19 sec. 2): a wire
// format narrower than the data, fp32 accumulation at every combining rank.
//
//   bf16:        2 B per element on the wire;
//   fp8 (e4m3):  1 B per element plus one fp32 scale per block of `block`
//                elements (32-1024, default 128): 1 + 4 / block B.
//
// The plans quantize each element a bounded number of times: an allreduce is
// a direct reduce-scatter of quantized contributions (every rank quantizes its
// input once, the owner of a shard dequantizes and sums in fp32) and one
// quantized all-gather of the reduced shards (quantized once more): 2; a
// reduce-scatter 1; an all-gather 1.  The network carries the wire bytes
// (the same per-rank traffic as the uncompressed plan's, times wire / data
// bytes); the GPU pays the quantize and dequantize passes over HBM as
// memory-bound kernels before and after, not overlapped (an upper bound on
// their cost: a fused kernel pipelines them with the transfer).
#pragma once

#include <string>
#include <string_view>

#include "common/status.hpp"
#include "common/units.hpp"
#include "plan/plan.hpp"

namespace chorus::sim {

struct Compression {
  enum class Wire { None, Bf16, Fp8 } wire = Wire::None;
  int block = 128;  // fp8: elements per fp32 scale
  [[nodiscard]] bool on() const { return wire != Wire::None; }
  // Bytes per element on the wire.
  [[nodiscard]] double wireBytes() const {
    return wire == Wire::Bf16 ? 2.0 : wire == Wire::Fp8 ? 1.0 + 4.0 / block : 0.0;
  }
  [[nodiscard]] std::string describe() const;  // "none", "bf16", "fp8 (block 128)"
};

// "none", "bf16", "fp8" or "fp8:BLOCK" (BLOCK in [32, 1024]); `flag` names the
// option in messages.
Result<Compression> parseCompression(std::string_view text, std::string_view flag = "--compress");

// Checks that `coll` of data elements of `data_bytes` (4: fp32, 2: bf16) can
// be compressed this way: allreduce, reduce-scatter and all-gather of sum
// (compressing prod, max or min, or any other collective, is refused), and a
// wire narrower than the data.  The message names the argument and the
// supported values.
Status checkCompression(const Compression& c, plan::Collective coll, double data_bytes, std::string_view flag = "--compress");

// Times an element is quantized on its way through `coll` (the bound the
// error analysis uses): allreduce 2, reduce-scatter 1, all-gather 1.
int quantizations(plan::Collective coll);

// HBM bytes the quantize and dequantize passes of one rank move for `coll`
// of `bytes` of data over n ranks (wire/data ratio r): allreduce
// S (1 + r) + S r + 2 S / n + (S / n)(1 + r) + S (1 + r); reduce-scatter
// S (1 + r) + S r + 2 S / n; all-gather (S / n)(1 + r) + S (1 + r), where S
// is the call's whole data size per rank (the input of an allreduce or
// reduce-scatter, the output of an all-gather).
double quantizeHbmBytes(plan::Collective coll, double bytes, double ratio, int64_t n);
// Kernels those passes launch (each pays the GPU's per-kernel cost).
int quantizeKernels(plan::Collective coll);

}  // namespace chorus::sim
