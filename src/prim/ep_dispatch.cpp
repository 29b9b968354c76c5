// "ep_dispatch": each token crosses once to each rank that holds one of its
// experts, and lands there in every one of those experts' groups of recvX
// (prim/ep.hpp; chorusEpDispatch).
//
// After the agreement (a rank without a layout, a NULL buffer or a recvX too
// small for the layout's numRecv fails the call on every rank, no data moved),
// one all-to-all-v of wire rows in the layout's send order.  A wire row is the
// token's hidden elements, its top-k ids (int32) and weights (float32): the
// receiver picks its own experts from the ids.  It writes row i's payload into
// the groups of its local experts in ascending expert id (groups in expert
// order, within a group by source rank, then the source's token order), and
// keeps where each went: the routing combine undoes.  Every write is checked
// against the counts the layout exchanged.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

class Dispatch final : public Primitive {
 public:
  std::string_view name() const override { return "ep_dispatch"; }
  std::string_view summary() const override {
    return "MoE dispatch: tokens to the ranks of their experts, grouped by local expert (chorusEpDispatch; aux: its call block)";
  }

  Status run(Context& ctx, const Args& args) const override {
    auto call = callOf(args);
    if (!call.isOk()) return call.status();
    const Call& c = **call;
    State& s = *c.state;
    s.dispatched = false;
    Status mine;
    if (!s.laid_out) mine = invalidUsage("no layout: call chorusEpLayout first (or its last call failed)");
    else if (s.tokens > 0 && c.x == nullptr) mine = invalidArgument("x is NULL but the layout has {} tokens", s.tokens);
    else if (c.recv_capacity < s.num_recv)
      mine = invalidArgument("recvCapacity={} rows but {} rows arrive at rank {} (the layout's numRecv)", c.recv_capacity,
                             s.num_recv, s.rank);
    else if (s.num_recv > 0 && c.recv_x == nullptr) mine = invalidArgument("recvX is NULL but {} rows arrive", s.num_recv);
    CHORUS_RETURN_IF_ERROR(agree(ctx, mine));

    const auto n = static_cast<size_t>(s.nranks);
    const auto k = static_cast<size_t>(s.cfg.topk);
    const size_t row = s.rowBytes();
    const size_t wire = row + k * (sizeof(int32_t) + sizeof(float));
    std::vector<uint8_t> sendb(s.send_order.size() * wire);
    for (size_t p = 0; p < s.send_order.size(); ++p) {
      const size_t t = s.send_order[p];
      uint8_t* w = &sendb[p * wire];
      std::memcpy(w, static_cast<const uint8_t*>(c.x) + t * row, row);
      std::memcpy(w + row, &s.ids[t * k], k * sizeof(int32_t));
      if (c.topk_weights != nullptr) {
        std::memcpy(w + row + k * sizeof(int32_t), c.topk_weights + t * k, k * sizeof(float));
      } else {
        const float one = 1.0f;
        for (size_t j = 0; j < k; ++j) std::memcpy(w + row + (k + j) * sizeof(int32_t), &one, sizeof one);
      }
    }
    const size_t rows_in = std::accumulate(s.recv_rows.begin(), s.recv_rows.end(), size_t{0});
    std::vector<uint8_t> recvb(rows_in * wire);
    std::vector<size_t> scount(n), sdisp(n), rcount(n), rdisp(n);
    for (size_t r = 0, sa = 0, ra = 0; r < n; ++r) {
      scount[r] = s.send_counts[r] * wire, sdisp[r] = sa, sa += scount[r];
      rcount[r] = s.recv_rows[r] * wire, rdisp[r] = ra, ra += rcount[r];
    }
    CHORUS_RETURN_IF_ERROR(ctx.allToAllV(sendb.data(), scount, sdisp, recvb.data(), rcount, rdisp, chorusUint8));

    const int L = s.localExperts();
    const int first = s.rank * L;
    std::vector<size_t> off(static_cast<size_t>(L), 0), cur(static_cast<size_t>(L), 0);
    for (int e = 1; e < L; ++e) off[static_cast<size_t>(e)] = off[static_cast<size_t>(e - 1)] + s.recv_per_expert[static_cast<size_t>(e - 1)];
    s.slot_begin.assign(1, 0);
    s.slots.clear();
    s.slot_k.clear();
    std::vector<std::pair<int32_t, int32_t>> mine_e;  // (expert, choice j)
    for (size_t i = 0; i < rows_in; ++i) {
      const uint8_t* w = &recvb[i * wire];
      mine_e.clear();
      for (size_t j = 0; j < k; ++j) {
        int32_t e;
        std::memcpy(&e, w + row + j * sizeof(int32_t), sizeof e);
        if (e >= first && e < first + L) mine_e.emplace_back(e, static_cast<int32_t>(j));
      }
      if (mine_e.empty()) return internalError("received row {} names none of this rank's experts", i);
      std::sort(mine_e.begin(), mine_e.end());
      for (auto [e, j] : mine_e) {
        const auto le = static_cast<size_t>(e - first);
        if (cur[le] >= s.recv_per_expert[le])
          return internalError("more rows for expert {} than the {} its layout announced: the counts do not add up", e,
                               s.recv_per_expert[le]);
        const size_t slot = off[le] + cur[le]++;
        std::memcpy(static_cast<uint8_t*>(c.recv_x) + slot * row, w, row);
        if (c.recv_weights != nullptr)
          std::memcpy(&c.recv_weights[slot], w + row + (k + static_cast<size_t>(j)) * sizeof(int32_t), sizeof(float));
        s.slots.push_back(slot);
        s.slot_k.push_back(j);
      }
      s.slot_begin.push_back(s.slots.size());
    }
    for (int e = 0; e < L; ++e)
      if (cur[static_cast<size_t>(e)] != s.recv_per_expert[static_cast<size_t>(e)])
        return internalError("expert {} received {} rows but its layout announced {}: the counts do not add up",
                             first + e, cur[static_cast<size_t>(e)], s.recv_per_expert[static_cast<size_t>(e)]);
    s.dispatched = true;
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpDispatch() { return std::make_unique<Dispatch>(); }

}  // namespace chorus::prim::ep
