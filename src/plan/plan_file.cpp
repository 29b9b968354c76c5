// Plans from files: chorus's text format (docs/plan-format.md), its writer,
// the reader table and the loader that proves every plan before registering it.
#include "plan/plan_file.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/shown.hpp"
#include "plan/verify.hpp"

namespace chorus::plan {
namespace {

// The proof at load holds every rank's buffers in the verifier's memory (one
// symbolic value per element, at count 3C): bounding the chunks of all ranks'
// buffers together bounds what a file can make the loader allocate.
constexpr uint64_t kMaxTotalChunks = uint64_t{1} << 18;

constexpr std::string_view kFileCollectives = "allreduce, broadcast, reduce, allgather, reducescatter, alltoall, gather, scatter";
constexpr std::string_view kKeywords =
    "chorus-plan, name, collective, ranks, chunks, scratch, root, inplace, rank, send, recv, recvreduce, copy, reduce";

bool fileCollective(Collective c) {
  return c != Collective::AllGatherV && c != Collective::AllToAllV && c != Collective::Barrier;
}

std::string_view bufName(Buf b) {
  switch (b) {
    case Buf::Input: return "in";
    case Buf::Output: return "out";
    case Buf::Scratch: return "scr";
    default: return "?";
  }
}
bool parseBuf(std::string_view t, Buf* b) {
  if (t == "in") *b = Buf::Input;
  else if (t == "out") *b = Buf::Output;
  else if (t == "scr") *b = Buf::Scratch;
  else return false;
  return true;
}

std::string_view opName(StepOp op) {
  switch (op) {
    case StepOp::Send: return "send";
    case StepOp::Recv: return "recv";
    case StepOp::RecvReduce: return "recvreduce";
    case StepOp::Copy: return "copy";
    case StepOp::Reduce: return "reduce";
    default: return "?";
  }
}

std::string_view inplaceName(PlanInPlace p) {
  return p == PlanInPlace::Yes ? "yes" : p == PlanInPlace::Both ? "both" : "no";
}

std::string shown(std::string_view t) { return shownUntrusted(t); }

bool validName(std::string_view s) {
  if (s.empty() || s.size() > kPlanMaxName) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

// Whether a built-in algorithm of this collective has this name (a file plan
// may not shadow one: CHORUS_ALGO and --algo would become ambiguous).
bool builtinName(Collective c, std::string_view name) {
  static const Registry kBuiltin = Registry::builtin();
  return kBuiltin.find(c, name) != nullptr;
}

// Why rank `rank` has no `buf`, for messages.
std::string_view whyNoBuffer(const PlanSpec& spec, Buf buf) {
  if (buf == Buf::Scratch) return "the plan declares no scratch";
  if (buf == Buf::Input) return "only the root has an input";
  if (spec.coll == Collective::Reduce || spec.coll == Collective::Gather) return "only the root has an output";
  return "it has none";
}

// The rules of one step of rank `rank`: "" when it keeps them, else what is
// wrong (the caller adds where).
std::string stepError(const PlanSpec& spec, int rank, const ChunkStep& s) {
  const bool message = s.op == StepOp::Send || s.op == StepOp::Recv || s.op == StepOp::RecvReduce;
  if (message) {
    if (s.peer < 0 || s.peer >= spec.nranks)
      return fmt::format("peer {} is not a rank of a {}-rank plan", s.peer, spec.nranks);
    if (s.peer == rank) return fmt::format("peer {} is this rank (a rank sends nothing to itself)", s.peer);
  }
  if (s.n == 0) return "n is 0 (a step moves at least one chunk)";
  // The regions the step reads and the one it writes.
  const bool writes = s.op != StepOp::Send;
  const int reads = s.op == StepOp::Recv ? 0 : s.op == StepOp::Reduce ? 2 : 1;
  auto inBounds = [&](const ChunkRef& c, std::string_view role) -> std::string {
    const uint64_t have = planChunksOf(spec, c.buf, rank);
    if (have == 0)
      return fmt::format("{} '{}': rank {} has no such buffer in this {} ({})", role, bufName(c.buf), rank,
                         collectiveName(spec.coll), whyNoBuffer(spec, c.buf));
    if (uint64_t{c.chunk} + s.n > have)
      return fmt::format("{} chunks {}..{} of '{}' are past its end (rank {} has {} chunks of it)", role, c.chunk,
                         uint64_t{c.chunk} + s.n - 1, bufName(c.buf), rank, have);
    return {};
  };
  if (writes) {
    if (std::string e = inBounds(s.dst, "destination"); !e.empty()) return e;
    if (s.dst.buf == Buf::Input)
      return "the destination is 'in': the call's input is read-only (write 'out' or 'scr')";
  }
  const ChunkRef* ops[2] = {&s.src, &s.src2};
  for (int i = 0; i < reads; ++i) {
    if (std::string e = inBounds(*ops[i], i == 0 ? "source" : "second source"); !e.empty()) return e;
    // The kernels and the transport reduce element by element: a destination
    // that is an operand's very run works, one shifted against it would read
    // elements the step already wrote.  (A copy is a memmove.)
    const ChunkRef& o = *ops[i];
    if (writes && s.op != StepOp::Copy && o.buf == s.dst.buf && o.chunk != s.dst.chunk &&
        o.chunk < s.dst.chunk + uint64_t{s.n} && s.dst.chunk < o.chunk + uint64_t{s.n})
      return fmt::format("the destination (chunk {}) partly overlaps an operand (chunk {}) of '{}': a reduction "
                         "writes the operand's own run or a disjoint one", s.dst.chunk, o.chunk, bufName(o.buf));
  }
  return {};
}

// ---- The text parser --------------------------------------------------------

// Up to 9 tokens of one line (a step has at most 8), split on blanks, without
// the comment.  More are reported as too many.
struct Tokens {
  std::string_view t[9];
  int n = 0;
  bool overflow = false;
};
Tokens tokenize(std::string_view line) {
  Tokens k;
  if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i == line.size()) break;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (k.n == 9) {
      k.overflow = true;
      break;
    }
    k.t[k.n++] = line.substr(i, j - i);
    i = j;
  }
  return k;
}

class TextParser {
 public:
  TextParser(std::string_view text, std::string_view origin) : text_(text) { spec_.origin = std::string(origin); }
  Result<PlanSpec> run();

