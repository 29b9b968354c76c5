// "ep_dispatch": each token crosses once to each rank that holds one of its
// experts (node-limited routing: once to each host, then forwarded inside
// it), and lands there in every one of those experts' groups of recvX
// (prim/ep.hpp; chorusEpDispatch).
//
// After the agreement (a rank without a layout, a NULL buffer or a recvX too
// small for the layout's numRecv fails the call on every rank, no data moved),
// one all-to-all-v of wire rows in the layout's send order (node-limited: a
// second one, the relays forwarding the rows they received to the ranks of
// their host that hold the rows' experts, the wire rows unchanged).  A wire
// row is the token's hidden elements, its top-k ids (int32), its weights
// (float32) and its origin (source rank, token index: 2 x uint64).  With
// dispatchCompress the payload is the row quantized (bf16, or fp8 e4m3 with
// per-block scales: kernels/quantize.hpp's encoding) from its float32 value;
// the receiver decodes it once and rounds it to the datatype (or, with
// chorusEpDispatchFp8, hands the experts the codes and the scales as they
// came: DeepEP's fp8 recv_x and its scales).  The
// receiver writes each row's payload into the groups of its local experts in
// ascending expert id; groups are in expert order, within a group by origin
// (source rank, then token), whichever way the rows came.  It keeps where
// each arrival went: the routing combine undoes.  Every write is checked
// against the counts the layout exchanged.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "exec/local_ops.hpp"
#include "prim/ep.hpp"

namespace chorus::prim::ep {
namespace {

// A wire row: the payload (the row in the datatype, or compressed: wireBytes
// of the format, scales first), ids, weights, origin.
struct Wire {
  size_t row, k;  // row: the payload's bytes
  [[nodiscard]] size_t ids() const { return row; }
  [[nodiscard]] size_t weights() const { return row + k * sizeof(int32_t); }
  [[nodiscard]] size_t origin() const { return row + k * (sizeof(int32_t) + sizeof(float)); }
  [[nodiscard]] size_t bytes() const { return plan::ep::dispatchRowBytes(row, k); }
};

class Dispatch final : public Primitive {
 public:
  std::string_view name() const override { return "ep_dispatch"; }
  std::string_view summary() const override {
    return "MoE dispatch: tokens to the ranks of their experts, grouped by local expert (chorusEpDispatch; aux: its call block)";
  }

