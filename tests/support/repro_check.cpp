#include "support/repro_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "support/exact_reference.hpp"

namespace chorus::testing {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// ---- canonical -----------------------------------------------------------------

// Rank r's element i: mixed magnitudes (2^-24 .. 2^24), and every third
// element carries +-1e6 of alternating sign across ranks (cancellation).
float canonInput(int r, uint64_t i) {
  const uint64_t h = mix(uint64_t(r) << 40 ^ i);
  float v = std::ldexp(1.0f + static_cast<float>((h >> 8) & 0xffff) / 65536.0f, static_cast<int>(h % 49) - 24);
  if (h >> 63) v = -v;
  if (i % 3 == 0) v += (r % 2 ? -1.0e6f : 1.0e6f);
  return v;
}

namespace {

// The canonical tree's sum over ranks [lo, hi) (plan/canonical.hpp's rule,
// restated): left [lo, mid), right [mid, hi), mid = lo + ceil((hi - lo) / 2).
float treeSum(int lo, int hi, uint64_t i) {
  if (hi - lo == 1) return canonInput(lo, i);
  const int mid = lo + (hi - lo + 1) / 2;
  return treeSum(lo, mid, i) + treeSum(mid, hi, i);
}

// bf16 with the test's own rounding (nearest, ties to even; no NaN here).
uint16_t toBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float fromBf16(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }
uint16_t treeSumBf16(int lo, int hi, uint64_t i) {
  if (hi - lo == 1) return toBf16(canonInput(lo, i));
  const int mid = lo + (hi - lo + 1) / 2;
  return toBf16(fromBf16(treeSumBf16(lo, mid, i)) + fromBf16(treeSumBf16(mid, hi, i)));
}

const char* kCanonSpecs[] = {"",  // the tuner's choice
                             "allreduce:ring",         "allreduce:recursive_doubling", "allreduce:rabenseifner",
                             "allreduce:double_tree",  "allreduce:direct",             "allreduce:hierarchical",
                             "allreduce:oneshot",      "reducescatter:ring",           "reducescatter:recursive_halving",
                             "reducescatter:oneshot",  "reduce:binomial"};

std::string firstDiff(const char* what, const void* got, const void* want, size_t n, size_t es) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(static_cast<const char*>(got) + i * es, static_cast<const char*>(want) + i * es, es) != 0) {
      double g = 0, w = 0;
      if (es == 4) {
        g = static_cast<const float*>(got)[i];
        w = static_cast<const float*>(want)[i];
      } else {
        g = fromBf16(static_cast<const uint16_t*>(got)[i]);
        w = fromBf16(static_cast<const uint16_t*>(want)[i]);
      }
      return fmt::format("{}: element {} is {:.9g}, the canonical sum is {:.9g}", what, i, g, w);
    }
  return "";
}

}  // namespace

