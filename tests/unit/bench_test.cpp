// The pure parts of chorus-bench: sweeps, shapes, bandwidth factors, the check
// pattern and its expectations, and the table and JSON formats.
#include "toolkit/bench.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/size.hpp"
#include "kernels/dtype.hpp"
#include "support/rank_threads.hpp"

namespace chorus::tools::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Bench, CollectiveNamesRoundTrip) {
  for (Collective c : allCollectives()) {
    auto parsed = parseCollective(collectiveName(c));
    ASSERT_TRUE(parsed.isOk());
    EXPECT_EQ(*parsed, c);
  }
  auto bad = parseCollective("allreduse");
  EXPECT_EQ(bad.status().code(), chorusInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("allreduce|broadcast"));
  EXPECT_TRUE(takesOp(Collective::ReduceScatter));
  EXPECT_FALSE(takesOp(Collective::AllGather));
  EXPECT_TRUE(takesRoot(Collective::Scatter));
  EXPECT_FALSE(hasInPlace(Collective::SendRecv));
}

TEST(Bench, ParsesOps) {
  EXPECT_EQ(*parseOp("avg"), chorusAvg);
  EXPECT_FALSE(parseOp("mean").isOk());
}

// The one size grammar of every tool (common/size.hpp): every spelling of a
// multiple is binary, as nccl-tests reads K/M/G.
TEST(SizeGrammar, EverySpellingOfAMultipleIsBinary) {
  for (const char* s : {"8k", "8K", "8kb", "8KB", "8KiB", "8kib", "8192", "8192B", "8192b"})
    EXPECT_EQ(parseSize(s).value(), 8192u) << s;
  for (const char* s : {"64M", "64m", "64MB", "64MiB"}) EXPECT_EQ(parseSize(s).value(), 64ull << 20) << s;
  for (const char* s : {"1G", "1g", "1GB", "1GiB"}) EXPECT_EQ(parseSize(s).value(), 1ull << 30) << s;
  EXPECT_EQ(parseSize("2T").value(), 2ull << 40);
  EXPECT_EQ(parseSize("0").value(), 0u);
  // Fractions that make whole bytes.
  EXPECT_EQ(parseSize("1.5G").value(), 3ull << 29);
  EXPECT_EQ(parseSize("0.5K").value(), 512u);
  EXPECT_EQ(parseSize("0.25KiB").value(), 256u);
  EXPECT_EQ(parseSize("2.0M").value(), 2ull << 20);
  EXPECT_EQ(parseSize("18446744073709551615").value(), UINT64_MAX);
}

TEST(SizeGrammar, ErrorsNameTheFlagTheValueAndTheRule) {
  auto bad = parseSize("12X", "-b");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), chorusInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("-b '12X'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown suffix 'X'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("powers of 1024"));
  for (const char* s : {"", "M", "-5", "+5", " 8", "8 K", "1e3", ".", "8KK", "8Ki", "0x10", "1.1K", "0.3", "1.5",
                        "99999999999999G", "18446744073709551616", "16777216T", "1.0000000000001K"})
    EXPECT_FALSE(parseSize(s, "--bytes").isOk()) << s;
  EXPECT_THAT(parseSize("1.1K").status().message(), HasSubstr("not a whole number of bytes"));
  EXPECT_THAT(parseSize("99999999999999G").status().message(), HasSubstr("too large"));
  EXPECT_THAT(parseSize("-5", "--bytes").status().message(), HasSubstr("--bytes '-5'"));
}

TEST(Bench, SweepMultipliesOrAdds) {
  // 8 * 4^k <= 1M: k = 0..8.
  auto f = sizeSweep({8, 1 << 20, 4, 0});
  ASSERT_TRUE(f.isOk());
  EXPECT_THAT(*f, ElementsAre(8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288));
  auto i = sizeSweep({1024, 4096, 1, 1024});
  ASSERT_TRUE(i.isOk());
  EXPECT_THAT(*i, ElementsAre(1024, 2048, 3072, 4096));
  EXPECT_THAT(*sizeSweep({64, 64, 2, 0}), ElementsAre(64));
  EXPECT_FALSE(sizeSweep({128, 64, 2, 0}).isOk());
  EXPECT_FALSE(sizeSweep({8, 64, 1, 0}).isOk());
  EXPECT_FALSE(sizeSweep({0, 64, 2, 0}).isOk());
}