 private:
  // "origin:line: 'token': what"
  Status fail(size_t line, std::string_view token, std::string what) const {
    return invalidArgument("{}:{}: '{}': {}", spec_.origin, line, shown(token), what);
  }
  Status failEof(std::string what) const {
    return invalidArgument("{}:{}: end of file: {}", spec_.origin, std::max<size_t>(line_, 1), what);
  }
  // A decimal number in [lo, hi]: `what` names it in messages.
  Result<uint64_t> number(std::string_view key, std::string_view tok, std::string_view what, uint64_t lo,
                          uint64_t hi) const {
    uint64_t v = 0;
    const bool digits = !tok.empty() && std::all_of(tok.begin(), tok.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) return fail(line_, key, fmt::format("{} '{}' is not a decimal number", what, shown(tok)));
    auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec != std::errc() || p != tok.data() + tok.size() || v < lo || v > hi)
      return fail(line_, key, fmt::format("{} {} is out of range ({} to {})", what, shown(tok), lo, hi));
    return v;
  }
  Status headerLine(const Tokens& k);
  Status endHeader(std::string_view token);
  Status rankLine(const Tokens& k);
  Status stepLine(const Tokens& k, StepOp op);

  std::string_view text_;
  PlanSpec spec_;
  size_t line_ = 0;
  bool version_ = false, header_done_ = false;
  int rank_ = -1;  // the section being read
  size_t steps_ = 0;  // in all ranks
  // Line of each header key (0: not given): name, collective, ranks, chunks, scratch, root, inplace.
  static constexpr std::string_view kKeys[7] = {"name", "collective", "ranks", "chunks", "scratch", "root", "inplace"};
  size_t key_line_[7] = {};
  std::vector<size_t> rank_line_;  // line of each rank's section, 0: none yet
};

Result<PlanSpec> TextParser::run() {
  if (text_.size() > kPlanMaxFileBytes)
    return invalidArgument("{}: {} bytes: a plan file holds at most {} bytes", spec_.origin, text_.size(),
                           kPlanMaxFileBytes);
  size_t pos = 0;
  while (pos < text_.size()) {
    size_t end = text_.find('\n', pos);
    if (end == std::string_view::npos) end = text_.size();
    const std::string_view line = text_.substr(pos, end - pos);
    pos = end + 1;
    ++line_;
    if (line.size() > kPlanMaxLine)
      return invalidArgument("{}:{}: the line is {} bytes long (at most {})", spec_.origin, line_, line.size(),
                             kPlanMaxLine);
    const Tokens k = tokenize(line);
    if (k.n == 0) continue;
    const std::string_view kw = k.t[0];
    if (k.overflow) return fail(line_, kw, "too many values on one line (a step has at most 8 tokens)");
    if (!version_) {
      if (kw != "chorus-plan")
        return fail(line_, kw, "a plan file begins with 'chorus-plan 1' (the format and its version)");
      if (k.n != 2) return fail(line_, kw, "takes one value, the format's version: 'chorus-plan 1'");
      if (k.t[1] != "1")
        return fail(line_, kw, fmt::format("version '{}' is not one this build reads (it reads version 1)",
                                           shown(k.t[1])));
      version_ = true;
      continue;
    }
    if (kw == "rank") {
      CHORUS_RETURN_IF_ERROR(rankLine(k));
      continue;
    }
    if (std::find(std::begin(kKeys), std::end(kKeys), kw) != std::end(kKeys)) {
      CHORUS_RETURN_IF_ERROR(headerLine(k));
      continue;
    }
    StepOp op;
    if (kw == "send") op = StepOp::Send;
    else if (kw == "recv") op = StepOp::Recv;
    else if (kw == "recvreduce") op = StepOp::RecvReduce;
    else if (kw == "copy") op = StepOp::Copy;
    else if (kw == "reduce") op = StepOp::Reduce;
    else if (kw == "chorus-plan") return fail(line_, kw, "given twice");
    else return fail(line_, kw, fmt::format("is neither a header key nor a step ({})", kKeywords));
    CHORUS_RETURN_IF_ERROR(stepLine(k, op));
  }
  if (!version_) return failEof("no 'chorus-plan 1' line (an empty or truncated plan file)");
  if (!header_done_) return failEof("no 'rank' section (a truncated plan file?)");
  for (int r = 0; r < spec_.nranks; ++r)
    if (rank_line_[r] == 0)
      return failEof(fmt::format("rank {} has no section (every rank 0..{} needs one 'rank' section; a truncated "
                                 "plan file?)", r, spec_.nranks - 1));
  return std::move(spec_);
}

