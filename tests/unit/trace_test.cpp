// Traces: the offset estimate, the record format (round trip and hostile
// bytes), the store's clock exchange, the alignment, and the report's naming
// of stragglers and slow links on traces with known answers.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "bootstrap/store.hpp"
#include "clock/offset.hpp"
#include "plan/plan.hpp"
#include "trace/analysis.hpp"
#include "trace/record.hpp"

namespace chorus::trace {
namespace {

using namespace std::chrono_literals;

// ---- offset estimation ----------------------------------------------------------

// An exchange with a true offset (reference = local + offset) and one-way delays.
clock::Exchange exchange(int64_t t1, int64_t offset, int64_t up, int64_t server_time, int64_t down) {
  clock::Exchange x;
  x.t1 = t1;
  x.t2 = t1 + offset + up;
  x.t3 = x.t2 + server_time;
  x.t4 = x.t3 - offset + down;
  return x;
}

TEST(ClockOffset, SymmetricDelaysGiveTheExactOffset) {
  const int64_t offset = 123456789;
  std::vector<clock::Exchange> xs = {exchange(1000, offset, 5000, 100, 5000)};
  auto e = clock::estimateOffset(xs);
  EXPECT_EQ(e.offset_ns, offset);
  EXPECT_EQ(e.rtt_ns, 10000);
  EXPECT_EQ(e.bound_ns, 5000);
  EXPECT_EQ(e.samples, 1);
}

TEST(ClockOffset, TheFilterDropsExchangesDelayedOneWay) {
  // Most exchanges hit a queue in one direction (large, asymmetric delays);
  // the few quick ones are symmetric.  The estimate must come from those.
  const int64_t offset = -42'000'000;
  std::vector<clock::Exchange> xs;
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    const int64_t t1 = 1'000'000 * i;
    if (i % 8 == 3)
      xs.push_back(exchange(t1, offset, 4000, 50, 4000));
    else
      xs.push_back(exchange(t1, offset, 4000 + static_cast<int64_t>(rng() % 200000), 50, 4000));
  }
  auto e = clock::estimateOffset(xs);
  EXPECT_EQ(e.offset_ns, offset);
  EXPECT_EQ(e.used, 5);
  EXPECT_EQ(e.samples, 40);
  // Without the filter (the mean of all), the error would be tens of microseconds.
  double mean = 0;
  for (auto& x : xs) mean += static_cast<double>(x.offset() - offset);
  EXPECT_GT(std::abs(mean / xs.size()), 10000.0);
}

TEST(ClockOffset, EmptyInputIsNoEstimate) {
  auto e = clock::estimateOffset({});
  EXPECT_EQ(e.samples, 0);
  EXPECT_EQ(e.offset_ns, 0);
}

TEST(ClockOffset, StoreServerTimeLiesBetweenRequestAndReply) {
  // Same process, same clock: the server's stamp must be inside [t1, t4].
  auto secret = auth::Secret::random();
  auto server = bootstrap::StoreServer::start(*net::resolve("127.0.0.1", 0), secret);
  ASSERT_TRUE(server.isOk()) << server.status().message();
  auto client = bootstrap::connectStore((*server)->address(), secret, 5s);
  ASSERT_TRUE(client.isOk()) << client.status().message();
  std::vector<clock::Exchange> xs;
  for (int i = 0; i < 16; ++i) {
    clock::Exchange x;
    x.t1 = clock::traceNowNs();
    auto t = (*client)->serverTimeNs();
    ASSERT_TRUE(t.isOk()) << t.status().message();
    x.t4 = clock::traceNowNs();
    x.t2 = x.t3 = *t;
    EXPECT_LE(x.t1, x.t2);
    EXPECT_LE(x.t2, x.t4);
    xs.push_back(x);
  }
  auto e = clock::estimateOffset(xs);
  EXPECT_LE(std::abs(e.offset_ns), e.bound_ns);
  // The connection still serves ordinary requests afterwards.
  ASSERT_TRUE((*client)->set("k", bootstrap::toBytes(std::string_view("v"))).isOk());
  EXPECT_TRUE((*client)->get("k", 1s).isOk());
}

TEST(ClockOffset, StoreRejectsATimeRequestWithAValue) {
  std::vector<std::byte> frame = {std::byte{4}, std::byte{1}, std::byte{0}, std::byte{0}, std::byte{0},
                                  std::byte{1}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0},
                                  std::byte{0}, std::byte{0}, std::byte{0}, std::byte{'t'}, std::byte{9}};
  auto r = bootstrap::parseStoreRequest(frame);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("TIME"), std::string::npos);
  frame.pop_back();
  frame[5] = std::byte{0};  // vallen 0: a valid TIME request
  auto ok = bootstrap::parseStoreRequest(frame);
  ASSERT_TRUE(ok.isOk());
  ASSERT_TRUE(ok->has_value());
  EXPECT_EQ((*ok)->op, 4);
}

