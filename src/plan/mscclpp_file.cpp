// MSCCL++'s JSON execution plans as a plan reader (plan_file.hpp,
// docs/msccl.md).
//
// The schema is the one MSCCL++'s executor reads (microsoft/mscclpp,
// src/executor/execution_plan.cc, and the operations' meaning from
// src/include/execution_kernel.hpp, both at commit 008fbad; facts, not code):
// a top-level object with name, collective, protocol, inplace and a gpus
// array; gpus[r] (id r) with input_chunks, output_chunks, scratch_chunks,
// channels [{channel_type, connected_to: [peer...]}] (one channel per peer
// named, numbered per channel type in order), remote_buffers [{rank (the
// owner), type, access_channel_types}] and threadblocks [{id, ops,
// channels [{channel_type, channel_ids}], remote_buffer_refs
// [{access_channel_type, remote_buffer_ids}]}].  An operation names its
// channels by position in its thread block's list of that type, and a remote
// buffer by position in its thread block's refs of the operation's channel
// type; local operands carry a buffer type (i, o, s), every operand an index
// and a size in chunks.
//
// MSCCL++ is one-sided: a put writes into a peer's buffer, a signal on a
// channel tells the peer, a wait on the peer's end of the channel (channels
// pair in order: a GPU's k-th channel of a type to a peer with the peer's
// k-th of that type back) waits for it.  chorus's plan is two-sided, one
// program per rank.  The reader runs the thread blocks symbolically (like
// msccl_file.cpp): a put becomes a send where it runs; the signal after it
// (in its thread block, on a channel to the put's peer) closes a batch of
// puts; the wait that consumes that signal becomes a receive of each put of
// the batch into the put's destination, in the receiver's program where the
// wait runs.  copy, re (dst = the sum of its sources) and res (re, then the
// sum put to the remote operands) are local steps.  Waits fire only when
// their messages are the oldest not yet received from that peer (chorus
// matches messages per pair in order); a plan with no such order, a wait
// whose signal never comes, a put never signalled and a signal never waited
// for are refused, naming the operation by its key path.
//
// Not checked, because the two-sided plan cannot see it: a put's data lands
// in the receiver's buffer when the put runs, not when the wait runs, so a
// receiver that touches the destination between the two races with the
// sender; and thread blocks of one GPU run at once in MSCCL++ while the reader
// proves one serial order of them (ordered by barriers, waits and signals).
// docs/msccl.md says so.  chorus's own export (plan_export.cpp) puts every
// message into a scratch slot of its own and uses one thread block per GPU,
// so neither applies to it.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "plan/plan_file.hpp"

