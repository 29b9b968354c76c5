// Expert parallelism's routing (docs/ep.md): where each token of a MoE
// dispatch goes, computed once for its three consumers -- the ep_layout
// primitive (src/prim/ep_layout.cpp) that runs it, the simulator's pricing of
// a layout (src/sim/ep_price.cpp), and chorus-bench dispatch|combine's
// bookkeeping -- so the bytes the simulator prices are the ones the library
// sends.
//
// Pure functions of the routing (the top-k ids) and the geometry (ranks,
// hosts, experts); no communication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.hpp"

namespace chorus::plan::ep {

// Experts spread evenly over the ranks (expert e on rank e / (E / n)); hosts
// numbered by first appearance in rank order.
struct Geometry {
  int nranks = 1, experts = 1, topk = 1;
  int max_hosts = 0;                         // node-limited routing: 0 off
  std::vector<int> host_of;                  // rank -> host
  std::vector<std::vector<int>> host_ranks;  // host -> its ranks, ascending
  std::vector<int> local_index;              // rank -> its index among its host's ranks

  // From any host labels per rank (equal labels: one host).
  static Geometry make(int nranks, int experts, int topk, int max_hosts, std::span<const int> host_labels);

  [[nodiscard]] int nhosts() const { return static_cast<int>(host_ranks.size()); }
  [[nodiscard]] int localExperts() const { return experts / nranks; }
  [[nodiscard]] int rankOf(int expert) const { return expert / localExperts(); }
  [[nodiscard]] int hostOfExpert(int expert) const { return host_of[static_cast<size_t>(rankOf(expert))]; }
  [[nodiscard]] bool nodeLimited() const { return max_hosts > 0; }
  // Node-limited routing: the rank of host h that relays `rank`'s tokens (the
  // one with `rank`'s local index, modulo the host's size: DeepEP's "same GPU
  // index on every node"); on `rank`'s own host, `rank` itself.
  [[nodiscard]] int relayFor(int rank, int h) const {
    const auto& rs = host_ranks[static_cast<size_t>(h)];
    return rs[static_cast<size_t>(local_index[static_cast<size_t>(rank)]) % rs.size()];
  }
};

// Bytes of one dispatched row on the wire (src/prim/ep_dispatch.cpp's
// layout): the payload (the row in the datatype, or its compressed form),
// the token's topk ids (int32) and weights (float32), its origin (two uint64:
// source rank, token).  Combine sends the row in the datatype alone.
constexpr size_t dispatchRowBytes(size_t payload, size_t topk) { return payload + topk * 8 + 16; }

// What one rank sends first: without node-limited routing each token once to
// every rank holding one of its experts, with it once to each host's relay.
struct FirstHop {
  std::vector<size_t> send_counts;  // rows to each rank
  std::vector<size_t> send_order;   // token indices, rank-major, ascending within a rank
  std::vector<size_t> per_rank;     // tokens with an expert on each rank
  std::vector<size_t> per_host;     // tokens with an expert on each host
  std::vector<size_t> per_expert;   // tokens per expert
};
// ids: tokens x topk, each in [0, experts) and distinct within a token (the
// caller validated them).  Fails (naming the token) when node-limited routing
// is on and a token's experts span more than max_hosts hosts.
Result<FirstHop> firstHop(const Geometry& g, int rank, std::span<const int32_t> ids);

// Node-limited routing's relay step, on `rank`: for the first hop's rows that
// arrived here (their ids, topk per row, arrival order), the rows forwarded to
// each rank of this host (counts per rank, and the row indices, rank-major).
struct Forward {
  std::vector<size_t> counts;
  std::vector<size_t> rows;
};
Result<Forward> forward(const Geometry& g, int rank, std::span<const int32_t> hop1_ids);

// The last hop's counts, as the receivers learn them: for each row (its
// topk ids) that this rank sends on the last hop, adds to sc[dest * (1 + L)]
// one row and to sc[dest * (1 + L) + 1 + local expert] one per expert of the
// token on dest; only_host >= 0 counts only destinations on that host (the
// relay's forwarding).
void countLastHop(const Geometry& g, const int32_t* ids, int only_host, std::vector<uint64_t>& sc);

// A uniform router for benchmarks and the simulator: token t of `rank`
// picks topk distinct experts (with max_hosts > 0: first max_hosts distinct
// hosts of nhosts equal groups of consecutive experts, then its experts among
// theirs).  A function of (seed, rank, t).
void uniformRoute(uint64_t seed, int rank, size_t t, int experts, int topk, int nhosts, int max_hosts, int32_t* ids);

}  // namespace chorus::plan::ep

namespace chorus::plan::ep {

// The proof of a step's routing (docs/ep.md, "What is proven"): runs the
// library's routing -- each rank's firstHop, each relay's forward, the last
// hop's countLastHop -- for every rank's ids and checks, with every
// (rank, token, choice) as a tagged element:
//   - it reaches the rank holding its expert exactly once, and no token
//     reaches a rank that holds none of its experts;
//   - a token crosses to each rank (direct) or host (node-limited) at most
//     once, reaches at most max_hosts hosts, and forwarding stays inside the
//     relay's host;
//   - the counts the layout announces (countLastHop) are the rows that arrive,
//     per rank and local expert;
//   - combine, dispatch's exchanges reversed, brings each token one partial
//     per row it sent, and those partials cover its topk experts once each.
// ids[r]: rank r's tokens x topk ids (valid: in range, distinct per token).
// Fails naming the first element or count that breaks a rule.
Status verifyRouting(const Geometry& g, std::span<const std::vector<int32_t>> ids);

// The same over given hops (what verifyRouting computes with firstHop and
// forward; tests hand it corrupted ones to see it refuse them).  forwards is
// empty for direct routing, one per rank otherwise.
Status verifyDelivery(const Geometry& g, std::span<const std::vector<int32_t>> ids, std::span<const FirstHop> hops,
                      std::span<const Forward> forwards);

}  // namespace chorus::plan::ep
