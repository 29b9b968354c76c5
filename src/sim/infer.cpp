#include "sim/infer.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <deque>
#include <functional>
#include <queue>
#include <optional>
#include <random>
#include <set>

#include "sim/cli_args.hpp"
#include "sim/compute.hpp"

namespace chorus::sim {
namespace {

constexpr double kAct = 2;  // bytes per 16-bit activation element

struct Request {
  double arrival = 0;
  int64_t in = 0, out = 0;
  double first = -1, done = -1;  // first token, last token
  double ready = 0;              // disaggregated: KV arrived at the decode pool
  double kv_s = 0;
  int64_t user = -1;             // closed loop: who sent it
  double last_token = -1;        // time of its latest token (ITL)
  int64_t resume = 0;            // --kv-alloc paged: output tokens made before a preemption (recomputed on return)
  int64_t order = 0;             // admission order on its replica (the newest is preempted first)
};

// Phase costs of one replica of tp GPUs (roofline; see docs/simulator.md).
class Replica {
 public:
  // `attention_kernel`: whose fused attention curves price the prefill ("" = the GPU's default).
  Replica(const ModelSpec& m, const ClusterSpec& c, int tp, bool fp8, bool kv_fp8, Seconds ar_alpha, double ar_beta,
          std::string_view attention_kernel = "")
      : m_(m), g_(c.gpu), tp_(tp), fp8_(fp8 || m.weight_bytes <= 1), w8_(fp8), kv_bytes_(kv_fp8 ? 1 : kAct),
        ar_alpha_(ar_alpha.value()), ar_beta_(ar_beta), compute_(c.gpu, fp8_, attention_kernel, Compute::Load::Sustained) {}

  // Prefill of requests with `tokens` input tokens in all; `sq` = sum of
  // squared lengths and `sq_win` the same capped by the window (2 x the
  // causal pairs a sliding layer attends, ~ 2 L W - W^2 for L > W).
  // `keys` / `keys_win` > 0: the mean key length the queries attend (a
  // prompt's uncached suffix [c, n) sees n keys: --prefix-hit).
  [[nodiscard]] double prefill(double tokens, double sq, double sq_win, double keys = 0, double keys_win = 0) const {
    if (ep_ > 1) return step(0, 0, 0, tokens, sq / 2, sq_win / 2);  // the expert-parallel roofline step
    // Whole prompts: equal problems of L = sq / tokens queries and keys.
    if (keys <= 0) keys = tokens > 0 ? sq / tokens : 0;
    if (keys_win <= 0) keys_win = tokens > 0 ? sq_win / tokens : 0;
    return passes(tokens, sq, sq_win, keys, keys_win);
  }
  // Turning `rows` rows of logits into tokens (one row per sequence that
  // samples: a decode, a prompt's first token, each verified position of a
  // speculative step).  vLLM's sampler (vllm/v1/sample/sampler.py): the head's
  // 16-bit logits (written, 2 B) cast to fp32 (read 2, write 4), divided by the
  // temperature in place (4 + 4), softmax (4 + 4), argmax (4): 28 bytes per
  // vocabulary entry at the HBM rate, and 4 kernels beside the head GEMM.  The
  // least a sampler does (greedy, no top-k/top-p); one GPU samples.
  [[nodiscard]] double sample(double rows) const {
    if (rows <= 0) return 0;
    return rows * static_cast<double>(m_.vocab) * 28 / (g_.hbm_bw.value() * g_.hbm_efficiency) +
           4 * g_.kernel_overhead.value();
  }
  // --kv-alloc paged: the decode attention reads the cache through a block
  // table, `overhead` slower than a contiguous cache (InferConfig::paged_overhead).
  void setPagedAttention(double overhead) { paged_ = overhead; }
  // Every layer's pass over `tokens` tokens by the per-operator model: the
  // GEMMs and the fused causal attention core as the training model prices
  // them (src/sim/compute.hpp: by shape from the GPU's data file), when the
  // GPU has one; else the cluster's single efficiency curve.  The prompt
  // attention covers `pairs2` (full layers) / `pairs2_win` (sliding layers)
  // = 2 x the causal (query, key) pairs, run at key length `keys` /
  // `keys_win`: whole prompts L = sum n^2 / sum n; a chunk [a, b) of a
  // prompt its b keys (the chunk's queries see the prefix), so a chunk never
  // runs at a longer key length, nor so a higher efficiency, than its whole
  // prompt (docs/simulator.md, "Mixed steps by the per-operator model").
  [[nodiscard]] double passes(double tokens, double pairs2_full, double pairs2_win, double keys, double keys_win) const {
    const double h = static_cast<double>(m_.hidden), T = tp_;
    const double heads_v = static_cast<double>(m_.heads) * m_.vHeadDim();
    const double mats = m_.ffnMats();
    double t = 0;
    const bool per_op = compute_.spec() != nullptr;
    for (int l = 0; l < m_.layers; ++l) {
      const double ff = m_.ffnPerToken(l);
      if (per_op) {
        t += (compute_.gemm(tokens, m_.attnInParams() / h / T, h) + compute_.gemm(tokens, h, heads_v / T) +
              compute_.gemm(tokens, (mats - 1) * ff / T, h) + compute_.gemm(tokens, h, ff / T)).value();
      } else {
        t += gemm(tokens, m_.attnInParams() / h / T, h) + gemm(tokens, h, heads_v / T) +
             gemm(tokens, (mats - 1) * ff / T, h) + gemm(tokens, h, ff / T);
      }
      // Causal attention (FlashAttention): 2 x sq/2 x heads x (qk + v) FLOPs per layer.
      const bool win = m_.isWindowLayer(l);
      const double pairs2 = win ? pairs2_win : pairs2_full;  // 2 x the (query, key) pairs
      const double L = win ? keys_win : keys;
      const double core = pairs2 * static_cast<double>(m_.heads) * (m_.qkHeadDim() + m_.vHeadDim());
      if (per_op && tokens > 0 && pairs2 > 0 && L > 0) {
        // Problems of L queries and L keys, as many as carry the same FLOPs (causal).
        const double problems = static_cast<double>(m_.heads) / T * pairs2 / (L * L);
        t += compute_.attention(problems, L, L, m_.qkHeadDim(), m_.vHeadDim(), true).value();
        t += 5 * g_.kernel_overhead.value();  // two norms, the activation, two residual adds
      } else {
        t += core / T / (peak() * g_.gemm_efficiency) + 6 * g_.kernel_overhead.value();
      }
      t += 2 * allreduce(tokens * h * kAct);
    }
    return t;
  }
  // A mixed (chunked-prefill) step: `batch` decoding requests of `q` queries
  // each over `context` / `context_win` tokens of cache, and `chunk` prompt
  // tokens whose attention covers `pairs` / `pairs_win` causal pairs at key
  // length `keys` / `keys_win`.  The layer passes over all batch x q + chunk
  // tokens as a prefill prices them, plus the decodes' attention over the
  // cache (its FLOPs or its bytes, whichever is slower), and never less than
  // reading the weights the step touches and the cache once.
  [[nodiscard]] double mixed(double batch, double context, double context_win, double chunk, double pairs,
                             double pairs_win, double keys, double keys_win, double q = 1) const {
    if (ep_ > 1 || chunk <= 0) return step(batch, context, context_win, chunk, pairs, pairs_win, q);
    const double tokens = batch * q + chunk;
    double t = passes(tokens, 2 * pairs, 2 * pairs_win, keys, keys_win);
    const double kv = kvBytesFor(context, context_win) * (1 + paged_);
    const double hbm = g_.hbm_bw.value() * g_.hbm_efficiency;
    if (batch > 0) {
      double attn = 0;
      for (int l = 0; l < m_.layers; ++l)
        attn += 2 * q * (m_.isWindowLayer(l) ? context_win : context) * m_.heads * decodeWidth();
      t += std::max(attn / tp_ / (peak() * g_.gemm_efficiency), kv / hbm);
    }
    return std::max(t, (weightsRead(tokens) + kv) / hbm);
  }
  // Weight bytes one GPU reads in a step whose tokens route to experts at
  // random: an MoE layer reads only the experts some token chose.
  [[nodiscard]] double weightsRead(double tokens) const {
    double w = 0;
    for (int l = 0; l < m_.layers; ++l) {
      double lb = layerBytes(l);
      if (ep_ > 1) {  // routed experts spread over ep GPUs, the rest split over tp
        const double routed = routedBytes(l);
        const double E = m_.moe.experts;
        const double touched = m_.isMoeLayer(l) ? 1 - std::pow(1 - double(m_.moe.top_k) / E, tokens) : 0;
        w += (lb - routed) / tp_ + routed / ep_ * touched;
        continue;
      }
      if (m_.isMoeLayer(l)) {
        const double E = m_.moe.experts;
        const double touched = E * (1 - std::pow(1 - double(m_.moe.top_k) / E, tokens));
        lb -= m_.expertParams() * expertBytes() * (E - touched);
      }
      w += lb / tp_;
    }
    return w + static_cast<double>(m_.vocab) * static_cast<double>(m_.hidden) / tp_ * kAct;  // the head
  }
  // One decode step of `batch` requests holding `context` tokens of KV in all
  // (`context_win`: the same with each request capped at the window).
  [[nodiscard]] double decode(double batch, double context, double context_win) const {
    return step(batch, context, context_win, 0, 0, 0);
  }
  // A step of `batch` decode tokens plus `chunk` prompt tokens (chunked
  // prefill) whose attention covers `pairs` (full layers) / `pairs_win`
  // (sliding layers) query-key pairs: one roofline over the whole step —
  // the weights are read once, the FLOPs of every token add up.
  // `q` queries per decoding request (speculative decoding verifies K + 1):
  // q x the GEMM and attention FLOPs, the cache read once.
  [[nodiscard]] double step(double batch, double context, double context_win, double chunk, double pairs,
                            double pairs_win, double q = 1) const {
    const double tokens = batch * q + chunk;
    if (tokens <= 0) return 0;
    const double h = static_cast<double>(m_.hidden), T = tp_;
    const double kv = kvBytesFor(context, context_win) * (1 + paged_);  // as read: paged kernels' extra time as bytes
    // Attention over the cache per layer: MHA/GQA 2 x context x heads x (qk + v);
    // MLA decodes in the latent (the up-projections absorbed into Q and O),
    // so each head scores kv_lora + rope wide and gathers kv_lora wide.
    const double width = decodeWidth();
    const double prefill_width = m_.qkHeadDim() + m_.vHeadDim();
    double attn = 0;
    for (int l = 0; l < m_.layers; ++l) {
      attn += 2 * q * (m_.isWindowLayer(l) ? context_win : context) * m_.heads * width;
      attn += 2 * (m_.isWindowLayer(l) ? pairs_win : pairs) * m_.heads * prefill_width;
    }
    if (ep_ > 1) {
      // DP attention: each of the ep / tp groups runs attention (and dense
      // layers) for its share of the requests over its tp GPUs; every GPU
      // runs its ep-th of the experts for all tokens routed there; each MoE
      // layer dispatches each token to its top_k experts and combines the
      // results (two all-to-alls over the ep GPUs, 16-bit hidden states).
      const double a = static_cast<double>(ep_) / tp_;
      const double routed = m_.moeLayers() * m_.moe.top_k * m_.expertParams();
      const double flops = 2 * (tokens / a) * (m_.activeMatmulParams() - routed) / T + 2 * tokens * routed / ep_ + attn / a / T;
      const double tc = flops / (peak() * g_.gemm_efficiency);
      const double tm = (weightsRead(tokens) + kv / a) / (g_.hbm_bw.value() * g_.hbm_efficiency);
      const double a2a = a2a_alpha_ + a2a_beta_ * (tokens / ep_) * m_.moe.top_k * h * kAct + g_.kernel_overhead.value();
      return std::max(tc, tm) + m_.layers * (8 * g_.kernel_overhead.value() + 2 * allreduce(tokens / a * h * kAct)) +
             m_.moeLayers() * 2 * a2a;
    }
    const double flops = 2 * tokens * m_.activeMatmulParams() / T + attn / T;
    const double tc = flops / (peak() * g_.gemm_efficiency);
    const double tm = (weightsRead(tokens) + kv) / (g_.hbm_bw.value() * g_.hbm_efficiency);
    return std::max(tc, tm) + m_.layers * (8 * g_.kernel_overhead.value() + 2 * allreduce(tokens * h * kAct));
  }
  // Expert parallelism over ep GPUs (a multiple of tp): the all-to-all's
  // alpha + beta x bytes sent per GPU, from the plans.
  void setExpertParallel(int ep, double a2a_alpha, double a2a_beta) { ep_ = ep, a2a_alpha_ = a2a_alpha, a2a_beta_ = a2a_beta; }
  [[nodiscard]] int ep() const { return ep_; }
  [[nodiscard]] double a2aAlpha() const { return a2a_alpha_; }
  [[nodiscard]] double a2aBeta() const { return a2a_beta_; }
  [[nodiscard]] double weightBytesPerGpu() const {
    double b = static_cast<double>(m_.vocab) * static_cast<double>(m_.hidden) * (m_.tie_embeddings ? 1 : 2) * kAct;
    double routed = 0;
    for (int l = 0; l < m_.layers; ++l) {
      const double r = ep_ > 1 ? routedBytes(l) : 0;
      b += layerBytes(l) - r, routed += r;
    }
    return b / tp_ + routed / ep_;
  }
  // KV-cache bytes per token on one GPU: the layers without a window, and
  // the sliding layers (which hold at most `window` tokens per request).
  [[nodiscard]] double kvFullPerToken() const { return perLayerKv() * (m_.layers - windowLayers()); }
  [[nodiscard]] double kvWinPerToken() const { return perLayerKv() * windowLayers(); }
  [[nodiscard]] double kvBytesFor(double context, double context_win) const {
    return kvFullPerToken() * context + kvWinPerToken() * context_win;
  }
  // One request of n tokens.
  [[nodiscard]] double kvBytesOf(double n) const { return kvBytesFor(n, capped(n)); }
  [[nodiscard]] double capped(double n) const { return m_.window > 0 ? std::min(n, static_cast<double>(m_.window)) : n; }
  [[nodiscard]] double kvBytesPerToken() const { return kvFullPerToken() + kvWinPerToken(); }
  [[nodiscard]] double kvElemBytes() const { return kv_bytes_; }

