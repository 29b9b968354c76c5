// "ep_return_topk": per-row float32 values of the last dispatch's recvX rows
// back to the (token, choice) each came from: the adjoint of dispatch's
// recvWeights, which a torch backward needs for the gate scores' gradient
// (prim/ep.hpp; chorusEpReturnTopk).  Each wire row of the dispatch carries k
// floats back, its experts' values at their choice positions; at home value j
// of a token's row from rank r lands at topkValues[t * k + j] for the choices
// whose expert lives on r: each (token, choice) written exactly once.
#include <cstring>

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
    const size_t rows_in = s.slot_begin.size() - 1;
    std::vector<float> sendb(rows_in * k, 0.0f);
    for (size_t i = 0; i < rows_in; ++i)
      for (size_t q = s.slot_begin[i]; q < s.slot_begin[i + 1]; ++q)
        sendb[i * k + static_cast<size_t>(s.slot_k[q])] = c.row_values[s.slots[q]];
    std::vector<float> recvb(s.send_order.size() * k);
    std::vector<size_t> scount(n), sdisp(n), rcount(n), rdisp(n);
    for (size_t r = 0, sa = 0, ra = 0; r < n; ++r) {
      scount[r] = s.recv_rows[r] * k, sdisp[r] = sa, sa += scount[r];
      rcount[r] = s.send_counts[r] * k, rdisp[r] = ra, ra += rcount[r];
    }
    CHORUS_RETURN_IF_ERROR(ctx.allToAllV(sendb.data(), scount, sdisp, recvb.data(), rcount, rdisp, chorusFloat32));
    for (size_t r = 0, p = 0; r < n; ++r)
      for (size_t q = 0; q < s.send_counts[r]; ++q, ++p) {
        const size_t t = s.send_order[p];
        for (size_t j = 0; j < k; ++j)
          if (static_cast<size_t>(s.rankOf(s.ids[t * k + j])) == r) c.topk_values[t * k + j] = recvb[p * k + j];
      }
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpReturnTopk() { return std::make_unique<ReturnTopk>(); }

}  // namespace chorus::prim::ep
