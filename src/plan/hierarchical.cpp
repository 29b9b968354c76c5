// Two-level (hierarchical) algorithms for jobs that span several hosts.
//
// Shape::hosts says which ranks share a host.  The ranks of a host, in rank
// order, have local indices 0..L-1; hosts are numbered in order of their
// lowest rank.  The plans need every host to hold the same number of ranks L
// (supports() is false otherwise, and for one host or an unknown layout); the
// ranks of a host need not be contiguous.
//
// allreduce "hierarchical": (1) a direct reduce-scatter inside each host: the
// data is cut into L blocks and local rank l reduces block l, reading it from
// every local peer (one all-pairs round over shared memory); (2) an allreduce
// of block l across hosts between the ranks with local index l (one "rail"
// per local index: H ranks, a ring, so every inter-host link carries N/L
// per rank instead of N); (3) a direct allgather inside each host.
//
// allgather "hierarchical": (1) a ring allgather across hosts between the
// ranks with equal local index, so rank (host g, local l) holds the blocks of
// every rank with local index l; (2) inside each host every rank hands those H
// blocks to each local peer.
//
// alltoall "hierarchical": (1) inside each host, blocks are regrouped by rail
// (local index of the destination); (2) along each rail, one batch of L blocks
// per pair of hosts.
#include "plan/partition.hpp"
#include "plan/host_layout.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

// Slice s of [begin, begin + len) cut into S slices.
Region sliceOf(Buf buf, uint64_t begin, uint64_t len, uint64_t S, uint64_t s) {
  const uint64_t a = partBegin(len, S, s), e = partBegin(len, S, s + 1);
  return {buf, begin + a, e - a};
}

// Every ordered pair of ranks inside each host exchanges `elems` elements,
// `repeat` times: the intra-host phases' round pattern.
Round intraHostAllPairs(const HostLayout& lay, uint64_t elems, uint64_t repeat, bool reduce) {
  Round intra{.repeat = repeat, .peers = Peers::Explicit, .elems = elems, .reduce = reduce};
  for (int g = 0; g < lay.H; ++g)
    for (int a = 0; a < lay.L; ++a)
      for (int d = 0; d < lay.L; ++d)
        if (a != d) intra.msgs.push_back({lay.rank(g, a), lay.rank(g, d), elems});
  return intra;
}

// Calls f(k, s) for k in [0, steps) and s in [0, slices) in wavefront order
// (as the ring algorithms do).
template <typename F>
void wavefront(uint64_t steps, uint64_t slices, F&& f) {
  for (uint64_t d = 0; d + 1 < steps + slices; ++d)
    for (uint64_t k = 0; k < steps; ++k)
      if (d >= k && d - k < slices) f(k, d - k);
}

class HierarchicalAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "hierarchical"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool supports(const Shape& sh) const override { return HostLayout(sh).ok(); }
  std::string_view requirement() const override { return "two or more hosts with the same number of ranks each"; }

  // Explicit rounds (O(n L) messages): the intra-host phases as one round each
  // (every local pair), the rails as a ring of H ranks, repeated.
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const HostLayout lay(sh);
    if (!lay.ok()) return invalidArgument("hierarchical allreduce: the hosts do not all hold the same number of ranks");
    const uint64_t N = sh.count;
    std::vector<Round> rs;
    if (N == 0) return rs;
    const int H = lay.H, L = lay.L;
    const uint64_t blk = partBegin(N, L, 1);  // the largest block
    if (L > 1) rs.push_back(intraHostAllPairs(lay, blk, 1, /*reduce=*/true));
    const uint64_t sub = partBegin(blk, H, 1);
    if (sub > 0) {
      Round rail{.repeat = uint64_t(H - 1), .peers = Peers::Explicit, .elems = sub, .reduce = true};
      for (int g = 0; g < H; ++g)
        for (int l = 0; l < L; ++l)
          if (partBegin(N, L, l + 1) > partBegin(N, L, l)) rail.msgs.push_back({lay.rank(g, l), lay.rank((g + 1) % H, l), sub});
      rs.push_back(rail);
      rail.reduce = false;
      rs.push_back(rail);
    }
    if (L > 1) rs.push_back(intraHostAllPairs(lay, blk, 1, /*reduce=*/false));
    return rs;
  }

  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const HostLayout lay(sh);
    const uint64_t N = sh.count;
    const int H = lay.H, L = lay.L, g = lay.host[r], l = lay.local[r];
    auto bo = [&](int i) { return partBegin(N, L, i); };
    auto bs = [&](int i) { return bo(i + 1) - bo(i); };
    auto peer = [&](int k) { return lay.rank(g, mod(l + k, L)); };  // local peer k steps on
    const uint64_t S = numSlices(bs(0), sh.chunk_elems);

    // (1) Reduce-scatter inside the host: local rank l reduces block l.
    if (L == 1) {
      b.copy(out(0, N), in(0, N));
    } else {
      for (uint64_t s = 0; s < S; ++s) {
        for (int k = 1; k < L; ++k)
          if (Region x = sliceOf(Buf::Input, bo(mod(l + k, L)), bs(mod(l + k, L)), S, s); x.count) b.send(peer(k), x);
        const Region mine = sliceOf(Buf::Output, bo(l), bs(l), S, s);
        if (mine.count == 0) continue;
        for (int k = 1; k < L; ++k)
          b.recvReduce(peer(-k), mine, k == 1 ? sliceOf(Buf::Input, bo(l), bs(l), S, s) : mine);
      }
    }

    // (2) Allreduce of block l across hosts: a ring over the H ranks with
    // local index l, in place in the output.
    const uint64_t base = bo(l), len = bs(l);
    if (len > 0) {
      const int next = lay.rank(mod(g + 1, H), l), prev = lay.rank(mod(g - 1, H), l);
      auto so = [&](int i) { return base + partBegin(len, H, i); };
      auto ss = [&](int i) { return partBegin(len, H, i + 1) - partBegin(len, H, i); };
      const uint64_t S2 = numSlices(ss(0), sh.chunk_elems);
      wavefront(2 * (H - 1), S2, [&](uint64_t k, uint64_t s) {
        const int kk = static_cast<int>(k);
        int sb, rb;
        if (kk < H - 1) {
          sb = mod(g - kk, H);
          rb = mod(g - kk - 1, H);
        } else {
          const int j = kk - (H - 1);
          sb = mod(g + 1 - j, H);
          rb = mod(g - j, H);
        }
        if (Region x = sliceOf(Buf::Output, so(sb), ss(sb), S2, s); x.count) b.send(next, x);
        Region dst = sliceOf(Buf::Output, so(rb), ss(rb), S2, s);
        if (dst.count == 0) return;
        if (kk < H - 1)
          b.recvReduce(prev, dst, dst);
        else
          b.recv(prev, dst);
      });
    }

    // (3) Allgather inside the host.
    if (L == 1) return;
    for (uint64_t s = 0; s < S; ++s) {
      if (Region mine = sliceOf(Buf::Output, bo(l), bs(l), S, s); mine.count)
        for (int k = 1; k < L; ++k) b.send(peer(k), mine);
      for (int k = 1; k < L; ++k) {
        const int i = mod(l - k, L);
        if (Region x = sliceOf(Buf::Output, bo(i), bs(i), S, s); x.count) b.recv(peer(-k), x);
      }
    }
  }
};

class HierarchicalAllGather final : public Algorithm {
 public:
  std::string_view name() const override { return "hierarchical"; }
  Collective collective() const override { return Collective::AllGather; }
  bool supports(const Shape& sh) const override { return HostLayout(sh).ok(); }
  std::string_view requirement() const override { return "two or more hosts with the same number of ranks each"; }

  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const HostLayout lay(sh);
    if (!lay.ok()) return invalidArgument("hierarchical allgather: the hosts do not all hold the same number of ranks");
    const uint64_t c = sh.count;
    std::vector<Round> rs;
    if (c == 0) return rs;
    const int H = lay.H, L = lay.L;
    Round rail{.repeat = uint64_t(H - 1), .peers = Peers::Explicit, .elems = c};
    for (int g = 0; g < H; ++g)
      for (int l = 0; l < L; ++l) rail.msgs.push_back({lay.rank(g, l), lay.rank((g + 1) % H, l), c});
    rs.push_back(rail);
    // Every local pair exchanges H blocks (H messages, one per rail member).
    if (L > 1) rs.push_back(intraHostAllPairs(lay, c, uint64_t(H), /*reduce=*/false));
    return rs;
  }

  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const HostLayout lay(sh);
    const uint64_t c = sh.count;
    const int H = lay.H, L = lay.L, g = lay.host[r], l = lay.local[r];
    auto blk = [&](int q) { return out(static_cast<uint64_t>(q) * c, c); };
    b.copy(blk(r), in(0, c));
    if (c == 0) return;
    const uint64_t S = numSlices(c, sh.chunk_elems);
    // (1) Ring across hosts over the rail of local index l.
    const int next = lay.rank(mod(g + 1, H), l), prev = lay.rank(mod(g - 1, H), l);
    wavefront(H - 1, S, [&](uint64_t k, uint64_t s) {
      const int kk = static_cast<int>(k);
      const int sq = lay.rank(mod(g - kk, H), l), rq = lay.rank(mod(g - kk - 1, H), l);
      Region snd = kk == 0 ? sliceOf(Buf::Input, 0, c, S, s) : sliceOf(Buf::Output, sq * c, c, S, s);
      b.send(next, snd);
      b.recv(prev, sliceOf(Buf::Output, rq * c, c, S, s));
    });
    // (2) Inside the host: hand the rail's H blocks to every local peer.
    // Block of host gg is sent in host order, starting with this host's own.
    for (int j = 0; j < H; ++j) {
      const int gg = mod(g + j, H);
      for (int k = 1; k < L; ++k) {
        const int to = lay.rank(g, mod(l + k, L));
        b.send(to, gg == g ? in(0, c) : blk(lay.rank(gg, l)));
      }
      for (int k = 1; k < L; ++k) {
        const int li = mod(l - k, L);
        b.recv(lay.rank(g, li), blk(lay.rank(gg, li)));
      }
    }
  }
};

