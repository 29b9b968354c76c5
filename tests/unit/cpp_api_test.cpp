// The C++ API (include/chorus/chorus.hpp): typed collectives, span size
// checks, groups, streams and Work, split, move semantics, the 2-byte float
// wrappers.  Ranks are threads, each with its own chorus::Communicator.
#include <chorus/chorus.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

// Internal, header-only and free of the library's classes: the reference for
// the wrappers' conversions.
#include "kernels/convert.hpp"

namespace {

using chorus::Code;
using chorus::Communicator;
using chorus::RedOp;
using chorus::Status;

static_assert(!std::is_copy_constructible_v<Communicator> && !std::is_copy_assignable_v<Communicator>);
static_assert(std::is_nothrow_move_constructible_v<Communicator> && std::is_nothrow_move_assignable_v<Communicator>);
static_assert(!std::is_copy_constructible_v<chorus::Stream> && std::is_nothrow_move_constructible_v<chorus::Stream>);
static_assert(!std::is_copy_constructible_v<chorus::Group> && !std::is_move_constructible_v<chorus::Group>);
static_assert(chorus::dataTypeOf<float> == chorus::DataType::Float32 &&
              chorus::dataTypeOf<int64_t> == chorus::DataType::Int64 &&
              chorus::dataTypeOf<chorus::bfloat16> == chorus::DataType::Bfloat16 &&
              chorus::dataTypeOf<chorus::float16> == chorus::DataType::Float16 &&
              chorus::dataTypeOf<uint8_t> == chorus::DataType::Uint8 &&
              chorus::dataTypeOf<std::byte> == chorus::DataType::Uint8);
static_assert(!chorus::Element<bool> && !chorus::Element<int16_t> && !chorus::Element<std::string>);

// Runs body(comm) on n threads, each with its own communicator from one
// UniqueId.  Returns the joined failure messages ("" = all ok).
// cfg: every communicator made with it (chorusCommInitRankConfig, adopted);
// nullptr: Communicator::initRank.
std::string runComms(int n, const std::function<std::string(Communicator&)>& body,
                     const chorusConfig_t* cfg = nullptr) {
  auto id = chorus::UniqueId::create();
  if (!id.ok()) return "UniqueId::create: " + id.status().toString();
  std::vector<std::string> msgs(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto comm = [&]() -> chorus::Result<Communicator> {
        if (cfg == nullptr) return Communicator::initRank(n, *id, r);
        chorusComm_t c = nullptr;
        if (chorusResult_t res = chorusCommInitRankConfig(&c, n, id->native(), r, cfg); res != chorusSuccess)
          return Status::fromC(res);
        return Communicator::adopt(c);
      }();
      if (!comm.ok()) {
        msgs[r] = "init: " + comm.status().toString();
        return;
      }
      msgs[r] = body(*comm);
      if (Status st = comm->destroy(); !st.ok() && msgs[r].empty()) msgs[r] = "destroy: " + st.toString();
    });
  for (auto& t : threads) t.join();
  std::string all;
  for (int r = 0; r < n; ++r)
    if (!msgs[r].empty()) all += "rank " + std::to_string(r) + ": " + msgs[r] + "\n";
  return all;
}

