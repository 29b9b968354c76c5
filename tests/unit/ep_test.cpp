// Expert parallelism (chorusEpLayout / Dispatch / Combine / ReturnTopk):
// random top-k routings on 1-5 ranks (threads as ranks), float32 and bf16,
// int32 and int64 ids, against a reference this file computes from the
// whole job's routing (every rank can regenerate every rank's tokens): what
// each rank receives, grouped by expert; the combine, bit for bit, summed in
// chorus.h's documented order; the per-row values back to their (token, k).
// Then bad input (refused on every rank, naming the argument on the rank that
// passed it and that rank elsewhere; no byte written; the communicator goes
// on) and a rank that aborts mid-step (an error, not a hang).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "plan/plan.hpp"
#include "plan/verify.hpp"
#include "support/rank_threads.hpp"

namespace chorus::testing {
namespace {

// Round to nearest even, as bf16 (finite values only here).
uint16_t toBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}
float fromBf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

struct Job {
  int n = 1, experts = 4, topk = 2;
  size_t hidden = 5;
  chorusDataType_t dtype = chorusFloat32;
  chorusDataType_t itype = chorusInt64;
  uint32_t seed = 1;
  // Node-limited routing: a host label per rank (empty: one host) and
  // maxHostsPerToken (0: direct routing).
  std::vector<int> host;
  int max_hosts = 0;
  // Dispatch's wire (CHORUS_COMPRESS_*) and fp8 block (-1: 128).
  int compress = CHORUS_COMPRESS_OFF;
  int block = -1;
  // fp8 wire handed out as codes and scales (chorusEpDispatchFp8).
  bool fp8_out = false;
  // Host index of rank r (labels numbered by first appearance), the ranks of
  // each host, and the relay of host h for rank r.
  [[nodiscard]] std::vector<int> hostIndex() const {
    std::vector<int> idx, seen;
    for (int r = 0; r < n; ++r) {
      const int label = host.empty() ? 0 : host[static_cast<size_t>(r)];
      auto it = std::find(seen.begin(), seen.end(), label);
      if (it == seen.end()) seen.push_back(label), it = seen.end() - 1;
      idx.push_back(static_cast<int>(it - seen.begin()));
    }
    return idx;
  }
  [[nodiscard]] std::vector<std::vector<int>> hostRanks() const {
    std::vector<std::vector<int>> hr;
    const auto idx = hostIndex();
    for (int r = 0; r < n; ++r) {
      if (static_cast<size_t>(idx[static_cast<size_t>(r)]) >= hr.size()) hr.resize(static_cast<size_t>(idx[static_cast<size_t>(r)]) + 1);
      hr[static_cast<size_t>(idx[static_cast<size_t>(r)])].push_back(r);
    }
    return hr;
  }
  [[nodiscard]] int relay(int r, int h) const {
    const auto hr = hostRanks();
    const auto idx = hostIndex();
    const auto& mine = hr[static_cast<size_t>(idx[static_cast<size_t>(r)])];
    const auto li = static_cast<size_t>(std::find(mine.begin(), mine.end(), r) - mine.begin());
    const auto& there = hr[static_cast<size_t>(h)];
    return there[li % there.size()];
  }
};

// Rank q's tokens: ids (distinct per row), weights, x as floats exactly
// representable in the dtype.
struct Tokens {
  size_t count = 0;
  std::vector<int64_t> ids;
  std::vector<float> w;
  std::vector<float> x;  // count x hidden
};

float roundTo(const Job& j, float v) { return j.dtype == chorusBfloat16 ? fromBf16(toBf16(v)) : v; }

Tokens tokensOf(const Job& j, int q) {
  Tokens t;
  t.count = (q == 2 && j.n >= 3) ? 0 : static_cast<size_t>(4 + 3 * q + (j.seed % 3));
  std::mt19937 g(j.seed * 1000u + static_cast<uint32_t>(q));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f), uw(0.01f, 1.0f);
  std::vector<int> all(static_cast<size_t>(j.experts));
  for (int e = 0; e < j.experts; ++e) all[static_cast<size_t>(e)] = e;
  const auto hidx = j.hostIndex();
  const int nh = *std::max_element(hidx.begin(), hidx.end()) + 1;
  for (size_t i = 0; i < t.count; ++i) {
    std::shuffle(all.begin(), all.end(), g);  // the router's choices, unsorted
    if (j.max_hosts > 0) {  // group-limited gating: experts of max_hosts random hosts only, in random order
      std::vector<int> hs(static_cast<size_t>(nh));
      for (int h = 0; h < nh; ++h) hs[static_cast<size_t>(h)] = h;
      std::shuffle(hs.begin(), hs.end(), g);
      hs.resize(static_cast<size_t>(std::min(j.max_hosts, nh)));
      const int L = j.experts / j.n;
      std::stable_partition(all.begin(), all.end(), [&](int e) {
        return std::find(hs.begin(), hs.end(), hidx[static_cast<size_t>(e / L)]) != hs.end();
      });
    }
    for (int c = 0; c < j.topk; ++c) t.ids.push_back(all[static_cast<size_t>(c)]), t.w.push_back(uw(g));
    for (size_t h = 0; h < j.hidden; ++h) t.x.push_back(roundTo(j, u(g)));
  }
  return t;
}

