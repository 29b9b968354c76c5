// Exchange patterns: pairwise all-to-all(v) and the dissemination barrier.
#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

// In round k every rank sends to r + k and receives from r - k, so each rank
// talks to one peer per direction per round and no link is shared twice.
// All rounds are independent and go into flight together.  In place, a
// block may only be overwritten after it was sent, and a receive must not
// wait for a send (a large send completes only when its receiver reads it,
// so two ranks would wait on each other): blocks are received into scratch
// and copied into place once the block that was there has left.
void pairwise(int n, int r, bool inplace, ProgramBuilder& b, auto&& sendRegion, auto&& recvRegion) {
  b.copy(recvRegion(r), sendRegion(r));
  for (int k = 1; k < n; ++k) {
    const int to = mod(r + k, n);
    if (Region s = sendRegion(to); s.count) b.send(to, s);
  }
  for (int k = 1; k < n; ++k) {
    const int from = mod(r - k, n);
    Region d = recvRegion(from);
    if (d.count == 0) continue;
    if (!inplace) {
      b.recv(from, d);
      continue;
    }
    Region tmp = b.scratch(d.count);
    b.recv(from, tmp);
    b.copy(d, tmp);
  }
}

class PairwiseAllToAll final : public Algorithm {
 public:
  std::string_view name() const override { return "pairwise"; }
  Collective collective() const override { return Collective::AllToAll; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    return std::vector<Round>{{.peers = Peers::AllPairs, .elems = sh.count}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const uint64_t c = sh.count;
    if (c == 0) return;
    pairwise(sh.nranks, r, sh.inplace, b, [c](int p) { return in(p * c, c); }, [c](int p) { return out(p * c, c); });
  }
};

class PairwiseAllToAllV final : public Algorithm {
 public:
  std::string_view name() const override { return "pairwise"; }
  Collective collective() const override { return Collective::AllToAllV; }
  // Only this rank's counts are in the shape: the pattern assumes every rank
  // sends like this one (its largest block to every peer).
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    uint64_t maxc = 0;
    for (size_t c : sh.counts) maxc = std::max<uint64_t>(maxc, c);
    if (sh.nranks == 1 || maxc == 0) return std::vector<Round>{};
    return std::vector<Round>{{.peers = Peers::AllPairs, .elems = maxc}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    pairwise(
        sh.nranks, r, sh.inplace, b, [&](int p) { return in(sh.displs[p], sh.counts[p]); },
        [&](int p) { return out(sh.displs2[p], sh.counts2[p]); });
  }
};

// ceil(log2 n) rounds; in round k rank r signals r + 2^k and waits for r - 2^k.
class DisseminationBarrier final : public Algorithm {
 public:
  std::string_view name() const override { return "dissemination"; }
  Collective collective() const override { return Collective::Barrier; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    for (int k = 1; k < sh.nranks; k <<= 1) rs.push_back({.peers = Peers::Shift, .arg = k});
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    for (int k = 1; k < n; k <<= 1) {
      b.send(mod(r + k, n), Region{Buf::Scratch, 0, 0});
      b.recv(mod(r - k, n), Region{Buf::Scratch, 0, 0});
      b.fence();
    }
  }
};

}  // namespace

void addExchangeAlgorithms(Registry& r) {
  r.add(std::make_unique<PairwiseAllToAll>());
  r.add(std::make_unique<PairwiseAllToAllV>());
  r.add(std::make_unique<DisseminationBarrier>());
}

}  // namespace chorus::plan
