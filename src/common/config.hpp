// The library's complete configuration, one struct.
//
// The environment (the CHORUS_* knobs of env::knobs()) is read in one place,
// the API layer (api/config.hpp: configFromEnv), where every knob is validated
// once; everything below receives this struct, or the part of it it needs, as
// an argument.  So a test or a tool configures a communicator by building a
// Config (api::commInitRank), not by setting process-wide variables, and no
// layer can read a knob with a rule of its own.
//
// The defaults here are the knob table's defaults (env.cpp); the config test
// checks that parsing an empty environment gives Config{} (but for
// tune.profile_path, which the environment's HOME supplies).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/log.hpp"

namespace chorus {

// CHORUS_REPRODUCIBLE (docs/algorithms.md, "Reproducible reductions"): off;
// canonical: every sum/avg of a communicator size combines in one canonical
// tree over rank ids, whatever the plan, chunk, transport or placement; exact:
// the correctly rounded sum, carried in a wide integer accumulator.
enum class Reproducible : uint8_t { Off = 0, Canonical = 1, Exact = 2 };

// CHORUS_COMPRESS / chorusConfig_t.compress: the communicator's default wire
// format for compressible calls (docs/algorithms.md, "Compressed reductions").
// The values are the C API's CHORUS_COMPRESS_*.
enum class CompressKind : uint8_t { Off = 0, Bf16 = 1, Fp8 = 2 };
struct CompressDefault {
  CompressKind kind = CompressKind::Off;
  int block = 128;  // fp8: elements per scale, 32..1024 (kernels::kFp8DefaultBlock)
  bool operator==(const CompressDefault&) const = default;
};

// Protection of a connection's bytes after its handshake (CHORUS_WIRE_PROTECT;
// bootstrap/wire_protect.hpp).
enum class WireProtect : uint8_t { kOff = 0, kMac = 1, kEncrypt = 2 };

struct Config {
  std::chrono::milliseconds timeout{600000};  // CHORUS_TIMEOUT_MS: every operation and init
  bool check = false;                         // CHORUS_CHECK: signature exchange before every collective
  Reproducible reproducible = Reproducible::Off;  // CHORUS_REPRODUCIBLE: off, canonical, exact
  CompressDefault compress;                        // CHORUS_COMPRESS: off, bf16, fp8[:BLOCK]

  struct Net {
    // CHORUS_WIRE_PROTECT: the TCP transport's bytes after the handshake
    // (bootstrap/wire_protect.hpp): as they are, sealed with a MAC, or encrypted.
    WireProtect wire_protect = WireProtect::kOff;
    std::string socket_ifname;  // CHORUS_SOCKET_IFNAME: "" = the interface routing to the master
    std::string host_id;        // CHORUS_HOST_ID: "" = the machine's identity alone
    // CHORUS_TRANSPORT: a registered transport's name (transport/registry.hpp),
    // tried first for every peer; "auto": each peer's most preferred one.
    std::string transport = "auto";
  } net;

  // Shared by the shm and TCP transports' waits.
  std::chrono::microseconds spin{50};  // CHORUS_SPIN_US

  struct Shm {
    size_t ring_bytes = size_t{1} << 20;  // CHORUS_SHM_RING_BYTES: power of two in [4096, 4 GiB]
    bool cma = true;                      // CHORUS_SHM_CMA
    size_t cma_bytes = size_t{1} << 20;   // CHORUS_SHM_CMA_BYTES
    bool spread = true;                   // CHORUS_SHM_SPREAD
  } shm;

  struct Tcp {
    int sockets = 1;                     // CHORUS_TCP_SOCKETS: 1..16
    uint64_t rendezvous_bytes = 262144;  // CHORUS_TCP_RENDEZVOUS_BYTES
    int heartbeat_ms = 1000;             // CHORUS_HEARTBEAT_MS: 0..3600000 (0: off)
    bool rma = true;                     // CHORUS_TCP_RMA: one-sided operations (one more connection per pair)
  } tcp;

  // The UCX transport (docs/ucx.md); CHORUS_HEARTBEAT_MS also sets its keepalive.
  struct Ucx {
    std::string tls;  // CHORUS_UCX_TLS: UCX_TLS for its contexts; "" = UCX's own choice (UCX_TLS honoured)
    // The UCX variables the transport gives a default of its own
    // (kDefaulted) that the user set: UCX's reading of them stands.
    static constexpr const char* kDefaulted[] = {"UCX_TCP_RX_SEG_SIZE"};
    std::vector<std::string> user_set;
  } ucx;

  struct Tune {
    std::string algo_spec;     // CHORUS_ALGO
    uint64_t chunk_bytes = 0;  // CHORUS_CHUNK_BYTES: 0 = the tuner's choice
    // The profile the tuner loads (CHORUS_TUNE_FILE, else
    // $HOME/.cache/chorus/profile.json); "" = none, the built-in defaults.
    std::string profile_path;
    std::vector<std::string> plan_paths;  // CHORUS_PLAN_PATH: plan files and directories (docs/plan-format.md)
  } tune;

  struct Flight {
    std::string dir;  // CHORUS_FLIGHT_DIR: "" = no dumps
  } flight;

  struct Shrink {
    std::chrono::milliseconds window{2000};  // CHORUS_SHRINK_WINDOW_MS
  } shrink;

  struct Trace {
    std::string dir;            // CHORUS_TRACE: "" = off
    int clock_sync_s = 60;      // CHORUS_CLOCK_SYNC_S: 0..86400
    int64_t clock_offset_ns = 0;  // CHORUS_CLOCK_OFFSET_NS (testing; process-wide, set by each init)
  } trace;

  struct Log {
    log::Level level = log::Level::Warn;  // CHORUS_DEBUG (process-wide, set by each init)
  } log;
};

}  // namespace chorus