  Status run(Context& ctx, const Args& args) const override {
    auto call = callOf(args);
    if (!call.isOk()) return call.status();
    const Call& c = **call;
    State& s = *c.state;
    s.dispatched = false;
    PhaseClock clock("dispatch", s.rank);
    Status mine;
    if (!s.laid_out) mine = invalidUsage("no layout: call chorusEpLayout first (or its last call failed)");
    else if (s.tokens > 0 && c.x == nullptr) mine = invalidArgument("x is NULL but the layout has {} tokens", s.tokens);
    else if (c.recv_capacity < s.num_recv)
      mine = invalidArgument("recvCapacity={} rows but {} rows arrive at rank {} (the layout's numRecv)", c.recv_capacity,
                             s.num_recv, s.rank);
    else if (s.num_recv > 0 && c.recv_x == nullptr) mine = invalidArgument("recvX is NULL but {} rows arrive", s.num_recv);
    else if (c.fp8_out) mine = checkFp8Out(s, c);
    const auto k = static_cast<size_t>(s.cfg.topk);
    const bool z = s.cfg.compressed();
    const Wire wire{z ? wireBytes(s.cfg.wire(), s.cfg.hidden) : s.rowBytes(), k};
    const size_t W = wire.bytes();
    // The first hop is pipelined (exchangeChunked): chunk c + 1 is packed
    // (and, at a relay, chunk c - 1 forwarded) while chunk c is on the wire;
    // the busiest rank's bytes set the batches, alike on every rank.
    int64_t busiest = s.laid_out ? static_cast<int64_t>(s.send_order.size() * W) : 0;
    CHORUS_RETURN_IF_ERROR(agree(ctx, mine, {}, {}, &busiest));
    const size_t chunks = chunksFor(s, busiest);
    const auto n = static_cast<size_t>(s.nranks);
    uint8_t* sendb = grow(s.scratch[0], s.send_order.size() * W);
    std::vector<size_t> sd(n + 1, 0);  // the first hop's send blocks (rows)
    for (size_t q = 0; q < n; ++q) sd[q + 1] = sd[q] + s.send_counts[q];
    const auto packChunk = [&](size_t ch) {
      std::vector<float> tmp(z ? s.cfg.hidden : 0);
      for (size_t q = 0; q < n; ++q)
        for (size_t p = sd[q] + chunkStart(s.send_counts[q], ch, chunks);
             p < sd[q] + chunkStart(s.send_counts[q], ch + 1, chunks); ++p)
          pack(s, c, wire, z, tmp, p, &sendb[p * W]);
    };
    clock.mark("setup");
    const size_t rows_in = std::accumulate(s.recv_rows.begin(), s.recv_rows.end(), size_t{0});
    uint8_t* recvb = grow(s.scratch[1], rows_in * W);
    // The rows this rank sends itself do not cross the exchange (its block
    // to itself is left out): unpack reads them where they already are, so
    // the relay copies and the exchange's self-copy of those rows are saved.
    // rowp[i]: where arrival i's wire row is (arrival order: by source rank).
    const auto self = static_cast<size_t>(s.rank);
    size_t self_at = 0;  // arrival index of the first row from this rank
    for (size_t q = 0; q < self; ++q) self_at += s.recv_rows[q];
    std::vector<const uint8_t*> rowp(rows_in);
    for (size_t i = 0; i < rows_in; ++i) rowp[i] = &recvb[i * W];
    if (!s.nodeLimited()) {
      if (s.send_counts[self] != s.recv_rows[self])
        return internalError("this rank sends itself {} rows but expects {} from itself", s.send_counts[self],
                             s.recv_rows[self]);
      for (size_t j = 0; j < s.recv_rows[self]; ++j) rowp[self_at + j] = &sendb[(sd[self] + j) * W];
      CHORUS_RETURN_IF_ERROR(
          exchangeChunked(ctx, sendb, s.send_counts, recvb, s.recv_rows, W, s.rank, chunks, packChunk, {}));
      clock.mark("pack+exchange");
    } else {
      // The first hop lands in scratch[2], but for this rank's rows to itself
      // (its own host's relay is itself), read where they were packed.  The
      // rows forwarded to the other ranks of the host are copied into
      // scratch[3] as their chunk arrives; those the relay keeps are read in
      // place.
      if (s.send_counts[self] != s.hop1_rows[self])
        return internalError("this rank relays {} rows for itself but expects {}", s.send_counts[self], s.hop1_rows[self]);
      const size_t rows1 = std::accumulate(s.hop1_rows.begin(), s.hop1_rows.end(), size_t{0});
      uint8_t* hop1 = grow(s.scratch[2], rows1 * W);
      std::vector<size_t> h1(n + 1, 0);  // the first hop's receive blocks (rows)
      for (size_t q = 0; q < n; ++q) h1[q + 1] = h1[q] + s.hop1_rows[q];
      const auto row1 = [&](size_t j) -> const uint8_t* {
        return j >= h1[self] && j < h1[self + 1] ? &sendb[(sd[self] + j - h1[self]) * W] : &hop1[j * W];
      };
      if (s.hop2_counts[self] != s.recv_rows[self])
        return internalError("this relay keeps {} rows but expects {} from itself", s.hop2_counts[self], s.recv_rows[self]);
      size_t keep = 0;  // the first hop2 entry this relay keeps
      for (size_t q = 0; q < self; ++q) keep += s.hop2_counts[q];
      const size_t keep_end = keep + s.hop2_counts[self];
      // The chunk each first-hop row arrives in, and per chunk the entries to forward.
      std::vector<uint32_t> chunk_of(rows1);
      for (size_t q = 0; q < n; ++q)
        for (size_t ch = 0; ch < chunks; ++ch)
          for (size_t j = chunkStart(s.hop1_rows[q], ch, chunks); j < chunkStart(s.hop1_rows[q], ch + 1, chunks); ++j)
            chunk_of[h1[q] + j] = static_cast<uint32_t>(ch);
      std::vector<std::vector<size_t>> to_forward(chunks);
      for (size_t p = 0; p < s.hop2_rows.size(); ++p) {
        if (s.hop2_rows[p] >= rows1) return internalError("forward entry {} names first-hop row {} of {}", p, s.hop2_rows[p], rows1);
        if (p >= keep && p < keep_end) rowp[self_at + (p - keep)] = row1(s.hop2_rows[p]);
        else to_forward[chunk_of[s.hop2_rows[p]]].push_back(p);
      }
      uint8_t* fwd = grow(s.scratch[3], s.hop2_rows.size() * W);
      const auto forwardChunk = [&](size_t ch) {
        for (size_t p : to_forward[ch]) std::memcpy(&fwd[p * W], row1(s.hop2_rows[p]), W);
      };
      CHORUS_RETURN_IF_ERROR(
          exchangeChunked(ctx, sendb, s.send_counts, hop1, s.hop1_rows, W, s.rank, chunks, packChunk, forwardChunk));
      clock.mark("pack+hop1+forward");
      CHORUS_RETURN_IF_ERROR(exchangeRows(ctx, fwd, s.hop2_counts, recvb, s.recv_rows, W, s.rank));
      clock.mark("hop2");
    }
    CHORUS_RETURN_IF_ERROR(unpack(s, c, wire, rowp));
    clock.mark("unpack");
    s.dispatched = true;
    return {};
  }