 private:
  // The width each head's decode attention reads and multiplies per cached token.
  [[nodiscard]] double decodeWidth() const {
    return m_.hasMla() ? static_cast<double>(2 * m_.mla.kv_lora_rank + m_.mla.qk_rope_head_dim)
                       : m_.qkHeadDim() + m_.vHeadDim();
  }
  [[nodiscard]] double perLayerKv() const { return m_.kvCacheElems() / m_.kvCacheSplit(tp_) * kv_bytes_; }
  [[nodiscard]] int windowLayers() const {
    int n = 0;
    for (int l = 0; l < m_.layers; ++l) n += m_.isWindowLayer(l) ? 1 : 0;
    return n;
  }
  // Bytes of layer l's weights: the model's own format, or 1 byte each with --fp8.
  [[nodiscard]] double layerBytes(int l) const {
    if (!w8_) return m_.layerWeightBytes(l);
    const double e = m_.layerExpertParams(l);
    return (m_.layerParams(l) - e) * std::min(1.0, m_.weight_bytes) + e * std::min(1.0, m_.expertWeightBytes());
  }
  [[nodiscard]] double routedBytes(int l) const {
    return m_.isMoeLayer(l) ? m_.expertParams() * m_.moe.experts * expertBytes() : 0;
  }
  [[nodiscard]] double expertBytes() const { return w8_ ? std::min(1.0, m_.expertWeightBytes()) : m_.expertWeightBytes(); }
  [[nodiscard]] double peak() const { return (fp8_ ? g_.peak8 : g_.peak16).value(); }
  [[nodiscard]] double gemm(double mm, double n, double k) const {
    const double size = mm * n * k;
    const double eff = g_.gemm_efficiency * size / (size + g_.gemm_half_size);
    const double tc = 2 * size / (peak() * eff);
    const double tmem = kAct * (mm * k + k * n + mm * n) / (g_.hbm_bw.value() * g_.hbm_efficiency);
    return std::max(tc, tmem) + g_.kernel_overhead.value();
  }
  [[nodiscard]] double allreduce(double bytes) const { return tp_ > 1 ? ar_alpha_ + ar_beta_ * bytes : 0; }

  const ModelSpec& m_;
  const GpuSpec& g_;
  int tp_;
  int ep_ = 1;
  double a2a_alpha_ = 0, a2a_beta_ = 0;
  double paged_ = 0;
  bool fp8_, w8_;
  double kv_bytes_;
  double ar_alpha_, ar_beta_;
  Compute compute_;  // per-operator costs (prefill)
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::min<double>(static_cast<double>(v.size() - 1), std::floor(q * static_cast<double>(v.size()))));
  return v[i];
}

Latency latency(const std::vector<double>& v) {
  Latency l;
  if (v.empty()) return l;
  double sum = 0;
  for (double x : v) sum += x;
  l.mean = sum / static_cast<double>(v.size());
  l.p50 = percentile(v, 0.50), l.p90 = percentile(v, 0.90), l.p99 = percentile(v, 0.99);
  return l;
}

// Squared length capped by a window w (see Replica::prefill).
double sqWin(double n, double w) { return w <= 0 || n <= w ? n * n : 2 * n * w - w * w; }

// Continuous batching on one replica.  `prefill_here`: the replica prefills
// (aggregated); otherwise requests arrive prefilled at r.ready (decode pool).
// `decode_here`: the replica decodes after prefilling (aggregated); a prefill
// pool replica only prefills.  Arrivals come from a queue ordered by time;
// `on_done(r)` may add a request to it (closed loop: the user's next one).
// `itl` collects every gap between two tokens of a request.
struct Engine {
  const Replica& rep;
  const InferConfig& cfg;
  double kv_capacity;  // bytes per GPU
  bool prefill_here, decode_here;
  std::function<void(Request*)> on_done;
  std::vector<double>* itl = nullptr;
  int64_t max_running = 0;
  // --kv-alloc paged (aggregated replicas): KV allocated as a request's
  // context grows, not reserved whole at admission; when a step's growth
  // does not fit, the newest decoding requests are preempted (vLLM's
  // recompute preemption: their cache freed, back to the front of the queue,
  // prompt and generated tokens prefilled again on return).
  bool paged = false;
  int64_t preemptions = 0;
  std::vector<ServeStep>* steps = nullptr;  // --trace
  int replica = 0;
  void log(double start, double end, int64_t decodes, int64_t prefill, int64_t pending = 0) const {
    if (steps && steps->size() < kMaxSteps) steps->push_back({replica, start, end - start, decodes, prefill, pending});
  }
  static constexpr size_t kMaxSteps = 2000000;
  // Speculative decoding: the drafter's replica (nullptr: none), K and the acceptance rate.
  const Replica* drafter = nullptr;
  int spec_k = 0;
  double spec_a = 0;
  std::mt19937_64 spec_rng{1};
  // Tokens a request gains in one verification step: 1 + the accepted run.
  int64_t produced() {
    if (spec_k == 0) return 1;
    std::bernoulli_distribution accept(spec_a);
    int64_t n = 1;
    for (int i = 0; i < spec_k && accept(spec_rng); ++i) ++n;
    return n;
  }
  // A decode (or mixed) step of the target, with the drafter's K steps before it.
  // `firsts`: prompts that finish in the step and sample their first token.
  // Every step also pays the engine's host time per step (--step-overhead).
  [[nodiscard]] double decodeCost(double batch, double context, double context_win, double chunk, double pairs,
                                  double pairs_win, double keys = 0, double keys_win = 0, double firsts = 0) const {
    if (spec_k == 0 || batch == 0)
      return rep.mixed(batch, context, context_win, chunk, pairs, pairs_win, keys, keys_win) +
             rep.sample(batch + firsts) + cfg.step_overhead_s;
    return rep.mixed(batch, context, context_win, chunk, pairs, pairs_win, keys, keys_win, spec_k + 1) +
           spec_k * (drafter->decode(batch, context, context_win) + drafter->sample(batch)) +
           rep.sample(batch * (spec_k + 1) + firsts) + cfg.step_overhead_s;
  }
  // --prefix-hit: the prompt tokens found in the prefix cache (at least one is prefilled).
  [[nodiscard]] int64_t cached(const Request* r) const {
    if (cfg.prefix_hit <= 0) return 0;
    return std::min<int64_t>(r->in - 1, static_cast<int64_t>(std::floor(cfg.prefix_hit * static_cast<double>(r->in))));
  }

