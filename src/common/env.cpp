#include "common/env.hpp"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cstdlib>

namespace chorus::env {
namespace {

// clang-format off
constexpr Knob kKnobs[] = {
  {"CHORUS_RANK",            "", "this process's rank (set by chorus-run); torchrun's RANK, OMPI_COMM_WORLD_RANK and SLURM_PROCID are read when unset"},
  {"CHORUS_WORLD_SIZE",      "", "number of ranks in the job; WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS when unset"},
  {"CHORUS_LOCAL_RANK",      "", "rank among the ranks on this host (informational)"},
  {"CHORUS_MASTER_ADDR",     "", "address of rank 0's rendezvous store; when unset: MASTER_ADDR, the first host of a Slurm job, or under Open MPI's mpirun 127.0.0.1 (one host) or mpirun's host"},
  {"CHORUS_MASTER_PORT",     "", "port of rank 0's rendezvous store; when unset: MASTER_PORT + 1 (torchrun's store holds MASTER_PORT), or derived from the Slurm / Open MPI job id"},
  {"CHORUS_SECRET",          "", "job secret (hex) every connection must prove; chorus-run always sets a fresh one"},
  {"CHORUS_SECRET_FILE",     "", "a file of 64 hex digits (mode 0600, this user's) holding the job secret, when CHORUS_SECRET is unset: one on a shared file system serves ranks on many hosts"},
  {"CHORUS_SECRET_DIR",      "", "where ranks that all run on one host keep their per-job secret file without CHORUS_SECRET (a directory of this user's, mode 0700); default $XDG_RUNTIME_DIR, else /tmp/chorus-<uid>"},
  {"CHORUS_REQUIRE_SECRET",  "0", "1: refuse to initialise from the environment without a job secret (CHORUS_SECRET, CHORUS_SECRET_FILE, or the per-job file of a one-host job)"},
  {"CHORUS_WIRE_PROTECT",    "off", "the TCP transport's bytes after each connection's handshake: off, mac (every record carries an AES-GCM tag under per-connection keys: a changed, dropped, replayed or reordered byte breaks the connection with an error naming the peer), encrypt (the same, and the payload is encrypted); needs a job secret; all ranks alike"},
  {"CHORUS_SOCKET_IFNAME",   "", "network interface for the store and TCP data connections (e.g. eth0); default: the one routing to the master"},
  {"CHORUS_HOST_ID",         "", "ranks whose values differ are on different hosts even on one machine (TCP between them, as NCCL_HOSTID): for tests of multi-host plans"},
  {"CHORUS_KV_PROGRESS",     "thread", "who moves a KV transfer agent's bytes (chorusKv*, docs/kv.md): thread (a progress thread of the agent's own drives its transports, so transfers move while the caller computes or sleeps) or caller (only inside the agent's calls: progress, test, wait, notification polls)"},
  {"CHORUS_TRANSPORT",       "auto", "auto: each peer's most preferred registered transport (shared memory between ranks of one host, TCP across hosts); a registered transport's name (shm, tcp, ...): that one first, for every peer it can reach"},
  {"CHORUS_HEARTBEAT_MS",    "1000", "TCP keepalive period between hosts (and the UCX transport's keepalive interval): a peer host that vanishes without closing its connections is declared dead within about 3x this"},
  {"CHORUS_TCP_SOCKETS",     "1", "TCP sockets per peer (more can raise bandwidth on fast links)"},
  {"CHORUS_TCP_RMA",         "1", "one-sided operations (put/get into registered regions, docs/rma.md) over TCP: 1 opens one more connection per pair for them; 0: none (the transport's rma() is absent)"},
  {"CHORUS_UCX_TLS",         "", "the UCX transport's transports (UCX_TLS for its contexts, e.g. tcp, sm,tcp, rc,sm,self; docs/ucx.md); empty: UCX's own choice, which honours UCX_TLS"},
  {"CHORUS_TCP_RENDEZVOUS_BYTES", "262144", "TCP messages of at least this many bytes wait for the receiver's clear-to-send (sent when it posts the receive) before their payload goes on the wire; 0: every message eager"},
  {"CHORUS_SHM_CMA",         "1", "0: never use cross-memory attach (process_vm_readv) for large shared-memory messages"},
  {"CHORUS_SHM_SPREAD",      "1", "0: never move a rank off a core it shares with another local rank of the communicator (with as many cores as local ranks, the rank that finds it shares one moves itself to a free allowed CPU, then keeps its own affinity mask)"},
  {"CHORUS_SHM_CMA_BYTES",   "1048576", "smallest shared-memory message sent by cross-memory attach (the receiver reads the sender's buffer) instead of through the ring"},
  {"CHORUS_SHM_RING_BYTES",  "1048576", "bytes of each shared-memory ring (one per ordered pair of local ranks)"},
  {"CHORUS_CHUNK_BYTES",     "0", "pipeline chunk size for large messages; 0 lets the tuner choose"},
  {"CHORUS_SPIN_US",         "50", "microseconds a waiting rank polls (yielding the core when ranks outnumber cores) before it blocks"},
  {"CHORUS_TUNE_FILE",       "", "tuning profile written by chorus-tune (default ~/.cache/chorus/profile.json)"},
  {"CHORUS_ALGO",            "", "force algorithms per collective, e.g. allreduce:ring;allgather:recursive_doubling; allreduce:file:PATH runs the plan file PATH (MSCCL XML or chorus's plan text, proven as it loads; a call it does not take is an error)"},
  {"CHORUS_PLAN_PATH",       "", "plans from files (docs/plan-format.md): plan files and directories of them, separated by ':'; each plan is proven by the verifier when a communicator is set up, then CHORUS_ALGO can name it (allreduce:NAME) and the tuner may choose it"},
  {"CHORUS_TIMEOUT_MS",      "600000", "timeout of every operation and of init, in milliseconds"},
  {"CHORUS_SHRINK_WINDOW_MS", "2000", "how long chorusCommShrink waits for surviving ranks to join the agreement"},
  {"CHORUS_FLIGHT_DIR",      "", "directory where each rank dumps its flight recorder (last operations) on a timeout or error; read by `chorus-trace hang`"},
  {"CHORUS_TRACE",           "", "directory where every rank writes a binary trace of each operation and step (read by `chorus-trace merge` and `chorus-trace report`, docs/tracing.md)"},
  {"CHORUS_CLOCK_SYNC_S",    "60", "with CHORUS_TRACE: seconds between re-estimates of each rank's clock offset to rank 0 (one estimate is always made at init); 0: at init only"},
  {"CHORUS_CLOCK_OFFSET_NS", "0", "testing: shift this process's trace clock by this many nanoseconds, as if its host clock were off (the clock alignment must remove it)"},
  {"CHORUS_DEBUG",           "WARN", "log level: NONE, WARN, INFO, TRACE"},
  {"CHORUS_COMPRESS",        "off", "the communicator's default wire format for fp32 allreduce, reduce-scatter (sum, avg, premulsum) and allgather: off, bf16, fp8 (e4m3, one scale per 128 elements) or fp8:BLOCK (BLOCK 32..1024); other calls stay uncompressed, a call's options override it (docs/algorithms.md, Compressed reductions)"},
  {"CHORUS_REPRODUCIBLE",    "off", "reductions (sum, avg, premulsum) that do not depend on the plan: off; canonical: bitwise identical for a given number of ranks whatever the algorithm, chunk size, transport or rank placement (one fixed combination tree); exact: the correctly rounded sum, also identical across numbers of ranks (floating-point types only; docs/algorithms.md)"},
  {"CHORUS_DEVICE_STAGING",  "auto", "how a call on an OpenCL stream reaches its device buffers (docs/device.md): auto (map where the device's memory is the host's, CL_DEVICE_HOST_UNIFIED_MEMORY, else pipeline), map (the host call runs on the mapped buffers), pipeline (chunked copies through pinned host memory overlapped with the chunks' calls), whole (one copy in, one copy out); on a CUDA stream auto is pipeline and map is refused; read when the stream is created"},
  {"CHORUS_DEVICE_ASYNC",    "1", "1: a call on an OpenCL stream returns once its queue commands are enqueued, its host part runs on the communicator's device worker (NCCL's stream semantics; docs/device.md); 0: the call returns after its host part ran; read when the stream is created"},
  {"CHORUS_CUDA_DRIVER", "libcuda.so.1", "the CUDA driver library chorus loads (dlopen) for the CUDA memory space (docs/device.md, \"CUDA\"): a path or soname; the tests point it at their driver test double (tests/fake_cuda); read at the first CUDA call"},
  {"CHORUS_DEVICE_CHUNK_BYTES", "1048576", "the chunk of pipelined device staging (OpenCL: CHORUS_DEVICE_STAGING=pipeline; CUDA: auto or pipeline), bytes per buffer"},
  {"CHORUS_CHECK",           "0", "1: every collective first exchanges its signature (kind, sequence, count, dtype, op, root) and a mismatch between ranks returns chorusMismatch on every rank; the first collective of each communicator is always checked"},
};
// clang-format on

}  // namespace

std::span<const Knob> knobs() { return kKnobs; }

const Knob* findKnob(std::string_view name) {
  for (const Knob& k : kKnobs)
    if (k.name == name) return &k;
  return nullptr;
}

std::optional<std::string> raw(std::string_view name) {
  [[maybe_unused]] const Knob* k = findKnob(name);
  assert(k && "knob missing from the table in env.cpp");
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string getString(std::string_view name) {
  if (auto v = raw(name)) return *v;
  const Knob* k = findKnob(name);
  return k ? std::string(k->default_value) : std::string();
}

Result<int64_t> getInt(std::string_view name) {
  std::string s = getString(name);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size())
    return invalidArgument("{}='{}' is not an integer", name, s);
  return v;
}

Result<bool> getBool(std::string_view name) {
  std::string s = getString(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
  return invalidArgument("{}='{}' is not a boolean (use 0 or 1)", name, s);
}

std::optional<std::string> getAny(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace chorus::env
