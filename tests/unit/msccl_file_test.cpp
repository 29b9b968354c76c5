// MSCCL's algorithm files from RCCL (tests/data/msccl/, README there names
// each file's commit): every one read and proven by the verifier; real files
// broken in small ways refused with their counter-example; imported plans run
// on chorus ranks (threads) over shm and tcp, forced, against the reference;
// and chorus's own algorithms of every family exported as MSCCL XML, read
// back, proven and run (docs/msccl.md).  Malformed inputs and small
// hand-written programs are in msccl_xml_test.cpp.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "api/config.hpp"
#include "plan/plan_export.hpp"
#include "plan/plan_file.hpp"
#include "support/collective_check.hpp"
#include "support/rank_threads.hpp"

namespace chorus::plan {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(CHORUS_SOURCE_DIR) / "tests/data/msccl";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct TempDir {
  fs::path path;
  explicit TempDir(std::string_view tag)
      : path(fs::temp_directory_path() / fmt::format("chorus-msccl-{}-{}", tag, getpid())) {
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

// What the file's name says: "...-8n-..." is 8 GPUs, "all-reduce-ring" 16.
int ranksFromName(const std::string& stem) {
  for (int n : {4, 8, 16})
    if (stem.find(fmt::format("-{}n-", n)) != std::string::npos) return n;
  return stem.rfind("all-reduce-ring", 0) == 0 ? 16 : 0;
}
Collective collFromName(const std::string& stem) {
  if (stem.rfind("allgather", 0) == 0) return Collective::AllGather;
  if (stem.rfind("alltoall", 0) == 0) return Collective::AllToAll;
  return Collective::AllReduce;
}

TEST(MscclFile, EveryRcclFileIsReadAndProven) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kData))
    if (e.path().extension() == ".xml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 20u);
  for (const fs::path& f : files) {
    SCOPED_TRACE(f.filename().string());
    auto spec = readPlanFile(f.string());
    ASSERT_TRUE(spec.isOk()) << spec.status().message();
    const std::string stem = f.stem().string();
    EXPECT_EQ(spec->name, stem);
    EXPECT_EQ(spec->nranks, ranksFromName(stem));
    EXPECT_EQ(spec->coll, collFromName(stem));
    auto algo = buildPlan(std::move(*spec));
    EXPECT_TRUE(algo.isOk()) << algo.status().message();
  }
  // A directory of them loads as plans beside the built-ins (README.md and
  // LICENSE.txt are skipped): one registry, the names of the files.
  const std::vector<std::string> dir{(kData / "alltoall-8n-0-9kb.xml").string(),
                                     (kData / "allgather-8n-0-8kb.xml").string()};
  auto reg = Registry::withPlans(dir);
  ASSERT_TRUE(reg.isOk()) << reg.status().message();
  EXPECT_NE(reg->find(Collective::AllToAll, "alltoall-8n-0-9kb"), nullptr);
  EXPECT_NE(reg->find(Collective::AllGather, "allgather-8n-0-8kb"), nullptr);
}

std::string replaced(std::string text, std::string_view from, std::string_view to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

std::string importAndProve(const std::string& text, const std::string& origin) {
  auto spec = parseMscclXml(text, origin);
  if (!spec.isOk()) return spec.status().message();
  auto algo = buildPlan(std::move(*spec));
  return algo.isOk() ? "" : algo.status().message();
}

// RCCL's files, each broken in one place: the verifier's counter-example (a
// wrong chunk, a missing contribution), a race and a deadlock.
TEST(MscclFile, BrokenRcclFilesAreRefusedWithTheirCounterExample) {
  const std::string a2a = slurp(kData / "alltoall-8n-0-9kb.xml");
  // GPU 0 copies its input's chunk 3 where chunk 0 belongs.
  std::string msg = importAndProve(
      replaced(a2a, R"(type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0")",
               R"(type="cpy" srcbuf="i" srcoff="3" dstbuf="o" dstoff="0")"), "a2a.xml");
  EXPECT_NE(msg.find("a2a.xml: plan 'a2a' fails its proof (count 1, out of place): verifier: algorithm 'a2a' for "
                     "alltoall with 8 ranks (count 1, root 0): rank 0: output element 0 holds ranks {0} element 3 but "
                     "should hold ranks {0} element 0"), std::string::npos) << msg;

  const std::string one = slurp(kData / "allreduce-1step-4n-ll-1pass.xml");
  // GPU 0's first reduction copies instead of adding.
  const char* re0 = R"(<step s="4" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="2" deps="1")";
  msg = importAndProve(replaced(one, re0, R"(<step s="4" type="cpy" srcbuf="s" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="2" deps="1")"), "one.xml");
  EXPECT_NE(msg.find("rank 0: output element 0 holds ranks {1,2,3} element 0 but should hold ranks {0,1,2,3} element 0"),
            std::string::npos) << msg;
  // ... or no longer waits for the receive into the scratch it reads.
  msg = importAndProve(replaced(one, re0, R"(<step s="4" type="re" srcbuf="s" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1")"), "one.xml");
  EXPECT_NE(msg.find("one.xml: race on gpu 0's chunk s[0]: gpu 0 tb 2 step 1 (line 23, r) and gpu 0 tb 0 step 4 "
                     "(line 8, re) write and read it"), std::string::npos) << msg;

  // GPU 0's first send of the allgather is gone: GPU 1 waits for it forever.
  const std::string ag = slurp(kData / "allgather-8n-0-8kb.xml");
  msg = importAndProve(
      replaced(ag, R"(<step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>)", ""),
      "ag.xml");
  EXPECT_NE(msg.find("ag.xml: deadlock: gpu 1 tb 0 step 0 (line 50, r) never runs: it waits for a message from gpu 0 "
                     "on channel 0 that is never sent"), std::string::npos) << msg;
}

// Every case of `coll` (every dtype and op at the small counts, float32 sum
// at the large one) in the plan's form(s).
std::vector<testing::Case> standardCasesFor(int n, testing::Coll coll, const std::vector<size_t>& counts,
                                            PlanInPlace form) {
  std::vector<testing::Case> cases;
  for (testing::Case k : testing::standardCases(n, counts, /*all_dtypes=*/true))
    if (k.coll == coll && (k.count < 1000 || (k.dtype == chorusFloat32 && k.op == chorusSum)) &&
        (k.inplace ? form != PlanInPlace::No : form != PlanInPlace::Yes))
      cases.push_back(k);
  return cases;
}

// The cases on n ranks over `transport`, with the plan forced; each rank
// first checks that the tuner runs it, and over that transport.
std::string runImported(int n, const std::vector<std::string>& files, const std::string& spec, const char* coll_name,
                        const std::string& name, const std::vector<testing::Case>& cases, PlanInPlace form,
                        const std::string& transport) {
  Config cfg;
  cfg.tune.plan_paths = files;
  cfg.tune.algo_spec = spec;
  cfg.net.transport = transport;
  if (cases.size() < 2) return fmt::format("too few cases ({})", cases.size());
  auto msgs = testing::runRanks(n, cfg, [&](int r, chorusComm_t comm) -> std::string {
    char ran[64] = {};
    double us = 0;
    const int inplace = form == PlanInPlace::Yes ? 1 : 0;
    if (chorusCommPredict(comm, coll_name, cases.back().count, chorusFloat32, inplace, ran, sizeof ran, &us) !=
        chorusSuccess)
      return chorusGetLastError(comm);
    if (std::string(ran) != name) return fmt::format("rank {}: forced {} but the tuner runs {}", r, name, ran);
    const std::vector<std::string> used = api::commTransports(comm);
    if (std::find(used.begin(), used.end(), transport) == used.end())
      return fmt::format("rank {}: runs over {} transports, none of them {}", r, used.size(), transport);
    for (const testing::Case& k : cases)
      if (std::string e = testing::runCase(comm, k); !e.empty()) return fmt::format("rank {}: {}: {}", r, k.name(), e);
    return "";
  });
  return testing::failures(msgs);
}
std::string runImported(int n, const std::vector<std::string>& files, const std::string& spec, testing::Coll coll,
                        const char* coll_name, const std::string& name, const std::vector<size_t>& counts,
                        PlanInPlace form, const std::string& transport) {
  return runImported(n, files, spec, coll_name, name, standardCasesFor(n, coll, counts, form), form, transport);
}

struct RunFile {
  const char* file;
  int ranks;
  testing::Coll coll;
  const char* coll_name;
  size_t chunks;
  PlanInPlace form;
};
const RunFile kRunFiles[] = {
    {"alltoall-8n-0-9kb", 8, testing::Coll::AllToAll, "alltoall", 1, PlanInPlace::No},
    {"allgather-8n-8kb-128kb", 8, testing::Coll::AllGather, "allgather", 2, PlanInPlace::Yes},
    {"allreduce-1step-4n-ll-1pass", 4, testing::Coll::AllReduce, "allreduce", 8, PlanInPlace::Yes},
    {"allreduce-allpairs-8n-ll-1pass-op", 8, testing::Coll::AllReduce, "allreduce", 16, PlanInPlace::No},
};

TEST(MscclFile, ImportedPlansRunOnRanksOverShm) {
  for (const RunFile& f : kRunFiles) {
    SCOPED_TRACE(f.file);
    const std::string path = (kData / (std::string(f.file) + ".xml")).string();
    const size_t c = f.chunks;
    EXPECT_EQ(runImported(f.ranks, {path}, fmt::format("{}:{}", f.coll_name, f.file), f.coll, f.coll_name, f.file,
                          {c, 3 * c, 1001 * c}, f.form, "shm"), "");
  }
}

TEST(MscclFile, ImportedPlansRunOnRanksOverTcp) {
  for (const RunFile& f : {kRunFiles[0], kRunFiles[2]}) {
    SCOPED_TRACE(f.file);
    const std::string path = (kData / (std::string(f.file) + ".xml")).string();
    const size_t c = f.chunks;
    EXPECT_EQ(runImported(f.ranks, {path}, fmt::format("{}:{}", f.coll_name, f.file), f.coll, f.coll_name, f.file,
                          {c, 3 * c, 1001 * c}, f.form, "tcp"), "");
  }
}

// CHORUS_ALGO=allreduce:file:PATH: the plan of a file no CHORUS_PLAN_PATH
// names, loaded, proven and forced for every call of the collective; over
// shm and tcp, and ucx where the build has it; MSCCL XML and chorus's text.
TEST(MscclFile, AlgoFileRunsThePlan) {
  const RunFile& f = kRunFiles[2];  // allreduce-1step-4n-ll-1pass: 4 ranks, in place, 8 chunks
  const std::string path = (kData / (std::string(f.file) + ".xml")).string();
  std::vector<std::string> transports{"shm", "tcp"};
#if CHORUS_HAVE_UCX
  transports.push_back("ucx");
#endif
  for (const std::string& t : transports) {
    SCOPED_TRACE(t);
    EXPECT_EQ(runImported(f.ranks, {}, "allreduce:file:" + path, f.coll, f.coll_name, f.file, {8, 24, 8008}, f.form, t),
              "");
  }
  // chorus's plan text, beside another collective's forced built-in.
  TempDir dir("algofile");
  const Registry reg = Registry::builtin();
  auto text = dumpPlanText(*reg.find(Collective::AllReduce, "ring"), 4, 4, {.name = "ring4t"});
  ASSERT_TRUE(text.isOk()) << text.status().message();
  const std::string plan = dir.write("ring4t.plan", *text);
  EXPECT_EQ(runImported(4, {}, "allgather:ring;allreduce:file:" + plan, testing::Coll::AllReduce, "allreduce", "ring4t",
                        {4, 12, 4004}, PlanInPlace::No, "shm"), "");
  // The same file named by CHORUS_PLAN_PATH too (another spelling of its path) is one plan.
  const std::string other = (dir.path / "." / "ring4t.plan").string();
  EXPECT_EQ(runImported(4, {plan}, "allreduce:file:" + other, testing::Coll::AllReduce, "allreduce", "ring4t",
                        {4, 12}, PlanInPlace::No, "shm"), "");
}

// What a forced file does not take is an error that says so: a plan of
// another collective or a missing file when the communicator is made; a
// call of another rank count or a count that is not whole chunks when it is
// made (the tuner does not fall back to another algorithm).
TEST(MscclFile, AlgoFileRefusesWhatItDoesNotTake) {
  const std::string ar4 = (kData / "allreduce-1step-4n-ll-1pass.xml").string();
  const std::string ar8 = (kData / "allreduce-allpairs-8n-ll-1pass-op.xml").string();
  auto initError = [](const std::string& spec) {
    Config cfg;
    cfg.tune.algo_spec = spec;
    return testing::failures(testing::runRanks(2, cfg, [](int, chorusComm_t) { return std::string(); }));
  };
  std::string err = initError("allgather:file:" + ar4);
  EXPECT_NE(err.find("CHORUS_ALGO item 'allgather:file:" + ar4 + "': '" + ar4 +
                     "' is allreduce plan 'allreduce-1step-4n-ll-1pass', not allgather plan"), std::string::npos) << err;
  err = initError("allreduce:file:/nonexistent/x.xml");
  EXPECT_NE(err.find("CHORUS_ALGO item 'allreduce:file:/nonexistent/x.xml': '/nonexistent/x.xml' is not a plan file"),
            std::string::npos) << err;
  err = initError("allreduce:file:");
  EXPECT_NE(err.find("'file:' names no file"), std::string::npos) << err;

  auto callError = [](const std::string& spec, size_t count, bool inplace) {
    Config cfg;
    cfg.tune.algo_spec = spec;
    return testing::failures(testing::runRanks(4, cfg, [&](int, chorusComm_t comm) -> std::string {
      std::vector<float> in(count, 1.0f), out(count, 0.0f);
      const chorusResult_t rc = chorusAllReduce(in.data(), inplace ? in.data() : out.data(), count, chorusFloat32,
                                                chorusSum, comm, nullptr);
      if (rc == chorusSuccess) return std::string("the call ran");
      return std::string(chorusGetLastError(comm));
    }));
  };
  err = callError("allreduce:file:" + ar8, 16, false);
  EXPECT_NE(err.find("CHORUS_ALGO allreduce:file:" + ar8 + " forces plan 'allreduce-allpairs-8n-ll-1pass-op', which "
                     "does not take this call (4 ranks, count 16, out of place): it needs 8 ranks"), std::string::npos)
      << err;
  err = callError("allreduce:file:" + ar4, 12, true);
  EXPECT_NE(err.find("does not take this call (4 ranks, count 12, in place): it needs 4 ranks, a count that is a "
                     "positive multiple of 8"), std::string::npos) << err;
  err = callError("allreduce:file:" + ar4, 16, false);  // the file claims the in-place form only
  EXPECT_NE(err.find("(4 ranks, count 16, out of place): it needs"), std::string::npos) << err;
  EXPECT_EQ(err.find("the call ran"), std::string::npos) << err;
}

// Every RCCL file on as many ranks as it has GPUs (threads), over shm:
// float32 and int32 sums (and a max) at two counts, in the forms it claims.
TEST(MscclFile, EveryRcclFileRunsOnRanks) {
  int ran = 0;
  for (const auto& e : fs::directory_iterator(kData)) {
    // Not the two 16-GPU rings (23,040 steps): every rank proves the plan as
    // it sets up, 16 x 10 s on a 2-core machine.  They are proven above, and
    // ran right by hand (docs/msccl.md).
    if (e.path().extension() != ".xml" || e.path().stem().string().rfind("all-reduce-ring", 0) == 0) continue;
    SCOPED_TRACE(e.path().filename().string());
    auto spec = readPlanFile(e.path().string());
    ASSERT_TRUE(spec.isOk()) << spec.status().message();
    const testing::Coll coll = spec->coll == Collective::AllGather ? testing::Coll::AllGather
                               : spec->coll == Collective::AllToAll ? testing::Coll::AllToAll
                                                                    : testing::Coll::AllReduce;
    const char* coll_name = testing::collName(coll);
    std::vector<testing::Case> cases;
    for (size_t count : {size_t{spec->chunks}, size_t{3} * spec->chunks})
      for (bool inplace : {false, true}) {
        if (inplace ? spec->inplace == PlanInPlace::No : spec->inplace == PlanInPlace::Yes) continue;
        for (auto [dtype, op] : {std::pair{chorusFloat32, chorusSum}, std::pair{chorusInt32, chorusSum},
                                 std::pair{chorusFloat64, chorusMax}}) {
          if (op == chorusMax && spec->coll != Collective::AllReduce) continue;
          testing::Case k;
          k.coll = coll;
          k.dtype = dtype;
          k.op = op;
          k.count = count;
          k.inplace = inplace;
          cases.push_back(k);
        }
      }
    EXPECT_EQ(runImported(spec->nranks, {e.path().string()}, fmt::format("{}:{}", coll_name, spec->name), coll_name,
                          spec->name, cases, spec->inplace, "shm"), "");
    ++ran;
  }
  EXPECT_GE(ran, 19);
}

// Every built-in algorithm of the collectives MSCCL's XML has, on 4 ranks:
// written as MSCCL XML, read back and proven; and one of each collective run
// on ranks from its exported file.
TEST(MscclFile, ExportedBuiltinsRoundTrip) {
  const Registry reg = Registry::builtin();
  std::set<std::string> families;
  int written = 0;
  for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::AllToAll, Collective::ReduceScatter})
    for (const Algorithm* a : reg.forCollective(c)) {
      if (a->compressed() || a->exact()) continue;
      Shape sh;
      sh.coll = c;
      sh.nranks = 4;
      sh.count = 4;
      if (!a->supports(sh)) continue;  // e.g. plans for ranks on several hosts
      SCOPED_TRACE(fmt::format("{} {}", collectiveName(c), a->name()));
      auto xml = writeMscclXml(*a, 4, 4, {});
      ASSERT_TRUE(xml.isOk()) << xml.status().message();
      const std::string origin = fmt::format("x-{}-{}.xml", collectiveName(c), a->name());
      EXPECT_EQ(importAndProve(*xml, origin), "") << *xml;
      families.insert(std::string(a->name()));
      ++written;
    }
  EXPECT_GE(written, 12);
  for (const char* f : {"ring", "recursive_doubling", "rabenseifner", "bruck", "pairwise"})
    EXPECT_EQ(families.count(f), 1u) << f;