Status TextParser::headerLine(const Tokens& k) {
  const std::string_view key = k.t[0];
  const size_t idx = static_cast<size_t>(std::find(std::begin(kKeys), std::end(kKeys), key) - std::begin(kKeys));
  if (header_done_) return fail(line_, key, "a header line after the first 'rank' section (the header comes first)");
  if (key_line_[idx] != 0) return fail(line_, key, fmt::format("given twice (first on line {})", key_line_[idx]));
  if (k.n != 2) return fail(line_, key, fmt::format("takes one value, got {}", k.n - 1));
  key_line_[idx] = line_;
  const std::string_view v = k.t[1];
  if (key == "name") {
    if (!validName(v))
      return fail(line_, key, fmt::format("'{}' is not a plan name (1 to {} characters of a-z, 0-9, '_', '.', '-')",
                                          shown(v), kPlanMaxName));
    spec_.name = std::string(v);
  } else if (key == "collective") {
    Collective c;
    if (!parseCollective(v, &c))
      return fail(line_, key, fmt::format("'{}' is not a collective ({})", shown(v), kFileCollectives));
    if (!fileCollective(c))
      return fail(line_, key, fmt::format("{} has no plan-file form yet (the v-collectives' counts differ by rank, a "
                                          "barrier moves no data); plan files describe {}", v, kFileCollectives));
    spec_.coll = c;
  } else if (key == "ranks") {
    CHORUS_ASSIGN_OR_RETURN(const uint64_t n, number(key, v, "the rank count", kPlanMinRanks, kPlanMaxRanks));
    spec_.nranks = static_cast<int>(n);
  } else if (key == "chunks") {
    CHORUS_ASSIGN_OR_RETURN(const uint64_t c, number(key, v, "the chunk count", 1, kPlanMaxChunks));
    spec_.chunks = static_cast<uint32_t>(c);
  } else if (key == "scratch") {
    CHORUS_ASSIGN_OR_RETURN(const uint64_t s, number(key, v, "the scratch chunk count", 0, kPlanMaxScratch));
    spec_.scratch = static_cast<uint32_t>(s);
  } else if (key == "root") {
    // Its range needs the rank count, which may come later: endHeader checks it.
    CHORUS_ASSIGN_OR_RETURN(const uint64_t r, number(key, v, "the root", 0, kPlanMaxRanks));
    spec_.root = static_cast<int>(r);
  } else {  // inplace
    if (v == "no") spec_.inplace = PlanInPlace::No;
    else if (v == "yes") spec_.inplace = PlanInPlace::Yes;
    else if (v == "both") spec_.inplace = PlanInPlace::Both;
    else return fail(line_, key, fmt::format("'{}' is not one of yes, no, both", shown(v)));
  }
  return {};
}

// The header is complete at the first 'rank' line: what it must hold, and
// the rules between its values.
Status TextParser::endHeader(std::string_view token) {
  for (size_t i = 0; i < 4; ++i)  // name, collective, ranks, chunks
    if (key_line_[i] == 0)
      return fail(line_, token, fmt::format("the header lacks '{}' (a plan declares name, collective, ranks and "
                                            "chunks before its first rank)", kKeys[i]));
  if (const size_t root_line = key_line_[5]; root_line != 0) {
    if (!facts(spec_.coll).rooted)
      return fail(root_line, "root", fmt::format("{} has no root", collectiveName(spec_.coll)));
    if (spec_.root >= spec_.nranks)
      return fail(root_line, "root", fmt::format("root {} is not a rank of a {}-rank plan", spec_.root, spec_.nranks));
  }
  if (builtinName(spec_.coll, spec_.name))
    return fail(key_line_[0], "name", fmt::format("'{}' is the name of a built-in {} algorithm (choose another)",
                                                  spec_.name, collectiveName(spec_.coll)));
  // The proof at load holds every rank's buffers in memory (kMaxTotalChunks).
  uint64_t total = 0;
  for (int r = 0; r < spec_.nranks; ++r)
    total += planChunksOf(spec_, Buf::Input, r) + planChunksOf(spec_, Buf::Output, r) + spec_.scratch;
  if (total > kMaxTotalChunks)
    return fail(line_, token, fmt::format("the ranks' buffers hold {} chunks together (input, output and scratch of "
                                          "every rank), at most {}: fewer chunks or less scratch", total,
                                          kMaxTotalChunks));
  header_done_ = true;
  spec_.programs.assign(static_cast<size_t>(spec_.nranks), {});
  rank_line_.assign(static_cast<size_t>(spec_.nranks), 0);
  return {};
}

