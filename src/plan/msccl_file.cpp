// MSCCL's XML algorithm format as a plan reader (plan_file.hpp,
// docs/msccl.md).
//
// The format (as msccl-tools writes it and RCCL's MSCCL runtime reads it,
// src/misc/msccl/msccl_parser.cc in ROCm/rccl): <algo> with ngpus, coll,
// nchunksperloop, proto, nchannels, inplace, outofplace; a <gpu id i_chunks
// o_chunks s_chunks> per rank; in it <tb id send recv chan> thread blocks,
// each with at most one peer to send to and one to receive from on its
// channel; in each, <step s type srcbuf srcoff dstbuf dstoff cnt depid deps
// hasdep> in program order.  Thread blocks run in parallel; a step with
// depid/deps waits until thread block depid of the same GPU has finished its
// step deps.  A send on (channel c, to peer p) pairs with p's receive on
// (channel c, from this GPU), in order.
//
// chorus's plan is one program per rank whose messages between two ranks
// match in program order (plan.hpp), the builder deriving the data
// dependencies.  So the reader runs the MSCCL program once, symbolically:
// a step fires when its thread block reaches it, its dependency has fired
// and (for a receive) its message was sent; the order in which each GPU's
// steps fire is a serial execution of its thread blocks, and becomes the
// rank's program.  Message order between two ranks must be one FIFO in
// chorus but is one per channel in MSCCL: the run lets a receive fire only
// when its message is the oldest unreceived one of the pair, and delays
// sends until their receiver waits for them.  If that order does not exist
// the file is refused (and a program that deadlocks even with per-channel
// order is refused as a deadlock, with the step that never runs).
//
// The same run checks MSCCL's own concurrency: two steps of different thread
// blocks of one GPU that touch a chunk (one of them writing) must be ordered
// by the program (thread-block order, depid/deps, messages): vector clocks
// over the thread blocks decide it, and a race is refused with both steps.
//
// The thread blocks, channels, depid/deps and protocol stay with the plan as
// its schedule (PlanSpec::streams, proto): each lowered step's thread block
// and channel, and for the first step of an MSCCL step the steps its
// depid/deps (and the nops before it) waited for.  The verifier and the
// executor ignore it; the simulator prices the plan by it
// (sim/program_flow.cpp).
//
// Fused steps become sequences chorus's verifier proves: rcs = recv + send of
// what arrived; rrc = recvReduce; rrcs = recvReduce + send of the result;
// rrs = recvReduce into a scratch chunk of its own + send of it (MSCCL
// keeps that sum in registers); re = reduce(dst, dst, src); nop = nothing.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <deque>
#include <map>
#include <set>

#include "common/xml.hpp"
#include "plan/plan_file.hpp"

namespace chorus::plan {
namespace {

enum class MOp : uint8_t { Send, Recv, RecvCopySend, RecvReduceCopy, RecvReduceSend, RecvReduceCopySend, Copy, Reduce, Nop };
struct MOpInfo {
  std::string_view name;
  bool recv, send;        // receives from the tb's recv peer / sends to its send peer
  bool reads_src;         // srcbuf/srcoff are read
  bool writes_dst;        // dstbuf/dstoff are written
  bool reads_dst;         // ... and read (re; rcs sends what it wrote)
};
constexpr MOpInfo kOps[] = {
    {"s", false, true, true, false, false},    {"r", true, false, false, true, false},
    {"rcs", true, true, false, true, true},    {"rrc", true, false, true, true, false},
    {"rrs", true, true, true, false, false},   {"rrcs", true, true, true, true, false},
    {"cpy", false, false, true, true, false},  {"re", false, false, true, true, true},
    {"nop", false, false, false, false, false},
};
const MOpInfo& info(MOp op) { return kOps[static_cast<int>(op)]; }

struct MStep {
  MOp op = MOp::Nop;
  Buf srcbuf = Buf::Input, dstbuf = Buf::Input;
  int64_t srcoff = 0, dstoff = 0, cnt = 0;
  int depid = -1, deps = -1;  // depid: the tb's position (ids are mapped on reading)
  uint32_t line = 0;
};
struct MTb {
  int id = 0, send = -1, recv = -1, chan = 0;
  uint32_t line = 0;
  std::vector<MStep> steps;
};
struct MGpu {
  int64_t i_chunks = 0, o_chunks = 0, s_chunks = 0;
  uint32_t line = 0;
  std::vector<MTb> tbs;
};

constexpr int kMaxTbsPerGpu = 1024;
constexpr int kMaxChannel = 1024;
constexpr int64_t kMaxChunkIndex = int64_t{1} << 24;
// Vector clocks: entries (thread blocks x clocks kept) the race check may hold.
constexpr uint64_t kMaxClockEntries = uint64_t{1} << 26;

std::string_view bufLetter(Buf b) { return b == Buf::Input ? "i" : b == Buf::Output ? "o" : "s"; }

// The plan's name: the file's stem, lower case, other characters as '_'.
std::string stemName(std::string_view origin, std::string_view algo_name) {
  std::string_view s = origin;
  if (const size_t slash = s.rfind('/'); slash != std::string_view::npos) s = s.substr(slash + 1);
  if (s.size() > 4 && s.substr(s.size() - 4) == ".xml") s = s.substr(0, s.size() - 4);
  if (s.empty()) s = algo_name;
  std::string n;
  for (char c : s) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    n += (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '-' || l == '.' || l == '_' ? l : '_';
    if (n.size() == kPlanMaxName) break;
  }
  return n.empty() ? std::string("msccl") : n;
}

class Importer {
 public:
  Importer(std::string_view origin) : origin_(origin) {}
  Result<PlanSpec> run(std::string_view text);

