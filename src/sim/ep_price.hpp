// chorus-sim ep: the bytes of one MoE dispatch and combine on every host's
// link, from the library's own routing code (plan/ep_route.hpp: the send
// order ep_layout computes, the relays' forwarding, the wire row of
// ep_dispatch), for a routing drawn by the same uniform router chorus-bench
// dispatch|combine uses -- so the figure is the plan's, not a formula's.
//
// Two formulations are priced, as chorus-bench measures them: ep (the
// chorusEp* calls: a token crosses once per rank holding its experts, or with
// node-limited routing once per host, to the host's relay) and alltoallv
// (one row per (token, expert), the datatype's bytes plus a float32 weight).
// The bound is the busiest host link's bytes (up or down, whichever is more)
// over the link's rate: no schedule moves the data faster (docs/ep.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace chorus::sim {

struct EpPriceCase {
  int hosts = 4, ranks_per_host = 2;  // equal hosts of consecutive ranks
  size_t tokens = 4096;               // per rank
  size_t hidden = 7168;
  int experts = 64, topk = 8;
  int max_hosts = 2;                  // node-limited routing: 0 off
  std::string dtype = "bf16";         // bf16, float, or fp8 (bf16 data, fp8 e4m3 dispatch with a scale per 128)
  double link_gbps = 1;               // every host's link, each way (Gbit/s)
  uint64_t seed = 1;                  // the router's (chorus-bench --seed)
};

// One exchange's bytes: per host, out of and into it across its link, and
// what stays inside hosts (shared memory).
struct EpLinkBytes {
  std::vector<double> up, down;
  double inside = 0;
  [[nodiscard]] double busiest() const;
};

struct EpPrice {
  EpLinkBytes ep_dispatch, ep_combine, a2a_dispatch, a2a_combine;
  double link_bytes_per_s = 0;
  // Bounds in seconds: the busiest link's bytes / its rate.
  [[nodiscard]] double bound(const EpLinkBytes& b) const { return b.busiest() / link_bytes_per_s; }
};

Result<EpPrice> priceEp(const EpPriceCase& c);

// The command: prints the table (or JSON); returns the exit status.
int runEpCommand(const EpPriceCase& c, bool json);

}  // namespace chorus::sim
