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
#include <functional>
#include <numeric>
#include <span>

#include "exec/local_ops.hpp"
#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

// Summation lists: for output row j, the src rows p with target[p] == j in
// the order `order` lists them: rows[begin[j] .. begin[j + 1]) (State scratch).
template <class Order>
void sumLists(const Order& order, const std::vector<size_t>& target, size_t out_rows, std::vector<size_t>& begin,
              std::vector<size_t>& rows) {
  begin.assign(out_rows + 1, 0);
  size_t total = 0;
  order([&](size_t p) { ++begin[target[p] + 1], ++total; });
  for (size_t j = 0; j < out_rows; ++j) begin[j + 1] += begin[j];
  rows.resize(total);
  std::vector<size_t> next(begin.begin(), begin.end() - 1);
  order([&](size_t p) { rows[next[target[p]]++] = p; });
}

// out rows [j0, j1): row j = the sum of its list's src rows (src(p): where
// row p is), from +0 in float32, rounded once; a row with none is +0.
template <class Src>
void sumRange(size_t j0, size_t j1, const Src& src, uint8_t* out, size_t h, size_t row, chorusDataType_t dt,
              const std::vector<size_t>& begin, const std::vector<size_t>& rows) {
  std::vector<float> acc(h);
  for (size_t j = j0; j < j1; ++j) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t q = begin[j]; q < begin[j + 1]; ++q)
      exec::runLocalOp(exec::LocalOp::accumulate(acc.data(), src(rows[q]), h, dt, 1.0f));
    exec::runLocalOp(exec::LocalOp::fromFloat(&out[j * row], acc.data(), h, dt));
  }
}