Status TextParser::rankLine(const Tokens& k) {
  if (!header_done_) CHORUS_RETURN_IF_ERROR(endHeader(k.t[0]));
  if (k.n != 2) return fail(line_, k.t[0], fmt::format("takes one value, the rank, got {}", k.n - 1));
  CHORUS_ASSIGN_OR_RETURN(const uint64_t r, number(k.t[0], k.t[1], "the rank", 0, UINT32_MAX));
  if (r >= static_cast<uint64_t>(spec_.nranks))
    return fail(line_, k.t[0], fmt::format("{} is not a rank of a {}-rank plan", r, spec_.nranks));
  if (rank_line_[r] != 0)
    return fail(line_, k.t[0], fmt::format("rank {} has a section already (line {})", r, rank_line_[r]));
  rank_line_[r] = line_;
  rank_ = static_cast<int>(r);
  return {};
}

Status TextParser::stepLine(const Tokens& k, StepOp op) {
  const std::string_view kw = k.t[0];
  if (rank_ < 0) return fail(line_, kw, "a step before the first 'rank' section (steps belong to a rank)");
  // Arguments: peer (messages), then (buffer, chunk) per region, then n.
  const bool message = op == StepOp::Send || op == StepOp::Recv || op == StepOp::RecvReduce;
  const int regions = op == StepOp::Send || op == StepOp::Recv ? 1 : op == StepOp::Reduce ? 3 : 2;
  const int need = (message ? 1 : 0) + 2 * regions;
  constexpr std::string_view kUsage[] = {"send <peer> <buf> <chunk> [<n>]", "recv <peer> <buf> <chunk> [<n>]",
                                         "recvreduce <peer> <dstbuf> <dstchunk> <srcbuf> <srcchunk> [<n>]",
                                         "copy <dstbuf> <chunk> <srcbuf> <chunk> [<n>]",
                                         "reduce <dstbuf> <chunk> <abuf> <chunk> <bbuf> <chunk> [<n>]"};
  const std::string_view usage = kUsage[static_cast<int>(op)];
  if (k.n - 1 != need && k.n - 1 != need + 1)
    return fail(line_, kw, fmt::format("takes {} or {} values ({}), got {}", need, need + 1, usage, k.n - 1));
  if (steps_ >= kPlanMaxSteps)
    return fail(line_, kw, fmt::format("more than {} steps in the plan", kPlanMaxSteps));
  ChunkStep s;
  s.op = op;
  int i = 1;
  if (message) {
    CHORUS_ASSIGN_OR_RETURN(const uint64_t p, number(kw, k.t[i++], "peer", 0, UINT32_MAX));
    if (p >= static_cast<uint64_t>(spec_.nranks))
      return fail(line_, kw, fmt::format("peer {} is not a rank of a {}-rank plan", p, spec_.nranks));
    s.peer = static_cast<int32_t>(p);
  }
  // Regions in the order of the line: send's is the source; the others' first
  // is the destination, then the sources.
  ChunkRef* refs[3] = {op == StepOp::Send ? &s.src : &s.dst, op == StepOp::Send ? nullptr : &s.src, &s.src2};
  for (int g = 0; g < regions; ++g) {
    const std::string_view b = k.t[i++], c = k.t[i++];
    if (!parseBuf(b, &refs[g]->buf))
      return fail(line_, kw, fmt::format("'{}' is not a buffer (in, out, scr)", shown(b)));
    CHORUS_ASSIGN_OR_RETURN(const uint64_t ch, number(kw, c, "chunk", 0, UINT32_MAX));
    refs[g]->chunk = static_cast<uint32_t>(ch);
  }
  if (i < k.n) {
    CHORUS_ASSIGN_OR_RETURN(const uint64_t n, number(kw, k.t[i], "n (the chunks of the step)", 1, UINT32_MAX));
    s.n = static_cast<uint32_t>(n);
  }
  if (std::string e = stepError(spec_, rank_, s); !e.empty()) return fail(line_, kw, std::move(e));
  spec_.programs[rank_].push_back(s);
  ++steps_;
  return {};
}

// ---- Readers -----------------------------------------------------------------

// The formats the loader reads.  Adding one: a parse function returning a
// PlanSpec (its own file under src/plan/), and its line here.
constexpr PlanReader kReaders[] = {
    {"chorus", ".plan", &parsePlanText},
    {"msccl", ".xml", &parseMscclXml},
    {"mscclpp", ".json", &parseMscclppJson},
};

const PlanReader* readerFor(const std::filesystem::path& p) {
  const std::string ext = p.extension().string();
  for (const PlanReader& r : kReaders)
    if (ext == r.extension) return &r;
  return nullptr;
}

std::string knownExtensions() {
  std::string s;
  for (const PlanReader& r : kReaders) s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", r.extension, r.name);
  return s;
}

// A shape's description in a load-time refusal.
std::string caseName(const Shape& sh) {
  return fmt::format("count {}{}{}{}", sh.count, sh.inplace ? ", in place" : ", out of place",
                     facts(sh.coll).rooted ? fmt::format(", root {}", sh.root) : "",
                     sh.scaling == Scaling::PreMulSum ? ", premulsum" : sh.scaling == Scaling::Avg ? ", avg" : "");
}

