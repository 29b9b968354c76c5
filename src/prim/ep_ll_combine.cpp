// "ep_ll_combine": the low-latency combine (prim/ep.hpp;
// chorusEpLowLatencyCombine): the last low-latency dispatch undone.
//
// Each rank sums, per row it received, weight x expertOut of the row's
// experts here in ascending expert id (a float32 accumulator from +0, each
// product rounded, rounded once to the datatype) and sends each source one
// fixed-size block (kLlHeader + lowLatencyMaxTokens rows, the partials in the
// order the rows came); home adds each token's partials from +0 in ascending
// rank order and rounds once -- the normal combine's order with direct
// routing, so both give the same bits.  A rank's bad arguments travel as a
// refusing header, as in ep_ll_dispatch: every rank fails, none writes out.
#include <cstring>

#include "exec/local_ops.hpp"
#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

class LlCombine final : public Primitive {
 public:
  std::string_view name() const override { return "ep_ll_combine"; }
  std::string_view summary() const override {
    return "MoE low-latency combine: the last low-latency dispatch undone, fixed-size blocks "
           "(chorusEpLowLatencyCombine; aux: its call block)";
  }

  Status run(Context& ctx, const Args& args) const override {
    auto call = callOf(args);
    if (!call.isOk()) return call.status();
    const Call& c = **call;
    State& s = *c.state;
    const size_t M = static_cast<size_t>(s.cfg.ll_max_tokens);
    if (M == 0)
      return invalidUsage("the low-latency mode is off: create the handle with config.lowLatencyMaxTokens > 0");
    const auto n = static_cast<size_t>(s.nranks);
    const size_t h = s.cfg.hidden;
    const size_t row = s.rowBytes();
    const chorusDataType_t dt = s.cfg.dtype;
    const size_t block = kLlHeader + M * row;
    Status mine;
    if (!s.ll_dispatched)
      mine = invalidUsage("no low-latency dispatch to undo: call chorusEpLowLatencyDispatch first (or its last call failed)");
    else if (c.expert_out == nullptr) mine = invalidArgument("expertOut is NULL");
    else if (s.ll_tokens > 0 && c.out == nullptr) mine = invalidArgument("out is NULL but the dispatch had {} tokens", s.ll_tokens);

    std::vector<uint8_t> sendb(n * block, 0), recvb(n * block);
    if (mine.isOk()) {
      std::vector<float> acc(h);
      size_t r = 0;  // received row, sources ascending
      for (size_t src = 0; src < n; ++src)
        for (size_t i = 0; i < s.ll_rows_from[src]; ++i, ++r) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (size_t q = s.ll_slot_begin[r]; q < s.ll_slot_begin[r + 1]; ++q) {
            const size_t slot = s.ll_slots[q];
            const float w = c.weights != nullptr ? c.weights[slot] : 1.0f;
            exec::runLocalOp(
                exec::LocalOp::accumulate(acc.data(), static_cast<const uint8_t*>(c.expert_out) + slot * row, h, dt, w));
          }
          exec::runLocalOp(exec::LocalOp::fromFloat(&sendb[src * block + kLlHeader + i * row], acc.data(), h, dt));
        }
    }
    for (size_t q = 0; q < n; ++q) {
      const uint64_t hdr[2] = {mine.isOk() ? 0 : kLlRefused, mine.isOk() ? s.ll_rows_from[q] : 0};
      std::memcpy(&sendb[q * block], hdr, sizeof hdr);
    }
    CHORUS_RETURN_IF_ERROR(ctx.allToAll(sendb.data(), recvb.data(), block, chorusUint8));
    if (!mine.isOk()) return mine;
    for (size_t q = 0; q < n; ++q) {
      uint64_t hdr[2];
      std::memcpy(hdr, &recvb[q * block], sizeof hdr);
      if (hdr[0] == kLlRefused)
        return invalidArgument("rank {} refused its arguments (its error names them); no data was written", q);
      if (hdr[0] != 0 || hdr[1] != s.ll_sent[q].size())
        return internalError("rank {} sent back {} rows for the {} this rank sent it: the counts do not add up", q,
                             hdr[1], s.ll_sent[q].size());
    }
    std::vector<float> home(s.ll_tokens * h, 0.0f);
    for (size_t q = 0; q < n; ++q)
      for (size_t i = 0; i < s.ll_sent[q].size(); ++i)
        exec::runLocalOp(
            exec::LocalOp::accumulate(&home[s.ll_sent[q][i] * h], &recvb[q * block + kLlHeader + i * row], h, dt, 1.0f));
    if (!home.empty()) exec::runLocalOp(exec::LocalOp::fromFloat(c.out, home.data(), home.size(), dt));
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpLlCombine() { return std::make_unique<LlCombine>(); }

}  // namespace chorus::prim::ep