#define CHECK_OK(expr)                                                   \
  do {                                                                   \
    Status st_ = (expr);                                                 \
    if (!st_.ok()) return std::string(#expr ": ") + st_.toString();      \
  } while (0)
#define CHECK_THAT(cond, what)                                           \
  do {                                                                   \
    if (!(cond)) return std::string(#cond ": ") + (what);                \
  } while (0)

// The MoE dispatch's communication through the primitives layer
// (Communicator::allToAllVDynamic over chorusPrimitive): rank r sends r
// elements to rank 0, 1 to rank 1 and 2 to rank 2; each learns what arrived.
TEST(CppApi, AllToAllVDynamic) {
  EXPECT_EQ(runComms(3, [](Communicator& c) -> std::string {
              const int r = c.rank();
              std::vector<size_t> sc = {static_cast<size_t>(r), 1, 2}, rc(3);
              std::vector<int64_t> send(static_cast<size_t>(r) + 3), recv(16, -1);
              for (size_t i = 0; i < send.size(); ++i) send[i] = r * 100 + static_cast<int64_t>(i);
              CHECK_OK(c.allToAllVDynamic<int64_t>(send, sc, recv, rc));
              size_t at = 0;
              for (int s = 0; s < 3; ++s) {
                // What rank s sent to r: sc_s[r] elements, starting at its offset for r.
                const size_t count = r == 0 ? static_cast<size_t>(s) : static_cast<size_t>(r);
                const size_t offset = r == 0 ? 0 : (r == 1 ? static_cast<size_t>(s) : static_cast<size_t>(s) + 1);
                CHECK_THAT(rc[static_cast<size_t>(s)] == count, "rc[" + std::to_string(s) + "]=" + std::to_string(rc[static_cast<size_t>(s)]));
                for (size_t i = 0; i < count; ++i, ++at)
                  CHECK_THAT(recv[at] == s * 100 + static_cast<int64_t>(offset + i), "recv[" + std::to_string(at) + "]");
              }
              CHECK_THAT(recv[at] == -1, "past the data");
              // More than send holds: refused before the library is called.
              std::vector<size_t> too_many = {9, 9, 9};
              CHECK_THAT(c.allToAllVDynamic<int64_t>(send, too_many, recv, rc).code() == Code::InvalidArgument, "sizes");
              return "";
            }),
            "");
}

// chorus::ExpertParallel: 2 ranks, 4 experts (2 each), top-2, hidden 3,
// bf16 payload: the layout's counts, dispatch's grouping, combine's weighted
// sum (exact here: small integers and powers of two), the refusals.
TEST(CppApi, ExpertParallelDispatchCombine) {
  using chorus::bfloat16;
  EXPECT_EQ(runComms(2, [](Communicator& c) -> std::string {
              const int r = c.rank();
              auto epr = chorus::ExpertParallel<bfloat16, int64_t>::create(c, 4, 2, 3);
              CHECK_THAT(epr.ok(), "create: " + epr.status().toString());
              auto ep = std::move(*epr);
              CHECK_THAT(ep.numLocalExperts() == 2 && ep.numHosts() == 1, "info");
              // Token 0 -> experts {3, 0} (both ranks), token 1 -> {1, 0} (rank 0 only).
              std::vector<int64_t> ids = {3, 0, 1, 0};
              std::vector<float> w = {0.5f, 0.25f, 1.0f, 2.0f};
              std::vector<bfloat16> x(6);
              for (size_t i = 0; i < 6; ++i) x[i] = bfloat16(static_cast<float>(r * 10 + static_cast<int>(i)));
              auto lay = ep.layout(ids);
              CHECK_THAT(lay.ok(), "layout: " + lay.status().toString());
              CHECK_THAT(lay->tokensPerRank == std::vector<size_t>({2, 1}), "tokensPerRank");
              CHECK_THAT(lay->tokensPerHost == std::vector<size_t>({2}), "tokensPerHost");
              CHECK_THAT(lay->tokensPerExpert == std::vector<size_t>({2, 1, 0, 1}), "tokensPerExpert");
              // Rank 0 gets expert 0: 4 rows, expert 1: 2 rows; rank 1: expert 3: 2 rows.
              const std::vector<size_t> want_recv = r == 0 ? std::vector<size_t>{4, 2} : std::vector<size_t>{0, 2};
              CHECK_THAT(lay->recvPerExpert == want_recv, "recvPerExpert");
              auto order = ep.sendOrder();
              CHECK_THAT(order.ok() && *order == std::vector<size_t>({0, 1, 0}), "sendOrder");
              std::vector<bfloat16> rx(lay->numRecv * 3);
              std::vector<float> rw(lay->numRecv);
              // Too small a receive: refused on both ranks.
              std::vector<bfloat16> small(3);
              CHECK_THAT(ep.dispatch(x, w, std::span(small)).code() == Code::InvalidArgument || lay->numRecv <= 1,
                         "small recvX accepted");
              CHECK_OK(ep.dispatch(x, w, std::span(rx), std::span(rw)));
              if (r == 0) {
                // Expert 0: rank 0 token 0, token 1, rank 1 token 0, token 1.
                const float first[] = {0, 3, 10, 13, 3, 13};  // expert 0 rows' first element, then expert 1's
                for (size_t i = 0; i < 6; ++i)
                  CHECK_THAT(static_cast<float>(rx[i * 3]) == first[i], "recvX row " + std::to_string(i));
                CHECK_THAT(rw[0] == 0.25f && rw[1] == 2.0f && rw[4] == 1.0f, "recvWeights");
              }
              // Experts: identity.  out[t] = sum of the token's weights x x[t].
              std::vector<bfloat16> out(6);
              CHECK_OK(ep.combine(std::span<const bfloat16>(rx), rw, std::span(out)));
              for (size_t i = 0; i < 6; ++i) {
                const float want = static_cast<float>(x[i]) * (i < 3 ? 0.75f : 3.0f);
                CHECK_THAT(static_cast<float>(out[i]) == want, "out[" + std::to_string(i) + "]");
              }
              // A span of the wrong size is refused here, before the library.
              CHECK_THAT(ep.combine(std::span<const bfloat16>(rx), rw, std::span(out).first(3)).code() == Code::InvalidArgument,
                         "short out accepted");
              // A negative maxHostsPerToken is refused, naming the field.
              auto nl = chorus::ExpertParallel<float, int32_t>::create(c, 4, 2, 3, -1);
              CHECK_THAT(!nl.ok() && nl.status().message().find("config.maxHostsPerToken=-1") != std::string::npos,
                         "maxHostsPerToken=-1 accepted");
              return "";
            }),
            "");
}

// chorus::ExpertParallel's low-latency mode: 2 ranks, 4 experts, top-2,
// hidden 3, M = 3 tokens per rank.  Against the normal path on the same
// input: recvCount is the layout's recvPerExpert, expert e's rows sit at e x
// (2 x M) in the normal grouping's order, the combine is bit for bit the
// normal one; more tokens than M fail both ranks; a wrong span is refused here.
TEST(CppApi, ExpertParallelLowLatencyMatchesTheNormalPath) {
  EXPECT_EQ(runComms(2, [](Communicator& c) -> std::string {
              const int r = c.rank();
              constexpr size_t H = 3, M = 3, L = 2;
              auto normal = chorus::ExpertParallel<float, int32_t>::create(c, 4, 2, H);
              auto llr = chorus::ExpertParallel<float, int32_t>::create(c, 4, 2, H, 0, CHORUS_COMPRESS_OFF, -1, M);
              CHECK_THAT(normal.ok() && llr.ok(), "create: " + llr.status().toString());
              auto& ep = *normal;
              auto& ll = *llr;
              CHECK_THAT(ll.lowLatencyRows() == L * 2 * M, "lowLatencyRows");
              // Rank 0: 3 tokens, rank 1: 2 tokens (fewer than M).
              const std::vector<int32_t> ids = r == 0 ? std::vector<int32_t>{0, 3, 2, 1, 1, 0} : std::vector<int32_t>{3, 2, 0, 2};
              const size_t tokens = ids.size() / 2;
              std::vector<float> x(tokens * H), w(tokens * 2);
              for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i + 1) + static_cast<float>(r);
              for (size_t i = 0; i < w.size(); ++i) w[i] = 0.3f + 0.17f * static_cast<float>(i);
              auto lay = ep.layout(ids);
              CHECK_THAT(lay.ok(), "layout");
              std::vector<float> rx(lay->numRecv * H), rw(lay->numRecv);
              CHECK_OK(ep.dispatch(x, w, std::span(rx), std::span(rw)));
              std::vector<float> lx(ll.lowLatencyRows() * H, -7.0f), lw(ll.lowLatencyRows(), -7.0f);
              std::vector<size_t> count(L, 99);
              CHECK_OK(ll.lowLatencyDispatch(ids, x, w, std::span(lx), std::span(lw), std::span(count)));
              CHECK_THAT(count == lay->recvPerExpert, "recvCount is not the layout's recvPerExpert");
              size_t q = 0;  // the normal path's row
              for (size_t e = 0; e < L; ++e)
                for (size_t i = 0; i < count[e]; ++i, ++q) {
                  const size_t at = e * 2 * M + i;
                  CHECK_THAT(lw[at] == rw[q], "weight of row " + std::to_string(at));
                  for (size_t j = 0; j < H; ++j) CHECK_THAT(lx[at * H + j] == rx[q * H + j], "row " + std::to_string(at));
                }
              // Experts: row i scaled by (i + 1); the padding rows hold -7s that combine must not read.
              std::vector<float> y(rx.size()), ly(lx);
              q = 0;
              for (size_t e = 0; e < L; ++e)
                for (size_t i = 0; i < count[e]; ++i, ++q)
                  for (size_t j = 0; j < H; ++j) {
                    y[q * H + j] = rx[q * H + j] * static_cast<float>(q + 1);
                    ly[(e * 2 * M + i) * H + j] = y[q * H + j];
                  }
              std::vector<float> out(tokens * H), lout(tokens * H);
              CHECK_OK(ep.combine(std::span<const float>(y), rw, std::span(out)));
              CHECK_OK(ll.lowLatencyCombine(std::span<const float>(ly), lw, std::span(lout)));
              CHECK_THAT(std::memcmp(out.data(), lout.data(), out.size() * sizeof(float)) == 0, "combine differs");
              // A span of the wrong size: refused here, on this rank only.
              CHECK_THAT(ll.lowLatencyCombine(std::span<const float>(ly), lw, std::span(lout).first(H)).code() ==
                             Code::InvalidArgument, "short out accepted");
              // M + 1 tokens on rank 1: both ranks fail.
              std::vector<int32_t> many = ids;
              if (r == 1) many = {0, 1, 1, 2, 2, 3, 3, 0};
              std::vector<float> mx(many.size() / 2 * H, 1.0f);
              const Status over = ll.lowLatencyDispatch(many, mx, {}, std::span(lx), {}, std::span(count));
              CHECK_THAT(over.code() == Code::InvalidArgument, "overflow on rank 1 not refused here: " + over.toString());
              return "";
            }),
            "");
}

TEST(CppApi, AllReduceTyped) {
  const int n = 3;
  auto err = runComms(n, [&](Communicator& comm) -> std::string {
    const int r = comm.rank();
    CHECK_THAT(comm.size() == n, "size " + std::to_string(comm.size()));
    // float, in place.
    std::vector<float> f(1001);
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(r + i);
    CHECK_OK(comm.allReduce(std::span(f), RedOp::Sum).wait());
    for (size_t i = 0; i < f.size(); ++i)
      CHECK_THAT(f[i] == static_cast<float>(n * i + 3), "f[" + std::to_string(i) + "]=" + std::to_string(f[i]));
    // int64, out of place, values past 2^32.
    std::vector<int64_t> in(17), out(17, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = (int64_t{1} << 40) * (r + 1) + static_cast<int64_t>(i);
    CHECK_OK(comm.allReduce(std::span<const int64_t>(in), std::span(out), RedOp::Max).wait());
    for (size_t i = 0; i < out.size(); ++i)
      CHECK_THAT(out[i] == (int64_t{1} << 40) * n + static_cast<int64_t>(i), "int64 out[" + std::to_string(i) + "]");
    // bfloat16: small integers are exact.
    std::vector<chorus::bfloat16> b(64);
    for (size_t i = 0; i < b.size(); ++i) b[i] = chorus::bfloat16(static_cast<float>(i % 8 + r));
    CHECK_OK(comm.allReduce(std::span(b), RedOp::Sum).wait());
    for (size_t i = 0; i < b.size(); ++i)
      CHECK_THAT(static_cast<float>(b[i]) == static_cast<float>(n * (i % 8) + 3),
                 "bf16[" + std::to_string(i) + "]=" + std::to_string(static_cast<float>(b[i])));
    // float16 and double through Avg and Min.
    std::vector<chorus::float16> h(9, chorus::float16(static_cast<float>(2 * r)));
    CHECK_OK(comm.allReduce(std::span(h), RedOp::Avg).wait());
    for (auto v : h) CHECK_THAT(static_cast<float>(v) == 2.0f, "fp16 avg " + std::to_string(static_cast<float>(v)));
    std::vector<double> d(5, 1.5 + r);
    CHECK_OK(comm.allReduce(std::span(d), RedOp::Min).wait());
    for (double v : d) CHECK_THAT(v == 1.5, "double min " + std::to_string(v));
    return "";
  });
  EXPECT_EQ(err, "");
}

// Every other collective once, typed, checked against its definition.
TEST(CppApi, EveryCollective) {
  const int n = 3;
  auto err = runComms(n, [&](Communicator& comm) -> std::string {
    const int r = comm.rank();
    const size_t k = 5;
    auto val = [](int rank, size_t i) { return static_cast<int32_t>(100 * rank + static_cast<int>(i)); };
    std::vector<int32_t> mine(k);
    for (size_t i = 0; i < k; ++i) mine[i] = val(r, i);

    std::vector<int32_t> bc(k, r == 1 ? 7 : 0);
    CHECK_OK(comm.broadcast(std::span(bc), /*root=*/1).wait());
    for (int32_t v : bc) CHECK_THAT(v == 7, "broadcast");

    std::vector<int32_t> red(r == 2 ? k : 0);  // empty off the root
    CHECK_OK(comm.reduce(std::span<const int32_t>(mine), std::span(red), RedOp::Sum, /*root=*/2).wait());
    if (r == 2)
      for (size_t i = 0; i < k; ++i) CHECK_THAT(red[i] == val(0, i) + val(1, i) + val(2, i), "reduce");

    std::vector<int32_t> ag(k * n);
    CHECK_OK(comm.allGather(std::span<const int32_t>(mine), std::span(ag)).wait());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < k; ++i) CHECK_THAT(ag[q * k + i] == val(q, i), "allGather");

    std::vector<int32_t> rs(k), rsin(k * n);
    for (size_t i = 0; i < rsin.size(); ++i) rsin[i] = r + static_cast<int32_t>(i);
    CHECK_OK(comm.reduceScatter(std::span<const int32_t>(rsin), std::span(rs), RedOp::Sum).wait());
    for (size_t i = 0; i < k; ++i)
      CHECK_THAT(rs[i] == 3 + n * static_cast<int32_t>(r * k + i), "reduceScatter");

    std::vector<int32_t> a2a_in(2 * n), a2a_out(2 * n);
    for (int q = 0; q < n; ++q) a2a_in[2 * q] = a2a_in[2 * q + 1] = 10 * r + q;
    CHECK_OK(comm.allToAll(std::span<const int32_t>(a2a_in), std::span(a2a_out)).wait());
    for (int q = 0; q < n; ++q)
      CHECK_THAT(a2a_out[2 * q] == 10 * q + r && a2a_out[2 * q + 1] == 10 * q + r, "allToAll");

    // Rank q contributes q+1 elements, placed with a gap of one.
    std::vector<size_t> counts(n), displs(n);
    size_t off = 0;
    for (int q = 0; q < n; ++q) {
      counts[q] = static_cast<size_t>(q) + 1;
      displs[q] = off;
      off += counts[q] + 1;
    }
    std::vector<int32_t> agv_in(counts[r], 40 + r), agv_out(off, -1);
    CHECK_OK(comm.allGatherV(std::span<const int32_t>(agv_in), std::span(agv_out), counts, displs).wait());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < counts[q]; ++i) CHECK_THAT(agv_out[displs[q] + i] == 40 + q, "allGatherV");

    // allToAllV: rank r sends q+1 elements to rank q.
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t soff = 0, roff = 0;
    for (int q = 0; q < n; ++q) {
      sc[q] = static_cast<size_t>(q) + 1;
      sd[q] = soff;
      soff += sc[q];
      rc[q] = static_cast<size_t>(r) + 1;
      rd[q] = roff;
      roff += rc[q];
    }
    std::vector<int32_t> vin(soff), vout(roff, -1);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < sc[q]; ++i) vin[sd[q] + i] = 10 * r + q;
    CHECK_OK(comm.allToAllV(std::span<const int32_t>(vin), sc, sd, std::span(vout), rc, rd).wait());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < rc[q]; ++i) CHECK_THAT(vout[rd[q] + i] == 10 * q + r, "allToAllV");

    std::vector<int32_t> g(r == 0 ? k * n : 0);
    CHECK_OK(comm.gather(std::span<const int32_t>(mine), std::span(g), /*root=*/0).wait());
    if (r == 0)
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < k; ++i) CHECK_THAT(g[q * k + i] == val(q, i), "gather");

    std::vector<int32_t> sin(r == 1 ? k * n : 0), sout(k);
    if (r == 1) std::iota(sin.begin(), sin.end(), 0);
    CHECK_OK(comm.scatter(std::span<const int32_t>(sin), std::span(sout), /*root=*/1).wait());
    for (size_t i = 0; i < k; ++i) CHECK_THAT(sout[i] == static_cast<int32_t>(r * k + i), "scatter");

    CHECK_OK(comm.barrier().wait());
    return "";
  });
  EXPECT_EQ(err, "");
}

