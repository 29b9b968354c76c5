// Direct allreduce for ranks that share memory: each rank reduces its 1/n
// slice of the data, reading that slice straight out of every peer's input,
// then every rank copies the other reduced slices out of their owners.
//
// As a plan: rank r sends block j of its input to rank j (all j != r at once)
// and reduces the n - 1 blocks r it receives into its output (a reduce-scatter
// in one all-pairs round); then it sends its reduced block to every peer and
// receives theirs (an allgather in one all-pairs round).  Every rank moves
// 2(n-1)/n of the data, as a ring does, in 2 rounds instead of 2(n-1).
// Over shared memory the transport makes each of these messages a single
// read of the peer's buffer: from 64 KiB a cross-memory-attach copy out of the
// sender's buffer (the receiver reduces from it), below that one copy through
// the pair's ring -- so "reading the peers' buffers" is what the executor
// does, while the verifier proves the plan and the models price two all-pairs
// rounds.  Each block is reduced on one rank in one fixed order, so every rank
// ends with bitwise identical results.
//
// Only for ranks on one host (Shape::hosts all equal): across hosts n(n-1)
// connections and n-1 messages per rank per round are what the hierarchical
// algorithm avoids.  A shape whose hosts are not known is not supported, so
// the simulator (which prices network topologies) never picks it.
#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

bool oneHost(const Shape& sh) {
  if (sh.hosts.size() != static_cast<size_t>(sh.nranks)) return false;
  return std::all_of(sh.hosts.begin(), sh.hosts.end(), [&](int h) { return h == sh.hosts[0]; });
}

class DirectAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "direct"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool supports(const Shape& sh) const override { return oneHost(sh); }
  std::string_view requirement() const override { return "every rank on one host"; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return std::vector<Round>{};
    const uint64_t blk = partBegin(sh.count, n, 1);  // the largest block
    return std::vector<Round>{{.peers = Peers::AllPairs, .elems = blk, .reduce = true},
                              {.peers = Peers::AllPairs, .elems = blk}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (n == 1) return b.copy(out(0, N), in(0, N));
    if (N == 0) return;
    auto bo = [&](int blk) { return partBegin(N, n, blk); };
    auto bs = [&](int blk) { return bo(blk + 1) - bo(blk); };
    const uint64_t S = numSlices(bs(0), sh.chunk_elems);
    auto slice = [&](Buf buf, int blk, uint64_t s) {
      const uint64_t a = partBegin(bs(blk), S, s), e = partBegin(bs(blk), S, s + 1);
      return Region{buf, bo(blk) + a, e - a};
    };
    // Slice by slice, so that the allgather of slice s overlaps the
    // reduce-scatter of slice s + 1.  Peers are visited from r + 1 on, so the
    // ranks do not all start on the same peer.
    for (uint64_t s = 0; s < S; ++s) {
      for (int k = 1; k < n; ++k) {
        const int to = mod(r + k, n);
        if (Region x = slice(Buf::Input, to, s); x.count) b.send(to, x);
      }
      const Region mine = slice(Buf::Output, r, s);
      if (mine.count) {
        for (int k = 1; k < n; ++k) {
          const int from = mod(r - k, n);
          b.recvReduce(from, mine, k == 1 ? slice(Buf::Input, r, s) : mine);
        }
        for (int k = 1; k < n; ++k) b.send(mod(r + k, n), mine);
      }
      for (int k = 1; k < n; ++k) {
        const int from = mod(r - k, n);
        if (Region x = slice(Buf::Output, from, s); x.count) b.recv(from, x);
      }
    }
  }
};

}  // namespace

void addDirectAlgorithms(Registry& r) { r.add(std::make_unique<DirectAllReduce>()); }

}  // namespace chorus::plan