 private:
  // Wire row p of the send order into w: the token's payload (compressed
  // through tmp when the wire is), its ids, weights and origin.
  static void pack(const State& s, const Call& c, const Wire& wire, bool z, std::vector<float>& tmp, size_t p,
                   uint8_t* w) {
    const auto k = static_cast<size_t>(s.cfg.topk);
    const size_t t = s.send_order[p];
    const uint8_t* xr = static_cast<const uint8_t*>(c.x) + t * s.rowBytes();
    if (z) {
      exec::runLocalOp(exec::LocalOp::toFloat(tmp.data(), xr, s.cfg.hidden, s.cfg.dtype));
      exec::runLocalOp(exec::LocalOp::quantize(w, tmp.data(), s.cfg.hidden, s.cfg.wire()));
    } else {
      std::memcpy(w, xr, wire.row);
    }
    std::memcpy(w + wire.ids(), &s.ids[t * k], k * sizeof(int32_t));
    for (size_t j = 0; j < k; ++j) {
      const float wt = c.topk_weights != nullptr ? c.topk_weights[t * k + j] : 1.0f;
      std::memcpy(w + wire.weights() + j * sizeof(float), &wt, sizeof wt);
    }
    const uint64_t origin[2] = {static_cast<uint64_t>(s.rank), t};
    std::memcpy(w + wire.origin(), origin, sizeof origin);
  }

  // chorusEpDispatchFp8's own conditions: the fp8 wire, whole blocks (the
  // experts' fp8 GEMMs take one scale per block of a row: DeepEP's per-128
  // scales), room for every arriving row's scales.
  static Status checkFp8Out(const State& s, const Call& c) {
    if (s.cfg.compress != CHORUS_COMPRESS_FP8)
      return invalidArgument("chorusEpDispatchFp8 needs config.dispatchCompress=CHORUS_COMPRESS_FP8 ({}), the handle has "
                             "{}: the codes and scales are the fp8 wire's", CHORUS_COMPRESS_FP8, s.cfg.compress);
    const auto block = static_cast<size_t>(s.cfg.wire().block);
    if (s.cfg.hidden % block != 0)
      return invalidArgument("config.hidden={} is not a multiple of the fp8 block {} (config.fp8Block): "
                             "chorusEpDispatchFp8 hands out one scale per whole block", s.cfg.hidden, block);
    const size_t need = s.num_recv * (s.cfg.hidden / block);
    if (c.scales_capacity < need)
      return invalidArgument("recvScales holds {} floats but {} rows x {} scales = {} arrive at rank {}", c.scales_capacity,
                             s.num_recv, s.cfg.hidden / block, need, s.rank);
    if (need > 0 && c.recv_scales == nullptr) return invalidArgument("recvScales is NULL but {} scales arrive", need);
    return {};
  }

