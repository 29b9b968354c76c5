// Surviving a failure and growing again: chorusCommRevoke breaks a
// communicator on every rank (ranks blocked in a call with the revoker stop
// at once, not at the timeout), and chorusCommGrow / chorusCommJoin bring new
// processes (threads here) into a communicator that runs collectives.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"

namespace chorus {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn(rank) on n threads and returns their messages ("" = ok).
std::vector<std::string> onThreads(int n, const std::function<std::string(int)>& fn) {
  std::vector<std::string> out(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&, r] { out[static_cast<size_t>(r)] = fn(r); });
  for (auto& t : ts) t.join();
  return out;
}

std::string joined(const std::vector<std::string>& msgs) {
  std::string s;
  for (size_t i = 0; i < msgs.size(); ++i)
    if (!msgs[i].empty()) s += "[" + std::to_string(i) + "] " + msgs[i] + "\n";
  return s;
}

// Every rank's ints summed: checks a communicator of `size` ranks end to end.
std::string checkAllReduce(chorusComm_t comm, int me, int size) {
  std::vector<int> v(3000, me + 1);
  if (chorusAllReduce(v.data(), v.data(), v.size(), chorusInt32, chorusSum, comm, nullptr) != chorusSuccess)
    return std::string("allreduce: ") + chorusGetLastError(comm);
  if (v[2999] != size * (size + 1) / 2) return "allreduce: wrong sum " + std::to_string(v[2999]);
  std::vector<int> all(static_cast<size_t>(size));
  if (chorusAllGather(&me, all.data(), 1, chorusInt32, comm, nullptr) != chorusSuccess)
    return std::string("allgather: ") + chorusGetLastError(comm);
  for (int r = 0; r < size; ++r)
    if (all[static_cast<size_t>(r)] != r) return "allgather: rank " + std::to_string(r) + " says " + std::to_string(all[r]);
  return "";
}

TEST(Revoke, RanksBlockedWithTheRevokerStopAtOnceAndShrink) {
  setenv("CHORUS_TIMEOUT_MS", "60000", 1);  // a revoke must end the wait long before this
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  const int n = 4, revoker = 2;
  auto msgs = onThreads(n, [&](int r) -> std::string {
    chorusComm_t comm = nullptr;
    if (chorusCommInitRank(&comm, n, id, r) != chorusSuccess) return "init failed";
    std::string err = checkAllReduce(comm, r, n);
    if (!err.empty()) return err;
    if (r == revoker) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting for this rank by now
      if (chorusCommRevoke(comm) != chorusSuccess) return "revoke failed";
      if (chorusCommRevoke(comm) != chorusSuccess) return "a second revoke failed";
    } else {
      std::vector<float> x(1000, 1.0f);
      auto t0 = Clock::now();
      chorusResult_t res = chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, comm, nullptr);
      auto took = Clock::now() - t0;
      if (res != chorusRevoked) return "expected chorusRevoked, got " + std::to_string(res) + ": " + chorusGetLastError(comm);
      std::string why = chorusGetLastError(comm);
      if (why.find("revoked by rank 2") == std::string::npos) return "the error does not name the revoker: " + why;
      if (took > std::chrono::seconds(10)) return "the revoke took effect only after the wait's timeout";
    }
    // Later calls fail too.
    int one = 1;
    if (chorusAllReduce(&one, &one, 1, chorusInt32, chorusSum, comm, nullptr) == chorusSuccess)
      return "a call after the revoke succeeded";
    chorusComm_t next = nullptr;
    if (chorusCommShrink(comm, CHORUS_SHRINK_DEFAULT, &next) != chorusSuccess)
      return std::string("shrink: ") + chorusGetLastError(comm);
    int size = 0, me = -1;
    chorusCommCount(next, &size);
    chorusCommUserRank(next, &me);
    if (size != n || me != r)
      return "the shrunk communicator has the wrong shape: size " + std::to_string(size) + " rank " + std::to_string(me);
    err = checkAllReduce(next, me, size);
    chorusCommDestroy(next);
    chorusCommDestroy(comm);
    return err;
  });
  unsetenv("CHORUS_TIMEOUT_MS");
  EXPECT_EQ(joined(msgs), "");
}

