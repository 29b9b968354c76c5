// The one size grammar of every chorus tool (chorus-bench -b/-e/-i,
// chorus-tune --max-bytes, chorus-sim --bytes, ...).
//
//   SIZE   := NUMBER [SUFFIX]
//   NUMBER := digits, optionally with a fraction ("1.5"); the product must be a
//             whole number of bytes ("0.5K" = 512 is fine, "1.1K" is an error)
//   SUFFIX := B | K | KB | KiB | M | MB | MiB | G | GB | GiB | T | TB | TiB,
//             in any letter case ("8k", "8K", "8kb", "8KiB" are all 8192)
//
// Every multiple is BINARY (powers of 1024), whatever the spelling: 64M = 64MB
// = 64MiB = 67108864 bytes.  This is nccl-tests' convention (its -b/-e read
// K/M/G as 1024-multiples), which the users of these tools type; reading "MB"
// as 10^6 beside "M" as 2^20 would make two spellings a user means alike
// differ by 5%.  Bandwidths are a different matter: GB/s in the tables are
// 10^9 bytes per second, as nccl-tests prints them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace chorus {

// Bytes of a size written in the grammar above.  what names the flag or key
// in error messages ("-b", "--bytes"); the message also gives the value and
// the rule.
Result<uint64_t> parseSize(std::string_view text, std::string_view what = "size");

// The grammar in one line, for --help texts.
inline constexpr std::string_view kSizeGrammarHelp =
    "bytes, or with a binary suffix K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (any case; all powers of 1024, as "
    "nccl-tests): 8k = 8KiB = 8192";

}  // namespace chorus
