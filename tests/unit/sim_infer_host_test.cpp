// chorus-sim infer --disaggregated on a host emulation (sim/infer_host.hpp):
// the prefill/decode demo of issue 37 priced from the committed calibrated
// emulation file.  Physical bounds (no TTFT below a prefill plus the KV
// bytes past the burst at the link rate; no ITL below a decode token), the
// direction of every input (a slower link or a longer prompt: later first
// tokens; more load: larger batches and longer gaps), the link's framing
// arithmetic, and the parser's refusals.  No timing of this machine.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "sim/infer_host.hpp"

namespace chorus::sim {
namespace {

std::string slurp(const std::string& rel) {
  std::ifstream f(std::string(CHORUS_SOURCE_DIR) + "/" + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

constexpr const char* kCluster = "bench/kv_disagg_cluster_2026-12-07.json";

HostEmulation committed() {
  const std::string text = slurp(kCluster);
  EXPECT_TRUE(isHostEmulation(text));
  auto h = parseHostEmulation(text, kCluster);
  EXPECT_TRUE(h.isOk()) << h.status().message();
  return h.isOk() ? *h : HostEmulation{};
}

ModelSpec demoModel() {
  auto m = loadModel(std::string(CHORUS_SOURCE_DIR) + "/bench/kv_disagg_model.json");
  EXPECT_TRUE(m.isOk()) << m.status().message();
  return m.isOk() ? *m : ModelSpec{};
}

// The demo's defaults in bench/kv_netns.sh: 24 requests at 1/s, 128 + 32 tokens.
InferConfig demo() {
  InferConfig ic;
  ic.gpus = 2, ic.aggregated = false, ic.requests = 24, ic.rate = 1, ic.input_len = 128, ic.output_len = 32;
  return ic;
}

TEST(SimInferHost, PredictsFiniteLatenciesWithinPhysicalBounds) {
  const HostEmulation h = committed();
  const ModelSpec m = demoModel();
  auto r = simulateHostDisaggregated(m, h, demo());
  ASSERT_TRUE(r.isOk()) << r.status().message();
  // The KV of a 128-token prompt: 4 layers x K|V x 8 pages of 16 tokens x 4 heads x 32 x 4 B.
  EXPECT_EQ(r->descs, 64);
  EXPECT_DOUBLE_EQ(r->kv_bytes, 64.0 * 16 * 4 * 32 * 4);
  ASSERT_EQ(r->ttft_s.size(), 24u);
  ASSERT_EQ(r->itl_s.size(), 24u * 31);
  const double floor_ttft = r->prefill_s + std::max(0.0, r->kv_bytes * h.wireFactor() - h.burst_bytes) / h.rate_bytes_per_s;
  for (double t : r->ttft_s) {
    ASSERT_TRUE(std::isfinite(t));
    EXPECT_GE(t, floor_ttft);
  }
  // A gap is at least one token of one request at the cheapest calibrated context.
  double token = 1e9;
  for (const auto& [ctx, s] : h.decode_token_s) token = std::min(token, s);
  for (double g : r->itl_s) {
    ASSERT_TRUE(std::isfinite(g));
    EXPECT_GE(g, token + m.layers * h.progress_s);
  }
  EXPECT_GE(r->ttft_p90_s, r->ttft_median_s);
  EXPECT_GE(r->itl_p90_s, r->itl_median_s);
  EXPECT_GE(r->max_batch, 1);
}

// A slower link delays every first token by the KV bytes' extra time (no
// burst: the whole batch at the rate); decode is untouched at this load.
TEST(SimInferHost, SlowerLinkDelaysFirstTokens) {
  HostEmulation h = committed();
  h.burst_bytes = 0;
  const ModelSpec m = demoModel();
  InferConfig ic = demo();
  ic.rate = 0.2;  // requests far apart: no queueing, batch 1
  auto fast = simulateHostDisaggregated(m, h, ic);
  h.rate_bytes_per_s /= 4;
  auto slow = simulateHostDisaggregated(m, h, ic);
  ASSERT_TRUE(fast.isOk() && slow.isOk());
  const double extra = 3 * fast->kv_bytes * h.wireFactor() / (4 * h.rate_bytes_per_s);  // 4x the time minus 1x
  EXPECT_GT(slow->ttft_median_s, fast->ttft_median_s);
  // The extra wire time, within the progress-call granularity of the
  // notification (a fraction of a prefill layer or of the poll).
  EXPECT_NEAR(slow->ttft_median_s - fast->ttft_median_s, extra, 0.05 * extra + fast->prefill_s / m.layers);
  EXPECT_NEAR(slow->itl_median_s, fast->itl_median_s, 1e-9);
  EXPECT_EQ(fast->max_batch, 1);
}

// More load: requests overlap on the decode worker (the demo's per-request
// kernels: a step is the sum of its requests' tokens), so gaps grow; a
// longer prompt costs a longer prefill and more pages.  (Long outputs: a
// request must decode for longer than a prefill takes, or the prefill
// worker spaces them out whatever the rate.)
TEST(SimInferHost, LoadAndPromptLengthMoveTheRightWay) {
  const HostEmulation h = committed();
  const ModelSpec m = demoModel();
  InferConfig ic = demo();
  ic.output_len = 512;
  auto light = simulateHostDisaggregated(m, h, ic);
  ic.rate = 40;
  auto heavy = simulateHostDisaggregated(m, h, ic);
  ASSERT_TRUE(light.isOk() && heavy.isOk());
  EXPECT_GT(heavy->max_batch, light->max_batch);
  EXPECT_GT(heavy->itl_median_s, light->itl_median_s);
  EXPECT_GT(heavy->ttft_median_s, light->ttft_median_s);
  ic = demo();
  auto shorter = simulateHostDisaggregated(m, h, ic);
  ic.input_len = 256;
  auto longer = simulateHostDisaggregated(m, h, ic);
  ASSERT_TRUE(shorter.isOk() && longer.isOk());
  EXPECT_EQ(longer->descs, 2 * shorter->descs);
  EXPECT_GT(longer->prefill_s, shorter->prefill_s);
  EXPECT_GT(longer->ttft_median_s, shorter->ttft_median_s);
}

// Given arrivals replace the Poisson draw: two requests far apart see the
// same TTFT, the unloaded one: prefill + wire past the burst (none here:
// 512 KiB > 128 KiB) + the notification's pickup and latencies.
TEST(SimInferHost, GivenArrivalsAndTheUnloadedTtft) {
  const HostEmulation h = committed();
  const ModelSpec m = demoModel();
  auto r = simulateHostDisaggregated(m, h, demo(), {0.0, 10.0});
  ASSERT_TRUE(r.isOk()) << r.status().message();
  ASSERT_EQ(r->ttft_s.size(), 2u);
  EXPECT_NEAR(r->ttft_s[0], r->ttft_s[1], 1e-9);
  const double base = h.poll_s / 2 + r->prefill_s + h.post_s + r->wire_s + 3 * h.latency_s;
  EXPECT_GE(r->ttft_s[0], base);
  EXPECT_LE(r->ttft_s[0], base + h.poll_s + 3 * h.progress_s + 1e-9);
}

// Who drives the engine: with its progress thread (the default) the
// notification leaves as the last acknowledgement arrives, so an unloaded
// request's TTFT is exactly poll / 2 + prefill + post + wire + 3 latencies +
// the decode side's notification polls; driven by the worker's calls
// ("progress": "caller") the prefill worker's idle poll delays it, by up to
// one poll.  The key is checked.
TEST(SimInferHost, ProgressThreadOrCallerPickup) {
  HostEmulation h = committed();
  const ModelSpec m = demoModel();
  h.poll_s = 0.01;  // a coarse poll makes the caller's pickup visible
  ASSERT_TRUE(h.progress_thread);  // the default, and the committed file's (it has no key)
  auto thread = simulateHostDisaggregated(m, h, demo(), {0.0, 10.0});
  h.progress_thread = false;
  auto caller = simulateHostDisaggregated(m, h, demo(), {0.0, 10.0});
  ASSERT_TRUE(thread.isOk() && caller.isOk());
  const double base = h.poll_s / 2 + thread->prefill_s + h.post_s + thread->wire_s + 3 * h.latency_s;
  EXPECT_GE(thread->ttft_s[0], base);
  EXPECT_LE(thread->ttft_s[0], base + h.poll_s / 2 + 3 * h.progress_s + 1e-9);
  EXPECT_NEAR(caller->ttft_s[0] - thread->ttft_s[0], h.poll_s / 2, 1e-9);  // the idle poll's pickup
  EXPECT_DOUBLE_EQ(caller->itl_median_s, thread->itl_median_s);
  std::string text = slurp(kCluster);
  const size_t at = text.find("\"poll_s\"");
  ASSERT_NE(at, std::string::npos);
  std::string t = text;
  t.insert(at, "\"progress\": \"caller\", ");
  auto parsed = parseHostEmulation(t, "x");
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_FALSE(parsed->progress_thread);
  t = text;
  t.insert(at, "\"progress\": \"both\", ");
  EXPECT_FALSE(parseHostEmulation(t, "x").isOk());
  t = text;
  t.insert(at, "\"progress\": 1, ");
  EXPECT_FALSE(parseHostEmulation(t, "x").isOk());
}

// A kernel beside the other worker's (stretchedEnd): alone it takes its
// work; inside a busy interval `stretch` times as long; across intervals the
// sum of both; the cursor skips what is over.
TEST(SimInferHost, StretchedEndWalksTheOthersKernels) {
  const std::vector<std::pair<double, double>> busy = {{1, 2}, {3, 4}};
  size_t c = 0;
  EXPECT_DOUBLE_EQ(stretchedEnd(0, 0.5, busy, 2, &c), 0.5);
  c = 0;
  EXPECT_DOUBLE_EQ(stretchedEnd(0, 1.5, busy, 2, &c), 2.0);   // 1 alone, 0.5 of work in [1, 2]
  c = 0;
  EXPECT_DOUBLE_EQ(stretchedEnd(0, 2.0, busy, 2, &c), 2.5);   // ... and 0.5 alone after it
  c = 0;
  EXPECT_DOUBLE_EQ(stretchedEnd(0, 3.0, busy, 2, &c), 4.0);   // 1 + 0.5 + 1 + 0.5
  c = 0;
  EXPECT_DOUBLE_EQ(stretchedEnd(0, 3.5, busy, 2, &c), 4.5);
  c = 0;
  EXPECT_DOUBLE_EQ(stretchedEnd(1.5, 0.1, busy, 3, &c), 1.8);  // starts inside an interval
  EXPECT_EQ(c, 0u);
  EXPECT_DOUBLE_EQ(stretchedEnd(2.5, 1.0, busy, 2, &c), 4.0);  // 0.5 alone, then 0.5 in [3, 4]
  EXPECT_EQ(c, 1u);
  EXPECT_DOUBLE_EQ(stretchedEnd(5, 1.0, busy, 2, &c), 6.0);    // after every interval
  c = 0;
  EXPECT_DOUBLE_EQ(stretchedEnd(0, 3.0, busy, 1, &c), 3.0);    // stretch 1: the work alone
}

// The co-running workers (HostEmulation::*_corun_s): curves equal to the
// alone ones change nothing; a decode token twice as slow beside a prefill
// lengthens the gaps of a request that decodes through another's prefill,
// and not its first token; both stretched, the two timelines agree after a
// few passes and no gap or first token comes sooner.
TEST(SimInferHost, CoRunningKernelsStretchOnlyTheOverlap) {
  HostEmulation h = committed();
  const ModelSpec m = demoModel();
  auto alone = simulateHostDisaggregated(m, h, demo());
  ASSERT_TRUE(alone.isOk()) << alone.status().message();
  EXPECT_EQ(alone->passes, 1);
  EXPECT_DOUBLE_EQ(alone->decode_corun, 1);
  h.prefill_corun_s = h.prefill_s, h.decode_token_corun_s = h.decode_token_s;
  auto same = simulateHostDisaggregated(m, h, demo());
  ASSERT_TRUE(same.isOk()) << same.status().message();
  EXPECT_TRUE(same->converged);
  EXPECT_EQ(same->ttft_s, alone->ttft_s);
  EXPECT_EQ(same->itl_s, alone->itl_s);

  // Request 1 arrives as request 0's first token does: its prefill runs while request 0 decodes.
  const double t0 = alone->ttft_s[0];
  auto base = simulateHostDisaggregated(m, h, demo(), {0.0, t0});
  h.decode_token_corun_s.clear();
  for (const auto& [x, sec] : h.decode_token_s) h.decode_token_corun_s.emplace_back(x, 2 * sec);
  auto slow = simulateHostDisaggregated(m, h, demo(), {0.0, t0});
  ASSERT_TRUE(base.isOk() && slow.isOk());
  EXPECT_DOUBLE_EQ(slow->decode_corun, 2);
  EXPECT_DOUBLE_EQ(slow->prefill_corun, 1);
  EXPECT_TRUE(slow->converged);
  EXPECT_EQ(slow->ttft_s[0], base->ttft_s[0]);  // nothing overlapped it yet
  EXPECT_GT(slow->itl_s[0], base->itl_s[0]);    // request 0's first gap: beside the prefill from its start
  double sum_base = 0, sum_slow = 0;
  for (double g : base->itl_s) sum_base += g;
  for (double g : slow->itl_s) sum_slow += g;
  EXPECT_GT(sum_slow, sum_base);

  h.prefill_corun_s.clear();
  for (const auto& [x, sec] : h.prefill_s) h.prefill_corun_s.emplace_back(x, 1.3 * sec);
  h.decode_token_corun_s.clear();
  for (const auto& [x, sec] : h.decode_token_s) h.decode_token_corun_s.emplace_back(x, 1.3 * sec);
  auto both = simulateHostDisaggregated(m, h, demo());
  ASSERT_TRUE(both.isOk());
  EXPECT_TRUE(both->converged) << both->passes << " passes";
  EXPECT_GE(both->itl_median_s, alone->itl_median_s);
  EXPECT_GE(both->ttft_median_s, alone->ttft_median_s);
  double sum_alone = 0, sum_both = 0;
  for (double g : alone->itl_s) sum_alone += g;
  for (double g : both->itl_s) sum_both += g;
  EXPECT_GT(sum_both, sum_alone);

  // The file's keys: parsed when well formed, refused otherwise.
  const std::string text = slurp(kCluster);
  const size_t at = text.find("\"poll_s\"");
  ASSERT_NE(at, std::string::npos);
  std::string t = text;
  t.insert(at, "\"prefill_corun_s\": [[128, 0.08]], \"decode_token_corun_s\": [[128, 0.003], [159, 0.004]], ");
  auto parsed = parseHostEmulation(t, "x");
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(parsed->prefill_corun_s.size(), 1u);
  EXPECT_EQ(parsed->decode_token_corun_s.size(), 2u);
  for (const char* bad : {"\"prefill_corun_s\": [], ", "\"prefill_corun_s\": [[128, -1]], ",
                          "\"decode_token_corun_s\": [[159, 0.004], [128, 0.003]], "}) {
    t = text;
    t.insert(at, bad);
    EXPECT_FALSE(parseHostEmulation(t, "x").isOk()) << bad;
  }
}

TEST(SimInferHost, TcpFramingOfTheLink) {
  HostEmulation h;
  h.mtu = 1500;
  EXPECT_DOUBLE_EQ(h.wireFactor(), 1514.0 / 1448.0);
}

TEST(SimInferHost, RefusesMalformedEmulationsAndArrivals) {
  const std::string good = slurp(kCluster);
  ASSERT_TRUE(parseHostEmulation(good, "x").isOk());
  auto refused = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at == std::string::npos) return;
    t.replace(at, from.size(), to);
    auto r = parseHostEmulation(t, "x");
    EXPECT_FALSE(r.isOk()) << "accepted with " << to;
  };
  refused("\"poll_s\"", "\"pol_s\"");             // unknown key (and poll_s missing)
  refused("\"rate_bit_s\": ", "\"rate_bit_s\": -");  // negative rate
  refused("\"mtu\": 1500", "\"mtu\": 100");       // below IPv4's minimum
  refused("\"name\"", "\"nam\"");
  EXPECT_FALSE(parseHostEmulation("[1,2]", "x").isOk());
  EXPECT_FALSE(parseHostEmulation("{\"host\": 1", "x").isOk());
  // Curves: ascending tokens, positive seconds.
  const std::string curve = R"({"name":"e","host":{"prefill_s":[[128,0.05],[64,0.03]],"decode_token_s":[[128,0.001]],
    "progress_s":0,"post_s":0,"decode_request_s":0,"poll_s":0},"link":{"rate_bit_s":1e8,"burst_bytes":0,"latency_s":0}})";
  EXPECT_FALSE(parseHostEmulation(curve, "x").isOk());
  std::string ok = curve;
  ok.replace(ok.find("[64,0.03]"), 9, "[256,0.1]");
  EXPECT_TRUE(parseHostEmulation(ok, "x").isOk());
  std::string zero = ok;
  zero.replace(zero.find("[128,0.001]"), 11, "[128,0]");
  EXPECT_FALSE(parseHostEmulation(zero, "x").isOk());
  EXPECT_FALSE(isHostEmulation("{\"name\":\"a100\",\"gpu\":{}}"));
  EXPECT_FALSE(isHostEmulation("not json"));

  auto a = parseArrivals("[0, 0.5, 2]", "a");
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(a->size(), 3u);
  auto b = parseArrivals(R"({"role":"prefill","requests":[{"arrival":0},{"arrival":1.5}]})", "a");
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(b->back(), 1.5);
  EXPECT_FALSE(parseArrivals("[1, 0.5]", "a").isOk());  // not ascending
  EXPECT_FALSE(parseArrivals("[-1]", "a").isOk());
  EXPECT_FALSE(parseArrivals("[]", "a").isOk());
  EXPECT_FALSE(parseArrivals("{\"requests\":[{}]}", "a").isOk());
}

TEST(SimInferHost, CommandNeedsTheDisaggregatedDemoShape) {
  const std::string text = slurp(kCluster);
  const std::string model = std::string(CHORUS_SOURCE_DIR) + "/bench/kv_disagg_model.json";
  InferConfig ic = demo();
  auto ok = runHostInference(model, false, kCluster, text, ic, true);
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_NE(ok->find("\"ttft_s\""), std::string::npos);
  ic.aggregated = true;
  auto agg = runHostInference(model, false, kCluster, text, ic, false);
  ASSERT_FALSE(agg.isOk());
  EXPECT_NE(agg.status().message().find("--disaggregated"), std::string::npos);
  ic = demo();
  ic.gpus = 8;
  EXPECT_FALSE(runHostInference(model, false, kCluster, text, ic, false).isOk());
  ic = demo();
  ic.dist = LengthDist::Uniform;
  EXPECT_FALSE(runHostInference(model, false, kCluster, text, ic, false).isOk());
}

}  // namespace
}  // namespace chorus::sim