// A row as dispatch delivers it: itself, or with a compressed wire its
// float32 value encoded and decoded by the documented rule (kernels/
// quantize.hpp; written again here: bf16 nearest-even; fp8 e4m3 with scale =
// amax / 256 per block, code = e4m3(x * (256 / amax)) nearest-even, value =
// code x scale), then rounded to the datatype.
float e4m3Round(float y) {
  const float a = std::fabs(y);
  int ex = 0;
  std::frexp(a, &ex);  // a = m 2^ex, m in [0.5, 1)
  const float ulp = a >= 0x1p-6f ? std::ldexp(1.0f, ex - 1 - 3) : 0x1p-9f;
  return std::copysign(std::nearbyint(a / ulp) * ulp, y);
}
std::vector<float> delivered(const Job& j, const float* x) {
  std::vector<float> v(x, x + j.hidden);
  if (j.compress == CHORUS_COMPRESS_BF16) {
    for (float& f : v) f = fromBf16(toBf16(f));
  } else if (j.compress == CHORUS_COMPRESS_FP8) {
    const size_t b = j.block < 0 ? 128 : static_cast<size_t>(j.block);
    for (size_t s = 0; s < v.size(); s += b) {
      const size_t e = std::min(v.size(), s + b);
      float amax = 0;
      for (size_t i = s; i < e; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float scale = amax >= 0x1p-118f ? amax * (1.0f / 256.0f) : 0.0f;
      const float inv = scale > 0 ? 256.0f / amax : 0.0f;
      for (size_t i = s; i < e; ++i) v[i] = e4m3Round(v[i] * inv) * scale;
    }
  }
  for (float& f : v) f = roundTo(j, f);
  return v;
}

// The e4m3 code (FN: S.EEEE.MMM, bias 7) of a value e4m3Round returned.
uint8_t e4m3Code(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::fabs(v);
  if (a < 0x1p-6f) return static_cast<uint8_t>(sign | static_cast<uint8_t>(a / 0x1p-9f));  // subnormal: m x 2^-9
  int ex = 0;
  std::frexp(a, &ex);  // a = 2^(ex-1) x (1 + m/8)
  const float m = (a / std::ldexp(1.0f, ex - 1) - 1.0f) * 8.0f;
  return static_cast<uint8_t>(sign | ((ex - 1 + 7) << 3) | static_cast<uint8_t>(m));
}
// The reference quantizer (the documented rule, written again here): a row's
// e4m3 codes and its per-block scales.
void quantizeRef(const Job& j, const float* x, std::vector<uint8_t>* codes, std::vector<float>* scales) {
  const size_t b = j.block < 0 ? 128 : static_cast<size_t>(j.block);
  codes->assign(j.hidden, 0), scales->clear();
  for (size_t s = 0; s < j.hidden; s += b) {
    const size_t e = std::min(j.hidden, s + b);
    float amax = 0;
    for (size_t i = s; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax >= 0x1p-118f ? amax * (1.0f / 256.0f) : 0.0f;
    const float inv = scale > 0 ? 256.0f / amax : 0.0f;
    scales->push_back(scale);
    for (size_t i = s; i < e; ++i) (*codes)[i] = e4m3Code(e4m3Round(x[i] * inv));
  }
}
// An e4m3 code's value by its defining formula.
float e4m3Value(uint8_t c) {
  const int ex = (c >> 3) & 15, m = c & 7;
  const float a = ex == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, ex - 7);
  return (c & 0x80) ? -a : a;
}

// The experts' computation in this test: y = round(x * (0.5 + e/4) + e/8).
float expertFn(const Job& j, int e, float x) { return roundTo(j, x * (0.5f + 0.25f * e) + 0.125f * e); }

void putRow(const Job& j, void* dst, size_t row, const float* src) {
  for (size_t h = 0; h < j.hidden; ++h) {
    if (j.dtype == chorusFloat32) static_cast<float*>(dst)[row * j.hidden + h] = src[h];
    else static_cast<uint16_t*>(dst)[row * j.hidden + h] = toBf16(src[h]);
  }
}
float getElem(const Job& j, const void* src, size_t i) {
  return j.dtype == chorusFloat32 ? static_cast<const float*>(src)[i] : fromBf16(static_cast<const uint16_t*>(src)[i]);
}

std::string runStep(const Job& j, int r, chorusComm_t c) {
  const int L = j.experts / j.n;
  auto rankOf = [&](int64_t e) { return static_cast<int>(e / L); };
  const Tokens me = tokensOf(j, r);
  const size_t es = j.dtype == chorusFloat32 ? 4 : 2;
  chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
  cfg.numExperts = j.experts, cfg.topk = j.topk, cfg.hidden = j.hidden, cfg.datatype = j.dtype, cfg.indexType = j.itype;
  cfg.maxHostsPerToken = j.max_hosts;
  cfg.dispatchCompress = j.compress, cfg.fp8Block = j.block;
  chorusEpHandle_t ep = nullptr;
  if (chorusEpCreate(&ep, &cfg, c) != chorusSuccess) return fmt::format("rank {} create: {}", r, chorusGetLastError(c));
  std::unique_ptr<chorusEpHandle, decltype(&chorusEpDestroy)> guard(ep, &chorusEpDestroy);
  const auto hidx = j.hostIndex();
  const auto hranks = j.hostRanks();
  const int nh = static_cast<int>(hranks.size());
  int hosts = 0, locals = 0;
  chorusEpGetInfo(ep, &hosts, &locals);
  if (locals != L || hosts != nh) return fmt::format("rank {}: info {} hosts {} local experts", r, hosts, locals);

  // Layout.
  std::vector<int32_t> ids32(me.ids.begin(), me.ids.end());
  const void* idp = j.itype == chorusInt32 ? static_cast<const void*>(ids32.data()) : me.ids.data();
  std::vector<size_t> per_rank(static_cast<size_t>(j.n), 99), per_host(static_cast<size_t>(nh), 99), per_expert(static_cast<size_t>(j.experts), 99),
      recv_per_expert(static_cast<size_t>(L), 99);
  size_t num_recv = 99;
  if (chorusEpLayout(ep, idp, me.count, per_rank.data(), per_host.data(), per_expert.data(), recv_per_expert.data(),
                     &num_recv, c, nullptr) != chorusSuccess)
    return fmt::format("rank {} layout: {}", r, chorusGetLastError(c));
  // Expected layout, from this rank's ids.
  // The send order: to each rank holding experts (direct), or to each host's
  // relay (node-limited: one copy per host).
  std::vector<std::vector<size_t>> order(static_cast<size_t>(j.n)), sent(static_cast<size_t>(j.n));
  std::vector<size_t> want_host(static_cast<size_t>(nh), 0);
  for (size_t t = 0; t < me.count; ++t) {
    std::vector<int> rs, hs;
    for (int q = 0; q < j.topk; ++q) rs.push_back(rankOf(me.ids[t * j.topk + q]));
    std::sort(rs.begin(), rs.end());
    rs.erase(std::unique(rs.begin(), rs.end()), rs.end());
    for (int q : rs) order[static_cast<size_t>(q)].push_back(t), hs.push_back(hidx[static_cast<size_t>(q)]);
    std::sort(hs.begin(), hs.end());
    hs.erase(std::unique(hs.begin(), hs.end()), hs.end());
    for (int h : hs) ++want_host[static_cast<size_t>(h)];
    if (j.max_hosts > 0) {
      if (hs.size() > static_cast<size_t>(j.max_hosts)) return "test bug: a token beyond max_hosts";
      for (int h : hs) sent[static_cast<size_t>(j.relay(r, h))].push_back(t);
    }
  }
  if (j.max_hosts == 0) sent = order;
  std::vector<size_t> flat;
  for (int q = 0; q < j.n; ++q) {
    if (per_rank[static_cast<size_t>(q)] != order[static_cast<size_t>(q)].size())
      return fmt::format("rank {}: tokensPerRank[{}]={} expected {}", r, q, per_rank[static_cast<size_t>(q)], order[static_cast<size_t>(q)].size());
    flat.insert(flat.end(), sent[static_cast<size_t>(q)].begin(), sent[static_cast<size_t>(q)].end());
  }
  if (per_host != want_host) return fmt::format("rank {}: tokensPerHost differs", r);
  for (int e = 0; e < j.experts; ++e) {
    const auto cnt = static_cast<size_t>(std::count(me.ids.begin(), me.ids.end(), e));
    if (per_expert[static_cast<size_t>(e)] != cnt) return fmt::format("rank {}: tokensPerExpert[{}] wrong", r, e);
  }
  size_t needed = 0;
  chorusEpSendOrder(ep, nullptr, 0, &needed);
  std::vector<size_t> got_order(needed);
  chorusEpSendOrder(ep, got_order.data(), got_order.size(), nullptr);
  if (got_order != flat) return fmt::format("rank {}: send order differs", r);

  // What this rank must receive: per local expert, source ranks in order,
  // their tokens in order.
  struct Row { int src; size_t t; int e; float w; };
  std::vector<Row> want;
  std::vector<Tokens> all;
  for (int q = 0; q < j.n; ++q) all.push_back(tokensOf(j, q));
  for (int le = 0; le < L; ++le) {
    const int e = r * L + le;
    size_t cnt = 0;
    for (int q = 0; q < j.n; ++q)
      for (size_t t = 0; t < all[static_cast<size_t>(q)].count; ++t)
        for (int k = 0; k < j.topk; ++k)
          if (all[static_cast<size_t>(q)].ids[t * j.topk + k] == e)
            want.push_back({q, t, e, all[static_cast<size_t>(q)].w[t * j.topk + k]}), ++cnt;
    if (recv_per_expert[static_cast<size_t>(le)] != cnt)
      return fmt::format("rank {}: recvPerExpert[{}]={} expected {}", r, le, recv_per_expert[static_cast<size_t>(le)], cnt);
  }
  if (num_recv != want.size()) return fmt::format("rank {}: numRecv={} expected {}", r, num_recv, want.size());

  // Dispatch, with two spare rows that must stay untouched.
  std::vector<uint8_t> x(me.count * j.hidden * es);
  for (size_t t = 0; t < me.count; ++t) putRow(j, x.data(), t, &me.x[t * j.hidden]);
  std::vector<uint8_t> recv((num_recv + 2) * j.hidden * es, 0xAB);
  std::vector<float> rw(num_recv + 2, -7.0f);
  if (!j.fp8_out) {
    if (chorusEpDispatch(ep, x.data(), me.w.data(), recv.data(), rw.data(), num_recv + 2, c, nullptr) != chorusSuccess)
      return fmt::format("rank {} dispatch: {}", r, chorusGetLastError(c));
  } else {
    // The codes and scales: exactly the reference quantizer's for the
    // source row, nothing written past numRecv; then decoded (code x scale,
    // rounded to the datatype, as an expert would) into recv, which the
    // checks below compare with the decoding dispatch's rows.
    const size_t nb = j.hidden / static_cast<size_t>(j.block < 0 ? 128 : j.block);
    std::vector<uint8_t> codes((num_recv + 2) * j.hidden, 0xAB);
    std::vector<float> scales((num_recv + 2) * nb, -3.0f);
    if (chorusEpDispatchFp8(ep, x.data(), me.w.data(), codes.data(), scales.data(), scales.size(), rw.data(),
                            num_recv + 2, c, nullptr) != chorusSuccess)
      return fmt::format("rank {} dispatch fp8: {}", r, chorusGetLastError(c));
    std::vector<uint8_t> rc;
    std::vector<float> rs;
    for (size_t i = 0; i < want.size(); ++i) {
      const Row& w = want[i];
      quantizeRef(j, &all[static_cast<size_t>(w.src)].x[w.t * j.hidden], &rc, &rs);
      for (size_t b = 0; b < nb; ++b)
        if (std::bit_cast<uint32_t>(scales[i * nb + b]) != std::bit_cast<uint32_t>(rs[b]))
          return fmt::format("rank {}: recvScales row {} block {} = {} expected {}", r, i, b, scales[i * nb + b], rs[b]);
      std::vector<float> dec(j.hidden);
      for (size_t h = 0; h < j.hidden; ++h) {
        if (codes[i * j.hidden + h] != rc[h])
          return fmt::format("rank {}: recvCodes row {} element {} = {:#x} expected {:#x}", r, i, h,
                             codes[i * j.hidden + h], rc[h]);
        dec[h] = roundTo(j, e4m3Value(rc[h]) * rs[h / (j.hidden / nb)]);
      }
      putRow(j, recv.data(), i, dec.data());
    }
    for (size_t b = num_recv * j.hidden; b < codes.size(); ++b)
      if (codes[b] != 0xAB) return fmt::format("rank {}: recvCodes written past numRecv", r);
    for (size_t b = num_recv * nb; b < scales.size(); ++b)
      if (scales[b] != -3.0f) return fmt::format("rank {}: recvScales written past numRecv", r);
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const Row& w = want[i];
    const std::vector<float> row = delivered(j, &all[static_cast<size_t>(w.src)].x[w.t * j.hidden]);
    for (size_t h = 0; h < j.hidden; ++h)
      if (std::bit_cast<uint32_t>(getElem(j, recv.data(), i * j.hidden + h)) != std::bit_cast<uint32_t>(row[h]))
        return fmt::format("rank {}: recvX row {} (expert {}, rank {} token {}) element {} wrong", r, i, w.e, w.src, w.t, h);
    if (rw[i] != w.w) return fmt::format("rank {}: recvWeights[{}]={} expected {}", r, i, rw[i], w.w);
  }
  for (size_t b = num_recv * j.hidden * es; b < recv.size(); ++b)
    if (recv[b] != 0xAB) return fmt::format("rank {}: recvX written past numRecv", r);
  if (rw[num_recv] != -7.0f || rw[num_recv + 1] != -7.0f) return fmt::format("rank {}: recvWeights written past numRecv", r);

  // The experts run on the received rows; combine.
  std::vector<uint8_t> y(num_recv * j.hidden * es);
  for (size_t i = 0; i < num_recv; ++i) {
    std::vector<float> row(j.hidden);
    for (size_t h = 0; h < j.hidden; ++h) row[h] = expertFn(j, want[i].e, getElem(j, recv.data(), i * j.hidden + h));
    putRow(j, y.data(), i, row.data());
  }
  std::vector<uint8_t> out(me.count * j.hidden * es, 0xCD);
  if (chorusEpCombine(ep, y.data(), rw.data(), out.data(), c, nullptr) != chorusSuccess)
    return fmt::format("rank {} combine: {}", r, chorusGetLastError(c));
  // Reference: per rank holding experts of the token (ascending), a float
  // accumulator from +0 over those experts ascending, rounded; the partials
  // summed from +0 in rank order, rounded.  Node-limited: the partials of a
  // host's ranks summed from +0 in rank order and rounded (at the relay),
  // those summed from +0 in host order, rounded.
  for (size_t t = 0; t < me.count; ++t) {
    std::vector<std::pair<int64_t, float>> ew;
    for (int k = 0; k < j.topk; ++k) ew.emplace_back(me.ids[t * j.topk + k], me.w[t * j.topk + k]);
    std::sort(ew.begin(), ew.end());
    const std::vector<float> xt = delivered(j, &me.x[t * j.hidden]);
    for (size_t h = 0; h < j.hidden; ++h) {
      std::map<int, float> part;  // rank -> its rounded partial
      for (size_t a = 0; a < ew.size();) {
        float acc = 0.0f;
        const int q = rankOf(ew[a].first);
        for (; a < ew.size() && rankOf(ew[a].first) == q; ++a) {
          const float prod = ew[a].second * expertFn(j, static_cast<int>(ew[a].first), xt[h]);
          acc = acc + prod;
        }
        part[q] = roundTo(j, acc);
      }
      float home = 0.0f;
      if (j.max_hosts == 0) {
        for (const auto& [q, p] : part) home = home + p;
      } else {
        for (const auto& hr : hranks) {
          float hp = 0.0f;
          bool touched = false;
          for (int q : hr)
            if (part.count(q)) hp = hp + part[q], touched = true;
          if (touched) home = home + roundTo(j, hp);
        }
      }
      const float expect = roundTo(j, home);
      const float got = getElem(j, out.data(), t * j.hidden + h);
      if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(expect))
        return fmt::format("rank {}: combine token {} element {} = {} expected {} (bitwise)", r, t, h, got, expect);
    }
  }

  // Per-row values back to their (token, k).
  std::vector<float> vals(num_recv);
  for (size_t i = 0; i < num_recv; ++i) vals[i] = rw[i] + 1000.0f * static_cast<float>(want[i].e);
  std::vector<float> back(me.count * j.topk, -1.0f);
  if (chorusEpReturnTopk(ep, vals.data(), back.data(), c, nullptr) != chorusSuccess)
    return fmt::format("rank {} return: {}", r, chorusGetLastError(c));
  for (size_t i = 0; i < back.size(); ++i)
    if (back[i] != me.w[i] + 1000.0f * static_cast<float>(me.ids[i]))
      return fmt::format("rank {}: returned topk value {} = {} expected {}", r, i, back[i], me.w[i] + 1000.0f * static_cast<float>(me.ids[i]));
  return "";
}