// A size mismatch is reported before the library is called: if the bad call
// had reached the library, the next collective would be mismatched across
// ranks (rank 0 issued one more) and would fail or return wrong data.
TEST(CppApi, SizeChecksDoNotCallTheLibrary) {
  const int n = 2;
  auto err = runComms(n, [&](Communicator& comm) -> std::string {
    std::vector<float> send(3, 1.0f), recv(5);
    if (comm.rank() == 0) {
      Status st = comm.allGather(std::span<const float>(send), std::span(recv)).wait();
      CHECK_THAT(st.code() == Code::InvalidArgument, st.toString());
      CHECK_THAT(st.message().find("allGather") != std::string::npos, st.message());
      CHECK_THAT(st.message().find("recv.size()=5") != std::string::npos, st.message());
      CHECK_THAT(st.message().find("send.size()=3") != std::string::npos, st.message());
      std::vector<int> a(4), b(3);
      st = comm.allReduce(std::span<const int>(a), std::span(b), RedOp::Sum).wait();
      CHECK_THAT(st.code() == Code::InvalidArgument && st.message().find("send.size()=4") != std::string::npos,
                 st.toString());
      st = comm.reduceScatter(std::span<const int>(a), std::span(b), RedOp::Sum).wait();
      CHECK_THAT(st.code() == Code::InvalidArgument, st.toString());
      st = comm.allToAll(std::span<const int>(b), std::span(b)).wait();  // 3 not a multiple of 2
      CHECK_THAT(st.code() == Code::InvalidArgument && st.message().find("multiple") != std::string::npos,
                 st.toString());
      std::vector<size_t> counts{3, 3}, displs{0, 3};
      st = comm.allGatherV(std::span<const float>(send), std::span(recv), counts, displs).wait();  // needs 6
      CHECK_THAT(st.code() == Code::InvalidArgument && st.message().find("recv.size()=5") != std::string::npos,
                 st.toString());
      std::vector<size_t> short_counts{3};
      st = comm.allGatherV(std::span<const float>(send), std::span(recv), short_counts, displs).wait();
      CHECK_THAT(st.code() == Code::InvalidArgument && st.message().find("recvcounts has 1 entries") != std::string::npos,
                 st.toString());
    }
    // Both ranks then run one correct allgather, which must match.
    std::vector<float> mine(3, static_cast<float>(comm.rank() + 1)), all(6);
    CHECK_OK(comm.allGather(std::span<const float>(mine), std::span(all)).wait());
    for (size_t i = 0; i < all.size(); ++i) CHECK_THAT(all[i] == static_cast<float>(i / 3 + 1), "allGather after");
    // Errors from the library come back with its message.
    Status st = comm.broadcast(std::span(all), /*root=*/5).wait();
    CHECK_THAT(st.code() == Code::InvalidArgument && st.message().find("root=5") != std::string::npos, st.toString());
    return "";
  });
  EXPECT_EQ(err, "");
}