// One rank's pass over every spec, in and out of place, for a few counts.
std::string canonicalRank(int r, int n, chorusComm_t comm) {
  // Avg and PreMulSum results of the first spec, compared with the others'.
  std::map<std::pair<int, size_t>, std::vector<float>> avg_first, pre_first;
  chorusRedOp_t premul;
  float scalar = 0.7f;
  if (chorusRedOpCreatePreMulSum(&premul, &scalar, chorusFloat32, chorusScalarHostImmediate, comm) != chorusSuccess)
    return fmt::format("rank {}: PreMulSum: {}", r, chorusGetLastError(comm));
  auto call = [&](chorusResult_t res, const std::string& what) -> std::string {
    return res == chorusSuccess ? "" : fmt::format("rank {}: {}: {}", r, what, chorusGetLastError(comm));
  };
  for (const char* spec : kCanonSpecs) {
    if (chorusCommSetAlgo(comm, spec) != chorusSuccess)
      return fmt::format("rank {}: set algo '{}': {}", r, spec, chorusGetLastError(comm));
    for (int inplace = 0; inplace < 2; ++inplace)
      for (size_t count : {size_t{1}, size_t{37}, size_t{1500}}) {
        const std::string what = fmt::format("rank {} of {}, '{}', count {}{}", r, n, spec, count, inplace ? ", in place" : "");
        // allreduce, sum
        std::vector<float> in(count), out(count), want(count);
        for (size_t i = 0; i < count; ++i) {
          in[i] = canonInput(r, i);
          want[i] = treeSum(0, n, i);
        }
        if (inplace) out = in;
        std::string e = call(chorusAllReduce(inplace ? out.data() : in.data(), out.data(), count, chorusFloat32,
                                             chorusSum, comm, nullptr), what);
        if (e.empty()) e = firstDiff(("allreduce " + what).c_str(), out.data(), want.data(), count, 4);
        if (!e.empty()) return e;
        // reducescatter: block r of the n-block vector
        std::vector<float> rin(count * n), rout(count);
        for (size_t i = 0; i < rin.size(); ++i) rin[i] = canonInput(r, i);
        float* rs_out = inplace ? rin.data() + static_cast<size_t>(r) * count : rout.data();
        e = call(chorusReduceScatter(rin.data(), rs_out, count, chorusFloat32, chorusSum, comm, nullptr), what);
        for (size_t i = 0; i < count && e.empty(); ++i) want[i] = treeSum(0, n, static_cast<size_t>(r) * count + i);
        if (e.empty()) e = firstDiff(("reducescatter " + what).c_str(), rs_out, want.data(), count, 4);
        if (!e.empty()) return e;
        // reduce at a root that moves with the count
        const int root = static_cast<int>(count % n);
        std::vector<float> din(count), dout(count);
        for (size_t i = 0; i < count; ++i) {
          din[i] = canonInput(r, i);
          want[i] = treeSum(0, n, i);
        }
        e = call(chorusReduce(din.data(), inplace ? din.data() : dout.data(), count, chorusFloat32, chorusSum, root,
                              comm, nullptr), what);
        if (e.empty() && r == root)
          e = firstDiff(("reduce " + what).c_str(), inplace ? din.data() : dout.data(), want.data(), count, 4);
        if (!e.empty()) return e;
        // bf16 allreduce: every operation rounds to bf16, in tree order
        std::vector<uint16_t> bin(count), bout(count), bwant(count);
        for (size_t i = 0; i < count; ++i) {
          bin[i] = toBf16(canonInput(r, i));
          bwant[i] = treeSumBf16(0, n, i);
        }
        if (inplace) bout = bin;
        e = call(chorusAllReduce(inplace ? bout.data() : bin.data(), bout.data(), count, chorusBfloat16, chorusSum,
                                 comm, nullptr), what);
        if (e.empty()) e = firstDiff(("bf16 allreduce " + what).c_str(), bout.data(), bwant.data(), count, 2);
        if (!e.empty()) return e;
        // a group of two allreduces (one batch of jobs, never the board)
        std::vector<float> g1(count), g2(count);
        e = call(chorusGroupStart(), what);
        if (e.empty()) e = call(chorusAllReduce(in.data(), g1.data(), count, chorusFloat32, chorusSum, comm, nullptr), what);
        if (e.empty()) e = call(chorusAllReduce(in.data(), g2.data(), count, chorusFloat32, chorusSum, comm, nullptr), what);
        if (e.empty()) e = call(chorusGroupEnd(), what);
        for (size_t i = 0; i < count && e.empty(); ++i) want[i] = treeSum(0, n, i);
        if (e.empty()) e = firstDiff(("grouped allreduce " + what).c_str(), g1.data(), want.data(), count, 4);
        if (e.empty()) e = firstDiff(("grouped allreduce " + what).c_str(), g2.data(), want.data(), count, 4);
        if (!e.empty()) return e;
        // avg and PreMulSum: bitwise equal across specs
        for (int which = 0; which < 2; ++which) {
          std::vector<float> o(count);
          if (inplace) o = in;
          e = call(chorusAllReduce(inplace ? o.data() : in.data(), o.data(), count, chorusFloat32,
                                   which ? premul : chorusAvg, comm, nullptr), what);
          if (!e.empty()) return e;
          auto& first = (which ? pre_first : avg_first)[{inplace, count}];
          if (first.empty()) first = o;
          if (std::memcmp(first.data(), o.data(), count * 4) != 0)
            return fmt::format("{} {}: differs from the first algorithm's result", which ? "premulsum" : "avg", what);
        }
      }
  }
  return "";
}

// ---- exact -----------------------------------------------------------------------

