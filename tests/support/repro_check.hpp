// Reproducible reductions (CHORUS_REPRODUCIBLE): the per-rank checks that
// tests/unit/repro_test (ranks as threads) and chorus_collectives_main
// --repro (ranks as processes) run.  Each returns "" or what went wrong.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace chorus::testing {

// Canonical mode: every allreduce / reducescatter / reduce algorithm forced
// in turn (chorusCommSetAlgo), in and out of place, counts 1, 37 and 1500:
// fp32 and bf16 results equal bit for bit the canonical tree's sum computed
// here in float arithmetic (random inputs with cancellation and mixed
// magnitudes); avg and PreMulSum equal across algorithms.
std::string canonicalRank(int rank, int nranks, chorusComm_t comm);

// The float tree sum of canonicalRank's inputs at element i (for controls).
float canonInput(int rank, uint64_t i);

// Exact mode: results by (dtype, collective, spec) compared across
// communicator sizes (rank 0's allreduce bits).
struct ExactResults {
  std::mutex mu;
  std::map<std::string, std::vector<uint64_t>> first;
  std::string record(const std::string& key, std::vector<uint64_t> bits, int n);
};
inline constexpr int kExactSpecs = 8;
// Exact mode: five addends per element placed on the ranks by a permutation
// fixed by the size (the other ranks add zeros), every float type, eight
// algorithm choices (the tuner's, five forced word plans, the two exact
// plans forced): allreduce results are the correctly rounded sum (the
// independent reference of exact_reference.hpp), reducescatter blocks equal
// the allreduce's bits; with `results`, also equal across sizes.
std::string exactRank(int rank, int nranks, chorusComm_t comm, ExactResults* results);
inline constexpr int kExactTypeCount = 6;

}  // namespace chorus::testing
