// Plans: what a collective algorithm does, written once, read by four
// consumers (DESIGN.md): the executor runs a rank's part, the verifier
// executes all ranks' parts symbolically, the tuner and the simulator price it.
//
// Vocabulary
//  - Shape: everything about a call that the steps depend on — collective,
//    rank count, counts, element size, root, in-place — and no pointers.
//  - Program: one rank's part of a plan: a list of Steps over Regions of three
//    buffers (the call's input, its output, and plan-private scratch), with
//    the true data dependencies between steps.  Regions are in elements.
//  - Algorithm: a self-describing value (name, collective, constraints) that
//    generates the Program of any rank for a Shape.  Generating one rank's
//    program costs O(its own steps), never O(ranks x steps), which is what
//    keeps a 131,072-rank ring a few patterned rounds for the simulator.
//
// Matching rule every algorithm relies on: messages between an ordered pair of
// ranks are matched in program order (the transports are FIFO per pair), so a
// rank's i-th Send to p pairs with p's i-th Recv from it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "kernels/quantize.hpp"

namespace chorus::plan {

enum class Collective : uint8_t {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  AllGatherV,
  AllToAllV,
  Gather,
  Scatter,
  Barrier,
};
constexpr int kNumCollectives = 11;

// Point-to-point operations (chorusSend, chorusRecv) are not collectives:
// each involves this rank and one peer, named by the call (not a root), so
// they have no Shape, no algorithm, no tuner choice and no part in a call's
// signature; a group's sends and receives become Send/Recv steps of one
// program (the communicator).  Their names, for traces and messages:
enum class PointToPoint : uint8_t { Send, Recv };
constexpr std::string_view pointToPointName(PointToPoint p) { return p == PointToPoint::Send ? "send" : "recv"; }

// The facts of each collective, in one table that the communicator, the
// bench, the trace reports, the tuner and the simulator all read (names,
// buffer sizes, nccl-tests' algbw and busbw conventions).  A call's `count`
// follows NCCL: the per-rank block for allgather, reducescatter, alltoall,
// gather and scatter; the whole vector otherwise.
enum class BusBw : uint8_t {
  TwiceNm1OverN,  // 2(n-1)/n: allreduce
  Nm1OverN,       // (n-1)/n: allgather, reducescatter, alltoall(v), allgatherv, gather, scatter
  One,            // broadcast, reduce (and a point-to-point transfer)
  Zero,           // barrier: no data
};
// How an in-place call lays out its buffers (NCCL's conventions): one lies
// inside the other, at this rank's slot (r x count elements, or the v-form's
// displacement of rank r).
enum class InPlace : uint8_t {
  None,           // no in-place form (barrier)
  Same,           // sendbuff == recvbuff
  InputInOutput,  // the input is this rank's slot of the output (allgather(v), gather)
  OutputInInput,  // the output is this rank's slot of the input (reducescatter, scatter)
};
struct CollectiveFacts {
  std::string_view name;  // on command lines, in CHORUS_ALGO, traces and JSON: "allreduce", ...
  bool reduces;           // combines values: takes a reduction op
  bool rooted;            // takes a root
  bool in_place;          // has an in-place form
  bool variable;          // per-rank counts and displacements (the v-variants)
  // Input / output elements in units of `count`: x nranks when set (at the
  // root only for scatter's input and gather's output), else x 1.
  bool input_per_rank, output_per_rank;
  // nccl-tests' algbw numerator S: count x elem, or count x elem x nranks.
  bool alg_per_rank;
  BusBw busbw;
  // The in-place layout (inplaceAlias, the communicator's in-place test),
  // whether it applies at the root only (gather, scatter: the other ranks
  // have one buffer that is not the call's), and the C ABI's entry point.
  InPlace inplace_rule = InPlace::None;
  bool inplace_at_root = false;
  std::string_view c_entry = {};
  // The tuner's algorithm when nothing else decides (no measured profile, no
  // size rule of tune::Tuner's, no CHORUS_ALGO): a built-in of the registry.
  std::string_view default_algo = {};
  // Whether a compressed wire format applies (the C entry point takes
  // chorusCallOptions' wire format; plan/compressed.hpp).
  bool compressible = false;
};
inline constexpr CollectiveFacts kCollectiveFacts[kNumCollectives] = {
    // name           reduces rooted in_place variable in/rank out/rank alg/rank busbw                 in-place layout          at root  C entry point          default algo     compressible
    {"allreduce",     true,   false, true,    false,   false,   false,   false,   BusBw::TwiceNm1OverN, InPlace::Same,          false, "chorusAllReduce",     "ring",          true},
    {"broadcast",     false,  true,  true,    false,   false,   false,   false,   BusBw::One,           InPlace::Same,          false, "chorusBroadcast",     "ring",          false},
    {"reduce",        true,   true,  true,    false,   false,   false,   false,   BusBw::One,           InPlace::Same,          false, "chorusReduce",        "binomial",      false},
    {"allgather",     false,  false, true,    false,   false,   true,    true,    BusBw::Nm1OverN,      InPlace::InputInOutput, false, "chorusAllGather",     "ring",          true},
    {"reducescatter", true,   false, true,    false,   true,    false,   true,    BusBw::Nm1OverN,      InPlace::OutputInInput, false, "chorusReduceScatter", "ring",          true},
    {"alltoall",      false,  false, true,    false,   true,    true,    true,    BusBw::Nm1OverN,      InPlace::Same,          false, "chorusAllToAll",      "pairwise",      false},
    {"allgatherv",    false,  false, true,    true,    false,   false,   false,   BusBw::Nm1OverN,      InPlace::InputInOutput, false, "chorusAllGatherV",    "ring",          false},
    {"alltoallv",     false,  false, true,    true,    false,   false,   false,   BusBw::Nm1OverN,      InPlace::Same,          false, "chorusAllToAllV",     "pairwise",      false},
    {"gather",        false,  true,  true,    false,   false,   true,    true,    BusBw::Nm1OverN,      InPlace::InputInOutput, true,  "chorusGather",        "binomial",      false},
    {"scatter",       false,  true,  true,    false,   true,    false,   true,    BusBw::Nm1OverN,      InPlace::OutputInInput, true,  "chorusScatter",       "binomial",      false},
    {"barrier",       false,  false, false,   false,   false,   false,   false,   BusBw::Zero,          InPlace::None,          false, "chorusBarrier",       "dissemination", false},
};
constexpr const CollectiveFacts& facts(Collective c) { return kCollectiveFacts[static_cast<size_t>(c)]; }
static_assert(kCollectiveFacts[static_cast<int>(Collective::AllReduce)].name == "allreduce" &&
              kCollectiveFacts[static_cast<int>(Collective::AllGatherV)].name == "allgatherv" &&
              kCollectiveFacts[static_cast<int>(Collective::Scatter)].name == "scatter" &&
              kCollectiveFacts[static_cast<int>(Collective::Barrier)].name == "barrier" &&
              static_cast<int>(Collective::Barrier) + 1 == kNumCollectives,
              "kCollectiveFacts follows the order of enum Collective");
static_assert([] {
  for (const CollectiveFacts& f : kCollectiveFacts)
    if (f.in_place != (f.inplace_rule != InPlace::None) || f.c_entry.empty() || f.default_algo.empty()) return false;
  return true;
}(), "kCollectiveFacts: every row names its in-place layout (None exactly when it has no in-place form), C entry point and default algorithm");
constexpr std::string_view collectiveName(Collective c) { return facts(c).name; }
// The v-collectives: per-rank counts and displacements, planned per call
// (not cached, not priced by shape, not memoised).
constexpr bool variable(Collective c) { return facts(c).variable; }
// The element offset of rank r's slot in the in-place layout: r x count, or
// the v-form's displacement of r.
constexpr uint64_t inplaceSlot(Collective c, int r, uint64_t count, std::span<const size_t> displs) {
  const auto ur = static_cast<size_t>(r);
  return facts(c).variable ? (ur < displs.size() ? displs[ur] : 0) : ur * count;
}
bool parseCollective(std::string_view name, Collective* out);
// Every collective's name, in the table's order: "allreduce, broadcast, ..." (error messages).
std::string collectiveNamesText();
constexpr bool compressible(Collective c) { return facts(c).compressible; }
// Whether the collective combines values (needs a reduction op).
constexpr bool reduces(Collective c) { return facts(c).reduces; }
// nccl-tests' busbw = algbw x this factor (doc/PERFORMANCE.md): an ideal
// implementation's busbw equals the link bandwidth whatever the rank count.
constexpr double busBwFactor(Collective c, int64_t nranks) {
  const double n = static_cast<double>(nranks), f = nranks > 1 ? (n - 1) / n : 0;
  switch (facts(c).busbw) {
    case BusBw::TwiceNm1OverN: return 2 * f;
    case BusBw::Nm1OverN: return f;
    case BusBw::One: return 1;
    case BusBw::Zero: return 0;
  }
  return 0;
}

// Buffers a step can address.  Values from kFirstUserBuf on name further user
// buffers of a group (the k-th point-to-point buffer is kFirstUserBuf + k).
// Wire: plan-private bytes of a compressed plan (quantized data on its way
// to or from a peer); its regions count bytes, not elements, because a
// quantized run of n elements is kernels::wireBytes(fmt, n) bytes, which is
// no whole number of elements (fp8's scales).  The executor binds it apart
// from the indexed buffers (exec::Job::wire), so it takes the last value.
enum class Buf : uint8_t { Input = 0, Output = 1, Scratch = 2, Wire = 0xff };
constexpr int kFirstUserBuf = 3;
constexpr Buf userBuf(int k) { return static_cast<Buf>(kFirstUserBuf + k); }

struct Region {
  Buf buf = Buf::Input;
  uint64_t offset = 0;  // elements
  uint64_t count = 0;   // elements
  [[nodiscard]] uint64_t end() const { return offset + count; }
  [[nodiscard]] bool overlaps(const Region& o) const {
    return buf == o.buf && count != 0 && o.count != 0 && offset < o.end() && o.offset < end();
  }
};

enum class StepOp : uint8_t {
  Send,        // send src to peer
  Recv,        // receive from peer into dst
  RecvReduce,  // receive from peer x; dst = src (op) x
  Copy,        // dst = src (local)
  Reduce,      // dst = src (op) src2 (local)
  // Compressed plans (Shape::wire; every count below is fp32 elements but the
  // wire region's, which is kernels::wireBytes(format, elements) bytes):
  Quantize,          // dst (Wire) = the wire format of src (fp32)
  Dequantize,        // dst (fp32) = the decoded values of src (Wire)
  DequantizeReduce,  // dst (fp32) = src (fp32) + decoded src2 (Wire), fp32 accumulation
  // The reduction op's own arithmetic (Shape::scaling; plan/scaling.cpp
  // adds them to any reducing plan, so the verifier proves them and the
  // models price them like the other local steps):
  Scale,   // dst = src x the op's scalar (PreMulSum: this rank's input, before anything reads it)
  Divide,  // dst = dst / Program::divisor (Avg: where the final sum lives, after its last write)
  // Exact plans (Shape::exact_words, CHORUS_REPRODUCIBLE=exact; plan/exact.cpp):
  // the data is the call's float type and its sums travel and add up as the
  // exact accumulator's int64 words (kernels/exact.hpp), exact_words per
  // element, in wire regions (bytes: 8 x exact_words per element); the job's
  // reducer adds int64 words, so a RecvReduce on wire regions is exact.
  Encode,  // dst (Wire) = the accumulator words of src (this rank's own input)
  Decode,  // dst = the correctly rounded value of the words in src (Wire): the one rounding
  // dst = the rounded value of (the words of src + src2's words): src this
  // rank's own input; src2 words (Wire) or a single rank's input as it is
  DecodeAdd,
  EncodeAdd,  // dst (Wire) = the words of src + the words of src2 (each a single rank's input as it is)
};
// Bytes per unit of a region's count: 1 for the wire buffer, else elem_size.
constexpr uint64_t regionBytes(const Region& r, uint64_t elem_size) {
  return r.buf == Buf::Wire ? r.count : r.count * elem_size;
}
constexpr bool isLocal(StepOp op) { return op != StepOp::Send && op != StepOp::Recv && op != StepOp::RecvReduce; }

struct Step {
  StepOp op = StepOp::Copy;
  int32_t peer = -1;
  Region dst;   // Recv, RecvReduce, Copy, Reduce, Scale, Divide
  Region src;   // Send, RecvReduce (accumulator), Copy, Reduce, Scale (Divide: dst)
  Region src2;  // Reduce
};

// The arithmetic a reduction op adds around the combining (chorusPreMulSum's
// scalar, chorusAvg's division), as steps of the plan (plan/scaling.cpp):
//  - PreMulSum: every rank scales its own input once, before any step reads
//    it (into scratch, unless the input is the output of an in-place call,
//    so the user's input is never written);
//  - Avg: every rank whose output holds the final sum (every rank but a
//    reduce's non-roots) divides it by the rank count once, after its last write.
// The scalar is a run-time value the executor's job carries (exec::Job::scalar):
// a Scale step says only "by the op's scalar".
enum class Scaling : uint8_t { None, PreMulSum, Avg };

// Everything a plan depends on.  For the v-collectives the arrays are this
// rank's view (allgatherv: every rank's count and displacement; alltoallv:
// this rank's send and receive counts/displacements per peer).
struct Shape {
  Collective coll = Collective::AllReduce;
  int nranks = 1;
  // allreduce/broadcast/reduce: the count; allgather/gather: the per-rank send
  // count; reducescatter/scatter: the per-rank receive count; alltoall: the
  // count per peer.
  uint64_t count = 0;
  uint32_t elem_size = 4;
  int root = 0;
  bool inplace = false;
  uint64_t chunk_elems = 0;  // pipeline granularity; 0 = one chunk
  std::span<const size_t> counts, displs;    // allgatherv (recv side); alltoallv send side
  std::span<const size_t> counts2, displs2;  // alltoallv receive side
  // Host of every rank (ranks with equal ids share memory; ids are arbitrary
  // ints).  Empty: not known, which the plans treat as one host.  Only the
  // hierarchical algorithms read it.
  std::span<const int> hosts;
  // CHORUS_REPRODUCIBLE=canonical: every reduction must combine the ranks'
  // contributions in the canonical tree (plan/canonical.hpp).  The one-shot
  // plans honour it themselves; the communicator runs the canonical plans
  // (canonicalPlanFor) in place of every other reducing algorithm.
  bool canonical = false;
  // Compressed collectives (issue 19): the data is fp32 and travels in this
  // wire format; only the compressed algorithms (Algorithm::compressed())
  // take a shape with it, and they take no shape without it.
  std::optional<kernels::WireFormat> wire;
  // A reducing collective's op arithmetic (Scaling); None for the others.
  Scaling scaling = Scaling::None;
  // CHORUS_REPRODUCIBLE=exact run by an exact plan (Algorithm::exact()): the
  // data is the call's float type (elem_size its size) and each element's
  // sum travels as this many int64 accumulator words (the call's agreed
  // kernels::ExactLayout); only the exact algorithms take a shape with it,
  // and they take no shape without it.  0: not exact.
  uint32_t exact_words = 0;

