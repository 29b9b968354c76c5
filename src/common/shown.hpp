// Untrusted text in messages.
#pragma once

#include <string>
#include <string_view>

namespace chorus {

// A string from untrusted input as an error message shows it: at most 40
// bytes, every byte that is not printable ASCII (and ' and \) as \xNN.
std::string shownUntrusted(std::string_view s);

}  // namespace chorus