TEST(Bench, ShapesFollowNcclTests) {
  // allreduce: the whole size is the count.
  Shape ar = shapeFor(Collective::AllReduce, 1 << 20, 4, 4);
  EXPECT_EQ(ar.count, 262144u);
  EXPECT_EQ(ar.bytes, 1u << 20);
  // allgather, 3 ranks, 1 MiB of float: 262144 / 3 = 87381, rounded down to a
  // multiple of 4 floats (16 B) = 87380 per rank; the receive buffer holds 3x.
  Shape ag = shapeFor(Collective::AllGather, 1 << 20, 4, 3);
  EXPECT_EQ(ag.count, 87380u);
  EXPECT_EQ(ag.send_count, 87380u);
  EXPECT_EQ(ag.recv_count, 262140u);
  EXPECT_EQ(ag.bytes, 262140u * 4);
  // reducescatter / scatter: the send buffer is the big one.
  Shape rs = shapeFor(Collective::ReduceScatter, 4096, 8, 2);
  EXPECT_EQ(rs.count, 256u);
  EXPECT_EQ(rs.send_count, 512u);
  EXPECT_EQ(rs.recv_count, 256u);
  // alltoall: n blocks each way.
  Shape a2a = shapeFor(Collective::AllToAll, 4096, 4, 4);
  EXPECT_EQ(a2a.count, 256u);
  EXPECT_EQ(a2a.send_count, 1024u);
  EXPECT_EQ(a2a.recv_count, 1024u);
  // Too small for one 16-byte block per rank: nothing moves.
  Shape tiny = shapeFor(Collective::AllGather, 8, 4, 2);
  EXPECT_EQ(tiny.count, 0u);
  EXPECT_EQ(tiny.bytes, 0u);
  EXPECT_EQ(shapeFor(Collective::Barrier, 1024, 4, 2).bytes, 0u);
}

TEST(Bench, BusBandwidthFactors) {
  EXPECT_DOUBLE_EQ(busBwFactor(Collective::AllReduce, 4), 1.5);  // 2(n-1)/n
  EXPECT_DOUBLE_EQ(busBwFactor(Collective::AllReduce, 1), 0.0);
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllToAll, Collective::Gather,
                       Collective::Scatter})
    EXPECT_DOUBLE_EQ(busBwFactor(c, 8), 0.875) << collectiveName(c);  // (n-1)/n
  for (Collective c : {Collective::Broadcast, Collective::Reduce, Collective::SendRecv})
    EXPECT_DOUBLE_EQ(busBwFactor(c, 8), 1.0) << collectiveName(c);
}