  // Elements of the input and output buffers this rank must provide.
  [[nodiscard]] uint64_t inputElems(int rank) const;
  [[nodiscard]] uint64_t outputElems(int rank) const;
};

// One rank's part of a plan, with its dependency graph.
struct Program {
  int rank = 0;
  std::vector<Step> steps;
  // Step i waits for steps deps[dep_begin[i] .. dep_begin[i+1]).
  std::vector<uint32_t> dep_begin;
  std::vector<uint32_t> deps;
  // Reverse edges (CSR): succ[succ_begin[i] .. succ_begin[i+1]) wait for i.
  std::vector<uint32_t> succ_begin;
  std::vector<uint32_t> succ;
  uint64_t scratch_elems = 0;
  uint64_t wire_bytes = 0;  // Buf::Wire's size (compressed plans)
  std::optional<kernels::WireFormat> wire;  // the format of Quantize/Dequantize steps (Shape::wire)
  uint32_t divisor = 0;  // what Divide steps divide by (Avg: the rank count)
  uint32_t exact_words = 0;  // Encode/Decode: int64 words per element (Shape::exact_words)

  [[nodiscard]] size_t size() const { return steps.size(); }
  [[nodiscard]] std::span<const uint32_t> depsOf(size_t i) const {
    return {deps.data() + dep_begin[i], deps.data() + dep_begin[i + 1]};
  }
  [[nodiscard]] std::span<const uint32_t> succOf(size_t i) const {
    return {succ.data() + succ_begin[i], succ.data() + succ_begin[i + 1]};
  }
};

// Builds a Program: algorithms emit steps in an order that is a valid serial
// execution; the builder derives the dependencies (read-after-write,
// write-after-read, write-after-write on overlapping regions, and program
// order between messages to/from the same peer).
// In-place calls: one buffer lives inside the other.  The builder rewrites
// regions of `from` into `to` at `offset` (elements) so that dependencies
// between the aliased buffers are seen and the executor binds one pointer.
struct Alias {
  Buf from = Buf::Input;
  Buf to = Buf::Input;  // from == to: no alias
  uint64_t offset = 0;
};
// The alias of an in-place call of shape on rank (NCCL's conventions).
Alias inplaceAlias(const Shape& shape, int rank);

class ProgramBuilder {
 public:
  void reset(int rank, Alias alias = {});

