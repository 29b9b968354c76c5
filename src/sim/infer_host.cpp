// The prefill/decode demo on CPU workers (infer_host.hpp): an event model of
// the two workers and the link between them, from calibrated kernel costs and
// the link's configuration.
#include "sim/infer_host.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <fmt/format.h>

namespace chorus::sim {

using nlohmann::json;

namespace {

Status badKey(std::string_view where, std::string_view key, std::string_view why) {
  return invalidArgument("{}: '{}' {}", where, key, why);
}

Status onlyKeys(const json& o, std::string_view where, std::initializer_list<std::string_view> keys) {
  for (auto it = o.begin(); it != o.end(); ++it)
    if (std::find(keys.begin(), keys.end(), it.key()) == keys.end())
      return badKey(where, it.key(), "is not a known key");
  return {};
}

Status number(const json& o, std::string_view where, const char* key, double lo, double hi, double* out,
              bool required) {
  if (!o.contains(key)) return required ? badKey(where, key, "is missing") : Status{};
  const json& v = o.at(key);
  if (!v.is_number()) return badKey(where, key, "is not a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) return invalidArgument("{}: '{}' {} is outside [{}, {}]", where, key, x, lo, hi);
  *out = x;
  return {};
}

// [[x, seconds], ...]: x ascending, at least one point, seconds > 0.
Status curve(const json& o, std::string_view where, const char* key, std::vector<std::pair<double, double>>* out) {
  if (!o.contains(key)) return badKey(where, key, "is missing");
  const json& v = o.at(key);
  if (!v.is_array() || v.empty() || v.size() > 4096) return badKey(where, key, "is not a list of 1..4096 [tokens, seconds] pairs");
  for (const json& p : v) {
    if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number())
      return badKey(where, key, "has an entry that is not a [tokens, seconds] pair");
    const double x = p[0].get<double>(), s = p[1].get<double>();
    if (!std::isfinite(x) || !std::isfinite(s) || x < 1 || x > 1e9 || s <= 0 || s > 1e4)
      return invalidArgument("{}: '{}' has [{}, {}]: tokens in [1, 1e9], seconds in (0, 1e4]", where, key, x, s);
    if (!out->empty() && x <= out->back().first)
      return badKey(where, key, "is not in ascending order of tokens");
    out->emplace_back(x, s);
  }
  return {};
}

// Linear between points; beyond the ends, proportional to the end point's
// per-token cost continued by the nearest segment's slope (one point:
// proportional to tokens).
double at(const std::vector<std::pair<double, double>>& c, double x) {
  if (c.size() == 1) return c[0].second * x / c[0].first;
  size_t i = 1;
  while (i + 1 < c.size() && x > c[i].first) ++i;
  const auto [x0, y0] = c[i - 1];
  const auto [x1, y1] = c[i];
  return std::max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0));
}

// statistics.median and the demo's p90 (sorted[ceil(0.9 n) - 1]).
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
double p90(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto k = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, k > 0 ? k - 1 : 0)];
}

using Busy = std::vector<std::pair<double, double>>;

// The stretch of a kernel of x tokens beside the other worker's: corun /
// alone, at least 1; 1 without a co-run curve.
double stretchAt(const std::vector<std::pair<double, double>>& alone,
                 const std::vector<std::pair<double, double>>& corun, double x) {
  if (corun.empty()) return 1;
  const double a = at(alone, x);
  return a > 0 ? std::max(1.0, at(corun, x) / a) : 1;
}

void addBusy(Busy* b, double from, double to) {
  if (to <= from) return;
  if (!b->empty() && from <= b->back().second)
    b->back().second = std::max(b->back().second, to);
  else
    b->emplace_back(from, to);
}

Result<std::string> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return invalidArgument("cannot open '{}'", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (ss.str().size() > (64u << 20)) return invalidArgument("'{}' is larger than 64 MiB", path);
  return ss.str();
}

}  // namespace

double stretchedEnd(double t, double work, const std::vector<std::pair<double, double>>& busy, double stretch,
                    size_t* cursor) {
  size_t& i = *cursor;
  while (work > 0) {
    while (i < busy.size() && busy[i].second <= t) ++i;
    if (i == busy.size()) return t + work;
    if (t < busy[i].first) {  // alone until the other's next kernel
      if (t + work <= busy[i].first) return t + work;
      work -= busy[i].first - t;
      t = busy[i].first;
    }
    const double span = busy[i].second - t;  // beside it until it ends
    if (work * stretch <= span) return t + work * stretch;
    work -= span / stretch;
    t = busy[i].second;
  }
  return t;
}

