#include "sim/infer.hpp"

#include "sim/cli_args.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>

namespace chorus::sim {
namespace {

constexpr double kAct = 2;  // bytes per 16-bit element

struct Request {
  double arrival = 0;
  int64_t in = 0, out = 0;
  double first = -1, done = -1;  // first token, last token
  double ready = 0;              // disaggregated: KV arrived at the decode pool
  double kv_s = 0;
};

// Phase costs of one replica of tp GPUs (roofline; see docs/simulator.md).
class Replica {
 public:
  Replica(const ModelSpec& m, const ClusterSpec& c, int tp, bool fp8, Seconds ar_alpha, double ar_beta)
      : m_(m), g_(c.gpu), tp_(tp), fp8_(fp8), ar_alpha_(ar_alpha.value()), ar_beta_(ar_beta) {}

  // Prefill of requests with `tokens` input tokens in all and sum of squared
  // lengths `sq` (attention is quadratic per request).
  [[nodiscard]] double prefill(double tokens, double sq) const {
    const double h = static_cast<double>(m_.hidden), T = tp_;
    const double heads_v = static_cast<double>(m_.heads) * m_.vHeadDim();
    const double mats = m_.activation == Activation::SwiGlu ? 3 : 2;
    double t = 0;
    for (int l = 0; l < m_.layers; ++l) {
      const bool dense = m_.moe.experts == 0 || l < m_.moe.dense_layers;
      const double ff = dense ? static_cast<double>(m_.ffn_hidden)
                              : static_cast<double>(m_.moe.expert_ffn_hidden) * (m_.moe.top_k + m_.moe.shared_experts);
      t += gemm(tokens, m_.attnInParams() / h / T, h) + gemm(tokens, h, heads_v / T) +
           gemm(tokens, (mats - 1) * ff / T, h) + gemm(tokens, h, ff / T);
      // Causal attention (FlashAttention): 2 x sq/2 x heads x (qk + v) FLOPs per layer.
      const double core = sq * static_cast<double>(m_.heads) * (m_.qkHeadDim() + m_.vHeadDim());
      t += core / T / (peak() * g_.gemm_efficiency) + 6 * g_.kernel_overhead.value();
      t += 2 * allreduce(tokens * h * kAct);
    }
    return t;
  }
  // One decode step of `batch` requests holding `context` tokens of KV in all.
  [[nodiscard]] double decode(double batch, double context) const {
    if (batch <= 0) return 0;
    const double h = static_cast<double>(m_.hidden), T = tp_;
    double weights = 0;  // bytes read per GPU
    for (int l = 0; l < m_.layers; ++l) {
      double lp = m_.layerParams(l);
      if (m_.moe.experts > 0 && l >= m_.moe.dense_layers) {  // only the experts some token routes to are read
        const double mats = m_.activation == Activation::SwiGlu ? 3 : 2;
        const double expert = mats * h * static_cast<double>(m_.moe.expert_ffn_hidden);
        const double touched = m_.moe.experts * (1 - std::pow(1 - double(m_.moe.top_k) / m_.moe.experts, batch));
        lp -= expert * (m_.moe.experts - touched);
      }
      weights += lp / T * kAct;
    }
    weights += static_cast<double>(m_.vocab) * h / T * kAct;
    const double kv = context * kvBytesPerToken();
    // Attention over the cache per layer: MHA/GQA 2 x context x heads x (qk + v);
    // MLA decodes in the latent (the up-projections absorbed into Q and O),
    // so each head scores kv_lora + rope wide and gathers kv_lora wide.
    const double width = m_.hasMla() ? static_cast<double>(2 * m_.mla.kv_lora_rank + m_.mla.qk_rope_head_dim)
                                     : m_.qkHeadDim() + m_.vHeadDim();
    const double flops = 2 * batch * m_.activeParams() / T + 2 * context * m_.heads * width * m_.layers / T;
    const double tc = flops / (peak() * g_.gemm_efficiency);
    const double tm = (weights + kv) / (g_.hbm_bw.value() * g_.hbm_efficiency);
    return std::max(tc, tm) + m_.layers * (8 * g_.kernel_overhead.value() + 2 * allreduce(batch * h * kAct));
  }
  [[nodiscard]] double weightBytesPerGpu() const { return m_.params() * kAct / tp_; }
  [[nodiscard]] double kvBytesPerToken() const {  // per GPU
    return m_.layers * m_.kvCacheElems() / m_.kvCacheSplit(tp_) * kAct;
  }

