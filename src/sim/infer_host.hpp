// Disaggregated serving on an emulated cluster of CPU workers: the
// prefill/decode demo of issue 37 (python -m chorus.kv_disagg, docs/kv.md)
// as chorus-sim predicts it.  `chorus-sim infer --disaggregated` takes this
// path when its --cluster file is a host emulation (a top-level "host"
// object): one prefill worker and one decode worker, each a process running
// a torch transformer one request at a time, joined by a tbf-shaped link.
//
// Calibration (the file's "host" and "link"): the model's own kernels timed
// alone (a prefill of the prompt length, a decode token at a few context
// lengths: `kv_disagg kernels`), the fixed costs of the workers' calls
// (an agent's progress call, building a request's descriptor list, a decode
// step's bookkeeping per request), the workers' idle poll, and the link as
// configured (tbf rate and burst, MTU, the hop's latency).  Nothing in it is
// taken from a run of the demo; the demo's TTFT and ITL are only compared
// with the prediction (bench/kv_disagg_validate.sh, docs/validation.md).
//
// The model (src/sim/infer_host.cpp says where each term comes from):
// requests arrive (Poisson at --rate, or the times of --arrivals); the
// prefill worker takes them FCFS, one at a time; a request's KV pages
// (layers x K|V x the prompt's blocks) cross the link behind the earlier
// requests' (a token bucket: the burst passes at once, the rest at the
// rate, every packet's TCP/IP/Ethernet headers included); the origin's
// engine sees the last acknowledgement and sends the notification at once
// (its progress thread, the default) or at the worker's next progress call
// (between layers of a prefill, or its idle poll; "progress": "caller",
// CHORUS_KV_PROGRESS=caller); the decode worker
// admits the request when it next polls (at the end of its current step);
// a decode step runs one token of every running request, one request after
// another (the demo's kernels are per request), and emits them at its end.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sim/config.hpp"
#include "sim/infer.hpp"

namespace chorus::sim {

struct HostEmulation {
  std::string name;
  // Compute (calibrated): (prompt tokens, seconds) of one prefill and
  // (context tokens, seconds) of one decode token; linear between points,
  // proportional beyond the first and last (at least 1 point each).
  std::vector<std::pair<double, double>> prefill_s, decode_token_s;
  // The same kernels timed while the other worker's kernel runs back to back
  // in a process of its own (`kv_disagg kernels --corun`): the two workers
  // share the host's cores, caches and memory bandwidth.  Empty: the workers
  // do not slow each other.  The model stretches the part of a kernel that
  // overlaps the other worker's kernels by corun / alone (at least 1: a
  // neighbour cannot make a kernel faster).
  std::vector<std::pair<double, double>> prefill_corun_s, decode_token_corun_s;
  double progress_s = 0;        // one agent progress / notification poll call
  double post_s = 0;            // building and posting one request's descriptor list
  double decode_request_s = 0;  // a decode step's bookkeeping per running request
  double poll_s = 0;            // an idle worker's sleep between polls
  // Who drives the engine (CHORUS_KV_PROGRESS, docs/kv.md "Progress"): its
  // progress thread (true: "thread", the default) or the worker's calls.
  bool progress_thread = true;
  int64_t block_tokens = 16;    // tokens per KV page
  double kv_elem_bytes = 4;     // bytes per cached K or V element
  // The link (as configured): tbf rate and burst, the MTU its packets carry,
  // and the one-way latency of a hop between the two hosts.
  double rate_bytes_per_s = 0, burst_bytes = 0;
  int64_t mtu = 1500;
  double latency_s = 0;
  // What tbf counts per byte of payload: (MTU + 14 Ethernet) / (MTU - 52:
  // 20 IPv4 + 20 TCP + 12 TCP timestamps, RFC 7323).
  [[nodiscard]] double wireFactor() const {
    return static_cast<double>(mtu + 14) / static_cast<double>(mtu - 52);
  }
};

// When a kernel of `work` seconds alone, started at t, ends if it runs
// `stretch` times as long while the other worker's kernels run (`busy`: time
// intervals, in order and disjoint).  `cursor` (the first interval that may
// still matter; start at 0) only moves forward, so one worker's kernels, in
// time order, walk the other's intervals once.
double stretchedEnd(double t, double work, const std::vector<std::pair<double, double>>& busy, double stretch,
                    size_t* cursor);

// True when the JSON text is a host emulation (a top-level "host" object).
bool isHostEmulation(std::string_view text);
// The file's text, checked: every key known, every number finite and in range.
Result<HostEmulation> parseHostEmulation(std::string_view text, std::string_view where);

struct HostServeResult {
  std::vector<double> ttft_s, itl_s;  // per request; every gap of every request (pooled)
  double ttft_median_s = 0, ttft_p90_s = 0, itl_median_s = 0, itl_p90_s = 0;
  double prefill_s = 0, decode_token_s = 0;  // one request's prefill (with its progress calls); a token at the prompt's length
  double kv_bytes = 0, wire_s = 0;           // one request's KV pages; their time at the link rate from an empty bucket
  int64_t descs = 0;                         // descriptors (pages) per request
  int64_t max_batch = 0;                     // most requests decoding at once
  // Co-running kernels (HostEmulation::*_corun_s): the stretch of a prefill
  // and of a decode token (at the prompt's length) while the other worker
  // computes (1: none), and the passes the two workers' timelines took to
  // agree (each pass places one worker's kernels beside the other's from the
  // pass before; converged: the last pass moved no time by 1 ns or more).
  double prefill_corun = 1, decode_corun = 1;
  int passes = 1;
  bool converged = true;
};

// The demo's service on `h`, model shape from `m` (layers, kv_heads,
// head_dim), requests from cfg (rate, requests, input_len, output_len,
// seed); `arrivals` (seconds from the first, ascending) replaces the
// Poisson draw when not empty.
Result<HostServeResult> simulateHostDisaggregated(const ModelSpec& m, const HostEmulation& h, const InferConfig& cfg,
                                                  const std::vector<double>& arrivals = {});

// A JSON list of arrival times (seconds, ascending, finite, >= 0), or an object with "requests": [{"arrival": t}, ...]
// (what `kv_disagg prefill --out` writes).
Result<std::vector<double>> parseArrivals(std::string_view text, std::string_view where);

// The text and JSON reports of `chorus-sim infer --disaggregated` on a host emulation.
std::string hostServeText(const ModelSpec& m, const HostEmulation& h, const InferConfig& cfg, const HostServeResult& r);
std::string hostServeJson(const ModelSpec& m, const HostEmulation& h, const InferConfig& cfg, const HostServeResult& r);

// `chorus-sim infer --disaggregated` on a host emulation file: the report's text (or JSON).
Result<std::string> runHostInference(const std::string& model_path, bool allow_unknown_keys,
                                     const std::string& cluster_path, std::string_view cluster_text,
                                     const InferConfig& cfg, bool as_json);

}  // namespace chorus::sim
