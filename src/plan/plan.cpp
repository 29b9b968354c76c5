#include "plan/plan.hpp"

#include <algorithm>
#include <array>
#include <cassert>

namespace chorus::plan {

namespace {
uint64_t extent(std::span<const size_t> counts, std::span<const size_t> displs) {
  uint64_t e = 0;
  for (size_t i = 0; i < counts.size() && i < displs.size(); ++i)
    if (counts[i] != 0) e = std::max<uint64_t>(e, displs[i] + counts[i]);
  return e;
}
}  // namespace

std::string collectiveNamesText() {
  std::string out;
  for (const CollectiveFacts& f : kCollectiveFacts) out += fmt::format("{}{}", out.empty() ? "" : ", ", f.name);
  return out;
}

bool parseCollective(std::string_view name, Collective* out) {
  for (int i = 0; i < kNumCollectives; ++i) {
    if (kCollectiveFacts[i].name == name) {
      *out = static_cast<Collective>(i);
      return true;
    }
  }
  return false;
}

uint64_t Shape::inputElems(int rank) const {
  const uint64_t n = static_cast<uint64_t>(nranks);
  switch (coll) {
    case Collective::AllReduce:
    case Collective::Reduce:
    case Collective::AllGather:
    case Collective::Gather: return count;
    case Collective::Broadcast: return rank == root ? count : 0;
    case Collective::ReduceScatter:
    case Collective::AllToAll: return count * n;
    case Collective::Scatter: return rank == root ? count * n : 0;
    case Collective::AllGatherV: return static_cast<size_t>(rank) < counts.size() ? counts[rank] : 0;
    case Collective::AllToAllV: return extent(counts, displs);
    case Collective::Barrier: return 0;
  }
  return 0;
}

uint64_t Shape::outputElems(int rank) const {
  const uint64_t n = static_cast<uint64_t>(nranks);
  switch (coll) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::ReduceScatter:
    case Collective::Scatter: return count;
    case Collective::Reduce: return rank == root ? count : 0;
    case Collective::AllGather:
    case Collective::AllToAll: return count * n;
    case Collective::Gather: return rank == root ? count * n : 0;
    case Collective::AllGatherV: return extent(counts, displs);
    case Collective::AllToAllV: return extent(counts2, displs2);
    case Collective::Barrier: return 0;
  }
  return 0;
}

Alias inplaceAlias(const Shape& s, int rank) {
  if (!s.inplace) return {};
  const CollectiveFacts& f = facts(s.coll);
  if (f.inplace_at_root && rank != s.root) return {};
  switch (f.inplace_rule) {
    case InPlace::None: return {};
    case InPlace::Same: return {Buf::Input, Buf::Output, 0};
    case InPlace::InputInOutput: return {Buf::Input, Buf::Output, inplaceSlot(s.coll, rank, s.count, s.displs)};
    case InPlace::OutputInInput: return {Buf::Output, Buf::Input, inplaceSlot(s.coll, rank, s.count, s.displs)};
  }
  return {};
}

// ---- ProgramBuilder ---------------------------------------------------------

void ProgramBuilder::reset(int rank, Alias alias) {
  prog_.rank = rank;
  prog_.steps.clear();
  prog_.dep_begin.clear();
  prog_.deps.clear();
  prog_.succ_begin.clear();
  prog_.succ.clear();
  prog_.scratch_elems = 0;
  prog_.wire_bytes = 0;
  prog_.wire.reset();
  alias_ = alias;
  redirect_.reset();
  scratch_top_ = 0;
  wire_top_ = 0;
  fences_.clear();
}

Region ProgramBuilder::alias(Region r) const {
  if (alias_.from != alias_.to && r.buf == alias_.from) {
    r.buf = alias_.to;
    r.offset += alias_.offset;
  }
  return r;
}

Region ProgramBuilder::map(Region r) const {
  if (redirect_ && r.buf == Buf::Input) {
    r.buf = redirect_->buf;
    r.offset += redirect_->offset;
  }
  return alias(r);
}

void ProgramBuilder::add(Step s) {
  s.dst = map(s.dst);
  s.src = map(s.src);
  s.src2 = map(s.src2);
  prog_.steps.push_back(s);
}

void ProgramBuilder::send(int peer, Region src) { add({StepOp::Send, peer, {}, src, {}}); }
void ProgramBuilder::recv(int peer, Region dst) { add({StepOp::Recv, peer, dst, {}, {}}); }
void ProgramBuilder::recvReduce(int peer, Region dst, Region accum) {
  add({StepOp::RecvReduce, peer, dst, accum, {}});
}
void ProgramBuilder::copy(Region dst, Region src) {
  if (map(dst).buf == map(src).buf && map(dst).offset == map(src).offset) return;  // in place
  add({StepOp::Copy, -1, dst, src, {}});
}
void ProgramBuilder::reduce(Region dst, Region a, Region b) { add({StepOp::Reduce, -1, dst, a, b}); }