 private:
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
  bool fp8_;
  double ar_alpha_, ar_beta_;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::min<double>(static_cast<double>(v.size() - 1), std::floor(q * static_cast<double>(v.size()))));
  return v[i];
}

// Continuous batching on one replica.  `prefill_here`: the replica prefills
// (aggregated); otherwise requests arrive prefilled at r.ready (decode pool).
// `decode_here`: the replica decodes after prefilling (aggregated); a prefill
// pool replica only prefills.
void runReplica(const Replica& rep, std::vector<Request*>& reqs, bool prefill_here, bool decode_here,
                const InferConfig& cfg, double kv_capacity_tokens) {
  std::sort(reqs.begin(), reqs.end(), [&](const Request* a, const Request* b) {
    return (prefill_here ? a->arrival : a->ready) < (prefill_here ? b->arrival : b->ready);
  });
  auto avail = [&](const Request* r) { return prefill_here ? r->arrival : r->ready; };
  std::deque<Request*> waiting;
  std::vector<Request*> running;
  std::vector<int64_t> made;  // tokens generated per running request
  size_t next = 0;
  double now = 0, context = 0;
  while (next < reqs.size() || !waiting.empty() || !running.empty()) {
    while (next < reqs.size() && avail(reqs[next]) <= now) waiting.push_back(reqs[next++]);
    if (waiting.empty() && running.empty()) {
      now = avail(reqs[next]);
      continue;
    }
    if (!waiting.empty() && (!decode_here || static_cast<int64_t>(running.size()) < cfg.max_batch)) {
      if (prefill_here) {  // a prefill batch up to the token budget (at least one request)
        double tok = 0, sq = 0;
        std::vector<Request*> batch;
        while (!waiting.empty() && (batch.empty() || tok + static_cast<double>(waiting.front()->in) <= static_cast<double>(cfg.prefill_tokens)) &&
               (!decode_here || static_cast<int64_t>(running.size() + batch.size()) < cfg.max_batch) &&
               (!decode_here || context + tok + static_cast<double>(waiting.front()->in + waiting.front()->out) <= kv_capacity_tokens || running.empty())) {
          Request* r = waiting.front();
          waiting.pop_front();
          tok += static_cast<double>(r->in);
          sq += static_cast<double>(r->in) * static_cast<double>(r->in);
          batch.push_back(r);
        }
        if (!batch.empty()) {
          now += rep.prefill(tok, sq);
          for (Request* r : batch) {
            r->first = now;
            if (!decode_here || r->out <= 1) {
              if (decode_here) r->done = now;
              continue;
            }
            running.push_back(r);
            made.push_back(1);
            context += static_cast<double>(r->in + 1);
          }
          continue;
        }
      } else {  // decode pool: admit arrived requests while KV fits
        while (!waiting.empty() && static_cast<int64_t>(running.size()) < cfg.max_batch &&
               (context + static_cast<double>(waiting.front()->in + waiting.front()->out) <= kv_capacity_tokens || running.empty())) {
          Request* r = waiting.front();
          waiting.pop_front();
          if (r->out <= 1) {
            r->done = r->first;
            continue;
          }
          running.push_back(r);
          made.push_back(1);
          context += static_cast<double>(r->in + 1);
        }
      }
    }
    if (running.empty()) {
      if (!waiting.empty() && !prefill_here) continue;
      if (next < reqs.size() && waiting.empty()) now = std::max(now, avail(reqs[next]));
      continue;
    }
    now += rep.decode(static_cast<double>(running.size()), context);
    for (size_t i = 0; i < running.size();) {
      ++made[i];
      context += 1;
      if (made[i] >= running[i]->out) {
        running[i]->done = now;
        context -= static_cast<double>(running[i]->in + made[i]);
        running[i] = running.back(), running.pop_back();
        made[i] = made.back(), made.pop_back();
      } else {
        ++i;
      }
    }
  }
}

ServeStats summarise(const std::vector<Request>& reqs, const InferConfig& cfg) {
  ServeStats s;
  std::vector<double> ttft, tpot;
  double first_arrival = 1e300, last_done = 0, tokens = 0, kv = 0;
  int64_t good = 0;
  for (const Request& r : reqs) {
    first_arrival = std::min(first_arrival, r.arrival);
    last_done = std::max(last_done, r.done);
    const double a = r.first - r.arrival;
    const double b = r.out > 1 ? (r.done - r.first) / static_cast<double>(r.out - 1) : 0;
    ttft.push_back(a);
    tpot.push_back(b);
    tokens += static_cast<double>(r.out);
    kv += r.kv_s;
    if (a <= cfg.ttft_slo_s && b <= cfg.tpot_slo_s) ++good;
  }
  const double span = std::max(1e-12, last_done - first_arrival);
  s.ttft_p50_s = percentile(ttft, 0.50), s.ttft_p90_s = percentile(ttft, 0.90), s.ttft_p99_s = percentile(ttft, 0.99);
  s.tpot_p50_s = percentile(tpot, 0.50), s.tpot_p90_s = percentile(tpot, 0.90), s.tpot_p99_s = percentile(tpot, 0.99);
  s.throughput_rps = static_cast<double>(reqs.size()) / span;
  s.tokens_per_s = tokens / span;
  s.slo_attainment = reqs.empty() ? 0 : static_cast<double>(good) / static_cast<double>(reqs.size());
  s.goodput_rps = static_cast<double>(good) / span;
  s.kv_transfer_mean_s = reqs.empty() ? 0 : kv / static_cast<double>(reqs.size());
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
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--requests", cfg.requests, 1, 10000000, "requests simulated"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--input", cfg.input_len, 1, kTokens, "prompt tokens per request"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--output", cfg.output_len, 1, kTokens, "output tokens per request"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--ttft-slo", cfg.ttft_slo_s, 1e-9, 1e9, "seconds, positive"));
  CHORUS_RETURN_IF_ERROR(checkRange<double>("--tpot-slo", cfg.tpot_slo_s, 1e-9, 1e9, "seconds, positive"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--max-batch", cfg.max_batch, 1, 1 << 24, "running requests per replica"));
  CHORUS_RETURN_IF_ERROR(checkRange<int64_t>("--prefill-tokens", cfg.prefill_tokens, 1, kTokens, "tokens per prefill batch"));
  return checkRange<int>("--prefill-replicas", cfg.prefill_replicas, 0, 1 << 24, "disaggregated split; 0 = try all");
}

Result<InferReport> simulateInference(const ModelSpec& m, const InferConfig& cfg, NetworkModel& net) {
  const ClusterSpec& c = net.cluster();
  CHORUS_RETURN_IF_ERROR(checkInferConfig(cfg));
  if (cfg.gpus > c.gpus())
    return invalidArgument("infer: --gpus {} is outside [1, {}] for cluster '{}'", cfg.gpus, c.gpus(), c.name);
  InferReport rep;
  rep.config = cfg;
  // Replica size: the smallest power of two (inside one node) whose weights
  // leave room for KV cache, unless given.
  const double reserve = 0.9;  // of HBM usable (activations, allocator slack)
  auto kvCapacity = [&](int tp) {
    const Replica r(m, c, tp, cfg.fp8, Seconds(0), 0);
    return (c.gpu.hbm.value() * reserve - r.weightBytesPerGpu()) / r.kvBytesPerToken();
  };
  int tp = cfg.tp;
  if (tp == 0) {
    for (int t = 1; t <= c.node.gpus; t *= 2)
      if (kvCapacity(t) >= static_cast<double>(cfg.input_len + cfg.output_len) * 4) {
        tp = t;
        break;
      }
    if (tp == 0)
      return invalidArgument("infer: model '{}' ({:.0f} GB of 16-bit weights) does not fit a {}-GPU node of '{}' with "
                             "room for KV cache; use a larger --tp across nodes or a bigger GPU",
                             m.name, m.params() * kAct / 1e9, c.node.gpus, c.name);
  }
  if (tp < 1 || cfg.gpus % tp != 0 || m.heads % tp != 0)
    return invalidArgument("infer: --tp {} must divide --gpus {} and the model's {} heads", tp, cfg.gpus, m.heads);
  if (kvCapacity(tp) < static_cast<double>(cfg.input_len + cfg.output_len))
    return invalidArgument("infer: with tp={} the weights of '{}' leave no room for one request's KV cache on {} "
                           "({:.0f} GiB HBM); use a larger --tp", tp, m.name, c.gpu.name, toGib(c.gpu.hbm));
  rep.tp = tp;
  rep.replicas = static_cast<int>(cfg.gpus / tp);
  rep.kv_capacity_tokens = kvCapacity(tp);
  // The tensor-parallel allreduce as alpha + beta x bytes, from the plans on
  // the first replica's GPUs.
  double alpha = 0, beta = 0;
  if (tp > 1) {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost small, net.collective(plan::Collective::AllReduce, Bytes(1024), GroupSet{tp, 1, 1}, ""));
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost big, net.collective(plan::Collective::AllReduce, Bytes(64 << 20), GroupSet{tp, 1, 1}, ""));
    beta = (big.time - small.time).value() / ((64 << 20) - 1024);
    alpha = small.time.value() - beta * 1024;
  }
  const Replica replica(m, c, tp, cfg.fp8, Seconds(alpha), beta);
  rep.prefill_s_per_request = replica.prefill(static_cast<double>(cfg.input_len), double(cfg.input_len) * double(cfg.input_len));
  rep.decode_step_s = replica.decode(1, static_cast<double>(cfg.input_len));
  // KV bytes of one request (all of its replica's GPUs): 2 (K, V) x layers x kv width x 2 B per token.
  rep.kv_bytes_per_request = replica.kvBytesPerToken() * m.kvCacheSplit(tp) * static_cast<double>(cfg.input_len);

  // The request stream.
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
  std::vector<Request> base(static_cast<size_t>(cfg.requests));
  double t = 0;
  for (Request& r : base) {
    t += gap(rng);
    r.arrival = t;
    r.in = length(cfg.input_len);
    r.out = length(cfg.output_len);
  }

  // Aggregated: every replica prefills and decodes; requests round-robin.
  {
    std::vector<Request> reqs = base;
    std::vector<std::vector<Request*>> per(static_cast<size_t>(rep.replicas));
    for (size_t i = 0; i < reqs.size(); ++i) per[i % per.size()].push_back(&reqs[i]);
    for (auto& v : per) runReplica(replica, v, true, true, cfg, rep.kv_capacity_tokens);
    rep.aggregated = summarise(reqs, cfg);
    rep.aggregated.mode = "aggregated";
    rep.aggregated.decode_replicas = rep.replicas;
  }
  // Disaggregated: P prefill replicas, D = replicas - P decode replicas; the
  // KV cache of each request moves from its prefill GPUs to its decode GPUs
  // (one shard per tensor-parallel rank, every rank at once).
  double kv_alpha = 0, kv_beta = 0;
  bool have_kv = false;
  auto kvCost = [&](int p_reps) -> Result<std::pair<double, double>> {
    const int64_t stride = static_cast<int64_t>(p_reps) * tp;  // prefill GPU g sends to decode GPU g + stride
    if (stride >= cfg.gpus) return std::pair<double, double>{0, 0};
    const GroupSet pairs{2, stride, std::min<int64_t>(tp, stride)};
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost s1, net.sendRecv(Bytes(1024), pairs));
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost s2, net.sendRecv(Bytes(64 << 20), pairs));
    const double b = (s2.time - s1.time).value() / ((64 << 20) - 1024);
    return std::pair<double, double>{s1.time.value() - b * 1024, b};
  };
  for (int p_reps = 1; p_reps < rep.replicas; ++p_reps) {
    if (cfg.prefill_replicas > 0 && p_reps != cfg.prefill_replicas) continue;
    CHORUS_ASSIGN_OR_RETURN(auto ab, kvCost(p_reps));
    kv_alpha = ab.first, kv_beta = ab.second, have_kv = true;
    std::vector<Request> reqs = base;
    std::vector<std::vector<Request*>> pre(static_cast<size_t>(p_reps));
    for (size_t i = 0; i < reqs.size(); ++i) pre[i % pre.size()].push_back(&reqs[i]);
    for (auto& v : pre) runReplica(replica, v, true, false, cfg, rep.kv_capacity_tokens);
    const double per_gpu_shard = replica.kvBytesPerToken();
    for (Request& r : reqs) {
      r.kv_s = kv_alpha + kv_beta * per_gpu_shard * static_cast<double>(r.in);
      r.ready = r.first + r.kv_s;
    }
    std::vector<Request*> order;
    for (Request& r : reqs) order.push_back(&r);
    std::sort(order.begin(), order.end(), [](const Request* a, const Request* b) { return a->ready < b->ready; });
    std::vector<std::vector<Request*>> dec(static_cast<size_t>(rep.replicas - p_reps));
    for (size_t i = 0; i < order.size(); ++i) dec[i % dec.size()].push_back(order[i]);
    for (auto& v : dec) runReplica(replica, v, false, true, cfg, rep.kv_capacity_tokens);
    ServeStats st = summarise(reqs, cfg);
    st.mode = "disaggregated";
    st.prefill_replicas = p_reps;
    st.decode_replicas = rep.replicas - p_reps;
    rep.splits.push_back(st);
    if (rep.best_disaggregated.mode.empty() || st.goodput_rps > rep.best_disaggregated.goodput_rps) rep.best_disaggregated = st;
  }
  (void)have_kv;
  rep.best = "aggregated";
  // Disaggregation must win by more than 1 % (run-to-run noise of the
  // finite request stream) to be called better: it costs a second pool.
  if (!rep.best_disaggregated.mode.empty() && rep.best_disaggregated.goodput_rps > rep.aggregated.goodput_rps * 1.01)
    rep.best = fmt::format("disaggregated {}:{}", rep.best_disaggregated.prefill_replicas, rep.best_disaggregated.decode_replicas);
  return rep;
}

}  // namespace chorus::sim