TEST(Bench, BandwidthUsesTheCollectivesDataSize) {
  // allreduce of 250M floats (1e9 B) in 0.5 s: algbw 2 GB/s, busbw 2 * 1.5.
  Shape ar{1'000'000'000, 250'000'000, 250'000'000, 250'000'000};
  Bandwidth b = bandwidth(Collective::AllReduce, ar, 4, 4, 0.5);
  EXPECT_DOUBLE_EQ(b.algbw_gbps, 2.0);
  EXPECT_DOUBLE_EQ(b.busbw_gbps, 3.0);
  // allgather: S = count * elem * n = 1e8 * 4 * 5 = 2e9 B in 1 s; busbw * 4/5.
  Shape ag = shapeFor(Collective::AllGather, 2'000'000'000, 4, 5);
  ASSERT_EQ(ag.count, 100'000'000u);
  Bandwidth g = bandwidth(Collective::AllGather, ag, 4, 5, 1.0);
  EXPECT_DOUBLE_EQ(g.algbw_gbps, 2.0);
  EXPECT_DOUBLE_EQ(g.busbw_gbps, 1.6);
  EXPECT_DOUBLE_EQ(bandwidth(Collective::AllReduce, ar, 4, 4, 0).algbw_gbps, 0.0);
}

// ---- the check pattern --------------------------------------------------------

std::vector<unsigned char> buffer(chorusDataType_t d, size_t count) {
  return std::vector<unsigned char>(count * kernels::dtypeSize(d) + 8, 0xEE);  // +8: a guard
}

// What each rank's input buffer holds, as the bench fills it.
std::vector<std::vector<unsigned char>> inputs(const Pattern& p, size_t count) {
  std::vector<std::vector<unsigned char>> in;
  for (int r = 0; r < p.nranks(); ++r) {
    in.push_back(buffer(p.dtype(), count));
    p.fill(in.back().data(), r, count);
  }
  return in;
}

TEST(Bench, FillWritesTheInputValuesAndNothingMore) {
  Pattern p(chorusFloat16, chorusSum, 4);
  auto buf = buffer(chorusFloat16, 100);
  p.fill(buf.data(), 2, 100);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(kernels::loadAsDouble(buf.data() + 2 * i, chorusFloat16), p.input(2, i));
  EXPECT_EQ(buf[200], 0xEE) << "fill ran past its count";
  // The pattern depends on rank and index.
  int differ_rank = 0, differ_index = 0;
  for (size_t i = 0; i < 100; ++i) {
    differ_rank += p.input(0, i) != p.input(1, i);
    differ_index += p.input(0, i) != p.input(0, i + 1);
  }
  EXPECT_GT(differ_rank, 50);
  EXPECT_GT(differ_index, 50);
}

// Moves data the way each data-moving collective defines it, from the filled
// inputs, and checks the bench's expectations accept exactly that.
TEST(Bench, ExpectationsMatchASimulatedDataMovement) {
  const int n = 3, root = 1;
  const chorusDataType_t d = chorusFloat32;
  for (Collective c : {Collective::Broadcast, Collective::AllGather, Collective::AllToAll, Collective::Gather,
                       Collective::Scatter, Collective::SendRecv}) {
    SCOPED_TRACE(std::string(collectiveName(c)));
    Shape s = shapeFor(c, 3 * 64 * 4, 4, n);  // 64 floats per block
    ASSERT_EQ(s.count % 4, 0u);
    Pattern p(d, std::nullopt, n);
    auto in = inputs(p, s.send_count);
    const size_t cnt = s.count, bytes = cnt * 4;
    for (int r = 0; r < n; ++r) {
      auto out = buffer(d, outputCount(c, s));
      auto block = [&](int src_rank, size_t src_block, size_t dst_block) {
        std::memcpy(out.data() + dst_block * bytes, in[src_rank].data() + src_block * bytes, bytes);
      };
      switch (c) {
        case Collective::Broadcast: block(root, 0, 0); break;
        case Collective::AllGather:
          for (int q = 0; q < n; ++q) block(q, 0, q);
          break;
        case Collective::AllToAll:
          for (int q = 0; q < n; ++q) block(q, r, q);
          break;
        case Collective::Gather:
          if (r == root)
            for (int q = 0; q < n; ++q) block(q, 0, q);
          break;
        case Collective::Scatter: block(root, r, 0); break;
        case Collective::SendRecv: block((r + n - 1) % n, 0, 0); break;
        default: break;
      }
      EXPECT_EQ(countWrong(c, p, s, root, r, out.data()), 0u) << "rank " << r;
      if (c == Collective::Gather && r != root) continue;  // nothing defined there
      // One wrong element is counted once.
      float bad = -1;
      std::memcpy(out.data() + 4 * (outputCount(c, s) - 1), &bad, 4);
      EXPECT_EQ(countWrong(c, p, s, root, r, out.data()), 1u) << "rank " << r;
    }
  }
}

TEST(Bench, ExpectationsMatchASimulatedReduction) {
  const int n = 5, root = 2;
  for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
    SCOPED_TRACE(std::string(opName(op)));
    Pattern p(chorusInt32, op, n);
    const size_t count = 200;
    auto in = inputs(p, count * n);
    // The reference reduction, in int32 on the filled buffers.
    std::vector<int32_t> ref(count * n);
    for (size_t i = 0; i < count * n; ++i) {
      int32_t acc;
      std::memcpy(&acc, in[0].data() + 4 * i, 4);
      int64_t sum = acc;
      for (int r = 1; r < n; ++r) {
        int32_t v;
        std::memcpy(&v, in[r].data() + 4 * i, 4);
        sum += v;
        if (op == chorusProd) acc *= v;
        if (op == chorusMax) acc = std::max(acc, v);
        if (op == chorusMin) acc = std::min(acc, v);
        if (op == chorusSum) acc += v;
      }
      ref[i] = op == chorusAvg ? static_cast<int32_t>(sum / n) : acc;
    }
    Shape ar = shapeFor(Collective::AllReduce, count * 4, 4, n);
    EXPECT_EQ(countWrong(Collective::AllReduce, p, ar, root, 0, ref.data()), 0u);
    EXPECT_EQ(countWrong(Collective::Reduce, p, ar, root, root, ref.data()), 0u);
    EXPECT_EQ(countWrong(Collective::Reduce, p, ar, root, 0, nullptr), 0u) << "non-root output is not read";
    Shape rs = shapeFor(Collective::ReduceScatter, count * n * 4, 4, n);
    ASSERT_EQ(rs.count, count);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(countWrong(Collective::ReduceScatter, p, rs, root, r, ref.data() + r * count), 0u);
    // The blocks of another rank are wrong somewhere.
    EXPECT_GT(countWrong(Collective::ReduceScatter, p, rs, root, 0, ref.data() + count), 0u);
  }
}

TEST(Bench, IntegerReductionsWrapLikeTheKernels) {
  // 40 ranks of int8 codes up to 126 overflow int8: the expectation is the
  // wrapped two's-complement sum.
  Pattern sum(chorusInt8, chorusSum, 40);
  for (uint64_t i = 0; i < 50; ++i) {
    int total = 0;
    for (int r = 0; r < 40; ++r) total += static_cast<int>(sum.input(r, i));
    EXPECT_EQ(sum.reduced(i), static_cast<double>(static_cast<int8_t>(static_cast<uint8_t>(total & 0xff)))) << i;
  }
  // 64 ranks give 8 factors of 2 per element: 2^8 wraps to 0 in uint8.
  Pattern prod(chorusUint8, chorusProd, 64);
  for (uint64_t i = 0; i < 50; ++i) {
    uint32_t product = 1;
    for (int r = 0; r < 64; ++r) product *= static_cast<uint32_t>(prod.input(r, i));
    EXPECT_EQ(prod.reduced(i), static_cast<double>(product & 0xff)) << i;
  }
}

TEST(Bench, FloatSumsAllowRoundingButNotErrors) {
  Pattern p(chorusFloat16, chorusSum, 8);
  double e = 64;
  EXPECT_TRUE(p.matches(e, e));
  EXPECT_TRUE(p.matches(e * (1 + 0x1p-10), e)) << "one fp16 ulp of reordering";
  EXPECT_FALSE(p.matches(e + 1, e));
  EXPECT_FALSE(p.matches(std::nan(""), e));
  Pattern mx(chorusFloat16, chorusMax, 8);
  EXPECT_FALSE(mx.matches(e * (1 + 0x1p-10), e)) << "max moves values: exact";
  // Narrow types store the inputs rounded; expectations use the stored values.
  Pattern fp8(chorusFloat8e5m2, std::nullopt, 2);
  for (uint64_t i = 0; i < 100; ++i) {
    alignas(8) unsigned char b[8];
    kernels::storeFromDouble(b, chorusFloat8e5m2, fp8.input(1, i));
    EXPECT_EQ(kernels::loadAsDouble(b, chorusFloat8e5m2), fp8.input(1, i));
  }
}

TEST(Bench, EveryTypeAndOpChecksItsOwnExpectationCleanly) {
  for (int dt = 0; dt < chorusNumTypes; ++dt) {
    auto d = static_cast<chorusDataType_t>(dt);
    for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
      SCOPED_TRACE(fmt::format("{} {}", kernels::dtypeName(d), opName(op)));
      Pattern p(d, op, 4);
      Shape s = shapeFor(Collective::AllReduce, 64 * kernels::dtypeSize(d), kernels::dtypeSize(d), 4);
      auto out = buffer(d, s.count);
      for (size_t k = 0; k < s.count; ++k)
        kernels::storeFromDouble(out.data() + k * kernels::dtypeSize(d), d, p.reduced(k));
      EXPECT_EQ(countWrong(Collective::AllReduce, p, s, 0, 0, out.data()), 0u);
    }
  }
}

