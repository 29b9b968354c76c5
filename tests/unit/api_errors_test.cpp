// Every bad input to the C API is refused with chorusInvalidArgument or
// chorusInvalidUsage and a message naming the argument and its value; none
// crashes, hangs, or desynchronises the ranks.  Validation never
// communicates, so most checks run on rank 0 of a two-rank communicator while
// rank 1 idles; a final collective on both ranks proves nothing was issued.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/config.hpp"

namespace {

constexpr auto kBadType99 = static_cast<chorusDataType_t>(99);
const auto kBadTypeNeg = static_cast<chorusDataType_t>(-1);

// rc must be `want`, and both this thread's last error and the
// communicator's must contain every fragment.
::testing::AssertionResult failsWith(chorusResult_t rc, chorusResult_t want, chorusComm_t comm,
                                     std::initializer_list<std::string> fragments) {
  if (rc != want)
    return ::testing::AssertionFailure() << "returned " << rc << " (" << chorusGetErrorString(rc) << "), want " << want
                                         << "; last error: " << chorusGetLastError(nullptr);
  for (const char* msg : {chorusGetLastError(nullptr), chorusGetLastError(comm)}) {
    for (const auto& f : fragments)
      if (std::string(msg).find(f) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << f << "\"";
  }
  return ::testing::AssertionSuccess();
}

// Two ranks as threads; tests use comm_[0] on the test thread.
class ApiErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    chorusUniqueId id;
    ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
    chorusResult_t rc[2];
    std::thread t([&] { rc[1] = chorusCommInitRank(&comm_[1], 2, id, 1); });
    rc[0] = chorusCommInitRank(&comm_[0], 2, id, 0);
    t.join();
    ASSERT_EQ(rc[0], chorusSuccess) << chorusGetLastError(nullptr);
    ASSERT_EQ(rc[1], chorusSuccess);
  }
  // Both ranks run one allreduce: had any refused call been issued on rank 0,
  // the ranks' operation sequences would differ and this would fail or hang.
  void TearDown() override {
    std::vector<int> a(3, 1), b(3, 1);
    chorusResult_t rc1 = chorusSuccess;
    std::thread t([&] {
      if (comm_[1]) rc1 = chorusAllReduce(b.data(), b.data(), 3, chorusInt32, chorusSum, comm_[1], nullptr);
    });
    chorusResult_t rc0 = comm_[0] ? chorusAllReduce(a.data(), a.data(), 3, chorusInt32, chorusSum, comm_[0], nullptr)
                                  : chorusSuccess;
    t.join();
    EXPECT_EQ(rc0, chorusSuccess) << chorusGetLastError(nullptr);
    EXPECT_EQ(rc1, chorusSuccess);
    if (comm_[0] && comm_[1]) {
      EXPECT_EQ(a, (std::vector<int>{2, 2, 2}));
    }
    for (chorusComm_t c : comm_) {
      if (c) {
        EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
      }
    }
  }

  chorusComm_t comm_[2] = {nullptr, nullptr};
  float buf_[64] = {};
  float buf2_[64] = {};
};

// A single-rank communicator of its own (for destroy and abort tests).
chorusComm_t soloComm() {
  chorusUniqueId id;
  chorusComm_t c = nullptr;
  if (chorusGetUniqueId(&id) != chorusSuccess || chorusCommInitRank(&c, 1, id, 0) != chorusSuccess) return nullptr;
  return c;
}

// Each collective called with every argument valid except what the case
// changes.  Rank 0 of 2; root 0; peer 1; count 4; float.
struct Call {
  const char* name;
  std::function<chorusResult_t(chorusComm_t, const void* s, void* r, size_t n, chorusDataType_t, chorusRedOp_t, int)>
      fn;
  bool has_op = false;
  bool has_root = false;
};

const size_t kCounts2[2] = {4, 4};
const size_t kDispls2[2] = {0, 4};

