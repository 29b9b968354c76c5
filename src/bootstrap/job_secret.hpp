// A job secret without the user doing anything, where one can be had safely
// (readEnvJob's fallback when CHORUS_SECRET is not set):
//
//  - CHORUS_SECRET_FILE: a file the user made (64 hex digits), owned by this
//    user and readable by nobody else; on a shared file system it serves
//    ranks on many hosts.
//  - every rank on this host (torchrun with LOCAL_WORLD_SIZE == WORLD_SIZE,
//    mpirun with OMPI_COMM_WORLD_LOCAL_SIZE == OMPI_COMM_WORLD_SIZE, a
//    one-node Slurm step, or a loopback master address): a per-job file in a
//    directory only this user can enter ($XDG_RUNTIME_DIR, else
//    /tmp/chorus-<uid>, created 0700 and checked), named by a hash of the
//    launcher's job id.  The first rank to get there writes a fresh secret
//    to a temporary file and link()s it into place (atomic: a reader sees
//    the whole file or none); the others read it.  Rank 0 removes it once
//    every rank has joined (they all read it by then).
//
// Anything that is not exactly what we would have written (another owner,
// group or other permission bits, a symlink, a wrong size, non-hex) is
// refused with an error naming the path: the secret is never read from a
// file someone else could have planted or read.
#pragma once

#include <string>

#include "bootstrap/auth.hpp"
#include "common/status.hpp"

namespace chorus::bootstrap {

struct SharedSecret {
  auth::Secret secret;
  std::string path;
  bool created = false;  // this process wrote it
};

// The private directory for per-job files: `preferred` when not empty (it
// must exist, be ours and 0700 or stricter), else /tmp/chorus-<uid>
// (created when missing, then checked the same way).
Result<std::string> privateSecretDir(const std::string& preferred);

// The per-job secret file in `dir` for `job_key` (the launcher's job id and
// the store address: every rank of one launch derives the same key).
Result<SharedSecret> sharedJobSecret(const std::string& dir, const std::string& job_key);

// A secret file the user made (CHORUS_SECRET_FILE).
Result<auth::Secret> readSecretFile(const std::string& path);

}  // namespace chorus::bootstrap
