// The one table of CHORUS_* environment knobs.
//
// Every knob is declared once, in env.cpp, with its default and meaning;
// `chorus-run --print-env` lists them.  Reading a knob that is not in the
// table is a programming error (asserted), so the table cannot drift from the
// code.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace chorus::env {

struct Knob {
  std::string_view name;
  std::string_view default_value;  // "" = unset
  std::string_view meaning;
};

// All knobs, in documentation order.
std::span<const Knob> knobs();
// The table's entry for name, or nullptr.
const Knob* findKnob(std::string_view name);

// The readers below are for the API layer (api/config.cpp) and bootstrap's
// job-environment reader only: the rest of the library receives chorus::Config
// (common/config.hpp).  tests/check_env_reads.sh fails the build's tests when
// another file calls them.

// Raw value: the environment's, else nullopt (the default is not applied).
std::optional<std::string> raw(std::string_view name);
// The environment's value, else the declared default.
std::string getString(std::string_view name);
// Parsed integer; a malformed value is an error naming the knob.
Result<int64_t> getInt(std::string_view name);
// 1/true/yes/on vs 0/false/no/off.
Result<bool> getBool(std::string_view name);

// Any environment variable (not only CHORUS_*), for torchrun/MPI/Slurm detection.
std::optional<std::string> getAny(const char* name);

}  // namespace chorus::env