  using Arrival = std::pair<double, Request*>;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals;
  // A prefilling replica sees a request --request-overhead after it arrives.
  void add(Request* r) { arrivals.push({prefill_here ? r->arrival + cfg.request_overhead_s : r->ready, r}); }

  void token(Request* r, double now) {
    if (itl && r->last_token >= 0) itl->push_back(now - r->last_token);
    r->last_token = now;
  }
  void finish(Request* r, double now) {
    r->done = now;
    if (on_done) on_done(r);
  }

  // The run's state.
  struct Running {
    Request* r;
    int64_t made;  // tokens generated (decode) or prompt tokens done (prefilling)
  };
  std::deque<Request*> waiting;
  std::vector<Running> running;    // decoding
  std::deque<Running> prefilling;  // chunked prefill in progress
  // kv_res: the cache this replica has given out.  Reserved (TensorRT-LLM's
  // GUARANTEED_NO_EVICT, the default): the whole (input + output) cache of
  // every admitted request, at admission, so it never outgrows the memory.
  // Paged: the prompt's at admission, then each token's as it is made.
  double now = 0, context = 0, context_win = 0, kv_now = 0, kv_res = 0;
  int64_t admitted = 0;

  [[nodiscard]] double full(const Request* r) const { return rep.kvBytesOf(static_cast<double>(r->in + r->out)); }
  static int64_t prompt(const Request* r) { return r->in + r->resume; }  // tokens its prefill processes
  [[nodiscard]] double need(const Request* r) const {
    return paged ? rep.kvBytesOf(static_cast<double>(prompt(r) + 1)) : full(r);
  }
  [[nodiscard]] bool admitKv(const Request* r) const { return kv_res + need(r) <= kv_capacity; }
  // What admission gives a request: its whole cache (reserved) or its prompt's (paged).
  [[nodiscard]] double given(const Request* r) const {
    return paged ? rep.kvBytesOf(static_cast<double>(prompt(r))) : full(r);
  }
  void admit(Request* r) {
    kv_res += given(r);
    r->order = admitted++;
  }
  [[nodiscard]] int64_t slots() const { return static_cast<int64_t>(running.size() + prefilling.size()); }

  // r has its next token: its first, or the one after a recomputed prefill.
  void startDecode(Request* r) {
    const int64_t made = r->resume + 1;
    if (!decode_here || made >= r->out) {
      if (decode_here) kv_res -= given(r), finish(r, r->resume > 0 ? now : r->first);
      return;
    }
    running.push_back({r, made});
    const double n = static_cast<double>(r->in + made);
    context += n, context_win += rep.capped(n), kv_now += rep.kvBytesOf(n);
    if (paged) kv_res += rep.kvBytesOf(n) - rep.kvBytesOf(static_cast<double>(prompt(r)));
  }

  // Paged: frees the newest decoding requests until this step's growth (up
  // to 1 + K tokens each) fits; true when it preempted (the step then admits
  // nobody, as vLLM's scheduler does).  At least one request keeps running.
  bool makeRoom() {
    if (!paged) return false;
    const int64_t step = 1 + spec_k;
    auto growth = [&] {
      double g = 0;
      for (const Running& x : running) {
        const double n = static_cast<double>(x.r->in + x.made);
        g += rep.kvBytesOf(n + static_cast<double>(std::min(step, x.r->out - x.made))) - rep.kvBytesOf(n);
      }
      return g;
    };
    bool any = false;
    while (running.size() > 1 && kv_res + growth() > kv_capacity) {
      size_t v = 0;
      for (size_t i = 1; i < running.size(); ++i)
        if (running[i].r->order > running[v].r->order) v = i;
      Request* r = running[v].r;
      const double n = static_cast<double>(r->in + running[v].made), held = rep.kvBytesOf(n);
      context -= n, context_win -= rep.capped(n), kv_now -= held, kv_res -= held;
      r->resume = running[v].made;
      running[v] = running.back(), running.pop_back();
      waiting.push_front(r);
      ++preemptions;
      any = true;
    }
    return any;
  }

  // Chunked prefill (vLLM V1): one step is every decoding request's next
  // token, then prompt chunks (in-progress ones first) within the token budget.
  void chunkedStep() {
    // The budget counts the decodes that run in the step: those left after any preemption.
    const bool preempted = makeRoom();
    double budget = static_cast<double>(cfg.prefill_tokens) - static_cast<double>(running.size());
    while (!preempted && !waiting.empty() && slots() < cfg.max_batch && admitKv(waiting.front())) {
      prefilling.push_back({waiting.front(), cached(waiting.front())});
      admit(waiting.front());
      waiting.pop_front();
    }
    double chunk = 0, pairs = 0, pairs_win = 0, keyed = 0, keyed_win = 0;  // keyed: sum of pairs x key length
    std::vector<std::pair<size_t, int64_t>> parts;  // prefilling index, tokens this step
    for (size_t i = 0; i < prefilling.size() && budget >= 1; ++i) {
      const int64_t left = prompt(prefilling[i].r) - prefilling[i].made;
      const int64_t take = std::min<int64_t>(left, static_cast<int64_t>(budget));
      const double a = static_cast<double>(prefilling[i].made), b = a + static_cast<double>(take);
      chunk += static_cast<double>(take);
      pairs += (b * b - a * a) / 2;  // causal pairs of positions [a, b)
      const double w = static_cast<double>(m_window());
      pairs_win += (sqWin(b, w) - sqWin(a, w)) / 2;
      // The chunk's queries see keys [0, b) (a window: at most w of them).
      keyed += (b * b - a * a) / 2 * b;
      keyed_win += (sqWin(b, w) - sqWin(a, w)) / 2 * (w > 0 ? std::min(b, w) : b);
      budget -= static_cast<double>(take);
      parts.push_back({i, take});
    }
    if (running.empty() && chunk == 0) {
      if (!arrivals.empty()) now = std::max(now, arrivals.top().first);
      return;
    }
    max_running = std::max<int64_t>(max_running, static_cast<int64_t>(running.size()));
    const double t0 = now;
    double firsts = 0;  // prompts completed in this step: each samples its first token
    for (auto [i, take] : parts) firsts += prefilling[i].made + take >= prompt(prefilling[i].r) ? 1 : 0;
    now += decodeCost(static_cast<double>(running.size()), context, context_win, chunk, pairs, pairs_win,
                      pairs > 0 ? keyed / pairs : 0, pairs_win > 0 ? keyed_win / pairs_win : 0, firsts);
    const auto decodes = static_cast<int64_t>(running.size());
    advanceDecode(running, now, context, context_win, kv_now, kv_res);
    std::vector<Request*> started;
    for (auto [i, take] : parts) {
      prefilling[i].made += take;
      if (prefilling[i].made >= prompt(prefilling[i].r)) started.push_back(prefilling[i].r);
    }
    int64_t pending = 0;
    for (const Running& p : prefilling) pending += prompt(p.r) - p.made;
    log(t0, now, decodes, static_cast<int64_t>(chunk), pending);
    prefilling.erase(std::remove_if(prefilling.begin(), prefilling.end(),
                                    [&](const Running& p) { return p.made >= prompt(p.r); }),
                     prefilling.end());
    for (Request* r : started) {
      if (r->first < 0) r->first = now;
      token(r, now);
      startDecode(r);
    }
  }