// ---- the record format ----------------------------------------------------------

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/chorus-trace-test.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::vector<std::byte> readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> d((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(d.size());
  std::memcpy(out.data(), d.data(), d.size());
  return out;
}

TEST(TraceFormat, RecordsRoundTrip) {
  TempDir dir;
  Header h;
  h.rank = 2;
  h.nranks = 4;
  h.pid = 4242;
  h.comm_id = 0xfeedface12345678ull;
  h.open_ns = 111;
  h.open_unix_ns = 222;
  h.host = "node17";
  std::string path;
  {
    auto rec = Recorder::open(dir.path + "/sub", h);  // creates the directory
    ASSERT_TRUE(rec.isOk()) << rec.status().message();
    path = (*rec)->path();
    const uint16_t ring = (*rec)->algoId("ring");
    EXPECT_EQ((*rec)->algoId("ring"), ring);
    const uint16_t tree = (*rec)->algoId("double_tree");
    EXPECT_NE(ring, tree);
    OpRecord o;
    o.seq = 7;
    o.coll = static_cast<uint8_t>(plan::Collective::AllGather);
    o.dtype = 7;
    o.algo = tree;
    o.root = -1;
    o.count = 1000;
    o.bytes = 16000;
    o.enqueue_ns = -5;  // times may be negative (an injected offset)
    o.start_ns = 10;
    o.end_ns = 20;
    o.predicted_ns = 9;
    (*rec)->op(o);
    (*rec)->step({7, static_cast<uint8_t>(StepKind::RecvReduce), 3, 4096, 11, 19});
    (*rec)->step({7, static_cast<uint8_t>(StepKind::Copy), -1, 64, 12, 13});
    (*rec)->clock({100, -2500, 900, 450});
  }
  auto t = readTraceFile(path);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t->header.rank, 2);
  EXPECT_EQ(t->header.nranks, 4);
  EXPECT_EQ(t->header.pid, 4242);
  EXPECT_EQ(t->header.comm_id, 0xfeedface12345678ull);
  EXPECT_EQ(t->header.host, "node17");
  EXPECT_FALSE(t->truncated);
  ASSERT_EQ(t->algos.size(), 3u);
  EXPECT_EQ(t->algos[1], "ring");
  EXPECT_EQ(t->algos[2], "double_tree");
  ASSERT_EQ(t->ops.size(), 1u);
  EXPECT_EQ(t->ops[0].seq, 7u);
  EXPECT_EQ(t->ops[0].algo, 2);
  EXPECT_EQ(t->ops[0].root, -1);
  EXPECT_EQ(t->ops[0].count, 1000u);
  EXPECT_EQ(t->ops[0].bytes, 16000u);
  EXPECT_EQ(t->ops[0].enqueue_ns, -5);
  EXPECT_EQ(t->ops[0].end_ns, 20);
  EXPECT_EQ(t->ops[0].predicted_ns, 9);
  ASSERT_EQ(t->steps.size(), 2u);
  EXPECT_EQ(t->steps[0].peer, 3);
  EXPECT_EQ(t->steps[0].bytes, 4096u);
  EXPECT_EQ(t->steps[1].kind, static_cast<uint8_t>(StepKind::Copy));
  ASSERT_EQ(t->clocks.size(), 1u);
  EXPECT_EQ(t->clocks[0].offset_ns, -2500);
  EXPECT_EQ(t->clocks[0].bound_ns, 450);

  // A file cut inside its last record (a killed writer) keeps what came before.
  auto bytes = readAll(path);
  auto cut = parseTrace(std::span(bytes).first(bytes.size() - 5));
  ASSERT_TRUE(cut.isOk()) << cut.status().message();
  EXPECT_TRUE(cut->truncated);
  EXPECT_EQ(cut->ops.size(), 1u);
  EXPECT_EQ(cut->clocks.size(), 0u);
}