 private:
  Status fail(uint32_t line, std::string_view elem, std::string what) const {
    return invalidArgument("{}:{}: <{}> {}", origin_, line, elem, what);
  }
  Status failAttr(const XmlElement& e, const XmlAttribute& a, std::string what) const {
    return invalidArgument("{}:{}: <{}> attribute '{}': {}", origin_, a.line, e.name, a.name, what);
  }
  Status allowed(const XmlElement& e, std::initializer_list<std::string_view> names) const;
  Result<const XmlAttribute*> need(const XmlElement& e, std::string_view name) const;
  Result<int64_t> integer(const XmlElement& e, std::string_view name, int64_t lo, int64_t hi) const;
  Result<Buf> buffer(const XmlElement& e, std::string_view name) const;
  Status readAlgo(const XmlElement& root);
  Status readGpu(const XmlElement& g);
  Status checkGpu(int g);
  Status chunkCount();
  Status schedule(bool strict, bool emit);
  Status lower(int g, int t, uint32_t idx);
  ChunkRef mapRef(int g, Buf b, int64_t off, bool alias) const;
  std::string where(int g, int t, size_t s) const;

  std::string origin_;
  std::string coll_name_, proto_, algo_name_;
  uint32_t algo_line_ = 0;
  int ngpus_ = 0;
  int64_t nchunksperloop_ = 0, nchannels_ = 0;
  bool inplace_ = false, outofplace_ = false;
  std::vector<MGpu> gpus_;
  std::vector<uint32_t> gpu_line_;  // 0: no <gpu> yet
  PlanSpec spec_;
  std::vector<uint32_t> temp_top_;  // next private scratch chunk of each rank (rrs)
  // The schedule (PlanSpec::streams): per gpu, tb and MSCCL step, the chorus
  // steps whose completion is that step's (its last lowered step, or for a
  // nop what it waited for); per gpu and tb, the waits of nops not yet
  // passed on to a step.
  std::vector<std::vector<std::vector<std::vector<uint32_t>>>> frontier_;
  std::vector<std::vector<std::vector<uint32_t>>> carry_;
  std::vector<std::vector<int64_t>> last_;  // per gpu and tb: its last lowered step, -1: none yet
  uint64_t schedule_entries_ = 0;           // nop frontiers kept (bounded like the clocks)
};

Status Importer::allowed(const XmlElement& e, std::initializer_list<std::string_view> names) const {
  for (const XmlAttribute& a : e.attributes)
    if (std::find(names.begin(), names.end(), a.name) == names.end()) {
      std::string list;
      for (std::string_view n : names) list += fmt::format("{}{}", list.empty() ? "" : ", ", n);
      return failAttr(e, a, fmt::format("not an attribute of MSCCL's <{}> (it has {})", e.name, list));
    }
  return {};
}

Result<const XmlAttribute*> Importer::need(const XmlElement& e, std::string_view name) const {
  const XmlAttribute* a = e.find(name);
  if (a == nullptr) return fail(e.line, e.name, fmt::format("lacks attribute '{}'", name));
  return a;
}

Result<int64_t> Importer::integer(const XmlElement& e, std::string_view name, int64_t lo, int64_t hi) const {
  CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* a, need(e, name));
  const std::string& v = a->value;
  int64_t x = 0;
  const char* b = v.data();
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(b, end, x);
  if (v.empty() || ec != std::errc() || p != end || (v[0] == '-' && v.size() == 1))
    return failAttr(e, *a, fmt::format("'{}' is not a decimal integer", xmlShown(v)));
  if (x < lo || x > hi) return failAttr(e, *a, fmt::format("{} is out of range ({} to {})", x, lo, hi));
  return x;
}

Result<Buf> Importer::buffer(const XmlElement& e, std::string_view name) const {
  CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* a, need(e, name));
  if (a->value == "i") return Buf::Input;
  if (a->value == "o") return Buf::Output;
  if (a->value == "s") return Buf::Scratch;
  return failAttr(e, *a, fmt::format("'{}' is not a buffer (i: input, o: output, s: scratch)", xmlShown(a->value)));
}

std::string Importer::where(int g, int t, size_t s) const {
  const MTb& tb = gpus_[g].tbs[t];
  const MStep& st = tb.steps[s];
  return fmt::format("gpu {} tb {} step {} (line {}, {})", g, tb.id, s, st.line, info(st.op).name);
}