  // A prefill batch up to the token budget (at least one request); true when it ran one.
  bool prefillBatch() {
    // tok: the tokens prefilled (a prompt's uncached suffix [c, n)); sq, sq_w:
    // 2 x the causal pairs they attend; keyed: the same weighted by their key length n.
    double tok = 0, sq = 0, sq_w = 0, keyed = 0, keyed_w = 0;
    std::vector<Request*> batch;
    while (!waiting.empty() &&
           (batch.empty() || tok + static_cast<double>(prompt(waiting.front()) - cached(waiting.front())) <=
                                 static_cast<double>(cfg.prefill_tokens)) &&
           (!decode_here || static_cast<int64_t>(running.size() + batch.size()) < cfg.max_batch) &&
           (!decode_here || admitKv(waiting.front()))) {
      Request* r = waiting.front();
      waiting.pop_front();
      const double n = static_cast<double>(prompt(r)), c = static_cast<double>(cached(r));
      const double w = static_cast<double>(m_window());
      const double p2 = n * n - c * c, p2w = sqWin(n, w) - sqWin(c, w);
      tok += n - c, sq += p2, sq_w += p2w;
      keyed += p2 * n, keyed_w += p2w * (w > 0 ? std::min(n, w) : n);
      if (decode_here) admit(r);
      batch.push_back(r);
    }
    if (batch.empty()) return false;
    const double t0 = now;
    now += rep.prefill(tok, sq, sq_w, sq > 0 ? keyed / sq : 0, sq_w > 0 ? keyed_w / sq_w : 0) +
           rep.sample(static_cast<double>(batch.size())) + cfg.step_overhead_s;
    log(t0, now, 0, static_cast<int64_t>(tok));
    for (Request* r : batch) {
      if (r->first < 0) r->first = now;
      token(r, now);
      startDecode(r);
    }
    return true;
  }

  // Decode pool: admit arrived (prefilled) requests while KV fits.
  void admitPrefilled() {
    while (!waiting.empty() && static_cast<int64_t>(running.size()) < cfg.max_batch && admitKv(waiting.front())) {
      Request* r = waiting.front();
      waiting.pop_front();
      admit(r);
      r->last_token = r->first;
      startDecode(r);
    }
  }

  void decodeStep() {
    max_running = std::max<int64_t>(max_running, static_cast<int64_t>(running.size()));
    const double t0 = now;
    now += decodeCost(static_cast<double>(running.size()), context, context_win, 0, 0, 0);
    log(t0, now, static_cast<int64_t>(running.size()), 0);
    advanceDecode(running, now, context, context_win, kv_now, kv_res);
  }

  // Until every request is done: arrivals join the queue; each step is a
  // chunked-prefill step, or a prefill batch, or a decode step of the running
  // requests (after admitting what fits).
  void run() {
    while (!arrivals.empty() || !waiting.empty() || !running.empty() || !prefilling.empty()) {
      while (!arrivals.empty() && arrivals.top().first <= now) waiting.push_back(arrivals.top().second), arrivals.pop();
      if (waiting.empty() && running.empty() && prefilling.empty()) {
        now = arrivals.top().first;
        continue;
      }
      if (prefill_here && cfg.chunked_prefill && decode_here) {
        chunkedStep();
        continue;
      }
      const bool preempted = prefill_here && decode_here && makeRoom();
      if (!preempted && !waiting.empty() && (!decode_here || static_cast<int64_t>(running.size()) < cfg.max_batch)) {
        if (prefill_here) {
          if (prefillBatch()) continue;
        } else {
          admitPrefilled();
        }
      }
      if (running.empty()) {
        if (!waiting.empty() && !prefill_here) continue;
        if (!arrivals.empty() && waiting.empty()) now = std::max(now, arrivals.top().first);
        continue;
      }
      decodeStep();
    }
  }

  template <typename R>
  void advanceDecode(std::vector<R>& running, double now, double& context, double& context_win, double& kv_now,
                     double& kv_res) {
    for (size_t i = 0; i < running.size();) {
      Request* r = running[i].r;
      // One chunk of tokens streams out per step (benchmark_serving's ITL is per chunk).
      const int64_t gain = std::min(produced(), r->out - running[i].made);
      token(r, now);
      for (int64_t k = 0; k < gain; ++k) {
        const double n = static_cast<double>(r->in + running[i].made);
        ++running[i].made;
        context += 1;
        context_win += rep.capped(n + 1) - rep.capped(n);
        const double grown = rep.kvBytesOf(n + 1) - rep.kvBytesOf(n);
        kv_now += grown;
        if (paged) kv_res += grown;
      }
      if (running[i].made >= r->out) {
        const double n = static_cast<double>(r->in + running[i].made);
        context -= n, context_win -= rep.capped(n), kv_now -= rep.kvBytesOf(n);
        kv_res -= rep.kvBytesOf(static_cast<double>(r->in + r->out));
        running[i] = running.back(), running.pop_back();
        finish(r, now);
      } else {
        ++i;
      }
    }
  }
  int64_t window = 0;
  [[nodiscard]] int64_t m_window() const { return window; }
};

ServeStats summarise(const std::vector<Request>& reqs, const InferConfig& cfg, std::vector<double> itl) {
  ServeStats s;
  std::vector<double> ttft, tpot, e2e;
  double first_arrival = 1e300, last_done = 0, tokens = 0, in_tokens = 0, kv = 0, per_user = 0;
  int64_t good = 0, streams = 0;
  for (const Request& r : reqs) {
    first_arrival = std::min(first_arrival, r.arrival);
    last_done = std::max(last_done, r.done);
    const double a = r.first - r.arrival;
    const double b = r.out > 1 ? (r.done - r.first) / static_cast<double>(r.out - 1) : 0;
    const double e = r.done - r.arrival;
    ttft.push_back(a);
    tpot.push_back(b);
    e2e.push_back(e);
    if (r.out > 1 && r.done > r.first) per_user += static_cast<double>(r.out - 1) / (r.done - r.first), ++streams;
    tokens += static_cast<double>(r.out);
    in_tokens += static_cast<double>(r.in);
    kv += r.kv_s;
    if (a <= cfg.ttft_slo_s && b <= cfg.tpot_slo_s && (cfg.e2e_slo_s <= 0 || e <= cfg.e2e_slo_s)) ++good;
  }
  const double span = std::max(1e-12, last_done - first_arrival);
  s.ttft = latency(ttft), s.tpot = latency(tpot), s.e2e = latency(e2e), s.itl = latency(itl);
  s.ttft_p50_s = s.ttft.p50, s.ttft_p90_s = s.ttft.p90, s.ttft_p99_s = s.ttft.p99;
  s.tpot_p50_s = s.tpot.p50, s.tpot_p90_s = s.tpot.p90, s.tpot_p99_s = s.tpot.p99;
  s.duration_s = span;
  s.throughput_rps = static_cast<double>(reqs.size()) / span;
  s.tokens_per_s = tokens / span;
  s.total_tokens_per_s = (tokens + in_tokens) / span;
  s.per_user_tokens_per_s = streams > 0 ? per_user / static_cast<double>(streams) : 0;
  s.slo_attainment = reqs.empty() ? 0 : static_cast<double>(good) / static_cast<double>(reqs.size());
  s.goodput_rps = static_cast<double>(good) / span;
  s.kv_transfer_mean_s = reqs.empty() ? 0 : kv / static_cast<double>(reqs.size());
  // Requests in the system (arrived, not finished) when the middle and the
  // last request arrive: a stable queue holds about as many at both; an
  // unstable one grows linearly, about twice as many at the end.  Growing:
  // more than a quarter more, and more than Poisson noise (3 sqrt(n)) and 2.
  if (cfg.load() == LoadMode::OpenLoop && !reqs.empty()) {
    std::vector<double> arr, done;
    for (const Request& r : reqs) arr.push_back(r.arrival), done.push_back(r.done);
    std::sort(arr.begin(), arr.end());
    std::sort(done.begin(), done.end());
    auto inSystem = [&](double t) {
      const auto a = std::upper_bound(arr.begin(), arr.end(), t) - arr.begin();
      const auto d = std::upper_bound(done.begin(), done.end(), t) - done.begin();
      return static_cast<int64_t>(a - d);
    };
    s.backlog_mid = inSystem(arr[arr.size() / 2]);
    s.backlog_end = inSystem(arr.back());
    const double end = static_cast<double>(s.backlog_end), growth = end - static_cast<double>(s.backlog_mid);
    s.queue_growing = growth > std::max({0.25 * end, 3 * std::sqrt(end), 2.0});
    s.offered_rps = cfg.rate;
    s.overloaded = s.queue_growing;
  }
  return s;
}

}  // namespace

Result<LengthDist> parseLengthDist(std::string_view text) {
  if (text == "fixed") return LengthDist::Fixed;
  if (text == "uniform") return LengthDist::Uniform;
  if (text == "exponential") return LengthDist::Exponential;
  return invalidArgument("--lengths '{}' is not one of fixed, uniform, exponential", text);
}