TEST(CppApi, GroupOfSendRecvRing) {
  for (int n : {1, 2, 4}) {
    auto err = runComms(n, [&](Communicator& comm) -> std::string {
      const int r = comm.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<uint64_t> out(33, static_cast<uint64_t>(r) * 1000), in(33);
      {
        chorus::Group g;
        // Receive first: without the group this ring would deadlock.
        CHECK_OK(comm.recv(std::span(in), prev).wait());
        CHECK_OK(comm.send(std::span<const uint64_t>(out), next).wait());
        CHECK_OK(g.end());
        Status again = g.end();
        CHECK_THAT(again.code() == Code::InvalidUsage, again.toString());
      }
      for (uint64_t v : in) CHECK_THAT(v == static_cast<uint64_t>(prev) * 1000, "recv " + std::to_string(v));
      // The group's destructor ends it when end() is not called.
      {
        chorus::Group g;
        CHECK_OK(comm.send(std::span(out), next).wait());
        CHECK_OK(comm.recv(std::span(in), prev).wait());
      }
      // A send to self outside a group is refused by the library.
      Status st = comm.send(std::span(out), r).wait();
      CHECK_THAT(st.code() == Code::InvalidUsage, st.toString());
      return "";
    });
    EXPECT_EQ(err, "") << n << " ranks";
  }
}

