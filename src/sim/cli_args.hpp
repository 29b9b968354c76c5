// The ranges of chorus-sim's command-line values, checked before anything is
// simulated: each message names the flag, the value and the rule (a negative
// batch or a zero sequence length would otherwise print a nonsense answer).
#pragma once

#include <cmath>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "plan/plan.hpp"
#include "sim/infer.hpp"
#include "sim/search.hpp"
#include "sim/train.hpp"

namespace chorus::sim {

// `flag` = v must lie in [lo, hi]; `what` says what the value counts.
template <typename T>
Status checkRange(std::string_view flag, T v, T lo, T hi, std::string_view what) {
  if (!(v >= lo && v <= hi))  // also refuses NaN
    return invalidArgument("{} {}: must be in [{}, {}] ({})", flag, v, lo, hi, what);
  return {};
}

Status checkCollectiveArgs(int64_t gpus, double bytes);
// --algo naming a plan loaded from a file (--plan): the file serves one rank
// count, which --gpus must be (the message names both and the file).
Status checkPlanRanks(const plan::Registry& reg, std::string_view collective, std::string_view algo, int64_t gpus);
Status checkTrainArgs(const TrainConfig& c);
Status checkSearchArgs(const SearchConfig& c);
// --concurrency: "N" or a sweep "1,2,4,8"; every entry at least 1.
Result<std::vector<int64_t>> parseConcurrency(std::string_view text);
// --rate: "R", a list "1,2,4" or a range "MIN:MAX" (doubling, as --bytes) or
// "MIN:MAX:STEP" (linear); every rate positive.
Result<std::vector<double>> parseRates(std::string_view text);
// --micro-batch: a positive integer, or "auto" (returned as 0).
Result<int64_t> parseMicroBatch(std::string_view text);

}  // namespace chorus::sim