// All-to-all in two hops: (1) inside the host, local rank l collects from every
// local peer the blocks bound for rail l (local index l on every host); blocks
// for its own host go straight to their place, those for other hosts wait in
// scratch; (2) along rail l, rank (g, l) sends rank (g', l) the L blocks its
// host's ranks have for it.  Each inter-host pair of ranks exchanges one batch
// of L blocks, not L^2 separate messages between the hosts' ranks.
class HierarchicalAllToAll final : public Algorithm {
 public:
  std::string_view name() const override { return "hierarchical"; }
  Collective collective() const override { return Collective::AllToAll; }
  bool supports(const Shape& sh) const override { return HostLayout(sh).ok(); }
  std::string_view requirement() const override { return "two or more hosts with the same number of ranks each"; }

  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const HostLayout lay(sh);
    if (!lay.ok()) return invalidArgument("hierarchical alltoall: the hosts do not all hold the same number of ranks");
    const uint64_t c = sh.count;
    std::vector<Round> rs;
    if (c == 0) return rs;
    const int H = lay.H, L = lay.L;
    if (L > 1) rs.push_back(intraHostAllPairs(lay, c, uint64_t(H), /*reduce=*/false));
    Round rail{.repeat = uint64_t(L), .peers = Peers::Explicit, .elems = c};
    for (int g = 0; g < H; ++g)
      for (int g2 = 0; g2 < H; ++g2)
        if (g != g2)
          for (int l = 0; l < L; ++l) rail.msgs.push_back({lay.rank(g, l), lay.rank(g2, l), c});
    rs.push_back(rail);
    return rs;
  }

  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const HostLayout lay(sh);
    const uint64_t c = sh.count;
    const int H = lay.H, L = lay.L, g = lay.host[r], l = lay.local[r];
    auto src = [&](int q) { return in(static_cast<uint64_t>(q) * c, c); };   // my block for rank q
    auto dst = [&](int q) { return out(static_cast<uint64_t>(q) * c, c); };  // rank q's block for me
    if (c == 0) return;
    // In place, every block is read (sent or copied) before anything lands:
    // received blocks wait in scratch and are copied into place at the end.
    const bool ip = sh.inplace;
    // Staging: stage(gg, ll) holds the block of local rank ll for rank (gg, l), gg != g.
    const Region stage = b.scratch(static_cast<uint64_t>(H) * L * c);
    auto staged = [&](int gg, int ll) {
      return Region{Buf::Scratch, stage.offset + (static_cast<uint64_t>(gg) * L + ll) * c, c};
    };
    // Landing area for in place: one block per source rank.
    const Region land = ip ? b.scratch(static_cast<uint64_t>(sh.nranks) * c) : Region{};
    auto landing = [&](int q) {
      return ip ? Region{Buf::Scratch, land.offset + static_cast<uint64_t>(q) * c, c} : dst(q);
    };

    // (1) Inside the host: to local peer ll, my blocks for rail ll (one per host).
    for (int gg = 0; gg < H; ++gg) {
      const int host_g = mod(g + gg, H);
      for (int k = 1; k < L; ++k) b.send(lay.rank(g, mod(l + k, L)), src(lay.rank(host_g, mod(l + k, L))));
      for (int k = 1; k < L; ++k) {
        const int ll = mod(l - k, L);
        if (host_g == g)
          b.recv(lay.rank(g, ll), landing(lay.rank(g, ll)));
        else
          b.recv(lay.rank(g, ll), staged(host_g, ll));
      }
    }
    // My own blocks: for my rail on other hosts into the staging area, for me into place.
    for (int gg = 0; gg < H; ++gg)
      if (gg != g) b.copy(staged(gg, l), src(lay.rank(gg, l)));
    b.copy(landing(r), src(r));
    // (2) Along the rail: to (g', l) the L blocks of this host's ranks for it,
    // from (g', l) the L blocks of its host's ranks for me.
    for (int k = 1; k < H; ++k) {
      const int to = mod(g + k, H), from = mod(g - k, H);
      for (int ll = 0; ll < L; ++ll) b.send(lay.rank(to, l), staged(to, ll));
      for (int ll = 0; ll < L; ++ll) b.recv(lay.rank(from, l), landing(lay.rank(from, ll)));
    }
    if (ip)
      for (int q = 0; q < sh.nranks; ++q) b.copy(dst(q), landing(q));
  }
};

}  // namespace

void addHierarchicalAlgorithms(Registry& r) {
  r.add(std::make_unique<HierarchicalAllReduce>());
  r.add(std::make_unique<HierarchicalAllGather>());
  r.add(std::make_unique<HierarchicalAllToAll>());
}

}  // namespace chorus::plan