TEST(Bench, AlgoComesFromChorusAlgo) {
  EXPECT_EQ(algoFor("allreduce:ring;allgather:recursive_doubling", Collective::AllReduce), "ring");
  EXPECT_EQ(algoFor("allreduce:ring;allgather:recursive_doubling", Collective::AllGather), "recursive_doubling");
  EXPECT_EQ(algoFor("allreduce:ring", Collective::Broadcast), "auto");
  EXPECT_EQ(algoFor("", Collective::AllReduce), "auto");
  EXPECT_EQ(algoFor(" reduce : tree ; allreduce:ring", Collective::Reduce), "tree");
  EXPECT_EQ(algoFor("garbage;allreduce:ring", Collective::AllReduce), "ring");
}

TEST(Bench, AlgoOptionReplacesOnlyItsCollective) {
  EXPECT_EQ(withAlgo("", Collective::AllReduce, "ring"), "allreduce:ring");
  EXPECT_EQ(withAlgo("allgather:rd;allreduce:tree", Collective::AllReduce, "ring"), "allgather:rd;allreduce:ring");
  std::string both = withAlgo("allreduce:tree;broadcast:pipeline", Collective::AllReduce, "ring");
  EXPECT_EQ(algoFor(both, Collective::AllReduce), "ring");
  EXPECT_EQ(algoFor(both, Collective::Broadcast), "pipeline");
}

