// The primitives layer (src/prim): a primitive registered by a test runs
// through the C API; the built-in alltoallv_dynamic (MoE dispatch's
// communication) against a reference computed here; bad calls are refused
// naming the problem, and a refused call leaves the communicator usable.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "prim/primitive.hpp"
#include "support/rank_threads.hpp"

namespace chorus::testing {
namespace {

// Elements rank `src` sends to rank `dst`: a count that differs per pair
// (zero for some), and values that name the pair and the index.
size_t pairCount(int src, int dst) { return static_cast<size_t>((src * 7 + dst * 3) % 5) * 3; }
double pairValue(int src, int dst, size_t i) { return src * 1e6 + dst * 1e3 + static_cast<double>(i); }

std::string dispatch(int r, chorusComm_t c, chorusStream_t stream) {
  int n = 0;
  chorusCommCount(c, &n);
  std::vector<size_t> sc(static_cast<size_t>(n));
  std::vector<double> send;
  for (int d = 0; d < n; ++d) {
    sc[static_cast<size_t>(d)] = pairCount(r, d);
    for (size_t i = 0; i < sc[static_cast<size_t>(d)]; ++i) send.push_back(pairValue(r, d, i));
  }
  size_t expect_total = 0;
  for (int s = 0; s < n; ++s) expect_total += pairCount(s, r);
  std::vector<double> recv(expect_total + 5, -1.0);
  std::vector<size_t> rc(static_cast<size_t>(n), 999);
  chorusPrimitiveArgs_t a = CHORUS_PRIMITIVE_ARGS_INITIALIZER;
  a.sendbuff = send.data();
  a.recvbuff = recv.data();
  a.count = recv.size();
  a.datatype = chorusFloat64;
  a.counts = sc.data();
  a.ncounts = sc.size();
  a.outCounts = rc.data();
  a.nOutCounts = rc.size();
  if (chorusPrimitive("alltoallv_dynamic", &a, c, stream) != chorusSuccess) return chorusGetLastError(c);
  size_t at = 0;
  for (int s = 0; s < n; ++s) {
    if (rc[static_cast<size_t>(s)] != pairCount(s, r))
      return fmt::format("rank {}: {} elements from rank {}, expected {}", r, rc[static_cast<size_t>(s)], s, pairCount(s, r));
    for (size_t i = 0; i < pairCount(s, r); ++i, ++at)
      if (recv[at] != pairValue(s, r, i)) return fmt::format("rank {}: recv[{}]={} expected {}", r, at, recv[at], pairValue(s, r, i));
  }
  for (size_t i = at; i < recv.size(); ++i)
    if (recv[i] != -1.0) return fmt::format("rank {}: recv[{}] past the data was written", r, i);
  return "";
}

class DynamicAllToAll : public ::testing::TestWithParam<int> {};
TEST_P(DynamicAllToAll, MatchesTheReference) {
  auto msgs = runRanks(GetParam(), [](int r, chorusComm_t c) { return dispatch(r, c, nullptr); });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Ranks, DynamicAllToAll, ::testing::Values(1, 2, 3, 4, 5));

// On a stream: the primitive waits for the stream's queued allreduce first.
TEST(Primitive, OnAStreamAfterQueuedWork) {
  auto msgs = runRanks(3, [](int r, chorusComm_t c) -> std::string {
    chorusStream_t s = nullptr;
    chorusStreamCreate(&s);
    std::vector<float> x(1000, 1.0f);
    if (chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, c, s) != chorusSuccess)
      return chorusGetLastError(c);
    std::string err = dispatch(r, c, s);
    if (err.empty() && x[999] != 3.0f) err = fmt::format("rank {}: the queued allreduce gave {}", r, x[999]);
    chorusStreamDestroy(s);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}

// A receive that would overflow fails on every rank before any data moves;
// the overflowing rank names itself; the communicator keeps working.
TEST(Primitive, OverflowIsRefusedOnEveryRankAndTheCommunicatorGoesOn) {
  auto msgs = runRanks(3, [](int r, chorusComm_t c) -> std::string {
    std::vector<size_t> sc = {4, 4, 4}, rc(3);
    std::vector<int32_t> send(12, r), recv(r == 1 ? 5 : 12, -7);
    chorusPrimitiveArgs_t a = CHORUS_PRIMITIVE_ARGS_INITIALIZER;
    a.sendbuff = send.data(), a.recvbuff = recv.data(), a.count = recv.size(), a.datatype = chorusInt32;
    a.counts = sc.data(), a.ncounts = 3, a.outCounts = rc.data(), a.nOutCounts = 3;
    if (chorusPrimitive("alltoallv_dynamic", &a, c, nullptr) != chorusInvalidArgument)
      return fmt::format("rank {}: an overflowing receive was not refused", r);
    const std::string msg = chorusGetLastError(c);
    if (msg.find(r == 1 ? "arrive at rank 1" : "rank 1's receive") == std::string::npos)
      return fmt::format("rank {}: message does not name rank 1: {}", r, msg);
    for (int32_t v : recv)
      if (v != -7) return fmt::format("rank {}: data moved although the call was refused", r);
    return dispatch(r, c, nullptr);
  });
  EXPECT_EQ(failures(msgs), "");
}

// A primitive registered here, not in src/: allreduce, then local work (each
// element becomes sum / size + rank), through the C API.
class MeanPlusRank final : public prim::Primitive {
 public:
  std::string_view name() const override { return "test.mean_plus_rank"; }
  std::string_view summary() const override { return "allreduce sum of sendbuff into recvbuff (float32), / size + rank"; }
  Status run(prim::Context& ctx, const prim::Args& a) const override {
    if (a.dtype != chorusFloat32) return invalidArgument("datatype must be chorusFloat32");
    CHORUS_RETURN_IF_ERROR(ctx.allReduce(a.send, a.recv, a.count, a.dtype, chorusSum));
    auto* out = static_cast<float*>(a.recv);
    for (size_t i = 0; i < a.count; ++i) out[i] = out[i] / static_cast<float>(ctx.size()) + static_cast<float>(ctx.rank());
    return {};
  }
};

TEST(Primitive, ARegisteredPrimitiveRunsThroughTheCApi) {
  static const bool added = prim::registry().add(std::make_unique<MeanPlusRank>()).isOk();
  ASSERT_TRUE(added);
  EXPECT_FALSE(prim::registry().add(std::make_unique<MeanPlusRank>()).isOk());  // a name is taken once
  size_t needed = 0;
  ASSERT_EQ(chorusPrimitiveList(nullptr, 0, &needed), chorusSuccess);
  std::string list(needed, '\0');
  ASSERT_EQ(chorusPrimitiveList(list.data(), list.size(), nullptr), chorusSuccess);
  EXPECT_NE(list.find("test.mean_plus_rank: allreduce"), std::string::npos) << list;
  EXPECT_NE(list.find("alltoallv_dynamic: "), std::string::npos) << list;
  auto msgs = runRanks(4, [](int r, chorusComm_t c) -> std::string {
    std::vector<float> in(33), out(33);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r * 10 + i);
    chorusPrimitiveArgs_t a = CHORUS_PRIMITIVE_ARGS_INITIALIZER;
    a.sendbuff = in.data(), a.recvbuff = out.data(), a.count = in.size(), a.datatype = chorusFloat32;
    if (chorusPrimitive("test.mean_plus_rank", &a, c, nullptr) != chorusSuccess) return chorusGetLastError(c);
    for (size_t i = 0; i < out.size(); ++i) {
      const float sum = (0 + 10 + 20 + 30) + 4.0f * static_cast<float>(i);
      if (out[i] != sum / 4 + static_cast<float>(r)) return fmt::format("rank {}: out[{}]={}", r, i, out[i]);
    }
    // The primitive's own check, named with the primitive.
    a.datatype = chorusInt32;
    if (chorusPrimitive("test.mean_plus_rank", &a, c, nullptr) != chorusInvalidArgument) return "int32 accepted";
    if (std::string(chorusGetLastError(c)).find("test.mean_plus_rank: datatype") == std::string::npos)
      return std::string("message: ") + chorusGetLastError(c);
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

TEST(Primitive, BadCallsAreRefusedNamingTheProblem) {
  auto msgs = runRanks(2, [](int r, chorusComm_t c) -> std::string {
    chorusPrimitiveArgs_t a = CHORUS_PRIMITIVE_ARGS_INITIALIZER;
    auto expect = [&](chorusResult_t got, chorusResult_t want, const char* needle) -> std::string {
      if (got != want) return fmt::format("rank {}: {} gave {}", r, needle, static_cast<int>(got));
      if (std::string(chorusGetLastError(c)).find(needle) == std::string::npos)
        return fmt::format("rank {}: '{}' not in: {}", r, needle, chorusGetLastError(c));
      return "";
    };
    std::string e;
    if (e = expect(chorusPrimitive("no_such", &a, c, nullptr), chorusInvalidArgument, "registered: "); !e.empty()) return e;
    if (e = expect(chorusPrimitive(nullptr, &a, c, nullptr), chorusInvalidArgument, "name is NULL"); !e.empty()) return e;
    if (e = expect(chorusPrimitive("alltoallv_dynamic", nullptr, c, nullptr), chorusInvalidArgument, "args is NULL"); !e.empty()) return e;
    chorusPrimitiveArgs_t small = a;
    small.size = 16;
    if (e = expect(chorusPrimitive("alltoallv_dynamic", &small, c, nullptr), chorusInvalidArgument, "args->size=16"); !e.empty()) return e;
    size_t one = 1;
    chorusPrimitiveArgs_t half = a;
    half.counts = &one;
    if (e = expect(chorusPrimitive("alltoallv_dynamic", &half, c, nullptr), chorusInvalidArgument, "ncounts"); !e.empty()) return e;
    chorusGroupStart();
    const chorusResult_t in_group = chorusPrimitive("alltoallv_dynamic", &a, c, nullptr);
    chorusGroupEnd();
    if (e = expect(in_group, chorusInvalidUsage, "group"); !e.empty()) return e;
    if (chorusPrimitive("alltoallv_dynamic", &a, nullptr, nullptr) != chorusInvalidArgument) return "NULL comm accepted";
    return "";
  });
  EXPECT_EQ(failures(msgs), "");
}

}  // namespace
}  // namespace chorus::testing
