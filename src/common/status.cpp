#include "common/status.hpp"

#include <cstring>

namespace chorus {

Status errnoError(std::string_view what, int err) {
  char buf[128];
  const char* msg = strerror_r(err, buf, sizeof buf);  // GNU variant
  return makeError(chorusSystemError, "{}: {} (errno {})", what, msg, err);
}

}  // namespace chorus