  void send(int peer, Region src);
  void recv(int peer, Region dst);
  void recvReduce(int peer, Region dst, Region accum);
  void copy(Region dst, Region src);
  void reduce(Region dst, Region a, Region b);
  // Compressed plans: see StepOp.
  void quantize(Region wire, Region src);
  void dequantize(Region dst, Region wire);
  void dequantizeReduce(Region dst, Region accum, Region wire);
  // The op's arithmetic: see StepOp::Scale, StepOp::Divide.
  void scale(Region dst, Region src);
  void divide(Region dst);
  // Exact plans: see StepOp::Encode, StepOp::Decode.
  void encode(Region wire, Region src);
  void decode(Region dst, Region wire);
  void decodeAdd(Region dst, Region own, Region wire_or_raw);
  void encodeAdd(Region wire, Region own, Region raw);
  // From now on, regions of the input the algorithm names are read from
  // `to` (same offsets) instead: PreMulSum's scaled copy of the input.
  // Applied before the in-place alias, so output regions aliased into the
  // input are not moved.
  void redirectInput(Region to) { redirect_ = to; }
  // Wire regions (bytes) are allocated bump-style too.
  Region wire(uint64_t bytes);
  // Scratch regions are allocated bump-style; returns the region.
  Region scratch(uint64_t count);
  // Orders every later step after every earlier one (for messages that carry
  // no data, such as a barrier's tokens).
  void fence();