namespace {

constexpr int kAddends = 5;  // nonzero addends per element; the other ranks add zeros
constexpr size_t kExactCount = 300;

// Addend j (< kAddends) of element i in dtype d, as raw bits: random
// magnitudes over much of the type's range, with cancellation (addend 1 is
// the negation of addend 0 in every fourth element, nearly so in others).
uint64_t exactAddend(chorusDataType_t d, int j, uint64_t i) {
  const int sign = exactSignBit(d);
  const uint64_t mask = sign == 63 ? ~0ull : (uint64_t{2} << sign) - 1;
  const double limit = d == chorusFloat64 ? 1e300 : d == chorusFloat32 || d == chorusBfloat16 ? 1e37
                       : d == chorusFloat16 ? 2000 : d == chorusFloat8e4m3 ? 14 : 1792;
  if (j == 1 && i % 4 != 3) {
    const uint64_t b0 = exactAddend(d, 0, i) ^ (uint64_t{1} << sign);
    return i % 4 == 0 || (b0 & ((uint64_t{1} << sign) - 1)) == 0 ? b0 : b0 - 1;
  }
  for (uint64_t k = 0;; ++k) {
    uint64_t b = mix(uint64_t(d) << 56 ^ uint64_t(j) << 48 ^ i << 8 ^ k) & mask;
    if (d == chorusFloat64) {  // exponents near 1 mostly: cancellation then shows
      const uint64_t ex = (b >> 52 & 3) == 0 ? (b >> 20) % 2046 : 1023 - 40 + (b >> 20) % 80;
      b = (b & 0x800fffffffffffffull) | (ex << 52);
    }
    const double v = exactDecode(d, b);
    if (std::isfinite(v) && std::fabs(v) < limit) return b;
  }
}

// Which addend rank r of n holds (a permutation fixed by n): placement varies.
int slotOf(int r, int n) {
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(static_cast<unsigned>(n) * 7919u);
  std::shuffle(perm.begin(), perm.end(), rng);
  return perm[static_cast<size_t>(r)];
}

const chorusDataType_t kExactTypes[] = {chorusFloat32, chorusBfloat16, chorusFloat16,
                                        chorusFloat8e4m3, chorusFloat8e5m2, chorusFloat64};
size_t sizeOf(chorusDataType_t d) { return exactSignBit(d) / 8 + 1; }

void putBits(std::vector<unsigned char>& buf, size_t i, size_t es, uint64_t bits) {
  std::memcpy(buf.data() + i * es, &bits, es);
}
uint64_t getBits(const unsigned char* buf, size_t i, size_t es) {
  uint64_t b = 0;
  std::memcpy(&b, buf + i * es, es);
  return b;
}

}  // namespace

std::string ExactResults::record(const std::string& key, std::vector<uint64_t> bits, int n) {
  std::lock_guard l(mu);
  auto [it, fresh] = first.try_emplace(key, bits);
  if (!fresh && it->second != bits) return fmt::format("{} with {} ranks differs from an earlier size", key, n);
  return "";
}