struct Case {
  int n, experts, topk;
  chorusDataType_t dtype, itype;
  int compress = CHORUS_COMPRESS_OFF, block = -1;
  bool fp8_out = false;
};
class EpStep : public ::testing::TestWithParam<Case> {};
TEST_P(EpStep, MatchesTheReference) {
  const Case k = GetParam();
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    Job j{k.n, k.experts, k.topk, 5, k.dtype, k.itype, seed};
    j.compress = k.compress, j.block = k.block, j.fp8_out = k.fp8_out;
    if (seed == 3) j.hidden = 130;
    if (k.fp8_out) j.hidden = static_cast<size_t>(k.block < 0 ? 128 : k.block) * (seed == 3 ? 3 : 2);  // whole blocks
    auto msgs = runRanks(k.n, [&](int r, chorusComm_t c) { return runStep(j, r, c); });
    EXPECT_EQ(failures(msgs), "") << "seed " << seed;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Routings, EpStep,
    ::testing::Values(Case{1, 4, 2, chorusFloat32, chorusInt64}, Case{2, 8, 2, chorusFloat32, chorusInt64},
                      Case{2, 8, 3, chorusBfloat16, chorusInt32}, Case{3, 6, 4, chorusBfloat16, chorusInt64},
                      Case{4, 8, 3, chorusFloat32, chorusInt32}, Case{4, 16, 8, chorusBfloat16, chorusInt64},
                      Case{5, 5, 1, chorusFloat32, chorusInt64}, Case{4, 4, 4, chorusFloat32, chorusInt64},
                      // dispatch's wire compressed: fp8 (block 128: a partial block at hidden 130; block 32), bf16
                      Case{2, 8, 2, chorusFloat32, chorusInt64, CHORUS_COMPRESS_FP8},
                      Case{3, 6, 4, chorusBfloat16, chorusInt64, CHORUS_COMPRESS_FP8, 32},
                      Case{4, 8, 3, chorusFloat32, chorusInt32, CHORUS_COMPRESS_BF16},
                      // the fp8 codes and scales handed out (chorusEpDispatchFp8), block 128 and 32
                      Case{2, 8, 2, chorusFloat32, chorusInt64, CHORUS_COMPRESS_FP8, -1, true},
                      Case{3, 6, 4, chorusBfloat16, chorusInt32, CHORUS_COMPRESS_FP8, 32, true}));