TEST(CppApi, StreamAndWork) {
  const int n = 3;
  auto err = runComms(n, [&](Communicator& comm) -> std::string {
    auto stream = chorus::Stream::create();
    CHECK_THAT(stream.ok(), stream.status().toString());
    const int kOps = 20;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(4097, static_cast<float>(comm.rank())));
    std::vector<chorus::Work> works;
    for (auto& b : bufs) works.push_back(comm.allReduce(std::span(b), RedOp::Sum, *stream));
    CHECK_OK(works.back().wait());
    for (auto& w : works) CHECK_THAT(w.test(), "test() false after the last op's wait");
    CHECK_OK(works.front().wait());
    CHECK_OK(stream->query());
    for (auto& b : bufs)
      for (float v : b) CHECK_THAT(v == 3.0f, "stream allreduce " + std::to_string(v));
    // A rejected call on a stream: wait() returns the error, test() is true.
    std::vector<float> x(4);
    chorus::Work bad = comm.broadcast(std::span(x), /*root=*/-1, *stream);
    CHECK_THAT(bad.test(), "rejected work not complete");
    Status st = bad.wait();
    CHECK_THAT(st.code() == Code::InvalidArgument && st.message().find("root=-1") != std::string::npos,
               st.toString());
    // A blocking Work is complete at once.
    chorus::Work w = comm.barrier();
    CHECK_THAT(w.test(), "blocking work not complete");
    CHECK_OK(w.wait());
    CHECK_OK(stream->synchronize());
    return "";
  });
  EXPECT_EQ(err, "");
}