// In place, the builder maps one buffer into the other, which can make a
// reduction's destination partly overlap an operand although the file's
// buffers kept them apart (checkPlanSpec): refused like the same case in the file.
Status checkExpanded(const FileAlgorithm& algo, const Shape& sh) {
  Program prog;
  for (int r = 0; r < sh.nranks; ++r) {
    expand(algo, sh, r, &prog);
    for (size_t i = 0; i < prog.steps.size(); ++i) {
      const Step& s = prog.steps[i];
      if (s.op != StepOp::Reduce && s.op != StepOp::RecvReduce) continue;
      for (const Region* o : {&s.src, &s.src2})
        if (s.dst.overlaps(*o) && s.dst.offset != o->offset)
          return invalidArgument("{}: plan '{}' ({}): rank {}'s step {} ({}) writes a region that partly overlaps "
                                 "one it reads once the in-place buffers coincide", algo.spec().origin, algo.name(),
                                 caseName(sh), r, i, opName(s.op));
    }
  }
  return {};
}

Result<std::string> readFile(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec))
    return invalidArgument("plan file '{}': not a regular file", p.string());
  std::ifstream f(p, std::ios::binary);
  if (!f) return systemError("plan file '{}': cannot be opened", p.string());
  // In pieces, so that a file larger than the bound is refused without
  // reading (or allocating for) all of it.
  std::string text;
  char piece[1 << 14];
  while (f.read(piece, sizeof piece) || f.gcount() > 0) {
    text.append(piece, static_cast<size_t>(f.gcount()));
    if (text.size() > kPlanMaxFileBytes)
      return invalidArgument("plan file '{}': larger than {} bytes", p.string(), kPlanMaxFileBytes);
  }
  if (f.bad()) return systemError("plan file '{}': read error", p.string());
  return text;
}

Result<PlanSpec> readSpec(const std::filesystem::path& p) {
  const PlanReader* reader = readerFor(p);
  if (reader == nullptr)
    return invalidArgument("plan file '{}': unknown extension '{}' (known: {})", p.string(),
                           shown(p.extension().string()), knownExtensions());
  CHORUS_ASSIGN_OR_RETURN(const std::string text, readFile(p));
  return reader->parse(text, p.string());
}

Status loadFile(Registry& reg, const std::filesystem::path& p) {
  CHORUS_ASSIGN_OR_RETURN(PlanSpec spec, readSpec(p));
  if (const Algorithm* other = reg.find(spec.coll, spec.name)) {
    const auto* file = dynamic_cast<const FileAlgorithm*>(other);
    return invalidArgument("plan file '{}': {} plan '{}' is already registered ({})", p.string(),
                           collectiveName(spec.coll), spec.name,
                           file ? fmt::format("loaded from '{}'", file->spec().origin) : std::string("a built-in algorithm"));
  }
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<FileAlgorithm> algo, buildPlan(std::move(spec)));
  reg.add(std::move(algo));
  return {};
}

}  // namespace

std::string planStepError(const PlanSpec& spec, int rank, const ChunkStep& s) { return stepError(spec, rank, s); }

uint64_t planChunksOf(const PlanSpec& spec, Buf buf, int rank) {
  if (buf == Buf::Scratch) return spec.scratch;
  if (buf != Buf::Input && buf != Buf::Output) return 0;
  // A Shape whose count is the chunk count measures buffers in chunks.
  Shape sh;
  sh.coll = spec.coll;
  sh.nranks = spec.nranks;
  sh.count = spec.chunks;
  sh.root = spec.root;
  return buf == Buf::Input ? sh.inputElems(rank) : sh.outputElems(rank);
}

Status checkPlanSpec(const PlanSpec& spec) {
  const std::string& o = spec.origin;
  if (!validName(spec.name)) return invalidArgument("{}: '{}' is not a plan name", o, shown(spec.name));
  if (!fileCollective(spec.coll))
    return invalidArgument("{}: {} has no plan-file form", o, collectiveName(spec.coll));
  if (spec.nranks < kPlanMinRanks || spec.nranks > kPlanMaxRanks)
    return invalidArgument("{}: {} ranks (a plan has {} to {})", o, spec.nranks, kPlanMinRanks, kPlanMaxRanks);
  if (spec.chunks < 1 || spec.chunks > kPlanMaxChunks)
    return invalidArgument("{}: {} chunks (a plan has 1 to {})", o, spec.chunks, kPlanMaxChunks);
  if (spec.scratch > kPlanMaxScratch)
    return invalidArgument("{}: {} scratch chunks (at most {})", o, spec.scratch, kPlanMaxScratch);
  if (spec.root < 0 || spec.root >= spec.nranks || (!facts(spec.coll).rooted && spec.root != 0))
    return invalidArgument("{}: root {} for a {}-rank {}", o, spec.root, spec.nranks, collectiveName(spec.coll));
  if (builtinName(spec.coll, spec.name))
    return invalidArgument("{}: '{}' is the name of a built-in {} algorithm", o, spec.name, collectiveName(spec.coll));
  if (spec.programs.size() != static_cast<size_t>(spec.nranks))
    return invalidArgument("{}: {} programs for {} ranks", o, spec.programs.size(), spec.nranks);
  uint64_t total = 0, steps = 0;
  for (int r = 0; r < spec.nranks; ++r) {
    total += planChunksOf(spec, Buf::Input, r) + planChunksOf(spec, Buf::Output, r) + spec.scratch;
    steps += spec.programs[r].size();
  }
  if (total > kMaxTotalChunks)
    return invalidArgument("{}: the ranks' buffers hold {} chunks together, at most {}", o, total, kMaxTotalChunks);
  if (steps > kPlanMaxSteps) return invalidArgument("{}: {} steps, at most {}", o, steps, kPlanMaxSteps);
  for (int r = 0; r < spec.nranks; ++r)
    for (size_t i = 0; i < spec.programs[r].size(); ++i) {
      const ChunkStep& s = spec.programs[r][i];
      if (opName(s.op) == "?") return invalidArgument("{}: rank {} step {}: not a step of the format", o, r, i);
      if (std::string e = stepError(spec, r, s); !e.empty())
        return invalidArgument("{}: rank {} step {} ({}): {}", o, r, i, opName(s.op), e);
    }
  if (!spec.streams.empty()) {
    if (spec.streams.size() != spec.programs.size())
      return invalidArgument("{}: a schedule for {} ranks, {} programs", o, spec.streams.size(), spec.programs.size());
    for (int r = 0; r < spec.nranks; ++r) {
      if (spec.streams[r].size() != spec.programs[r].size())
        return invalidArgument("{}: rank {}: a schedule of {} steps for {}", o, r, spec.streams[r].size(),
                               spec.programs[r].size());
      for (size_t i = 0; i < spec.streams[r].size(); ++i)
        for (uint32_t w : spec.streams[r][i].waits)
          if (w >= i) return invalidArgument("{}: rank {} step {} waits for step {}, which is not before it", o, r, i, w);
    }
  }
  return {};
}

