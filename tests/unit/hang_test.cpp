// A rank that never reaches a collective: the others time out with a message
// that says who waits where — the "which rank hangs?" answer.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <atomic>

#include "comm/flight.hpp"
#include "comm/hang_report.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include "plan/plan.hpp"
#include "support/rank_threads.hpp"

namespace chorus::testing {
namespace {

// Four ranks with a 1.5 s timeout run allreduce #0; ranks 0-2 then enter
// allreduce #1, which rank 3 never joins.  Per rank: "<code> <message>" of
// allreduce #1 ("" for rank 3), or "first allreduce failed".
std::vector<std::string> rank3StaysOut(Config cfg = {}) {
  cfg.timeout = std::chrono::milliseconds(1500);
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  const int n = 4;
  auto msgs = runRanks(n, cfg, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(1000, 1.0f);
    if (chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess)
      return "first allreduce failed";
    std::string out;
    if (r != 3) {
      chorusResult_t res = chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, comm, nullptr);
      out = std::to_string(res) + " " + chorusGetLastError(comm);
    }
    // Rank 3 stays out of allreduce #1 until the others have given up on it,
    // and nobody destroys its communicator (whose watchdog answers probes)
    // before every waiting rank is done explaining.
    std::unique_lock l(mu);
    if (r != 3) ++finished;
    cv.notify_all();
    cv.wait_for(l, std::chrono::seconds(30), [&] { return finished == n - 1; });
    return out;
  });
  return msgs;
}

// A job without a single collective: every rank inits and destroys at once.
// Rank 0 hosts the store and leaves init's last barrier last; if any rank
// still had a store connection to open after that barrier (the watchdog's
// used to), rank 0's destroy could close the store under it and that rank's
// init failed ("authentication failed ... closed the connection").  Every
// init and destroy must succeed, many times over.
TEST(Hang, InitThenImmediateDestroyNeverLosesTheStore) {
  for (int round = 0; round < 60; ++round) {
    auto msgs = runRanks(4, [](int, chorusComm_t) { return std::string(); });
    ASSERT_EQ(failures(msgs), "") << "round " << round;
  }
}

TEST(Hang, TimeoutNamesWhoWaitsWhere) {
  auto msgs = rank3StaysOut();
  // Every waiting rank failed; at least one (the first to time out) explains.
  int explained = 0;
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(msgs[r].empty());
    const bool timeout = msgs[r].rfind(std::to_string(chorusTimeout) + " ", 0) == 0;
    const bool remote = msgs[r].rfind(std::to_string(chorusRemoteError) + " ", 0) == 0;
    EXPECT_TRUE(timeout || remote) << msgs[r];
    if (timeout) {
      EXPECT_NE(msgs[r].find("allreduce #1 (count=1000 float32) timed out after 1500 ms"), std::string::npos) << msgs[r];
      EXPECT_NE(msgs[r].find("rank 3 last completed allreduce #0 (count=1000 float32) and is in no collective"),
                std::string::npos)
          << msgs[r];
      if (msgs[r].find("are waiting in it") != std::string::npos) ++explained;
    }
  }
  EXPECT_GE(explained, 1);
  EXPECT_EQ(msgs[3], "");
}

// The same diagnosis offline, from the files CHORUS_FLIGHT_DIR collects.
TEST(Hang, ReportFromDumpedRecorders) {
  const std::string dir = ::testing::TempDir() + "/chorus-flight-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  FlightRecorder rec[3];
  for (int r = 0; r < 3; ++r) {
    rec[r].start(0, static_cast<uint8_t>(plan::Collective::AllReduce), chorusFloat32, 8, 0);
    rec[r].finish(0, true);
    if (r != 2) rec[r].start(1, static_cast<uint8_t>(plan::Collective::Broadcast), chorusInt32, 4, 0);
    std::ofstream(dir + "/flight-rank" + std::to_string(r) + ".json") << flightJson(r, 3, rec[r].snapshot());
  }
  auto report = hangReport(dir);
  ASSERT_TRUE(report.isOk()) << report.status().message();
  EXPECT_EQ(report.value(),
            "broadcast #1 (count=4 int32): ranks 0,1 are waiting in it; rank 2 last completed allreduce #0 "
            "(count=8 float32) and is in no collective\n");
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(hangReport(dir).isOk());
}