void ProgramBuilder::quantize(Region wire, Region src) { add({StepOp::Quantize, -1, wire, src, {}}); }
void ProgramBuilder::dequantize(Region dst, Region wire) { add({StepOp::Dequantize, -1, dst, wire, {}}); }
void ProgramBuilder::dequantizeReduce(Region dst, Region accum, Region wire) {
  add({StepOp::DequantizeReduce, -1, dst, accum, wire});
}

void ProgramBuilder::scale(Region dst, Region src) { add({StepOp::Scale, -1, dst, src, {}}); }
void ProgramBuilder::divide(Region dst) { add({StepOp::Divide, -1, dst, dst, {}}); }
void ProgramBuilder::encode(Region wire, Region src) { add({StepOp::Encode, -1, wire, src, {}}); }
void ProgramBuilder::decode(Region dst, Region wire) { add({StepOp::Decode, -1, dst, wire, {}}); }
void ProgramBuilder::decodeAdd(Region dst, Region own, Region x) { add({StepOp::DecodeAdd, -1, dst, own, x}); }
void ProgramBuilder::encodeAdd(Region wire, Region own, Region raw) { add({StepOp::EncodeAdd, -1, wire, own, raw}); }

Region ProgramBuilder::wire(uint64_t bytes) {
  Region r{Buf::Wire, wire_top_, bytes};
  wire_top_ += bytes;
  return r;
}

Region ProgramBuilder::scratch(uint64_t count) {
  Region r{Buf::Scratch, scratch_top_, count};
  scratch_top_ += count;
  return r;
}

void ProgramBuilder::fence() {
  const auto here = static_cast<uint32_t>(prog_.steps.size());
  if (here == 0 || (!fences_.empty() && fences_.back() == here)) return;  // nothing to order
  fences_.push_back(here);
}

namespace {
// The regions a step reads and writes (unused slots have count 0).
struct Access {
  std::array<Region, 2> reads;
  Region write;
};
Access accessOf(const Step& s) {
  switch (s.op) {
    case StepOp::Send: return {{s.src, Region{}}, Region{}};
    case StepOp::Recv: return {{Region{}, Region{}}, s.dst};
    case StepOp::RecvReduce:
    case StepOp::Copy:
    case StepOp::Quantize:
    case StepOp::Dequantize:
    case StepOp::Scale:
    case StepOp::Encode:
    case StepOp::Decode:
    case StepOp::Divide: return {{s.src, Region{}}, s.dst};  // Divide: src is dst
    case StepOp::Reduce:
    case StepOp::DecodeAdd:
    case StepOp::EncodeAdd:
    case StepOp::DequantizeReduce: return {{s.src, s.src2}, s.dst};
  }
  return {};
}
bool conflicts(const Access& earlier, const Access& later) {
  if (earlier.write.overlaps(later.write)) return true;  // WAW
  for (const Region& r : later.reads)
    if (earlier.write.overlaps(r)) return true;  // RAW
  for (const Region& r : earlier.reads)
    if (later.write.overlaps(r)) return true;  // WAR
  return false;
}
}  // namespace

namespace {
// Which earlier steps touch which part of each buffer: every buffer's extent
// cut into at most kBlocks blocks, each listing the steps (in program order)
// that read or write it.  An earlier step that conflicts with a step shares
// one of its blocks, so finish() tests only those, not every earlier step.
class TouchIndex {
 public:
  explicit TouchIndex(const std::vector<Access>& acc) {
    for (const Access& a : acc)
      forEachRegion(a, [&](const Region& g) {
        Lanes& l = lanes_[static_cast<uint8_t>(g.buf)];
        l.last = std::max(l.last, last(g));
        l.used = true;
      });
    for (Lanes& l : lanes_) {
      if (!l.used) continue;
      while ((l.last >> l.shift) >= kBlocks) ++l.shift;
      l.steps.resize(static_cast<size_t>(l.last >> l.shift) + 1);
    }
  }
  // f(step) for each step listed in a block that i's regions touch, latest
  // first, down to (not below) `from`; a step may come more than once.
  template <class F>
  void forEachEarlier(const Access& a, uint32_t from, F&& f) const {
    forEachRegion(a, [&](const Region& g) {
      const Lanes& l = lanes_[static_cast<uint8_t>(g.buf)];
      for (uint64_t b = g.offset >> l.shift; b <= last(g) >> l.shift; ++b)
        for (auto it = l.steps[b].rbegin(); it != l.steps[b].rend() && *it >= from; ++it) f(*it);
    });
  }
  void add(const Access& a, uint32_t step) {
    forEachRegion(a, [&](const Region& g) {
      Lanes& l = lanes_[static_cast<uint8_t>(g.buf)];
      for (uint64_t b = g.offset >> l.shift; b <= last(g) >> l.shift; ++b) l.steps[b].push_back(step);
    });
  }