std::vector<Call> allCalls() {
  return {
      {"chorusAllReduce",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t op, int) {
         return chorusAllReduce(s, r, n, d, op, c, nullptr);
       },
       true, false},
      {"chorusBroadcast",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int root) {
         return chorusBroadcast(s, r, n, d, root, c, nullptr);
       },
       false, true},
      {"chorusReduce",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t op, int root) {
         return chorusReduce(s, r, n, d, op, root, c, nullptr);
       },
       true, true},
      {"chorusAllGather",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int) {
         return chorusAllGather(s, r, n, d, c, nullptr);
       }},
      {"chorusReduceScatter",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t op, int) {
         return chorusReduceScatter(s, r, n, d, op, c, nullptr);
       },
       true, false},
      {"chorusAllToAll",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int) {
         return chorusAllToAll(s, r, n, d, c, nullptr);
       }},
      {"chorusAllGatherV",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int) {
         const size_t counts[2] = {n, n}, displs[2] = {0, n};
         return chorusAllGatherV(s, n, r, counts, displs, d, c, nullptr);
       }},
      {"chorusAllToAllV",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int) {
         const size_t counts[2] = {n, n}, displs[2] = {0, n};
         return chorusAllToAllV(s, counts, displs, r, counts, displs, d, c, nullptr);
       }},
      {"chorusGather",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int root) {
         return chorusGather(s, r, n, d, root, c, nullptr);
       },
       false, true},
      {"chorusScatter",
       [](chorusComm_t c, const void* s, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int root) {
         return chorusScatter(s, r, n, d, root, c, nullptr);
       },
       false, true},
      {"chorusSend",
       [](chorusComm_t c, const void* s, void*, size_t n, chorusDataType_t d, chorusRedOp_t, int root) {
         return chorusSend(s, n, d, root == 0 ? 1 : root, c, nullptr);
       }},
      {"chorusRecv",
       [](chorusComm_t c, const void*, void* r, size_t n, chorusDataType_t d, chorusRedOp_t, int root) {
         return chorusRecv(r, n, d, root == 0 ? 1 : root, c, nullptr);
       }},
  };
}

bool readsSend(const std::string& name) { return name != "chorusRecv"; }
bool writesRecv(const std::string& name) { return name != "chorusSend"; }

TEST_F(ApiErrors, NullBuffersWithPositiveCount) {
  for (const Call& c : allCalls()) {
    SCOPED_TRACE(c.name);
    const std::string name = c.name;
    // Every array collective needs at most 2 x count elements here; v-ones
    // reach 2 x 4 = 8 too, so the messages name count 4 or its total 8.
    if (readsSend(name)) {
      EXPECT_TRUE(failsWith(c.fn(comm_[0], nullptr, buf2_, 4, chorusFloat32, chorusSum, 0), chorusInvalidArgument,
                            comm_[0], {name + ":", "sendbuff", "is NULL but count is"}));
    }
    if (writesRecv(name)) {
      EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, nullptr, 4, chorusFloat32, chorusSum, 0), chorusInvalidArgument,
                            comm_[0], {name + ":", "recvbuff", "is NULL but count is"}));
    }
  }
  // The exact wording, for one case of each shape.
  EXPECT_TRUE(failsWith(chorusAllReduce(nullptr, buf_, 4, chorusFloat32, chorusSum, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"chorusAllReduce: sendbuff is NULL but count is 4"}));
  EXPECT_TRUE(failsWith(chorusBroadcast(nullptr, buf_, 4, chorusFloat32, 0, comm_[0], nullptr), chorusInvalidArgument,
                        comm_[0], {"sendbuff (at the root) is NULL but count is 4"}));
  EXPECT_TRUE(failsWith(chorusAllGatherV(buf_, 4, nullptr, kCounts2, kDispls2, chorusFloat32, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"recvbuff is NULL but count is 8"}));
  // Count 0 with NULL buffers is fine (and runs: both ranks must call it).
}

TEST_F(ApiErrors, NullBuffersOffTheRootAreAllowedOnlyWhereUnused) {
  // At a non-root, the broadcast send, reduce recv, gather recv and scatter
  // send are not read: NULL passes validation.  Not issued here (that would
  // need the other rank), so only the root-side refusals are checked.
  EXPECT_TRUE(failsWith(chorusReduce(buf_, nullptr, 4, chorusFloat32, chorusSum, 0, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"recvbuff (at the root) is NULL but count is 4"}));
  EXPECT_TRUE(failsWith(chorusGather(buf_, nullptr, 4, chorusFloat32, 0, comm_[0], nullptr), chorusInvalidArgument,
                        comm_[0], {"recvbuff (at the root) is NULL"}));
  EXPECT_TRUE(failsWith(chorusScatter(nullptr, buf_, 4, chorusFloat32, 0, comm_[0], nullptr), chorusInvalidArgument,
                        comm_[0], {"sendbuff (at the root) is NULL"}));
}