bool isHostEmulation(std::string_view text) {
  const json j = json::parse(text.begin(), text.end(), nullptr, false);
  return j.is_object() && j.contains("host");
}

Result<HostEmulation> parseHostEmulation(std::string_view text, std::string_view where) {
  const json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("{}: not a JSON object", where);
  CHORUS_RETURN_IF_ERROR(onlyKeys(j, where, {"name", "host", "link", "calibration"}));
  HostEmulation h;
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    return badKey(where, "name", "is missing or not a non-empty string");
  h.name = j["name"].get<std::string>();
  if (!j.contains("host") || !j["host"].is_object()) return badKey(where, "host", "is not an object");
  if (!j.contains("link") || !j["link"].is_object()) return badKey(where, "link", "is missing or not an object");
  const json& c = j["host"];
  const std::string hw = fmt::format("{}: host", where), lw = fmt::format("{}: link", where);
  CHORUS_RETURN_IF_ERROR(onlyKeys(c, hw, {"prefill_s", "decode_token_s", "progress_s", "post_s", "decode_request_s",
                                          "poll_s", "block_tokens", "kv_elem_bytes", "progress", "prefill_corun_s",
                                          "decode_token_corun_s"}));
  if (c.contains("progress")) {
    const json& v = c["progress"];
    if (!v.is_string() || (v.get<std::string>() != "thread" && v.get<std::string>() != "caller"))
      return badKey(hw, "progress", "is not \"thread\" or \"caller\"");
    h.progress_thread = v.get<std::string>() == "thread";
  }
  CHORUS_RETURN_IF_ERROR(curve(c, hw, "prefill_s", &h.prefill_s));
  CHORUS_RETURN_IF_ERROR(curve(c, hw, "decode_token_s", &h.decode_token_s));
  if (c.contains("prefill_corun_s")) CHORUS_RETURN_IF_ERROR(curve(c, hw, "prefill_corun_s", &h.prefill_corun_s));
  if (c.contains("decode_token_corun_s"))
    CHORUS_RETURN_IF_ERROR(curve(c, hw, "decode_token_corun_s", &h.decode_token_corun_s));
  CHORUS_RETURN_IF_ERROR(number(c, hw, "progress_s", 0, 1, &h.progress_s, true));
  CHORUS_RETURN_IF_ERROR(number(c, hw, "post_s", 0, 10, &h.post_s, true));
  CHORUS_RETURN_IF_ERROR(number(c, hw, "decode_request_s", 0, 10, &h.decode_request_s, true));
  CHORUS_RETURN_IF_ERROR(number(c, hw, "poll_s", 0, 1, &h.poll_s, true));
  double bt = 16, eb = 4;
  CHORUS_RETURN_IF_ERROR(number(c, hw, "block_tokens", 1, 1 << 20, &bt, false));
  CHORUS_RETURN_IF_ERROR(number(c, hw, "kv_elem_bytes", 0.5, 16, &eb, false));
  if (bt != std::floor(bt)) return badKey(hw, "block_tokens", "is not an integer");
  h.block_tokens = static_cast<int64_t>(bt), h.kv_elem_bytes = eb;
  const json& l = j["link"];
  CHORUS_RETURN_IF_ERROR(onlyKeys(l, lw, {"rate_bit_s", "burst_bytes", "mtu", "latency_s"}));
  double rate = 0, mtu = 1500;
  CHORUS_RETURN_IF_ERROR(number(l, lw, "rate_bit_s", 1e3, 1e13, &rate, true));
  CHORUS_RETURN_IF_ERROR(number(l, lw, "burst_bytes", 0, 1e12, &h.burst_bytes, true));
  CHORUS_RETURN_IF_ERROR(number(l, lw, "mtu", 576, 65536, &mtu, false));
  CHORUS_RETURN_IF_ERROR(number(l, lw, "latency_s", 0, 10, &h.latency_s, true));
  if (mtu != std::floor(mtu)) return badKey(lw, "mtu", "is not an integer");
  h.rate_bytes_per_s = rate / 8, h.mtu = static_cast<int64_t>(mtu);
  return h;
}

