// One-shot plans.  Allreduce: every rank sends its whole input to every other rank in
// one all-pairs round and reduces the n inputs itself, in rank order
// (in_0 op in_1 op ... op in_{n-1}), so every rank computes the same
// operations on the same operands and all end bitwise identical.
//
// It moves (n - 1) x the data per rank, against 2(n - 1)/n for a ring, but in
// one step: the latency-bound end of the size range, where a call's cost is
// the number of message latencies it waits for in sequence (recursive
// doubling waits for log2 n of them).
//
// Over shared memory the board runner (exec/board_runner.hpp) runs these
// plans through the transport's board (transport.hpp, Board): each rank writes its input once into its own slot
// and reads its peers' slots in place, which is the plan's n - 1 sends and
// receives with the copies into scratch elided; the reductions are the
// plan's, in the plan's order.  Everywhere else (TCP, payloads above
// exec::kBoardBytes) the executor runs the steps below.
#include "plan/canonical.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

// The one all-pairs round: every send first (peers from r + 1 on, so the
// ranks do not all start on the same peer), then every receive.
template <typename Send, typename Recv>
void exchangeAll(int r, int n, ProgramBuilder& b, Send&& send, Recv&& recv) {
  for (int k = 1; k < n; ++k) b.send((r + k) % n, send((r + k) % n));
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    b.recv(from, recv(from));
  }
}

// The reducing one-shot round: part(q) is what this rank sends rank q (the
// whole input for allreduce, block q for reduce-scatter), part(r) its own
// contribution.  Peer q's part lands in scratch slot q; the n parts are then
// reduced into out(0, N) in rank order.  In place, this rank's own part is
// kept in slot r too: the output (its input) is overwritten by the first
// reduction, before its turn in the rank order comes.
//
// Under canonical mode (Shape::canonical) the n parts are combined in the
// canonical tree instead (canonical.hpp), the receives posted in tree order.
template <typename Part>
void reduceAllToOne(const Shape& sh, int r, ProgramBuilder& b, uint64_t N, Part&& part) {
  const int n = sh.nranks;
  if (sh.canonical) {
    const Region slots = b.scratch(static_cast<uint64_t>(n + 1) * N);
    auto slot = [&](int q) { return Region{Buf::Scratch, slots.offset + static_cast<uint64_t>(q) * N, N}; };
    Region own = part(r);
    if (sh.inplace) {  // the output overlaps the own part: keep it in the extra slot n
      b.copy(slot(n), own);
      own = slot(n);
    }
    for (int k = 1; k < n; ++k) b.send((r + k) % n, part((r + k) % n));
    return combineCanonical(b, n, r, own, out(0, N), slot);
  }
  const Region slots = b.scratch(static_cast<uint64_t>(n) * N);
  auto slot = [&](int q) { return Region{Buf::Scratch, slots.offset + static_cast<uint64_t>(q) * N, N}; };
  auto input = [&](int q) { return q != r ? slot(q) : sh.inplace ? slot(r) : part(r); };
  if (sh.inplace) b.copy(slot(r), part(r));
  exchangeAll(r, n, b, part, slot);
  b.reduce(out(0, N), input(0), input(1));
  for (int q = 2; q < n; ++q) b.reduce(out(0, N), out(0, N), input(q));
}

// What the one-shot plans share: the name, the flag that lets a
// shared-memory transport run them through its board, the rank limit, and
// (but for broadcast) one all-pairs round of `count` elements per message.
class OneShot : public Algorithm {
 public:
  std::string_view name() const override { return "oneshot"; }
  bool oneShot() const override { return true; }
  // n - 1 messages per rank: priced as an all-pairs round, O(n^2) to price.
  bool supports(const Shape& sh) const override { return sh.nranks <= kOneShotMaxRanks; }
  std::string_view requirement() const override { return "at most 64 ranks (kOneShotMaxRanks)"; }