TEST(CppApi, Split) {
  const int n = 5;
  auto err = runComms(n, [&](Communicator& comm) -> std::string {
    const int r = comm.rank();
    // Rank 4 opts out; the rest split into even and odd, ordered by descending old rank.
    const int color = r == 4 ? CHORUS_SPLIT_NOCOLOR : r % 2;
    auto sub = comm.split(color, /*key=*/-r);
    CHECK_THAT(sub.ok(), sub.status().toString());
    // Keeps every rank (rank 0 above all, which hosts the rendezvous store)
    // alive until all sub-communicators are set up: see
    // SplitThenImmediateDestroy below.
    CHECK_OK(comm.barrier().wait());
    if (r == 4) {
      CHECK_THAT(!sub->valid(), "NOCOLOR gave a communicator");
      std::vector<int> x(1);
      Status st = sub->allReduce(std::span(x), RedOp::Sum).wait();
      CHECK_THAT(st.code() == Code::InvalidUsage && st.message().find("empty") != std::string::npos, st.toString());
      return "";
    }
    // Even: old 0, 2 -> new ranks 1, 0.  Odd: old 1, 3 -> new ranks 1, 0.
    CHECK_THAT(sub->valid() && sub->size() == 2, "size " + std::to_string(sub->size()));
    CHECK_THAT(sub->rank() == (r < 2 ? 1 : 0), "rank " + std::to_string(sub->rank()));
    std::vector<int> x(3, r);
    CHECK_OK(sub->allReduce(std::span(x), RedOp::Sum).wait());
    const int want = r % 2 == 0 ? 0 + 2 : 1 + 3;
    for (int v : x) CHECK_THAT(v == want, "sub allreduce " + std::to_string(v));
    CHECK_OK(sub->destroy());
    return "";
  });
  EXPECT_EQ(err, "");
}

