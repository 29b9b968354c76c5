// chorus-tune's command line: what its main does between parsing the options
// and measuring.
//
// The main (tools/chorus-tune.cpp) defines the CLI11 options into a TuneArgs;
// tuneOptionsFromArgs checks them into the measurement's TuneOptions.  Outside
// a job, launchTuneJobs runs one job of chorus-tune per rank count of --np;
// a rank runs runTuneRank (the measurement; rank 0 writes the profile).
#pragma once

#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/status.hpp"
#include "toolkit/tune.hpp"

namespace chorus::tools {

// The options of chorus-tune as its main parses them (the flag of each in its
// comment), with the main's defaults.
struct TuneArgs {
  std::string np = "2";   // --np: rank counts, comma-separated
  std::string output;     // -o (the main's default: the job's tune.profile_path)
  int reps = 7;           // --reps
  std::string transports = "all";  // --transports
  bool no_tcp = false;    // --no-tcp
  std::string collectives = "allreduce,allgather,reducescatter,alltoall,broadcast";  // --collectives, or "none"
  std::string max_bytes = "64M";  // --max-bytes
  int correction_reps = 3;        // --correction-reps
  bool append = false;            // --append
  int passes = 4;                 // --passes
  double agree = 0.10;            // --agree
};

// The measurement's options (all but `config` and `base`): --transports names
// registered transports (less tcp with --no-tcp), --collectives priced
// collectives, --max-bytes a size of at least 16 bytes.  Every error is a
// usage error (chorusInvalidUsage: chorus-tune exits 2) whose message is what
// chorus-tune prints.
Result<TuneOptions> tuneOptionsFromArgs(const TuneArgs& a);

// --np: "2,4" -> {2, 4}; empty unless every item is a rank count in [2, 64].
std::vector<int> parseRankCounts(const std::string& text);

// Outside a job: one job of this program (argv) per rank count of a.np, in
// turn, the later ones adding --append (unless given) so that they add their
// corrections to the profile the first wrote.  Returns the exit status: 2 for
// a bad --np, 1 when a job could not start, else the first failing job's.
int launchTuneJobs(const TuneArgs& a, int argc, char** argv);

// As a rank of a job: --append's base profile (read from a.output), the
// measurement (o.config is the job's configuration), and on rank 0 the profile
// written to a.output and printed.  Returns the exit status (0, or 1).
int runTuneRank(TuneOptions o, const TuneArgs& a, bool rank0);

}  // namespace chorus::tools