// Point-to-point operations have their own kinds (version 2) and keep their
// peer apart from a collective's root; a version 1 file, where a send or
// receive was collective 10 ("sendrecv") with its peer in the root field and
// barrier was 11, reads with the kinds of today.
TEST(TraceFormat, PointToPointKindsAndVersionOneFiles) {
  TempDir dir;
  Header h;
  h.nranks = 4;
  auto write = [&](const std::vector<OpRecord>& ops) {
    auto rec = Recorder::open(dir.path, h);
    EXPECT_TRUE(rec.isOk()) << rec.status().message();
    const std::string path = (*rec)->path();
    const uint16_t send = (*rec)->algoId("send");
    for (OpRecord o : ops) {
      o.algo = send;
      (*rec)->op(o);
    }
    return path;
  };
  OpRecord s;
  s.coll = kOpSend;
  s.peer = 3;
  s.root = 2;  // not written: a send has no root
  OpRecord b;
  b.seq = 1;
  b.coll = static_cast<uint8_t>(plan::Collective::Broadcast);
  b.root = 2;
  auto t = readTraceFile(write({s, b}));
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_EQ(t->ops.size(), 2u);
  EXPECT_EQ(t->ops[0].coll, kOpSend);
  EXPECT_EQ(t->ops[0].peer, 3);
  EXPECT_EQ(t->ops[0].root, 0);
  EXPECT_EQ(t->ops[1].root, 2);
  EXPECT_EQ(t->ops[1].peer, -1);

  // Version 1: kinds 10 (with the algorithm "send") and 11.
  std::filesystem::remove_all(dir.path);
  OpRecord old_send;
  old_send.coll = 10;
  old_send.root = 3;
  OpRecord old_barrier;
  old_barrier.seq = 1;
  old_barrier.coll = 11;
  const std::string path = write({old_send, old_barrier});
  std::vector<std::byte> bytes = readAll(path);
  ASSERT_GT(bytes.size(), 12u);
  bytes[8] = std::byte{1};  // the version, after the 8-byte magic
  auto v1 = parseTrace(bytes);
  ASSERT_TRUE(v1.isOk()) << v1.status().message();
  ASSERT_EQ(v1->ops.size(), 2u);
  EXPECT_EQ(v1->ops[0].coll, kOpSend);
  EXPECT_EQ(v1->ops[0].peer, 3);
  EXPECT_EQ(v1->ops[1].coll, static_cast<uint8_t>(plan::Collective::Barrier));
  bytes[8] = std::byte{3};
  EXPECT_FALSE(parseTrace(bytes).isOk());
}

