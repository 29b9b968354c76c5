// Unique ids, environment-based init and host identity.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket.hpp"
#include "common/status.hpp"

namespace chorus::bootstrap {

// The decoded chorusUniqueId: where rank 0's store listens, and the job secret.
//
// Layout of the 128 opaque bytes (little endian): magic "CHORUSID" [8] |
// version u16 | family u16 | port u16 | pad u16 | address [16] | secret [32] |
// flags u32 (bit 0: secret present) | zero [60].  decode() rejects any other
// magic, version, family or a non-zero tail.
struct UniqueId {
  net::SockAddr root;
  auth::Secret secret;

  [[nodiscard]] chorusUniqueId encode() const;
  static Result<UniqueId> decode(const chorusUniqueId& id);
};

// What rank 0 runs for chorusGetUniqueId: chooses the address (interface
// ifname's, Config::net.socket_ifname, when not empty, else a non-loopback address of this host, else
// loopback), starts nothing yet, and draws a fresh secret.  The store server is
// started by rank 0's chorusCommInitRank on exactly that address and port, so
// getUniqueId reserves a free port by binding it and keeps the listening
// socket for the server to adopt (see takeReservedListener).
Result<UniqueId> makeUniqueId(const std::string& ifname);
// The listener reserved by makeUniqueId for this address, if this process made it.
std::optional<net::Fd> takeReservedListener(const net::SockAddr& addr);

// The job as described by the environment (chorusCommInitFromEnv).
struct EnvJob {
  int rank = -1;
  int world_size = -1;
  std::string master_addr;
  uint16_t master_port = 0;
  auth::Secret secret;       // present == false: unauthenticated
  std::string secret_origin;     // "CHORUS_SECRET", "CHORUS_SECRET_FILE=...", "the per-job file ..."
  std::string secret_file;       // the per-job file (job_secret.hpp) rank 0 removes once every rank has joined
  std::string no_secret_reason;  // without a secret: why none could be had
  std::string source;        // "chorus", "torchrun", "openmpi", "slurm"
  // Where master_addr and master_port came from, for error messages
  // ("CHORUS_MASTER_PORT", "MASTER_PORT + 1 (MASTER_PORT=29500 is torch's store)", ...).
  std::string addr_origin;
  std::string port_origin;
};
// What a job without a secret risks and how to give it one (for warnings).
std::string_view secretFix();
// Reads, first found wins: CHORUS_RANK/CHORUS_WORLD_SIZE/CHORUS_MASTER_*;
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; OMPI_COMM_WORLD_RANK/SIZE;
// SLURM_PROCID/SLURM_NTASKS (master from CHORUS_MASTER_ADDR or the first host
// of SLURM_JOB_NODELIST).  Errors name the missing or malformed variable.
// Precisely: the rank variable found first picks the source; CHORUS_WORLD_SIZE,
// CHORUS_MASTER_ADDR and CHORUS_MASTER_PORT override per variable; then
// MASTER_ADDR / MASTER_PORT; a Slurm job without them uses its node list's
// first host and the port 20000 + SLURM_JOB_ID % 20000.  The secret:
// CHORUS_SECRET (hex), else CHORUS_SECRET_FILE, else, when every rank is on
// this host, a per-job 0600 file (job_secret.hpp; CHORUS_SECRET_DIR or
// $XDG_RUNTIME_DIR or /tmp/chorus-<uid>); CHORUS_REQUIRE_SECRET=1 makes its
// absence an error.
//
// MASTER_PORT is torch's: torchrun's agent already listens on it (and torch's
// env:// init binds it on rank 0), so chorus's store listens on MASTER_PORT + 1
// when the port comes from MASTER_PORT; CHORUS_MASTER_PORT names it exactly.
// Open MPI (mpirun) without CHORUS_MASTER_ADDR: 127.0.0.1 when every rank is
// on one host (OMPI_COMM_WORLD_LOCAL_SIZE = OMPI_COMM_WORLD_SIZE), else
// mpirun's host (OMPI_MCA_orte_hnp_uri), where rank 0 must then run; without
// CHORUS_MASTER_PORT the port is 20000 + FNV-1a(job id) % 12000, the job id
// being OMPI_MCA_ess_base_jobid (Open MPI 4) or PMIX_NAMESPACE (5).
Result<EnvJob> readEnvJob();

// The first host name of a Slurm node list ("node[01-04,07],gpu3" -> "node01").
Result<std::string> firstSlurmHost(const std::string& nodelist);

// Identity of this host as seen for transport choice: ranks with equal
// identities can share memory.
struct HostIdentity {
  char hostname[64] = {};
  char boot_id[40] = {};
  uint64_t netns_inode = 0;
  uint64_t ipcns_inode = 0;

  bool operator==(const HostIdentity& o) const;
};
// host_id (Config::net.host_id, CHORUS_HOST_ID), when not empty, makes this
// process a host of its own among the processes of one machine (tests).
HostIdentity localHostIdentity(std::string_view host_id);
// Host index of every rank: the lowest rank with an equal identity; with
// `apart` (CHORUS_TRANSPORT=tcp) every rank is a host of its own.
std::vector<int> hostIndices(std::span<const HostIdentity> ids, bool apart);

}  // namespace chorus::bootstrap
