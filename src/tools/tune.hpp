// chorus-tune: measures this machine's cost-model parameters and writes the
// calibration profile the tuner reads (tune/cost_model.hpp).
//
// Run as a job of two ranks (chorus-tune launches it): shared memory and TCP
// latency (half the round trip of an 8-byte message) and bandwidth (large
// one-way messages), the per-call overhead of a one-rank collective, and the
// reduction throughput of every data type.  Medians of repeated runs.
#pragma once

#include <chorus/chorus.h>

#include <string>

#include "common/status.hpp"
#include "tune/cost_model.hpp"

namespace chorus::tools {

struct TuneOptions {
  int reps = 7;                       // repetitions per figure (median)
  size_t big_bytes = 32u << 20;       // the out-of-cache bandwidth message
  bool tcp = true;                    // also measure TCP (a second communicator)
};

// Collective over the job the process belongs to (chorusCommInitFromEnv).
// Returns the profile on every rank.
Result<tune::CostProfile> measureProfile(const TuneOptions& o);

}  // namespace chorus::tools