bool hasSchedule(const Algorithm& a) {
  const auto* f = dynamic_cast<const FileAlgorithm*>(&a);
  return f != nullptr && !f->spec().streams.empty();
}

std::string_view planProtoName(PlanProto p) {
  switch (p) {
    case PlanProto::LL: return "LL";
    case PlanProto::LL128: return "LL128";
    case PlanProto::Simple: return "Simple";
    case PlanProto::None: break;
  }
  return "";
}

// ---- FileAlgorithm -------------------------------------------------------------

FileAlgorithm::FileAlgorithm(PlanSpec spec) : spec_(std::move(spec)) {
  requirement_ = fmt::format("{} ranks, a count that is a positive multiple of {} (the plan's chunks){}{}, as plan "
                             "file '{}' declares", spec_.nranks, spec_.chunks,
                             facts(spec_.coll).rooted ? fmt::format(", root {}", spec_.root) : "",
                             spec_.inplace == PlanInPlace::No    ? ", out of place"
                             : spec_.inplace == PlanInPlace::Yes ? ", in place"
                                                                 : "",
                             spec_.origin);
}

bool FileAlgorithm::supports(const Shape& sh) const {
  if (sh.coll != spec_.coll || sh.nranks != spec_.nranks) return false;
  if (sh.count == 0 || sh.count % spec_.chunks != 0) return false;
  if (facts(spec_.coll).rooted && sh.root != spec_.root) return false;
  // The file's steps are plain data movement: no compressed, exact or
  // canonical form (those plans order their steps by rules of their own).
  if (sh.wire.has_value() || sh.exact_words != 0 || sh.canonical) return false;
  return sh.inplace ? spec_.inplace != PlanInPlace::No : spec_.inplace != PlanInPlace::Yes;
}

void FileAlgorithm::generate(const Shape& sh, int rank, ProgramBuilder& b) const {
  if (rank < 0 || static_cast<size_t>(rank) >= spec_.programs.size()) return;
  const uint64_t unit = sh.count / spec_.chunks;
  // Scratch through the builder, so a PreMulSum's scaled copy of the input
  // (allocated before) stays apart from the plan's own.
  const uint64_t scr_base = spec_.scratch != 0 ? b.scratch(spec_.scratch * unit).offset : 0;
  const auto region = [&](const ChunkRef& c, uint32_t n) {
    Region g{c.buf, uint64_t{c.chunk} * unit, uint64_t{n} * unit};
    if (c.buf == Buf::Scratch) g.offset += scr_base;
    return g;
  };
  for (const ChunkStep& s : spec_.programs[static_cast<size_t>(rank)]) {
    switch (s.op) {
      case StepOp::Send: b.send(s.peer, region(s.src, s.n)); break;
      case StepOp::Recv: b.recv(s.peer, region(s.dst, s.n)); break;
      case StepOp::RecvReduce: b.recvReduce(s.peer, region(s.dst, s.n), region(s.src, s.n)); break;
      case StepOp::Copy: b.copy(region(s.dst, s.n), region(s.src, s.n)); break;
      case StepOp::Reduce: b.reduce(region(s.dst, s.n), region(s.src, s.n), region(s.src2, s.n)); break;
      default: break;  // not in the format (checkPlanSpec refuses it)
    }
  }
}

// ---- Parse, dump, load ---------------------------------------------------------

Result<PlanSpec> parsePlanText(std::string_view text, std::string_view origin) {
  return TextParser(text, origin).run();
}