namespace chorus::plan {
namespace {

using Json = nlohmann::json;

constexpr int kMaxTbs = 1024;
constexpr int kMaxChannels = 1024;
constexpr size_t kMaxOps = kPlanMaxSteps;
constexpr int64_t kMaxChunk = int64_t{1} << 24;
constexpr int kMaxDepth = 16;  // nesting of arrays and objects

enum class Kind : uint8_t { Put, Pws, Signal, Wait, Copy, Reduce, ReduceSend, Nop, Flush, Barrier };
enum class ChanType : uint8_t { Memory, Port };

struct Operand {
  bool remote = false;
  int owner = -1;  // remote: the rank whose buffer it is
  Buf buf = Buf::Input;
  int64_t index = 0, size = 0;
};
struct Op {
  Kind kind = Kind::Nop;
  std::string path;
  ChanType chan = ChanType::Memory;
  bool has_chan = false;
  std::vector<int> chans;  // resolved: global channel index of this GPU, per channel_ids entry
  std::vector<Operand> src, dst;
  int barrier = -1, barrier_n = 0;
};
struct Tb {
  std::vector<Op> ops;
  size_t pc = 0;
};
struct Chan {
  ChanType type;
  int peer;
  int ordinal;  // among this GPU's channels of this type to this peer
};
struct Gpu {
  int64_t in = 0, out = 0, scr = 0;
  std::vector<Chan> chans[2];  // by ChanType
  std::vector<Tb> tbs;
};
struct Msg {
  int from = 0, to = 0;
  Operand dst;  // on `to`
  int64_t n = 0;
};

ChunkStep mk(StepOp op, int peer, ChunkRef dst, ChunkRef src, ChunkRef src2, uint32_t n) {
  ChunkStep s;
  s.op = op;
  s.peer = peer;
  s.dst = dst;
  s.src = src;
  s.src2 = src2;
  s.n = n;
  return s;
}

std::string shown(const Json& v) {
  std::string s = v.dump(-1, ' ', true, Json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

class Reader {
 public:
  explicit Reader(std::string_view origin) : origin_(origin) {}
  Result<PlanSpec> run(std::string_view text);

 private:
  Status fail(const std::string& path, std::string what) const {
    return invalidArgument("{}: {}: {}", origin_, path, what);
  }
  Status keys(const Json& o, const std::string& path, std::initializer_list<std::string_view> known) const;
  Result<const Json*> member(const Json& o, const std::string& path, std::string_view key, Json::value_t type) const;
  Result<int64_t> integer(const Json& o, const std::string& path, std::string_view key, int64_t lo, int64_t hi) const;
  Result<int64_t> optInteger(const Json& o, const std::string& path, std::string_view key, int64_t lo, int64_t hi,
                             int64_t dflt) const;
  Result<Buf> bufType(const Json& v, const std::string& path) const;
  Result<ChanType> chanType(const Json& v, const std::string& path) const;
  Status readGpu(const Json& g, int r);
  Status readTb(const Json& t, int r, int id, std::vector<int> (&tb_chans)[2], std::vector<int> (&tb_rbufs)[2]);
  Status readOp(const Json& o, const std::string& path, int r, const std::vector<int> (&tb_chans)[2],
                const std::vector<int> (&tb_rbufs)[2], Op* op);
  Status readOperands(const Json& o, const std::string& path, std::string_view key, int r, const Op& op,
                      const std::vector<int> (&tb_rbufs)[2], std::vector<Operand>* out);
  Status simulate();
  Status emit(int r, const std::string& path, ChunkStep s);
  ChunkRef ref(int r, const Operand& o) const;
  Status localChain(int r, const Op& op);
  bool canFire(int r, int t, std::string* why) const;
  Status fire(int r, int t);
  void arrive(int r, const Tb& tb);

  std::string origin_;
  PlanSpec spec_;
  int n_ = 0;
  std::vector<Gpu> gpus_;
  // remote_buffers[r][id] = (owner, buffer)
  std::vector<std::vector<std::pair<int, Buf>>> rbufs_;
  std::vector<Msg> msgs_;
  std::map<std::tuple<int, int, int>, std::vector<uint32_t>> pending_;  // (rank, tb, peer) -> puts not signalled
  std::map<std::tuple<int, int, int, int>, std::deque<std::vector<uint32_t>>> signals_;  // (from, to, type, ord)
  std::map<std::pair<int, int>, std::deque<uint32_t>> unreceived_;  // (from, to): sends in program order
  std::map<std::pair<int, int>, int> at_barrier_;                    // (rank, barrier id) -> tbs waiting there
  size_t steps_ = 0;
  std::vector<int> woken_;  // GPUs where something happened that may unblock a thread block
};

Status Reader::keys(const Json& o, const std::string& path, std::initializer_list<std::string_view> known) const {
  for (const auto& [k, v] : o.items()) {
    (void)v;
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string list;
      for (std::string_view n : known) list += fmt::format("{}{}", list.empty() ? "" : ", ", n);
      return fail(path.empty() ? shown(Json(k)) : fmt::format("{}.{}", path, shown(Json(k))),
                  fmt::format("not a key this reader takes here (it takes {})", list));
    }
  }
  return {};
}

std::string_view typeName(Json::value_t t) {
  switch (t) {
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    default: return "an integer";
  }
}

Result<const Json*> Reader::member(const Json& o, const std::string& path, std::string_view key,
                                   Json::value_t type) const {
  const std::string p = path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  const auto it = o.find(std::string(key));
  if (it == o.end()) return fail(p, "missing");
  const bool ok = type == Json::value_t::number_integer ? it->is_number_integer() : it->type() == type;
  if (!ok) return fail(p, fmt::format("{} is not {}", shown(*it), typeName(type)));
  return &*it;
}

Result<int64_t> Reader::integer(const Json& o, const std::string& path, std::string_view key, int64_t lo,
                                int64_t hi) const {
  CHORUS_ASSIGN_OR_RETURN(const Json* v, member(o, path, key, Json::value_t::number_integer));
  const std::string p = path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    return fail(p, fmt::format("{} is out of range ({} to {})", shown(*v), lo, hi));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) return fail(p, fmt::format("{} is out of range ({} to {})", x, lo, hi));
  return x;
}

Result<int64_t> Reader::optInteger(const Json& o, const std::string& path, std::string_view key, int64_t lo,
                                   int64_t hi, int64_t dflt) const {
  if (!o.contains(std::string(key))) return dflt;
  return integer(o, path, key, lo, hi);
}

Result<Buf> Reader::bufType(const Json& v, const std::string& path) const {
  if (v == "i") return Buf::Input;
  if (v == "o") return Buf::Output;
  if (v == "s") return Buf::Scratch;
  return fail(path, fmt::format("{} is not a buffer type (\"i\": input, \"o\": output, \"s\": scratch)", shown(v)));
}

Result<ChanType> Reader::chanType(const Json& v, const std::string& path) const {
  if (v == "memory") return ChanType::Memory;
  if (v == "port") return ChanType::Port;
  if (v == "switch" || v == "nvls")
    return fail(path, fmt::format("{}: switch (NVLS multicast) channels are not read: chorus ranks have no "
                                  "multicast memory",
                                  shown(v)));
  return fail(path, fmt::format("{} is not a channel type this reader takes (\"memory\", \"port\")", shown(v)));
}

// Nesting depth of the text's arrays and objects (strings skipped), so the
// JSON parser never meets a document deeper than the schema.
bool tooDeep(std::string_view text) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : text) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

Result<PlanSpec> Reader::run(std::string_view text) {
  if (text.size() > kPlanMaxFileBytes)
    return invalidArgument("{}: {} bytes (at most {})", origin_, text.size(), kPlanMaxFileBytes);
  if (tooDeep(text)) return invalidArgument("{}: nested deeper than {} arrays and objects", origin_, kMaxDepth);
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    return invalidArgument("{}: byte {}: not JSON ({})", origin_, e.byte, e.what());
  } catch (const Json::exception& e) {  // the parser's others, e.g. a number past a double (out_of_range.406)
    return invalidArgument("{}: not JSON ({})", origin_, e.what());
  }
  if (!doc.is_object()) return fail("(top level)", fmt::format("{} is not an object", shown(doc)));
  CHORUS_RETURN_IF_ERROR(keys(doc, "", {"name", "collective", "protocol", "inplace", "gpus", "num_threads_per_block",
                                        "min_message_size", "max_message_size", "reuse_resources",
                                        "use_double_scratch_buffer", "buffer_alignment"}));
  CHORUS_ASSIGN_OR_RETURN(const Json* name, member(doc, "", "name", Json::value_t::string));
  CHORUS_ASSIGN_OR_RETURN(const Json* coll, member(doc, "", "collective", Json::value_t::string));
  CHORUS_ASSIGN_OR_RETURN(const Json* proto, member(doc, "", "protocol", Json::value_t::string));
  CHORUS_ASSIGN_OR_RETURN(const Json* inplace, member(doc, "", "inplace", Json::value_t::boolean));
  CHORUS_ASSIGN_OR_RETURN(const Json* gpus, member(doc, "", "gpus", Json::value_t::array));
  for (std::string_view flag : {"reuse_resources", "use_double_scratch_buffer"})
    if (doc.contains(std::string(flag))) {
      CHORUS_ASSIGN_OR_RETURN(const Json* b, member(doc, "", flag, Json::value_t::boolean));
      if (b->get<bool>())
        return fail(std::string(flag), "true is not read: it changes where scratch chunks lie, which the plan's "
                                       "chunks cannot say");
    }
  CHORUS_RETURN_IF_ERROR(optInteger(doc, "", "num_threads_per_block", 1, 1 << 20, 1024).status());
  CHORUS_RETURN_IF_ERROR(optInteger(doc, "", "buffer_alignment", 1, 1 << 20, 16).status());
  for (std::string_view k : {"min_message_size", "max_message_size"})
    if (doc.contains(std::string(k)) && !doc[std::string(k)].is_number_integer())
      return fail(std::string(k), fmt::format("{} is not an integer", shown(doc[std::string(k)])));