// ---- the table and the JSON rows ------------------------------------------------

std::vector<std::string> fields(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> v;
  for (std::string f; in >> f;) v.push_back(f);
  return v;
}

Row sampleRow() {
  Row r;
  r.collective = Collective::AllReduce;
  r.shape = shapeFor(Collective::AllReduce, 1 << 20, 4, 4);
  r.op = chorusSum;
  r.out_of_place = {123.456, {8.49, 12.74}, 0};
  r.in_place = Measurement{12345.6, {0.08, 0.13}, std::nullopt};
  return r;
}

TEST(Bench, TimeKeepsSevenColumns) {
  EXPECT_EQ(formatTime(5.123), "   5.12");
  EXPECT_EQ(formatTime(123.45), "  123.5");
  EXPECT_EQ(formatTime(12345.6), "  12346");
}

TEST(Bench, RowHasTheNcclTestsColumns) {
  std::string line = formatRow(sampleRow());
  ASSERT_EQ(line.back(), '\n');
  EXPECT_THAT(fields(line), ElementsAre("1048576", "262144", "float32", "sum", "-1", "123.5", "8.49", "12.74", "0",
                                        "12346", "0.08", "0.13", "N/A", "-", "-"));
  Row chosen = sampleRow();
  chosen.out_of_place.algo = "ring";
  chosen.out_of_place.predicted_us = 110.5;
  EXPECT_THAT(fields(formatRow(chosen)), ElementsAre("1048576", "262144", "float32", "sum", "-1", "123.5", "8.49",
                                                     "12.74", "0", "12346", "0.08", "0.13", "N/A", "ring", "110.5"));
  const nlohmann::json j = rowJson(chosen, false, 4, "auto");
  EXPECT_EQ(j["algo"], "ring");
  EXPECT_DOUBLE_EQ(j["predicted_us"].get<double>(), 110.5);
  Row sr;
  sr.collective = Collective::SendRecv;
  sr.shape = shapeFor(Collective::SendRecv, 64, 4, 2);
  sr.out_of_place = {1.0, {0.06, 0.06}, 0};
  EXPECT_THAT(fields(formatRow(sr)), ElementsAre("64", "16", "float32", "none", "-1", "1.00", "0.06", "0.06", "0",
                                                 "N/A", "N/A", "N/A", "N/A", "-", "-"));
}

