// "ep_combine": expert outputs back to their tokens, weighted by the gate's
// scores and summed in a fixed order (prim/ep.hpp; chorusEpCombine; the order
// is chorus.h's, "Expert parallelism").
//
// On each rank, per received wire row (the token as dispatch delivered it):
// a float32 accumulator from +0 adds weight x expertOut of the row's experts
// in ascending expert id, rounded to the datatype: the token's partial for
// this rank.  Direct routing: one all-to-all-v sends the partials back
// (dispatch's exchange reversed); at home a float32 accumulator per token
// from +0 adds the partials in ascending rank order (the send order is
// rank-major), rounded once.  Node-limited routing: the partials go back to
// the relay, which sums the partials of its host's ranks for each token (from
// +0, ascending rank, rounded: one row per host crosses the network), and the
// home adds the hosts' partials from +0 in ascending host order, rounded.
// The arithmetic runs as exec local operations (Accumulate, FromFloat).
#include <algorithm>
#include <numeric>

#include "exec/local_ops.hpp"
#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

class Combine final : public Primitive {
 public:
  std::string_view name() const override { return "ep_combine"; }
  std::string_view summary() const override {
    return "MoE combine: expert outputs to their tokens, weighted, summed in expert order (chorusEpCombine; aux: its call block)";
  }

  Status run(Context& ctx, const Args& args) const override {
    auto call = callOf(args);
    if (!call.isOk()) return call.status();
    const Call& c = **call;
    State& s = *c.state;
    Status mine;
    if (!s.dispatched) mine = invalidUsage("no dispatch to undo: call chorusEpDispatch first (or its last call failed)");
    else if (s.num_recv > 0 && c.expert_out == nullptr)
      mine = invalidArgument("expertOut is NULL but dispatch delivered {} rows", s.num_recv);
    else if (s.tokens > 0 && c.out == nullptr) mine = invalidArgument("out is NULL but the layout has {} tokens", s.tokens);
    CHORUS_RETURN_IF_ERROR(agree(ctx, mine));

    const auto n = static_cast<size_t>(s.nranks);
    const size_t h = s.cfg.hidden;
    const size_t row = s.rowBytes();
    const chorusDataType_t dt = s.cfg.dtype;
    const size_t rows_in = s.slot_begin.size() - 1;
    uint8_t* sendb = grow(s.scratch[0], rows_in * row);
    std::vector<float> acc(h);
    for (size_t i = 0; i < rows_in; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t q = s.slot_begin[i]; q < s.slot_begin[i + 1]; ++q) {
        const size_t slot = s.slots[q];
        const float w = c.weights != nullptr ? c.weights[slot] : 1.0f;
        exec::runLocalOp(exec::LocalOp::accumulate(acc.data(), static_cast<const uint8_t*>(c.expert_out) + slot * row, h, dt, w));
      }
      exec::runLocalOp(exec::LocalOp::fromFloat(&sendb[i * row], acc.data(), h, dt));
    }
    if (s.nodeLimited()) {
      // Back to the relays, which sum their host's partials per first-hop row.
      uint8_t* back = grow(s.scratch[1], s.hop2_rows.size() * row);
      CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, sendb, s.recv_rows, back, s.hop2_counts, row));
      const size_t rows1 = std::accumulate(s.hop1_rows.begin(), s.hop1_rows.end(), size_t{0});
      float* host = grow(s.fscratch[0], rows1 * h);
      std::fill_n(host, rows1 * h, 0.0f);
      for (size_t p = 0; p < s.hop2_rows.size(); ++p)  // rank-major: each row's partials in ascending rank
        exec::runLocalOp(exec::LocalOp::accumulate(&host[s.hop2_rows[p] * h], &back[p * row], h, dt, 1.0f));
      sendb = grow(s.scratch[0], rows1 * row);
      exec::runLocalOp(exec::LocalOp::fromFloat(sendb, host, rows1 * h, dt));
    }
    const std::vector<size_t>& sent_back = s.nodeLimited() ? s.hop1_rows : s.recv_rows;
    uint8_t* recvb = grow(s.scratch[2], s.send_order.size() * row);
    CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, sendb, sent_back, recvb, s.send_counts, row));

    // Home: each token's partials in ascending rank (direct) or host (node-limited) order.
    float* home = grow(s.fscratch[1], s.tokens * h);
    std::fill_n(home, s.tokens * h, 0.0f);
    std::vector<size_t> displ(n + 1, 0);
    for (size_t r = 0; r < n; ++r) displ[r + 1] = displ[r] + s.send_counts[r];
    auto addFrom = [&](size_t r) {
      for (size_t p = displ[r]; p < displ[r + 1]; ++p)
        exec::runLocalOp(exec::LocalOp::accumulate(&home[s.send_order[p] * h], &recvb[p * row], h, dt, 1.0f));
    };
    if (!s.nodeLimited()) {
      for (size_t r = 0; r < n; ++r) addFrom(r);
    } else {
      for (int hh = 0; hh < s.nhosts; ++hh) addFrom(static_cast<size_t>(s.relayFor(hh)));
    }
    exec::runLocalOp(exec::LocalOp::fromFloat(c.out, home, s.tokens * h, dt));
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpCombine() { return std::make_unique<Combine>(); }

}  // namespace chorus::prim::ep