  const std::string cname = coll->get<std::string>();
  Collective c;
  if (!parseCollective(cname, &c) ||
      (c != Collective::AllReduce && c != Collective::AllGather && c != Collective::ReduceScatter &&
       c != Collective::AllToAll))
    return fail("collective", fmt::format("{} is not read (allreduce, allgather, reducescatter, alltoall are)",
                                          shown(*coll)));
  if (*proto != "Simple")
    return fail("protocol", fmt::format("{} is not read: only \"Simple\" (LL plans move packets with ppkt, upkt, "
                                        "... whose flags chorus's steps have no form for)",
                                        shown(*proto)));
  n_ = static_cast<int>(std::min<size_t>(gpus->size(), 1000));
  if (n_ < kPlanMinRanks || n_ > kPlanMaxRanks)
    return fail("gpus", fmt::format("{} GPUs ({} to {})", gpus->size(), kPlanMinRanks, kPlanMaxRanks));
  spec_.origin = origin_;
  spec_.coll = c;
  spec_.nranks = n_;
  spec_.inplace = inplace->get<bool>() ? PlanInPlace::Yes : PlanInPlace::No;
  spec_.programs.assign(static_cast<size_t>(n_), {});
  // The plan's name: MSCCL++'s, lower case, other characters as '_'.
  for (char ch : name->get<std::string>()) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    spec_.name += (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '-' || l == '.' || l == '_' ? l : '_';
    if (spec_.name.size() == kPlanMaxName) break;
  }
  if (spec_.name.empty()) return fail("name", "empty");

  gpus_.assign(static_cast<size_t>(n_), {});
  rbufs_.assign(static_cast<size_t>(n_), {});
  // First every GPU's buffers and channels (operations name peers' channels).
  for (int r = 0; r < n_; ++r) {
    const Json& g = (*gpus)[static_cast<size_t>(r)];
    const std::string p = fmt::format("gpus[{}]", r);
    if (!g.is_object()) return fail(p, fmt::format("{} is not an object", shown(g)));
    CHORUS_RETURN_IF_ERROR(keys(g, p, {"id", "input_chunks", "output_chunks", "scratch_chunks", "channels",
                                       "remote_buffers", "threadblocks", "semaphores"}));
    CHORUS_ASSIGN_OR_RETURN(const int64_t id, integer(g, p, "id", 0, n_ - 1));
    if (id != r) return fail(p + ".id", fmt::format("{}: MSCCL++ reads gpus[r] as rank r, so it must be {}", id, r));
    Gpu& G = gpus_[static_cast<size_t>(r)];
    CHORUS_ASSIGN_OR_RETURN(G.in, integer(g, p, "input_chunks", 0, kMaxChunk));
    CHORUS_ASSIGN_OR_RETURN(G.out, integer(g, p, "output_chunks", 0, kMaxChunk));
    CHORUS_ASSIGN_OR_RETURN(G.scr, integer(g, p, "scratch_chunks", 0, kPlanMaxScratch));
    if (g.contains("semaphores")) {
      CHORUS_ASSIGN_OR_RETURN(const Json* sem, member(g, p, "semaphores", Json::value_t::array));
      if (!sem->empty()) return fail(p + ".semaphores", "not read (sem_acquire/sem_release are not either)");
    }
    CHORUS_ASSIGN_OR_RETURN(const Json* chans, member(g, p, "channels", Json::value_t::array));
    for (size_t k = 0; k < chans->size(); ++k) {
      const Json& ch = (*chans)[k];
      const std::string cp = fmt::format("{}.channels[{}]", p, k);
      if (!ch.is_object()) return fail(cp, fmt::format("{} is not an object", shown(ch)));
      CHORUS_RETURN_IF_ERROR(keys(ch, cp, {"channel_type", "connected_to"}));
      CHORUS_ASSIGN_OR_RETURN(const Json* ty, member(ch, cp, "channel_type", Json::value_t::string));
      CHORUS_ASSIGN_OR_RETURN(const ChanType t, chanType(*ty, cp + ".channel_type"));
      CHORUS_ASSIGN_OR_RETURN(const Json* peers, member(ch, cp, "connected_to", Json::value_t::array));
      for (size_t q = 0; q < peers->size(); ++q) {
        const std::string pp = fmt::format("{}.connected_to[{}]", cp, q);
        const Json& pv = (*peers)[q];
        if (!pv.is_number_integer() || pv.get<int64_t>() < 0 || pv.get<int64_t>() >= n_ || pv.get<int64_t>() == r)
          return fail(pp, fmt::format("{} is not another GPU of the {}", shown(pv), n_));
        auto& list = G.chans[static_cast<int>(t)];
        if (list.size() >= static_cast<size_t>(kMaxChannels))
          return fail(pp, fmt::format("more than {} channels", kMaxChannels));
        const int peer = static_cast<int>(pv.get<int64_t>());
        const int ord = static_cast<int>(std::count_if(list.begin(), list.end(), [&](const Chan& x) { return x.peer == peer; }));
        list.push_back({t, peer, ord});
      }
    }
    CHORUS_ASSIGN_OR_RETURN(const Json* rb, member(g, p, "remote_buffers", Json::value_t::array));
    for (size_t k = 0; k < rb->size(); ++k) {
      const Json& b = (*rb)[k];
      const std::string bp = fmt::format("{}.remote_buffers[{}]", p, k);
      if (!b.is_object()) return fail(bp, fmt::format("{} is not an object", shown(b)));
      if (k >= static_cast<size_t>(kMaxChannels)) return fail(bp, fmt::format("more than {}", kMaxChannels));
      CHORUS_RETURN_IF_ERROR(keys(b, bp, {"rank", "type", "access_channel_types"}));
      CHORUS_ASSIGN_OR_RETURN(const int64_t owner, integer(b, bp, "rank", 0, n_ - 1));
      if (owner == r) return fail(bp + ".rank", fmt::format("{} is this GPU: a remote buffer is another's", owner));
      CHORUS_ASSIGN_OR_RETURN(const Json* ty, member(b, bp, "type", Json::value_t::string));
      CHORUS_ASSIGN_OR_RETURN(const Buf buf, bufType(*ty, bp + ".type"));
      CHORUS_ASSIGN_OR_RETURN(const Json* acc, member(b, bp, "access_channel_types", Json::value_t::array));
      for (size_t q = 0; q < acc->size(); ++q)
        CHORUS_RETURN_IF_ERROR(chanType((*acc)[q], fmt::format("{}.access_channel_types[{}]", bp, q)).status());
      rbufs_[static_cast<size_t>(r)].emplace_back(static_cast<int>(owner), buf);
    }
  }
  // C: chunks per rank block, from the buffers' chunk counts.
  const Gpu& g0 = gpus_[0];
  const int64_t per = c == Collective::AllReduce || c == Collective::AllGather ? g0.in : g0.in / n_;
  if (per < 1 || per > static_cast<int64_t>(kPlanMaxChunks))
    return fail("gpus[0].input_chunks", fmt::format("{} gives {} chunks per rank block (1 to {})", g0.in, per,
                                                    kPlanMaxChunks));
  spec_.chunks = static_cast<uint32_t>(per);
  for (int r = 0; r < n_; ++r) {
    const Gpu& G = gpus_[static_cast<size_t>(r)];
    const auto want_in = static_cast<int64_t>(planChunksOf(spec_, Buf::Input, r));
    const auto want_out = static_cast<int64_t>(planChunksOf(spec_, Buf::Output, r));
    if (G.in != want_in)
      return fail(fmt::format("gpus[{}].input_chunks", r),
                  fmt::format("{}: a {}-GPU {} at {} chunks per rank block has {}", G.in, n_, cname, per, want_in));
    if (G.out != want_out)
      return fail(fmt::format("gpus[{}].output_chunks", r),
                  fmt::format("{}: a {}-GPU {} at {} chunks per rank block has {}", G.out, n_, cname, per, want_out));
    spec_.scratch = std::max(spec_.scratch, static_cast<uint32_t>(G.scr));
  }
  for (int r = 0; r < n_; ++r) CHORUS_RETURN_IF_ERROR(readGpu((*gpus)[static_cast<size_t>(r)], r));
  CHORUS_RETURN_IF_ERROR(simulate());
  return std::move(spec_);
}