TEST_F(ApiErrors, InvalidDataType) {
  for (const Call& c : allCalls()) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, buf2_, 4, kBadType99, chorusSum, 0), chorusInvalidArgument, comm_[0],
                          {std::string(c.name) + ":", "datatype=99"}));
    EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, buf2_, 4, kBadTypeNeg, chorusSum, 0), chorusInvalidArgument, comm_[0],
                          {"datatype=-1"}));
    EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, buf2_, 4, chorusNumTypes, chorusSum, 0), chorusInvalidArgument,
                          comm_[0], {"datatype=12"}));
  }
}

TEST_F(ApiErrors, InvalidReductionOp) {
  for (const Call& c : allCalls()) {
    if (!c.has_op) continue;
    SCOPED_TRACE(c.name);
    for (int op : {99, -1, static_cast<int>(chorusNumOps)})
      EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, buf2_, 4, chorusFloat32, static_cast<chorusRedOp_t>(op), 0),
                            chorusInvalidArgument, comm_[0], {std::string(c.name) + ":", "op=" + std::to_string(op)}));
  }
  // A destroyed PreMulSum op, and one used with another dtype.
  float scalar = 0.5f;
  chorusRedOp_t op;
  ASSERT_EQ(chorusRedOpCreatePreMulSum(&op, &scalar, chorusFloat32, chorusScalarHostImmediate, comm_[0]),
            chorusSuccess);
  const std::string name = "op=" + std::to_string(static_cast<int>(op));
  EXPECT_TRUE(failsWith(chorusAllReduce(buf_, buf2_, 4, chorusFloat64, op, comm_[0], nullptr), chorusInvalidArgument,
                        comm_[0], {name, "float32"}));
  ASSERT_EQ(chorusRedOpDestroy(op, comm_[0]), chorusSuccess);
  for (const Call& c : allCalls()) {
    if (!c.has_op) continue;
    EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, buf2_, 4, chorusFloat32, op, 0), chorusInvalidArgument, comm_[0],
                          {name, "chorusRedOpCreatePreMulSum"}))
        << c.name;
  }
  EXPECT_TRUE(failsWith(chorusRedOpDestroy(op, comm_[0]), chorusInvalidArgument, comm_[0],
                        {"chorusRedOpDestroy: " + name}));
  EXPECT_TRUE(failsWith(chorusRedOpDestroy(static_cast<chorusRedOp_t>(99), comm_[0]), chorusInvalidArgument,
                        comm_[0], {"op=99"}));
  EXPECT_TRUE(failsWith(chorusRedOpDestroy(chorusSum, comm_[0]), chorusInvalidArgument, comm_[0], {"op=0"}));
  // Bad PreMulSum creation arguments.
  EXPECT_TRUE(failsWith(chorusRedOpCreatePreMulSum(nullptr, &scalar, chorusFloat32, chorusScalarHostImmediate,
                                                   comm_[0]),
                        chorusInvalidArgument, comm_[0], {"op is NULL"}));
  EXPECT_TRUE(failsWith(chorusRedOpCreatePreMulSum(&op, nullptr, chorusFloat32, chorusScalarHostImmediate, comm_[0]),
                        chorusInvalidArgument, comm_[0], {"scalar is NULL"}));
  EXPECT_TRUE(failsWith(chorusRedOpCreatePreMulSum(&op, &scalar, kBadType99, chorusScalarHostImmediate, comm_[0]),
                        chorusInvalidArgument, comm_[0], {"datatype=99"}));
  EXPECT_TRUE(failsWith(chorusRedOpCreatePreMulSum(&op, &scalar, chorusFloat32,
                                                   static_cast<chorusScalarResidence_t>(7), comm_[0]),
                        chorusInvalidArgument, comm_[0], {"residence=7"}));
}

