// libFuzzer target: the grow offer a joining process reads from the store
// (comm/communicator.hpp, parseGrowOffer) and the shrink member list
// (parseMemberList), from arbitrary bytes.
//
// Properties: no crash, no out-of-bounds access (ASan), no UB (UBSan); an
// accepted offer has 2 <= size <= 2^20, 0 <= rank < size, a prefix of
// [A-Za-z0-9/_-] of 1..256 characters, and its encoding parses back to it;
// an accepted member list is strictly increasing within 0..n-1.
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "comm/communicator.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::as_bytes(std::span(data, size));
  if (auto o = chorus::parseGrowOffer(bytes); o.isOk()) {
    bool ok = o->size >= 2 && o->size <= (1 << 20) && o->rank >= 0 && o->rank < o->size && !o->prefix.empty() &&
              o->prefix.size() <= 256;
    const std::string again = chorus::encodeGrowOffer(*o);
    auto back = chorus::parseGrowOffer(std::as_bytes(std::span(again.data(), again.size())));
    ok = ok && back.isOk() && back->size == o->size && back->rank == o->rank && back->prefix == o->prefix;
    for (char ch : o->prefix) ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '/' || ch == '_' || ch == '-');
    if (!ok) {
      std::fprintf(stderr, "grow_offer_fuzz: accepted an offer outside its bounds\n");
      std::abort();
    }
  }
  const int n = size > 0 ? data[0] % 64 + 1 : 1;
  if (auto m = chorus::parseMemberList(bytes.subspan(size > 0 ? 1 : 0), n); m.isOk()) {
    for (size_t i = 0; i < m->size(); ++i)
      if ((*m)[i] < 0 || (*m)[i] >= n || (i > 0 && (*m)[i] <= (*m)[i - 1])) {
        std::fprintf(stderr, "grow_offer_fuzz: accepted a member list outside 0..n-1 or out of order\n");
        std::abort();
      }
  }
  return 0;
}