  TempDir dir("export");
  struct Run {
    const char* coll_name;
    const char* algo;
    testing::Coll coll;
  };
  for (const Run& r : {Run{"allreduce", "ring", testing::Coll::AllReduce},
                       Run{"allgather", "bruck", testing::Coll::AllGather},
                       Run{"alltoall", "pairwise", testing::Coll::AllToAll},
                       Run{"reducescatter", "ring", testing::Coll::ReduceScatter}}) {
    SCOPED_TRACE(fmt::format("{} {}", r.coll_name, r.algo));
    auto xml = exportPlan({.collective = r.coll_name, .algo = r.algo, .ranks = 4, .chunks = 4, .format = "msccl-xml"});
    ASSERT_TRUE(xml.isOk()) << xml.status().message();
    const std::string name = fmt::format("x-{}-{}", r.coll_name, r.algo);
    const std::string path = dir.write(name + ".xml", *xml);
    EXPECT_EQ(runImported(4, {path}, fmt::format("{}:{}", r.coll_name, name), r.coll, r.coll_name, name,
                          {4, 12, 4004}, PlanInPlace::No, "shm"), "");
  }
  auto bad = exportPlan({.collective = "allreduce", .algo = "ring", .ranks = 4, .format = "msccl++-xml"});
  EXPECT_FALSE(bad.isOk());
  bad = exportPlan({.collective = "allreduce", .algo = "nosuch", .ranks = 4});
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("no built-in allreduce algorithm 'nosuch'"), std::string::npos);
}