Status Reader::readGpu(const Json& g, int r) {
  const std::string p = fmt::format("gpus[{}]", r);
  CHORUS_ASSIGN_OR_RETURN(const Json* tbs, member(g, p, "threadblocks", Json::value_t::array));
  if (tbs->size() > static_cast<size_t>(kMaxTbs))
    return fail(p + ".threadblocks", fmt::format("{} thread blocks (at most {})", tbs->size(), kMaxTbs));
  Gpu& G = gpus_[static_cast<size_t>(r)];
  G.tbs.assign(tbs->size(), {});
  std::vector<bool> seen(tbs->size());
  for (size_t k = 0; k < tbs->size(); ++k) {
    const Json& t = (*tbs)[k];
    const std::string tp = fmt::format("{}.threadblocks[{}]", p, k);
    if (!t.is_object()) return fail(tp, fmt::format("{} is not an object", shown(t)));
    CHORUS_ASSIGN_OR_RETURN(const int64_t id, integer(t, tp, "id", 0, static_cast<int64_t>(tbs->size()) - 1));
    if (seen[static_cast<size_t>(id)]) return fail(tp + ".id", fmt::format("{} is another thread block's too", id));
    seen[static_cast<size_t>(id)] = true;
    std::vector<int> tb_chans[2], tb_rbufs[2];
    CHORUS_RETURN_IF_ERROR(readTb(t, r, static_cast<int>(id), tb_chans, tb_rbufs));
  }
  return {};
}

Status Reader::readTb(const Json& t, int r, int id, std::vector<int> (&tb_chans)[2], std::vector<int> (&tb_rbufs)[2]) {
  const std::string tp = fmt::format("gpus[{}].threadblocks[{}]", r, id);
  CHORUS_RETURN_IF_ERROR(keys(t, tp, {"id", "ops", "channels", "remote_buffer_refs"}));
  const Gpu& G = gpus_[static_cast<size_t>(r)];
  CHORUS_ASSIGN_OR_RETURN(const Json* chans, member(t, tp, "channels", Json::value_t::array));
  for (size_t k = 0; k < chans->size(); ++k) {
    const Json& ch = (*chans)[k];
    const std::string cp = fmt::format("{}.channels[{}]", tp, k);
    if (!ch.is_object()) return fail(cp, fmt::format("{} is not an object", shown(ch)));
    CHORUS_RETURN_IF_ERROR(keys(ch, cp, {"channel_type", "channel_ids"}));
    CHORUS_ASSIGN_OR_RETURN(const Json* ty, member(ch, cp, "channel_type", Json::value_t::string));
    CHORUS_ASSIGN_OR_RETURN(const ChanType ct, chanType(*ty, cp + ".channel_type"));
    CHORUS_ASSIGN_OR_RETURN(const Json* ids, member(ch, cp, "channel_ids", Json::value_t::array));
    const auto& list = G.chans[static_cast<int>(ct)];
    for (size_t q = 0; q < ids->size(); ++q) {
      const Json& v = (*ids)[q];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= static_cast<int64_t>(list.size()))
        return fail(fmt::format("{}.channel_ids[{}]", cp, q),
                    fmt::format("{} is not one of this GPU's {} {} channels", shown(v), list.size(), shown(*ty)));
      if (tb_chans[static_cast<int>(ct)].size() >= static_cast<size_t>(kMaxChannels))
        return fail(cp, fmt::format("more than {} channels", kMaxChannels));
      tb_chans[static_cast<int>(ct)].push_back(static_cast<int>(v.get<int64_t>()));
    }
  }
  if (t.contains("remote_buffer_refs")) {
    CHORUS_ASSIGN_OR_RETURN(const Json* refs, member(t, tp, "remote_buffer_refs", Json::value_t::array));
    const auto& rb = rbufs_[static_cast<size_t>(r)];
    for (size_t k = 0; k < refs->size(); ++k) {
      const Json& rf = (*refs)[k];
      const std::string rp = fmt::format("{}.remote_buffer_refs[{}]", tp, k);
      if (!rf.is_object()) return fail(rp, fmt::format("{} is not an object", shown(rf)));
      CHORUS_RETURN_IF_ERROR(keys(rf, rp, {"access_channel_type", "remote_buffer_ids"}));
      CHORUS_ASSIGN_OR_RETURN(const Json* ty, member(rf, rp, "access_channel_type", Json::value_t::string));
      CHORUS_ASSIGN_OR_RETURN(const ChanType ct, chanType(*ty, rp + ".access_channel_type"));
      CHORUS_ASSIGN_OR_RETURN(const Json* ids, member(rf, rp, "remote_buffer_ids", Json::value_t::array));
      for (size_t q = 0; q < ids->size(); ++q) {
        const Json& v = (*ids)[q];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= static_cast<int64_t>(rb.size()))
          return fail(fmt::format("{}.remote_buffer_ids[{}]", rp, q),
                      fmt::format("{} is not one of this GPU's {} remote buffers", shown(v), rb.size()));
        if (tb_rbufs[static_cast<int>(ct)].size() >= static_cast<size_t>(kMaxChannels))
          return fail(rp, fmt::format("more than {} buffers", kMaxChannels));
        tb_rbufs[static_cast<int>(ct)].push_back(static_cast<int>(v.get<int64_t>()));
      }
    }
  }
  CHORUS_ASSIGN_OR_RETURN(const Json* ops, member(t, tp, "ops", Json::value_t::array));
  Tb& tb = gpus_[static_cast<size_t>(r)].tbs[static_cast<size_t>(id)];
  for (size_t k = 0; k < ops->size(); ++k) {
    if (++steps_ > kMaxOps) return fail(tp + ".ops", fmt::format("more than {} operations in all", kMaxOps));
    Op op;
    op.path = fmt::format("{}.ops[{}]", tp, k);
    CHORUS_RETURN_IF_ERROR(readOp((*ops)[k], op.path, r, tb_chans, tb_rbufs, &op));
    tb.ops.push_back(std::move(op));
  }
  return {};
}

