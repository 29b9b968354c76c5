#include "clock/ptp/bmca.hpp"

namespace chorus::clock::ptp {
namespace {

// Figure 28: same grandmaster, compare by topology.
DatasetOrder compareTopology(const Dataset& a, const Dataset& b) {
  const unsigned sa = a.steps_removed;
  const unsigned sb = b.steps_removed;
  if (sa + 1 < sb) return DatasetOrder::ABetter;
  if (sb + 1 < sa) return DatasetOrder::BBetter;
  if (sa < sb) {
    // B is one step further: it is worse unless it came through us.
    if (b.receiver < b.sender) return DatasetOrder::ABetter;
    if (b.sender < b.receiver) return DatasetOrder::ABetterByTopology;
    return DatasetOrder::Equal;  // error-1
  }
  if (sa > sb) {
    if (a.receiver < a.sender) return DatasetOrder::BBetter;
    if (a.sender < a.receiver) return DatasetOrder::BBetterByTopology;
    return DatasetOrder::Equal;  // error-1
  }
  if (a.sender < b.sender) return DatasetOrder::ABetterByTopology;
  if (b.sender < a.sender) return DatasetOrder::BBetterByTopology;
  if (a.receiver.port < b.receiver.port) return DatasetOrder::ABetterByTopology;
  if (a.receiver.port > b.receiver.port) return DatasetOrder::BBetterByTopology;
  return DatasetOrder::Equal;  // error-2
}

}  // namespace

DatasetOrder compareDatasets(const Dataset& a, const Dataset& b) {
  if (a.gm_identity == b.gm_identity) return compareTopology(a, b);
  auto lower = [](auto x, auto y) { return x < y ? DatasetOrder::ABetter : DatasetOrder::BBetter; };
  if (a.priority1 != b.priority1) return lower(a.priority1, b.priority1);
  if (a.quality.clock_class != b.quality.clock_class) return lower(a.quality.clock_class, b.quality.clock_class);
  if (a.quality.clock_accuracy != b.quality.clock_accuracy)
    return lower(a.quality.clock_accuracy, b.quality.clock_accuracy);
  if (a.quality.offset_scaled_log_variance != b.quality.offset_scaled_log_variance)
    return lower(a.quality.offset_scaled_log_variance, b.quality.offset_scaled_log_variance);
  if (a.priority2 != b.priority2) return lower(a.priority2, b.priority2);
  return lower(a.gm_identity, b.gm_identity);
}

std::string_view recommendationName(Recommendation r) {
  switch (r) {
    case Recommendation::Unchanged: return "unchanged";
    case Recommendation::Master: return "master";
    case Recommendation::Passive: return "passive";
    case Recommendation::Slave: return "slave";
  }
  return "?";
}

Recommendation stateDecision(const Dataset& local, const std::optional<Dataset>& best_foreign, bool listening) {
  if (!best_foreign) return listening ? Recommendation::Unchanged : Recommendation::Master;
  const DatasetOrder o = compareDatasets(local, *best_foreign);
  if (local.quality.clock_class <= 127)  // M1 / P1: a primary clock never follows
    return aBetter(o) ? Recommendation::Master : Recommendation::Passive;
  if (aBetter(o)) return Recommendation::Master;  // M2
  // One port: Ebest is this port's Erbest, so S1.
  return Recommendation::Slave;
}

std::optional<Dataset> bestDataset(std::span<const Dataset> candidates) {
  std::optional<Dataset> best;
  for (const Dataset& d : candidates)
    if (!best || aBetter(compareDatasets(d, *best))) best = d;
  return best;
}

}  // namespace chorus::clock::ptp