 protected:
  // A reducing round lands its messages in scratch and reduces them in a
  // separate pass (staged).
  static Result<std::vector<Round>> allPairs(const Shape& sh, bool reduce) {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    return std::vector<Round>{{.peers = Peers::AllPairs, .elems = sh.count, .reduce = reduce, .staged = reduce}};
  }
};

class OneShotAllReduce final : public OneShot {
 public:
  Collective collective() const override { return Collective::AllReduce; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override { return allPairs(sh, true); }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (n == 1) return b.copy(out(0, N), in(0, N));
    if (N == 0) return;
    reduceAllToOne(sh, r, b, N, [&](int) { return in(0, N); });
  }
};

// The one-shot family for the other all-to-all-shaped collectives: each rank
// sends every peer what it needs of its input at once.  Over the board a rank
// publishes its whole input and each peer reads its part in place.
class OneShotAllGather final : public OneShot {
 public:
  Collective collective() const override { return Collective::AllGather; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override { return allPairs(sh, false); }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (N == 0) return;
    const Region own = out(static_cast<uint64_t>(r) * N, N);
    if (!sh.inplace) b.copy(own, in(0, N));
    exchangeAll(r, n, b, [&](int) { return sh.inplace ? own : in(0, N); },
                [&](int from) { return out(static_cast<uint64_t>(from) * N, N); });
  }
};

// Reduce-scatter: block q of every input goes to rank q, which reduces the n
// blocks in rank order.
class OneShotReduceScatter final : public OneShot {
 public:
  Collective collective() const override { return Collective::ReduceScatter; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override { return allPairs(sh, true); }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    auto block = [&](int q) { return in(static_cast<uint64_t>(q) * N, N); };
    if (n == 1) return b.copy(out(0, N), block(0));
    if (N == 0) return;
    reduceAllToOne(sh, r, b, N, block);
  }
};

// All-to-all: block q of this rank's input to rank q, in one round.
class OneShotAllToAll final : public OneShot {
 public:
  Collective collective() const override { return Collective::AllToAll; }
  // In place, a block received could overwrite one not yet sent: the
  // pairwise plan handles that; this one is for separate buffers.
  bool supports(const Shape& sh) const override { return OneShot::supports(sh) && !sh.inplace; }
  std::string_view requirement() const override { return "separate send and receive buffers (not in place), at most 64 ranks"; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override { return allPairs(sh, false); }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (N == 0) return;
    auto at = [&](int q) { return static_cast<uint64_t>(q) * N; };
    b.copy(out(at(r), N), in(at(r), N));
    exchangeAll(r, n, b, [&](int q) { return in(at(q), N); }, [&](int from) { return out(at(from), N); });
  }
};

// Broadcast: the root sends the vector to every other rank at once (a flat
// tree).  Over the board the root publishes it once and every rank copies it
// out of the root's slot.
class OneShotBroadcast final : public OneShot {
 public:
  Collective collective() const override { return Collective::Broadcast; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return std::vector<Round>{};
    Round rd{.peers = Peers::Explicit, .elems = sh.count};
    for (int k = 1; k < n; ++k) rd.msgs.push_back({sh.root, (sh.root + k) % n, sh.count});
    return std::vector<Round>{std::move(rd)};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (N == 0) return;
    if (r != sh.root) return b.recv(sh.root, out(0, N));
    if (!sh.inplace) b.copy(out(0, N), in(0, N));
    for (int k = 1; k < n; ++k) b.send((r + k) % n, in(0, N));
  }
};

}  // namespace

void addOneShotAlgorithms(Registry& r) {
  r.add(std::make_unique<OneShotBroadcast>());
  r.add(std::make_unique<OneShotAllReduce>());
  r.add(std::make_unique<OneShotAllGather>());
  r.add(std::make_unique<OneShotReduceScatter>());
  r.add(std::make_unique<OneShotAllToAll>());
}

}  // namespace chorus::plan