// Ranks that are not in a call when a rank revokes learn it from the store
// (their watchdogs), not at their next message: the communicator's
// asynchronous error turns to chorusRevoked while they sit idle.
TEST(Revoke, IdleRanksLearnItThroughTheirWatchdogs) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  const int n = 3, revoker = 1;
  auto msgs = onThreads(n, [&](int r) -> std::string {
    chorusComm_t comm = nullptr;
    if (chorusCommInitRank(&comm, n, id, r) != chorusSuccess) return "init failed";
    std::string err = checkAllReduce(comm, r, n);
    if (r == revoker && err.empty()) {
      if (chorusCommRevoke(comm) != chorusSuccess) err = "revoke failed";
    } else if (err.empty()) {
      chorusResult_t async = chorusSuccess;
      auto end = Clock::now() + std::chrono::seconds(10);
      while (Clock::now() < end && chorusCommGetAsyncError(comm, &async) == chorusSuccess && async == chorusSuccess)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (async != chorusRevoked) err = "the idle rank's async error is " + std::to_string(async) + ", not chorusRevoked";
    }
    // Hold the communicator until every rank has looked (the revoker's
    // destroy would otherwise tell the others by closing its connections).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    chorusCommDestroy(comm);
    return err;
  });
  EXPECT_EQ(joined(msgs), "");
}

TEST(Grow, JoinersGetTheNextRanksAndEveryCollectiveRuns) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  const int n = 3, nnew = 2;
  auto msgs = onThreads(n + nnew, [&](int t) -> std::string {
    chorusComm_t grown = nullptr;
    chorusComm_t comm = nullptr;
    if (t < n) {
      if (chorusCommInitRank(&comm, n, id, t) != chorusSuccess) return "init failed";
      std::string err = checkAllReduce(comm, t, n);
      if (!err.empty()) return err;
      if (chorusCommGrow(comm, nnew, &grown) != chorusSuccess) return std::string("grow: ") + chorusGetLastError(comm);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50 * (t - n)));  // arrive in order
      if (chorusCommJoin(id, &grown) != chorusSuccess) return std::string("join: ") + chorusGetLastError(nullptr);
    }
    int size = 0, me = -1;
    chorusCommCount(grown, &size);
    chorusCommUserRank(grown, &me);
    if (size != n + nnew) return "grown size " + std::to_string(size);
    if (t < n && me != t) return "an old rank was renumbered";
    if (t >= n && (me < n || me >= n + nnew)) return "a joiner got rank " + std::to_string(me);
    std::string err = checkAllReduce(grown, me, size);
    // A broadcast of rank 0's state (the parameters a joiner needs).
    std::vector<double> state(4096, me == 0 ? 0.25 : -1.0);
    if (err.empty() && chorusBroadcast(state.data(), state.data(), state.size(), chorusFloat64, 0, grown, nullptr) !=
                           chorusSuccess)
      err = std::string("broadcast: ") + chorusGetLastError(grown);
    if (err.empty() && state[4095] != 0.25) err = "broadcast: wrong value";
    chorusCommDestroy(grown);
    if (comm != nullptr) chorusCommDestroy(comm);
    return err;
  });
  EXPECT_EQ(joined(msgs), "");
}

TEST(Grow, OffersFromTheStoreAreRangeChecked) {
  auto parse = [](std::string_view s) { return parseGrowOffer(std::as_bytes(std::span(s.data(), s.size()))); };
  auto ok = parse("v1 5 3 w/grow0/");
  ASSERT_TRUE(ok.isOk()) << ok.status().message();
  EXPECT_EQ(ok->size, 5);
  EXPECT_EQ(ok->rank, 3);
  EXPECT_EQ(ok->prefix, "w/grow0/");
  EXPECT_EQ(encodeGrowOffer(*ok), "v1 5 3 w/grow0/");
  for (std::string_view bad : {"", "v2 5 3 p/", "v1 5 5 p/", "v1 5 -1 p/", "v1 1 0 p/", "v1 2000000 1 p/",
                               "v1 5 3 ", "v1 5 3 a b", "v1 5 3 ../\n", "v1 x 3 p/", "v1 5 3"}) {
    EXPECT_FALSE(parse(bad).isOk()) << "'" << bad << "' was accepted";
  }
  EXPECT_FALSE(parse("v1 5 3 " + std::string(300, 'a')).isOk());
}

TEST(Grow, BadArguments) {
  chorusComm_t out = reinterpret_cast<chorusComm_t>(1);
  EXPECT_EQ(chorusCommGrow(nullptr, 1, &out), chorusInvalidArgument);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(chorusCommRevoke(nullptr), chorusInvalidArgument);
  EXPECT_EQ(chorusCommJoin(chorusUniqueId{}, nullptr), chorusInvalidArgument);
  chorusUniqueId garbage{};
  EXPECT_EQ(chorusCommJoin(garbage, &out), chorusInvalidArgument);
}

}  // namespace
}  // namespace chorus