TEST_F(ApiErrors, RootAndPeerOutOfRange) {
  for (const Call& c : allCalls()) {
    const std::string name = c.name;
    const bool p2p = name == "chorusSend" || name == "chorusRecv";
    if (!c.has_root && !p2p) continue;
    SCOPED_TRACE(name);
    const std::string what = p2p ? "peer=" : "root=";
    for (int v : {-1, 2, 5, INT32_MAX, INT32_MIN})
      EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, buf2_, 4, chorusFloat32, chorusSum, v), chorusInvalidArgument,
                            comm_[0], {name + ":", what + std::to_string(v), "2 ranks"}));
  }
  // Send/receive to self outside a group is a usage error naming the peer.
  EXPECT_TRUE(failsWith(chorusSend(buf_, 4, chorusFloat32, 0, comm_[0], nullptr), chorusInvalidUsage, comm_[0],
                        {"chorusSend", "peer=0", "chorusGroupStart"}));
  EXPECT_TRUE(failsWith(chorusRecv(buf_, 4, chorusFloat32, 0, comm_[0], nullptr), chorusInvalidUsage, comm_[0],
                        {"chorusRecv", "peer=0"}));
}

TEST_F(ApiErrors, ByteSizeOverflow) {
  // float is 4 bytes; the library's limit is 2^62 bytes in all.
  const size_t huge[] = {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 4 + 1, (size_t{1} << 60) + 1};
  for (const Call& c : allCalls()) {
    SCOPED_TRACE(c.name);
    for (size_t n : huge)
      EXPECT_TRUE(failsWith(c.fn(comm_[0], buf_, buf2_, n, chorusFloat32, chorusSum, 0), chorusInvalidArgument,
                            comm_[0], {std::string(c.name) + ":", "count=" + std::to_string(n), "overflows"}));
  }
  // Gather-type calls multiply by the rank count: 2^59+1 floats is fine for
  // an allreduce (2^61 bytes) but 2^62+8 bytes for an allgather on 2 ranks.
  const size_t edge = (size_t{1} << 59) + 1;
  for (auto fn : {+[](chorusComm_t c, const void* s, void* r, size_t n) {
                    return chorusAllGather(s, r, n, chorusFloat32, c, nullptr);
                  },
                  +[](chorusComm_t c, const void* s, void* r, size_t n) {
                    return chorusReduceScatter(s, r, n, chorusFloat32, chorusSum, c, nullptr);
                  },
                  +[](chorusComm_t c, const void* s, void* r, size_t n) {
                    return chorusAllToAll(s, r, n, chorusFloat32, c, nullptr);
                  }})
    EXPECT_TRUE(failsWith(fn(comm_[0], buf_, buf2_, edge), chorusInvalidArgument, comm_[0],
                          {"count=" + std::to_string(edge), "x2"}));
  // v-collectives check every entry of their count and displacement arrays.
  const size_t bad_counts[2] = {4, SIZE_MAX / 2}, bad_displs[2] = {0, SIZE_MAX};
  EXPECT_TRUE(failsWith(chorusAllGatherV(buf_, 4, buf2_, bad_counts, kDispls2, chorusFloat32, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"count=" + std::to_string(SIZE_MAX / 2)}));
  EXPECT_TRUE(failsWith(chorusAllGatherV(buf_, 4, buf2_, kCounts2, bad_displs, chorusFloat32, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"count=" + std::to_string(SIZE_MAX)}));
  EXPECT_TRUE(failsWith(chorusAllToAllV(buf_, kCounts2, kDispls2, buf2_, bad_counts, kDispls2, chorusFloat32,
                                        comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"count=" + std::to_string(SIZE_MAX / 2)}));
}

