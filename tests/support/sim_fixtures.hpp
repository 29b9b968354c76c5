// Cluster and model fixtures shared by the simulator's unit tests.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "sim/config.hpp"

namespace chorus::sim::fixtures {

// A DGX-A100-like cluster: 8 GPUs per node, NVLink 300 GB/s (x 0.8 achievable
// = 240 GB/s), 8 x 200 Gb/s NICs (25 GB/s x 0.9 = 22.5 GB/s per GPU port).
inline std::string clusterJson(std::string_view topology, int nodes, std::string_view extra = "",
                               int gpus_per_node = 8, int nics = 8) {
  return fmt::format(R"({{"name": "test", "nodes": {},
    "gpu": {{"name": "A100", "peak_tflops": 312, "hbm_gib": 80, "hbm_gbyte_s": 2039}},
    "node": {{"gpus": {}, "nvlink_gbyte_s": 300, "nvlink_latency_us": 1}},
    "network": {{"topology": "{}", "nics_per_node": {}, "nic_gbit_s": 200, "latency_us": 2,
                 "oversubscription": 1 {}}}}})",
                     nodes, gpus_per_node, topology, nics, extra);
}

inline ClusterSpec cluster(std::string_view topology, int nodes, std::string_view extra = "", int gpus_per_node = 8,
                           int nics = 8) {
  auto c = parseCluster(clusterJson(topology, nodes, extra, gpus_per_node, nics), "test.json");
  EXPECT_TRUE(c.isOk()) << c.status().message();
  return *c;
}

// A GPT-like model (ffn = 4h, no GQA, vocab 51200).
inline ModelSpec gpt(int layers, int64_t h, int heads) {
  ModelSpec m;
  m.name = "gpt";
  m.layers = layers;
  m.hidden = h;
  m.heads = m.kv_heads = heads;
  m.ffn_hidden = 4 * h;
  m.vocab = 51200;
  return m;
}

}  // namespace chorus::sim::fixtures
