// "ep_layout": the dispatch layout from the router's top-k expert ids, then
// one all-to-all of counts so that every rank knows what it will receive
// (prim/ep.hpp; chorusEpLayout).
//
// Local: each id checked (in [0, numExperts), not twice in a token's row);
// per destination rank the tokens that have an expert there, in ascending
// token order (the send order; a token counted once per rank, however many of
// its experts live there); per host and per expert counts.  Then the ranks
// agree (a rank's bad ids fail the call on every rank) and exchange, per
// pair, [rows, rows for local expert 0, ..., local expert L-1], from which the
// receiver knows its rows per local expert before any data moves.
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
    const int k = s.cfg.topk;
    const int L = s.localExperts();
    Status mine = local(c, s);
    CHORUS_RETURN_IF_ERROR(agree(ctx, mine));

    // [rows, rows per local expert...] for each destination.
    const size_t w = 1 + static_cast<size_t>(L);
    std::vector<uint64_t> sc(w * static_cast<size_t>(n), 0), rc(sc.size(), 0);
    for (size_t t = 0; t < s.tokens; ++t) {
      int last = -1;
      std::vector<int32_t> row(s.ids.begin() + static_cast<ptrdiff_t>(t * k), s.ids.begin() + static_cast<ptrdiff_t>((t + 1) * k));
      std::sort(row.begin(), row.end());
      for (int32_t e : row) {
        const int r = s.rankOf(e);
        if (r != last) sc[static_cast<size_t>(r) * w] += 1, last = r;
        sc[static_cast<size_t>(r) * w + 1 + static_cast<size_t>(e - r * L)] += 1;
      }
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
      if (slots < p[0] || slots > p[0] * static_cast<uint64_t>(std::min(k, L)) || p[0] > (uint64_t{1} << 40))
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
  // This rank's own part: validation, counts, send order.
  static Status local(const Call& c, State& s) {
    const size_t k = static_cast<size_t>(s.cfg.topk);
    const int E = s.cfg.experts;
    if (c.tokens > (size_t{1} << 40)) return invalidArgument("numTokens={} is beyond 2^40", c.tokens);
    if (c.tokens > 0 && c.topk_idx == nullptr) return invalidArgument("topkIdx is NULL but numTokens={}", c.tokens);
    s.tokens = c.tokens;
    s.ids.resize(c.tokens * k);
    for (size_t i = 0; i < s.ids.size(); ++i) {
      const int64_t v = s.cfg.index_type == chorusInt32 ? static_cast<const int32_t*>(c.topk_idx)[i]
                                                        : static_cast<const int64_t*>(c.topk_idx)[i];
      if (v < 0 || v >= E)
        return invalidArgument("topkIdx[{}] (token {}, choice {}) = {} is not an expert id (0..{})", i, i / k, i % k, v,
                               E - 1);
      for (size_t j = i - i % k; j < i; ++j)
        if (s.ids[j] == v)
          return invalidArgument("topkIdx[{}] (token {}) = {} repeats choice {} of the same token", i, i / k, v, j % k);
      s.ids[i] = static_cast<int32_t>(v);
    }
    const auto n = static_cast<size_t>(s.nranks);
    s.send_counts.assign(n, 0);
    std::vector<size_t> per_host(static_cast<size_t>(s.nhosts), 0), per_expert(static_cast<size_t>(E), 0);
    std::vector<std::vector<size_t>> to(n);
    std::vector<char> in_rank(n), in_host(static_cast<size_t>(s.nhosts));
    for (size_t t = 0; t < c.tokens; ++t) {
      std::fill(in_rank.begin(), in_rank.end(), 0);
      std::fill(in_host.begin(), in_host.end(), 0);
      for (size_t j = 0; j < k; ++j) {
        const int e = s.ids[t * k + j];
        const auto r = static_cast<size_t>(s.rankOf(e));
        per_expert[static_cast<size_t>(e)] += 1;
        in_rank[r] = 1;
        in_host[static_cast<size_t>(s.host_of[r])] = 1;
      }
      for (size_t r = 0; r < n; ++r)
        if (in_rank[r]) to[r].push_back(t);
      for (size_t h = 0; h < in_host.size(); ++h) per_host[h] += in_host[h];
    }
    s.send_order.clear();
    for (size_t r = 0; r < n; ++r) {
      s.send_counts[r] = to[r].size();
      s.send_order.insert(s.send_order.end(), to[r].begin(), to[r].end());
    }
    if (c.tokens_per_rank != nullptr) std::copy(s.send_counts.begin(), s.send_counts.end(), c.tokens_per_rank);
    if (c.tokens_per_host != nullptr) std::copy(per_host.begin(), per_host.end(), c.tokens_per_host);
    if (c.tokens_per_expert != nullptr) std::copy(per_expert.begin(), per_expert.end(), c.tokens_per_expert);
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpLayout() { return std::make_unique<Layout>(); }

}  // namespace chorus::prim::ep
