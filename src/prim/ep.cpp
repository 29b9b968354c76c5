// What the ep_* primitives share: the config check, the agreement before data
// moves, the call block, the handle's creation (prim/ep.hpp).
#include "prim/ep.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>

#include <fmt/format.h>

#include "comm/communicator.hpp"
#include "common/dtype.hpp"

namespace chorus::prim::ep {

size_t State::elemBytes() const { return dtypeSize(cfg.dtype); }

Status checkConfig(const Config& c, int nranks) {
  if (c.experts <= 0) return invalidArgument("config.numExperts={} must be > 0", c.experts);
  if (c.experts % nranks != 0)
    return invalidArgument("config.numExperts={} is not a multiple of the rank count {} (experts are spread evenly: "
                           "expert e lives on rank e / (numExperts / nranks))", c.experts, nranks);
  if (c.topk <= 0 || c.topk > c.experts)
    return invalidArgument("config.topk={} must be in 1..numExperts ({})", c.topk, c.experts);
  if (c.hidden == 0) return invalidArgument("config.hidden=0: a token row needs at least one element");
  if (c.hidden > (size_t{1} << 40)) return invalidArgument("config.hidden={} is beyond 2^40 elements", c.hidden);
  if (c.dtype != chorusFloat32 && c.dtype != chorusBfloat16)
    return invalidArgument("config.datatype={} is not supported (chorusFloat32 or chorusBfloat16)", static_cast<int>(c.dtype));
  if (c.index_type != chorusInt32 && c.index_type != chorusInt64)
    return invalidArgument("config.indexType={} is not supported (chorusInt32 or chorusInt64)", static_cast<int>(c.index_type));
  if (c.max_hosts < 0) return invalidArgument("config.maxHostsPerToken={} must be >= 0 (0: off)", c.max_hosts);
  if (c.compress != CHORUS_COMPRESS_DEFAULT && c.compress != CHORUS_COMPRESS_OFF && c.compress != CHORUS_COMPRESS_BF16 &&
      c.compress != CHORUS_COMPRESS_FP8)
    return invalidArgument("config.dispatchCompress={} is not one of CHORUS_COMPRESS_OFF (0), _BF16 (1), _FP8 (2)",
                           c.compress);
  if (c.fp8_block != -1 && (c.fp8_block < kFp8MinBlock || c.fp8_block > kFp8MaxBlock))
    return invalidArgument("config.fp8Block={} is outside {}..{} (or -1: {})", c.fp8_block, kFp8MinBlock, kFp8MaxBlock,
                           kFp8DefaultBlock);
  if (c.ll_max_tokens < 0 || c.ll_max_tokens > (1 << 20))
    return invalidArgument("config.lowLatencyMaxTokens={} must be in 0..2^20 (0: no low-latency mode)", c.ll_max_tokens);
  if (c.ll_max_tokens > 0 && c.max_hosts > 0)
    return invalidArgument("config.lowLatencyMaxTokens={} with maxHostsPerToken={}: the low-latency mode sends "
                           "straight to the experts' ranks (no relays); use one or the other", c.ll_max_tokens,
                           c.max_hosts);
  return {};
}

Status readIds(const Config& cfg, const void* topk_idx, size_t tokens, std::vector<int32_t>* ids) {
  const size_t k = static_cast<size_t>(cfg.topk);
  const int E = cfg.experts;
  if (tokens > (size_t{1} << 40)) return invalidArgument("numTokens={} is beyond 2^40", tokens);
  if (tokens > 0 && topk_idx == nullptr) return invalidArgument("topkIdx is NULL but numTokens={}", tokens);
  ids->resize(tokens * k);
  for (size_t i = 0; i < ids->size(); ++i) {
    const int64_t v = cfg.index_type == chorusInt32 ? static_cast<const int32_t*>(topk_idx)[i]
                                                    : static_cast<const int64_t*>(topk_idx)[i];
    if (v < 0 || v >= E)
      return invalidArgument("topkIdx[{}] (token {}, choice {}) = {} is not an expert id (0..{})", i, i / k, i % k, v,
                             E - 1);
    for (size_t j = i - i % k; j < i; ++j)
      if ((*ids)[j] == v)
        return invalidArgument("topkIdx[{}] (token {}) = {} repeats choice {} of the same token", i, i / k, v, j % k);
    (*ids)[i] = static_cast<int32_t>(v);
  }
  return {};
}

Result<const Call*> callOf(const Args& args) {
  if (args.aux == nullptr || args.aux_bytes != sizeof(Call))
    return invalidArgument("aux must be the chorusEp* entry points' call block ({} bytes), got {} bytes; call "
                           "chorusEpLayout/Dispatch/Combine instead", sizeof(Call), args.aux_bytes);
  const auto* c = static_cast<const Call*>(args.aux);
  if (c->magic != kCallMagic || c->state == nullptr)
    return invalidArgument("aux is not a chorusEp* call block; call chorusEpLayout/Dispatch/Combine instead");
  return c;
}

Status agree(Context& ctx, const Status& mine, std::span<const int64_t> params, std::span<const char* const> names,
             int64_t* max_value) {
  const int n = ctx.size();
  // [first failing rank as n - rank (max = lowest rank), then each parameter as +p and -p, then max_value]
  std::vector<int64_t> v(1 + 2 * params.size() + (max_value != nullptr ? 1 : 0));
  v[0] = mine.isOk() ? 0 : static_cast<int64_t>(n - ctx.rank());
  for (size_t i = 0; i < params.size(); ++i) v[1 + 2 * i] = params[i], v[2 + 2 * i] = -params[i];
  if (max_value != nullptr) v.back() = *max_value;
  CHORUS_RETURN_IF_ERROR(ctx.allReduce(v.data(), v.data(), v.size(), chorusInt64, chorusMax));
  if (max_value != nullptr) *max_value = v.back();
  if (!mine.isOk()) return mine;
  if (v[0] > 0)
    return invalidArgument("rank {} refused its arguments (its error names them); no data moved", n - v[0]);
  for (size_t i = 0; i < params.size(); ++i)
    if (v[1 + 2 * i] != -v[2 + 2 * i])
      return invalidArgument("{} differs across ranks (from {} to {}); every rank must pass the same; no data moved",
                             i < names.size() ? names[i] : "a parameter", -v[2 + 2 * i], v[1 + 2 * i]);
  return {};
}

Status exchangeRows(Context& ctx, const void* send, std::span<const size_t> send_rows, void* recv,
                    std::span<const size_t> recv_rows, size_t row_bytes, int skip) {
  const size_t n = send_rows.size();
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  for (size_t r = 0, sa = 0, ra = 0; r < n; ++r) {
    sc[r] = send_rows[r] * row_bytes, sd[r] = sa, sa += sc[r];
    rc[r] = recv_rows[r] * row_bytes, rd[r] = ra, ra += rc[r];
  }
  if (skip >= 0 && static_cast<size_t>(skip) < n) sc[static_cast<size_t>(skip)] = rc[static_cast<size_t>(skip)] = 0;
  return ctx.allToAllV(send, sc, sd, recv, rc, rd, chorusUint8);
}

size_t chunksFor(const State& s, int64_t max_send_bytes) {
  const int64_t c = max_send_bytes / std::max<int64_t>(s.chunk_bytes, 1);
  return static_cast<size_t>(std::clamp<int64_t>(c, 1, s.max_chunks));
}

Status exchangeChunked(Context& ctx, const void* send, std::span<const size_t> send_rows, void* recv,
                       std::span<const size_t> recv_rows, size_t row_bytes, int skip, size_t chunks,
                       const std::function<void(size_t)>& prepare, const std::function<void(size_t)>& consume) {
  const size_t n = send_rows.size();
  std::vector<size_t> sd(n + 1, 0), rd(n + 1, 0), sc(n), so(n), rc(n), ro(n);
  for (size_t r = 0; r < n; ++r) sd[r + 1] = sd[r] + send_rows[r], rd[r + 1] = rd[r] + recv_rows[r];
  if (prepare) prepare(0);
  for (size_t c = 0; c < chunks; ++c) {
    for (size_t r = 0; r < n; ++r) {
      const size_t s0 = chunkStart(send_rows[r], c, chunks), s1 = chunkStart(send_rows[r], c + 1, chunks);
      const size_t r0 = chunkStart(recv_rows[r], c, chunks), r1 = chunkStart(recv_rows[r], c + 1, chunks);
      sc[r] = (s1 - s0) * row_bytes, so[r] = (sd[r] + s0) * row_bytes;
      rc[r] = (r1 - r0) * row_bytes, ro[r] = (rd[r] + r0) * row_bytes;
    }
    if (skip >= 0 && static_cast<size_t>(skip) < n) sc[static_cast<size_t>(skip)] = rc[static_cast<size_t>(skip)] = 0;
    const bool next = prepare && c + 1 < chunks, prev = consume && c > 0;
    std::future<void> side;
    if (next || prev)
      side = std::async(std::launch::async, [&, c, next, prev] {
        if (next) prepare(c + 1);
        if (prev) consume(c - 1);
      });
    Status st = ctx.allToAllV(send, sc, so, recv, rc, ro, chorusUint8);
    if (side.valid()) side.get();  // before returning, even on an error: it uses the buffers
    CHORUS_RETURN_IF_ERROR(st);
  }
  if (consume) consume(chunks - 1);
  return {};
}

namespace {
int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

#ifdef CHORUS_EP_PHASES
constexpr bool kPhases = true;
#else
constexpr bool kPhases = false;
#endif

PhaseClock::PhaseClock(const char* op, int rank) : op_(op), rank_(rank), on_(kPhases) {
  if (on_) last_ = nowUs(), line_ = op;
}

void PhaseClock::mark(const char* phase) {
  if (!on_) return;
  const int64_t t = nowUs();
  line_ += fmt::format(" {}={}", phase, t - last_);
  last_ = t;
}

PhaseClock::~PhaseClock() {
  if (!on_) return;
  if (std::FILE* f = std::fopen(fmt::format("/tmp/chorus-ep-phases.rank{}", rank_).c_str(), "a")) {
    std::fprintf(f, "%s\n", line_.c_str());
    std::fclose(f);
  }
}

Result<std::unique_ptr<State>> create(Communicator& comm, const Config& cfg, std::vector<int> host_ids) {
  Context ctx(comm);
  Status mine = checkConfig(cfg, ctx.size());
  const int64_t params[] = {cfg.experts, cfg.topk, static_cast<int64_t>(cfg.hidden), static_cast<int64_t>(cfg.dtype),
                            static_cast<int64_t>(cfg.index_type), cfg.max_hosts, cfg.compress, cfg.fp8_block,
                            cfg.ll_max_tokens};
  static constexpr const char* kNames[] = {"config.numExperts", "config.topk",      "config.hidden",
                                           "config.datatype",   "config.indexType", "config.maxHostsPerToken",
                                           "config.dispatchCompress", "config.fp8Block",
                                           "config.lowLatencyMaxTokens"};
  CHORUS_RETURN_IF_ERROR(agree(ctx, mine, params, kNames));
  auto st = std::make_unique<State>();
  st->cfg = cfg;
  if (st->cfg.compress == CHORUS_COMPRESS_DEFAULT) st->cfg.compress = CHORUS_COMPRESS_OFF;
  st->nranks = ctx.size();
  st->rank = ctx.rank();
  if (host_ids.size() != static_cast<size_t>(st->nranks)) host_ids.assign(static_cast<size_t>(st->nranks), 0);
  std::map<int, int> index;
  for (int h : host_ids) st->host_of.push_back(index.try_emplace(h, static_cast<int>(index.size())).first->second);
  st->nhosts = static_cast<int>(index.size());
  st->host_ranks.assign(static_cast<size_t>(st->nhosts), {});
  for (int r = 0; r < st->nranks; ++r) {
    auto& hr = st->host_ranks[static_cast<size_t>(st->host_of[static_cast<size_t>(r)])];
    if (r == st->rank) st->local_index = static_cast<int>(hr.size());
    hr.push_back(r);
  }
  st->geo = plan::ep::Geometry::make(st->nranks, cfg.experts, cfg.topk, cfg.max_hosts, host_ids);
  return st;
}

}  // namespace chorus::prim::ep