TEST(Bench, HeaderColumnsLineUpWithRows) {
  std::string header = formatHeader();
  std::istringstream in(header);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u);
  for (const std::string& l : lines) EXPECT_EQ(l[0], '#');
  const std::string& names = lines[2];
  std::string row = formatRow(sampleRow());
  // Right-aligned columns: each name ends where its values end.
  auto endOf = [](const std::string& s, const std::string& word, size_t from = 0) {
    return s.find(word, from) + word.size();
  };
  EXPECT_EQ(endOf(names, "size"), endOf(row, "1048576"));
  EXPECT_EQ(endOf(names, "count"), endOf(row, "262144"));
  EXPECT_EQ(endOf(names, "busbw"), endOf(row, "12.74"));
  const size_t second_busbw = endOf(names, "busbw", endOf(names, "busbw"));
  EXPECT_EQ(endOf(names, "#wrong", second_busbw), endOf(row, "N/A"));
  EXPECT_EQ(names.size(), row.size() - 1) << "both blocks line up (the row ends in '\\n')";
}

TEST(Bench, FooterReportsErrorsAndAverageBusBandwidth) {
  EXPECT_THAT(formatFooter(0, 1.5), HasSubstr("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.5\n"));
  EXPECT_THAT(formatFooter(3, 0), HasSubstr(": 3 FAILED"));
}

TEST(Bench, JsonRowHasEveryField) {
  Row r = sampleRow();
  nlohmann::json out = rowJson(r, false, 4, "ring");
  EXPECT_EQ(out["collective"], "allreduce");
  EXPECT_EQ(out["bytes"], 1048576);
  EXPECT_EQ(out["count"], 262144);
  EXPECT_EQ(out["dtype"], "float32");
  EXPECT_EQ(out["op"], "sum");
  EXPECT_EQ(out["nranks"], 4);
  EXPECT_EQ(out["algo"], "ring");
  EXPECT_EQ(out["inplace"], false);
  EXPECT_DOUBLE_EQ(out["time_us"].get<double>(), 123.456);
  EXPECT_DOUBLE_EQ(out["algbw_gbps"].get<double>(), 8.49);
  EXPECT_DOUBLE_EQ(out["busbw_gbps"].get<double>(), 12.74);
  EXPECT_EQ(out["wrong"], 0);
  EXPECT_TRUE(out["predicted_us"].is_null());
  nlohmann::json in = rowJson(r, true, 4, "ring");
  EXPECT_EQ(in["inplace"], true);
  EXPECT_TRUE(in["wrong"].is_null()) << "unchecked";
  // One line per object (JSON Lines).
  EXPECT_EQ(out.dump().find('\n'), std::string::npos);
}

// ---- runBench end to end, ranks as threads -----------------------------------

TEST(Bench, RunBenchMeasuresAndChecksEveryCollective) {
  constexpr int kRanks = 3;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("bench_test.{}", ::getpid());
  std::filesystem::create_directories(dir);
  for (Collective c : allCollectives()) {
    SCOPED_TRACE(std::string(collectiveName(c)));
    BenchOptions o;
    o.collective = c;
    o.sweep = {64, 4096, 8, 0};  // 64, 512, 4096 B
    o.iters = 2;
    o.warmup = 1;
    o.root = 1;
    o.dtypes = {chorusFloat32, chorusInt8};
    o.ops = {chorusSum, chorusMax};
    o.json_path = (dir / fmt::format("{}.jsonl", collectiveName(c))).string();
    std::vector<std::string> tables(kRanks);
    auto msgs = chorus::testing::runRanks(kRanks, [&](int rank, chorusComm_t comm) -> std::string {
      char* buf = nullptr;
      size_t len = 0;
      std::FILE* out = ::open_memstream(&buf, &len);
      auto wrong = runBench(o, comm, out);
      std::fclose(out);
      tables[rank].assign(buf, len);
      std::free(buf);
      if (!wrong.isOk()) return wrong.status().message();
      return *wrong == 0 ? "" : fmt::format("rank {}: {} wrong elements", rank, *wrong);
    });
    ASSERT_EQ(chorus::testing::failures(msgs), "");
    EXPECT_EQ(tables[1], "") << "only rank 0 prints";
    EXPECT_THAT(tables[0], HasSubstr("# Out of bounds values : 0 OK"));

    const size_t sizes = c == Collective::Barrier ? 1 : 3;
    const size_t ops = takesOp(c) ? 2 : 1;
    const size_t rows = 2 * ops * sizes * (hasInPlace(c) ? 2 : 1);
    std::ifstream in(o.json_path);
    size_t n = 0;
    for (std::string line; std::getline(in, line); ++n) {
      auto j = nlohmann::json::parse(line);
      EXPECT_EQ(j["collective"], collectiveName(c));
      EXPECT_EQ(j["nranks"], kRanks);
      EXPECT_EQ(j["wrong"], 0) << line;
      EXPECT_GE(j["time_us"].get<double>(), 0.0);
    }
    EXPECT_EQ(n, rows);
  }
  std::filesystem::remove_all(dir);
}