// Node-limited routing on ranks of several "hosts" (net.host_id per rank; the
// hosts' ranks talk over TCP): one copy per host to the host's relay, then
// forwarded inside it; the same grouping as direct routing, combine summed
// per host at the relay.  Contiguous and interleaved host layouts, unequal
// host sizes, M = 1 and 2.
struct NlCase {
  std::vector<int> host;
  int experts, topk, max_hosts;
  chorusDataType_t dtype;
};
class EpNodeLimited : public ::testing::TestWithParam<NlCase> {};
TEST_P(EpNodeLimited, MatchesTheReference) {
  const NlCase k = GetParam();
  const int n = static_cast<int>(k.host.size());
  for (uint32_t seed = 1; seed <= 2; ++seed) {
    Job j{n, k.experts, k.topk, 9, k.dtype, chorusInt64, seed, k.host, k.max_hosts};
    auto msgs = runRanksPerRank(
        n,
        [&](int r) {
          Config cfg;
          cfg.net.host_id = fmt::format("ephost{}", k.host[static_cast<size_t>(r)]);
          return cfg;
        },
        [&](int r, chorusComm_t c) { return runStep(j, r, c); });
    EXPECT_EQ(failures(msgs), "") << "seed " << seed;
  }
}
INSTANTIATE_TEST_SUITE_P(
    Hosts, EpNodeLimited,
    ::testing::Values(NlCase{{0, 0, 1, 1}, 8, 3, 1, chorusFloat32}, NlCase{{0, 0, 1, 1}, 8, 4, 2, chorusBfloat16},
                      NlCase{{0, 1, 0, 1}, 8, 3, 1, chorusFloat32}, NlCase{{0, 0, 0, 1, 1, 2}, 12, 4, 2, chorusFloat32},
                      NlCase{{0, 1, 2, 0, 1, 2}, 6, 2, 2, chorusBfloat16}));