Result<std::vector<double>> parseArrivals(std::string_view text, std::string_view where) {
  const json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return invalidArgument("{}: not JSON", where);
  std::vector<double> out;
  auto take = [&](const json& v) -> Status {
    if (!v.is_number()) return invalidArgument("{}: an arrival time is not a number", where);
    const double t = v.get<double>();
    if (!std::isfinite(t) || t < 0 || t > 1e7 || (!out.empty() && t < out.back()))
      return invalidArgument("{}: arrival {} is not finite, >= 0 and ascending", where, t);
    out.push_back(t);
    return {};
  };
  if (j.is_array()) {
    for (const json& v : j) CHORUS_RETURN_IF_ERROR(take(v));
  } else if (j.is_object() && j.contains("requests") && j["requests"].is_array()) {
    for (const json& r : j["requests"]) {
      if (!r.is_object() || !r.contains("arrival")) return invalidArgument("{}: a request has no 'arrival'", where);
      CHORUS_RETURN_IF_ERROR(take(r["arrival"]));
    }
  } else {
    return invalidArgument("{}: neither a list of arrival times nor an object with 'requests'", where);
  }
  if (out.empty() || out.size() > (1u << 24)) return invalidArgument("{}: 1 .. 2^24 arrivals expected", where);
  return out;
}