  static Status unpack(State& s, const Call& c, const Wire& wire, const std::vector<const uint8_t*>& rowp) {
    const size_t rows_in = rowp.size();
    const auto k = static_cast<size_t>(s.cfg.topk);
    const int L = s.localExperts();
    const int first = s.rank * L;
    // Each arrival's local experts (expert, choice), ascending, and its origin.
    std::vector<std::vector<std::pair<int32_t, int32_t>>> mine(rows_in);
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, size_t>> by_origin(rows_in);
    s.slot_begin.assign(rows_in + 1, 0);
    for (size_t i = 0; i < rows_in; ++i) {
      const uint8_t* w = rowp[i];
      for (size_t j = 0; j < k; ++j) {
        int32_t e;
        std::memcpy(&e, w + wire.ids() + j * sizeof(int32_t), sizeof e);
        if (e >= first && e < first + L) mine[i].emplace_back(e, static_cast<int32_t>(j));
      }
      if (mine[i].empty()) return internalError("received row {} names none of this rank's experts", i);
      std::sort(mine[i].begin(), mine[i].end());
      uint64_t origin[2];
      std::memcpy(origin, w + wire.origin(), sizeof origin);
      by_origin[i] = {{origin[0], origin[1]}, i};
      s.slot_begin[i + 1] = s.slot_begin[i] + mine[i].size();
    }
    std::sort(by_origin.begin(), by_origin.end());
    const bool z = s.cfg.compressed() && !c.fp8_out;
    // fp8 out: recvX's rows are the wire's codes (hidden bytes), the scales
    // go to recv_scales (nb per row), both copied from the wire unchanged.
    const size_t nb = c.fp8_out ? wireScales(s.cfg.wire(), s.cfg.hidden) : 0;
    const size_t row = c.fp8_out ? s.cfg.hidden : s.rowBytes();
    std::vector<float> tmp(z ? s.cfg.hidden : 0);
    std::vector<uint8_t> decoded(z ? row : 0);
    std::vector<size_t> off(static_cast<size_t>(L), 0), cur(static_cast<size_t>(L), 0);
    for (int e = 1; e < L; ++e)
      off[static_cast<size_t>(e)] = off[static_cast<size_t>(e - 1)] + s.recv_per_expert[static_cast<size_t>(e - 1)];
    s.slots.assign(s.slot_begin[rows_in], 0);
    s.slot_k.assign(s.slot_begin[rows_in], 0);
    for (const auto& [origin, i] : by_origin) {
      const uint8_t* w = rowp[i];
      const uint8_t* payload = c.fp8_out ? w + nb * sizeof(float) : w;
      if (z) {  // decoded once, rounded to the datatype once, copied into each group
        exec::runLocalOp(exec::LocalOp::dequantize(tmp.data(), w, s.cfg.hidden, s.cfg.wire()));
        exec::runLocalOp(exec::LocalOp::fromFloat(decoded.data(), tmp.data(), s.cfg.hidden, s.cfg.dtype));
        payload = decoded.data();
      }
      size_t q = s.slot_begin[i];
      for (auto [e, j] : mine[i]) {
        const auto le = static_cast<size_t>(e - first);
        if (cur[le] >= s.recv_per_expert[le])
          return internalError("more rows for expert {} than the {} its layout announced: the counts do not add up", e,
                               s.recv_per_expert[le]);
        const size_t slot = off[le] + cur[le]++;
        std::memcpy(static_cast<uint8_t*>(c.recv_x) + slot * row, payload, row);
        if (c.fp8_out) std::memcpy(&c.recv_scales[slot * nb], w, nb * sizeof(float));
        if (c.recv_weights != nullptr)
          std::memcpy(&c.recv_weights[slot], w + wire.weights() + static_cast<size_t>(j) * sizeof(float), sizeof(float));
        s.slots[q] = slot;
        s.slot_k[q] = j;
        ++q;
      }
    }
    for (int e = 0; e < L; ++e)
      if (cur[static_cast<size_t>(e)] != s.recv_per_expert[static_cast<size_t>(e)])
        return internalError("expert {} received {} rows but its layout announced {}: the counts do not add up",
                             first + e, cur[static_cast<size_t>(e)], s.recv_per_expert[static_cast<size_t>(e)]);
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeEpDispatch() { return std::make_unique<Dispatch>(); }

}  // namespace chorus::prim::ep