 private:
  static constexpr uint64_t kBlocks = 256;
  struct Lanes {
    bool used = false;
    uint64_t last = 0;  // the last element any step touches
    int shift = 0;      // block = element >> shift
    std::vector<std::vector<uint32_t>> steps;
  };
  template <class F>
  static void forEachRegion(const Access& a, F&& f) {
    for (const Region& g : {a.reads[0], a.reads[1], a.write})
      if (g.count != 0) f(g);
  }
  static uint64_t last(const Region& g) {  // saturating: an absurd region still lands in a block
    return g.offset > UINT64_MAX - (g.count - 1) ? UINT64_MAX : g.offset + (g.count - 1);
  }
  std::array<Lanes, 256> lanes_;
};
}  // namespace

void ProgramBuilder::finish(Program* out) {
  const size_t n = prog_.steps.size();
  std::vector<Access> acc(n);
  for (size_t i = 0; i < n; ++i) acc[i] = accessOf(prog_.steps[i]);

  // Dependencies: every earlier conflicting step, plus fences.  Candidates
  // come from the steps touching the same blocks of the same buffers
  // (TouchIndex), tested and listed in program order.
  prog_.dep_begin.assign(1, 0);
  size_t next_fence = 0;
  uint32_t seg_start = 0, prev_seg_start = 0;  // current and previous fence segments
  TouchIndex touched(acc);
  std::vector<uint32_t> seen(n, UINT32_MAX), cand;
  for (uint32_t i = 0; i < n; ++i) {
    while (next_fence < fences_.size() && fences_[next_fence] <= i) {
      prev_seg_start = seg_start;
      seg_start = fences_[next_fence++];
    }
    // A fence orders i after every earlier step; depending on the previous
    // segment suffices, since that segment depends on everything before it.
    for (uint32_t j = prev_seg_start; j < seg_start; ++j) prog_.deps.push_back(j);
    cand.clear();
    touched.forEachEarlier(acc[i], seg_start, [&](uint32_t j) {
      if (seen[j] != i) {
        seen[j] = i;
        cand.push_back(j);
      }
    });
    std::sort(cand.begin(), cand.end());
    for (uint32_t j : cand)
      if (conflicts(acc[j], acc[i])) prog_.deps.push_back(j);
    prog_.dep_begin.push_back(static_cast<uint32_t>(prog_.deps.size()));
    touched.add(acc[i], i);
  }

  // Reverse edges (CSR).
  std::vector<uint32_t> cnt(n + 1, 0);
  for (uint32_t d : prog_.deps) ++cnt[d + 1];
  for (size_t i = 0; i < n; ++i) cnt[i + 1] += cnt[i];
  prog_.succ_begin = cnt;
  prog_.succ.assign(prog_.deps.size(), 0);
  std::vector<uint32_t> fill(cnt.begin(), cnt.end() - 1);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t j = prog_.dep_begin[i]; j < prog_.dep_begin[i + 1]; ++j) prog_.succ[fill[prog_.deps[j]]++] = i;

  prog_.scratch_elems = scratch_top_;
  prog_.wire_bytes = wire_top_;
  *out = std::move(prog_);
  prog_ = Program{};
}

void expand(const Algorithm& algo, const Shape& shape, int rank, Program* out) {
  ProgramBuilder b;
  b.reset(rank, inplaceAlias(shape, rank));
  const bool wrap = !algo.scalesItself();
  if (wrap) beginScaling(shape, rank, b);
  algo.generate(shape, rank, b);
  if (wrap) endScaling(shape, rank, b);
  b.finish(out);
  if (algo.compressed()) out->wire = shape.wire;
  if (algo.exact()) out->exact_words = shape.exact_words;
  if (shape.scaling == Scaling::Avg) out->divisor = static_cast<uint32_t>(shape.nranks);
}

// ---- Registry ---------------------------------------------------------------

Registry Registry::builtin() {
  Registry r;
  addRingAlgorithms(r);
  addTreeAlgorithms(r);
  addRecursiveDoublingAlgorithms(r);
  addExchangeAlgorithms(r);
  addRabenseifnerAlgorithms(r);
  addBruckAlgorithms(r);
  addDoubleTreeAlgorithms(r);
  addDirectAlgorithms(r);
  addHierarchicalAlgorithms(r);
  addOneShotAlgorithms(r);
  addCompressedAlgorithms(r);
  addExactAlgorithms(r);
  return r;
}

void Registry::add(std::unique_ptr<Algorithm> algo) { algos_.push_back(std::move(algo)); }

const Algorithm* Registry::find(Collective c, std::string_view name) const {
  for (const auto& a : algos_)
    if (a->collective() == c && a->name() == name) return a.get();
  return nullptr;
}

std::vector<const Algorithm*> Registry::forCollective(Collective c) const {
  std::vector<const Algorithm*> v;
  for (const auto& a : algos_)
    if (a->collective() == c) v.push_back(a.get());
  return v;
}

}  // namespace chorus::plan
