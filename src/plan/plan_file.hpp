// Plans from outside the binary: chorus's own text format for plans
// (docs/plan-format.md), the readers of plan formats, and the loader that
// adds the plans of files and directories to a Registry -- each one proven
// by the verifier before it can run.
//
// A plan file is one program per rank over *chunks*: the call's `count` cut
// into C equal parts, so one file serves every count that is a multiple of C
// (a chunk is count / C elements).  This is the granularity at which an
// algorithm written outside the binary (by hand, by a synthesizer, or
// translated from another library's format) can be checked and run without
// generating code: FileAlgorithm replays the steps scaled to the call.
//
// Files are untrusted input: the parser bounds every number, line and list,
// never crashes, and names the file, the line and the token at fault.  What
// it accepts still proves nothing about the collective's result; the loader
// runs plan::verify on the shapes the file claims and refuses the plan with
// the verifier's counter-example.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {

// Bounds of the format (each also in docs/plan-format.md).
inline constexpr int kPlanMinRanks = 2;
inline constexpr int kPlanMaxRanks = 64;         // the verifier's limit
inline constexpr uint32_t kPlanMaxChunks = 4096;  // C
inline constexpr uint32_t kPlanMaxScratch = kPlanMaxChunks * kPlanMaxRanks;  // S, in chunks
inline constexpr size_t kPlanMaxSteps = size_t{1} << 20;  // all ranks together (so also per rank)
inline constexpr size_t kPlanMaxLine = 4096;               // bytes per line
inline constexpr size_t kPlanMaxFileBytes = size_t{64} << 20;
inline constexpr size_t kPlanMaxName = 48;

// Which forms of the call a plan claims (`inplace` line).
enum class PlanInPlace : uint8_t { No, Yes, Both };

// A run of chunks of one buffer (in, out or scr); the step's n gives the length.
struct ChunkRef {
  Buf buf = Buf::Input;
  uint32_t chunk = 0;
};

// One step of a plan over chunks: ProgramBuilder's send, recv, recvReduce,
// copy or reduce, every region n chunks long.  Unused refs are ignored.
struct ChunkStep {
  StepOp op = StepOp::Copy;
  int32_t peer = -1;  // Send, Recv, RecvReduce
  ChunkRef dst, src, src2;  // as Step: dst written; src (and src2) read
  uint32_t n = 1;
};

// How the runtime a plan came from schedules its steps, where the format
// says (MSCCL's thread blocks, channels and protocol; chorus's text format
// says nothing): what the simulator prices (sim/program_flow.cpp).  It
// changes nothing the verifier proves or the executor runs.
enum class PlanProto : uint8_t { None, LL, LL128, Simple };
std::string_view planProtoName(PlanProto p);  // "", "LL", "LL128", "Simple"
struct StepStream {
  int32_t tb = -1;   // the rank's sequential stream (MSCCL thread block) the step runs in; -1: none
  int32_t chan = 0;  // the channel its message travels on (a send or receive): one FIFO per (pair, channel)
  // Earlier steps of the rank it waits for besides its stream's order and its
  // message (MSCCL's depid/deps, through the nops that carried them).
  std::vector<uint32_t> waits;
};

// A plan as every reader produces it, whatever its file format: what the
// file declares and each rank's steps.  The loader checks it (checkPlanSpec),
// makes the FileAlgorithm and proves it.
struct PlanSpec {
  std::string origin;  // where it came from, for messages: the file's path
  std::string name;
  Collective coll = Collective::AllReduce;
  int nranks = 0;
  uint32_t chunks = 1;   // C: the call's count is C chunks
  uint32_t scratch = 0;  // scratch chunks
  int root = 0;          // rooted collectives
  PlanInPlace inplace = PlanInPlace::No;
  std::vector<std::vector<ChunkStep>> programs;  // programs[r]: rank r's steps, in program order
  // The schedule, where the format has one: streams[r][i] for programs[r][i]
  // (empty: none; checkPlanSpec checks the shape and that waits point back).
  std::vector<std::vector<StepStream>> streams;
  PlanProto proto = PlanProto::None;
};

// Chunks of buffer `buf` on `rank` for a plan of this collective, rank count
// and chunk count (0 where the rank has no such buffer: a broadcast's
// non-root input, a reduce's non-root output).
uint64_t planChunksOf(const PlanSpec& spec, Buf buf, int rank);

// Every structural rule of the format on a spec, however it was read (ranks,
// chunk ranges, peers, read-only input, partial overlaps); messages name the
// origin, the rank and the step.  The text parser checks the same rules line
// by line, with line numbers; a reader of another format relies on this one.
Status checkPlanSpec(const PlanSpec& spec);
// checkPlanSpec's rules for one step of `rank` ("" when it keeps them, else
// what is wrong), for readers that name the line of the step themselves.
std::string planStepError(const PlanSpec& spec, int rank, const ChunkStep& s);

