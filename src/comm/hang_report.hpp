// `chorus-trace hang`: reads the flight recorders a job's ranks dumped to
// CHORUS_FLIGHT_DIR and says who waits where, as a timeout does at run time.
#pragma once

#include <string>

#include "common/status.hpp"

namespace chorus {

// The report for every flight-*.json file in dir.  Errors name the file.
Result<std::string> hangReport(const std::string& dir);

}  // namespace chorus
