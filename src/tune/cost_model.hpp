// The α-β-γ cost model the tuner prices plans with.
//
// For a link class (shared memory inside a host, TCP between hosts) a message
// of b bytes costs α + b·β, and reducing b bytes costs b·γ(dtype).  A plan is
// priced from its rounds (plan::Round): each round costs the slowest of its
// messages — α and β of the link the message crosses, plus γ when the
// receiver reduces it — and rounds run one after another.  Pipelined plans
// report one round per slice, so α is paid per slice and bandwidth once.
//
// The numbers come from a calibration profile written by chorus-tune
// (default ~/.cache/chorus/profile.json, CHORUS_TUNE_FILE overrides), or from
// built-in defaults measured on a 2-core x86 VM (docs/algorithms.md).
#pragma once

#include <chorus/chorus.h>

#include <array>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "plan/plan.hpp"

namespace chorus::tune {

struct LinkCost {
  double alpha_s = 0;          // seconds per message
  double beta_s_per_byte = 0;  // seconds per byte (1 / bandwidth)
};

struct CostProfile {
  LinkCost shm{1.0e-6, 1.0 / 6.0e9};
  LinkCost tcp{15.0e-6, 1.0 / 1.5e9};
  // Seconds per byte reduced, per data type (fp16/bf16/fp8 pay the conversions).
  std::array<double, chorusNumTypes> gamma_s_per_byte{};
  double op_overhead_s = 1.5e-6;  // per call: API, plan lookup, executor set-up
  // Cores per host: when a round puts more messages on a host than it has
  // cores, they take turns (8 ranks on 2 cores).
  int cores = 1;
  std::string source = "built-in defaults";

  CostProfile();
  // Parses a profile written by chorus-tune; errors name the key.
  static Result<CostProfile> fromJson(const std::string& text);
  [[nodiscard]] std::string toJson() const;
  // CHORUS_TUNE_FILE, else ~/.cache/chorus/profile.json, else the defaults.
  // A file that exists but does not parse is an error naming it.
  static Result<CostProfile> load();
  static std::string defaultPath();
};

// host_of[r]: an identifier of rank r's host (ranks with equal ids share memory).
Result<double> predictSeconds(const plan::Algorithm& algo, const plan::Shape& shape, chorusDataType_t dtype,
                              const CostProfile& prof, const std::vector<int>& host_of);

}  // namespace chorus::tune
