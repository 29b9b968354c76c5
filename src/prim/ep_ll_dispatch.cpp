// "ep_ll_dispatch": the low-latency dispatch for decode (prim/ep.hpp;
// chorusEpLowLatencyDispatch; DeepEP's low-latency kernels' shape).
//
// No layout step and no count exchange before the data: every rank sends
// every rank one block of a fixed size (kLlHeader + lowLatencyMaxTokens wire
// rows) in one all-to-all; the header says how many rows follow (or that
// the sender refused its own arguments).  The receiver writes the rows into
// fixed-size per-expert buffers, recvX[L][nranks * maxTokens][hidden]: rows
// of local expert e from index 0 up, by source rank, then the source's token
// (the normal dispatch's grouping, each expert at its fixed offset), and
// recvCount[e] says how many.
//
// A rank's bad arguments -- more tokens than lowLatencyMaxTokens (its blocks
// would overflow the receivers' buffers), bad ids, NULL buffers -- are known
// before it sends: it sends refusing headers and no rows, so the one
// exchange tells every rank, each of which fails naming it, and no rank
// writes recvX.  Direct routing only (the config refuses a node limit).
#include <algorithm>
#include <cstring>

#include "exec/local_ops.hpp"
#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

class LlDispatch final : public Primitive {
 public:
  std::string_view name() const override { return "ep_ll_dispatch"; }
  std::string_view summary() const override {
    return "MoE low-latency dispatch: fixed-size per-expert buffers, no count exchange "
           "(chorusEpLowLatencyDispatch; aux: its call block)";
  }

