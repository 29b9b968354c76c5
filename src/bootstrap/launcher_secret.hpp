// A job secret over the launcher's own channel, for ranks on several hosts:
// PMIx, the key-value exchange that Open MPI's mpirun, Slurm's srun
// --mpi=pmix, PRRTE and Flux give every process they start.  Rank 0 of the
// PMIx namespace puts a fresh random secret under a key of global scope;
// every rank fences (collecting the data), and the others get it from rank 0.
// The secret travels only through the launcher: each process's PMIx server
// is its local launcher daemon (a Unix socket whose peer PMIx authenticates),
// and between hosts the daemons' own connections.  Nothing listens on the
// job's network for it and no file holds it.
//
// libpmix is loaded when first needed (dlopen of libpmix.so.2), not linked:
// a process that is not under a PMIx launcher never loads it.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "bootstrap/auth.hpp"
#include "common/status.hpp"

namespace chorus::bootstrap {

struct LauncherSecret {
  auth::Secret secret;
  std::string origin;  // "PMIx (namespace ..., N processes)"
};

// The secret from the launcher, collective over every process of the PMIx
// namespace (they all initialise chorus from the environment).  Call it only
// under a PMIx launcher (PMIX_NAMESPACE is set).  nullopt with *why_not set
// when PMIx cannot serve: chorus built without PMIx headers, libpmix not loadable, or a
// namespace whose size is not world_size (then not every process would
// fence).  An error when PMIx is there but the exchange fails or times out.
// `instance` tells apart this process's successive inits (a key each).
Result<std::optional<LauncherSecret>> secretFromLauncher(int world_size, int instance,
                                                         std::chrono::milliseconds timeout, std::string* why_not);

}  // namespace chorus::bootstrap
