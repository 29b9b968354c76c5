// The local job launcher behind chorus-run (and chorus-bench --np).
//
// launch() starts N ranks of one program on this host, each with the
// CHORUS_* variables that chorusCommInitFromEnv reads and the torchrun-style
// variables that torch.distributed's env:// init reads (MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; MASTER_PORT is
// a second free port, never chorus's own store port), relays their output
// line by line with a "[rank] " prefix, and supervises them: the first rank
// that fails (non-zero exit or a signal) brings the job down, a forwarded
// SIGINT/SIGTERM/SIGHUP reaches every rank, and an optional timeout ends the
// job with status 124.
//
// Contracts:
//  - launch() runs on the calling thread and returns only when every rank has
//    been reaped.  While it runs it blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP
//    in the calling thread and reads them from a signalfd; the previous mask is
//    restored on return.  Call it from a process whose other threads (if any)
//    also block those signals, or the kernel may deliver them elsewhere.
//  - Each rank runs in its own process group (so a rank's own children are
//    signalled with it) with stdin from /dev/null, and dies with the launcher
//    (PR_SET_PDEATHSIG), so a killed launcher leaves no orphans.
//  - Output is relayed by this thread only, whole lines per write(), so lines of
//    different ranks never interleave mid-line.  A line longer than
//    kMaxLineBytes is split; a last line without '\n' gets one at EOF.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.hpp"

namespace chorus::tools {

inline constexpr size_t kMaxLineBytes = 64 * 1024;

struct LaunchOptions {
  int nranks = 1;
  std::vector<std::string> argv;  // program (looked up in PATH) and its arguments
  bool prefix_stdout = true;      // "[rank] " before each stdout line
  bool prefix_stderr = true;      // "[rank] " before each stderr line
  // Ends the job (SIGTERM, then SIGKILL after kill_grace) and returns 124.
  std::optional<std::chrono::milliseconds> timeout;
  // How long ranks get between SIGTERM and SIGKILL.
  std::chrono::milliseconds kill_grace{3000};
  std::string master_addr = "127.0.0.1";
  // 0: pick a free port on master_addr (see pickFreePort for the race).
  uint16_t master_port = 0;
  // MASTER_PORT for torch's env:// store (rank 0's TCPStore binds it).
  // 0: pick a free port other than master_port.  Equal to master_port is an
  // error: chorus's store and torch's would both bind it.
  uint16_t torch_port = 0;
  // Extra NAME=VALUE pairs for every rank (override the inherited environment).
  std::vector<std::pair<std::string, std::string>> extra_env;
  int out_fd = 1;  // where relayed stdout lines go
  int err_fd = 2;  // where relayed stderr lines and the launcher's own messages go
  std::string name = "chorus-run";  // prefix of the launcher's own messages
  // Pin rank r to the r-th CPU (modulo their number) of the CPUs this
  // process may run on, as mpirun --bind-to core: ranks then never share a
  // core while others are idle (a 2-rank shared-memory job whose ranks the
  // kernel placed on one core pays a context switch per message).
  bool bind_cores = false;
};

// How one rank ended.
struct RankExit {
  bool reaped = false;
  bool signaled = false;
  int code = 0;  // exit status, or the signal number when signaled

  [[nodiscard]] bool failed() const { return signaled || code != 0; }
  // As a shell reports it: the exit status, or 128 + signal.
  [[nodiscard]] int shellStatus() const { return signaled ? 128 + code : code; }
};

struct LaunchReport {
  int exit_code = 0;            // what the launcher process should return
  std::vector<RankExit> ranks;  // indexed by rank
  int first_failed_rank = -1;   // -1: none failed on its own
  bool timed_out = false;
  int forwarded_signal = 0;     // the first SIGINT/SIGTERM/SIGHUP received, 0: none
  std::string summary;          // the line printed about how the job ended ("" when all succeeded)
};

// Runs the job to completion.  Errors are only the launcher's own (bad
// options, pipe/fork/signalfd failures); a failing rank is a LaunchReport.
Result<LaunchReport> launch(const LaunchOptions& options);

// Binds port 0 on addr, reads the port the kernel chose and closes the socket.
// Racy by nature: another process may take the port before rank 0's store
// binds it.  The window is a few milliseconds on a quiet host, and losing it
// makes init fail loudly (address in use) rather than misbehave.
Result<uint16_t> pickFreePort(const std::string& addr);

// The values chorus-run gives one rank.
struct RankEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  std::string master_addr;
  uint16_t master_port = 0;  // chorus's store: CHORUS_MASTER_PORT
  std::string secret_hex;
  uint16_t torch_port = 0;   // torch's env:// store: MASTER_PORT
  int local_world_size = 1;  // ranks on this host (all of them: chorus-run is local)
};
// base (NAME=VALUE strings, e.g. from environ) with the job variables and
// extra replaced or added; every other entry is kept in order.  The job
// variables: CHORUS_RANK, CHORUS_LOCAL_RANK, CHORUS_WORLD_SIZE,
// CHORUS_MASTER_ADDR, CHORUS_MASTER_PORT, CHORUS_SECRET, and for torch's
// env:// (and any torchrun-style program) MASTER_ADDR, MASTER_PORT (=
// torch_port), RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
std::vector<std::string> rankEnvironment(const std::vector<std::string>& base, const RankEnv& job,
                                         const std::vector<std::pair<std::string, std::string>>& extra);

// "rank 1 exited with status 3" / "rank 2 was killed by signal 9 (Killed)".
std::string describeExit(int rank, const RankExit& e);

// The table that `chorus-run --print-env` prints: every knob of env::knobs()
// with its default and meaning.
std::string formatKnobTable();
// Which memory spaces this chorus can use here (chorusMemSpaceQuery), one
// line each, each line starting with `prefix`: "host: yes", "opencl: yes",
// "cuda: no (no CUDA driver (libcuda.so.1: ...))".  chorus-run --print-env and
// chorus-bench print it.
std::string formatMemorySpaces(std::string_view prefix);

}  // namespace chorus::tools