struct OpName {
  std::string_view name;
  Kind kind;
};
constexpr OpName kOpNames[] = {
    {"put", Kind::Put},         {"pws", Kind::Pws},   {"pwsf", Kind::Pws},        {"signal", Kind::Signal},
    {"rlxsignal", Kind::Signal}, {"wait", Kind::Wait}, {"rlxwait", Kind::Wait},    {"copy", Kind::Copy},
    {"re", Kind::Reduce},       {"res", Kind::ReduceSend}, {"nop", Kind::Nop},    {"flush", Kind::Flush},
    {"barrier", Kind::Barrier},
};

Status Reader::readOp(const Json& o, const std::string& path, int r, const std::vector<int> (&tb_chans)[2],
                      const std::vector<int> (&tb_rbufs)[2], Op* op) {
  if (!o.is_object()) return fail(path, fmt::format("{} is not an object", shown(o)));
  CHORUS_RETURN_IF_ERROR(keys(o, path, {"name", "src_buff", "dst_buff", "channel_ids", "channel_type", "tbg_info",
                                        "barrier_id", "num_threadblocks"}));
  CHORUS_ASSIGN_OR_RETURN(const Json* name, member(o, path, "name", Json::value_t::string));
  const auto* it = std::find_if(std::begin(kOpNames), std::end(kOpNames),
                                [&](const OpName& x) { return name->get_ref<const std::string&>() == x.name; });
  if (it == std::end(kOpNames)) {
    static constexpr std::string_view kKnown[] = {"get", "rre", "rres", "ppkt", "rppkt", "respkt", "cpkt", "upkt",
                                                  "repkt", "recpkt", "recspkt", "glres", "pipeline", "sem_acquire",
                                                  "sem_release"};
    const bool known = std::find(std::begin(kKnown), std::end(kKnown), name->get<std::string>()) != std::end(kKnown);
    return fail(path + ".name",
                known ? fmt::format("{} is not read (this reader takes put, pws, pwsf, signal, wait, rlxsignal, "
                                    "rlxwait, flush, copy, re, res, nop, barrier; reads of a peer's memory, packets, "
                                    "multicast, pipelines and semaphores have no chorus step yet)",
                                    shown(*name))
                      : fmt::format("{} is not one of MSCCL++'s operations", shown(*name)));
  }
  op->kind = it->kind;
  if (o.contains("tbg_info")) {
    CHORUS_ASSIGN_OR_RETURN(const Json* tbg, member(o, path, "tbg_info", Json::value_t::object));
    CHORUS_RETURN_IF_ERROR(keys(*tbg, path + ".tbg_info", {"tb_id", "tbg_size"}));
    CHORUS_ASSIGN_OR_RETURN(const int64_t sz, integer(*tbg, path + ".tbg_info", "tbg_size", 1, kMaxTbs));
    CHORUS_RETURN_IF_ERROR(integer(*tbg, path + ".tbg_info", "tb_id", 0, sz - 1).status());
    if (sz != 1)
      return fail(path + ".tbg_info.tbg_size",
                  fmt::format("{}: an operation split over a group of thread blocks is not read", sz));
  }
  if (o.contains("channel_type")) {
    CHORUS_ASSIGN_OR_RETURN(const Json* ty, member(o, path, "channel_type", Json::value_t::string));
    if (*ty != "none") {
      CHORUS_ASSIGN_OR_RETURN(op->chan, chanType(*ty, path + ".channel_type"));
      op->has_chan = true;
    }
  }
  if (o.contains("channel_ids")) {
    CHORUS_ASSIGN_OR_RETURN(const Json* ids, member(o, path, "channel_ids", Json::value_t::array));
    if (!op->has_chan && !ids->empty()) return fail(path + ".channel_ids", "given without a channel_type");
    const auto& list = tb_chans[static_cast<int>(op->chan)];
    for (size_t q = 0; q < ids->size(); ++q) {
      const Json& v = (*ids)[q];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= static_cast<int64_t>(list.size()))
        return fail(fmt::format("{}.channel_ids[{}]", path, q),
                    fmt::format("{} is not one of its thread block's {} channels of the type", shown(v), list.size()));
      op->chans.push_back(list[static_cast<size_t>(v.get<int64_t>())]);
    }
  }
  if (o.contains("src_buff"))
    CHORUS_RETURN_IF_ERROR(readOperands(o, path, "src_buff", r, *op, tb_rbufs, &op->src));
  if (o.contains("dst_buff"))
    CHORUS_RETURN_IF_ERROR(readOperands(o, path, "dst_buff", r, *op, tb_rbufs, &op->dst));
  auto local = [&](const std::vector<Operand>& v, std::string_view key, size_t from) -> Status {
    for (size_t i = from; i < v.size(); ++i)
      if (v[i].remote) return fail(fmt::format("{}.{}[{}]", path, key, i), "a remote buffer where a local one is read");
    return {};
  };
  auto sameSize = [&](std::string_view key, const std::vector<Operand>& v, int64_t n) -> Status {
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].size != n)
        return fail(fmt::format("{}.{}[{}].size", path, key, i),
                    fmt::format("{} chunks where the operation moves {}", v[i].size, n));
    return {};
  };
  const bool signals = op->kind == Kind::Signal || op->kind == Kind::Wait;
  if (signals || op->kind == Kind::Pws) {
    if (!op->has_chan) return fail(path, "lacks channel_type");
    if (op->chans.empty()) return fail(path, "lacks channel_ids");
  }
  switch (op->kind) {
    case Kind::Put:
    case Kind::Pws:
      if (op->src.empty() || op->src.size() != op->dst.size())
        return fail(path, fmt::format("puts {} source and {} destination operands (one of each per message)",
                                      op->src.size(), op->dst.size()));
      CHORUS_RETURN_IF_ERROR(local(op->src, "src_buff", 0));
      for (size_t i = 0; i < op->dst.size(); ++i) {
        if (!op->dst[i].remote)
          return fail(fmt::format("{}.dst_buff[{}]", path, i), "a local buffer where a put writes a peer's");
        if (op->src[i].buf != op->src[0].buf)
          return fail(fmt::format("{}.src_buff[{}].type", path, i),
                      "not src_buff[0]'s: MSCCL++ reads every source of a put from src_buff[0]'s buffer");
        if (op->src[i].size != op->dst[i].size)
          return fail(fmt::format("{}.src_buff[{}].size", path, i),
                      fmt::format("{} chunks where its destination has {}", op->src[i].size, op->dst[i].size));
      }
      if (op->kind == Kind::Pws && op->chan == ChanType::Port) {
        if (op->chans.size() != op->dst.size())
          return fail(path + ".channel_ids", "one channel per destination is needed for a port channel's pws");
        for (size_t i = 0; i < op->dst.size(); ++i)
          if (gpus_[static_cast<size_t>(r)].chans[1][static_cast<size_t>(op->chans[i])].peer != op->dst[i].owner)
            return fail(fmt::format("{}.channel_ids[{}]", path, i), "does not lead to the destination's GPU");
      }
      break;
    case Kind::Copy:
      if (op->src.size() != 1 || op->dst.size() != 1)
        return fail(path, "a copy has one source and one destination operand");
      CHORUS_RETURN_IF_ERROR(local(op->src, "src_buff", 0));
      CHORUS_RETURN_IF_ERROR(local(op->dst, "dst_buff", 0));
      CHORUS_RETURN_IF_ERROR(sameSize("dst_buff", op->dst, op->src[0].size));
      break;
    case Kind::Reduce:
    case Kind::ReduceSend:
      if (op->src.empty() || op->dst.empty() || (op->kind == Kind::Reduce && op->dst.size() != 1))
        return fail(path, op->kind == Kind::Reduce ? "re has sources and one destination operand"
                                                   : "res has sources and a local destination, then remote ones");
      CHORUS_RETURN_IF_ERROR(local(op->src, "src_buff", 0));
      CHORUS_RETURN_IF_ERROR(local({op->dst[0]}, "dst_buff", 0));
      for (size_t i = 1; i < op->dst.size(); ++i)
        if (!op->dst[i].remote)
          return fail(fmt::format("{}.dst_buff[{}]", path, i), "a local buffer where res writes a peer's");
      CHORUS_RETURN_IF_ERROR(sameSize("src_buff", op->src, op->dst[0].size));
      CHORUS_RETURN_IF_ERROR(sameSize("dst_buff", op->dst, op->dst[0].size));
      break;
    case Kind::Barrier: {
      CHORUS_ASSIGN_OR_RETURN(const int64_t id, integer(o, path, "barrier_id", 0, kMaxTbs));
      CHORUS_ASSIGN_OR_RETURN(const int64_t nt, integer(o, path, "num_threadblocks", 1, kMaxTbs));
      op->barrier = static_cast<int>(id);
      op->barrier_n = static_cast<int>(nt);
      break;
    }
    case Kind::Flush: break;  // MSCCL++'s flush counts its channels by its dst_buff: read, not used
    default:
      if (!op->src.empty() || !op->dst.empty()) return fail(path, "names buffers, which this operation does not use");
      break;
  }
  return {};
}