Result<HostServeResult> simulateHostDisaggregated(const ModelSpec& m, const HostEmulation& h, const InferConfig& cfg,
                                                  const std::vector<double>& arrivals_in) {
  if (m.layers < 1 || m.headDim() < 1) return invalidArgument("infer: model '{}' has no layers or heads", m.name);
  if (cfg.requests < 1 || cfg.input_len < 1 || cfg.output_len < 1 || !(cfg.rate > 0))
    return invalidArgument("infer: --requests, --input, --output and --rate must be positive");
  if (cfg.dist != LengthDist::Fixed)
    return invalidArgument("infer: a host emulation runs the demo's fixed --input / --output lengths (--lengths fixed)");
  // The request stream: the demo's (--arrivals) or Poisson at --rate, the first at 0.
  std::vector<double> arr = arrivals_in;
  if (arr.empty()) {
    std::mt19937_64 rng(cfg.seed);
    std::exponential_distribution<double> gap(cfg.rate);
    double t = 0;
    for (int64_t i = 0; i < cfg.requests; ++i) {
      arr.push_back(t);
      t += gap(rng);
    }
  }
  const size_t n = arr.size();
  const auto L = static_cast<double>(m.layers);
  const double in = static_cast<double>(cfg.input_len);
  const int64_t out = cfg.output_len;

  HostServeResult r;
  // One request's KV pages: the demo writes the blocks that hold prompt
  // tokens, every (layer, K|V): one descriptor each.
  const int64_t blocks = (cfg.input_len + h.block_tokens - 1) / h.block_tokens;
  r.descs = static_cast<int64_t>(m.layers) * 2 * blocks;
  const double page = static_cast<double>(h.block_tokens) * static_cast<double>(m.kv_heads > 0 ? m.kv_heads : m.heads) *
                      static_cast<double>(m.headDim()) * h.kv_elem_bytes;
  r.kv_bytes = static_cast<double>(r.descs) * page;
  const double wire = r.kv_bytes * h.wireFactor();
  r.wire_s = std::max(0.0, wire - h.burst_bytes) / h.rate_bytes_per_s;
  // A prefill: the kernels, then the agent's progress call after each layer.
  r.prefill_s = at(h.prefill_s, in) + L * h.progress_s;
  // A decode token of one request at position p (its cache holds p + 1 tokens after it).
  auto token = [&](double p) { return at(h.decode_token_s, p) + L * h.progress_s + h.decode_request_s; };
  r.decode_token_s = token(in);

  // Co-running workers: a kernel that overlaps the other worker's kernels
  // runs slower (HostEmulation::*_corun_s).  The two timelines depend on
  // each other, so they are placed in turn (the prefill worker beside the
  // decode worker's kernels of the pass before, then the decode worker
  // beside those prefills) until a pass moves nothing.
  const double prefill_stretch = stretchAt(h.prefill_s, h.prefill_corun_s, in);
  auto token_stretch = [&](double p) { return stretchAt(h.decode_token_s, h.decode_token_corun_s, p); };
  r.prefill_corun = prefill_stretch;
  r.decode_corun = token_stretch(in);
  const bool corun = !h.prefill_corun_s.empty() || !h.decode_token_corun_s.empty();
  constexpr int kMaxPasses = 64;

  Busy prefill_busy, decode_busy;
  std::vector<double> start(n), done(n), posted(n), notified(n), last_done, last_ttft;
  std::vector<size_t> order(n);
  struct Run {
    size_t id;
    int64_t made;
    double last;
  };
  std::vector<Run> running;
  r.converged = false;
  for (r.passes = 1; r.passes <= kMaxPasses; ++r.passes) {
    // The prefill worker: FCFS, one request at a time; an idle worker polls
    // every poll_s, so it starts an arrival poll_s / 2 late on average.
    prefill_busy.clear();
    double free = 0;
    size_t pc = 0;
    for (size_t i = 0; i < n; ++i) {
      start[i] = std::max(arr[i] + h.poll_s / 2, free);
      done[i] = stretchedEnd(start[i], r.prefill_s, decode_busy, prefill_stretch, &pc);
      addBusy(&prefill_busy, start[i], done[i]);
      posted[i] = done[i] + h.post_s;
      free = posted[i];
    }
    // When the origin's engine acts on what arrived at t.  Its progress
    // thread (blocked in the transport's epoll or futex wait) at once.
    // Without one, when the prefill worker next calls progress at or after t:
    // the end of a layer of a prefill it is computing, else within its idle
    // poll.
    auto pickup = [&](double t) {
      if (h.progress_thread) return t;
      for (size_t j = 0; j < n; ++j)
        if (t >= start[j] && t < done[j]) {
          const double layer = (done[j] - start[j]) / L;
          return start[j] + std::ceil((t - start[j]) / layer) * layer;
        }
      return t + h.poll_s / 2;
    };
    // The link: FIFO, a token bucket of burst_bytes refilled at the rate (two
    // tbf of the same setting in series, host and switch port, pass what one
    // passes).  The last byte lands one latency later, its acknowledgement
    // another latency later at the origin; the notification (sent when the
    // origin's engine acts on it: pickup) one latency after that.
    double link_free = 0, bucket = h.burst_bytes, bucket_t = 0;
    for (size_t i = 0; i < n; ++i) {
      const double s = std::max(posted[i], link_free);
      bucket = std::min(h.burst_bytes, bucket + (s - bucket_t) * h.rate_bytes_per_s);
      double end = s;
      if (wire <= bucket) {
        bucket -= wire;
      } else {
        end = s + (wire - bucket) / h.rate_bytes_per_s;
        bucket = 0;
      }
      bucket_t = end, link_free = end;
      notified[i] = pickup(end + 2 * h.latency_s) + h.latency_s;
    }

    // The decode worker: polls its notifications (one call each, and one that
    // finds none), admits those that have arrived (the first token's time),
    // then a step: one token of every running request in turn, all emitted at
    // the step's end; idle, it sleeps poll_s between polls.
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return notified[a] < notified[b]; });
    running.clear();
    decode_busy.clear();
    r.ttft_s.assign(n, 0);
    r.itl_s.clear();
    r.max_batch = 0;
    size_t next = 0, finished = 0, dc = 0;
    double now = 0;
    while (finished < n) {
      while (next < n && notified[order[next]] <= now) {
        const size_t id = order[next++];
        now += h.progress_s;
        r.ttft_s[id] = now - arr[id];
        if (out == 1) {
          ++finished;
          continue;
        }
        running.push_back({id, 1, now});
      }
      now += h.progress_s;  // the poll that finds no notification
      if (running.empty()) {
        if (next < n) now = std::max(now, notified[order[next]] + h.poll_s / 2);
        continue;
      }
      r.max_batch = std::max<int64_t>(r.max_batch, static_cast<int64_t>(running.size()));
      const double step_start = now;
      for (const Run& x : running) {
        const double p = in + static_cast<double>(x.made) - 1;
        now = stretchedEnd(now, token(p), prefill_busy, token_stretch(p), &dc);
      }
      addBusy(&decode_busy, step_start, now);
      for (size_t i = 0; i < running.size();) {
        Run& x = running[i];
        r.itl_s.push_back(now - x.last);
        x.last = now;
        if (++x.made >= out) {
          ++finished;
          running[i] = running.back();
          running.pop_back();
        } else {
          ++i;
        }
      }
    }
    if (!corun) {  // nothing couples the timelines: one pass is exact
      r.converged = true;
      break;
    }
    if (!last_done.empty()) {
      double moved = 0;
      for (size_t i = 0; i < n; ++i)
        moved = std::max({moved, std::abs(done[i] - last_done[i]), std::abs(r.ttft_s[i] - last_ttft[i])});
      if (moved < 1e-9) {
        r.converged = true;
        break;
      }
    }
    last_done = done, last_ttft = r.ttft_s;
  }
  r.passes = std::min(r.passes, kMaxPasses);
  r.ttft_median_s = median(r.ttft_s), r.ttft_p90_s = p90(r.ttft_s);
  r.itl_median_s = median(r.itl_s), r.itl_p90_s = p90(r.itl_s);
  return r;
}

