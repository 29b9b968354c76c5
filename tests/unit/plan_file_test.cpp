// Plans from files (src/plan/plan_file.*, docs/plan-format.md): the text
// format's round trip against the built-in ring, the load-time proof
// accepting a right plan and refusing wrong ones with the verifier's
// counter-example, malformed files refused with their line, and a file plan
// run through the library, forced, against the reference.  The simulator's
// pricing of a file plan is in sim_plan_file_test.cpp (the simulator is not
// linked into the ThreadSanitizer tree's tests, which build this file).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "api/config.hpp"
#include "plan/plan_file.hpp"
#include "plan/verify.hpp"
#include "support/collective_check.hpp"
#include "support/rank_threads.hpp"

namespace chorus::plan {
namespace {

namespace fs = std::filesystem;

// A directory of its own, removed afterwards.
struct TempDir {
  fs::path path;
  explicit TempDir(std::string_view tag)
      : path(fs::temp_directory_path() / fmt::format("chorus-plan-file-{}-{}", tag, getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(std::string_view name, std::string_view text) const {
    const fs::path p = path / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};

const Algorithm& builtinRing() {
  static const Registry reg = Registry::builtin();
  return *reg.find(Collective::AllReduce, "ring");
}

std::string dumpRing(int n, std::string name, PlanInPlace inplace = PlanInPlace::Both) {
  auto text = dumpPlanText(builtinRing(), n, n, {.name = std::move(name), .inplace = inplace});
  EXPECT_TRUE(text.isOk()) << text.status().message();
  return text.isOk() ? *text : std::string();
}

bool sameRegion(const Region& a, const Region& b) {
  return a.buf == b.buf && a.offset == b.offset && a.count == b.count;
}

// Every rank's program of a and b for sh, step by step.
std::string compareExpansions(const Algorithm& a, const Algorithm& b, const Shape& sh) {
  for (int r = 0; r < sh.nranks; ++r) {
    Program pa, pb;
    expand(a, sh, r, &pa);
    expand(b, sh, r, &pb);
    if (pa.steps.size() != pb.steps.size())
      return fmt::format("rank {}: {} steps against {}", r, pa.steps.size(), pb.steps.size());
    for (size_t i = 0; i < pa.steps.size(); ++i) {
      const Step &x = pa.steps[i], &y = pb.steps[i];
      if (x.op != y.op || x.peer != y.peer || !sameRegion(x.dst, y.dst) || !sameRegion(x.src, y.src) ||
          !sameRegion(x.src2, y.src2))
        return fmt::format("rank {} step {} differs", r, i);
    }
    if (pa.scratch_elems != pb.scratch_elems) return fmt::format("rank {}: scratch differs", r);
  }
  return "";
}

// The text after its first line (dumpPlanText's comment names the source algorithm).
std::string body(const std::string& text) { return text.substr(text.find('\n') + 1); }

// ---- The format -------------------------------------------------------------

// The built-in ring allreduce for 2..8 ranks written as a plan file, read
// back and proven: its programs are the built-in's, step for step, at count C
// and 3C (the file's chunks scaled), in and out of place, and writing the
// file plan again gives the same text.
TEST(PlanFile, RingRoundTripsForTwoToEightRanks) {
  for (int n = 2; n <= 8; ++n) {
    SCOPED_TRACE(fmt::format("{} ranks", n));
    const std::string name = fmt::format("ring{}f", n);
    const std::string text = dumpRing(n, name);
    auto spec = parsePlanText(text, fmt::format("{}.plan", name));
    ASSERT_TRUE(spec.isOk()) << spec.status().message() << "\n" << text;
    EXPECT_EQ(spec->name, name);
    EXPECT_EQ(spec->nranks, n);
    EXPECT_EQ(spec->chunks, static_cast<uint32_t>(n));
    EXPECT_EQ(spec->inplace, PlanInPlace::Both);
    auto algo = buildPlan(*spec);
    ASSERT_TRUE(algo.isOk()) << algo.status().message();
    for (uint64_t k : {1, 3, 1000})
      for (bool inplace : {false, true}) {
        Shape sh;
        sh.nranks = n;
        sh.count = k * static_cast<uint64_t>(n);
        sh.inplace = inplace;
        EXPECT_TRUE((*algo)->supports(sh));
        EXPECT_EQ(compareExpansions(builtinRing(), **algo, sh), "") << "count " << sh.count << " inplace " << inplace;
      }
    auto again = dumpPlanText(**algo, n, n, {.name = name, .inplace = PlanInPlace::Both});
    ASSERT_TRUE(again.isOk()) << again.status().message();
    EXPECT_EQ(body(*again), body(text));
  }
  // What the file looks like: docs/plan-format.md shows this very text.
  const std::string two = dumpRing(2, "ring2f");
  std::ifstream doc(std::string(CHORUS_SOURCE_DIR) + "/docs/plan-format.md");
  const std::string doc_text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  EXPECT_NE(doc_text.find("```\n" + two + "```\n"), std::string::npos) << two;
  EXPECT_NE(two.find("chorus-plan 1\nname ring2f\ncollective allreduce\nranks 2\nchunks 2\ninplace both\n"),
            std::string::npos) << two;
  EXPECT_NE(two.find("rank 0\nsend 1 in 0\nrecvreduce 1 out 1 in 1\nsend 1 out 1\nrecv 1 out 0\n"), std::string::npos)
      << two;
}

// What supports() takes: the declared rank count, counts that are positive
// multiples of the chunks, the declared in-place forms and root; requirement()
// says so.
TEST(PlanFile, SupportsOnlyTheDeclaredShapes) {
  auto spec = parsePlanText(dumpRing(4, "ring4f", PlanInPlace::No), "ring4f.plan");
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  auto algo = buildPlan(*spec);
  ASSERT_TRUE(algo.isOk()) << algo.status().message();
  Shape sh;
  sh.nranks = 4;
  sh.count = 400;
  EXPECT_TRUE((*algo)->supports(sh));
  sh.count = 402;
  EXPECT_FALSE((*algo)->supports(sh));
  sh.count = 0;
  EXPECT_FALSE((*algo)->supports(sh));
  sh.count = 400;
  sh.nranks = 5;
  EXPECT_FALSE((*algo)->supports(sh));
  sh.nranks = 4;
  sh.inplace = true;
  EXPECT_FALSE((*algo)->supports(sh));  // declared out of place only
  sh.inplace = false;
  sh.canonical = true;
  EXPECT_FALSE((*algo)->supports(sh));
  sh.canonical = false;
  sh.wire = kernels::WireFormat{};
  EXPECT_FALSE((*algo)->supports(sh));
  const std::string req((*algo)->requirement());
  EXPECT_NE(req.find("4 ranks"), std::string::npos) << req;
  EXPECT_NE(req.find("multiple of 4"), std::string::npos) << req;
  EXPECT_NE(req.find("ring4f.plan"), std::string::npos) << req;
}

// A plan of a rooted collective: the built-in binomial broadcast from root 2
// written and proven; the file takes that root only.
TEST(PlanFile, RootedPlanKeepsItsRoot) {
  const Registry reg = Registry::builtin();
  const Algorithm* bino = reg.find(Collective::Broadcast, "binomial");
  ASSERT_NE(bino, nullptr);
  auto text = dumpPlanText(*bino, 5, 3, {.name = "bino5", .root = 2, .inplace = PlanInPlace::Both});
  ASSERT_TRUE(text.isOk()) << text.status().message();
  EXPECT_NE(text->find("root 2\n"), std::string::npos) << *text;
  auto spec = parsePlanText(*text, "bino5.plan");
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  auto algo = buildPlan(*spec);
  ASSERT_TRUE(algo.isOk()) << algo.status().message();
  Shape sh;
  sh.coll = Collective::Broadcast;
  sh.nranks = 5;
  sh.count = 9;
  sh.root = 2;
  EXPECT_TRUE((*algo)->supports(sh));
  sh.root = 0;
  EXPECT_FALSE((*algo)->supports(sh));
}

// ---- Loading: the proof -------------------------------------------------------

// A ring written to a file, loaded from its directory (the other files there
// skipped), proven and registered beside the built-ins.
TEST(PlanFile, LoadedRingIsVerifiedAndRegistered) {
  TempDir dir("load");
  dir.write("ring4f.plan", dumpRing(4, "ring4f"));
  dir.write("README.txt", "not a plan");
  const std::vector<std::string> paths{dir.path.string()};
  auto reg = Registry::withPlans(paths);
  ASSERT_TRUE(reg.isOk()) << reg.status().message();
  const Algorithm* a = reg->find(Collective::AllReduce, "ring4f");
  ASSERT_NE(a, nullptr);
  EXPECT_NE(reg->find(Collective::AllReduce, "ring"), nullptr);  // the built-ins stay
  EXPECT_EQ(reg->all().size(), Registry::builtin().all().size() + 1);
  // Proven beyond what load checks: a larger count, in place.
  VerifyCase vc;
  vc.shape.nranks = 4;
  vc.shape.count = 4 * 37;
  vc.shape.inplace = true;
  EXPECT_TRUE(verify(*a, vc).isOk());
  // The derived rounds the models price: the ring's two shifts of n - 1 rounds.
  auto rounds = a->rounds(vc.shape);
  ASSERT_TRUE(rounds.isOk()) << rounds.status().message();
  ASSERT_EQ(rounds->size(), 2u);
  EXPECT_EQ((*rounds)[0].repeat, 3u);
  EXPECT_TRUE((*rounds)[0].reduce);
  EXPECT_EQ((*rounds)[1].repeat, 3u);
}

// The files the loader refuses, each naming the path.
TEST(PlanFile, LoaderErrorsNameThePath) {
  TempDir dir("errors");
  auto load = [](std::vector<std::string> paths) -> std::string {
    auto reg = Registry::withPlans(paths);
    return reg.isOk() ? "" : reg.status().message();
  };
  const std::string missing = (dir.path / "nope.plan").string();
  EXPECT_NE(load({missing}).find(missing), std::string::npos);
  EXPECT_NE(load({missing}).find("no such file"), std::string::npos);
  const std::string txt = dir.write("ring.txt", dumpRing(2, "ring2f"));
  EXPECT_NE(load({txt}).find("unknown extension '.txt'"), std::string::npos) << load({txt});
  const std::string a = dir.write("a.plan", dumpRing(3, "same")), b = dir.write("b.plan", dumpRing(3, "same"));
  const std::string dup = load({a, b});
  EXPECT_NE(dup.find(b), std::string::npos) << dup;
  EXPECT_NE(dup.find("already registered"), std::string::npos) << dup;
  EXPECT_NE(dup.find(a), std::string::npos) << dup;
  // Either file alone loads.
  EXPECT_EQ(load({a}), "");
  const std::string bad = dir.write("bad.plan", "chorus-plan 1\nname x\ncollective allreduce\nranks 2\nchunks 1\n");
  const std::string m = load({bad});
  EXPECT_NE(m.find(bad + ":5: end of file"), std::string::npos) << m;
}

// A 2-rank allreduce of one chunk, correct: each rank sends its input and
// reduces what it receives with it.  The wrong plans below change one line.
constexpr std::string_view kPair = R"(chorus-plan 1
name pair
collective allreduce
ranks 2
chunks 1
scratch 1
rank 0
send 1 in 0
recvreduce 1 out 0 in 0
rank 1
send 0 in 0
recvreduce 0 out 0 in 0
)";

std::string proofOf(std::string_view text) {
  auto spec = parsePlanText(text, "pair.plan");
  if (!spec.isOk()) return "parse: " + spec.status().message();
  auto algo = buildPlan(*spec);
  return algo.isOk() ? "" : algo.status().message();
}

std::string replaced(std::string_view text, std::string_view from, std::string_view to) {
  std::string s(text);
  const size_t at = s.rfind(from);  // rank 1's line
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

TEST(PlanFile, WrongPlansAreRefusedWithTheCounterExample) {
  EXPECT_EQ(proofOf(kPair), "");
  // Rank 1 reduces its own input a second time into the result: double counted.
  const std::string twice = proofOf(replaced(kPair, "recvreduce 0 out 0 in 0\n",
                                             "recvreduce 0 scr 0 in 0\nreduce out 0 scr 0 in 0\n"));
  EXPECT_NE(twice.find("pair.plan: plan 'pair' fails its proof (count 1, out of place)"), std::string::npos) << twice;
  EXPECT_NE(twice.find("rank 1: output element 0 holds a poisoned value"), std::string::npos) << twice;
  // Rank 0 never sends: rank 1 waits for ever.
  const std::string deadlock = proofOf(replaced(kPair, "send 1 in 0\n", ""));
  EXPECT_NE(deadlock.find("rank 1: deadlock: step 1"), std::string::npos) << deadlock;
  // Rank 1 receives without reducing: its output lacks its own contribution.
  const std::string partial = proofOf(replaced(kPair, "recvreduce 0 out 0 in 0", "recv 0 out 0"));
  EXPECT_NE(partial.find("rank 1: output element 0 holds ranks {0} element 0 but should hold ranks {0,1} element 0"),
            std::string::npos) << partial;
  // Right out of place, wrong in place: the plan declares both forms, and in
  // place rank 1's input is its output, which it overwrote before sending it.
  const std::string order = proofOf(replaced(replaced(kPair, "chunks 1\n", "chunks 1\ninplace both\n"),
                                             "send 0 in 0\nrecvreduce 0 out 0 in 0\n",
                                             "recv 0 scr 0\nreduce out 0 scr 0 in 0\nsend 0 in 0\n"));
  EXPECT_NE(order.find("in place"), std::string::npos) << order;
  EXPECT_NE(order.find("rank 0: output element 0 holds a poisoned value"), std::string::npos) << order;
}

// ---- Malformed files ----------------------------------------------------------

constexpr std::string_view kHeader = "chorus-plan 1\nname x\ncollective allreduce\nranks 4\nchunks 4\n";

std::string parseError(std::string_view text) {
  auto spec = parsePlanText(text, "x.plan");
  return spec.isOk() ? "" : spec.status().message();
}

TEST(PlanFile, MalformedInputsNameTheLineAndToken) {
  struct Bad {
    std::string text;
    std::string want;
  };
  const std::string h(kHeader);
  const Bad cases[] = {
      {"", "x.plan:1: end of file: no 'chorus-plan 1' line"},
      {"# only a comment\n\n", "x.plan:2: end of file: no 'chorus-plan 1' line"},
      {"chorus-plan 2\n", "x.plan:1: 'chorus-plan': version '2' is not one this build reads"},
      {"name x\n", "x.plan:1: 'name': a plan file begins with 'chorus-plan 1'"},
      {h, "x.plan:5: end of file: no 'rank' section"},
      {"chorus-plan 1\nname x\ncollective allreduce\nranks 4\nrank 0\n", "x.plan:5: 'rank': the header lacks 'chunks'"},
      {h + "rank 0\nsnd 1 in 0\n", "x.plan:7: 'snd': is neither a header key nor a step"},
      {h + "rank 0\nsend 7 in 0\n", "x.plan:7: 'send': peer 7 is not a rank of a 4-rank plan"},
      {h + "rank 0\nsend 0 in 0\n", "x.plan:7: 'send': peer 0 is this rank"},
      {h + "rank 0\nsend 1 in 4\n", "x.plan:7: 'send': source chunks 4..4 of 'in' are past its end (rank 0 has 4 chunks of it)"},
      {h + "rank 0\nsend 1 in 2 3\n", "x.plan:7: 'send': source chunks 2..4 of 'in' are past its end"},
      {h + "rank 0\nsend 1 in 0 0\n", "x.plan:7: 'send': n (the chunks of the step) 0 is out of range"},
      {h + "rank 0\nsend 1 xyz 0\n", "x.plan:7: 'send': 'xyz' is not a buffer (in, out, scr)"},
      {h + "rank 0\nsend 1 scr 0\n", "x.plan:7: 'send': source 'scr': rank 0 has no such buffer in this allreduce (the plan declares no scratch)"},
      {h + "rank 0\nsend 1 in -1\n", "x.plan:7: 'send': chunk '-1' is not a decimal number"},
      {h + "rank 0\nsend 1 in 18446744073709551616\n", "x.plan:7: 'send': chunk 18446744073709551616 is out of range"},
      {h + "rank 0\nsend 99999999999999999999999 in 0\n", "x.plan:7: 'send': peer 99999999999999999999999 is out of range"},
      {h + "rank 0\nsend 1 in\n", "x.plan:7: 'send': takes 3 or 4 values (send <peer> <buf> <chunk> [<n>]), got 2"},
      {h + "rank 0\nrecv 1 in 0\n", "x.plan:7: 'recv': the destination is 'in': the call's input is read-only"},
      {h + "rank 0\nreduce out 0 out 1 in 0 2\n", "x.plan:7: 'reduce': the destination (chunk 0) partly overlaps an operand (chunk 1)"},
      {h + "send 1 in 0\n", "x.plan:6: 'send': a step before the first 'rank' section"},
      {h + "rank 0\nrank 0\n", "x.plan:7: 'rank': rank 0 has a section already (line 6)"},
      {h + "rank 4\n", "x.plan:6: 'rank': 4 is not a rank of a 4-rank plan"},
      {h + "rank 0\nrank 1\nrank 2\n", "x.plan:8: end of file: rank 3 has no section"},
      {h + "rank 0\nchunks 2\n", "x.plan:7: 'chunks': a header line after the first 'rank' section"},
      {h + "chunks 2\n", "x.plan:6: 'chunks': given twice (first on line 5)"},
      {"chorus-plan 1\nranks 99999999999999999999\n", "x.plan:2: 'ranks': the rank count 99999999999999999999 is out of range (2 to 64)"},
      {"chorus-plan 1\nranks 1\n", "x.plan:2: 'ranks': the rank count 1 is out of range (2 to 64)"},
      {"chorus-plan 1\nchunks 4097\n", "x.plan:2: 'chunks': the chunk count 4097 is out of range (1 to 4096)"},
      {"chorus-plan 1\nname Ring!\n", "x.plan:2: 'name': 'Ring!' is not a plan name"},
      {"chorus-plan 1\ncollective allgatherv\n", "x.plan:2: 'collective': allgatherv has no plan-file form yet"},
      {"chorus-plan 1\ncollective barrier\n", "x.plan:2: 'collective': barrier has no plan-file form yet"},
      {"chorus-plan 1\ncollective sum\n", "x.plan:2: 'collective': 'sum' is not a collective"},
      {"chorus-plan 1\ninplace maybe\n", "x.plan:2: 'inplace': 'maybe' is not one of yes, no, both"},
      {"chorus-plan 1\nname ring\ncollective allreduce\nranks 2\nchunks 1\nrank 0\n",
       "x.plan:2: 'name': 'ring' is the name of a built-in allreduce algorithm"},
      {"chorus-plan 1\nname x\nroot 1\ncollective allreduce\nranks 2\nchunks 1\nrank 0\n", "x.plan:3: 'root': allreduce has no root"},
      {"chorus-plan 1\nname x\nroot 5\ncollective broadcast\nranks 2\nchunks 1\nrank 0\n",
       "x.plan:3: 'root': root 5 is not a rank of a 2-rank plan"},
      {"chorus-plan 1\nname x\ncollective allgather\nranks 64\nchunks 4096\nrank 0\n", "x.plan:6: 'rank': the ranks' buffers hold"},
      {h + "rank 0\nsend 1 in 0 1 1 1 1 1 1\n", "x.plan:7: 'send': too many values on one line"},
      {h + "rank 0\n" + std::string(5000, ' ') + "\n", "x.plan:7: the line is 5000 bytes long (at most 4096)"},
      {std::string("chorus-plan 1\nna\0me x\n", 22), "x.plan:2: 'na\\x00me': is neither a header key nor a step"},
      {"\xff\xfe\n", "x.plan:1: '\\xff\\xfe': a plan file begins with 'chorus-plan 1'"},
  };
  for (const Bad& b : cases) {
    const std::string m = parseError(b.text);
    EXPECT_NE(m.find(b.want), std::string::npos) << "input:\n" << b.text << "\ngot: " << m << "\nwant: " << b.want;
  }
  // Every truncation of a good file is refused (never a crash), with a line.
  const std::string good = dumpRing(3, "ring3f");
  ASSERT_EQ(parseError(good), "");
  for (size_t cut = 0; cut < good.size(); cut += 7) {
    const std::string m = parseError(good.substr(0, cut));
    if (m.empty()) continue;  // a cut that ends at a complete, possibly incomplete-plan-but-parsable prefix
    EXPECT_EQ(m.rfind("x.plan:", 0), 0u) << m;
  }
  // A file cut after its last rank's header line parses, but does not prove.
  const std::string cut = good.substr(0, good.rfind("rank 2\n") + 7);
  ASSERT_EQ(parseError(cut), "");
  EXPECT_NE(proofOf(cut).find("fails its proof"), std::string::npos);
}

// checkPlanSpec holds a spec from any reader to the same rules, naming the
// rank and the step.
TEST(PlanFile, CheckPlanSpecRefusesWhatTheParserWould) {
  auto spec = parsePlanText(kPair, "pair.plan");
  ASSERT_TRUE(spec.isOk()) << spec.status().message();
  EXPECT_TRUE(checkPlanSpec(*spec).isOk());
  PlanSpec bad = *spec;
  bad.programs[1][0].peer = 2;
  EXPECT_NE(checkPlanSpec(bad).message().find("pair.plan: rank 1 step 0 (send): peer 2 is not a rank of a 2-rank plan"),
            std::string::npos) << checkPlanSpec(bad).message();
  bad = *spec;
  bad.programs[0][1].dst = {Buf::Input, 0};
  EXPECT_NE(checkPlanSpec(bad).message().find("read-only"), std::string::npos);
  bad = *spec;
  bad.programs.pop_back();
  EXPECT_NE(checkPlanSpec(bad).message().find("1 programs for 2 ranks"), std::string::npos);
  bad = *spec;
  bad.programs[0][0].op = StepOp::Quantize;
  EXPECT_NE(checkPlanSpec(bad).message().find("not a step of the format"), std::string::npos);
}

// The reader table: chorus's own format under .plan.
TEST(PlanFile, ReaderTableHasTheChorusFormat) {
  ASSERT_FALSE(planReaders().empty());
  EXPECT_EQ(planReaders()[0].name, "chorus");
  EXPECT_EQ(planReaders()[0].extension, ".plan");
  auto spec = planReaders()[0].parse(kPair, "pair.plan");
  EXPECT_TRUE(spec.isOk());
}

// ---- Through the library --------------------------------------------------------

// CHORUS_PLAN_PATH: colon-separated, empty entries skipped.
TEST(PlanFile, PlanPathKnob) {
  auto c = api::parseConfig([](std::string_view name) -> std::optional<std::string> {
    if (name == "CHORUS_PLAN_PATH") return std::string("/a/b.plan::/c:");
    return std::nullopt;
  });
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->tune.plan_paths, (std::vector<std::string>{"/a/b.plan", "/c"}));
  auto d = api::parseConfig([](std::string_view) -> std::optional<std::string> { return std::nullopt; });
  ASSERT_TRUE(d.isOk());
  EXPECT_TRUE(d->tune.plan_paths.empty());
}

// Runs every case of `coll` from the standard matrix (every dtype and op at
// the small counts, float32 sum at the large ones) on n ranks configured by
// cfg, rooted ones at root 0 (what chorusCommPredict asks about); each rank
// first checks that the tuner runs `algo` for a large count.
std::string runForced(int n, const Config& cfg, testing::Coll coll, const char* coll_name, const std::string& algo,
                      const std::vector<size_t>& counts) {
  std::vector<testing::Case> cases;
  for (testing::Case k : testing::standardCases(n, counts, /*all_dtypes=*/true))
    if (k.coll == coll && (k.count < 1000 || (k.dtype == chorusFloat32 && k.op == chorusSum))) {
      k.root = 0;
      cases.push_back(k);
    }
  if (cases.size() < 10) return "too few cases";
  auto msgs = testing::runRanks(n, cfg, [&](int r, chorusComm_t comm) -> std::string {
    for (int inplace : {0, 1}) {
      char ran[64] = {};
      double us = 0;
      if (chorusCommPredict(comm, coll_name, counts.back(), chorusFloat32, inplace, ran, sizeof ran, &us) !=
          chorusSuccess)
        return chorusGetLastError(comm);
      if (std::string(ran) != algo) return fmt::format("rank {}: forced {} but the tuner runs {}", r, algo, ran);
    }
    for (const testing::Case& k : cases)
      if (std::string e = testing::runCase(comm, k); !e.empty()) return fmt::format("rank {}: {}: {}", r, k.name(), e);
    return "";
  });
  return testing::failures(msgs);
}

// A ring plan file run on 2, 4 and 8 ranks, forced (CHORUS_ALGO's
// allreduce:NAME), every dtype and op at counts that are multiples of its
// chunks, in and out of place, against the reference.
TEST(PlanFile, FilePlanRunsThroughTheLibrary) {
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(fmt::format("{} ranks", n));
    TempDir dir(fmt::format("run{}", n));
    const std::string name = fmt::format("ring{}f", n);
    dir.write(name + ".plan", dumpRing(n, name));
    Config cfg;
    cfg.tune.plan_paths = {dir.path.string()};
    cfg.tune.algo_spec = "allreduce:" + name;
    const size_t c = static_cast<size_t>(n);
    EXPECT_EQ(runForced(n, cfg, testing::Coll::AllReduce, "allreduce", name, {c, 3 * c, 4099 * c}), "");
  }
}

// The other steps and buffers through the executor: a hand-written 2-rank
// allreduce through scratch (a plain receive, then a local reduce; under
// PreMulSum its scratch follows the scaled copy of the input), and the
// built-in binomial broadcast (a copy, sends of n chunks) as a file, both in
// one directory.
TEST(PlanFile, HandWrittenAndRootedPlansRunThroughTheLibrary) {
  TempDir dir("hand");
  dir.write("viascratch.plan", R"(# each rank adds the other's input, received into scratch, to its own
chorus-plan 1
name viascratch
collective allreduce
ranks 2
chunks 1
scratch 1
inplace both
rank 0
send 1 in 0
recv 1 scr 0
reduce out 0 in 0 scr 0
rank 1
send 0 in 0
recv 0 scr 0
reduce out 0 in 0 scr 0
)");
  Config cfg;
  cfg.tune.plan_paths = {dir.path.string()};
  cfg.tune.algo_spec = "allreduce:viascratch";
  EXPECT_EQ(runForced(2, cfg, testing::Coll::AllReduce, "allreduce", "viascratch", {1, 5, 100003}), "");

  const Registry reg = Registry::builtin();
  auto bino = dumpPlanText(*reg.find(Collective::Broadcast, "binomial"), 4, 2,
                           {.name = "bino4f", .root = 0, .inplace = PlanInPlace::Both});
  ASSERT_TRUE(bino.isOk()) << bino.status().message();
  dir.write("bino4f.plan", *bino);
  cfg.tune.algo_spec = "broadcast:bino4f";
  EXPECT_EQ(runForced(4, cfg, testing::Coll::Broadcast, "broadcast", "bino4f", {2, 6, 100002}), "");
}

// A plan file that fails its proof fails the communicator's setup, on every
// rank, with the verifier's message.
TEST(PlanFile, CommunicatorRefusesAWrongPlan) {
  TempDir dir("comm");
  dir.write("pair.plan", replaced(kPair, "send 1 in 0\n", ""));
  Config cfg;
  cfg.tune.plan_paths = {dir.path.string()};
  cfg.timeout = std::chrono::milliseconds(20000);
  auto msgs = testing::runRanks(2, cfg, [](int, chorusComm_t) { return std::string(); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(msgs[r].find("init"), std::string::npos) << msgs[r];
    EXPECT_NE(msgs[r].find("deadlock"), std::string::npos) << msgs[r];
  }
}

}  // namespace
}  // namespace chorus::plan