TEST(TraceFormat, HostileBytesAreRefusedWithTheOffset) {
  TempDir dir;
  Header h;
  h.nranks = 2;
  h.host = "h";
  std::string path;
  {
    auto rec = Recorder::open(dir.path, h);
    ASSERT_TRUE(rec.isOk());
    path = (*rec)->path();
    (*rec)->step({1, static_cast<uint8_t>(StepKind::Send), 1, 8, 1, 2});
  }
  const auto good = readAll(path);
  ASSERT_TRUE(parseTrace(good).isOk());
  const size_t step_at = good.size() - 41;  // the step record: 4-byte head + 37-byte payload
  ASSERT_EQ(std::to_integer<int>(good[step_at]), static_cast<int>(Kind::Step));

  auto bad_magic = good;
  bad_magic[0] = std::byte{'X'};
  EXPECT_FALSE(parseTrace(bad_magic).isOk());

  auto bad_len = good;
  bad_len[step_at + 2] = std::byte{36};  // a step record one byte short
  bad_len.pop_back();
  auto r = parseTrace(bad_len);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find(fmt::format("offset {}", step_at)), std::string::npos) << r.status().message();

  auto bad_peer = good;
  bad_peer[step_at + 4 + 9] = std::byte{2};  // peer 2 of 2 ranks
  EXPECT_FALSE(parseTrace(bad_peer).isOk());

  auto bad_rank = good;
  bad_rank[12] = std::byte{5};  // rank 5 of 2
  EXPECT_FALSE(parseTrace(bad_rank).isOk());

  auto unknown = good;  // a record kind from a later version is skipped
  unknown[step_at] = std::byte{99};
  auto u = parseTrace(unknown);
  ASSERT_TRUE(u.isOk());
  EXPECT_TRUE(u->steps.empty());

  auto op_before_algo = good;  // an op naming an algorithm that was never defined
  op_before_algo.resize(step_at);
  std::vector<std::byte> op(4 + 8 + 1 + 1 + 2 + 1 + 4 + 8 + 8 + 32, std::byte{0});
  op[0] = std::byte{static_cast<uint8_t>(Kind::Op)};
  op[2] = std::byte{static_cast<uint8_t>(op.size() - 4)};
  op[4 + 10] = std::byte{5};  // algo id 5
  op_before_algo.insert(op_before_algo.end(), op.begin(), op.end());
  EXPECT_FALSE(parseTrace(op_before_algo).isOk());

  // Random corruption never crashes (the fuzz target does this at scale).
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) {
    auto b = good;
    for (int k = 0; k < 4; ++k) b[rng() % b.size()] = static_cast<std::byte>(rng());
    (void)parseTrace(b);
  }
}

// ---- alignment and analysis on traces with known answers ------------------------

TraceFile rankFile(int rank, int nranks, std::string host, int64_t clock_offset) {
  TraceFile f;
  f.path = fmt::format("rank{}.trace", rank);
  f.header.rank = rank;
  f.header.nranks = nranks;
  f.header.host = std::move(host);
  f.header.comm_id = 99;
  f.algos = {"", "ring"};
  // The rank's clock runs clock_offset behind rank 0's: rank 0 = local - clock_offset.
  if (clock_offset != 0 || rank != 0) f.clocks.push_back({0, -clock_offset, 2000, 1000});
  return f;
}

TEST(TraceAlign, ClockRecordsInterpolateLinearly) {
  RankTrace r;
  r.file.clocks = {{1000, 100, 0, 0}, {3000, 300, 0, 0}};
  EXPECT_EQ(r.toRef(0), 100);         // before the first: its offset
  EXPECT_EQ(r.toRef(2000), 2000 + 200);
  EXPECT_EQ(r.toRef(5000), 5000 + 300);  // after the last: its offset
  RankTrace none;
  EXPECT_EQ(none.toRef(77), 77);
}