  // Computes the dependency graph and moves the result into out.
  void finish(Program* out);

 private:
  Region alias(Region r) const;
  Region map(Region r) const;  // redirect, then alias
  void add(Step s);

  Program prog_;
  Alias alias_;
  std::optional<Region> redirect_;
  uint64_t scratch_top_ = 0;
  uint64_t wire_top_ = 0;
  std::vector<uint32_t> fences_;  // step indices where a fence was placed
};

// Convenience for regions.
constexpr Region in(uint64_t off, uint64_t n) { return {Buf::Input, off, n}; }
constexpr Region out(uint64_t off, uint64_t n) { return {Buf::Output, off, n}; }
constexpr Region scr(uint64_t off, uint64_t n) { return {Buf::Scratch, off, n}; }

// ---- Round patterns: the plan as the simulator and cost models see it ------
//
// A plan's messages grouped into rounds, each described by a peer *pattern*
// instead of a list, so that a 131,072-rank ring is two Rounds, not 10^10
// steps (DESIGN.md).  rounds() costs O(rounds), independent of the rank count
// for the uniform families.  Rounds describe unsliced messages: the executor's
// pipelining (Shape::chunk_elems) splits a message into slices but moves the
// same bytes between the same pairs, so it is a timing detail for the models.
// tests/unit/sim_rounds_test.cpp cross-checks every algorithm's rounds
// against its expanded programs for n <= 16 so the two cannot drift.
enum class Peers : uint8_t {
  Shift,     // every rank r sends to (r + arg) mod n
  Xor,       // recursive doubling over the n - fold "core" ranks: core v sends to v ^ arg;
             // core v is real rank 2v+1 for v < fold, else v + fold (fold = 0: all ranks)
  FoldIn,    // rank 2i sends to 2i+1, for i < fold
  FoldOut,   // rank 2i+1 sends to 2i, for i < fold
  TreeDown,  // binomial level arg: virtual v = (r - root) mod n with v % (2 arg) == 0 and
             // v + arg < n sends to v + arg
  TreeUp,    // binomial level arg: virtual v with v % (2 arg) == arg sends to v - arg
  Chain,     // virtual ranks 0..n-2 each send to the next (a pipelined chain: one stream)
  AllPairs,  // every rank sends to every other rank
  Explicit,  // the messages are listed in Round::msgs (derived plans; small n only)
  // Double binary tree, level arg >= 1 of two heap-shaped trees at once (the
  // second mirrored, v -> n - 1 - v): HeapUp: every node at depth arg sends to
  // its parent (v - 1) / 2; HeapDown: every parent sends to it.
  HeapUp,
  HeapDown,
};

struct RoundMessage {
  int32_t src = 0, dst = 0;
  uint64_t elems = 0;
};

struct Round {
  uint64_t repeat = 1;  // back-to-back rounds of the same pattern (ring: n - 1)
  Peers peers = Peers::Shift;
  int64_t arg = 1;      // Shift: distance; Xor: mask; Tree*: child offset m
  int32_t root = 0;     // Tree*, Chain: the root (virtual rank 0)
  int32_t fold = 0;     // Xor, Fold*: ranks folded away (0 for a power of two)
  uint64_t elems = 0;   // elements per message (the largest when a split is ragged)
  // Tree*: a message carries a subtree of blocks, elems * min(arg, n - child)
  // where child is the non-root end (gather, scatter).
  bool subtree = false;
  bool reduce = false;  // the receiver reduces what it receives
  // With reduce: the receiver lands the message in scratch and reduces it in a
  // separate pass (recursive doubling, Rabenseifner) instead of reducing
  // straight out of the transport's memory (RecvReduce): one more pass over
  // the bytes, which the cost model charges.
  bool staged = false;
  std::vector<RoundMessage> msgs;  // Explicit only