Status Reader::readOperands(const Json& o, const std::string& path, std::string_view key, int r, const Op& op,
                            const std::vector<int> (&tb_rbufs)[2], std::vector<Operand>* out) {
  CHORUS_ASSIGN_OR_RETURN(const Json* arr, member(o, path, key, Json::value_t::array));
  if (arr->size() > 64) return fail(fmt::format("{}.{}", path, key), fmt::format("{} operands (at most 64)", arr->size()));
  const Gpu& G = gpus_[static_cast<size_t>(r)];
  for (size_t i = 0; i < arr->size(); ++i) {
    const Json& b = (*arr)[i];
    const std::string bp = fmt::format("{}.{}[{}]", path, key, i);
    if (!b.is_object()) return fail(bp, fmt::format("{} is not an object", shown(b)));
    CHORUS_RETURN_IF_ERROR(keys(b, bp, {"type", "buffer_id", "index", "size"}));
    Operand x;
    if (b.contains("buffer_id")) {
      if (!op.has_chan) return fail(bp + ".buffer_id", "a remote buffer in an operation without a channel_type");
      const auto& list = tb_rbufs[static_cast<int>(op.chan)];
      CHORUS_ASSIGN_OR_RETURN(const int64_t id, integer(b, bp, "buffer_id", 0, kMaxChannels));
      if (id >= static_cast<int64_t>(list.size()))
        return fail(bp + ".buffer_id", fmt::format("{} is not one of its thread block's {} remote buffers of the "
                                                   "operation's channel type",
                                                   id, list.size()));
      const auto [owner, buf] = rbufs_[static_cast<size_t>(r)][static_cast<size_t>(list[static_cast<size_t>(id)])];
      x.remote = true;
      x.owner = owner;
      x.buf = buf;
      if (b.contains("type")) {
        CHORUS_ASSIGN_OR_RETURN(const Json* ty, member(b, bp, "type", Json::value_t::string));
        CHORUS_ASSIGN_OR_RETURN(const Buf tb, bufType(*ty, bp + ".type"));
        if (tb != buf) return fail(bp + ".type", "not the type of the remote buffer it names");
      }
    } else {
      CHORUS_ASSIGN_OR_RETURN(const Json* ty, member(b, bp, "type", Json::value_t::string));
      CHORUS_ASSIGN_OR_RETURN(x.buf, bufType(*ty, bp + ".type"));
    }
    CHORUS_ASSIGN_OR_RETURN(x.index, integer(b, bp, "index", 0, kMaxChunk));
    CHORUS_ASSIGN_OR_RETURN(x.size, integer(b, bp, "size", 1, kMaxChunk));
    // The chunks lie inside the buffer (the owner's, for a remote one).
    const Gpu& B = x.remote ? gpus_[static_cast<size_t>(x.owner)] : G;
    const int64_t have = x.buf == Buf::Input ? B.in : x.buf == Buf::Output ? B.out : B.scr;
    if (x.index + x.size > have)
      return fail(bp, fmt::format("chunks {}..{} lie outside the {} buffer's {} chunks{}", x.index,
                                  x.index + x.size - 1, x.buf == Buf::Input ? "input" : x.buf == Buf::Output ? "output" : "scratch",
                                  have, x.remote ? fmt::format(" (of gpu {})", x.owner) : std::string()));
    out->push_back(x);
  }
  return {};
}