Result<std::string> dumpPlanText(const Algorithm& algo, int nranks, int chunks, const DumpOptions& opt) {
  const Collective c = algo.collective();
  const std::string where = fmt::format("dumpPlanText: {} '{}'", collectiveName(c), algo.name());
  if (!fileCollective(c)) return invalidArgument("{}: the collective has no plan-file form", where);
  if (nranks < kPlanMinRanks || nranks > kPlanMaxRanks)
    return invalidArgument("{}: {} ranks (a plan has {} to {})", where, nranks, kPlanMinRanks, kPlanMaxRanks);
  if (chunks < 1 || static_cast<uint32_t>(chunks) > kPlanMaxChunks)
    return invalidArgument("{}: {} chunks (a plan has 1 to {})", where, chunks, kPlanMaxChunks);
  if (algo.compressed() || algo.exact())
    return invalidArgument("{}: a compressed or exact plan's steps have no plan-file form", where);
  const std::string name = opt.name.empty() ? fmt::format("{}{}", algo.name(), nranks) : opt.name;
  if (!validName(name)) return invalidArgument("{}: '{}' is not a plan name", where, shown(name));
  Shape sh;
  sh.coll = c;
  sh.nranks = nranks;
  sh.count = static_cast<uint64_t>(chunks);  // one element per chunk: every region is whole chunks
  sh.root = facts(c).rooted ? opt.root : 0;
  if (!algo.supports(sh))
    return invalidArgument("{}: does not take {} ranks at count {} (it needs {})", where, nranks, chunks,
                           algo.requirement().empty() ? std::string_view("another shape") : algo.requirement());
  std::vector<Program> progs(static_cast<size_t>(nranks));
  uint64_t scratch = 0;
  for (int r = 0; r < nranks; ++r) {
    expand(algo, sh, r, &progs[r]);
    scratch = std::max(scratch, progs[r].scratch_elems);
  }
  if (scratch > kPlanMaxScratch) return invalidArgument("{}: {} scratch chunks (at most {})", where, scratch, kPlanMaxScratch);
  std::string out = fmt::format("# {} '{}' on {} ranks, the count in {} chunks (written by dumpPlanText)\n",
                                collectiveName(c), algo.name(), nranks, chunks);
  out += fmt::format("chorus-plan 1\nname {}\ncollective {}\nranks {}\nchunks {}\n", name, collectiveName(c), nranks,
                     chunks);
  if (scratch != 0) out += fmt::format("scratch {}\n", scratch);
  if (facts(c).rooted) out += fmt::format("root {}\n", sh.root);
  if (opt.inplace != PlanInPlace::No) out += fmt::format("inplace {}\n", inplaceName(opt.inplace));
  for (int r = 0; r < nranks; ++r) {
    out += fmt::format("\nrank {}\n", r);
    for (size_t i = 0; i < progs[r].steps.size(); ++i) {
      const Step& s = progs[r].steps[i];
      const Region* regs[3] = {};
      int nregs = 0;
      switch (s.op) {
        case StepOp::Send: regs[0] = &s.src, nregs = 1; break;
        case StepOp::Recv: regs[0] = &s.dst, nregs = 1; break;
        case StepOp::RecvReduce:
        case StepOp::Copy: regs[0] = &s.dst, regs[1] = &s.src, nregs = 2; break;
        case StepOp::Reduce: regs[0] = &s.dst, regs[1] = &s.src, regs[2] = &s.src2, nregs = 3; break;
        default:
          return invalidArgument("{}: rank {} step {} is a step the format lacks (op {})", where, r, i,
                                 static_cast<int>(s.op));
      }
      const uint64_t n = regs[0]->count;
      std::string line(opName(s.op));
      if (s.peer >= 0 && !isLocal(s.op)) line += fmt::format(" {}", s.peer);
      for (int g = 0; g < nregs; ++g) {
        const Region& reg = *regs[g];
        if (reg.buf != Buf::Input && reg.buf != Buf::Output && reg.buf != Buf::Scratch)
          return invalidArgument("{}: rank {} step {} uses a buffer the format lacks", where, r, i);
        if (reg.count != n)
          return invalidArgument("{}: rank {} step {} has regions of {} and {} chunks", where, r, i, n, reg.count);
        line += fmt::format(" {} {}", bufName(reg.buf), reg.offset);
      }
      if (n == 0) {
        if (isLocal(s.op)) continue;  // moves nothing
        return invalidArgument("{}: rank {} step {} is an empty message, which the format cannot say", where, r, i);
      }
      if (n != 1) line += fmt::format(" {}", n);
      out += line + "\n";
    }
  }
  return out;
}

std::span<const PlanReader> planReaders() { return kReaders; }