  Status run(Context& ctx, const Args& args) const override {
    auto call = callOf(args);
    if (!call.isOk()) return call.status();
    const Call& c = **call;
    State& s = *c.state;
    s.ll_dispatched = false;
    const size_t M = static_cast<size_t>(s.cfg.ll_max_tokens);
    if (M == 0)  // the config is the same on every rank: all fail alike, without a message
      return invalidUsage("the low-latency mode is off: create the handle with config.lowLatencyMaxTokens > 0");
    const auto n = static_cast<size_t>(s.nranks);
    const auto k = static_cast<size_t>(s.cfg.topk);
    const auto L = static_cast<size_t>(s.localExperts());
    const bool z = s.cfg.compressed();
    const size_t payload = z ? wireBytes(s.cfg.wire(), s.cfg.hidden) : s.rowBytes();
    const size_t W = plan::ep::dispatchRowBytes(payload, k);
    const size_t block = kLlHeader + M * W;

    std::vector<int32_t> ids;
    Status mine = readIds(s.cfg, c.topk_idx, c.tokens, &ids);
    if (mine.isOk()) {
      if (c.tokens > M)
        mine = invalidArgument("numTokens={} exceeds config.lowLatencyMaxTokens={}: the receivers' fixed buffers hold "
                               "{} tokens per rank",
                               c.tokens, M, M);
      else if (c.tokens > 0 && c.x == nullptr)
        mine = invalidArgument("x is NULL but numTokens={}", c.tokens);
      else if (c.recv_x == nullptr)
        mine = invalidArgument("recvX is NULL (it holds numLocalExperts x nranks x lowLatencyMaxTokens rows)");
      else if (c.recv_count == nullptr)
        mine = invalidArgument("recvCount is NULL (numLocalExperts entries)");
    }

    std::vector<uint8_t> sendb(n * block, 0), recvb(n * block);
    std::vector<std::vector<size_t>> sent(n);
    if (mine.isOk()) {
      std::vector<float> tmp(z ? s.cfg.hidden : 0);
      std::vector<int> ranks;
      for (size_t t = 0; t < c.tokens; ++t) {
        ranks.clear();
        for (size_t j = 0; j < k; ++j) ranks.push_back(s.rankOf(ids[t * k + j]));
        std::sort(ranks.begin(), ranks.end());
        ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
        for (int q : ranks) {
          auto& to = sent[static_cast<size_t>(q)];
          uint8_t* w = &sendb[static_cast<size_t>(q) * block + kLlHeader + to.size() * W];
          to.push_back(t);
          const uint8_t* xr = static_cast<const uint8_t*>(c.x) + t * s.rowBytes();
          if (z) {
            exec::runLocalOp(exec::LocalOp::toFloat(tmp.data(), xr, s.cfg.hidden, s.cfg.dtype));
            exec::runLocalOp(exec::LocalOp::quantize(w, tmp.data(), s.cfg.hidden, s.cfg.wire()));
          } else {
            std::memcpy(w, xr, payload);
          }
          std::memcpy(w + payload, &ids[t * k], k * sizeof(int32_t));
          for (size_t j = 0; j < k; ++j) {
            const float wt = c.topk_weights != nullptr ? c.topk_weights[t * k + j] : 1.0f;
            std::memcpy(w + payload + k * sizeof(int32_t) + j * sizeof(float), &wt, sizeof wt);
          }
          const uint64_t origin[2] = {static_cast<uint64_t>(s.rank), t};
          std::memcpy(w + payload + k * 8, origin, sizeof origin);
        }
      }
    }
    for (size_t q = 0; q < n; ++q) {
      const uint64_t hdr[2] = {mine.isOk() ? 0 : kLlRefused, mine.isOk() ? sent[q].size() : 0};
      std::memcpy(&sendb[q * block], hdr, sizeof hdr);
    }
    CHORUS_RETURN_IF_ERROR(ctx.allToAll(sendb.data(), recvb.data(), block, chorusUint8));
    if (!mine.isOk()) return mine;

    // Every header first: a refusing or impossible one fails the call before
    // any write into recvX.
    std::vector<size_t> rows_from(n);
    for (size_t src = 0; src < n; ++src) {
      uint64_t hdr[2];
      std::memcpy(hdr, &recvb[src * block], sizeof hdr);
      if (hdr[0] == kLlRefused)
        return invalidArgument("rank {} refused its arguments (its error names them); no data was written", src);
      if (hdr[0] != 0 || hdr[1] > M)
        return internalError("rank {} sent a low-latency block of {} rows (at most {}; flag {}): the counts do not add up",
                             src, hdr[1], M, hdr[0]);
      rows_from[src] = hdr[1];
    }
    const size_t cap = n * M;  // rows per expert buffer
    const size_t row = s.rowBytes();
    const int first = s.rank * static_cast<int>(L);
    std::vector<size_t> count(L, 0);
    s.ll_slot_begin.assign(1, 0);
    s.ll_slots.clear();
    std::vector<float> tmp(z ? s.cfg.hidden : 0);
    std::vector<std::pair<int32_t, int32_t>> mine_e;
    for (size_t src = 0; src < n; ++src)
      for (size_t i = 0; i < rows_from[src]; ++i) {
        const uint8_t* w = &recvb[src * block + kLlHeader + i * W];
        uint64_t origin[2];
        std::memcpy(origin, w + payload + k * 8, sizeof origin);
        if (origin[0] != src || origin[1] >= M)
          return internalError("rank {}'s row {} claims origin ({}, {}): the counts do not add up", src, i, origin[0],
                               origin[1]);
        mine_e.clear();
        for (size_t j = 0; j < k; ++j) {
          int32_t e;
          std::memcpy(&e, w + payload + j * sizeof(int32_t), sizeof e);
          if (e >= first && e < first + static_cast<int>(L)) mine_e.emplace_back(e, static_cast<int32_t>(j));
        }
        if (mine_e.empty()) return internalError("rank {}'s row {} names none of this rank's experts", src, i);
        std::sort(mine_e.begin(), mine_e.end());
        const uint8_t* src_row = w;
        if (z) {  // decoded once, rounded to the datatype into each slot
          exec::runLocalOp(exec::LocalOp::dequantize(tmp.data(), w, s.cfg.hidden, s.cfg.wire()));
        }
        for (auto [e, j] : mine_e) {
          const auto le = static_cast<size_t>(e - first);
          if (count[le] >= cap)
            return internalError("expert {} receives more than {} rows: the counts do not add up", e, cap);
          const size_t slot = le * cap + count[le]++;
          uint8_t* dst = static_cast<uint8_t*>(c.recv_x) + slot * row;
          if (z) {
            exec::runLocalOp(exec::LocalOp::fromFloat(dst, tmp.data(), s.cfg.hidden, s.cfg.dtype));
          } else {
            std::memcpy(dst, src_row, row);
          }
          if (c.recv_weights != nullptr)
            std::memcpy(&c.recv_weights[slot], w + payload + k * sizeof(int32_t) + static_cast<size_t>(j) * sizeof(float),
                        sizeof(float));
          s.ll_slots.push_back(slot);
        }
        s.ll_slot_begin.push_back(s.ll_slots.size());
      }
    std::copy(count.begin(), count.end(), c.recv_count);
    s.ll_sent = std::move(sent);
    s.ll_rows_from = std::move(rows_from);
    s.ll_tokens = c.tokens;
    s.ll_dispatched = true;
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpLlDispatch() { return std::make_unique<LlDispatch>(); }

}  // namespace chorus::prim::ep