// The recorder is written by the executing thread and read by any other (a
// sequence lock): a reader running beside a writer must only ever see whole
// entries.  Every entry the writer makes has count = 3 x seq and root =
// seq % 7, and is finished (Done) before the next one starts; a torn read
// would break one of those relations.
TEST(Hang, RecorderSnapshotsAreWholeEntriesWhileItIsWritten) {
  FlightRecorder rec;
  constexpr uint64_t kOps = 200000;
  std::atomic<uint64_t> written{0};
  std::atomic<int64_t> snapshots{0};
  std::thread writer([&] {
    for (uint64_t seq = 1; seq <= kOps; ++seq) {
      rec.start(seq, 0, 7, 3 * seq, static_cast<int32_t>(seq % 7));
      rec.finish(seq, true);
      written.store(seq, std::memory_order_release);
      // Halfway, let the reader in (on 2 busy cores it may not have run yet:
      // the whole write takes ~10 ms), for at most 5 s.
      if (seq == kOps / 2) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (snapshots.load(std::memory_order_acquire) < 20 && std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
      }
    }
  });
  int64_t checked = 0;
  std::string torn;  // the first inconsistency seen (asserted after the join)
  while (torn.empty() && written.load(std::memory_order_acquire) < kOps) {
    const std::vector<FlightEntry> snap = rec.snapshot();
    // Only snapshots with entries count: 20 empty ones taken before the
    // writer's first entry let it run past the halfway wait and finish before
    // the next snapshot (seen once in CI: checked == 0).
    if (!snap.empty()) snapshots.fetch_add(1, std::memory_order_release);
    for (size_t k = 0; k < snap.size() && torn.empty(); ++k) {
      const FlightEntry& e = snap[k];
      if (e.count != 3 * e.seq || e.root != static_cast<int32_t>(e.seq % 7) || e.dtype != 7 ||
          (k > 0 && e.seq != snap[k - 1].seq + 1) || (k + 1 < snap.size() && e.state != FlightEntry::Done))
        torn = fmt::format("entry {} of {}: seq {} count {} root {} state {}", k, snap.size(), e.seq, e.count, e.root,
                           e.state);
      ++checked;
    }
  }
  writer.join();
  EXPECT_EQ(torn, "");
  EXPECT_GT(checked, 0);
  const std::vector<FlightEntry> last = rec.snapshot();
  ASSERT_EQ(last.size(), FlightRecorder::kSize);
  EXPECT_EQ(last.back().state, FlightEntry::Done);
}

TEST(Hang, DiagnosisText) {
  FlightEntry stuck{};
  stuck.seq = 1042;
  stuck.coll = static_cast<uint8_t>(plan::Collective::AllReduce);
  stuck.dtype = chorusFloat32;
  stuck.count = 8;
  std::vector<FlightSummary> s(5);
  for (int r = 0; r < 3; ++r) {
    s[r].rank = r;
    s[r].has_current = 1;
    s[r].current = stuck;
  }
  s[3].rank = 3;
  s[3].has_last = 1;
  s[3].last = stuck;
  s[3].last.seq = 1041;
  s[3].has_current = 1;
  s[3].current.coll = static_cast<uint8_t>(plan::Collective::Barrier);
  s[3].current.seq = 7;
  EXPECT_EQ(diagnoseHang(stuck, s),
            "ranks 0,1,2 are waiting in it; rank 3 last completed allreduce #1041 (count=8 float32) and is in "
            "barrier #7; rank(s) 4 did not answer (dead, or unreachable)");
}

// A rank that times out in an operation is still in it for anyone who asks
// (its recorder marks the operation failed, which breaks the communicator):
// a probe of a rank that gave up must not say "in no collective".
TEST(Hang, ARankThatGaveUpIsReportedInItsOperation) {
  FlightRecorder rec;
  rec.start(0, static_cast<uint8_t>(plan::Collective::AllGather), chorusFloat32, 16, 0);
  rec.finish(0, true);
  rec.start(1, static_cast<uint8_t>(plan::Collective::AllGather), chorusFloat32, 16, 0);
  rec.finish(1, false);  // timed out
  FlightSummary mine = rec.summary(0);
  ASSERT_EQ(mine.has_current, 1u);
  EXPECT_EQ(mine.current.seq, 1u);
  EXPECT_EQ(mine.current.state, FlightEntry::Failed);
  FlightEntry stuck = mine.current;
  std::vector<FlightSummary> s(3);
  s[0] = mine;
  s[1] = mine;
  s[1].rank = 1;
  s[1].current.state = FlightEntry::Running;
  s[2].rank = 2;
  s[2].has_last = 1;
  s[2].last = stuck;
  s[2].last.seq = 0;
  s[2].last.state = FlightEntry::Done;
  EXPECT_EQ(diagnoseHang(stuck, s),
            "ranks 1 are waiting in it; ranks 0 stopped in it (timed out or aborted); rank 2 last completed "
            "allgather #0 (count=16 float32) and is in no collective");
}

// After a real timeout, `chorus-trace hang` on CHORUS_FLIGHT_DIR (which the
// library creates) names the operation, who stopped in it and which rank
// wrote no record.
TEST(Hang, ReportAfterARealTimeout) {
  const std::string dir = ::testing::TempDir() + "/chorus-flight-real-" + std::to_string(getpid()) + "/sub";
  std::filesystem::remove_all(dir);
  Config cfg;
  cfg.flight.dir = dir;
  auto msgs = rank3StaysOut(cfg);
  for (const std::string& m : msgs) EXPECT_NE(m, "first allreduce failed");
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << "CHORUS_FLIGHT_DIR was not created";
  auto report = hangReport(dir);
  ASSERT_TRUE(report.isOk()) << report.status().message();
  EXPECT_EQ(report.value().rfind("allreduce #1 (count=1000 float32): ", 0), 0u) << report.value();
  EXPECT_NE(report.value().find("ranks 0,1,2 stopped in it"), std::string::npos) << report.value();
  EXPECT_NE(report.value().find("rank 3: no flight record (did it start?"), std::string::npos) << report.value();
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

// A CHORUS_FLIGHT_DIR that cannot be created fails the init, naming it.
TEST(Hang, UncreatableFlightDirFailsTheInit) {
  Config cfg;
  cfg.flight.dir = "/proc/chorus-no-such-dir/x";
  auto msgs = runRanks(1, cfg, [&](int, chorusComm_t) -> std::string { return "init succeeded"; });
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_NE(msgs[0].find("CHORUS_FLIGHT_DIR"), std::string::npos) << msgs[0];
  EXPECT_NE(msgs[0].find("/proc/chorus-no-such-dir/x"), std::string::npos) << msgs[0];
}

}  // namespace
}  // namespace chorus::testing