Status checkInferConfig(const InferConfig& cfg) {
  constexpr int64_t kTokens = int64_t{1} << 30;
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--gpus", cfg.gpus, 1, int64_t{1} << 24, "GPUs of the service"));
  CHORUS_RETURN_IF_ERROR(checkRange<int>("--tp", cfg.tp, 0, 1 << 20, "GPUs per replica; 0 = the smallest that fits"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--rate", cfg.rate, 1e-9, 1e9, "requests per second, positive"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--concurrency", cfg.concurrency, 0, 1 << 24,
                                             "users in a closed loop, at least 1; absent = open loop at --rate"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--requests", cfg.requests, 1, 10000000, "requests simulated"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--input", cfg.input_len, 1, kTokens, "prompt tokens per request"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--output", cfg.output_len, 1, kTokens, "output tokens per request"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--ttft-slo", cfg.ttft_slo_s, 1e-9, 1e9, "seconds, positive"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--tpot-slo", cfg.tpot_slo_s, 1e-9, 1e9, "seconds, positive"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--e2e-slo", cfg.e2e_slo_s, 0, 1e9, "seconds; 0 = none"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--prefix-hit", cfg.prefix_hit, 0, 1,
                                            "fraction of each prompt found in the prefix cache"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--step-overhead", cfg.step_overhead_s, 0, 10, "seconds of host time per engine step"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--request-overhead", cfg.request_overhead_s, 0, 1e3,
                                            "seconds per request before its prefill"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--paged-overhead", cfg.paged_overhead, 0, 10,
                                            "paged decode attention's extra time, a fraction of the cache read"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--max-batch", cfg.max_batch, 1, 1 << 24, "running requests per replica"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--prefill-tokens", cfg.prefill_tokens, 1, kTokens, "tokens per prefill batch"));
  CHORUS_RETURN_IF_ERROR(checkRange<int>("--decode-tp", cfg.decode_tp, 0, 1 << 20, "GPUs per decode replica; 0 = --tp"));
  CHORUS_RETURN_IF_ERROR(checkRange<int>("--ep", cfg.ep, 0, 1 << 20, "GPUs the experts are spread over; 0 = none"));
  CHORUS_RETURN_IF_ERROR(checkRange<int>("--decode-ep", cfg.decode_ep, 0, 1 << 20, "GPUs per decode replica's experts; 0 = --ep"));
  if (cfg.decode_ep > 0 && cfg.ep <= 1)
    return invalidArgument("--decode-ep {} needs --ep (expert-parallel replicas; the decode pool's expert group)", cfg.decode_ep);
  CHORUS_RETURN_IF_ERROR(checkRange<int>("--spec-tokens", cfg.spec_tokens, 0, 16, "drafted tokens per step; 0 = none"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--spec-acceptance", cfg.spec_acceptance, 0, 1,
                                            "probability that a drafted token is accepted"));
  if (cfg.spec_tokens > 0 && cfg.spec_acceptance == 0)
    return invalidArgument("--spec-tokens {} needs --spec-acceptance (the probability a drafted token is accepted, in (0, 1])",
                           cfg.spec_tokens);
  if (cfg.max_throughput && cfg.concurrency > 0)
    return invalidArgument("--max-throughput and --concurrency {} are different load modes: give one", cfg.concurrency);
  return checkRange<int>("--prefill-replicas", cfg.prefill_replicas, 0, 1 << 24, "disaggregated split; 0 = try all");
}

namespace {

// One inference service on one cluster, simulated in phases (run() calls them
// in order): the drafter, the replica size, the replicas' phase costs, the
// request stream, the aggregated run and every disaggregated split.
class Service {
 public:
  Service(const ModelSpec& model, const InferConfig& config, NetworkModel& network)
      : m(model), cfg(config), net(network), c(network.cluster()), ep(config.ep > 1 ? config.ep : 1), load(config.load()) {}
  Result<InferReport> run();

 private:
  Status pickDrafter();
  Status sizeReplica();
  Status priceReplicas();
  Status makeRequests();
  void runAggregated();
  void runAggregatedClosedLoop(std::vector<Request>& reqs, std::vector<double>& itl, int64_t* max_running,
                               int64_t* preemptions);
  Status prepareDecodePool();
  Status runSplit(int p_reps);
  Status measureCapacity();
  void chooseBest();

  double kvCapacityBytes(int tp_, int experts_over = 0) const;
  double requestKv(int tp_, int64_t n) const;
  Result<std::pair<double, double>> fit(plan::Collective k, int n);
  Result<std::pair<double, double>> kvCost(int p_reps);
  double transferBytes(double n) const;
  Engine engine(bool prefill_here, bool decode_here);

  const ModelSpec& m;
  const InferConfig& cfg;
  NetworkModel& net;
  const ClusterSpec& c;
  const int ep;
  const LoadMode load;
  InferReport rep;
  ModelSpec mtp;                     // the model's own MTP module as a drafter
  const ModelSpec* draft = nullptr;  // the drafter's model, if speculative decoding
  int tp = 0;
  double groups = 1;  // attention groups per replica
  double alpha = 0, beta = 0;  // the tensor-parallel allreduce as alpha + beta x bytes
  std::optional<Replica> replica, drafter, decoder;
  std::vector<Request> base;  // the request stream
  uint64_t engines = 0;
  // Disaggregated: the decode pool's layout.
  int dtp = 0, dep = 1, p_width = 0, d_width = 0;
  double d_groups = 1, d_capacity = 0;
};

Result<InferReport> Service::run() {
  CHORUS_RETURN_IF_ERROR(checkInferConfig(cfg));
  if (cfg.gpus > c.gpus())
    return invalidArgument("infer: --gpus {} is outside [1, {}] for cluster '{}'", cfg.gpus, c.gpus(), c.name);
  CHORUS_RETURN_IF_ERROR(checkAttentionKernel(c.gpu, cfg.attention_kernel));
  rep.config = cfg;
  CHORUS_RETURN_IF_ERROR(pickDrafter());
  CHORUS_RETURN_IF_ERROR(sizeReplica());
  CHORUS_RETURN_IF_ERROR(priceReplicas());
  CHORUS_RETURN_IF_ERROR(makeRequests());
  if (cfg.aggregated) runAggregated();
  CHORUS_RETURN_IF_ERROR(prepareDecodePool());
  // (A drafter beside expert-parallel pools is not priced disaggregated: its
  // experts' all-to-all would be the prefill pool's; those runs report the
  // aggregated mode only.)
  const bool disagg = cfg.disaggregated && load != LoadMode::ClosedLoop && !(ep > 1 && drafter);
  for (int p_reps = 1; static_cast<int64_t>(p_reps) * p_width < cfg.gpus && disagg; ++p_reps) {
    if (cfg.prefill_replicas > 0 && p_reps != cfg.prefill_replicas) continue;
    CHORUS_RETURN_IF_ERROR(runSplit(p_reps));
  }
  rankSplits(rep.splits);
  if (!rep.splits.empty()) rep.best_disaggregated = rep.splits.front();
  CHORUS_RETURN_IF_ERROR(measureCapacity());
  chooseBest();
  return std::move(rep);
}

// Open loop: each mode's capacity is its completion rate with the same
// requests all queued at once (offline), the most it can serve; an offered
// rate above it cannot be sustained, whatever --requests says.
Status Service::measureCapacity() {
  if (load != LoadMode::OpenLoop || !cfg.capacity) return {};
  InferConfig off = cfg;
  off.max_throughput = true, off.capacity = false, off.record = false;
  CHORUS_ASSIGN_OR_RETURN(InferReport o, simulateInference(m, off, net));
  auto mark = [](ServeStats& s, double capacity) {
    s.capacity_rps = capacity;
    s.overloaded = s.queue_growing || s.offered_rps > capacity;
  };
  if (cfg.aggregated) mark(rep.aggregated, o.aggregated.throughput_rps);
  for (ServeStats& s : rep.splits)
    for (const ServeStats& q : o.splits)
      if (q.prefill_replicas == s.prefill_replicas) mark(s, q.throughput_rps);
  if (!rep.splits.empty()) rep.best_disaggregated = rep.splits.front();
  return {};
}

// The drafter for speculative decoding: a draft model, or the model's own
// MTP module (one transformer layer like its last, sharing the embedding and
// head; its 2h x h input projection is left out) applied K times.
Status Service::pickDrafter() {
  if (cfg.spec_tokens == 0) return {};
  if (cfg.draft_model) {
    draft = cfg.draft_model.get();
    return {};
  }
  if (m.mtp_layers == 0)
    return invalidArgument("infer: --spec-tokens {} without --draft-model needs multi-token-prediction modules, and "
                           "model '{}' has none (num_nextn_predict_layers / mtp_layers)", cfg.spec_tokens, m.name);
  mtp = m;
  mtp.layers = m.mtp_layers;
  mtp.moe.dense_layers = 0;
  mtp.moe.dense_list.clear();
  mtp.moe.sparse_step = 1;
  mtp.window_layers.clear();
  mtp.window = 0;
  mtp.mtp_layers = 0;
  mtp.name = m.name + " MTP";
  draft = &mtp;
  return {};
}

// What is left for the target's KV cache on one GPU: 90 % of HBM (the rest:
// activations, allocator slack) minus the weights; with a drafter, minus its
// weights (MTP: only its own layer), the rest shared with the drafter's
// cache in proportion to their bytes per token.
double Service::kvCapacityBytes(int tp_, int experts_over) const {
  const double reserve = 0.9;
  const int e = experts_over > 0 ? experts_over : ep;
  Replica r(m, c, tp_, cfg.fp8, cfg.kv_fp8, Seconds(0), 0);
  r.setExpertParallel(e, 0, 0);
  double left = c.gpu.hbm.value() * reserve - r.weightBytesPerGpu();
  if (draft) {
    Replica d(*draft, c, tp_, cfg.fp8, cfg.kv_fp8, Seconds(0), 0);
    if (draft == &mtp) d.setExpertParallel(e, 0, 0);  // the MTP layer's experts are spread as the model's
    double dw = d.weightBytesPerGpu();
    if (draft == &mtp) dw -= static_cast<double>(m.vocab) * static_cast<double>(m.hidden) * (m.tie_embeddings ? 1 : 2) * kAct / tp_;
    left = (left - dw) * r.kvBytesPerToken() / (r.kvBytesPerToken() + d.kvBytesPerToken());
  }
  return left;
}

double Service::requestKv(int tp_, int64_t n) const {
  const Replica r(m, c, tp_, cfg.fp8, cfg.kv_fp8, Seconds(0), 0);
  return r.kvBytesOf(static_cast<double>(n));
}

// Replica size: the smallest power of two (inside one node) whose weights
// leave room for KV cache, unless given; with --ep, replicas of ep GPUs with
// attention over tp of them (1: data-parallel attention).
Status Service::sizeReplica() {
  tp = cfg.tp;
  if (ep > 1) {
    if (tp == 0) tp = 1;
    if (m.moe.experts == 0 || m.moe.experts % ep != 0)
      return invalidArgument("infer: --ep {} must divide the model's experts ({})", ep, m.moe.experts);
    if (ep % tp != 0 || cfg.gpus % ep != 0)
      return invalidArgument("infer: --ep {} must be a multiple of --tp {} and divide --gpus {}", ep, tp, cfg.gpus);
    if (cfg.spec_tokens > 0 && cfg.draft_model)
      return invalidArgument("infer: --ep {} with a --draft-model: a separate draft model beside expert-parallel "
                             "replicas is not modelled (the model's own MTP module is: omit --draft-model)", ep);
  }
  if (tp == 0) {
    for (int t = 1; t <= c.node.gpus; t *= 2)
      if (kvCapacityBytes(t) >= 4 * requestKv(t, cfg.input_len + cfg.output_len)) {
        tp = t;
        break;
      }
    if (tp == 0)
      return invalidArgument("infer: model '{}' ({:.0f} GB of weights) does not fit a {}-GPU node of '{}' with "
                             "room for KV cache; use a larger --tp across nodes or a bigger GPU",
                             m.name, Replica(m, c, 1, cfg.fp8, cfg.kv_fp8, Seconds(0), 0).weightBytesPerGpu() / 1e9,
                             c.node.gpus, c.name);
  }
  if (tp < 1 || cfg.gpus % tp != 0 || m.heads % tp != 0)
    return invalidArgument("infer: --tp {} must divide --gpus {} and the model's {} heads", tp, cfg.gpus, m.heads);
  if (kvCapacityBytes(tp) <= 0)
    return invalidArgument("infer: with tp={} the weights of '{}' ({:.1f} GB per GPU) exceed 90% of {}'s {:.0f} GiB HBM; "
                           "use a larger --tp or --fp8", tp, m.name,
                           Replica(m, c, tp, cfg.fp8, cfg.kv_fp8, Seconds(0), 0).weightBytesPerGpu() / 1e9, c.gpu.name,
                           toGib(c.gpu.hbm));
  rep.tp = tp;
  rep.ep = ep;
  rep.replicas = static_cast<int>(cfg.gpus / std::max(tp, ep));
  groups = static_cast<double>(ep > 1 ? ep / tp : 1);
  Replica r(m, c, tp, cfg.fp8, cfg.kv_fp8, Seconds(0), 0);
  r.setExpertParallel(ep, 0, 0);
  rep.weight_bytes_per_gpu = r.weightBytesPerGpu();
  rep.kv_capacity_bytes = kvCapacityBytes(tp);
  rep.kv_capacity_tokens = rep.kv_capacity_bytes * groups / r.kvBytesPerToken();
  return {};
}

// A collective over `n` GPUs of one replica as alpha + beta x bytes, from the
// plans' times at 1 KiB and 64 MiB.
Result<std::pair<double, double>> Service::fit(plan::Collective k, int n) {
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost small, net.collective(k, Bytes(1024), GroupSet{n, 1, 1}, ""));
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost big, net.collective(k, Bytes(64 << 20), GroupSet{n, 1, 1}, ""));
  const double b = (big.time - small.time).value() / ((64 << 20) - 1024);
  return std::pair<double, double>{small.time.value() - b * 1024, b};
}

