// The simulator pricing a plan loaded from a file (docs/plan-format.md):
// chorus-sim collective --plan FILE --algo NAME, and simulateCollective with
// a registry that holds the file's plan.  (Apart from plan_file_test.cpp: the
// simulator is not linked into the ThreadSanitizer tree's tests.)
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "plan/plan_file.hpp"
#include "sim/cli.hpp"
#include "sim/config.hpp"
#include "sim/report.hpp"

namespace chorus::sim {
namespace {

namespace fs = std::filesystem;

const std::string kCluster = std::string(CHORUS_SOURCE_DIR) + "/configs/clusters/h100-rail.json";

// The built-in ring allreduce for n ranks as a plan file named `name`, in a
// directory removed afterwards.
struct RingFile {
  fs::path dir;
  std::string path;
  RingFile(int n, const std::string& name)
      : dir(fs::temp_directory_path() / fmt::format("chorus-sim-plan-{}-{}", name, getpid())) {
    fs::create_directories(dir);
    const plan::Registry reg = plan::Registry::builtin();
    auto text = plan::dumpPlanText(*reg.find(plan::Collective::AllReduce, "ring"), n, n, {.name = name});
    EXPECT_TRUE(text.isOk()) << text.status().message();
    path = (dir / (name + ".plan")).string();
    std::ofstream(path) << (text.isOk() ? *text : std::string());
  }
  ~RingFile() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// The file's ring is the built-in ring: the same rounds (derived from its
// programs), so the same price.
TEST(SimPlanFile, PricesTheFilePlanAsTheBuiltinRing) {
  RingFile f(4, "ring4f");
  auto cluster = loadCluster(kCluster);
  ASSERT_TRUE(cluster.isOk()) << cluster.status().message();
  const std::vector<std::string> paths{f.path};
  auto reg = plan::Registry::withPlans(paths);
  ASSERT_TRUE(reg.isOk()) << reg.status().message();
  for (double bytes : {4096.0, 16.0 * (1 << 20), 1024.0 * (1 << 20)}) {
    auto file = simulateCollective(*cluster, 4, "allreduce", bytes, "ring4f", *reg);
    auto ring = simulateCollective(*cluster, 4, "allreduce", bytes, "ring", *reg);
    ASSERT_TRUE(file.isOk()) << file.status().message();
    ASSERT_TRUE(ring.isOk()) << ring.status().message();
    EXPECT_EQ(file->algo, "ring4f");
    EXPECT_GT(file->time_us, 0);
    EXPECT_NEAR(file->time_us, ring->time_us, 1e-6 * ring->time_us) << bytes << " bytes";
  }
}

// The command line: --plan loads it, --algo names it; a GPU count or a size
// the plan does not take is an error saying what it needs.
TEST(SimPlanFile, CollectiveCommandTakesPlanFiles) {
  RingFile f(4, "ring4f");
  CliOptions o;
  o.cluster_path = kCluster;
  o.gpus = 4;
  o.collective = "allreduce";
  o.bytes_text = "1M";
  o.algo = "ring4f";
  o.plan_paths = {f.dir.string()};
  o.json = true;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(runCollectiveCommand(o), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("\"algo\": \"ring4f\""), std::string::npos) << out;

  auto error = [](const CliOptions& opt) {
    ::testing::internal::CaptureStderr();
    const int rc = runCollectiveCommand(opt);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, 1) << err;
    return err;
  };
  CliOptions wrong = o;
  wrong.gpus = 8;
  std::string err = error(wrong);
  EXPECT_NE(err.find("--algo ring4f: the allreduce plan of '" + f.path + "' is for 4 ranks, not --gpus 8"),
            std::string::npos) << err;
  wrong = o;
  wrong.bytes_text = "1001";
  err = error(wrong);
  EXPECT_NE(err.find("allreduce 'ring4f' does not take 4 ranks and a count of 1001 (bytes): it needs 4 ranks, a count "
                     "that is a positive multiple of 4"), std::string::npos) << err;
  wrong = o;
  wrong.plan_paths = {f.dir.string() + "/missing.plan"};
  err = error(wrong);
  EXPECT_NE(err.find("missing.plan': no such file or directory"), std::string::npos) << err;
  // Without --plan the name is unknown.
  wrong = o;
  wrong.plan_paths.clear();
  err = error(wrong);
  EXPECT_NE(err.find("no allreduce algorithm named 'ring4f'"), std::string::npos) << err;
}

// An MSCCL file from RCCL (tests/data/msccl) priced by --plan FILE.xml: an
// in-place-only plan is priced in that form; another --gpus names the GPUs
// it needs.
TEST(SimPlanFile, CollectiveCommandTakesMscclXml) {
  CliOptions o;
  o.cluster_path = kCluster;
  o.gpus = 4;
  o.collective = "allreduce";
  o.bytes_text = "1M";
  o.algo = "allreduce-1step-4n-ll-1pass";
  o.plan_paths = {std::string(CHORUS_SOURCE_DIR) + "/tests/data/msccl/allreduce-1step-4n-ll-1pass.xml"};
  o.json = true;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(runCollectiveCommand(o), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("\"algo\": \"allreduce-1step-4n-ll-1pass\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"time_us\""), std::string::npos) << out;
  CliOptions wrong = o;
  wrong.gpus = 8;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(runCollectiveCommand(wrong), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the allreduce plan of '" + o.plan_paths[0] + "' is for 4 ranks, not --gpus 8"),
            std::string::npos) << err;
}

}  // namespace
}  // namespace chorus::sim