TEST(TraceReport, AHostileClockRecordReportsASaturatedDriftNotAWrappedOne) {
  // Found by trace_file_fuzz: two estimates 1 ns apart whose offsets differ by
  // 2^59 ns gave a drift of 5.8e26 ppb, which the int64 conversion could not
  // hold (undefined behaviour; UBSan aborted the report).
  TraceFile f = rankFile(0, 1, "A", 0);
  f.clocks = {{1000, 0, 10, 10}, {1001, int64_t{1} << 59, 10, 10}};
  TraceFile g = f;
  g.clocks = {{1000, int64_t{1} << 59, 10, 10}, {1001, -(int64_t{1} << 59), 10, 10}};
  for (const auto& [file, sign] : {std::pair{f, 1}, std::pair{g, -1}}) {
    auto comms = groupTraces({file});
    ASSERT_TRUE(comms.isOk()) << comms.status().message();
    Report r = analyse(comms->front());
    ASSERT_EQ(r.clocks.size(), 1u);
    EXPECT_EQ(r.clocks[0].drift_ppb, sign * 1'000'000'000);
  }
  // A sane drift is reported as is: 1 us over 1 s = 1000 ppb.
  TraceFile h = rankFile(0, 1, "A", 0);
  h.clocks = {{0, 0, 10, 10}, {1'000'000'000, 1000, 10, 10}};
  auto comms = groupTraces({h});
  ASSERT_TRUE(comms.isOk());
  EXPECT_EQ(analyse(comms->front()).clocks.at(0).drift_ppb, 1000);
}

// Four ranks on two hosts (0,1 on A; 2,3 on B), `calls` allreduces of 4 MiB.
// Rank `late` computes 5 ms longer before every call; host B sends to A at
// 1/8 of the speed of every other cross-host path.  Every rank's clock is
// shifted by rank x 1 s, which the clock records undo.
std::vector<TraceFile> syntheticJob(int calls, int late, bool slow_b_to_a) {
  const int n = 4;
  std::vector<TraceFile> files;
  for (int r = 0; r < n; ++r) files.push_back(rankFile(r, n, r < 2 ? "A" : "B", int64_t{r} * 1'000'000'000));
  auto local = [&](int r, int64_t ref) { return ref + int64_t{r} * 1'000'000'000; };
  int64_t t = 1'000'000;
  const uint64_t msg = 1 << 20;
  for (int c = 0; c < calls; ++c) {
    std::vector<int64_t> arrive(n);
    for (int r = 0; r < n; ++r) arrive[r] = t + 10'000 * r + (r == late ? 5'000'000 : 0);
    const int64_t last = *std::max_element(arrive.begin(), arrive.end());
    // Every rank sends one 1 MiB message to every other after the last arrival.
    int64_t end = last;
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        const bool cross = (a < 2) != (b < 2);
        int64_t dur = cross ? 1'000'000 : 200'000;                    // 1 GB/s across, 5 GB/s within
        if (cross && slow_b_to_a && a >= 2) dur *= 8;                 // B -> A slow
        const int64_t s0 = last + 1000, s1 = s0 + dur;
        files[a].steps.push_back({static_cast<uint64_t>(c), static_cast<uint8_t>(StepKind::Send), b, msg,
                                  local(a, s0), local(a, s1)});
        files[b].steps.push_back({static_cast<uint64_t>(c), static_cast<uint8_t>(StepKind::Recv), a, msg,
                                  local(b, arrive[b]), local(b, s1)});
        end = std::max(end, s1);
      }
    for (int r = 0; r < n; ++r) {
      OpRecord o;
      o.seq = static_cast<uint64_t>(c);
      o.coll = static_cast<uint8_t>(plan::Collective::AllReduce);
      o.algo = 1;
      o.count = 1 << 20;
      o.bytes = 4 << 20;
      o.enqueue_ns = o.start_ns = local(r, arrive[r]);
      o.end_ns = local(r, end + 1000 * r);
      o.predicted_ns = 2'000'000;
      files[r].ops.push_back(o);
    }
    t = end + 100'000;
  }
  return files;
}

TEST(TraceReport, NamesTheStragglerAndTheSlowHost) {
  auto comms = groupTraces(syntheticJob(10, 3, true));
  ASSERT_TRUE(comms.isOk()) << comms.status().message();
  ASSERT_EQ(comms->size(), 1u);
  Report r = analyse(comms->front());
  EXPECT_EQ(r.hosts, 2);
  EXPECT_EQ(r.straggler, 3);
  EXPECT_NEAR(r.straggler_late_us, 5000, 50);
  ASSERT_EQ(r.collectives.size(), 1u);
  const CollectiveStats& c = r.collectives[0];
  EXPECT_EQ(c.coll, "allreduce");
  EXPECT_EQ(c.calls, 10);
  EXPECT_EQ(c.algo, "ring");
  EXPECT_EQ(c.last_rank, 3);
  EXPECT_NEAR(c.time_us, 8001 + 3, 5);  // the slowest transfer (8 ms) + latency, from the last arrival
  EXPECT_NEAR(c.predicted_us, 2000, 1e-6);
  EXPECT_NEAR(c.skew_us, 5030, 1);  // rank 3: 30 us + 5 ms after rank 0
  // B -> A runs at 1 MiB / 8 ms; A -> B at 1 MiB / 1 ms.
  EXPECT_EQ(r.slow_host, "B");
  EXPECT_TRUE(r.slow_host_outbound);
  EXPECT_EQ(r.slow_host_alt, "A");  // two hosts: B's sending and A's receiving are the same path
  ASSERT_FALSE(r.links.empty());
  EXPECT_GE(r.links.front().src, 2);
  EXPECT_LT(r.links.front().dst, 2);
  EXPECT_NEAR(r.links.front().gbps, 1048576 / 8e6, 0.01);
  EXPECT_EQ(r.slow_src, r.links.front().src);
  EXPECT_NE(r.verdict.find("Straggler: rank 3"), std::string::npos) << r.verdict;
  EXPECT_NE(r.verdict.find("Slow link: host B"), std::string::npos) << r.verdict;
  auto j = reportJson(r);
  EXPECT_EQ(j["straggler"], 3);
  EXPECT_EQ(j["slow_host"]["host"], "B");
  EXPECT_EQ(j["collectives"][0]["calls"], 10);
  EXPECT_FALSE(formatReport(r).empty());
}

TEST(TraceReport, AnEvenJobHasNoCulprit) {
  auto comms = groupTraces(syntheticJob(10, -1, false));
  ASSERT_TRUE(comms.isOk());
  Report r = analyse(comms->front());
  EXPECT_EQ(r.straggler, -1);
  EXPECT_TRUE(r.slow_host.empty());
  EXPECT_EQ(r.slow_src, -1);
  EXPECT_NE(r.verdict.find("No straggler"), std::string::npos) << r.verdict;
  EXPECT_NE(r.verdict.find("Links are even"), std::string::npos) << r.verdict;
}

TEST(TraceReport, AMissingRankIsSaid) {
  auto files = syntheticJob(3, -1, false);
  files.erase(files.begin() + 2);
  auto comms = groupTraces(std::move(files));
  ASSERT_TRUE(comms.isOk());
  Report r = analyse(comms->front());
  EXPECT_EQ(r.missing_ranks, std::vector<int>{2});
  EXPECT_NE(r.verdict.find("missing"), std::string::npos);
}

TEST(TraceReport, DuplicateRanksAreRefused) {
  auto files = syntheticJob(1, -1, false);
  files.push_back(files[1]);
  EXPECT_FALSE(groupTraces(std::move(files)).isOk());
}

// Two ranks on hosts A and B, each with one 4 MiB broadcast from 0 to 4 ms;
// the tests add its steps.
std::vector<TraceFile> twoRankBroadcast() {
  std::vector<TraceFile> files = {rankFile(0, 2, "A", 0), rankFile(1, 2, "B", 0)};
  OpRecord o;
  o.coll = static_cast<uint8_t>(plan::Collective::Broadcast);
  o.bytes = 4 << 20;
  o.start_ns = 0;
  o.end_ns = 4'000'000;
  files[0].ops.push_back(o);
  files[1].ops.push_back(o);
  return files;
}

TEST(TraceReport, OverlappingTransfersOfALinkCountOnce) {
  // Four 1 MiB chunks 0 -> 1, all posted at once and delivered one after the
  // other, 1 ms apart: the link moved 4 MiB in 4 ms, not in 1+2+3+4 ms.
  std::vector<TraceFile> files = twoRankBroadcast();
  for (int k = 0; k < 4; ++k) {
    const int64_t end = 1'000'000 * (k + 1);
    files[0].steps.push_back({0, static_cast<uint8_t>(StepKind::Send), 1, 1 << 20, 0, end});
    files[1].steps.push_back({0, static_cast<uint8_t>(StepKind::Recv), 0, 1 << 20, 0, end});
  }
  auto comms = groupTraces(std::move(files));
  ASSERT_TRUE(comms.isOk());
  Report r = analyse(comms->front());
  ASSERT_EQ(r.links.size(), 1u);
  EXPECT_EQ(r.links[0].messages, 4);
  EXPECT_NEAR(r.links[0].busy_us, 4000, 1e-6);
  EXPECT_NEAR(r.links[0].gbps, 4.0 * 1048576 / 4e6, 1e-9);
}

TEST(TraceMerge, OneTimelineWithFlows) {
  auto comms = groupTraces(syntheticJob(2, 1, false));
  ASSERT_TRUE(comms.isOk());
  auto j = chromeTrace(*comms);
  int procs = 0, ops = 0, flows_s = 0, flows_f = 0;
  double min_ts = 1e300, max_ts = -1e300;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++procs;
    if (e["ph"] == "X" && e["cat"] == "op") ++ops;
    if (e["ph"] == "s") ++flows_s;
    if (e["ph"] == "f") ++flows_f;
    if (e.contains("ts")) {
      min_ts = std::min(min_ts, e["ts"].get<double>());
      max_ts = std::max(max_ts, e["ts"].get<double>());
    }
  }
  EXPECT_EQ(procs, 4);
  EXPECT_EQ(ops, 8);
  EXPECT_EQ(flows_s, 24);  // 12 messages per call
  EXPECT_EQ(flows_f, 24);
  EXPECT_EQ(min_ts, 0);
  // The ranks' clocks are seconds apart; aligned, the job spans ~20 ms.
  EXPECT_LT(max_ts, 100'000);
}

// Slices on one track must nest or follow one another (Perfetto and
// chrome://tracing misdraw others): overlapping transfers go to lanes of
// their own, and every flow binds to a lane holding its send or receive.
TEST(TraceMerge, SlicesOnATrackNest) {
  std::vector<TraceFile> files = twoRankBroadcast();
  for (int k = 0; k < 6; ++k) {  // each overlaps the next without nesting
    const int64_t start = 500'000 * k, end = start + 1'000'000;
    files[0].steps.push_back({0, static_cast<uint8_t>(StepKind::Send), 1, 1 << 20, start, end});
    files[1].steps.push_back({0, static_cast<uint8_t>(StepKind::Recv), 0, 1 << 20, start, end + 100});
  }
  auto comms = groupTraces(std::move(files));
  ASSERT_TRUE(comms.isOk());
  auto j = chromeTrace(*comms);
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  std::set<std::pair<int, int>> named;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X")
      tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back(
          {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
    if (e["ph"] == "M" && e["name"] == "thread_name") named.insert({e["pid"].get<int>(), e["tid"].get<int>()});
  }
  int send_tracks = 0;
  for (auto& [key, v] : tracks) {
    EXPECT_TRUE(named.count(key)) << "track " << key.first << "/" << key.second << " has no name";
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<double> open;  // ends of the enclosing slices
    for (auto [b, e] : v) {
      while (!open.empty() && open.back() <= b) open.pop_back();
      EXPECT_TRUE(open.empty() || e <= open.back() + 1e-9)
          << "pid " << key.first << " tid " << key.second << ": [" << b << ", " << e << ") overlaps a slice ending at "
          << open.back();
      open.push_back(e);
    }
    if (key.first == 0 && key.second >= 1000 && key.second < 2000) ++send_tracks;
  }
  EXPECT_EQ(send_tracks, 2);  // six sends, at most two at a time
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "s" || e["ph"] == "f") {
      EXPECT_TRUE(tracks.count({e["pid"].get<int>(), e["tid"].get<int>()})) << e.dump();
    }
  }
}

}  // namespace
}  // namespace chorus::trace