  // Elements of the message that the child at virtual rank `child` carries.
  [[nodiscard]] uint64_t elemsFor(int n, int child) const {
    return subtree ? elems * static_cast<uint64_t>(std::min<int64_t>(arg, n - child)) : elems;
  }
};

// Calls f(src, dst, elems) for every message of one repetition of r on n
// ranks, in O(messages) time and O(1) memory.
template <typename F>
void forEachMessage(const Round& r, int n, F&& f) {
  auto real = [&](int64_t v) { return static_cast<int>(((v + r.root) % n + n) % n); };
  switch (r.peers) {
    case Peers::Shift:
      if (n > 1 && r.arg % n != 0)
        for (int i = 0; i < n; ++i) f(i, static_cast<int>(((i + r.arg) % n + n) % n), r.elems);
      break;
    case Peers::Xor: {
      const int p = n - r.fold;
      auto core = [&](int v) { return v < r.fold ? 2 * v + 1 : v + r.fold; };
      for (int v = 0; v < p; ++v)
        if (int w = v ^ static_cast<int>(r.arg); w < p) f(core(v), core(w), r.elems);
      break;
    }
    case Peers::FoldIn:
      for (int i = 0; i < r.fold; ++i) f(2 * i, 2 * i + 1, r.elems);
      break;
    case Peers::FoldOut:
      for (int i = 0; i < r.fold; ++i) f(2 * i + 1, 2 * i, r.elems);
      break;
    case Peers::TreeDown:
      for (int64_t v = 0; v + r.arg < n; v += 2 * r.arg)
        f(real(v), real(v + r.arg), r.elemsFor(n, static_cast<int>(v + r.arg)));
      break;
    case Peers::TreeUp:
      for (int64_t v = r.arg; v < n; v += 2 * r.arg) f(real(v), real(v - r.arg), r.elemsFor(n, static_cast<int>(v)));
      break;
    case Peers::Chain:
      for (int v = 0; v + 1 < n; ++v) f(real(v), real(v + 1), r.elems);
      break;
    case Peers::AllPairs:
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          if (i != j) f(i, j, r.elems);
      break;
    case Peers::Explicit:
      for (const RoundMessage& m : r.msgs) f(m.src, m.dst, m.elems);
      break;
    case Peers::HeapUp:
    case Peers::HeapDown: {
      const int64_t lo = (int64_t{1} << r.arg) - 1, hi = std::min<int64_t>((int64_t{1} << (r.arg + 1)) - 1, n);
      for (int mirror = 0; mirror < 2; ++mirror)
        for (int64_t v = lo; v < hi; ++v) {
          const int child = static_cast<int>(mirror ? n - 1 - v : v);
          const int parent = static_cast<int>(mirror ? n - 1 - (v - 1) / 2 : (v - 1) / 2);
          if (r.peers == Peers::HeapUp)
            f(child, parent, r.elems);
          else
            f(parent, child, r.elems);
        }
      break;
    }
  }
}

// Derives rounds by expanding every rank's program (round j = every rank's
// j-th send); the default for an algorithm without its own rounds().  Costs
// O(n x steps^2), so it refuses n > kMaxDerivedRanks.
constexpr int kMaxDerivedRanks = 256;

// The library's default pipeline slice (Shape::chunk_elems, in bytes): small
// enough to keep several slices in flight and in cache, large enough to
// amortise a message's fixed cost; larger across hosts, where that cost is
// higher.  The tuner and the simulator use the same figures.
constexpr uint64_t kChunkBytesOneHost = 512u << 10;
constexpr uint64_t kChunkBytesAcrossHosts = 1u << 20;
// The one-shot plans (src/plan/oneshot.cpp) are not offered above
// kOneShotMaxRanks (n - 1 messages per rank, and O(n^2) to price).  Over
// shared memory the small ones run through the transport's board
// (exec/board_runner.hpp, exec::kBoardBytes).
constexpr int kOneShotMaxRanks = 64;
class Algorithm;
Result<std::vector<Round>> deriveRounds(const Algorithm& algo, const Shape& shape);

// An algorithm: a self-describing value in a registry the communicator owns.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;  // "ring", "recursive_doubling", ...
  [[nodiscard]] virtual Collective collective() const = 0;
  // Whether the algorithm handles this shape (e.g. a power-of-two constraint).
  [[nodiscard]] virtual bool supports(const Shape& shape) const {
    (void)shape;
    return true;
  }
  // What supports() asks of a shape, in words, for messages that say why a
  // forced algorithm did not run ("a power-of-two number of ranks"); "" when
  // it takes every shape.
  [[nodiscard]] virtual std::string_view requirement() const { return {}; }
  // Emits rank's program for shape (the builder is already reset).
  virtual void generate(const Shape& shape, int rank, ProgramBuilder& b) const = 0;
  // The plan's rounds as patterns (see Round).  The default derives them from
  // the expanded programs, which works for any algorithm but only for small n.
  [[nodiscard]] virtual Result<std::vector<Round>> rounds(const Shape& shape) const {
    return deriveRounds(*this, shape);
  }
  // A pipelined plan (a tree's slices flowing up and down at once) moves its
  // data in S slices, and the slices overlap: slice s + 1 runs the first
  // rounds while slice s runs the later ones.  Its rounds() then describe the
  // whole data passing through the stages, and the cost models price
  //     fill (every round once, with 1/S of the bytes, in sequence)
  //   + (S - 1) x steady state (all rounds at once, 1/S of the bytes each),
  // see pricePipelined() in src/sim/network.cpp and src/tune/cost_model.cpp.
  // 1 (the default): the rounds run one after another.
  [[nodiscard]] virtual uint64_t pipelineSlices(const Shape& shape) const {
    (void)shape;
    return 1;
  }
  // A one-shot exchange: every rank's whole input goes to every other rank in
  // one all-pairs round, which the board runner may run over a shared-memory
  // transport's board (exec/board_runner.hpp) for small inputs.
  [[nodiscard]] virtual bool oneShot() const { return false; }
  // A compressed plan (src/plan/compressed.cpp): it takes only shapes with a
  // wire format (Shape::wire), and the tuner offers it only for those.
  [[nodiscard]] virtual bool compressed() const { return false; }
  // The most times the plan quantizes any element on its way from an input to
  // an output (the count docs/algorithms.md derives the error bound from);
  // the verifier proves it.  0: the plan never quantizes.
  // An exact plan (src/plan/exact.cpp): it takes only shapes with
  // Shape::exact_words, and the tuner offers it only for those.
  [[nodiscard]] virtual bool exact() const { return false; }
  [[nodiscard]] virtual int quantizations(const Shape& shape) const {
    (void)shape;
    return 0;
  }
  // Whether generate() emits the op's Scale and Divide steps itself
  // (Shape::scaling); else expand() adds them around its steps
  // (addScaling), which is what every built-in algorithm relies on.
  [[nodiscard]] virtual bool scalesItself() const { return false; }
};

