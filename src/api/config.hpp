// The one place the library reads its CHORUS_* knobs (with bootstrap's job
// reader, bootstrap::readEnvJob, for the job's rank, size and rendezvous), and
// the internal C++ entry points that take a chorus::Config instead.
//
// The entry points are not in libchorus.so's ABI (hidden, not in chorus.map):
// tests and tools, which link the core, use them to configure a communicator
// without setenv (process-wide, and left behind when a test fails).
#pragma once

#include <chorus/chorus.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.hpp"
#include "common/status.hpp"

namespace chorus::api {

// A variable's value, nullopt when it is unset.
using Lookup = std::function<std::optional<std::string>(std::string_view name)>;

// Every knob of env::knobs() (unset or empty: the table's default) into a
// Config, each validated once, by one rule; an error names the knob, the
// value and what is accepted.  HOME (the default tuning profile's directory)
// comes from lookup too.
Result<Config> parseConfig(const Lookup& lookup);
// parseConfig over this process's environment.
Result<Config> configFromEnv();
// CHORUS_SOCKET_IFNAME alone, for chorusGetUniqueId (which must not fail on
// a knob it does not use).
std::string envSocketIfname();

// As chorusCommInitRank, configured by cfg instead of the environment.
chorusResult_t commInitRank(chorusComm_t* comm, int nranks, chorusUniqueId id, int rank, const Config& cfg);
// As chorusCommInitFromEnv (the job's rank, size and store from the
// environment), the communicator configured by cfg.
chorusResult_t commInitFromEnv(chorusComm_t* comm, const Config& cfg);
// As chorusCommSplit, the new communicator configured by cfg instead of comm's
// configuration (chorus-tune's calibration communicators).
chorusResult_t commSplit(chorusComm_t comm, int color, int key, const Config& cfg, chorusComm_t* newcomm);
// The communicator's route key (tune::routeKey: "shm", "tcp", "shm+tcp", ...)
// and the transports it uses; "" and none for an invalid handle.
std::string commRouteKey(chorusComm_t comm);
std::vector<std::string> commTransports(chorusComm_t comm);

}  // namespace chorus::api