TEST_F(ApiErrors, VectorCollectiveArguments) {
  EXPECT_TRUE(failsWith(chorusAllGatherV(buf_, 4, buf2_, nullptr, kDispls2, chorusFloat32, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"recvcounts is NULL"}));
  EXPECT_TRUE(failsWith(chorusAllGatherV(buf_, 4, buf2_, kCounts2, nullptr, chorusFloat32, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"displs is NULL"}));
  EXPECT_TRUE(failsWith(chorusAllGatherV(buf_, 3, buf2_, kCounts2, kDispls2, chorusFloat32, comm_[0], nullptr),
                        chorusInvalidArgument, comm_[0], {"sendcount=3", "recvcounts[0]=4"}));
  for (int which = 0; which < 4; ++which) {
    const size_t* a[4] = {kCounts2, kDispls2, kCounts2, kDispls2};
    a[which] = nullptr;
    const char* names[4] = {"sendcounts is NULL", "sdispls is NULL", "recvcounts is NULL", "rdispls is NULL"};
    EXPECT_TRUE(failsWith(chorusAllToAllV(buf_, a[0], a[1], buf2_, a[2], a[3], chorusFloat32, comm_[0], nullptr),
                          chorusInvalidArgument, comm_[0], {names[which]}));
  }
  const size_t other[2] = {3, 4};
  EXPECT_TRUE(failsWith(chorusAllToAllV(buf_, kCounts2, kDispls2, buf2_, other, kDispls2, chorusFloat32, comm_[0],
                                        nullptr),
                        chorusInvalidArgument, comm_[0], {"sendcounts[0]=4", "recvcounts[0]=3"}));
  EXPECT_TRUE(failsWith(chorusAllToAllV(buf_, kCounts2, kDispls2, buf_, kCounts2, kDispls2, chorusFloat32, comm_[0],
                                        nullptr),
                        chorusInvalidUsage, comm_[0], {"in-place"}));
}

TEST_F(ApiErrors, NullOutParameters) {
  int v;
  EXPECT_TRUE(failsWith(chorusCommCount(comm_[0], nullptr), chorusInvalidArgument, comm_[0], {"count is NULL"}));
  EXPECT_TRUE(failsWith(chorusCommUserRank(comm_[0], nullptr), chorusInvalidArgument, comm_[0], {"rank is NULL"}));
  EXPECT_TRUE(failsWith(chorusCommGetAsyncError(comm_[0], nullptr), chorusInvalidArgument, nullptr,
                        {"asyncError is NULL"}));
  EXPECT_TRUE(failsWith(chorusCommSplit(comm_[0], 0, 0, nullptr), chorusInvalidArgument, comm_[0],
                        {"newcomm is NULL"}));
  EXPECT_TRUE(failsWith(chorusGetUniqueId(nullptr), chorusInvalidArgument, nullptr, {"uniqueId is NULL"}));
  EXPECT_TRUE(failsWith(chorusStreamCreate(nullptr), chorusInvalidArgument, nullptr, {"stream is NULL"}));
  EXPECT_TRUE(failsWith(chorusStreamDestroy(nullptr), chorusInvalidArgument, nullptr, {"stream is NULL"}));
  EXPECT_TRUE(failsWith(chorusGetVersion(nullptr), chorusInvalidArgument, nullptr, {"version is NULL"}));
  ASSERT_EQ(chorusCommCount(comm_[0], &v), chorusSuccess);
  EXPECT_EQ(v, 2);
}

// Every entry point that takes a communicator, with the given handle.
std::vector<std::pair<std::string, std::function<chorusResult_t()>>> everyCommCall(chorusComm_t comm, float* b) {
  static const size_t counts[1] = {1}, displs[1] = {0};
  return {
      {"chorusAllReduce", [=] { return chorusAllReduce(b, b, 1, chorusFloat32, chorusSum, comm, nullptr); }},
      {"chorusBroadcast", [=] { return chorusBroadcast(b, b, 1, chorusFloat32, 0, comm, nullptr); }},
      {"chorusReduce", [=] { return chorusReduce(b, b, 1, chorusFloat32, chorusSum, 0, comm, nullptr); }},
      {"chorusAllGather", [=] { return chorusAllGather(b, b, 1, chorusFloat32, comm, nullptr); }},
      {"chorusReduceScatter", [=] { return chorusReduceScatter(b, b, 1, chorusFloat32, chorusSum, comm, nullptr); }},
      {"chorusAllToAll", [=] { return chorusAllToAll(b, b, 1, chorusFloat32, comm, nullptr); }},
      {"chorusAllGatherV",
       [=] { return chorusAllGatherV(b, 1, b, counts, displs, chorusFloat32, comm, nullptr); }},
      {"chorusAllToAllV",
       [=] { return chorusAllToAllV(b, counts, displs, b + 1, counts, displs, chorusFloat32, comm, nullptr); }},
      {"chorusGather", [=] { return chorusGather(b, b, 1, chorusFloat32, 0, comm, nullptr); }},
      {"chorusScatter", [=] { return chorusScatter(b, b, 1, chorusFloat32, 0, comm, nullptr); }},
      {"chorusSend", [=] { return chorusSend(b, 1, chorusFloat32, 0, comm, nullptr); }},
      {"chorusRecv", [=] { return chorusRecv(b, 1, chorusFloat32, 0, comm, nullptr); }},
      {"chorusBarrier", [=] { return chorusBarrier(comm, nullptr); }},
      {"chorusCommCount",
       [=] {
         int v;
         return chorusCommCount(comm, &v);
       }},
      {"chorusCommUserRank",
       [=] {
         int v;
         return chorusCommUserRank(comm, &v);
       }},
      {"chorusCommSplit",
       [=] {
         chorusComm_t n;
         return chorusCommSplit(comm, 0, 0, &n);
       }},
      {"chorusRedOpCreatePreMulSum",
       [=] {
         chorusRedOp_t op;
         return chorusRedOpCreatePreMulSum(&op, b, chorusFloat32, chorusScalarHostImmediate, comm);
       }},
      {"chorusRedOpDestroy", [=] { return chorusRedOpDestroy(static_cast<chorusRedOp_t>(chorusNumOps), comm); }},
  };
}