// Calls f(j0, j1) for chunk ch of each of the blocks (rows per block; packed in order).
template <class F>
void forChunk(std::span<const size_t> blocks, size_t ch, size_t chunks, const F& f) {
  size_t at = 0;
  for (size_t rows : blocks) {
    f(at + chunkStart(rows, ch, chunks), at + chunkStart(rows, ch + 1, chunks));
    at += rows;
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
    PhaseClock clock("combine", s.rank);
    Status mine;
    if (!s.dispatched) mine = invalidUsage("no dispatch to undo: call chorusEpDispatch first (or its last call failed)");
    else if (s.num_recv > 0 && c.expert_out == nullptr)
      mine = invalidArgument("expertOut is NULL but dispatch delivered {} rows", s.num_recv);
    else if (s.tokens > 0 && c.out == nullptr) mine = invalidArgument("out is NULL but the layout has {} tokens", s.tokens);
    // The busiest rank's bytes to its homes set the last exchange's batches.
    int64_t busiest = 0;
    if (s.dispatched) {
      const std::vector<size_t>& back = s.nodeLimited() ? s.hop1_rows : s.recv_rows;
      busiest = static_cast<int64_t>(std::accumulate(back.begin(), back.end(), size_t{0}) * s.rowBytes());
    }
    CHORUS_RETURN_IF_ERROR(agree(ctx, mine, {}, {}, &busiest));

    const auto n = static_cast<size_t>(s.nranks);
    const size_t h = s.cfg.hidden;
    const size_t row = s.rowBytes();
    const chorusDataType_t dt = s.cfg.dtype;
    const size_t rows_in = s.slot_begin.size() - 1;
    const auto self = static_cast<size_t>(s.rank);
    uint8_t* sendb = grow(s.scratch[0], rows_in * row);
    // This rank's partial of each received row (the token's experts here).
    const auto expertSum = [&](size_t i0, size_t i1) {
      std::vector<float> acc(h);
      for (size_t i = i0; i < i1; ++i) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (size_t q = s.slot_begin[i]; q < s.slot_begin[i + 1]; ++q) {
          const size_t slot = s.slots[q];
          const float w = c.weights != nullptr ? c.weights[slot] : 1.0f;
          exec::runLocalOp(
              exec::LocalOp::accumulate(acc.data(), static_cast<const uint8_t*>(c.expert_out) + slot * row, h, dt, w));
        }
        exec::runLocalOp(exec::LocalOp::fromFloat(&sendb[i * row], acc.data(), h, dt));
      }
    };
    // The last exchange (home-bound) is pipelined: chunk c + 1 is summed
    // while chunk c is on the wire (exchangeChunked); the rows a rank sends
    // itself skip it and are read where they were summed.
    const std::vector<size_t>& sent_back = s.nodeLimited() ? s.hop1_rows : s.recv_rows;
    std::vector<size_t> bd(n + 1, 0);  // its send blocks (rows)
    for (size_t q = 0; q < n; ++q) bd[q + 1] = bd[q] + sent_back[q];
    const size_t chunks = chunksFor(s, busiest);
    const uint8_t* homeb = sendb;  // what the last exchange sends
    std::function<void(size_t)> prepare;
    size_t self_at = 0, keep = 0;  // node-limited: the relay's own partials' arrival index and hop2 entry
    uint8_t* back = nullptr;
    uint8_t* summed = nullptr;
    if (s.nodeLimited()) {
      // Back to the relays (one batch: shared memory inside the host), which
      // sum their host's partials per first-hop row (hop2_rows is rank-major:
      // each row's partials in ascending rank); the partials a relay keeps
      // are read from sendb.
      expertSum(0, rows_in);
      clock.mark("expert_sum");
      for (size_t q = 0; q < self; ++q) self_at += s.recv_rows[q], keep += s.hop2_counts[q];
      const size_t keep_end = keep + s.hop2_counts[self];
      back = grow(s.scratch[1], s.hop2_rows.size() * row);
      CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, sendb, s.recv_rows, back, s.hop2_counts, row, s.rank));
      clock.mark("hop2");
      const size_t rows1 = bd[n];
      summed = grow(s.scratch[3], rows1 * row);
      const auto inOrder = [&](auto&& f) {
        for (size_t p = 0; p < s.hop2_rows.size(); ++p) f(p);
      };
      for (size_t p : s.hop2_rows)
        if (p >= rows1) return internalError("forward entry names first-hop row {} of {}", p, rows1);
      sumLists(inOrder, s.hop2_rows, rows1, s.sum_begin, s.sum_rows);
      prepare = [&, keep_end](size_t ch) {
        const auto src = [&](size_t p) -> const uint8_t* {
          return p >= keep && p < keep_end ? &sendb[(self_at + p - keep) * row] : &back[p * row];
        };
        forChunk(s.hop1_rows, ch, chunks,
                 [&](size_t j0, size_t j1) { sumRange(j0, j1, src, summed, h, row, dt, s.sum_begin, s.sum_rows); });
      };
      homeb = summed;
    } else {
      prepare = [&](size_t ch) { forChunk(s.recv_rows, ch, chunks, expertSum); };
    }
    uint8_t* recvb = grow(s.scratch[2], s.send_order.size() * row);
    CHORUS_RETURN_IF_ERROR(
        exchangeChunked(ctx, homeb, sent_back, recvb, s.send_counts, row, s.rank, chunks, prepare, {}));
    clock.mark(s.nodeLimited() ? "relay_sum+hop1" : "expert_sum+exchange");

    // Home: each token's partials in ascending rank (direct) or host
    // (node-limited) order; its own (this rank's block) where they were summed.
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
    if (s.send_counts[self] != sent_back[self])
      return internalError("this rank sends itself {} rows but expects {} back", sent_back[self], s.send_counts[self]);
    const auto homeSrc = [&](size_t p) -> const uint8_t* {
      return p >= displ[self] && p < displ[self + 1] ? &homeb[(bd[self] + p - displ[self]) * row] : &recvb[p * row];
    };
    sumLists(homeOrder, s.send_order, s.tokens, s.sum_begin, s.sum_rows);
    sumRange(0, s.tokens, homeSrc, static_cast<uint8_t*>(c.out), h, row, dt, s.sum_begin, s.sum_rows);
    clock.mark("home_sum");
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpCombine() { return std::make_unique<Combine>(); }

}  // namespace chorus::prim::ep
