// JSON views of the simulator's results (what `chorus-sim ... --json` prints).
#pragma once

#include <nlohmann/json.hpp>

#include "common/size.hpp"
#include "sim/compress.hpp"  // chorus::parseSize: the sizes of --bytes, as every tool reads them
#include "sim/infer.hpp"
#include "sim/network.hpp"
#include "sim/search.hpp"
#include "sim/train.hpp"

namespace chorus::sim {

struct CollectiveReport {
  std::string collective, algo, bottleneck;
  int64_t gpus = 0;
  double bytes = 0, time_us = 0, algbw_gbps = 0, busbw_gbps = 0, latency_us = 0;
  // With compression (sim/compress.hpp): the wire format, the bytes the plan
  // moves, the quantize / dequantize passes' time (inside time_us) and the
  // times an element is quantized.  algbw and busbw count the data bytes
  // (the effective bandwidth).
  std::string compress = "none";
  double wire_bytes = 0, quantize_us = 0;
  int quantizations = 0;
};

// Prices `collective` of `bytes` over the first `gpus` GPUs of the cluster
// (ranks in GPU order) with the analytical model; `lib` chorus (the
// default here: chorus's plans, as the golden tests pin them) or nccl (the
// CLI's default).
Result<CollectiveReport> simulateCollective(const ClusterSpec& c, int64_t gpus, std::string_view collective, double bytes,
                                            std::string_view algo, const plan::Registry& reg,
                                            NetMode mode = NetMode::Analytical, Library lib = Library::Chorus,
                                            const Compression& compress = {});

// A compressed collective's plan on the network (sim/compress.hpp), `wire`
// bytes on the wire for `data` bytes of data per rank: no reduction may happen
// in the network or along a chain of hops (each would dequantize and quantize
// again), so the reduce-scatter is direct (an all-to-all of the quantized
// contributions) and the all-gather moves the quantized reduced shards.  A
// group with several members in each of several nodes runs it in two levels:
// uncompressed over NVLink inside the node (reduce-scatter of fp32 partial
// sums, all-gather at the end), compressed across nodes on 1/e of the data.
Result<CollectiveCost> compressedCost(NetworkModel& net, plan::Collective coll, double wire, double data,
                                      const GroupSet& g, std::string_view algo);

nlohmann::json toJson(const CollectiveReport& r);
nlohmann::json toJson(const TrainReport& r);
nlohmann::json toJson(const SearchResult& r);
nlohmann::json toJson(const Latency& l);
nlohmann::json toJson(const ServeStats& s);
nlohmann::json toJson(const InferReport& r);
// One line naming a layout: "tp 8 pp 16 dp 128 cp 1 ep 1 vpp 1 mb 1 zero 1 selective".
std::string layoutName(const TrainConfig& c);

Result<Recompute> parseRecompute(std::string_view text);

}  // namespace chorus::sim