// --algo all: one sweep per algorithm, every row names the algorithm that ran
// and its predicted time; an algorithm that does not handle the job (the
// hierarchical one on one host) is skipped with a note instead of silently
// measuring the tuner's fallback.
TEST(Bench, AlgoAllSweepsEachAlgorithm) {
  constexpr int kRanks = 3;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("bench_algos.{}", ::getpid());
  std::filesystem::create_directories(dir);
  BenchOptions o;
  o.collective = Collective::AllReduce;
  o.sweep = {1024, 65536, 64, 0};  // 1 KiB, 64 KiB
  o.iters = 1;
  o.warmup = 0;
  o.algos = {"ring", "direct", "hierarchical", "recursive_doubling"};
  o.json_path = (dir / "algos.jsonl").string();
  std::string table;
  auto msgs = chorus::testing::runRanks(kRanks, [&](int rank, chorusComm_t comm) -> std::string {
    char* buf = nullptr;
    size_t len = 0;
    std::FILE* out = ::open_memstream(&buf, &len);
    auto wrong = runBench(o, comm, out);
    std::fclose(out);
    if (rank == 0) table.assign(buf, len);
    std::free(buf);
    if (!wrong.isOk()) return wrong.status().message();
    return *wrong == 0 ? "" : fmt::format("rank {}: {} wrong elements", rank, *wrong);
  });
  ASSERT_EQ(chorus::testing::failures(msgs), "");
  EXPECT_THAT(table, HasSubstr("algorithm 'hierarchical' does not handle 1024 bytes on 3 ranks"));
  std::map<std::string, int> rows;
  std::ifstream in(o.json_path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    ++rows[j["algo"].get<std::string>()];
    EXPECT_EQ(j["wrong"], 0) << line;
    EXPECT_TRUE(j["predicted_us"].is_number()) << line;
  }
  // 2 sizes x (out of place, in place) per algorithm that runs here.
  EXPECT_EQ(rows, (std::map<std::string, int>{{"direct", 4}, {"recursive_doubling", 4}, {"ring", 4}}));
  std::filesystem::remove_all(dir);
}

// --algo NAME for a size it cannot run: the row is not measured (the tuner
// would have run another plan) and the note says why; counted for the exit status.
TEST(Bench, ForcedAlgorithmThatCannotRunASizeSaysWhyAndMeasuresNothing) {
  constexpr int kRanks = 3;
  BenchOptions o;
  o.collective = Collective::AllGather;
  o.sweep = {1024, 4096, 4, 0};  // 1 KiB, 4 KiB
  o.iters = 1;
  o.warmup = 0;
  o.forced_algo = "recursive_doubling";  // allgather's needs a power-of-two number of ranks
  std::vector<int> unsupported(kRanks, 0);
  std::vector<std::vector<Row>> rows(kRanks);
  std::string table;
  auto msgs = chorus::testing::runRanks(kRanks, [&](int rank, chorusComm_t comm) -> std::string {
    BenchOptions mine = o;
    mine.unsupported = &unsupported[static_cast<size_t>(rank)];
    mine.rows = &rows[static_cast<size_t>(rank)];
    if (chorusCommSetAlgo(comm, "allgather:recursive_doubling") != chorusSuccess) return chorusGetLastError(comm);
    char* buf = nullptr;
    size_t len = 0;
    std::FILE* out = ::open_memstream(&buf, &len);
    auto wrong = runBench(mine, comm, out);
    std::fclose(out);
    if (rank == 0) table.assign(buf, len);
    std::free(buf);
    return wrong.isOk() ? "" : wrong.status().message();
  });
  ASSERT_EQ(chorus::testing::failures(msgs), "");
  EXPECT_THAT(table, HasSubstr("allgather: algorithm 'recursive_doubling' does not handle 1024 bytes on 3 ranks, not measured"));
  EXPECT_THAT(table, HasSubstr("it needs a power-of-two number of ranks; the tuner would run '"));
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(unsupported[static_cast<size_t>(r)], 2) << "rank " << r;
    EXPECT_TRUE(rows[static_cast<size_t>(r)].empty()) << "rank " << r << " measured another plan";
  }
}