// A chunk run of rank r; in a plan claiming the in-place form, MSCCL++'s input
// and output are one buffer, named as chorus's builder binds them (as
// msccl_file.cpp's mapRef).
ChunkRef Reader::ref(int r, const Operand& o) const {
  const auto c = static_cast<uint32_t>(o.index);
  if (spec_.inplace != PlanInPlace::Yes || o.buf != Buf::Input) return {o.buf, c};
  const uint32_t C = spec_.chunks, base = static_cast<uint32_t>(r) * C;
  switch (facts(spec_.coll).inplace_rule) {
    case InPlace::Same: return {Buf::Output, c};
    case InPlace::InputInOutput: return {Buf::Output, base + c};
    case InPlace::OutputInInput:
      if (c >= base && c + o.size <= base + C) return {Buf::Output, c - base};
      break;
    default: break;
  }
  return {o.buf, c};
}

Status Reader::emit(int r, const std::string& path, ChunkStep s) {
  if (std::string e = planStepError(spec_, r, s); !e.empty()) return fail(path, e);
  spec_.programs[static_cast<size_t>(r)].push_back(s);
  return {};
}

// re / res: dst = the sum of the sources, as chorus's two-operand reductions.
// A source that is the destination goes first (it is read before it is
// overwritten); a source that partly overlaps it is refused by emit's check
// or by the ordering below.
Status Reader::localChain(int r, const Op& op) {
  const Operand& d = op.dst[0];
  const auto n = static_cast<uint32_t>(d.size);
  const ChunkRef dst = ref(r, d);
  std::vector<ChunkRef> srcs;
  for (const Operand& s : op.src) srcs.push_back(ref(r, s));
  auto same = [](ChunkRef a, ChunkRef b) { return a.buf == b.buf && a.chunk == b.chunk; };
  auto overlaps = [&](ChunkRef a, ChunkRef b) { return a.buf == b.buf && a.chunk < b.chunk + n && b.chunk < a.chunk + n; };
  const auto self = std::find_if(srcs.begin(), srcs.end(), [&](ChunkRef s) { return same(s, dst); });
  if (self != srcs.end()) std::rotate(srcs.begin(), self, self + 1);
  for (size_t i = 1; i < srcs.size(); ++i)
    if (overlaps(srcs[i], dst) && !same(srcs[i], dst))
      return fail(fmt::format("{}.dst_buff[0]", op.path), "overlaps a source in part");
  if (srcs.size() == 1) {
    if (same(srcs[0], dst)) return {};
    return emit(r, op.path, mk(StepOp::Copy, -1, dst, srcs[0], {}, n));
  }
  CHORUS_RETURN_IF_ERROR(emit(r, op.path, mk(StepOp::Reduce, -1, dst, srcs[0], srcs[1], n)));
  for (size_t i = 2; i < srcs.size(); ++i) {
    if (same(srcs[i], dst))
      return fail(fmt::format("{}.src_buff", op.path), "names the destination twice");
    CHORUS_RETURN_IF_ERROR(emit(r, op.path, mk(StepOp::Reduce, -1, dst, dst, srcs[i], n)));
  }
  return {};
}

bool Reader::canFire(int r, int t, std::string* why) const {
  const Gpu& G = gpus_[static_cast<size_t>(r)];
  const Tb& tb = G.tbs[static_cast<size_t>(t)];
  const Op& op = tb.ops[tb.pc];
  if (op.kind == Kind::Barrier) {
    const auto it = at_barrier_.find({r, op.barrier});
    if (it == at_barrier_.end() || it->second < op.barrier_n) {
      if (why != nullptr)
        *why = fmt::format("waits at barrier {} for {} thread blocks; {} arrive", op.barrier, op.barrier_n,
                           it == at_barrier_.end() ? 0 : it->second);
      return false;
    }
    return true;
  }
  if (op.kind != Kind::Wait) return true;
  // Every channel's next signal has come, and its puts are the oldest sends
  // from that peer not yet received (in channel order within the wait).
  std::map<int, size_t> taken;  // peer -> messages this wait takes before the channel
  for (int ci : op.chans) {
    const Chan& ch = G.chans[static_cast<int>(op.chan)][static_cast<size_t>(ci)];
    const auto sit = signals_.find({ch.peer, r, static_cast<int>(op.chan), ch.ordinal});
    if (sit == signals_.end() || sit->second.empty()) {
      if (why != nullptr)
        *why = fmt::format("it waits for a signal from gpu {} on {} channel {} that is never sent", ch.peer,
                           op.chan == ChanType::Memory ? "memory" : "port", ci);
      return false;
    }
    const auto uit = unreceived_.find({ch.peer, r});
    size_t& k = taken[ch.peer];
    for (uint32_t m : sit->second.front()) {
      if (uit == unreceived_.end() || k >= uit->second.size() || uit->second[k] != m) {
        if (why != nullptr)
          *why = fmt::format("the puts its signal from gpu {} covers are not the oldest messages gpu {} sent it "
                             "(chorus matches a pair's messages in order)",
                             ch.peer, ch.peer);
        return false;
      }
      ++k;
    }
  }
  return true;
}

