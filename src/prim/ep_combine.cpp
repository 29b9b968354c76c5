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
// The arithmetic runs as exec local operations (Accumulate, FromFloat), one
// output row at a time: its float32 accumulator stays in cache, and no
// tokens x hidden float32 array is written and read back.
#include <algorithm>
#include <numeric>

#include "exec/local_ops.hpp"
#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

// out row j = the sum of the src rows p with target[p] == j, taken in the
// order `order` lists them, each from +0 in float32, rounded once; a row
// with none is +0.  begin/rows are the summation lists (State scratch).
template <class Order>
void sumRows(const Order& order, const std::vector<size_t>& target, size_t out_rows, const uint8_t* src, uint8_t* out,
             size_t h, size_t row, chorusDataType_t dt, std::vector<size_t>& begin, std::vector<size_t>& rows) {
  begin.assign(out_rows + 1, 0);
  size_t total = 0;
  order([&](size_t p) { ++begin[target[p] + 1], ++total; });
  for (size_t j = 0; j < out_rows; ++j) begin[j + 1] += begin[j];
  rows.resize(total);
  std::vector<size_t> next(begin.begin(), begin.end() - 1);
  order([&](size_t p) { rows[next[target[p]]++] = p; });
  std::vector<float> acc(h);
  for (size_t j = 0; j < out_rows; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t q = begin[j]; q < begin[j + 1]; ++q)
      exec::runLocalOp(exec::LocalOp::accumulate(acc.data(), &src[rows[q] * row], h, dt, 1.0f));
    exec::runLocalOp(exec::LocalOp::fromFloat(&out[j * row], acc.data(), h, dt));
  }
}

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
      // Back to the relays, which sum their host's partials per first-hop row
      // (hop2_rows is rank-major: each row's partials in ascending rank).
      uint8_t* back = grow(s.scratch[1], s.hop2_rows.size() * row);
      CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, sendb, s.recv_rows, back, s.hop2_counts, row));
      const size_t rows1 = std::accumulate(s.hop1_rows.begin(), s.hop1_rows.end(), size_t{0});
      uint8_t* summed = grow(s.scratch[0], rows1 * row);  // sendb's rows are in `back` now
      const auto inOrder = [&](auto&& f) {
        for (size_t p = 0; p < s.hop2_rows.size(); ++p) f(p);
      };
      sumRows(inOrder, s.hop2_rows, rows1, back, summed, h, row, dt, s.sum_begin, s.sum_rows);
      sendb = summed;
    }
    const std::vector<size_t>& sent_back = s.nodeLimited() ? s.hop1_rows : s.recv_rows;
    uint8_t* recvb = grow(s.scratch[2], s.send_order.size() * row);
    CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, sendb, sent_back, recvb, s.send_counts, row));

    // Home: each token's partials in ascending rank (direct) or host (node-limited) order.
    std::vector<size_t> displ(n + 1, 0);
    for (size_t r = 0; r < n; ++r) displ[r + 1] = displ[r] + s.send_counts[r];
    const auto homeOrder = [&](auto&& f) {
      const auto from = [&](size_t r) {
        for (size_t p = displ[r]; p < displ[r + 1]; ++p) f(p);
      };
      if (!s.nodeLimited()) {
        for (size_t r = 0; r < n; ++r) from(r);
      } else {
        for (int hh = 0; hh < s.nhosts; ++hh) from(static_cast<size_t>(s.relayFor(hh)));
      }
    };
    sumRows(homeOrder, s.send_order, s.tokens, recvb, static_cast<uint8_t*>(c.out), h, row, dt, s.sum_begin, s.sum_rows);
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpCombine() { return std::make_unique<Combine>(); }

}  // namespace chorus::prim::ep