// nccl-tests -a (how the ranks' times combine) and -z 0 (timed calls queued on
// a stream): every -a value and both -z values measure and check, the header
// says which were used, every rank reports the one combined time; -a 4 is refused.
TEST(Bench, AverageAndBlockingFollowNcclTests) {
  constexpr int kRanks = 2;
  for (int average : {0, 1, 2, 3})
    for (bool blocking : {true, false}) {
      SCOPED_TRACE(fmt::format("-a {} -z {}", average, blocking ? 1 : 0));
      BenchOptions o;
      o.collective = Collective::AllReduce;
      o.sweep = {4096, 4096, 1, 0};
      o.iters = 3;
      o.warmup = 1;
      o.average = average;
      o.blocking = blocking;
      std::vector<std::vector<Row>> rows(kRanks);
      std::string table;
      auto msgs = chorus::testing::runRanks(kRanks, [&](int rank, chorusComm_t comm) -> std::string {
        BenchOptions mine = o;
        mine.rows = &rows[static_cast<size_t>(rank)];
        char* buf = nullptr;
        size_t len = 0;
        std::FILE* out = ::open_memstream(&buf, &len);
        auto wrong = runBench(mine, comm, out);
        std::fclose(out);
        if (rank == 0) table.assign(buf, len);
        std::free(buf);
        if (!wrong.isOk()) return wrong.status().message();
        return *wrong == 0 ? "" : fmt::format("{} wrong", *wrong);
      });
      ASSERT_EQ(chorus::testing::failures(msgs), "");
      EXPECT_THAT(table, HasSubstr(fmt::format("average: {}({}) blocking: {}", average, averageName(average),
                                               blocking ? 1 : 0)));
      ASSERT_EQ(rows[0].size(), 1u);
      ASSERT_EQ(rows[1].size(), 1u);
      EXPECT_EQ(rows[0][0].out_of_place.time_us, rows[1][0].out_of_place.time_us) << "every rank reports one time";
      EXPECT_GT(rows[0][0].out_of_place.time_us, 0.0);
    }
  BenchOptions bad;
  bad.average = 4;
  auto msgs = chorus::testing::runRanks(1, [&](int, chorusComm_t comm) -> std::string {
    auto r = runBench(bad, comm, stdout);
    return r.isOk() ? "accepted -a 4" : (r.status().message().find("-a 4") == std::string::npos ? r.status().message() : "");
  });
  EXPECT_EQ(chorus::testing::failures(msgs), "");
}

TEST(Bench, RunBenchRejectsARootOutsideTheJob) {
  BenchOptions o;
  o.collective = Collective::Broadcast;
  o.root = 5;
  o.sweep = {64, 64, 2, 0};
  auto msgs = chorus::testing::runRanks(2, [&](int, chorusComm_t comm) -> std::string {
    // Every rank past init before one returns and destroys its communicator.
    if (chorusBarrier(comm, nullptr) != chorusSuccess) return chorusGetLastError(comm);
    auto r = runBench(o, comm, stdout);
    return r.isOk() ? "accepted root 5 of 2 ranks" : "";
  });
  EXPECT_EQ(chorus::testing::failures(msgs), "");
}

}  // namespace
}  // namespace chorus::tools::bench