// Library bug (src/comm/communicator.cpp, Communicator::split): a split
// communicator's setup talks to the rendezvous store hosted by rank 0 of the
// root communicator, but nothing keeps that rank alive until the other
// colors' setups are done.  Here rank 0 destroys its communicators right
// after its own split returns, and ranks 1 and 3 (the other color) fail with
// "store ... (request on 'w/s0c1/left'): ... Connection reset by peer"; when
// only one of them fails, the other waits in its first collective for the
// whole CHORUS_TIMEOUT_MS (600 s by default).  Enable once split keeps the
// store alive (e.g. a parent-wide "left" count before split returns).
TEST(CppApi, SplitThenImmediateDestroy) {
  chorusConfig_t cfg = CHORUS_CONFIG_INITIALIZER;
  cfg.timeoutMs = 5000;
  for (int iter = 0; iter < 20; ++iter) {
    auto err = runComms(4, [&](Communicator& comm) -> std::string {
      auto sub = comm.split(comm.rank() % 2, 0);
      CHECK_THAT(sub.ok(), sub.status().toString());
      std::vector<int> x(3, 1);
      CHECK_OK(sub->allReduce(std::span(x), RedOp::Sum).wait());
      return "";
    }, &cfg);
    EXPECT_EQ(err, "") << "iteration " << iter;
  }
}

TEST(CppApi, MoveSemantics) {
  auto err = runComms(2, [&](Communicator& comm) -> std::string {
    const int r = comm.rank();
    Communicator a = std::move(comm);
    CHECK_THAT(!comm.valid() && comm.size() == 0, "moved-from still valid");  // NOLINT(bugprone-use-after-move)
    CHECK_THAT(a.valid() && a.rank() == r && a.size() == 2, "moved-to lost its state");
    std::vector<int> x(2, 1);
    Status st = comm.allReduce(std::span(x), RedOp::Sum).wait();  // NOLINT(bugprone-use-after-move)
    CHECK_THAT(st.code() == Code::InvalidUsage, st.toString());
    Communicator b;
    b = std::move(a);
    CHECK_OK(b.allReduce(std::span(x), RedOp::Sum).wait());
    CHECK_THAT(x[0] == 2 && x[1] == 2, "allreduce after move");
    comm = std::move(b);  // hand it back for runComms to destroy
    auto s1 = chorus::Stream::create();
    CHECK_THAT(s1.ok(), s1.status().toString());
    chorus::Stream s2 = std::move(*s1);
    CHECK_THAT(s1->native() == nullptr && s2.native() != nullptr, "stream move");
    CHECK_OK(comm.allReduce(std::span(x), RedOp::Sum, s2).wait());
    CHECK_THAT(x[0] == 4, "allreduce on moved stream");
    return "";
  });
  EXPECT_EQ(err, "");
}

