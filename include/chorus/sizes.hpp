// The element counts a collective requires of its buffers: one set of rules
// for every binding that sees whole buffers (chorus.hpp, the Python module,
// the torch backend), so a short buffer is an error naming both sizes before
// any communication, never an overrun.  The C API cannot know a pointer's
// size; it checks what it can (null pointers, counts, vectors).
//
// Each check returns "" when the sizes fit, else the message.  Names are the
// caller's (e.g. "recv.size()" in C++, "recv.size" in Python).  Header-only,
// C++17, no dependencies: it is installed with chorus.hpp.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace chorus::sizes {

namespace detail {
inline std::string head(std::string_view fn) { return std::string(fn) + ": "; }
inline std::string kv(std::string_view name, size_t v) { return std::string(name) + "=" + std::to_string(v); }
}  // namespace detail

// a == b.
inline std::string equal(std::string_view fn, std::string_view a, size_t na, std::string_view b, size_t nb) {
  if (na == nb) return {};
  return detail::head(fn) + detail::kv(a, na) + " but " + detail::kv(b, nb) + " (they must be equal)";
}

// big == small * nranks, checked without overflow.
inline std::string multiple(std::string_view fn, std::string_view big, size_t nbig, std::string_view small,
                            size_t nsmall, int nranks) {
  const auto n = static_cast<size_t>(nranks < 1 ? 1 : nranks);
  if (nbig % n == 0 && nbig / n == nsmall) return {};
  const bool overflows = nsmall != 0 && n > static_cast<size_t>(-1) / nsmall;
  return detail::head(fn) + detail::kv(big, nbig) + " but " + detail::kv(small, nsmall) + " x " +
         std::to_string(n) + " ranks = " + (overflows ? std::string("more than 2^64") : std::to_string(nsmall * n)) +
         " elements are required";
}

// x is a multiple of nranks (an all-to-all's blocks).
inline std::string divisible(std::string_view fn, std::string_view a, size_t na, int nranks) {
  const auto n = static_cast<size_t>(nranks < 1 ? 1 : nranks);
  if (na % n == 0) return {};
  return detail::head(fn) + detail::kv(a, na) + " is not a multiple of the communicator size " + std::to_string(n);
}

// counts and displs have nranks entries each and block i (displs[i],
// counts[i]) lies inside a buffer of `buf` elements.
inline std::string vector(std::string_view fn, std::string_view cn, const size_t* counts, size_t ncounts,
                          std::string_view dn, const size_t* displs, size_t ndispls, std::string_view bn, size_t buf,
                          int nranks) {
  const auto n = static_cast<size_t>(nranks < 1 ? 1 : nranks);
  if (ncounts != n || ndispls != n)
    return detail::head(fn) + std::string(cn) + " has " + std::to_string(ncounts) + " entries and " +
           std::string(dn) + " " + std::to_string(ndispls) + "; both must have one per rank (" + std::to_string(n) +
           ")";
  for (size_t i = 0; i < n; ++i)
    if (counts[i] != 0 && (displs[i] > buf || counts[i] > buf - displs[i]))
      return detail::head(fn) + "block " + std::to_string(i) + " (" + std::string(dn) + "[" + std::to_string(i) +
             "]=" + std::to_string(displs[i]) + ", " + std::string(cn) + "[" + std::to_string(i) +
             "]=" + std::to_string(counts[i]) + ") ends past " + detail::kv(bn, buf);
  return {};
}

}  // namespace chorus::sizes