TEST_F(ApiErrors, NullCommunicator) {
  for (auto& [name, call] : everyCommCall(nullptr, buf_))
    EXPECT_TRUE(failsWith(call(), chorusInvalidArgument, nullptr, {name + ":", "comm is NULL"})) << name;
  chorusResult_t e;
  EXPECT_TRUE(failsWith(chorusCommGetAsyncError(nullptr, &e), chorusInvalidArgument, nullptr, {"comm is NULL"}));
  EXPECT_TRUE(failsWith(chorusCommDestroy(nullptr), chorusInvalidArgument, nullptr, {"comm is NULL"}));
  EXPECT_TRUE(failsWith(chorusCommAbort(nullptr), chorusInvalidArgument, nullptr, {"comm is NULL"}));
}

TEST_F(ApiErrors, DestroyedCommunicator) {
  chorusComm_t c = soloComm();
  ASSERT_NE(c, nullptr) << chorusGetLastError(nullptr);
  ASSERT_EQ(chorusCommDestroy(c), chorusSuccess);
  // No communicator is created between here and the end, so the freed
  // address cannot be reused by a live one.
  for (auto& [name, call] : everyCommCall(c, buf_))
    EXPECT_TRUE(failsWith(call(), chorusInvalidUsage, c, {name + ":", "not a live communicator"})) << name;
  chorusResult_t e;
  EXPECT_TRUE(failsWith(chorusCommGetAsyncError(c, &e), chorusInvalidUsage, c, {"not a live communicator"}));
  EXPECT_TRUE(failsWith(chorusCommAbort(c), chorusInvalidUsage, c, {"not a live communicator"}));
  EXPECT_TRUE(failsWith(chorusCommDestroy(c), chorusInvalidUsage, c, {"destroyed twice"}));
}

TEST_F(ApiErrors, AbortedCommunicator) {
  chorusComm_t c = soloComm();
  ASSERT_NE(c, nullptr) << chorusGetLastError(nullptr);
  // An earlier error leaves a message on the communicator; the abort
  // refusals below must replace it, not hide behind it.
  EXPECT_TRUE(failsWith(chorusBroadcast(buf_, buf_, 1, chorusFloat32, 7, c, nullptr), chorusInvalidArgument, c,
                        {"root=7"}));
  ASSERT_EQ(chorusCommAbort(c), chorusSuccess);
  EXPECT_EQ(chorusCommAbort(c), chorusSuccess);  // idempotent
  for (auto& [name, call] : everyCommCall(c, buf_))
    EXPECT_TRUE(failsWith(call(), chorusInvalidUsage, c, {name + ":", "aborted"})) << name;
  chorusResult_t e = chorusSuccess;
  ASSERT_EQ(chorusCommGetAsyncError(c, &e), chorusSuccess);
  EXPECT_EQ(e, chorusAborted);
  EXPECT_NE(std::string(chorusGetLastError(c)).find("aborted"), std::string::npos) << chorusGetLastError(c);
  EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
}