// The replica's phase costs with its collectives (the tensor-parallel
// allreduce on the first replica's GPUs; with --ep the dispatch / combine
// all-to-all over its ep GPUs), the drafter's, and the figures at the mean length.
Status Service::priceReplicas() {
  if (tp > 1) {
    CHORUS_ASSIGN_OR_RETURN(auto ab, fit(plan::Collective::AllReduce, tp));
    alpha = ab.first, beta = ab.second;
  }
  replica.emplace(m, c, tp, cfg.fp8, cfg.kv_fp8, Seconds(alpha), beta, cfg.attention_kernel);
  if (cfg.kv_paged) replica->setPagedAttention(cfg.paged_overhead);
  if (ep > 1) {
    CHORUS_ASSIGN_OR_RETURN(auto ab, fit(plan::Collective::AllToAll, ep));
    replica->setExpertParallel(ep, ab.first, ab.second);
    rep.a2a_latency_s = ab.first;
  }
  if (draft) {
    if (draft->heads % tp != 0)
      return invalidArgument("infer: the draft model '{}' has {} heads, not divisible by --tp {}", draft->name, draft->heads, tp);
    drafter.emplace(*draft, c, tp, cfg.fp8, cfg.kv_fp8, Seconds(alpha), beta, cfg.attention_kernel);
    // The MTP module's layer is an MoE layer like the model's: under --ep its
    // experts are spread over the same GPUs and every drafted step pays the
    // same dispatch and combine.
    if (ep > 1 && draft == &mtp) drafter->setExpertParallel(ep, replica->a2aAlpha(), replica->a2aBeta());
    const double a = cfg.spec_acceptance, K = cfg.spec_tokens;
    rep.expected_tokens_per_step = a >= 1 ? K + 1 : (1 - std::pow(a, K + 1)) / (1 - a);
  }
  const double in = static_cast<double>(cfg.input_len), w = static_cast<double>(m.window);
  rep.prefill_s_per_request = replica->prefill(in, in * in, sqWin(in, w));
  rep.decode_step_s = replica->decode(1, in, replica->capped(in));
  rep.sample_s = replica->sample(1);
  if (drafter) rep.draft_step_s = cfg.spec_tokens * drafter->decode(1, in, drafter->capped(in));
  // KV bytes of one request's prompt (all of its replica's GPUs).
  rep.kv_bytes_per_request = replica->kvBytesOf(in) * m.kvCacheSplit(tp);
  return {};
}

// The request stream: arrivals (open loop: Poisson at --rate; closed loop:
// set when the user's previous request completes) and lengths.
Status Service::makeRequests() {
  std::mt19937_64 rng(cfg.seed);
  std::exponential_distribution<double> gap(cfg.rate);
  auto length = [&](int64_t mean) -> int64_t {
    switch (cfg.dist) {
      case LengthDist::Fixed: return mean;
      case LengthDist::Uniform: return std::max<int64_t>(1, static_cast<int64_t>(std::uniform_real_distribution<double>(0.5, 1.5)(rng) * mean));
      case LengthDist::Exponential: return std::max<int64_t>(1, static_cast<int64_t>(std::exponential_distribution<double>(1.0 / mean)(rng)));
    }
    return mean;
  };
  base.resize(static_cast<size_t>(cfg.requests));
  double t = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    Request& r = base[i];
    if (load == LoadMode::OpenLoop) t += gap(rng);
    r.arrival = t;
    r.in = length(cfg.input_len);
    r.out = length(cfg.output_len);
    if (load == LoadMode::ClosedLoop) r.user = static_cast<int64_t>(i) % cfg.concurrency;
    // A request whose cache cannot fit the replica at all would never run.
    if (replica->kvBytesOf(static_cast<double>(r.in + r.out)) > rep.kv_capacity_bytes)
      return invalidArgument("infer: request {} with {} input + {} output tokens needs {:.2f} GB of KV cache per GPU, but "
                             "a tp={} replica of '{}' has {:.2f} GB left after the weights; use a larger --tp, "
                             "--kv-fp8 or shorter --input/--output", i, r.in, r.out,
                             replica->kvBytesOf(static_cast<double>(r.in + r.out)) / 1e9, tp, m.name,
                             rep.kv_capacity_bytes / 1e9);
  }
  return {};
}

Engine Service::engine(bool prefill_here, bool decode_here) {
  Engine e{*replica, cfg, rep.kv_capacity_bytes * groups, prefill_here, decode_here, {}, nullptr, 0};
  e.window = m.window;
  e.paged = cfg.kv_paged && prefill_here && decode_here;  // a decode pool keeps what it received
  if (drafter) {
    e.drafter = &*drafter, e.spec_k = cfg.spec_tokens, e.spec_a = cfg.spec_acceptance;
    e.spec_rng.seed(cfg.seed * 1000003 + ++engines);
  }
  return e;
}