std::string hostServeText(const ModelSpec& m, const HostEmulation& h, const InferConfig& cfg, const HostServeResult& r) {
  std::string s = fmt::format(
      "{} on host emulation '{}': 1 prefill + 1 decode worker, {} requests at {:.3g}/s, {} in / {} out tokens\n"
      "  prefill {:.2f} ms per request, decode token {:.3f} ms (at {} tokens); KV {} pages, {:.1f} KiB per request, "
      "{:.2f} ms on a {:.0f} Mbit/s link past its {:.0f} KiB burst\n",
      m.name, h.name, r.ttft_s.size(), cfg.rate, cfg.input_len, cfg.output_len, 1e3 * r.prefill_s,
      1e3 * r.decode_token_s, cfg.input_len, r.descs, r.kv_bytes / 1024, 1e3 * r.wire_s, h.rate_bytes_per_s * 8 / 1e6,
      h.burst_bytes / 1024);
  s += fmt::format("  disaggregated: TTFT median {:.2f} ms p90 {:.2f} ms; ITL median {:.3f} ms p90 {:.3f} ms; "
                   "at most {} decoding at once\n",
                   1e3 * r.ttft_median_s, 1e3 * r.ttft_p90_s, 1e3 * r.itl_median_s, 1e3 * r.itl_p90_s, r.max_batch);
  if (!h.prefill_corun_s.empty() || !h.decode_token_corun_s.empty())
    s += fmt::format("  beside the other worker's kernels: a prefill takes {:.2f}x, a decode token {:.2f}x; the two "
                     "timelines {} after {} passes\n",
                     r.prefill_corun, r.decode_corun, r.converged ? "agreed" : "still moved (not converged)",
                     r.passes);
  return s;
}

std::string hostServeJson(const ModelSpec& m, const HostEmulation& h, const InferConfig& cfg, const HostServeResult& r) {
  json j = {{"model", m.name},
            {"cluster", h.name},
            {"mode", "disaggregated"},
            {"requests", r.ttft_s.size()},
            {"rate", cfg.rate},
            {"input", cfg.input_len},
            {"output", cfg.output_len},
            {"prefill_s", r.prefill_s},
            {"decode_token_s", r.decode_token_s},
            {"kv_bytes_per_request", r.kv_bytes},
            {"descs_per_request", r.descs},
            {"kv_wire_s", r.wire_s},
            {"max_batch", r.max_batch},
            {"ttft_s", {{"median", r.ttft_median_s}, {"p90", r.ttft_p90_s}}},
            {"itl_s", {{"median", r.itl_median_s}, {"p90", r.itl_p90_s}}},
            {"corun", {{"prefill", r.prefill_corun}, {"decode_token", r.decode_corun}, {"passes", r.passes},
                       {"converged", r.converged}}}};
  return j.dump(2) + "\n";
}

Result<std::string> runHostInference(const std::string& model_path, bool allow_unknown_keys,
                                     const std::string& cluster_path, std::string_view cluster_text,
                                     const InferConfig& cfg, bool as_json) {
  CHORUS_ASSIGN_OR_RETURN(HostEmulation h, parseHostEmulation(cluster_text, cluster_path));
  if (cfg.aggregated)
    return invalidArgument("infer: '{}' is a host emulation of the prefill/decode demo (one prefill and one decode "
                           "worker): give --disaggregated", cluster_path);
  if (cfg.gpus != 2)
    return invalidArgument("infer: host emulation '{}' has 2 workers (1 prefill, 1 decode): --gpus 2, not {}", h.name,
                           cfg.gpus);
  if (cfg.load() != LoadMode::OpenLoop)
    return invalidArgument("infer: a host emulation runs the demo's open-loop stream (--rate), not --concurrency or "
                           "--max-throughput");
  CHORUS_ASSIGN_OR_RETURN(ModelSpec m, loadModel(model_path, allow_unknown_keys));
  std::vector<double> arrivals;
  if (!cfg.arrivals_path.empty()) {
    CHORUS_ASSIGN_OR_RETURN(std::string text, slurp(cfg.arrivals_path));
    CHORUS_ASSIGN_OR_RETURN(arrivals, parseArrivals(text, cfg.arrivals_path));
  }
  CHORUS_ASSIGN_OR_RETURN(HostServeResult r, simulateHostDisaggregated(m, h, cfg, arrivals));
  return as_json ? hostServeJson(m, h, cfg, r) : hostServeText(m, h, cfg, r);
}

}  // namespace chorus::sim
