// Best master clock algorithm (IEEE 1588-2008 9.3): the data set comparison
// (9.3.4, figures 27 and 28) and the state decision for an ordinary clock
// (9.3.3, figure 26), with linuxptp's reading of the "error" branches
// (bmc.c: error-1/error-2 compare equal).
//
// Pure functions over values: no clock, no sockets, no state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "clock/ptp/message.hpp"

namespace chorus::clock::ptp {

// The comparable part of an Announce (or of the local default data set D0).
struct Dataset {
  uint8_t priority1 = 128;
  ClockIdentity gm_identity{};
  ClockQuality quality;
  uint8_t priority2 = 128;
  uint16_t steps_removed = 0;
  PortIdentity sender;    // the port that sent the Announce (D0: our own port)
  PortIdentity receiver;  // the port that received it (D0: our own port)
};

enum class DatasetOrder : int {
  BBetterByTopology = -2,
  BBetter = -1,
  Equal = 0,  // identical, or the standard's error-1/error-2
  ABetter = 1,
  ABetterByTopology = 2,
};
// Figure 27: A vs B.  Different grandmasters compare by priority1, clockClass,
// clockAccuracy, offsetScaledLogVariance, priority2, then identity (lower is
// better); the same grandmaster compares topologically (figure 28).
[[nodiscard]] DatasetOrder compareDatasets(const Dataset& a, const Dataset& b);
[[nodiscard]] constexpr bool aBetter(DatasetOrder o) { return static_cast<int>(o) > 0; }

enum class Recommendation : uint8_t {
  Unchanged,  // LISTENING with no foreign master: keep waiting
  Master,     // M1 / M2 / M3
  Passive,    // P1 / P2
  Slave,      // S1
};
[[nodiscard]] std::string_view recommendationName(Recommendation r);

// Figure 26 for an ordinary clock (one port, so Ebest == Erbest).  `local` is
// D0 built from the default data set; `best_foreign` the best qualified
// foreign master on the port, if any; `listening` whether the port is in
// LISTENING (then no foreign master means "unchanged", as in linuxptp).
[[nodiscard]] Recommendation stateDecision(const Dataset& local, const std::optional<Dataset>& best_foreign,
                                           bool listening);

// The best of `candidates` by compareDatasets, nullopt when empty.
[[nodiscard]] std::optional<Dataset> bestDataset(std::span<const Dataset> candidates);

}  // namespace chorus::clock::ptp
