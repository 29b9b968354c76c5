// A rank drops out; the survivors see a remote error, agree on who is left
// with chorusCommShrink, and finish the job on the smaller communicator.
#include <gtest/gtest.h>

#include <chrono>

#include "comm/communicator.hpp"
#include "support/rank_threads.hpp"

namespace chorus::testing {
namespace {

TEST(Shrink, SurvivorsFinishTheJob) {
  Config cfg;
  cfg.shrink.window = std::chrono::milliseconds(1500);
  cfg.timeout = std::chrono::milliseconds(20000);
  const int n = 4, gone = 2;
  auto msgs = runRanks(n, cfg, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<float> x(100000, 1.0f);
    if (chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, comm, nullptr) != chorusSuccess)
      return "first allreduce failed";
    if (r == gone) {
      chorusCommAbort(comm);  // as good as dead to the others
      return "";
    }
    chorusResult_t res = chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, comm, nullptr);
    if (res != chorusRemoteError) return "rank " + std::to_string(r) + ": expected a remote error, got " + std::to_string(res);
    std::string why = chorusGetLastError(comm);
    if (why.find("rank 2") == std::string::npos) return "the error does not name rank 2: " + why;
    chorusComm_t small = nullptr;
    if (chorusCommShrink(comm, CHORUS_SHRINK_DEFAULT, &small) != chorusSuccess)
      return std::string("shrink: ") + chorusGetLastError(comm);
    int sz = 0, me = 0;
    chorusCommCount(small, &sz);
    chorusCommUserRank(small, &me);
    if (sz != 3 || me != (r < gone ? r : r - 1))
      return "shrunk communicator has the wrong shape: size " + std::to_string(sz) + " rank " + std::to_string(me);
    // Finish the job: 20 more steps on the survivors.
    for (int step = 0; step < 20; ++step) {
      std::vector<int> v(5000, me + step);
      if (chorusAllReduce(v.data(), v.data(), v.size(), chorusInt32, chorusSum, small, nullptr) != chorusSuccess)
        return std::string("allreduce on the shrunk communicator: ") + chorusGetLastError(small);
      if (v[4999] != 0 + 1 + 2 + 3 * step) return "wrong sum on the shrunk communicator";
    }
    chorusCommDestroy(small);
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

// The member list comes from the store (the network): anything but
// increasing ranks in range is an error, never a rank out of bounds.
TEST(Shrink, MemberListIsRangeChecked) {
  auto parse = [](std::string_view s, int n) {
    return parseMemberList(std::as_bytes(std::span(s.data(), s.size())), n);
  };
  auto ok = parse("0,2,3", 4);
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_EQ(*ok, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(*parse("5", 6), std::vector<int>{5});
  for (std::string_view bad : {"", ",", "0,", ",1", "0,,1", "4", "0,4", "-1", "1,0", "1,1", "a", "0,1x",
                               "99999999999", "2147483648", "0 ,1", "3,2,1"}) {
    auto r = parse(bad, 4);
    EXPECT_FALSE(r.isOk()) << "'" << bad << "' was accepted";
  }
}

TEST(Shrink, BadArguments) {
  chorusComm_t out = reinterpret_cast<chorusComm_t>(1);
  EXPECT_EQ(chorusCommShrink(nullptr, 0, &out), chorusInvalidArgument);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(chorusCommShrink(nullptr, 0, nullptr), chorusInvalidArgument);
  auto msgs = runRanks(1, [&](int, chorusComm_t comm) -> std::string {
    chorusComm_t o = nullptr;
    if (chorusCommShrink(comm, 7, &o) != chorusInvalidArgument) return "flags=7 accepted";
    if (std::string(chorusGetLastError(nullptr)).find("flags=7") == std::string::npos) return "message lacks flags=7";
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

}  // namespace
}  // namespace chorus::testing