TEST_F(ApiErrors, GroupEndWithoutStart) {
  EXPECT_TRUE(failsWith(chorusGroupEnd(), chorusInvalidUsage, nullptr, {"chorusGroupEnd", "chorusGroupStart"}));
  // Balanced nesting still works afterwards, and an empty group is fine.
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  EXPECT_EQ(chorusGroupEnd(), chorusSuccess);
  EXPECT_EQ(chorusGroupEnd(), chorusSuccess);
  EXPECT_EQ(chorusGroupEnd(), chorusInvalidUsage);
  // A refused call inside a group is not queued: the group issues nothing.
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  EXPECT_EQ(chorusAllReduce(buf_, buf_, 4, kBadType99, chorusSum, comm_[0], nullptr), chorusInvalidArgument);
  EXPECT_EQ(chorusGroupEnd(), chorusSuccess);
  // A group holding an operation of a communicator destroyed before the end
  // reports it at chorusGroupEnd instead of touching freed memory.
  chorusComm_t c = soloComm();
  ASSERT_NE(c, nullptr) << chorusGetLastError(nullptr);
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  ASSERT_EQ(chorusAllReduce(buf_, buf_, 4, chorusFloat32, chorusSum, c, nullptr), chorusSuccess);
  ASSERT_EQ(chorusCommDestroy(c), chorusSuccess);
  EXPECT_TRUE(failsWith(chorusGroupEnd(), chorusInvalidUsage, nullptr, {"chorusGroupEnd", "not a live communicator"}));
}

TEST(ApiInit, BadArguments) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusComm_t c = reinterpret_cast<chorusComm_t>(0x1);
  EXPECT_TRUE(failsWith(chorusCommInitRank(nullptr, 1, id, 0), chorusInvalidArgument, nullptr, {"comm is NULL"}));
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 0, id, 0), chorusInvalidArgument, nullptr, {"nranks=0"}));
  EXPECT_EQ(c, nullptr);  // cleared on failure
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, -3, id, 0), chorusInvalidArgument, nullptr, {"nranks=-3"}));
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 2, id, 2), chorusInvalidArgument, nullptr, {"rank=2", "nranks=2"}));
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 2, id, 5), chorusInvalidArgument, nullptr, {"rank=5"}));
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 2, id, -1), chorusInvalidArgument, nullptr, {"rank=-1"}));

  // Corrupted ids: each is refused before any connection is attempted.
  chorusUniqueId zero{};
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 1, zero, 0), chorusInvalidArgument, nullptr,
                        {"chorusCommInitRank", "unique id", "magic"}));
  chorusUniqueId bad = id;
  bad.internal[0] ^= 0x20;
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 1, bad, 0), chorusInvalidArgument, nullptr, {"unique id"}));
  bad = id;
  bad.internal[CHORUS_UNIQUE_ID_BYTES - 1] = 0x5a;
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 1, bad, 0), chorusInvalidArgument, nullptr, {"unique id"}));
  bad = id;
  bad.internal[8] = 9;  // version
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 1, bad, 0), chorusInvalidArgument, nullptr, {"unique id", "version 9"}));
  bad = id;
  bad.internal[12] = bad.internal[13] = 0;  // port
  EXPECT_TRUE(failsWith(chorusCommInitRank(&c, 1, bad, 0), chorusInvalidArgument, nullptr, {"port 0"}));

  // The intact id still works (and its reserved port is adopted).
  ASSERT_EQ(chorusCommInitRank(&c, 1, id, 0), chorusSuccess) << chorusGetLastError(nullptr);
  EXPECT_EQ(chorusCommDestroy(c), chorusSuccess);
}