// Narrow data (the accumulator's one-word layout after the ranks agree on
// the exponents): 16 significant bits within 8 binades, with cancellation.
std::string exactNarrow(int r, int n, chorusComm_t comm, ExactResults* results) {
  const int slot = slotOf(r, n);
  auto addend = [](int j, uint64_t i) -> double {
    const uint64_t h = mix(uint64_t(j) << 32 ^ i ^ 0x5eed);
    const double v = std::ldexp(static_cast<double>((h & 0xffff) | 0x8000), static_cast<int>(h >> 16 & 7) - 20);
    return j == 1 && i % 2 == 0 ? -std::ldexp(static_cast<double>((mix(i ^ 0x5eed) & 0xffff) | 0x8000),
                                              static_cast<int>(mix(i ^ 0x5eed) >> 16 & 7) - 20)
           : (h >> 40 & 1)      ? -v
                                : v;
  };
  std::vector<float> in(kExactCount), out(kExactCount);
  for (size_t i = 0; i < kExactCount; ++i) in[i] = slot < kAddends ? static_cast<float>(addend(slot, i)) : 0.0f;
  if (chorusAllReduce(in.data(), out.data(), kExactCount, chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess)
    return fmt::format("narrow float32 allreduce rank {} of {}: {}", r, n, chorusGetLastError(comm));
  std::vector<uint64_t> got(kExactCount);
  for (size_t i = 0; i < kExactCount; ++i) {
    got[i] = std::bit_cast<uint32_t>(out[i]);
    std::vector<double> addends;
    for (int j = 0; j < kAddends; ++j) addends.push_back(static_cast<float>(addend(j, i)));
    if (std::string why = exactCheck(chorusFloat32, addends, got[i]); !why.empty())
      return fmt::format("narrow float32 allreduce rank {} of {} element {}: {}", r, n, i, why);
  }
  if (r == 0 && results != nullptr) return results->record("allreduce narrow float32", got, n);
  return "";
}

std::string exactRank(int r, int n, chorusComm_t comm, ExactResults* results) {
  if (std::string e = exactNarrow(r, n, comm, results); !e.empty()) return e;
  const int slot = slotOf(r, n);
  for (chorusDataType_t d : kExactTypes) {
    const size_t es = sizeOf(d);
    for (const char* spec : {"", "allreduce:ring", "allreduce:oneshot", "allreduce:recursive_doubling",
                             "allreduce:direct", "reducescatter:ring", "allreduce:exact_ring",
                             "reducescatter:exact_ring"}) {
      if (chorusCommSetAlgo(comm, spec) != chorusSuccess) return chorusGetLastError(comm);
      const std::string what = fmt::format("'{}' rank {} of {}", spec, r, n);
      // allreduce, in place on odd ranks' counts: every element summed once
      std::vector<unsigned char> in(kExactCount * es), out(kExactCount * es);
      for (size_t i = 0; i < kExactCount; ++i) putBits(in, i, es, slot < kAddends ? exactAddend(d, slot, i) : 0);
      const bool inplace = n % 2 == 1;
      if (inplace) out = in;
      if (chorusAllReduce(inplace ? out.data() : in.data(), out.data(), kExactCount, d, chorusSum, comm, nullptr) !=
          chorusSuccess)
        return fmt::format("dtype {} {}: {}", int(d), what, chorusGetLastError(comm));
      std::vector<uint64_t> got(kExactCount);
      for (size_t i = 0; i < kExactCount; ++i) {
        got[i] = getBits(out.data(), i, es);
        std::vector<double> addends;
        for (int j = 0; j < kAddends; ++j) addends.push_back(exactDecode(d, exactAddend(d, j, i)));
        if (std::string why = exactCheck(d, addends, got[i]); !why.empty())
          return fmt::format("dtype {} allreduce {} element {}: {}", int(d), what, i, why);
      }
      if (r == 0 && results != nullptr) {
        if (std::string e = results->record(fmt::format("allreduce {} {}", int(d), spec), got, n); !e.empty()) return e;
      }
      // reducescatter: block b of the vector is elements b * c .. of the addends
      const size_t c = kExactCount / 4;
      std::vector<unsigned char> rin(c * n * es), rout(c * es);
      for (size_t i = 0; i < c * n; ++i) putBits(rin, i, es, slot < kAddends ? exactAddend(d, slot, i % kExactCount) : 0);
      if (chorusReduceScatter(rin.data(), rout.data(), c, d, chorusSum, comm, nullptr) != chorusSuccess)
        return fmt::format("dtype {} reducescatter {}: {}", int(d), what, chorusGetLastError(comm));
      for (size_t i = 0; i < c; ++i) {
        const uint64_t at = (static_cast<uint64_t>(r) * c + i) % kExactCount;
        if (getBits(rout.data(), i, es) != got[at])
          return fmt::format("dtype {} reducescatter {} element {}: not the allreduce's bits", int(d), what, i);
      }
      // reduce at the last rank, in place there: the allreduce's bits
      const int root = n - 1;
      std::vector<unsigned char> din(in), dout(kExactCount * es);
      for (size_t i = 0; i < kExactCount; ++i) putBits(din, i, es, slot < kAddends ? exactAddend(d, slot, i) : 0);
      unsigned char* dst = r == root ? din.data() : dout.data();
      if (chorusReduce(din.data(), dst, kExactCount, d, chorusSum, root, comm, nullptr) != chorusSuccess)
        return fmt::format("dtype {} reduce {}: {}", int(d), what, chorusGetLastError(comm));
      for (size_t i = 0; i < kExactCount && r == root; ++i)
        if (getBits(dst, i, es) != got[i])
          return fmt::format("dtype {} reduce {} element {}: not the allreduce's bits", int(d), what, i);
    }
  }
  return "";
}


}  // namespace chorus::testing