Status Importer::readAlgo(const XmlElement& root) {
  if (root.name != "algo")
    return fail(root.line, root.name, "is not MSCCL's root element <algo> (an MSCCL algorithm file holds one <algo>)");
  algo_line_ = root.line;
  CHORUS_RETURN_IF_ERROR(allowed(root, {"name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
                                        "outofplace", "minBytes", "maxBytes", "maxcount", "nthreadblocks", "redop"}));
  CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* name, need(root, "name"));
  algo_name_ = name->value;
  CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* coll, need(root, "coll"));
  coll_name_ = coll->value;
  Collective c;
  if (coll_name_ == "allreduce") c = Collective::AllReduce;
  else if (coll_name_ == "allgather") c = Collective::AllGather;
  else if (coll_name_ == "alltoall") c = Collective::AllToAll;
  else if (coll_name_ == "reducescatter") c = Collective::ReduceScatter;
  else if (coll_name_ == "broadcast" || coll_name_ == "reduce" || coll_name_ == "gather" || coll_name_ == "scatter")
    return failAttr(root, *coll, fmt::format("'{}' is rooted, and MSCCL's XML names no root: not imported "
                                             "(allreduce, allgather, alltoall and reducescatter are)", coll_name_));
  else
    return failAttr(root, *coll, fmt::format("'{}' is not a collective this reader imports (allreduce, allgather, "
                                             "alltoall, reducescatter)", xmlShown(coll_name_)));
  spec_.coll = c;
  if (const XmlAttribute* r = root.find("redop"); r != nullptr && r->value != "sum")
    return failAttr(root, *r, fmt::format("'{}': the plan's reduction is the call's op; only 'sum' (the default) "
                                          "is read", xmlShown(r->value)));
  CHORUS_ASSIGN_OR_RETURN(const int64_t n, integer(root, "ngpus", kPlanMinRanks, kPlanMaxRanks));
  ngpus_ = static_cast<int>(n);
  CHORUS_ASSIGN_OR_RETURN(nchunksperloop_, integer(root, "nchunksperloop", 1, int64_t{kPlanMaxChunks} * kPlanMaxRanks));
  CHORUS_ASSIGN_OR_RETURN(nchannels_, integer(root, "nchannels", 1, kMaxChannel));
  CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* proto, need(root, "proto"));
  if (proto->value != "LL" && proto->value != "LL128" && proto->value != "Simple")
    return failAttr(root, *proto, fmt::format("'{}' is not one of MSCCL's protocols (LL, LL128, Simple)",
                                              xmlShown(proto->value)));
  proto_ = proto->value;
  CHORUS_ASSIGN_OR_RETURN(const int64_t inplace, integer(root, "inplace", 0, 1));
  inplace_ = inplace == 1;
  // Files before RCCL added 'outofplace' are one or the other.
  if (root.find("outofplace") != nullptr) {
    CHORUS_ASSIGN_OR_RETURN(const int64_t oop, integer(root, "outofplace", 0, 1));
    outofplace_ = oop == 1;
  } else {
    outofplace_ = !inplace_;
  }
  if (!inplace_ && !outofplace_)
    return fail(root.line, "algo", "claims neither form of the call (inplace=\"0\" and outofplace=\"0\")");
  for (std::string_view k : {"minBytes", "maxBytes", "maxcount", "nthreadblocks"})
    if (root.find(k) != nullptr) CHORUS_RETURN_IF_ERROR(integer(root, k, -1, INT64_MAX).status());
  CHORUS_RETURN_IF_ERROR(chunkCount());

  gpus_.assign(static_cast<size_t>(ngpus_), {});
  gpu_line_.assign(static_cast<size_t>(ngpus_), 0);
  size_t steps = 0;
  for (const XmlElement& g : root.children) {
    if (g.name != "gpu") return fail(g.line, g.name, "inside <algo>: only <gpu> elements belong there");
    CHORUS_RETURN_IF_ERROR(readGpu(g));
  }
  for (int g = 0; g < ngpus_; ++g) {
    if (gpu_line_[g] == 0)
      return fail(algo_line_, "algo", fmt::format("has no <gpu id=\"{}\"> (ngpus=\"{}\" needs ids 0 to {})", g, ngpus_,
                                                 ngpus_ - 1));
    for (const MTb& tb : gpus_[g].tbs) steps += tb.steps.size();
  }
  if (steps > kPlanMaxSteps)
    return fail(algo_line_, "algo", fmt::format("{} steps: at most {} are read", steps, kPlanMaxSteps));
  for (int g = 0; g < ngpus_; ++g) CHORUS_RETURN_IF_ERROR(checkGpu(g));
  return {};
}

// chorus's chunks per rank block (C) from nchunksperloop: the whole buffer of
// an allreduce, one rank's block of an allgather's output or an alltoall's or
// reducescatter's input.
Status Importer::chunkCount() {
  const bool per_rank = spec_.coll != Collective::AllReduce;
  if (per_rank && nchunksperloop_ % ngpus_ != 0)
    return fail(algo_line_, "algo", fmt::format("nchunksperloop=\"{}\" is not a multiple of ngpus=\"{}\" (a {}'s "
                                                "buffer is a block per GPU)", nchunksperloop_, ngpus_, coll_name_));
  const int64_t c = per_rank ? nchunksperloop_ / ngpus_ : nchunksperloop_;
  if (c < 1 || c > kPlanMaxChunks)
    return fail(algo_line_, "algo", fmt::format("{} chunks per rank block: a plan has 1 to {}", c, kPlanMaxChunks));
  spec_.chunks = static_cast<uint32_t>(c);
  spec_.nranks = ngpus_;
  spec_.inplace = inplace_ && outofplace_ ? PlanInPlace::Both : inplace_ ? PlanInPlace::Yes : PlanInPlace::No;
  return {};
}