TEST(CppApi, PreMulSumAbortAndAsyncError) {
  auto err = runComms(2, [&](Communicator& comm) -> std::string {
    auto half = comm.createPreMulSum(0.5f);
    CHECK_THAT(half.ok(), half.status().toString());
    std::vector<float> x(7, 4.0f);
    CHECK_OK(comm.allReduce(std::span(x), *half).wait());
    for (float v : x) CHECK_THAT(v == 4.0f, "premulsum " + std::to_string(v));  // 0.5*4 + 0.5*4
    std::vector<double> d(7, 1.0);
    Status st = comm.allReduce(std::span(d), *half).wait();  // made for float
    CHECK_THAT(st.code() == Code::InvalidArgument, st.toString());
    CHECK_OK(comm.destroyRedOp(*half));
    st = comm.allReduce(std::span(x), *half).wait();
    CHECK_THAT(st.code() == Code::InvalidArgument, st.toString());
    CHECK_OK(comm.asyncError());
    CHECK_OK(comm.abort());
    st = comm.asyncError();
    CHECK_THAT(st.code() == Code::Aborted, st.toString());
    st = comm.barrier().wait();
    CHECK_THAT(st.code() == Code::InvalidUsage && st.message().find("aborted") != std::string::npos, st.toString());
    return "";
  });
  EXPECT_EQ(err, "");
}

TEST(CppApi, UniqueIdBytesRoundTrip) {
  auto id = chorus::UniqueId::create();
  ASSERT_TRUE(id.ok()) << id.status().toString();
  auto copy = chorus::UniqueId::fromBytes(id->bytes());
  EXPECT_EQ(std::memcmp(copy.native().internal, id->native().internal, chorus::UniqueId::kBytes), 0);
  // Use it, so rank 0 adopts the port the id reserved.
  auto comm = Communicator::initRank(1, copy, 0);
  ASSERT_TRUE(comm.ok()) << comm.status().toString();
  // A zeroed id is refused with the library's message.
  auto bad = Communicator::initRank(1, chorus::UniqueId(), 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::InvalidArgument);
  EXPECT_NE(bad.status().message().find("unique id"), std::string::npos) << bad.status().message();
}

TEST(CppApi, ResultValueOnErrorAborts) {
  chorus::Result<int> r(Status(Code::Timeout, "took too long"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::Timeout);
  EXPECT_EQ(r.status().toString(), "timeout: took too long");
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) called on an error: timeout: took too long");
  chorus::Result<int> from_ok{Status()};
  EXPECT_EQ(from_ok.status().code(), Code::InternalError);
  EXPECT_EQ(Status(Code::Success, "ignored").message(), "");
}

// The wrappers convert exactly as the library's kernels do.
TEST(CppApi, HalfAndBfloat16MatchTheKernels) {
  namespace cv = chorus::kernels::convert;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float want = cv::halfToFloat(h), got = chorus::float16::toFloat(h);
    ASSERT_TRUE(std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(got) || (std::isnan(want) && std::isnan(got)))
        << std::hex << "half 0x" << b;
  }
  auto check = [&](uint32_t u) {
    const float f = std::bit_cast<float>(u);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(chorus::float16::toFloat(chorus::float16::fromFloat(f))));
      ASSERT_TRUE(std::isnan(static_cast<float>(chorus::bfloat16(f))));
      return;
    }
    ASSERT_EQ(chorus::float16::fromFloat(f), cv::floatToHalf(f)) << std::hex << "float 0x" << u;
    ASSERT_EQ(chorus::bfloat16::fromFloat(f), cv::floatToBf16(f)) << std::hex << "float 0x" << u;
  };
  // float -> half/bf16: every sign, exponent and top mantissa bits, with low
  // 16 bits on and around both formats' rounding boundaries (half: bit 12 is
  // the tie, bit 13 the kept lsb; bf16: bit 15 and bit 16).
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x2fffu, 0x3000u, 0x3001u, 0x7fffu, 0x8000u,
                        0x8001u, 0xefffu, 0xf000u, 0xffffu})
      check(hi << 16 | lo);
  for (uint64_t u = 0; u < (1ull << 32); u += 65537) check(static_cast<uint32_t>(u));
}

}  // namespace