// Closed loop: user u's requests go to replica u mod R, each sent when the
// previous one completes.
void Service::runAggregatedClosedLoop(std::vector<Request>& reqs, std::vector<double>& itl, int64_t* max_running,
                                      int64_t* preemptions) {
  const size_t R = static_cast<size_t>(rep.replicas);
  std::vector<std::vector<Request*>> per_user(static_cast<size_t>(cfg.concurrency));  // per user, its requests in order
  for (Request& r : reqs) per_user[static_cast<size_t>(r.user)].push_back(&r);
  std::vector<size_t> next(per_user.size(), 0);
  for (size_t rr = 0; rr < R; ++rr) {
    Engine e = engine(true, true);
    e.itl = &itl;
    if (cfg.record) e.steps = &rep.steps, e.replica = static_cast<int>(rr);
    e.on_done = [&](Request* done) {
      const size_t u = static_cast<size_t>(done->user);
      if (next[u] < per_user[u].size()) {
        Request* n = per_user[u][next[u]++];
        n->arrival = done->done;
        e.add(n);
      }
    };
    for (size_t u = rr; u < per_user.size(); u += R)
      if (!per_user[u].empty()) {
        per_user[u][0]->arrival = 0;
        next[u] = 1;
        e.add(per_user[u][0]);
      }
    e.run();
    *max_running = std::max(*max_running, e.max_running);
    *preemptions += e.preemptions;
  }
}

// Aggregated: every replica prefills and decodes.  Open loop and offline:
// requests round-robin; closed loop: runAggregatedClosedLoop.
void Service::runAggregated() {
  std::vector<Request> reqs = base;
  std::vector<double> itl;
  const size_t R = static_cast<size_t>(rep.replicas);
  int64_t max_running = 0, preemptions = 0;
  if (load == LoadMode::ClosedLoop) {
    runAggregatedClosedLoop(reqs, itl, &max_running, &preemptions);
  } else {
    for (size_t rr = 0; rr < R; ++rr) {
      Engine e = engine(true, true);
      e.itl = &itl;
      if (cfg.record) e.steps = &rep.steps, e.replica = static_cast<int>(rr);
      for (size_t i = rr; i < reqs.size(); i += R) e.add(&reqs[i]);
      e.run();
      max_running = std::max(max_running, e.max_running);
      preemptions += e.preemptions;
    }
  }
  if (cfg.record)
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Request& q = reqs[i];
      const int on = static_cast<int>(load == LoadMode::ClosedLoop ? static_cast<size_t>(q.user) % R : i % R);
      rep.requests.push_back({on, q.arrival, q.first, q.done, q.in, q.out});
    }
  rep.aggregated = summarise(reqs, cfg, std::move(itl));
  rep.aggregated.mode = "aggregated";
  rep.aggregated.decode_replicas = rep.replicas;
  rep.aggregated.max_running = max_running;
  rep.aggregated.preemptions = preemptions;
}

// Disaggregated (open loop and offline): P prefill replicas of tp GPUs, D
// decode replicas of decode_tp GPUs on the rest; the KV cache of each
// request moves from its prefill GPUs to its decode GPUs (every shard at
// once, as pairs of GPUs g -> g + P tp).  The slower side sets the time:
// a prefill GPU sends its shard (MLA: the whole latent, to each of the
// decode_tp / tp GPUs that hold one), a decode GPU receives its own.  When
// the two tensor-parallel layouts differ, the decode GPU also rearranges
// what it received into its own heads' cache: a copy, read and written at
// the HBM rate.
// With --ep, prefill replicas are ep GPUs (attention over tp of them) and
// decode replicas decode_ep GPUs (attention over decode_tp), each paying
// its own expert group's dispatch and combine; a request's cache moves from
// its prefill attention group to one decode attention group.
Status Service::prepareDecodePool() {
  dtp = cfg.decode_tp > 0 ? cfg.decode_tp : tp;
  dep = ep > 1 ? (cfg.decode_ep > 0 ? cfg.decode_ep : ep) : 1;
  p_width = std::max(tp, ep), d_width = std::max(dtp, dep);  // GPUs per prefill / decode replica
  d_groups = static_cast<double>(dep > 1 ? dep / dtp : 1);
  if (dep > 1 && (m.moe.experts % dep != 0 || dep % dtp != 0))
    return invalidArgument("infer: --decode-ep {} must divide the model's experts ({}) and be a multiple of the decode "
                           "attention group (--decode-tp {})", dep, m.moe.experts, dtp);
  if (m.heads % dtp != 0)
    return invalidArgument("infer: --decode-tp {} must divide the model's {} heads", dtp, m.heads);
  if ((dtp != tp || dep != ep) && kvCapacityBytes(dtp, dep) <= 0)
    return invalidArgument("infer: --decode-tp {}{}: the weights of '{}' leave no room for KV cache on {}", dtp,
                           dep > 1 ? fmt::format(" --decode-ep {}", dep) : "", m.name, c.gpu.name);
  double d_alpha = alpha, d_beta = beta;
  if (dtp != tp && dtp > 1) {
    CHORUS_ASSIGN_OR_RETURN(auto ab, fit(plan::Collective::AllReduce, dtp));
    d_alpha = ab.first, d_beta = ab.second;
  }
  decoder.emplace(m, c, dtp, cfg.fp8, cfg.kv_fp8, Seconds(d_alpha), d_beta, cfg.attention_kernel);
  if (cfg.kv_paged) decoder->setPagedAttention(cfg.paged_overhead);  // the same paged kernel reads the decode pool's cache
  if (dep > 1) {  // the decode replica's own dispatch / combine over its dep GPUs
    if (dep == ep) {
      decoder->setExpertParallel(dep, replica->a2aAlpha(), replica->a2aBeta());
    } else {
      CHORUS_ASSIGN_OR_RETURN(auto ab, fit(plan::Collective::AllToAll, dep));
      decoder->setExpertParallel(dep, ab.first, ab.second);
    }
  }
  d_capacity = kvCapacityBytes(dtp, dep);
  return {};
}

// The KV transfer of a split with `p_reps` prefill replicas as alpha + beta x bytes.
Result<std::pair<double, double>> Service::kvCost(int p_reps) {
  const int64_t stride = static_cast<int64_t>(p_reps) * p_width;  // prefill GPU g sends to decode GPU g + stride
  if (stride >= cfg.gpus) return std::pair<double, double>{0, 0};
  const GroupSet pairs{2, stride, std::min<int64_t>(std::min(tp, dtp), stride)};
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost s1, net.sendRecv(Bytes(1024), pairs));
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost s2, net.sendRecv(Bytes(64 << 20), pairs));
  const double b = (s2.time - s1.time).value() / ((64 << 20) - 1024);
  return std::pair<double, double>{s1.time.value() - b * 1024, b};
}

// The busier GPU's bytes for a prompt of n tokens.
double Service::transferBytes(double n) const {
  const double sent = replica->kvBytesOf(n) * (m.hasMla() ? std::max(1.0, double(dtp) / tp) : 1.0);
  return std::max(sent, decoder->kvBytesOf(n));
}

// One disaggregated split: `p_reps` prefill replicas, the rest decode replicas.
Status Service::runSplit(int p_reps) {
  const int64_t left = cfg.gpus - static_cast<int64_t>(p_reps) * p_width;
  if (left % d_width != 0) return {};  // the rest must make whole decode replicas
  const size_t D = static_cast<size_t>(left / d_width);
  CHORUS_ASSIGN_OR_RETURN(auto ab, kvCost(p_reps));
  std::vector<Request> reqs = base;
  std::vector<double> itl;
  for (const Request& r : reqs)
    if (decoder->kvBytesOf(static_cast<double>(r.in + r.out)) > d_capacity)
      return invalidArgument("infer: a request of {} + {} tokens does not fit a --decode-tp {} replica's KV cache "
                             "({:.2f} GB per GPU)", r.in, r.out, dtp, d_capacity / 1e9);
  for (int pr = 0; pr < p_reps; ++pr) {
    Engine e = engine(true, false);
    for (size_t i = static_cast<size_t>(pr); i < reqs.size(); i += static_cast<size_t>(p_reps)) e.add(&reqs[i]);
    e.run();
  }
  for (Request& r : reqs) {
    const double n = static_cast<double>(r.in);
    const double convert = dtp != tp ? 2 * decoder->kvBytesOf(n) / (c.gpu.hbm_bw.value() * c.gpu.hbm_efficiency) : 0;
    r.kv_s = ab.first + ab.second * transferBytes(n) + convert;
    r.ready = r.first + r.kv_s;
  }
  std::vector<Request*> order;
  for (Request& r : reqs) order.push_back(&r);
  std::sort(order.begin(), order.end(), [](const Request* a, const Request* b) { return a->ready < b->ready; });
  int64_t max_running = 0;
  for (size_t d = 0; d < D; ++d) {
    Engine e = engine(false, true);
    Engine de{*decoder, cfg, d_capacity * d_groups, false, true, {}, &itl, 0};
    de.window = m.window;
    de.drafter = e.drafter, de.spec_k = e.spec_k, de.spec_a = e.spec_a, de.spec_rng = e.spec_rng;
    for (size_t i = d; i < order.size(); i += D) de.add(order[i]);
    de.run();
    max_running = std::max(max_running, de.max_running);
  }
  ServeStats st = summarise(reqs, cfg, std::move(itl));
  st.mode = "disaggregated";
  st.prefill_replicas = p_reps;
  st.decode_replicas = static_cast<int>(D);
  st.decode_tp = dtp;
  st.decode_ep = dep > 1 ? dep : 0;
  st.max_running = max_running;
  rep.splits.push_back(st);
  return {};
}

// Disaggregation must win by more than 1 % (run-to-run noise of the finite
// request stream) to be called better: it costs a second pool.
void Service::chooseBest() {
  rep.best = "aggregated";
  if (!rep.best_disaggregated.mode.empty() && rep.best_disaggregated.goodput_rps > rep.aggregated.goodput_rps * 1.01)
    rep.best = fmt::format("disaggregated {}:{}", rep.best_disaggregated.prefill_replicas, rep.best_disaggregated.decode_replicas);
}

}  // namespace