Status Importer::readGpu(const XmlElement& e) {
  CHORUS_RETURN_IF_ERROR(allowed(e, {"id", "i_chunks", "o_chunks", "s_chunks"}));
  CHORUS_ASSIGN_OR_RETURN(const int64_t id, integer(e, "id", 0, ngpus_ - 1));
  const auto g = static_cast<size_t>(id);
  if (gpu_line_[g] != 0) return fail(e.line, e.name, fmt::format("id=\"{}\" given twice (first on line {})", id, gpu_line_[g]));
  gpu_line_[g] = e.line;
  MGpu& gpu = gpus_[g];
  gpu.line = e.line;
  CHORUS_ASSIGN_OR_RETURN(gpu.i_chunks, integer(e, "i_chunks", 0, kMaxChunkIndex));
  CHORUS_ASSIGN_OR_RETURN(gpu.o_chunks, integer(e, "o_chunks", 0, kMaxChunkIndex));
  CHORUS_ASSIGN_OR_RETURN(gpu.s_chunks, integer(e, "s_chunks", 0, kPlanMaxScratch));
  std::map<int, size_t> tb_line;
  for (const XmlElement& t : e.children) {
    if (t.name != "tb") return fail(t.line, t.name, "inside <gpu>: only <tb> elements belong there");
    if (gpu.tbs.size() == kMaxTbsPerGpu)
      return fail(t.line, t.name, fmt::format("more than {} thread blocks on gpu {}", kMaxTbsPerGpu, id));
    CHORUS_RETURN_IF_ERROR(allowed(t, {"id", "send", "recv", "chan"}));
    MTb tb;
    tb.line = t.line;
    CHORUS_ASSIGN_OR_RETURN(const int64_t tid, integer(t, "id", 0, kMaxTbsPerGpu - 1));
    tb.id = static_cast<int>(tid);
    if (auto [it, fresh] = tb_line.emplace(tb.id, t.line); !fresh)
      return fail(t.line, t.name, fmt::format("id=\"{}\" given twice on gpu {} (first on line {})", tid, id, it->second));
    CHORUS_ASSIGN_OR_RETURN(const int64_t send, integer(t, "send", -1, ngpus_ - 1));
    CHORUS_ASSIGN_OR_RETURN(const int64_t recv, integer(t, "recv", -1, ngpus_ - 1));
    CHORUS_ASSIGN_OR_RETURN(const int64_t chan, integer(t, "chan", 0, kMaxChannel));
    if (send == id || recv == id)
      return fail(t.line, t.name, fmt::format("{}=\"{}\" is its own gpu (a GPU sends nothing to itself)",
                                              send == id ? "send" : "recv", id));
    tb.send = static_cast<int>(send);
    tb.recv = static_cast<int>(recv);
    tb.chan = static_cast<int>(chan);
    for (const XmlElement& s : t.children) {
      if (s.name != "step") return fail(s.line, s.name, "inside <tb>: only <step> elements belong there");
      CHORUS_RETURN_IF_ERROR(
          allowed(s, {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"}));
      MStep st;
      st.line = s.line;
      CHORUS_ASSIGN_OR_RETURN(const int64_t idx, integer(s, "s", 0, INT32_MAX));
      if (idx != static_cast<int64_t>(tb.steps.size()))
        return fail(s.line, s.name, fmt::format("s=\"{}\" at position {} of its thread block (steps are numbered 0, "
                                                "1, ... in order)", idx, tb.steps.size()));
      CHORUS_ASSIGN_OR_RETURN(const XmlAttribute* type, need(s, "type"));
      const auto op = std::find_if(std::begin(kOps), std::end(kOps), [&](const MOpInfo& o) { return o.name == type->value; });
      if (op == std::end(kOps))
        return failAttr(s, *type, fmt::format("'{}' is not one of MSCCL's step types (s, r, rcs, rrc, rrs, rrcs, cpy, "
                                              "re, nop)", xmlShown(type->value)));
      st.op = static_cast<MOp>(op - std::begin(kOps));
      CHORUS_ASSIGN_OR_RETURN(st.srcbuf, buffer(s, "srcbuf"));
      CHORUS_ASSIGN_OR_RETURN(st.dstbuf, buffer(s, "dstbuf"));
      CHORUS_ASSIGN_OR_RETURN(st.srcoff, integer(s, "srcoff", -1, kMaxChunkIndex));
      CHORUS_ASSIGN_OR_RETURN(st.dstoff, integer(s, "dstoff", -1, kMaxChunkIndex));
      const bool moves = st.op != MOp::Nop;
      CHORUS_ASSIGN_OR_RETURN(st.cnt, integer(s, "cnt", moves ? 1 : 0, kPlanMaxChunks * int64_t{kPlanMaxRanks}));
      CHORUS_ASSIGN_OR_RETURN(const int64_t depid, integer(s, "depid", -1, kMaxTbsPerGpu - 1));
      CHORUS_ASSIGN_OR_RETURN(const int64_t deps, integer(s, "deps", -1, INT32_MAX));
      CHORUS_RETURN_IF_ERROR(integer(s, "hasdep", 0, 1).status());
      if ((depid < 0) != (deps < 0))
        return fail(s.line, s.name, fmt::format("depid=\"{}\" with deps=\"{}\": both name a step or both are -1", depid,
                                                deps));
      st.depid = static_cast<int>(depid);  // an id until checkGpu maps it
      st.deps = static_cast<int>(deps);
      const MOpInfo& oi = info(st.op);
      if (oi.send && tb.send < 0)
        return fail(s.line, s.name, fmt::format("type=\"{}\" sends, but its <tb> (line {}) has send=\"-1\"", oi.name, t.line));
      if (oi.recv && tb.recv < 0)
        return fail(s.line, s.name, fmt::format("type=\"{}\" receives, but its <tb> (line {}) has recv=\"-1\"", oi.name,
                                                t.line));
      // The chunks it names exist in the GPU's declared buffers.
      auto inDeclared = [&](bool used, Buf b, int64_t off, std::string_view role) -> Status {
        if (!used) return {};
        const int64_t have = b == Buf::Input ? gpu.i_chunks : b == Buf::Output ? gpu.o_chunks : gpu.s_chunks;
        if (off < 0 || off + st.cnt > have)
          return fail(s.line, s.name, fmt::format("{}buf=\"{}\" {}off=\"{}\" cnt=\"{}\": past the {} chunks gpu {} "
                                                  "declares ({}_chunks=\"{}\")", role, bufLetter(b), role, off, st.cnt,
                                                  have, id, bufLetter(b), have));
        return {};
      };
      CHORUS_RETURN_IF_ERROR(inDeclared(oi.reads_src, st.srcbuf, st.srcoff, "src"));
      CHORUS_RETURN_IF_ERROR(inDeclared(oi.writes_dst, st.dstbuf, st.dstoff, "dst"));
      tb.steps.push_back(st);
    }
    gpu.tbs.push_back(std::move(tb));
  }
  return {};
}

// Rules between the thread blocks of a GPU: dependencies name a step that
// exists; one thread block per (peer, channel) and direction.
Status Importer::checkGpu(int g) {
  MGpu& gpu = gpus_[g];
  std::map<int, int> pos;  // tb id -> position
  for (size_t t = 0; t < gpu.tbs.size(); ++t) pos[gpu.tbs[t].id] = static_cast<int>(t);
  std::map<std::pair<int, int>, uint32_t> sends, recvs;  // (peer, chan) -> line
  for (MTb& tb : gpu.tbs) {
    for (auto [peer, map, dir] : {std::tuple{tb.send, &sends, "send"}, std::tuple{tb.recv, &recvs, "recv"}}) {
      if (peer < 0) continue;
      if (auto [it, fresh] = map->emplace(std::pair{peer, tb.chan}, tb.line); !fresh)
        return fail(tb.line, "tb", fmt::format("{}=\"{}\" chan=\"{}\": gpu {} has another thread block for that "
                                               "connection (line {}); MSCCL gives each (peer, channel) one",
                                               dir, peer, tb.chan, g, it->second));
    }
    for (MStep& st : tb.steps) {
      if (st.depid < 0) continue;
      const auto it = pos.find(st.depid);
      if (it == pos.end())
        return fail(st.line, "step", fmt::format("depid=\"{}\": gpu {} has no thread block of that id", st.depid, g));
      if (static_cast<size_t>(st.deps) >= gpu.tbs[it->second].steps.size())
        return fail(st.line, "step", fmt::format("deps=\"{}\": thread block {} of gpu {} has {} steps", st.deps,
                                                 st.depid, g, gpu.tbs[it->second].steps.size()));
      st.depid = it->second;
    }
  }
  return {};
}

// In a plan that claims only the in-place form, MSCCL's input and output are
// one buffer: the reader names it as chorus's builder binds it (the input
// slot inside the output, or the output's slot inside the input).
ChunkRef Importer::mapRef(int g, Buf b, int64_t off, bool alias) const {
  const auto c = static_cast<uint32_t>(off);
  if (!alias) return {b, c};
  const uint32_t C = spec_.chunks;
  switch (facts(spec_.coll).inplace_rule) {
    case InPlace::Same:
      if (b == Buf::Input) return {Buf::Output, c};
      break;
    case InPlace::InputInOutput:
      if (b == Buf::Input) return {Buf::Output, static_cast<uint32_t>(g) * C + c};
      break;
    case InPlace::OutputInInput:
      if (b == Buf::Input && c >= static_cast<uint32_t>(g) * C && c < static_cast<uint32_t>(g + 1) * C)
        return {Buf::Output, c - static_cast<uint32_t>(g) * C};
      break;
    default: break;
  }
  return {b, c};
}

Status Importer::lower(int g, int t, uint32_t idx) {
  const MTb& tb = gpus_[g].tbs[t];
  const MStep& s = tb.steps[idx];
  auto& prog = spec_.programs[static_cast<size_t>(g)];
  auto& streams = spec_.streams[static_cast<size_t>(g)];
  const auto n = static_cast<uint32_t>(s.cnt);
  const bool alias = spec_.inplace == PlanInPlace::Yes;
  const ChunkRef src = mapRef(g, s.srcbuf, s.srcoff, alias), dst = mapRef(g, s.dstbuf, s.dstoff, alias);
  std::vector<ChunkStep> out;
  auto step = [&](StepOp op, int peer, ChunkRef d, ChunkRef a, ChunkRef b = {}) {
    ChunkStep c;
    c.op = op;
    c.peer = peer;
    c.dst = d;
    c.src = a;
    c.src2 = b;
    c.n = n;
    out.push_back(c);
  };
  switch (s.op) {
    case MOp::Send: step(StepOp::Send, tb.send, {}, src); break;
    case MOp::Recv: step(StepOp::Recv, tb.recv, dst, {}); break;
    case MOp::RecvCopySend:
      step(StepOp::Recv, tb.recv, dst, {});
      step(StepOp::Send, tb.send, {}, dst);
      break;
    case MOp::RecvReduceCopy: step(StepOp::RecvReduce, tb.recv, dst, src); break;
    case MOp::RecvReduceCopySend:
      step(StepOp::RecvReduce, tb.recv, dst, src);
      step(StepOp::Send, tb.send, {}, dst);
      break;
    case MOp::RecvReduceSend: {
      // The sum MSCCL forwards without storing: a scratch run of its own.
      const ChunkRef tmp{Buf::Scratch, temp_top_[static_cast<size_t>(g)]};
      temp_top_[static_cast<size_t>(g)] += n;
      step(StepOp::RecvReduce, tb.recv, tmp, src);
      step(StepOp::Send, tb.send, {}, tmp);
      break;
    }
    case MOp::Copy: step(StepOp::Copy, -1, dst, src); break;
    case MOp::Reduce: step(StepOp::Reduce, -1, dst, dst, src); break;
    case MOp::Nop: break;
  }
  for (const ChunkStep& c : out) {
    if (std::string e = planStepError(spec_, g, c); !e.empty()) {
      const std::string_view op = c.op == StepOp::Send         ? "send"
                                  : c.op == StepOp::Recv       ? "recv"
                                  : c.op == StepOp::RecvReduce ? "recvreduce"
                                  : c.op == StepOp::Copy       ? "copy"
                                                               : "reduce";
      return fail(s.line, "step", fmt::format("type=\"{}\" on gpu {}, as chorus's {}: {}", info(s.op).name, g, op, e));
    }
  }
  // The schedule: each step in its thread block's stream on its channel; the
  // first also waits for its depid/deps and what the nops before it waited for.
  std::vector<uint32_t>& carry = carry_[g][t];
  if (s.depid >= 0) {
    const auto& dep = frontier_[g][s.depid][static_cast<size_t>(s.deps)];
    carry.insert(carry.end(), dep.begin(), dep.end());
  }
  // A thread block's later step implies its earlier ones: the latest of each suffices.
  std::sort(carry.begin(), carry.end(), [&](uint32_t a, uint32_t b) {
    return std::pair{streams[a].tb, b} < std::pair{streams[b].tb, a};
  });
  carry.erase(std::unique(carry.begin(), carry.end(), [&](uint32_t a, uint32_t b) { return streams[a].tb == streams[b].tb; }),
              carry.end());
  std::vector<uint32_t>& mine = frontier_[g][t][idx];
  if (out.empty()) {  // a nop: done when its dependency and its thread block's previous step are
    mine = carry;
    if (last_[g][t] >= 0) mine.push_back(static_cast<uint32_t>(last_[g][t]));
    if ((schedule_entries_ += mine.size()) > kMaxClockEntries)
      return fail(s.line, "step", "too many dependencies through nops to keep as the plan's schedule");
    return {};
  }
  for (size_t k = 0; k < out.size(); ++k) {
    StepStream st;
    st.tb = t;
    st.chan = tb.chan;
    if (k == 0) st.waits = std::move(carry);
    prog.push_back(out[k]);
    streams.push_back(std::move(st));
  }
  carry.clear();
  mine.assign(1, static_cast<uint32_t>(prog.size() - 1));
  last_[g][t] = static_cast<int64_t>(prog.size() - 1);
  return {};
}

// The symbolic run (see the top of the file).  strict: chorus's one FIFO per
// ordered pair; else MSCCL's one per (pair, channel), to tell a program that
// deadlocks from one whose order chorus cannot keep.  emit: lower the steps
// into spec_ and check races as they fire.
Status Importer::schedule(bool strict, bool emit) {
  const int n = ngpus_;
  std::vector<size_t> base(static_cast<size_t>(n) + 1, 0);  // global tb index of each gpu's first
  for (int g = 0; g < n; ++g) base[g + 1] = base[g] + gpus_[g].tbs.size();
  const size_t T = base[n];
  std::vector<uint32_t> pc(T, 0);
  // The receiving tb of each tb's send connection, -1 when none.
  std::vector<int64_t> partner(T, -1);
  std::map<std::tuple<int, int, int>, size_t> recv_tb;  // (gpu, from, chan) -> global tb
  for (int g = 0; g < n; ++g)
    for (size_t t = 0; t < gpus_[g].tbs.size(); ++t)
      if (gpus_[g].tbs[t].recv >= 0) recv_tb[{g, gpus_[g].tbs[t].recv, gpus_[g].tbs[t].chan}] = base[g] + t;
  for (int g = 0; g < n; ++g)
    for (size_t t = 0; t < gpus_[g].tbs.size(); ++t) {
      const MTb& tb = gpus_[g].tbs[t];
      if (tb.send < 0) continue;
      if (auto it = recv_tb.find({tb.send, g, tb.chan}); it != recv_tb.end()) partner[base[g] + t] = static_cast<int64_t>(it->second);
    }

  // Vector clocks (emit only): clock[u][v] = steps of tb v that happen before
  // tb u's next step.  Snapshots travel with messages and are kept for the
  // steps another one depends on.
  const bool clocks = emit;
  if (clocks && uint64_t{T} * T > kMaxClockEntries)
    return fail(algo_line_, "algo", fmt::format("{} thread blocks in all: too many to check for races (at most {})", T,
                                                static_cast<uint64_t>(std::sqrt(static_cast<double>(kMaxClockEntries)))));
  using Clock = std::vector<uint32_t>;
  std::vector<Clock> clock(clocks ? T : 0, Clock(clocks ? T : 0, 0));
  std::set<std::pair<size_t, uint32_t>> depended;  // (global tb, step)
  for (int g = 0; g < n && clocks; ++g)
    for (const MTb& tb : gpus_[g].tbs)
      for (const MStep& st : tb.steps)
        if (st.depid >= 0) depended.insert({base[g] + st.depid, static_cast<uint32_t>(st.deps)});
  std::map<std::pair<size_t, uint32_t>, Clock> dep_clock;
  uint64_t entries = uint64_t{T} * T;

  struct Msg {
    size_t tb;       // the sender's global tb
    uint32_t step;   // its step
    int64_t cnt;
    Clock clock;
  };
  std::map<std::tuple<int, int, int>, std::deque<Msg>> conn;  // (from, to, chan)
  std::map<std::pair<int, int>, std::deque<int>> pair;        // (from, to) -> channels in send order

  // Race check state: per gpu, per (buffer, chunk): the last write and the
  // reads since, as (global tb, steps of it done when it ran).
  struct Access {
    size_t tb = SIZE_MAX;
    uint32_t done = 0;
    uint32_t step = 0;
  };
  struct ChunkState {
    Access write;
    std::vector<Access> reads;
  };
  std::vector<std::map<std::pair<int, uint32_t>, ChunkState>> chunks(static_cast<size_t>(n));
  auto tbOf = [&](size_t gt, int* g, int* t) {
    *g = static_cast<int>(std::upper_bound(base.begin(), base.end(), gt) - base.begin()) - 1;
    *t = static_cast<int>(gt - base[*g]);
  };
  auto raceCheck = [&](int g, size_t gt, uint32_t step, Buf b, int64_t off, int64_t cnt, bool write) -> Status {
    const Clock& now = clock[gt];
    auto before = [&](const Access& a) { return a.tb == SIZE_MAX || a.tb == gt || now[a.tb] >= a.done; };
    for (int64_t k = 0; k < cnt; ++k) {
      // In place, the input and output are one buffer.
      const ChunkRef r = mapRef(g, b, off + k, spec_.inplace != PlanInPlace::No);
      ChunkState& cs = chunks[static_cast<size_t>(g)][{static_cast<int>(r.buf), r.chunk}];
      auto race = [&](const Access& other, std::string_view kind) {
        int og = 0, ot = 0;
        tbOf(other.tb, &og, &ot);
        int mg = 0, mt = 0;
        tbOf(gt, &mg, &mt);
        return invalidArgument("{}: race on gpu {}'s chunk {}[{}]: {} and {} {} it, and neither waits for the other "
                               "(thread blocks run in parallel: a depid/deps between them is missing)", origin_, g,
                               bufLetter(r.buf), r.chunk, where(og, ot, other.step), where(mg, mt, step), kind);
      };
      if (!before(cs.write)) return race(cs.write, write ? "both write" : "write and read");
      const Access me{gt, now[gt] + 1, step};
      if (write) {
        for (const Access& rd : cs.reads)
          if (!before(rd)) return race(rd, "read and write");
        cs.reads.clear();
        cs.write = me;
      } else {
        auto it = std::find_if(cs.reads.begin(), cs.reads.end(), [&](const Access& a) { return a.tb == gt; });
        if (it != cs.reads.end()) *it = me;
        else cs.reads.push_back(me);
      }
    }
    return {};
  };

  auto current = [&](size_t gt, int g, int t) -> const MStep* {
    const MTb& tb = gpus_[g].tbs[t];
    return pc[gt] < tb.steps.size() ? &tb.steps[pc[gt]] : nullptr;
  };
  auto depDone = [&](int g, const MStep& s) { return s.depid < 0 || pc[base[g] + s.depid] > static_cast<uint32_t>(s.deps); };
  auto messageReady = [&](int g, const MTb& tb) {
    auto q = conn.find({tb.recv, g, tb.chan});
    if (q == conn.end() || q->second.empty()) return false;
    if (!strict) return true;
    const auto& pq = pair[{tb.recv, g}];
    return !pq.empty() && pq.front() == tb.chan;
  };
  auto ready = [&](size_t gt, int g, int t) {
    const MStep* s = current(gt, g, t);
    if (s == nullptr || !depDone(g, *s)) return false;
    return !info(s->op).recv || messageReady(g, gpus_[g].tbs[t]);
  };
  // Whether tb gt's partner waits for a message at its current step.
  auto partnerWaits = [&](size_t gt) {
    const int64_t p = partner[gt];
    if (p < 0) return false;
    int pg = 0, pt = 0;
    tbOf(static_cast<size_t>(p), &pg, &pt);
    const MStep* s = current(static_cast<size_t>(p), pg, pt);
    return s != nullptr && info(s->op).recv && depDone(pg, *s);
  };

  auto fire = [&](size_t gt, int g, int t) -> Status {
    const MTb& tb = gpus_[g].tbs[t];
    const uint32_t idx = pc[gt];
    const MStep& s = tb.steps[idx];
    const MOpInfo& oi = info(s.op);
    if (clocks && s.depid >= 0) {
      const Clock& dc = dep_clock[{base[g] + s.depid, static_cast<uint32_t>(s.deps)}];
      for (size_t v = 0; v < T; ++v) clock[gt][v] = std::max(clock[gt][v], dc[v]);
    }
    if (oi.recv) {
      auto& q = conn[{tb.recv, g, tb.chan}];
      Msg m = std::move(q.front());
      q.pop_front();
      if (strict) pair[{tb.recv, g}].pop_front();
      if (m.cnt != s.cnt) {
        int sg = 0, st = 0;
        tbOf(m.tb, &sg, &st);
        return fail(s.line, "step", fmt::format("type=\"{}\" receives cnt=\"{}\" chunks, but the message it pairs with, "
                                                "{}, has cnt=\"{}\"", oi.name, s.cnt, where(sg, st, m.step), m.cnt));
      }
      if (clocks)
        for (size_t v = 0; v < T; ++v) clock[gt][v] = std::max(clock[gt][v], m.clock[v]);
      if (clocks) entries -= T;
    }
    if (emit) {
      if (oi.reads_src) CHORUS_RETURN_IF_ERROR(raceCheck(g, gt, idx, s.srcbuf, s.srcoff, s.cnt, false));
      if (oi.reads_dst) CHORUS_RETURN_IF_ERROR(raceCheck(g, gt, idx, s.dstbuf, s.dstoff, s.cnt, false));
      if (oi.writes_dst) CHORUS_RETURN_IF_ERROR(raceCheck(g, gt, idx, s.dstbuf, s.dstoff, s.cnt, true));
      CHORUS_RETURN_IF_ERROR(lower(g, t, idx));
    }
    ++pc[gt];
    if (clocks) clock[gt][gt] = pc[gt];
    if (oi.send) {
      Msg m{gt, idx, s.cnt, {}};
      if (clocks) {
        if ((entries += T) > kMaxClockEntries)
          return fail(algo_line_, "algo", "too many messages in flight to check for races");
        m.clock = clock[gt];
      }
      conn[{g, tb.send, tb.chan}].push_back(std::move(m));
      if (strict) pair[{g, tb.send}].push_back(tb.chan);
    }
    if (clocks && depended.count({gt, idx}) != 0) {
      if ((entries += T) > kMaxClockEntries)
        return fail(algo_line_, "algo", "too many dependencies to check for races");
      dep_clock[{gt, idx}] = clock[gt];
    }
    return {};
  };

  for (;;) {
    bool fired = false;
    // Everything but plain sends, as far as it goes.
    for (int g = 0; g < n; ++g)
      for (size_t t = 0; t < gpus_[g].tbs.size(); ++t) {
        const size_t gt = base[g] + t;
        while (ready(gt, g, static_cast<int>(t)) && current(gt, g, static_cast<int>(t))->op != MOp::Send) {
          CHORUS_RETURN_IF_ERROR(fire(gt, g, static_cast<int>(t)));
          fired = true;
        }
      }
    if (fired) continue;
    // One plain send: the first whose receiver waits for it, else the first.
    int64_t pick = -1, first = -1;
    for (int g = 0; g < n && pick < 0; ++g)
      for (size_t t = 0; t < gpus_[g].tbs.size(); ++t) {
        const size_t gt = base[g] + t;
        if (!ready(gt, g, static_cast<int>(t))) continue;
        if (first < 0) first = static_cast<int64_t>(gt);
        if (partnerWaits(gt)) {
          pick = static_cast<int64_t>(gt);
          break;
        }
      }
    if (pick < 0) pick = first;
    if (pick < 0) break;
    int g = 0, t = 0;
    tbOf(static_cast<size_t>(pick), &g, &t);
    CHORUS_RETURN_IF_ERROR(fire(static_cast<size_t>(pick), g, t));
  }

  // Done, or stuck: the first step that never ran, preferring one that waits
  // only for its message (the others wait for it, directly or not).
  for (int pass = 0; pass < 2; ++pass)
  for (int g = 0; g < n; ++g)
    for (size_t t = 0; t < gpus_[g].tbs.size(); ++t) {
      const size_t gt = base[g] + t;
      const MStep* s = current(gt, g, static_cast<int>(t));
      if (s == nullptr || (pass == 0 && !depDone(g, *s))) continue;
      const MTb& tb = gpus_[g].tbs[t];
      std::string why;
      if (!depDone(g, *s))
        why = fmt::format("it waits for {} (depid/deps), which never runs", where(g, s->depid, static_cast<size_t>(s->deps)));
      else if (!strict)
        why = fmt::format("it waits for a message from gpu {} on channel {} that is never sent", tb.recv, tb.chan);
      else
        why = fmt::format("the message it waits for, from gpu {} on channel {}, is not the oldest one gpu {} has sent "
                          "to gpu {}; chorus matches messages between two ranks in one order, MSCCL per channel, and "
                          "no order of this program's steps keeps both", tb.recv, tb.chan, tb.recv, g);
      return invalidArgument("{}: {}: {} never runs: {}", origin_, strict ? "no per-pair message order" : "deadlock",
                             where(g, static_cast<int>(t), pc[gt]), why);
    }
  for (const auto& [key, q] : conn)
    if (!q.empty()) {
      int sg = 0, st = 0;
      tbOf(q.front().tb, &sg, &st);
      return invalidArgument("{}: {} sends to gpu {} on channel {}, and gpu {} never receives it{}", origin_,
                             where(sg, st, q.front().step), std::get<1>(key), std::get<2>(key), std::get<1>(key),
                             recv_tb.count({std::get<1>(key), std::get<0>(key), std::get<2>(key)}) != 0
                                 ? ""
                                 : fmt::format(" (it has no <tb recv=\"{}\" chan=\"{}\">)", std::get<0>(key),
                                               std::get<2>(key)));
    }
  return {};
}

Result<PlanSpec> Importer::run(std::string_view text) {
  spec_.origin = origin_;
  XmlLimits lim;
  lim.max_bytes = kPlanMaxFileBytes;
  lim.max_depth = 4;  // algo, gpu, tb, step
  lim.max_elements = kPlanMaxSteps + 4096;
  CHORUS_ASSIGN_OR_RETURN(const XmlElement root, parseXml(text, origin_, lim));
  CHORUS_RETURN_IF_ERROR(readAlgo(root));
  spec_.name = stemName(origin_, algo_name_);
  // Scratch: the largest declared, and then each rank's rrs sums.
  int64_t scratch = 0, rrs = 0;
  for (const MGpu& g : gpus_) {
    int64_t mine = 0;
    for (const MTb& tb : g.tbs)
      for (const MStep& s : tb.steps)
        if (s.op == MOp::RecvReduceSend) mine += s.cnt;
    scratch = std::max(scratch, g.s_chunks);
    rrs = std::max(rrs, mine);
  }
  if (scratch + rrs > kPlanMaxScratch)
    return fail(algo_line_, "algo", fmt::format("{} scratch chunks per rank ({} declared, {} for rrs sums): at most {}",
                                                scratch + rrs, scratch, rrs, kPlanMaxScratch));
  spec_.scratch = static_cast<uint32_t>(scratch + rrs);
  temp_top_.assign(static_cast<size_t>(ngpus_), static_cast<uint32_t>(scratch));
  spec_.programs.assign(static_cast<size_t>(ngpus_), {});
  spec_.streams.assign(static_cast<size_t>(ngpus_), {});
  spec_.proto = proto_ == "LL" ? PlanProto::LL : proto_ == "LL128" ? PlanProto::LL128 : PlanProto::Simple;
  frontier_.assign(static_cast<size_t>(ngpus_), {});
  carry_.assign(static_cast<size_t>(ngpus_), {});
  last_.assign(static_cast<size_t>(ngpus_), {});
  for (int g = 0; g < ngpus_; ++g) {
    carry_[g].assign(gpus_[g].tbs.size(), {});
    last_[g].assign(gpus_[g].tbs.size(), -1);
    for (const MTb& tb : gpus_[g].tbs) frontier_[g].emplace_back(tb.steps.size());
  }
  if (Status st = schedule(/*strict=*/true, /*emit=*/true); !st.isOk()) {
    // Tell a deadlock of MSCCL's own semantics from an order chorus cannot keep.
    if (st.message().find("no per-pair message order") != std::string::npos) {
      spec_.programs.assign(static_cast<size_t>(ngpus_), {});
      if (Status relaxed = schedule(/*strict=*/false, /*emit=*/false); !relaxed.isOk()) return relaxed;
    }
    return st;
  }
  return std::move(spec_);
}

}  // namespace

Result<PlanSpec> parseMscclXml(std::string_view text, std::string_view origin) {
  return Importer(origin).run(text);
}

}  // namespace chorus::plan
