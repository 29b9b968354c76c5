// "ep_return_topk": per-row float32 values of the last dispatch's recvX rows
// back to the (token, choice) each came from: the adjoint of dispatch's
// recvWeights, which a torch backward needs for the gate scores' gradient
// (prim/ep.hpp; chorusEpReturnTopk).  Each wire row of the dispatch carries k
// floats back, its experts' values at their choice positions (node-limited:
// the relay merges its host's rows for each first-hop row, each choice coming
// from the one rank that holds its expert); at home value j of a token's row
// from rank (or host) X lands at topkValues[t * k + j] for the choices whose
// expert lives on X: each (token, choice) written exactly once.
#include <numeric>

#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

class ReturnTopk final : public Primitive {
 public:
  std::string_view name() const override { return "ep_return_topk"; }
  std::string_view summary() const override {
    return "MoE: per-row values of the last dispatch back to their (token, k) (chorusEpReturnTopk; aux: its call block)";
  }

  Status run(Context& ctx, const Args& args) const override {
    auto call = callOf(args);
    if (!call.isOk()) return call.status();
    const Call& c = **call;
    State& s = *c.state;
    Status mine;
    if (!s.dispatched) mine = invalidUsage("no dispatch to undo: call chorusEpDispatch first (or its last call failed)");
    else if (s.num_recv > 0 && c.row_values == nullptr)
      mine = invalidArgument("rowValues is NULL but dispatch delivered {} rows", s.num_recv);
    else if (s.tokens > 0 && c.topk_values == nullptr)
      mine = invalidArgument("topkValues is NULL but the layout has {} tokens", s.tokens);
    CHORUS_RETURN_IF_ERROR(agree(ctx, mine));

    const auto n = static_cast<size_t>(s.nranks);
    const auto k = static_cast<size_t>(s.cfg.topk);
    const size_t kb = k * sizeof(float);
    const size_t rows_in = s.slot_begin.size() - 1;
    std::vector<float> sendb(rows_in * k, 0.0f);
    for (size_t i = 0; i < rows_in; ++i)
      for (size_t q = s.slot_begin[i]; q < s.slot_begin[i + 1]; ++q)
        sendb[i * k + static_cast<size_t>(s.slot_k[q])] = c.row_values[s.slots[q]];
    if (s.nodeLimited()) {
      std::vector<float> back(s.hop2_rows.size() * k);
      CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, sendb.data(), s.recv_rows, back.data(), s.hop2_counts, kb));
      const size_t rows1 = std::accumulate(s.hop1_rows.begin(), s.hop1_rows.end(), size_t{0});
      sendb.assign(rows1 * k, 0.0f);
      for (size_t q = 0, p = 0; q < n; ++q)
        for (size_t m = 0; m < s.hop2_counts[q]; ++m, ++p) {
          const size_t i = s.hop2_rows[p];
          for (size_t j = 0; j < k; ++j)
            if (static_cast<size_t>(s.rankOf(s.hop1_ids[i * k + j])) == q) sendb[i * k + j] = back[p * k + j];
        }
    }
    const std::vector<size_t>& sent_back = s.nodeLimited() ? s.hop1_rows : s.recv_rows;
    std::vector<float> recvb(s.send_order.size() * k);
    CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, sendb.data(), sent_back, recvb.data(), s.send_counts, kb));
    for (size_t r = 0, p = 0; r < n; ++r)
      for (size_t q = 0; q < s.send_counts[r]; ++q, ++p) {
        const size_t t = s.send_order[p];
        for (size_t j = 0; j < k; ++j) {
          const int holder = s.rankOf(s.ids[t * k + j]);
          const bool from_here = s.nodeLimited() ? s.relayFor(s.host_of[static_cast<size_t>(holder)]) == static_cast<int>(r)
                                                 : holder == static_cast<int>(r);
          if (from_here) c.topk_values[t * k + j] = recvb[p * k + j];
        }
      }
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpReturnTopk() { return std::make_unique<ReturnTopk>(); }

}  // namespace chorus::prim::ep