// The pipelined exchanges (prim/ep.hpp, exchangeChunked): rows of 128-256 KiB,
// so the busiest rank's sends take several 1 MiB batches and the packing, the
// relay's forwarding and combine's sums run chunk by chunk beside the wire
// (most pairs have fewer rows than batches: empty chunks too).  Direct and
// node-limited, float32 and bf16: bitwise the reference.
TEST(EpPipelined, SeveralBatchesMatchTheReference) {
  for (int nl = 0; nl < 2; ++nl) {
    Job j{4, 8, 3, 65536, nl != 0 ? chorusBfloat16 : chorusFloat32, chorusInt64, 2};
    if (nl != 0) j.host = {0, 0, 1, 1}, j.max_hosts = 2;
    auto msgs = runRanksPerRank(
        j.n,
        [&](int r) {
          Config cfg;
          if (nl != 0) cfg.net.host_id = fmt::format("ephost{}", j.host[static_cast<size_t>(r)]);
          return cfg;
        },
        [&](int r, chorusComm_t c) { return runStep(j, r, c); });
    EXPECT_EQ(failures(msgs), "") << (nl != 0 ? "node-limited" : "direct");
  }
}

// chorusEpDispatchFp8 with node-limited routing: the codes and scales cross
// to the relay and are forwarded unchanged.
TEST(EpNodeLimited, Fp8CodesAndScalesMatchTheReferenceQuantizer) {
  Job j{4, 8, 3, 64, chorusBfloat16, chorusInt64, 2, {0, 0, 1, 1}, 2};
  j.compress = CHORUS_COMPRESS_FP8, j.block = 32, j.fp8_out = true;
  auto msgs = runRanksPerRank(
      4,
      [&](int r) {
        Config cfg;
        cfg.net.host_id = fmt::format("ephost{}", j.host[static_cast<size_t>(r)]);
        return cfg;
      },
      [&](int r, chorusComm_t c) { return runStep(j, r, c); });
  EXPECT_EQ(failures(msgs), "");
}

// Runs body after creating a handle (float32, 12 experts, top-2, hidden 4).
std::string withEp(int r, chorusComm_t c, const std::function<std::string(chorusEpHandle_t)>& body) {
  chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
  cfg.numExperts = 12, cfg.topk = 2, cfg.hidden = 4, cfg.datatype = chorusFloat32, cfg.indexType = chorusInt32;
  chorusEpHandle_t ep = nullptr;
  if (chorusEpCreate(&ep, &cfg, c) != chorusSuccess) return fmt::format("rank {} create: {}", r, chorusGetLastError(c));
  std::string s = body(ep);
  chorusEpDestroy(ep);
  return s;
}

// Expects `got` == want and the message to hold `needle` (on the rank that
// passed the bad argument) or `other` (on the others).
std::string expect(int r, chorusComm_t c, chorusResult_t got, chorusResult_t want, bool bad_rank, const std::string& needle,
                   const std::string& other) {
  if (got != want) return fmt::format("rank {}: result {} expected {} ({})", r, static_cast<int>(got), static_cast<int>(want), chorusGetLastError(c));
  const std::string msg = chorusGetLastError(c);
  const std::string& n = bad_rank ? needle : other;
  if (msg.find(n) == std::string::npos) return fmt::format("rank {}: '{}' not in: {}", r, n, msg);
  return "";
}

// A good step after a refused one: the communicator and handle go on.
std::string goodStep(int r, chorusComm_t c, chorusEpHandle_t ep) {
  std::vector<int32_t> ids = {0, 7, 3, 4};
  std::vector<float> x(8, 1.0f);
  size_t nr = 0;
  if (chorusEpLayout(ep, ids.data(), 2, nullptr, nullptr, nullptr, nullptr, &nr, c, nullptr) != chorusSuccess)
    return fmt::format("rank {} good layout: {}", r, chorusGetLastError(c));
  std::vector<float> rx(nr * 4), out(8);
  if (chorusEpDispatch(ep, x.data(), nullptr, rx.data(), nullptr, nr, c, nullptr) != chorusSuccess)
    return fmt::format("rank {} good dispatch: {}", r, chorusGetLastError(c));
  if (chorusEpCombine(ep, rx.data(), nullptr, out.data(), c, nullptr) != chorusSuccess)
    return fmt::format("rank {} good combine: {}", r, chorusGetLastError(c));
  for (float v : out)
    if (v != 2.0f) return fmt::format("rank {}: good step's combine gave {} (expected 2: two experts, weight 1)", r, v);
  return "";
}