// The algorithm of a plan read from a file.  supports() takes exactly the
// shapes the file declares: its rank count, a count that is a positive
// multiple of its chunks, its root, the in-place forms it claims; no wire
// format, exact words or canonical order.  generate() replays the steps with
// every chunk count / C elements long.
class FileAlgorithm final : public Algorithm {
 public:
  explicit FileAlgorithm(PlanSpec spec);
  [[nodiscard]] std::string_view name() const override { return spec_.name; }
  [[nodiscard]] Collective collective() const override { return spec_.coll; }
  [[nodiscard]] bool supports(const Shape& shape) const override;
  [[nodiscard]] std::string_view requirement() const override { return requirement_; }
  void generate(const Shape& shape, int rank, ProgramBuilder& b) const override;
  [[nodiscard]] const PlanSpec& spec() const { return spec_; }

 private:
  PlanSpec spec_;
  std::string requirement_;
};

// Whether `a` is a plan file's algorithm that carries its runtime's schedule
// (PlanSpec::streams): the simulator runs such a plan's programs.
bool hasSchedule(const Algorithm& a);

// Parses chorus's plan text (docs/plan-format.md).  `origin` names the text in
// messages ("ring4.plan:12: 'send': peer 7 is not a rank of a 4-rank plan").
Result<PlanSpec> parsePlanText(std::string_view text, std::string_view origin);

// Reads MSCCL's XML algorithm format (the programs msccl-tools writes and RCCL
// ships in tools/msccl-algorithms/): <algo> holding a <gpu> per rank, holding
// <tb> thread blocks, holding <step>s; see src/plan/msccl_file.cpp and
// docs/msccl.md for what is read, how thread blocks become one program per
// rank, and what is refused.  Errors name the origin, the line, the element
// and the attribute.  The plan's name is the file's stem.
Result<PlanSpec> parseMscclXml(std::string_view text, std::string_view origin);

// Reads MSCCL++'s JSON execution plans (the files its executor loads and
// chorus-plan export --format mscclpp-json writes): gpus holding thread
// blocks holding operations; puts, signals and waits become chorus's sends
// and receives (src/plan/mscclpp_file.cpp and docs/msccl.md say how, and
// what is refused).  Errors name the origin and the key path
// ("a.json: gpus[1].threadblocks[0].ops[3].name: ...").  The plan's name is
// the file's "name".
Result<PlanSpec> parseMscclppJson(std::string_view text, std::string_view origin);

// Writes `algo` in chorus's plan text: its programs for `nranks` ranks
// expanded at count = chunks, so every region is whole chunks of one element
// (an error when a step is not one the format has, or a buffer is not in, out
// or scratch).  The file claims the in-place forms and root given; load proves
// them.  Tests write ring plans with it, and its output documents the format.
struct DumpOptions {
  std::string name;  // "" = the algorithm's name and the rank count ("ring4")
  int root = 0;
  PlanInPlace inplace = PlanInPlace::No;
};
Result<std::string> dumpPlanText(const Algorithm& algo, int nranks, int chunks, const DumpOptions& opt = {});

// The plan formats the loader reads, chosen by file extension.  A reader
// translates its format into a PlanSpec; checking, proving and registering
// are the loader's, the same for every format.  A new format is a parse
// function and one line in the table (plan_file.cpp, docs/plan-format.md).
struct PlanReader {
  std::string_view name;       // "chorus"
  std::string_view extension;  // ".plan"
  Result<PlanSpec> (*parse)(std::string_view text, std::string_view origin);
};
std::span<const PlanReader> planReaders();

// Checks, builds and proves one plan: checkPlanSpec, then plan::verify for
// every shape the plan claims (count C and 3C; out of place and/or in place as
// declared; its root; reducing collectives also under PreMulSum and Avg).  A
// refusal carries the verifier's counter-example, prefixed with the origin.
Result<std::unique_ptr<FileAlgorithm>> buildPlan(PlanSpec spec);

// Reads one plan file with the reader of its extension (not yet checked or
// proven: buildPlan does both).  chorus-plan import uses it.
Result<PlanSpec> readPlanFile(const std::string& path);

// Adds the plans of `paths` to reg: a file is read by the reader of its
// extension; a directory contributes its files with a known extension, in
// sorted order (others are skipped).  A missing path, a file of unknown
// extension, a name a registered algorithm of the same collective already has
// and a plan that fails its proof are errors naming the path.
Status loadPlans(Registry& reg, std::span<const std::string> paths);

// CHORUS_ALGO's items that name a plan file instead of a plan
// (`allreduce:file:PATH`; PATH runs to the next ';' or ','): loads each file
// that reg does not hold yet (read, checked and proven as loadPlans does)
// and refuses a file whose plan is not of the item's collective, naming both.
// Other items are left to the tuner, which then finds the file's plan with
// findPlanFile and refuses calls the plan does not take (its requirement).
Status loadAlgoFiles(Registry& reg, std::string_view algo_spec);
// The plan of collective c that reg loaded from the file `path` (the same
// file however the path is spelled), or nullptr.
const FileAlgorithm* findPlanFile(const Registry& reg, Collective c, std::string_view path);
inline constexpr std::string_view kAlgoFilePrefix = "file:";

}  // namespace chorus::plan