// Shape::scaling's steps around an algorithm's (plan/scaling.cpp):
// beginScaling before generate() (PreMulSum: the Scale step and the input's
// redirection to its scaled copy), endScaling after (Avg: the Divide step).
// expand() calls them for an algorithm that does not scale itself.
void beginScaling(const Shape& shape, int rank, ProgramBuilder& b);
void endScaling(const Shape& shape, int rank, ProgramBuilder& b);
// Elements rank's Scale and Divide steps pass over (the models' local work).
uint64_t scalingElems(const Shape& shape, int rank);

// Generates rank's program of algo for shape.
void expand(const Algorithm& algo, const Shape& shape, int rank, Program* out);

// The algorithms a communicator can choose from.
class Registry {
 public:
  // A registry with every built-in algorithm.
  static Registry builtin();
  // builtin() and the plans of these files and directories, each proven by
  // the verifier as it loads (plan/plan_file.hpp, loadPlans).
  static Result<Registry> withPlans(std::span<const std::string> paths);

  void add(std::unique_ptr<Algorithm> algo);
  [[nodiscard]] const Algorithm* find(Collective c, std::string_view name) const;
  [[nodiscard]] std::vector<const Algorithm*> forCollective(Collective c) const;
  [[nodiscard]] std::span<const std::unique_ptr<Algorithm>> all() const { return algos_; }

 private:
  std::vector<std::unique_ptr<Algorithm>> algos_;
};

// Built-in algorithm families (one file each under src/plan/).
void addRingAlgorithms(Registry& r);
void addTreeAlgorithms(Registry& r);
void addRecursiveDoublingAlgorithms(Registry& r);
void addExchangeAlgorithms(Registry& r);  // pairwise alltoall(v), barrier, send/recv, direct
void addRabenseifnerAlgorithms(Registry& r);  // halving-doubling allreduce, recursive-halving reduce-scatter
void addBruckAlgorithms(Registry& r);         // Bruck allgather and alltoall
void addDoubleTreeAlgorithms(Registry& r);    // double binary tree allreduce, scatter-allgather broadcast
void addDirectAlgorithms(Registry& r);        // direct (all-pairs) allreduce for ranks sharing memory
void addHierarchicalAlgorithms(Registry& r);  // two-level allreduce / allgather across hosts
void addOneShotAlgorithms(Registry& r);       // one-shot allreduce (the shared-memory board's plan)
void addCompressedAlgorithms(Registry& r);    // compressed allreduce / reduce-scatter / allgather
void addExactAlgorithms(Registry& r);         // exact-accumulator ring allreduce / reduce-scatter

}  // namespace chorus::plan
