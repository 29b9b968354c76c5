#include "common/status.hpp"
#include "common/shown.hpp"

#include <algorithm>
#include <cstring>

namespace chorus {

Status errnoError(std::string_view what, int err) {
  char buf[128];
  const char* msg = strerror_r(err, buf, sizeof buf);  // GNU variant
  return makeError(chorusSystemError, "{}: {} (errno {})", what, msg, err);
}

std::string shownUntrusted(std::string_view t) {
  std::string s;
  const size_t n = std::min<size_t>(t.size(), 40);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(t[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
      s += static_cast<char>(c);
    else
      s += fmt::format("\\x{:02x}", c);
  }
  if (t.size() > n) s += "...";
  return s;
}

}  // namespace chorus
