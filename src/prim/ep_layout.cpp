// "ep_layout": the dispatch layout from the router's top-k expert ids, then
// the count exchange, so that every rank knows what it will receive before
// any data moves (prim/ep.hpp; chorusEpLayout).
//
// Local: each id checked (in [0, numExperts), not twice in a token's row,
// and with node-limited routing, a token's experts on at most
// maxHostsPerToken hosts); per destination the tokens that go there, in
// ascending token order (the send order); per rank, host and expert counts.
// Then the ranks agree (a rank's bad ids fail the call on every rank).
//
// Direct routing: one all-to-all of [rows, rows for local expert 0, ...,
// L-1] per pair.  Node-limited routing (one copy per host, to that host's
// relay, which forwards inside its host): an all-to-all of the first hop's
// row counts, an all-to-all-v of those rows' ids (so each relay knows where
// it forwards them), then the relays' [rows, rows per local expert] per pair
// inside their host.
#include <algorithm>

#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

class Layout final : public Primitive {
 public:
  std::string_view name() const override { return "ep_layout"; }
  std::string_view summary() const override {
    return "MoE dispatch layout from top-k expert ids + the count exchange (chorusEpLayout; aux: its call block)";
  }

  Status run(Context& ctx, const Args& args) const override {
    auto call = callOf(args);
    if (!call.isOk()) return call.status();
    const Call& c = **call;
    State& s = *c.state;
    s.laid_out = false;
    s.dispatched = false;
    const int n = s.nranks;
    const auto k = static_cast<size_t>(s.cfg.topk);
    const int L = s.localExperts();
    Status mine = local(c, s);
    CHORUS_RETURN_IF_ERROR(agree(ctx, mine));

    // The rows of the last hop, counted by their sender: [rows, rows per
    // local expert of the destination] per destination.
    const size_t w = 1 + static_cast<size_t>(L);
    std::vector<uint64_t> sc(w * static_cast<size_t>(n), 0), rc(sc.size(), 0);
    auto countRow = [&](const int32_t* ids, int only_host) { plan::ep::countLastHop(s.geo, ids, only_host, sc); };
    if (!s.nodeLimited()) {
      for (size_t t = 0; t < s.tokens; ++t) countRow(&s.ids[t * k], -1);
    } else {
      CHORUS_RETURN_IF_ERROR(relayHop(ctx, s));
      // The relay's forwarding inside its host (plan/ep_route.hpp).
      const int my_host = s.host_of[static_cast<size_t>(s.rank)];
      const size_t rows1 = s.hop1_ids.size() / k;
      auto fwd = plan::ep::forward(s.geo, s.rank, s.hop1_ids);
      if (!fwd.isOk()) return fwd.status();
      for (size_t i = 0; i < rows1; ++i) countRow(&s.hop1_ids[i * k], my_host);
      s.hop2_counts = std::move(fwd->counts);
      s.hop2_rows = std::move(fwd->rows);
    }
    CHORUS_RETURN_IF_ERROR(ctx.allToAll(sc.data(), rc.data(), w, chorusUint64));
    s.recv_rows.assign(static_cast<size_t>(n), 0);
    s.recv_per_expert.assign(static_cast<size_t>(L), 0);
    s.num_recv = 0;
    for (int src = 0; src < n; ++src) {
      const uint64_t* p = &rc[static_cast<size_t>(src) * w];
      uint64_t slots = 0;
      for (int e = 0; e < L; ++e) slots += p[1 + e];
      // What a peer announces must be possible: every row has 1..min(k, L) of our experts.
      if (slots < p[0] || slots > p[0] * std::min<uint64_t>(k, static_cast<uint64_t>(L)) || p[0] > (uint64_t{1} << 40))
        return internalError("rank {} announced {} rows carrying {} expert rows: the counts do not add up", src,
                             p[0], slots);
      s.recv_rows[static_cast<size_t>(src)] = p[0];
      for (int e = 0; e < L; ++e) s.recv_per_expert[static_cast<size_t>(e)] += p[1 + e];
      s.num_recv += slots;
    }
    if (c.recv_per_expert != nullptr) std::copy(s.recv_per_expert.begin(), s.recv_per_expert.end(), c.recv_per_expert);
    if (c.num_recv != nullptr) *c.num_recv = s.num_recv;
    s.laid_out = true;
    return {};
  }

 private:
  // Node-limited routing's first hop: the row counts to each relay, then the
  // rows' ids, which the relays check before they use them.
  static Status relayHop(Context& ctx, State& s) {
    const auto n = static_cast<size_t>(s.nranks);
    const auto k = static_cast<size_t>(s.cfg.topk);
    std::vector<uint64_t> sc(n), rc(n);
    for (size_t r = 0; r < n; ++r) sc[r] = s.send_counts[r];
    CHORUS_RETURN_IF_ERROR(ctx.allToAll(sc.data(), rc.data(), 1, chorusUint64));
    s.hop1_rows.assign(n, 0);
    size_t rows1 = 0;
    for (size_t r = 0; r < n; ++r) {
      if (rc[r] > (uint64_t{1} << 40)) return internalError("rank {} announced {} rows: the counts do not add up", r, rc[r]);
      s.hop1_rows[r] = rc[r], rows1 += rc[r];
    }
    std::vector<int32_t> out(s.send_order.size() * k);
    for (size_t p = 0; p < s.send_order.size(); ++p)
      std::copy_n(&s.ids[s.send_order[p] * k], k, &out[p * k]);
    s.hop1_ids.assign(rows1 * k, 0);
    CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, out.data(), s.send_counts, s.hop1_ids.data(), s.hop1_rows, k * sizeof(int32_t)));
    for (int32_t e : s.hop1_ids)
      if (e < 0 || e >= s.cfg.experts) return internalError("a relayed row names expert {}: the counts do not add up", e);
    return {};
  }

  // This rank's own part: validation, counts, send order.
  static Status local(const Call& c, State& s) {
    s.tokens = c.tokens;
    CHORUS_RETURN_IF_ERROR(readIds(s.cfg, c.topk_idx, c.tokens, &s.ids));
    // Per destination, the tokens that go there (plan/ep_route.hpp: the
    // simulator prices the same send order).
    auto hop = plan::ep::firstHop(s.geo, s.rank, s.ids);
    if (!hop.isOk()) return hop.status();
    s.send_counts = std::move(hop->send_counts);
    s.send_order = std::move(hop->send_order);
    const std::vector<size_t>& per_rank = hop->per_rank;
    const std::vector<size_t>& per_host = hop->per_host;
    const std::vector<size_t>& per_expert = hop->per_expert;
    if (c.tokens_per_rank != nullptr) std::copy(per_rank.begin(), per_rank.end(), c.tokens_per_rank);
    if (c.tokens_per_host != nullptr) std::copy(per_host.begin(), per_host.end(), c.tokens_per_host);
    if (c.tokens_per_expert != nullptr) std::copy(per_expert.begin(), per_expert.end(), c.tokens_per_expert);
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpLayout() { return std::make_unique<Layout>(); }

}  // namespace chorus::prim::ep
