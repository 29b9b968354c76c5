// chorus-tune: measures this machine's cost-model parameters and writes the
// calibration profile the tuner reads (tune/cost_model.hpp).
//
// Run as a job (chorus-tune launches it): every registered transport's latency,
// per-message overhead and bandwidth (from ring rounds and message bursts), the
// per-call overhead of a one-rank collective, the reduction throughput of every
// data type, and then the measured correction of every algorithm of the chosen
// collectives at this rank count.  Medians of repeated runs.
#pragma once

#include <chorus/chorus.h>

#include <optional>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/status.hpp"
#include "tune/cost_model.hpp"

namespace chorus::tools {

struct TuneOptions {
  int reps = 7;                       // repetitions per figure (median)
  size_t big_bytes = 32u << 20;       // the out-of-cache bandwidth message
  // The transports whose link figures (α, β, o) are measured, each on a
  // communicator of the job's ranks forced onto it (CHORUS_TRANSPORT), by
  // registered name (chorus-tune: every registered one); empty: only the
  // job's own communicator's.  One that cannot reach every rank of the job
  // is skipped with a note.
  std::vector<std::string> transports;
  // Measured corrections (tune::Correction): every algorithm of each of these
  // collectives, out of place, float32, at 16 B x 4^k up to max_bytes, the
  // median of correction_reps sweeps.  Empty: none.
  std::vector<std::string> collectives = {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast"};
  uint64_t max_bytes = 64u << 20;
  int correction_reps = 3;
  // The α-β-γ figures are measured in passes until two in a row agree
  // within `agree` (relative) on every figure, at most `max_passes`; the
  // profile records the passes and, when they never agreed, which figures
  // moved (the machine was unstable).  1: one pass, no check.
  int max_passes = 4;
  double agree = 0.10;
  // Keep this profile's figures and only add the corrections of this job's
  // rank count (chorus-tune --np 2,4 runs one job per count).
  std::optional<tune::CostProfile> base;
  // The job's configuration (chorus-tune: api::configFromEnv()); the TCP and
  // calibration communicators are made from variants of it.
  Config config;
};

// Collective over the job the process belongs to (chorusCommInitFromEnv).
// Returns the profile on every rank.
Result<tune::CostProfile> measureProfile(const TuneOptions& o);

// The figures of two passes that differ by more than `agree` (relative to
// the smaller), as "name a -> b (+x %)"; empty when every figure agrees.
// Every transport's link figures that both profiles have are compared.
std::vector<std::string> disagreeingFigures(const tune::CostProfile& a, const tune::CostProfile& b, double agree);

}  // namespace chorus::tools