Result<InferReport> simulateInference(const ModelSpec& m, const InferConfig& cfg, NetworkModel& net) {
  return Service(m, cfg, net).run();
}

std::string ServeStats::label() const {
  if (mode != "disaggregated") return mode;
  return fmt::format("disaggregated {}:{}{}", prefill_replicas, decode_replicas,
                     decode_ep > 0   ? fmt::format(" (decode ep {}, tp {})", decode_ep, decode_tp)
                     : decode_tp > 0 ? fmt::format(" (decode tp {})", decode_tp)
                                     : "");
}

void rankSplits(std::vector<ServeStats>& splits) {
  std::stable_sort(splits.begin(), splits.end(), [](const ServeStats& a, const ServeStats& b) {
    if (a.goodput_rps != b.goodput_rps) return a.goodput_rps > b.goodput_rps;
    if (a.ttft_p50_s != b.ttft_p50_s) return a.ttft_p50_s < b.ttft_p50_s;
    return a.prefill_replicas < b.prefill_replicas;
  });
}

Result<std::vector<MaxRate>> findMaxRates(const ModelSpec& m, const InferConfig& cfg, NetworkModel& net,
                                          double attainment) {
  if (!(attainment > 0 && attainment <= 1))
    return invalidArgument("--slo-attainment {}: must be in (0, 1] (the fraction of requests meeting every SLO)", attainment);
  if (cfg.load() != LoadMode::OpenLoop)
    return invalidArgument("--max-rate searches open-loop rates: drop --concurrency / --max-throughput");
  // The modes and their capacities: one offline run of every mode.
  InferConfig off = cfg;
  off.max_throughput = true, off.capacity = false, off.record = false;
  CHORUS_ASSIGN_OR_RETURN(InferReport o, simulateInference(m, off, net));
  std::vector<MaxRate> out;
  std::vector<ServeStats> modes;
  if (cfg.aggregated) modes.push_back(o.aggregated);
  std::vector<ServeStats> splits = o.splits;
  std::sort(splits.begin(), splits.end(), [](const ServeStats& a, const ServeStats& b) { return a.prefill_replicas < b.prefill_replicas; });
  for (const ServeStats& s : splits) modes.push_back(s);
  for (const ServeStats& mode : modes) {
    MaxRate r;
    r.mode = mode.label(), r.prefill_replicas = mode.prefill_replicas, r.decode_replicas = mode.decode_replicas;
    r.capacity_rps = mode.throughput_rps;
    InferConfig k = cfg;
    k.capacity = false, k.record = false;
    k.aggregated = mode.mode == "aggregated";
    k.disaggregated = !k.aggregated;
    if (!k.aggregated) k.prefill_replicas = mode.prefill_replicas;
    auto attained = [&](double rate) -> Result<double> {
      k.rate = rate;
      ++r.runs;
      CHORUS_ASSIGN_OR_RETURN(InferReport x, simulateInference(m, k, net));
      return k.aggregated ? x.aggregated.slo_attainment : x.splits.empty() ? 0.0 : x.splits.front().slo_attainment;
    };
    // Bisection on [lo, hi]: lo meets the target (or is 0), hi does not.  A
    // rate above the capacity cannot be sustained however few --requests let
    // the SLOs hold: the capacity caps the answer.
    double lo = 0, hi = r.capacity_rps;
    CHORUS_ASSIGN_OR_RETURN(double top, attained(hi));
    if (top >= attainment) {
      lo = hi, r.attainment_at_max = top, r.capped = true;
    } else {
      while (hi - lo > 0.01 * r.capacity_rps) {
        const double mid = 0.5 * (lo + hi);
        CHORUS_ASSIGN_OR_RETURN(double a, attained(mid));
        if (a >= attainment) lo = mid, r.attainment_at_max = a;
        else hi = mid;
      }
    }
    r.max_rate_rps = lo;
    out.push_back(r);
  }
  return out;
}

Status writeServeTrace(const InferReport& r, std::ostream& out) {
  // Chrome trace: pid = replica, tid 0 = its steps; requests as async spans.
  nlohmann::json ev = nlohmann::json::array();
  std::set<int> replicas;
  for (const ServeStep& s : r.steps) {
    replicas.insert(s.replica);
    const std::string name = s.prefill_tokens > 0 && s.decodes > 0 ? "mixed" : s.prefill_tokens > 0 ? "prefill" : "decode";
    ev.push_back({{"name", name}, {"ph", "X"}, {"pid", s.replica}, {"tid", 0}, {"ts", s.start_s * 1e6},
                  {"dur", s.duration_s * 1e6}, {"args", {{"decodes", s.decodes}, {"prefill_tokens", s.prefill_tokens}, {"prefill_pending", s.prefill_pending}}}});
  }
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const ServeRequest& q = r.requests[i];
    const std::string id = std::to_string(i);
    const nlohmann::json args = {{"input", q.input}, {"output", q.output}};
    ev.push_back({{"name", "until first token"}, {"cat", "request"}, {"ph", "b"}, {"id", id}, {"pid", q.replica},
                  {"tid", 1}, {"ts", q.arrival_s * 1e6}, {"args", args}});
    ev.push_back({{"name", "until first token"}, {"cat", "request"}, {"ph", "e"}, {"id", id}, {"pid", q.replica},
                  {"tid", 1}, {"ts", q.first_s * 1e6}});
    ev.push_back({{"name", "decode"}, {"cat", "request"}, {"ph", "b"}, {"id", id}, {"pid", q.replica}, {"tid", 1},
                  {"ts", q.first_s * 1e6}, {"args", args}});
    ev.push_back({{"name", "decode"}, {"cat", "request"}, {"ph", "e"}, {"id", id}, {"pid", q.replica}, {"tid", 1},
                  {"ts", q.done_s * 1e6}});
  }
  for (int p : replicas) {
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", p}, {"args", {{"name", fmt::format("replica {}", p)}}}});
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", p}, {"tid", 0}, {"args", {{"name", "engine steps"}}}});
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", p}, {"tid", 1}, {"args", {{"name", "requests"}}}});
  }
  out << nlohmann::json{{"traceEvents", ev}, {"displayTimeUnit", "ms"},
                        {"otherData", {{"steps_kept", r.steps.size()}, {"requests", r.requests.size()}}}}
             .dump();
  if (!out) return systemError("--trace: writing failed");
  return {};
}

Status plotServeSweep(const std::vector<std::pair<int64_t, InferReport>>& runs, const std::string& title,
                      const std::string& png) {
  static constexpr const char* kScript = R"PY(
import json, sys
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except Exception as e:
    sys.stderr.write("matplotlib is not available (%s); install python3-matplotlib\n" % e)
    sys.exit(3)
d = json.load(sys.stdin)
p = d["points"]
x = [q["tok_s_gpu"] for q in p]
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
a.plot(x, [q["tok_s_user"] for q in p], "o-", color="#4878a8")
b.plot(x, [q["ttft_p50"] for q in p], "o-", color="#4878a8", label="TTFT p50")
b.plot(x, [q["ttft_p99"] for q in p], "s--", color="#c05050", label="TTFT p99")
for q in p:
    a.annotate(str(q["users"]), (q["tok_s_gpu"], q["tok_s_user"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    b.annotate(str(q["users"]), (q["tok_s_gpu"], q["ttft_p50"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
a.set_xlabel("output tokens/s per GPU"); a.set_ylabel("output tokens/s per user")
b.set_xlabel("output tokens/s per GPU"); b.set_ylabel("seconds"); b.set_yscale("log"); b.legend()
a.grid(alpha=0.3); b.grid(alpha=0.3)
fig.suptitle(d["title"] + " (points: concurrent users)")
fig.tight_layout()
try:
    fig.savefig(d["png"], dpi=120)
except Exception as e:
    sys.stderr.write("cannot write %s: %s\n" % (d["png"], e))
    sys.exit(4)
)PY";
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& [n, r] : runs)
    pts.push_back({{"users", n},
                   {"tok_s_gpu", r.aggregated.tokens_per_s / static_cast<double>(r.config.gpus)},
                   {"tok_s_user", r.aggregated.per_user_tokens_per_s},
                   {"ttft_p50", r.aggregated.ttft.p50},
                   {"ttft_p99", r.aggregated.ttft.p99}});
  const std::string cmd = std::string("/usr/bin/python3 -c '") + kScript + "'";
  FILE* f = popen(cmd.c_str(), "w");
  if (!f) return systemError("--plot: cannot run /usr/bin/python3 (install python3 and python3-matplotlib)");
  const std::string text = nlohmann::json{{"title", title}, {"png", png}, {"points", pts}}.dump();
  std::fwrite(text.data(), 1, text.size(), f);
  const int rc = pclose(f);
  if (rc == -1 || !WIFEXITED(rc)) return systemError("--plot: /usr/bin/python3 did not finish");
  if (WEXITSTATUS(rc) == 3) return systemError("--plot: matplotlib is not available (install python3-matplotlib)");
  if (WEXITSTATUS(rc) == 4) return systemError("--plot: cannot write '{}' (does its folder exist and is it writable?)", png);
  if (WEXITSTATUS(rc) != 0) return systemError("--plot: the plotting script failed (exit {})", WEXITSTATUS(rc));
  return {};
}

}  // namespace chorus::sim