// chorus's algorithms as MSCCL++ execution plans (JSON) for 2 to 8 ranks:
// every one written is read back and proven (the reader maps puts, signals
// and waits onto sends and receives), and a selection runs on shm ranks from
// its file against the reference.
TEST(MscclppJson, ExportedBuiltinsRoundTrip) {
  const Registry reg = Registry::builtin();
  std::set<std::string> families;
  int written = 0;
  for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::AllToAll, Collective::ReduceScatter})
    for (const Algorithm* a : reg.forCollective(c))
      for (int n = 2; n <= 8; ++n) {
        if (a->compressed() || a->exact()) continue;
        Shape sh;
        sh.coll = c;
        sh.nranks = n;
        sh.count = static_cast<uint64_t>(n);
        if (!a->supports(sh)) continue;
        SCOPED_TRACE(fmt::format("{} {} on {} ranks", collectiveName(c), a->name(), n));
        auto json = writeMscclppJson(*a, n, n, {});
        ASSERT_TRUE(json.isOk()) << json.status().message();
        auto spec = parseMscclppJson(*json, fmt::format("x-{}-{}-{}.json", collectiveName(c), a->name(), n));
        ASSERT_TRUE(spec.isOk()) << spec.status().message();
        EXPECT_EQ(spec->coll, c);
        EXPECT_EQ(spec->nranks, n);
        EXPECT_EQ(spec->chunks, static_cast<uint32_t>(n));
        auto built = buildPlan(std::move(*spec));
        EXPECT_TRUE(built.isOk()) << built.status().message();
        families.insert(fmt::format("{} {}", collectiveName(c), a->name()));
        ++written;
      }
  EXPECT_GE(written, 60);
  for (const char* f : {"allreduce ring", "allreduce recursive_doubling", "allreduce rabenseifner", "allgather ring",
                        "allgather bruck", "alltoall pairwise", "reducescatter ring"})
    EXPECT_EQ(families.count(f), 1u) << f;

  TempDir dir("exportpp");
  struct Run {
    const char* coll_name;
    const char* algo;
    testing::Coll coll;
    int ranks;
  };
  for (const Run& r : {Run{"allreduce", "ring", testing::Coll::AllReduce, 3},
                       Run{"allreduce", "rabenseifner", testing::Coll::AllReduce, 8},
                       Run{"allgather", "bruck", testing::Coll::AllGather, 5},
                       Run{"alltoall", "pairwise", testing::Coll::AllToAll, 4},
                       Run{"reducescatter", "ring", testing::Coll::ReduceScatter, 2}}) {
    SCOPED_TRACE(fmt::format("{} {} on {}", r.coll_name, r.algo, r.ranks));
    auto json = exportPlan({.collective = r.coll_name, .algo = r.algo, .ranks = r.ranks, .format = "mscclpp-json",
                            .name = fmt::format("pp-{}-{}", r.coll_name, r.algo)});
    ASSERT_TRUE(json.isOk()) << json.status().message();
    const std::string name = fmt::format("pp-{}-{}", r.coll_name, r.algo);
    const std::string path = dir.write(name + ".json", *json);
    const auto k = static_cast<size_t>(r.ranks);
    EXPECT_EQ(runImported(r.ranks, {path}, fmt::format("{}:{}", r.coll_name, name), r.coll, r.coll_name, name,
                          {k, 3 * k, 1001 * k}, PlanInPlace::No, "shm"), "");
  }
}

}  // namespace
}  // namespace chorus::plan