Status Reader::fire(int r, int t) {
  Gpu& G = gpus_[static_cast<size_t>(r)];
  Tb& tb = G.tbs[static_cast<size_t>(t)];
  const Op& op = tb.ops[tb.pc];
  auto send = [&](const Operand& src, const Operand& dst) -> Status {
    CHORUS_RETURN_IF_ERROR(emit(r, op.path, mk(StepOp::Send, dst.owner, {}, ref(r, src), {}, static_cast<uint32_t>(src.size))));
    msgs_.push_back({r, dst.owner, dst, dst.size});
    const auto id = static_cast<uint32_t>(msgs_.size() - 1);
    pending_[{r, t, dst.owner}].push_back(id);
    unreceived_[{r, dst.owner}].push_back(id);
    return {};
  };
  auto signal = [&](int ci) {
    const Chan& ch = G.chans[static_cast<int>(op.chan)][static_cast<size_t>(ci)];
    auto& pend = pending_[{r, t, ch.peer}];
    signals_[{r, ch.peer, static_cast<int>(op.chan), ch.ordinal}].push_back(std::move(pend));
    pend.clear();
    woken_.push_back(ch.peer);
  };
  switch (op.kind) {
    case Kind::Put:
    case Kind::Pws:
      for (size_t i = 0; i < op.src.size(); ++i) {
        CHORUS_RETURN_IF_ERROR(send(op.src[i], op.dst[i]));
        // A port channel's pws signals its channel after its put; over a
        // memory channel MSCCL++ runs it as a put.
        if (op.kind == Kind::Pws && op.chan == ChanType::Port) signal(op.chans[i]);
      }
      break;
    case Kind::Signal:
      for (int ci : op.chans) signal(ci);
      break;
    case Kind::Wait:
      for (int ci : op.chans) {
        const Chan& ch = G.chans[static_cast<int>(op.chan)][static_cast<size_t>(ci)];
        auto& q = signals_[{ch.peer, r, static_cast<int>(op.chan), ch.ordinal}];
        auto& un = unreceived_[{ch.peer, r}];
        if (q.empty()) return fail(op.path + ".channel_ids", "names one channel twice");
        for (uint32_t m : q.front()) {
          if (un.empty() || un.front() != m) return fail(op.path + ".channel_ids", "names one channel twice");
          const Msg& msg = msgs_[m];
          CHORUS_RETURN_IF_ERROR(emit(r, op.path, mk(StepOp::Recv, msg.from, ref(r, msg.dst), {}, {}, static_cast<uint32_t>(msg.n))));
          un.pop_front();
        }
        q.pop_front();
      }
      woken_.push_back(r);  // another wait of this GPU may now hold the oldest messages
      break;
    case Kind::Copy:
    case Kind::Reduce:
      CHORUS_RETURN_IF_ERROR(localChain(r, op));
      break;
    case Kind::ReduceSend:
      CHORUS_RETURN_IF_ERROR(localChain(r, op));
      for (size_t i = 1; i < op.dst.size(); ++i) CHORUS_RETURN_IF_ERROR(send(op.dst[0], op.dst[i]));
      break;
    case Kind::Barrier: {
      // Everyone waiting at it passes together.
      at_barrier_.erase({r, op.barrier});
      const int id = op.barrier;
      for (Tb& other : G.tbs)
        if (&other != &tb && other.pc < other.ops.size() && other.ops[other.pc].kind == Kind::Barrier &&
            other.ops[other.pc].barrier == id) {
          ++other.pc;
          arrive(r, other);
        }
      woken_.push_back(r);
      break;
    }
    case Kind::Nop:
    case Kind::Flush: break;
  }
  ++tb.pc;
  arrive(r, tb);
  return {};
}

void Reader::arrive(int r, const Tb& tb) {
  if (tb.pc < tb.ops.size() && tb.ops[tb.pc].kind == Kind::Barrier) {
    ++at_barrier_[{r, tb.ops[tb.pc].barrier}];
    woken_.push_back(r);
  }
}

Status Reader::simulate() {
  for (int r = 0; r < n_; ++r)
    for (Tb& tb : gpus_[static_cast<size_t>(r)].tbs)
      arrive(r, tb);
  // A work list of thread blocks; one that blocks waits until something
  // happens on its GPU (a signal to it, a wait of it, a barrier arrival).
  std::deque<std::pair<int, int>> work;
  std::vector<std::vector<int>> blocked(static_cast<size_t>(n_));
  for (int r = 0; r < n_; ++r)
    for (size_t t = 0; t < gpus_[static_cast<size_t>(r)].tbs.size(); ++t) work.emplace_back(r, static_cast<int>(t));
  while (!work.empty()) {
    const auto [r, t] = work.front();
    work.pop_front();
    const Tb& tb = gpus_[static_cast<size_t>(r)].tbs[static_cast<size_t>(t)];
    while (tb.pc < tb.ops.size() && canFire(r, t, nullptr)) CHORUS_RETURN_IF_ERROR(fire(r, t));
    if (tb.pc < tb.ops.size()) blocked[static_cast<size_t>(r)].push_back(t);
    for (int w : woken_) {
      for (int b : blocked[static_cast<size_t>(w)]) work.emplace_back(w, b);
      blocked[static_cast<size_t>(w)].clear();
    }
    woken_.clear();
  }
  for (int r = 0; r < n_; ++r) {
    const auto& tbs = gpus_[static_cast<size_t>(r)].tbs;
    for (size_t t = 0; t < tbs.size(); ++t)
      if (tbs[t].pc < tbs[t].ops.size()) {
        std::string why;
        (void)canFire(r, static_cast<int>(t), &why);
        return fail(tbs[t].ops[tbs[t].pc].path, fmt::format("never runs: {}", why));
      }
  }
  for (const auto& [key, ids] : pending_)
    if (!ids.empty())
      return invalidArgument("{}: gpus[{}].threadblocks[{}]: a put to gpu {} is never signalled (the peer could not "
                             "know its data arrived)",
                             origin_, std::get<0>(key), std::get<1>(key), std::get<2>(key));
  for (const auto& [key, q] : signals_)
    if (!q.empty())
      return invalidArgument("{}: gpu {}'s signal to gpu {} on {} channel (its {} to that peer) is never waited for",
                             origin_, std::get<0>(key), std::get<1>(key), std::get<2>(key) == 0 ? "a memory" : "a port",
                             std::get<3>(key));
  return {};
}

}  // namespace

Result<PlanSpec> parseMscclppJson(std::string_view text, std::string_view origin) {
  return Reader(origin).run(text);
}

}  // namespace chorus::plan