// Two ranks disagree on nranks.  Both must fail, naming the two values, and
// within the (shortened) timeout rather than hang.
TEST(ApiInit, MismatchedRankCounts) {
  chorus::Config cfg;
  cfg.timeout = std::chrono::milliseconds(5000);
  for (auto [n0, n1_] : {std::pair{2, 3}, std::pair{3, 2}}) {
    const int n1 = n1_;  // a copy the thread's lambda can capture (clang 14 cannot capture a structured binding)
    SCOPED_TRACE(testing::Message() << "rank 0 nranks=" << n0 << ", rank 1 nranks=" << n1);
    chorusUniqueId id;
    ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
    chorusComm_t c[2] = {nullptr, nullptr};
    chorusResult_t rc[2];
    std::string msg[2];
    const auto start = std::chrono::steady_clock::now();
    std::thread t([&] {
      rc[1] = chorus::api::commInitRank(&c[1], n1, id, 1, cfg);
      msg[1] = chorusGetLastError(nullptr);
    });
    rc[0] = chorus::api::commInitRank(&c[0], n0, id, 0, cfg);
    msg[0] = chorusGetLastError(nullptr);
    t.join();
    const auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(rc[r], chorusSuccess) << "rank " << r << " initialised";
      if (c[r]) chorusCommDestroy(c[r]);
    }
    // At least one rank names both values; the other may instead see the
    // first one's store go away (a remote error), but not hang.
    bool named = false;
    for (int r = 0; r < 2; ++r)
      named |= msg[r].find("nranks=" + std::to_string(n0)) != std::string::npos &&
               msg[r].find("nranks=" + std::to_string(n1)) != std::string::npos;
    EXPECT_TRUE(named) << "rank 0: " << msg[0] << "\nrank 1: " << msg[1];
    EXPECT_TRUE(rc[0] == chorusInvalidUsage || rc[0] == chorusMismatch) << rc[0] << ": " << msg[0];
    EXPECT_LT(secs, 10.0) << "rank 0: " << msg[0] << "\nrank 1: " << msg[1];
  }
}

// A rank that never starts: the others time out naming how many joined, the
// missing rank and the store's address, not a store key.
TEST(ApiInit, ARankThatNeverStartsIsNamed) {
  chorus::Config rank0_cfg;
  rank0_cfg.timeout = std::chrono::milliseconds(1500);
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusComm_t c[2] = {nullptr, nullptr};
  chorusResult_t rc[2];
  std::string msg[2];
  // Rank 1 gives up first (700 ms), while rank 0's rendezvous store still
  // serves it: with the same timeout, rank 0 (the store's host) could leave
  // first and close the store under rank 1's pending request, which then
  // fails as a closed connection instead of a timeout (seen under TSan).
  std::thread t([&] {
    chorusConfig_t cfg = CHORUS_CONFIG_INITIALIZER;
    cfg.timeoutMs = 700;
    rc[1] = chorusCommInitRankConfig(&c[1], 3, id, 1, &cfg);
    msg[1] = chorusGetLastError(nullptr);
  });
  rc[0] = chorus::api::commInitRank(&c[0], 3, id, 0, rank0_cfg);  // rank 2 never calls
  msg[0] = chorusGetLastError(nullptr);
  t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rc[r], chorusTimeout) << msg[r];
    if (c[r]) chorusCommDestroy(c[r]);
  }
  EXPECT_NE(msg[0].find("2 of 3 ranks joined within"), std::string::npos) << msg[0];
  EXPECT_NE(msg[0].find("rank(s) 2 never reached the rendezvous store"), std::string::npos) << msg[0];
  EXPECT_NE(msg[0].find("did they start?"), std::string::npos) << msg[0];
}

TEST(ApiInfo, ErrorStringsAndVersion) {
  std::set<std::string> seen;
  for (int r = 0; r < chorusNumResults; ++r) {
    std::string s = chorusGetErrorString(static_cast<chorusResult_t>(r));
    EXPECT_FALSE(s.empty()) << r;
    EXPECT_EQ(s.find("unknown"), std::string::npos) << r << ": " << s;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(chorusNumResults)) << "two codes share a string";
  EXPECT_STREQ(chorusGetErrorString(chorusSuccess), "no error");
  EXPECT_STREQ(chorusGetErrorString(chorusInvalidArgument), "invalid argument");
  for (int r : {static_cast<int>(chorusNumResults), -1, 1000})
    EXPECT_STREQ(chorusGetErrorString(static_cast<chorusResult_t>(r)), "unknown chorusResult_t") << r;
  int v = 0;
  ASSERT_EQ(chorusGetVersion(&v), chorusSuccess);
  EXPECT_EQ(v, CHORUS_VERSION_CODE);
  EXPECT_EQ(v, CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH);
  EXPECT_NE(chorusGetLastError(nullptr), nullptr);
}

}  // namespace