TEST(EpBadInput, ExpertIdsOutOfRangeOrRepeatedFailEveryRank) {
  for (int32_t bad : {-1, 12, 1 << 30}) {
    auto msgs = runRanks(3, [&](int r, chorusComm_t c) {
      return withEp(r, c, [&](chorusEpHandle_t ep) -> std::string {
        std::vector<int32_t> ids = {0, 5, 2, 3};
        if (r == 1) ids[3] = bad;
        size_t nr = 0;
        std::string e = expect(r, c, chorusEpLayout(ep, ids.data(), 2, nullptr, nullptr, nullptr, nullptr, &nr, c, nullptr),
                               chorusInvalidArgument, r == 1, fmt::format("topkIdx[3] (token 1, choice 1) = {}", bad),
                               "rank 1 refused");
        if (!e.empty()) return e;
        // No layout now on any rank: dispatch refused on every rank too.
        std::vector<float> x(8), rx(64);
        e = expect(r, c, chorusEpDispatch(ep, x.data(), nullptr, rx.data(), nullptr, 16, c, nullptr),
                   chorusInvalidUsage, true, "call chorusEpLayout first", "");
        if (!e.empty()) return e;
        return goodStep(r, c, ep);
      });
    });
    EXPECT_EQ(failures(msgs), "") << bad;
  }
  auto msgs = runRanks(2, [&](int r, chorusComm_t c) {
    return withEp(r, c, [&](chorusEpHandle_t ep) -> std::string {
      std::vector<int32_t> ids = {0, 5, 3, r == 1 ? 3 : 4};
      std::string e = expect(r, c, chorusEpLayout(ep, ids.data(), 2, nullptr, nullptr, nullptr, nullptr, nullptr, c, nullptr),
                             chorusInvalidArgument, r == 1, "repeats choice 0", "rank 1 refused");
      if (!e.empty()) return e;
      e = expect(r, c, chorusEpLayout(ep, nullptr, r == 0 ? 3 : 0, nullptr, nullptr, nullptr, nullptr, nullptr, c, nullptr),
                 chorusInvalidArgument, r == 0, "topkIdx is NULL but numTokens=3", "rank 0 refused");
      return e.empty() ? goodStep(r, c, ep) : e;
    });
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(EpBadInput, ARecvBufferTooSmallFailsEveryRankWithoutAWrite) {
  auto msgs = runRanks(2, [&](int r, chorusComm_t c) {
    return withEp(r, c, [&](chorusEpHandle_t ep) -> std::string {
      std::vector<int32_t> ids = {0, 7, 3, 4, 1, 6};
      size_t nr = 0;
      if (chorusEpLayout(ep, ids.data(), 3, nullptr, nullptr, nullptr, nullptr, &nr, c, nullptr) != chorusSuccess)
        return chorusGetLastError(c);
      const size_t cap = r == 1 ? nr - 1 : nr;
      std::vector<float> x(12, 3.0f), rx(nr * 4, -5.0f), rw(nr, -5.0f);
      std::string e = expect(r, c, chorusEpDispatch(ep, x.data(), nullptr, rx.data(), rw.data(), cap, c, nullptr),
                             chorusInvalidArgument, r == 1, fmt::format("recvCapacity={} rows but {} rows arrive", cap, nr),
                             "rank 1 refused");
      if (!e.empty()) return e;
      for (float v : rx)
        if (v != -5.0f) return fmt::format("rank {}: recvX written by a refused dispatch", r);
      for (float v : rw)
        if (v != -5.0f) return fmt::format("rank {}: recvWeights written by a refused dispatch", r);
      // Combine without a dispatch is refused too.
      std::vector<float> out(12);
      e = expect(r, c, chorusEpCombine(ep, rx.data(), nullptr, out.data(), c, nullptr), chorusInvalidUsage, true,
                 "call chorusEpDispatch first", "");
      return e.empty() ? goodStep(r, c, ep) : e;
    });
  });
  EXPECT_EQ(failures(msgs), "");
}

// chorusEpDispatchFp8's bad input, refused on every rank before a write:
// a handle without the fp8 wire, hidden not a multiple of the block (every
// rank: the config is the same), a scale buffer too short on one rank.
TEST(EpBadInput, Fp8OutRefusesBadScalesOrBlocksOnEveryRank) {
  auto run = [](int r, chorusComm_t c, int compress, size_t hidden, bool short_scales, const std::string& needle,
                const std::string& other) -> std::string {
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = 4, cfg.topk = 2, cfg.hidden = hidden, cfg.datatype = chorusFloat32, cfg.indexType = chorusInt32;
    cfg.dispatchCompress = compress, cfg.fp8Block = 32;
    chorusEpHandle_t ep = nullptr;
    if (chorusEpCreate(&ep, &cfg, c) != chorusSuccess) return fmt::format("rank {} create: {}", r, chorusGetLastError(c));
    std::unique_ptr<chorusEpHandle, decltype(&chorusEpDestroy)> guard(ep, &chorusEpDestroy);
    std::vector<int32_t> ids = {0, 3, 1, 2};
    size_t nr = 0;
    if (chorusEpLayout(ep, ids.data(), 2, nullptr, nullptr, nullptr, nullptr, &nr, c, nullptr) != chorusSuccess)
      return chorusGetLastError(c);
    const size_t nb = (hidden + 31) / 32;
    const size_t scap = nr * nb - (short_scales && r == 1 ? 1 : 0);
    std::vector<float> x(2 * hidden, 3.0f), scales(nr * nb, -5.0f), rw(nr, -5.0f);
    std::vector<uint8_t> codes(nr * hidden, 0xAB);
    std::string e = expect(r, c,
                           chorusEpDispatchFp8(ep, x.data(), nullptr, codes.data(), scales.data(), scap, rw.data(), nr, c,
                                               nullptr),
                           chorusInvalidArgument, !short_scales || r == 1, needle, other);
    if (!e.empty()) return e;
    for (uint8_t v : codes)
      if (v != 0xAB) return fmt::format("rank {}: recvCodes written by a refused dispatch", r);
    for (float v : scales)
      if (v != -5.0f) return fmt::format("rank {}: recvScales written by a refused dispatch", r);
    for (float v : rw)
      if (v != -5.0f) return fmt::format("rank {}: recvWeights written by a refused dispatch", r);
    return "";
  };
  auto msgs = runRanks(2, [&](int r, chorusComm_t c) {
    std::string e = run(r, c, CHORUS_COMPRESS_OFF, 64, false, "needs config.dispatchCompress=CHORUS_COMPRESS_FP8", "");
    if (e.empty()) e = run(r, c, CHORUS_COMPRESS_FP8, 40, false, "config.hidden=40 is not a multiple of the fp8 block 32", "");
    if (e.empty()) e = run(r, c, CHORUS_COMPRESS_FP8, 64, true, "recvScales holds", "rank 1 refused");
    return e;
  });
  EXPECT_EQ(failures(msgs), "");
}

// A token beyond maxHostsPerToken is refused on every rank.
TEST(EpNodeLimitedBadInput, ATokenOnTooManyHostsFailsEveryRank) {
  auto msgs = runRanksPerRank(
      4,
      [](int r) {
        Config cfg;
        cfg.net.host_id = fmt::format("ephost{}", r / 2);
        return cfg;
      },
      [](int r, chorusComm_t c) -> std::string {
        chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
        cfg.numExperts = 8, cfg.topk = 2, cfg.hidden = 2, cfg.datatype = chorusFloat32, cfg.maxHostsPerToken = 1;
        chorusEpHandle_t ep = nullptr;
        if (chorusEpCreate(&ep, &cfg, c) != chorusSuccess) return chorusGetLastError(c);
        std::unique_ptr<chorusEpHandle, decltype(&chorusEpDestroy)> guard(ep, &chorusEpDestroy);
        // Experts 0-3 on host 0, 4-7 on host 1: rank 3's second token spans both.
        std::vector<int64_t> ids = {0, 3, 4, r == 3 ? 1 : 7};
        return expect(r, c, chorusEpLayout(ep, ids.data(), 2, nullptr, nullptr, nullptr, nullptr, nullptr, c, nullptr),
                      chorusInvalidArgument, r == 3, "topkIdx row 1 (token 1) reaches 2 hosts but maxHostsPerToken=1",
                      "rank 3 refused");
      });
  EXPECT_EQ(failures(msgs), "");
}

TEST(EpBadInput, BadOrDifferingConfigsFailEveryRank) {
  struct Bad {
    std::function<void(chorusEpConfig_t&)> set;
    std::string needle;
  };
  const std::vector<Bad> bads = {
      {[](chorusEpConfig_t& c) { c.topk = 0; }, "config.topk=0"},
      {[](chorusEpConfig_t& c) { c.hidden = 0; }, "config.hidden=0"},
      {[](chorusEpConfig_t& c) { c.numExperts = 7; }, "config.numExperts=7 is not a multiple"},
      {[](chorusEpConfig_t& c) { c.topk = 9; }, "config.topk=9"},
      {[](chorusEpConfig_t& c) { c.datatype = chorusInt32; }, "config.datatype=2 is not supported"},
      {[](chorusEpConfig_t& c) { c.indexType = chorusFloat32; }, "config.indexType=7 is not supported"},
      {[](chorusEpConfig_t& c) { c.maxHostsPerToken = -1; }, "config.maxHostsPerToken=-1 must be >= 0"},
      {[](chorusEpConfig_t& c) { c.dispatchCompress = 5; }, "config.dispatchCompress=5 is not one of"},
      {[](chorusEpConfig_t& c) { c.fp8Block = 16; }, "config.fp8Block=16 is outside 32..1024"},
  };
  for (const Bad& b : bads) {
    auto msgs = runRanks(3, [&](int r, chorusComm_t c) -> std::string {
      chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
      cfg.numExperts = 6, cfg.topk = 2, cfg.hidden = 4;
      if (r == 2) b.set(cfg);
      chorusEpHandle_t ep = reinterpret_cast<chorusEpHandle_t>(1);
      std::string e = expect(r, c, chorusEpCreate(&ep, &cfg, c), chorusInvalidArgument, r == 2, b.needle, "rank 2 refused");
      if (e.empty() && ep != nullptr) e = fmt::format("rank {}: *ep not NULL after a failed create", r);
      return e;
    });
    EXPECT_EQ(failures(msgs), "") << b.needle;
  }
  // Valid on each rank, but not alike.
  auto msgs = runRanks(2, [&](int r, chorusComm_t c) -> std::string {
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = 4, cfg.topk = 2, cfg.hidden = r == 0 ? 4 : 8;
    chorusEpHandle_t ep = nullptr;
    return expect(r, c, chorusEpCreate(&ep, &cfg, c), chorusInvalidArgument, true, "config.hidden differs across ranks (from 4 to 8)", "");
  });
  EXPECT_EQ(failures(msgs), "");
  // A wrong size field.
  msgs = runRanks(1, [&](int r, chorusComm_t c) -> std::string {
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.size = 8;
    chorusEpHandle_t ep = nullptr;
    return expect(r, c, chorusEpCreate(&ep, &cfg, c), chorusInvalidArgument, true, "config->size=8", "");
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(EpBadInput, HandlesAreChecked) {
  auto msgs = runRanks(1, [&](int r, chorusComm_t c) -> std::string {
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = 2, cfg.topk = 1, cfg.hidden = 1;
    chorusEpHandle_t ep = nullptr;
    if (chorusEpCreate(&ep, &cfg, c) != chorusSuccess) return chorusGetLastError(c);
    if (chorusEpDestroy(ep) != chorusSuccess) return "destroy failed";
    int32_t id = 0;
    std::string e = expect(r, c, chorusEpLayout(ep, &id, 1, nullptr, nullptr, nullptr, nullptr, nullptr, c, nullptr),
                           chorusInvalidUsage, true, "not a live handle", "");
    if (!e.empty()) return e;
    if (chorusEpDestroy(ep) != chorusInvalidUsage) return "a second destroy was accepted";
    // The primitives refuse a call block that is not one.
    chorusPrimitiveArgs_t a = CHORUS_PRIMITIVE_ARGS_INITIALIZER;
    return expect(r, c, chorusPrimitive("ep_dispatch", &a, c, nullptr), chorusInvalidArgument, true,
                  "aux must be the chorusEp* entry points' call block", "");
  });
  EXPECT_EQ(failures(msgs), "");
}

// A rank that aborts its communicator between layout and dispatch (as a
// dying rank's peers see it): the others' dispatch fails, it does not hang.
TEST(EpFaults, ARankThatLeavesMidStepFailsTheOthers) {
  Config cfg;
  cfg.timeout = std::chrono::milliseconds(20000);
  auto msgs = runRanks(3, cfg, [&](int r, chorusComm_t c) {
    return withEp(r, c, [&](chorusEpHandle_t ep) -> std::string {
      std::vector<int32_t> ids = {0, 7, 3, 4};
      size_t nr = 0;
      if (chorusEpLayout(ep, ids.data(), 2, nullptr, nullptr, nullptr, nullptr, &nr, c, nullptr) != chorusSuccess)
        return chorusGetLastError(c);
      if (r == 2) {
        chorusCommAbort(c);
        return "";
      }
      std::vector<float> x(8, 1.0f), rx(nr * 4);
      const chorusResult_t res = chorusEpDispatch(ep, x.data(), nullptr, rx.data(), nullptr, nr, c, nullptr);
      if (res == chorusSuccess) return fmt::format("rank {}: dispatch succeeded although rank 2 left", r);
      if (res != chorusRemoteError && res != chorusAborted)
        return fmt::format("rank {}: result {} (expected a remote error): {}", r, static_cast<int>(res), chorusGetLastError(c));
      if (std::string(chorusGetLastError(c)).find("rank 2") == std::string::npos)
        return fmt::format("rank {}: the error does not name rank 2: {}", r, chorusGetLastError(c));
      return "";
    });
  });
  EXPECT_EQ(failures(msgs), "");
}

// The dispatch of one concrete call: its exchange proven, its routing checked.
// The rows each rank sends to each rank (tokensPerRank, from the real layout)
// make an all-to-all-v shape, and the verifier proves every registered
// all-to-all-v plan for it (each row reaches exactly its destination's block,
// at its place, once) and for the combine's reverse exchange.  Then, on the
// real dispatch's output (x tagged with its source rank and token), every
// (rank, token, expert) of the routing is found exactly once, in its expert's
// group on its expert's rank, and nothing else arrived; and a combine of
// y = 4^expert (exact in float32) gives each token exactly the sum over its
// own experts: every expert's row came back once.
TEST(EpPlan, TheCallsExchangeIsProvenAndEveryTokenReachesExactlyItsExperts) {
  const int n = 4, E = 8, k = 3, L = E / n;
  Job j{n, E, k, 1, chorusFloat32, chorusInt64, 7};
  std::vector<std::vector<size_t>> rows(n, std::vector<size_t>(n));
  std::vector<std::vector<float>> got(n);     // recvX tags per rank
  std::vector<std::vector<size_t>> rpe(n);    // recvPerExpert per rank
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) -> std::string {
    const Tokens me = tokensOf(j, r);
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = E, cfg.topk = k, cfg.hidden = 1, cfg.datatype = chorusFloat32, cfg.indexType = chorusInt64;
    chorusEpHandle_t ep = nullptr;
    if (chorusEpCreate(&ep, &cfg, c) != chorusSuccess) return chorusGetLastError(c);
    std::unique_ptr<chorusEpHandle, decltype(&chorusEpDestroy)> guard(ep, &chorusEpDestroy);
    size_t nr = 0;
    rpe[static_cast<size_t>(r)].resize(L);
    if (chorusEpLayout(ep, me.ids.data(), me.count, rows[static_cast<size_t>(r)].data(), nullptr, nullptr,
                       rpe[static_cast<size_t>(r)].data(), &nr, c, nullptr) != chorusSuccess)
      return chorusGetLastError(c);
    std::vector<float> x(me.count), rx(nr), out(me.count);
    for (size_t t = 0; t < me.count; ++t) x[t] = static_cast<float>(r * 1000 + static_cast<int>(t));
    if (chorusEpDispatch(ep, x.data(), nullptr, rx.data(), nullptr, nr, c, nullptr) != chorusSuccess)
      return chorusGetLastError(c);
    got[static_cast<size_t>(r)] = rx;
    std::vector<float> y(nr);
    for (size_t i = 0, at = 0; i < static_cast<size_t>(L); ++i)
      for (size_t q = 0; q < rpe[static_cast<size_t>(r)][i]; ++q, ++at)
        y[at] = static_cast<float>(1u << (2 * (r * L + static_cast<int>(i))));
    if (chorusEpCombine(ep, y.data(), nullptr, out.data(), c, nullptr) != chorusSuccess) return chorusGetLastError(c);
    for (size_t t = 0; t < me.count; ++t) {
      float want = 0;
      for (int q = 0; q < k; ++q) want += static_cast<float>(1u << (2 * me.ids[t * k + q]));
      if (out[t] != want) return fmt::format("rank {}: token {} came back as {}, its experts sum to {}", r, t, out[t], want);
    }
    return "";
  });
  ASSERT_EQ(failures(msgs), "");

  // The exchange of this call's counts, proven: dispatch (rows[r][p] from r
  // to p) and combine (the transpose).
  plan::Registry reg = plan::Registry::builtin();
  for (bool reverse : {false, true}) {
    plan::VerifyCase vc;
    vc.shape.coll = plan::Collective::AllToAllV;
    vc.shape.nranks = n;
    vc.send_counts.assign(n, std::vector<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p)
        vc.send_counts[static_cast<size_t>(r)][static_cast<size_t>(p)] =
            reverse ? rows[static_cast<size_t>(p)][static_cast<size_t>(r)] : rows[static_cast<size_t>(r)][static_cast<size_t>(p)];
    vc.send_displs.assign(n, std::vector<size_t>(n));
    vc.recv_counts.assign(n, std::vector<size_t>(n));
    vc.recv_displs.assign(n, std::vector<size_t>(n));
    for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
      size_t so = 0, ro = 0;
      for (size_t p = 0; p < static_cast<size_t>(n); ++p) {
        vc.send_displs[r][p] = so, so += vc.send_counts[r][p];
        vc.recv_counts[r][p] = vc.send_counts[p][r];
        vc.recv_displs[r][p] = ro, ro += vc.recv_counts[r][p];
      }
    }
    int proven = 0;
    for (const plan::Algorithm* a : reg.forCollective(plan::Collective::AllToAllV)) {
      if (!a->supports(vc.shape)) continue;
      Status st = plan::verify(*a, vc);
      EXPECT_TRUE(st.isOk()) << st.message();
      ++proven;
    }
    EXPECT_GT(proven, 0) << "no all-to-all-v plan was proven for the call's counts";
  }

  // The routing, on the real dispatch's output.
  size_t triples = 0;
  for (int q = 0; q < n; ++q) {
    const Tokens tq = tokensOf(j, q);
    for (size_t t = 0; t < tq.count; ++t)
      for (int c = 0; c < k; ++c) {
        const int e = static_cast<int>(tq.ids[t * k + static_cast<size_t>(c)]);
        const int r = e / L, le = e % L;
        size_t begin = 0;
        for (int i = 0; i < le; ++i) begin += rpe[static_cast<size_t>(r)][static_cast<size_t>(i)];
        const auto first = got[static_cast<size_t>(r)].begin() + static_cast<ptrdiff_t>(begin);
        const auto last = first + static_cast<ptrdiff_t>(rpe[static_cast<size_t>(r)][static_cast<size_t>(le)]);
        const auto found = std::count(first, last, static_cast<float>(q * 1000 + static_cast<int>(t)));
        EXPECT_EQ(found, 1) << "rank " << q << " token " << t << " in expert " << e << "'s group";
        ++triples;
      }
  }
  size_t arrived = 0;
  for (const auto& g : got) arrived += g.size();
  EXPECT_EQ(arrived, triples) << "rows arrived that no (token, expert) asked for";
}

}  // namespace
}  // namespace chorus::testing