Result<std::unique_ptr<FileAlgorithm>> buildPlan(PlanSpec spec) {
  CHORUS_RETURN_IF_ERROR(checkPlanSpec(spec));
  auto algo = std::make_unique<FileAlgorithm>(std::move(spec));
  const PlanSpec& s = algo->spec();
  const bool reducing = reduces(s.coll);
  for (const uint64_t k : {1, 3})
    for (const bool inplace : {false, true}) {
      if (inplace ? s.inplace == PlanInPlace::No : s.inplace == PlanInPlace::Yes) continue;
      for (const Scaling sc : {Scaling::None, Scaling::PreMulSum, Scaling::Avg}) {
        // The op's steps wrap any plan alike (plan/scaling.cpp): proven once,
        // at the smallest count, for the plans that reduce.
        if (sc != Scaling::None && (!reducing || k != 1)) continue;
        VerifyCase vc;
        vc.shape.coll = s.coll;
        vc.shape.nranks = s.nranks;
        vc.shape.count = k * s.chunks;
        vc.shape.root = s.root;
        vc.shape.inplace = inplace;
        vc.shape.scaling = sc;
        if (Status st = verify(*algo, vc); !st.isOk())
          return invalidArgument("{}: plan '{}' fails its proof ({}): {}", s.origin, s.name, caseName(vc.shape),
                                 st.message());
        CHORUS_RETURN_IF_ERROR(checkExpanded(*algo, vc.shape));
      }
    }
  // The models price it from rounds derived from its programs.
  Shape sh;
  sh.coll = s.coll;
  sh.nranks = s.nranks;
  sh.count = s.chunks;
  sh.root = s.root;
  sh.inplace = s.inplace == PlanInPlace::Yes;
  if (auto rounds = algo->rounds(sh); !rounds.isOk())
    return invalidArgument("{}: plan '{}': {}", s.origin, s.name, rounds.status().message());
  return algo;
}

Result<PlanSpec> readPlanFile(const std::string& path) { return readSpec(path); }

Status loadPlans(Registry& reg, std::span<const std::string> paths) {
  namespace fs = std::filesystem;
  for (const std::string& path : paths) {
    if (path.empty()) return invalidArgument("plan path '': an empty path names no file or directory");
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) return invalidArgument("plan path '{}': no such file or directory", path);
    if (!fs::is_directory(st)) {
      CHORUS_RETURN_IF_ERROR(loadFile(reg, path));
      continue;
    }
    // A directory: its files of a known format, in sorted order (so the
    // registry's order, and the tuner's ties, do not follow the file system's).
    std::vector<fs::path> files;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      if (readerFor(it->path()) != nullptr && it->is_regular_file(ec2)) files.push_back(it->path());
    }
    if (ec) return systemError("plan directory '{}': {}", path, ec.message());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) CHORUS_RETURN_IF_ERROR(loadFile(reg, f));
  }
  return {};
}

namespace {
// Two spellings of one file's path name the same file.
bool samePath(std::string_view a, std::string_view b) {
  if (a == b) return true;
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(std::filesystem::path(a), ea);
  const auto cb = std::filesystem::weakly_canonical(std::filesystem::path(b), eb);
  return !ea && !eb && ca == cb;
}
}  // namespace

const FileAlgorithm* findPlanFile(const Registry& reg, Collective c, std::string_view path) {
  for (const Algorithm* a : reg.forCollective(c))
    if (const auto* f = dynamic_cast<const FileAlgorithm*>(a); f != nullptr && samePath(f->spec().origin, path)) return f;
  return nullptr;
}

Status loadAlgoFiles(Registry& reg, std::string_view algo_spec) {
  size_t pos = 0;
  while (pos < algo_spec.size()) {
    size_t end = algo_spec.find_first_of(";,", pos);
    if (end == std::string_view::npos) end = algo_spec.size();
    const std::string_view item = algo_spec.substr(pos, end - pos);
    pos = end + 1;
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos || item.substr(colon + 1).substr(0, kAlgoFilePrefix.size()) != kAlgoFilePrefix)
      continue;  // not a file item: the tuner's to parse
    const std::string_view cname = item.substr(0, colon);
    const std::string path(item.substr(colon + 1 + kAlgoFilePrefix.size()));
    Collective c;
    if (!parseCollective(cname, &c))
      return invalidArgument("CHORUS_ALGO names unknown collective '{}' ({})", cname, collectiveNamesText());
    if (path.empty())
      return invalidArgument("CHORUS_ALGO item '{}': 'file:' names no file (give {}:file:PATH)", item, cname);
    if (findPlanFile(reg, c, path) != nullptr) continue;  // loaded already (CHORUS_PLAN_PATH, an earlier item)
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      return invalidArgument("CHORUS_ALGO item '{}': '{}' is not a plan file", item, path);
    auto spec = readSpec(path);
    if (!spec.isOk()) return spec.status().withContext(fmt::format("CHORUS_ALGO item '{}': ", item));
    if (spec->coll != c)
      return invalidArgument("CHORUS_ALGO item '{}': '{}' is {} plan '{}', not {} plan", item, path,
                             collectiveName(spec->coll), spec->name, cname);
    if (const Algorithm* other = reg.find(c, spec->name)) {
      const auto* file = dynamic_cast<const FileAlgorithm*>(other);
      return invalidArgument("CHORUS_ALGO item '{}': {} plan '{}' is already registered ({})", item, cname, spec->name,
                             file ? fmt::format("loaded from '{}'", file->spec().origin)
                                  : std::string("a built-in algorithm"));
    }
    auto algo = buildPlan(std::move(*spec));
    if (!algo.isOk()) return algo.status().withContext(fmt::format("CHORUS_ALGO item '{}': ", item));
    reg.add(std::move(*algo));
  }
  return {};
}

Result<Registry> Registry::withPlans(std::span<const std::string> paths) {
  Registry r = builtin();
  CHORUS_RETURN_IF_ERROR(loadPlans(r, paths));
  return r;
}

}  // namespace chorus::plan
