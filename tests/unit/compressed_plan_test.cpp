// The compressed plans (src/plan/compressed.cpp), proven by the verifier for
// every rank count, ragged counts, slices and in place, with each format; and
// plans that quantize an element more often than they declare are rejected.
#include <gtest/gtest.h>

#include "plan/plan.hpp"
#include "plan/verify.hpp"
#include "tune/cost_model.hpp"
#include "tune/tuner.hpp"

namespace chorus::plan {
namespace {

VerifyCase compressedCase(Collective c, int n, uint64_t count, bool inplace, uint64_t chunk,
                          kernels::WireFormat fmt) {
  VerifyCase vc;
  vc.shape.coll = c;
  vc.shape.nranks = n;
  vc.shape.count = count;
  vc.shape.inplace = inplace;
  vc.shape.chunk_elems = chunk;
  vc.shape.wire = fmt;
  return vc;
}

const kernels::WireFormat kFormats[] = {{kernels::WireFormat::Bf16, 128}, {kernels::WireFormat::Fp8E4m3, 32},
                                        {kernels::WireFormat::Fp8E4m3, 1024}};

TEST(CompressedPlan, EveryCompressedAlgorithmVerifiesAndDeclaresItsCount) {
  Registry reg = Registry::builtin();
  int verified = 0;
  for (const auto& algo : reg.all()) {
    if (!algo->compressed()) continue;
    const Collective c = algo->collective();
    EXPECT_EQ(algo->quantizations(compressedCase(c, 4, 8, false, 0, kFormats[0]).shape),
              c == Collective::AllReduce ? 2 : 1);
    for (int n : {1, 2, 3, 4, 5, 8, 13}) {
      for (uint64_t count : {0, 1, 7, 33, 100}) {
        for (uint64_t chunk : {0, 16}) {
          for (bool inplace : {false, true}) {
            for (const auto& fmt : kFormats) {
              VerifyCase vc = compressedCase(c, n, count, inplace, chunk, fmt);
              if (!algo->supports(vc.shape)) {  // needs a host layout: below
                ASSERT_EQ(algo->name(), "compressed_hierarchical");
                continue;
              }
              Status st = verify(*algo, vc);
              ASSERT_TRUE(st.isOk()) << st.message();
              ++verified;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(verified, 3 * 7 * 5 * 2 * 2 * 3);
  // And one large rank count.
  for (const auto& algo : reg.all())
    if (algo->compressed()) {
      VerifyCase vc = compressedCase(algo->collective(), 31, 70, true, 8, kFormats[1]);
      if (!algo->supports(vc.shape)) continue;
      Status st = verify(*algo, vc);
      EXPECT_TRUE(st.isOk()) << st.message();
    }
}

TEST(CompressedPlan, CompressedAlgorithmsTakeOnlyCompressedFp32Shapes) {
  Registry reg = Registry::builtin();
  int seen = 0;
  const std::vector<int> two_hosts = {0, 0, 1, 1};
  for (const auto& algo : reg.all()) {
    VerifyCase vc = compressedCase(algo->collective(), 4, 64, false, 0, kFormats[1]);
    vc.shape.hosts = two_hosts;
    if (!algo->compressed()) continue;
    ++seen;
    EXPECT_TRUE(algo->supports(vc.shape));
    vc.shape.wire.reset();
    EXPECT_FALSE(algo->supports(vc.shape)) << algo->name();
    vc.shape.wire = kernels::WireFormat{kernels::WireFormat::Fp8E4m3, 16};  // block out of range
    EXPECT_FALSE(algo->supports(vc.shape));
    vc.shape.wire = kFormats[0];
    vc.shape.elem_size = 8;
    EXPECT_FALSE(algo->supports(vc.shape));
  }
  EXPECT_EQ(seen, 4);
}

// The two-level compressed allreduce on host layouts: contiguous and
// round-robin hosts of 2 and 3 ranks; uneven layouts and one host refused.
TEST(CompressedPlan, HierarchicalVerifiesOnHostLayouts) {
  Registry reg = Registry::builtin();
  const Algorithm* algo = reg.find(Collective::AllReduce, "compressed_hierarchical");
  ASSERT_NE(algo, nullptr);
  int verified = 0;
  for (int H : {2, 3})
    for (int L : {2, 3})
      for (bool round_robin : {false, true}) {
        const int n = H * L;
        std::vector<int> hosts(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) hosts[static_cast<size_t>(r)] = round_robin ? r % H : r / L;
        for (uint64_t count : {0, 1, 7, 33, 100})
          for (uint64_t chunk : {0, 4})
            for (bool inplace : {false, true})
              for (const auto& fmt : kFormats) {
                VerifyCase vc = compressedCase(Collective::AllReduce, n, count, inplace, chunk, fmt);
                vc.hosts = hosts;
                vc.shape.hosts = vc.hosts;
                ASSERT_TRUE(algo->supports(vc.shape));
                Status st = verify(*algo, vc);
                ASSERT_TRUE(st.isOk()) << st.message();
                ++verified;
              }
      }
  EXPECT_EQ(verified, 2 * 2 * 2 * 5 * 2 * 2 * 3);
  VerifyCase uneven = compressedCase(Collective::AllReduce, 5, 10, false, 0, kFormats[0]);
  const std::vector<int> h5 = {0, 0, 0, 1, 1}, one = {0, 0, 0, 0, 0};
  uneven.shape.hosts = h5;
  EXPECT_FALSE(algo->supports(uneven.shape));
  uneven.shape.hosts = one;
  EXPECT_FALSE(algo->supports(uneven.shape));
}

// An allgather that relays every block through the next rank, quantizing it
// again there: each element is quantized twice, but it declares once.
class RelayingAllGather final : public Algorithm {
 public:
  explicit RelayingAllGather(int declared) : declared_(declared) {}
  std::string_view name() const override { return "relaying"; }
  Collective collective() const override { return Collective::AllGather; }
  bool compressed() const override { return true; }
  int quantizations(const Shape&) const override { return declared_; }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    const uint64_t wb = kernels::wireBytes(*sh.wire, c);
    auto slot = [&](int j) { return out(static_cast<uint64_t>(j) * c, c); };
    // Own block: quantize, decode into the own slot (every rank agrees).
    const Region w = b.wire(wb);
    b.quantize(w, in(0, c));
    b.dequantize(slot(r), w);
    // Ring: pass the decoded block of rank r - k on to r + 1, re-quantized.
    for (int k = 0; k + 1 < n; ++k) {
      const int have = ((r - k) % n + n) % n, get = ((r - k - 1) % n + n) % n;
      const Region ws = b.wire(wb);
      b.quantize(ws, slot(have));
      b.send((r + 1) % n, ws);
      const Region wr = b.wire(wb);
      b.recv(((r - 1) % n + n) % n, wr);
      b.dequantize(slot(get), wr);
    }
  }

 private:
  int declared_;
};

TEST(CompressedPlan, PlansQuantizingMoreThanTheyDeclareAreRejected) {
  // With 3 ranks a block travels two hops: quantized at its owner, again
  // before hop 1 and again before hop 2 (3 times).
  RelayingAllGather once(1);
  Status st = verify(once, compressedCase(Collective::AllGather, 3, 5, false, 0, kFormats[0]));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("declares at most 1"), std::string::npos) << st.message();
  RelayingAllGather twice(2);
  st = verify(twice, compressedCase(Collective::AllGather, 3, 5, false, 0, kFormats[1]));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("declares at most 2"), std::string::npos) << st.message();
  // The true count, the owner's quantization plus one per hop (n - 1 = 2),
  // proves it.
  RelayingAllGather honest(3);
  st = verify(honest, compressedCase(Collective::AllGather, 3, 5, false, 0, kFormats[1]));
  EXPECT_TRUE(st.isOk()) << st.message();
}

// A plan that quantizes while declaring none, and one whose wire region is
// the wrong size for its elements.
class SloppyAllGather final : public Algorithm {
 public:
  explicit SloppyAllGather(bool short_wire) : short_wire_(short_wire) {}
  std::string_view name() const override { return "sloppy"; }
  Collective collective() const override { return Collective::AllGather; }
  bool compressed() const override { return true; }
  int quantizations(const Shape&) const override { return short_wire_ ? 1 : 0; }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const uint64_t c = sh.count;
    const Region w = b.wire(kernels::wireBytes(*sh.wire, c) - (short_wire_ ? 1 : 0));
    b.quantize(w, in(0, c));
    for (int k = 1; k < sh.nranks; ++k) b.send((r + k) % sh.nranks, w);
    b.dequantize(out(static_cast<uint64_t>(r) * c, c), w);
    for (int k = 1; k < sh.nranks; ++k) {
      const int from = ((r - k) % sh.nranks + sh.nranks) % sh.nranks;
      const Region x = b.wire(w.count);
      b.recv(from, x);
      b.dequantize(out(static_cast<uint64_t>(from) * c, c), x);
    }
  }

 private:
  bool short_wire_;
};

TEST(CompressedPlan, UndeclaredQuantizationAndMisSizedWireAreRejected) {
  SloppyAllGather undeclared(false);
  Status st = verify(undeclared, compressedCase(Collective::AllGather, 2, 9, false, 0, kFormats[0]));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("declares at most 0"), std::string::npos) << st.message();
  SloppyAllGather short_wire(true);
  st = verify(short_wire, compressedCase(Collective::AllGather, 2, 9, false, 0, kFormats[1]));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("wire region"), std::string::npos) << st.message();
}

// The tuner: a compressed call gets a compressed plan, an uncompressed call
// never does; the price counts the wire bytes and the (de)quantize passes.
TEST(CompressedPlan, TunerOffersCompressionOnlyWhereAllowedAndPricesIt) {
  Registry reg = Registry::builtin();
  const std::vector<int> hosts = {0, 1, 2, 3};  // four hosts: TCP links
  tune::Topology topo{4, 1, false, hosts, false};
  auto tuner = tune::Tuner::create(reg, topo, "", 0);
  ASSERT_TRUE(tuner.isOk()) << tuner.status().message();
  for (Collective c : {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather}) {
    Shape sh;
    sh.coll = c;
    sh.nranks = 4;
    sh.count = 16u << 20;  // 64 MiB of fp32 (per rank's block for the gather types)
    sh.hosts = hosts;
    auto plain = tuner->choose(sh, chorusFloat32);
    ASSERT_TRUE(plain.isOk());
    EXPECT_FALSE(plain->algo->compressed()) << collectiveName(c);
    sh.wire = kernels::WireFormat{kernels::WireFormat::Bf16, 128};
    auto bf16 = tuner->choose(sh, chorusFloat32);
    ASSERT_TRUE(bf16.isOk());
    EXPECT_TRUE(bf16->algo->compressed()) << collectiveName(c);
    // On 1 Gbit/s links (bench/compress.sh's cluster) cheaper than the best
    // uncompressed plan at this size, fp8 cheaper still; on one host, where
    // the links are memory copies, the kernels' work is what it costs.
    tune::CostProfile prof;
    prof.links["tcp"].beta = prof.links["tcp"].beta_large = chorus::SecondsPerByte(1.0 / 125e6);
    Shape priced = sh;
    priced.chunk_elems = (1u << 20) / 4;
    auto t_bf16 = tune::predictSeconds(*bf16->algo, priced, chorusFloat32, prof, hosts);
    priced.wire = kernels::WireFormat{kernels::WireFormat::Fp8E4m3, 128};
    auto t_fp8 = tune::predictSeconds(*bf16->algo, priced, chorusFloat32, prof, hosts);
    Shape unc = priced;
    unc.wire.reset();
    auto t_plain = tune::predictSeconds(*plain->algo, unc, chorusFloat32, prof, hosts);
    ASSERT_TRUE(t_bf16.isOk() && t_fp8.isOk() && t_plain.isOk());
    EXPECT_LT(t_bf16->value(), t_plain->value()) << collectiveName(c);
    EXPECT_LT(t_fp8->value(), t_bf16->value()) << collectiveName(c);
    const std::vector<int> one_host(4, 0);
    Shape local = priced;
    local.hosts = one_host;
    auto t_local = tune::predictSeconds(*bf16->algo, local, chorusFloat32, prof, one_host);
    local.wire.reset();
    auto t_local_plain = tune::predictSeconds(*plain->algo, local, chorusFloat32, prof, one_host);
    ASSERT_TRUE(t_local.isOk() && t_local_plain.isOk());
    fprintf(stderr, "%s 64 MiB, 1 host: plain %.1f ms, fp8 %.1f ms\n", std::string(collectiveName(c)).c_str(),
            t_local_plain->value() * 1e3, t_local->value() * 1e3);
    fprintf(stderr, "%s 64 MiB, 4 hosts: plain %s %.1f ms, bf16 %.1f ms, fp8 %.1f ms\n",
            std::string(collectiveName(c)).c_str(), std::string(plain->algo->name()).c_str(), t_plain->value() * 1e3,
            t_bf16->value() * 1e3, t_fp8->value() * 1e3);
  }
}

// Two hosts of two ranks on 1 Gbit/s links (bench/compress.sh): the direct
// plan sends every rank's quantized blocks across, twice the bytes through
// each host's one link that the hierarchical plan sends (it sums in fp32
// inside the host first), so the tuner must pick the hierarchical one for
// both formats (measured there: fp8 4.3x over fp32 hierarchical, direct
// 2.1x).  The model bounds each round by the bytes through a host's link
// (cost_model.cpp).  And one format's choice is not another's: the tuner's
// memo used to hand fp8 calls the plan it had chosen for bf16.
TEST(CompressedPlan, TunerSendsEachByteAcrossOnceOnHostsOfSeveralRanks) {
  Registry reg = Registry::builtin();
  const std::vector<int> hosts = {0, 0, 1, 1};
  tune::Topology topo{4, 2, false, hosts, false};
  tune::CostProfile slow;
  slow.links["tcp"].beta = slow.links["tcp"].beta_large = chorus::SecondsPerByte(1.0 / 125e6);
  auto tuner = tune::Tuner::create(reg, topo, "", 0, slow);
  ASSERT_TRUE(tuner.isOk()) << tuner.status().message();
  auto shape = [&](uint64_t count, kernels::WireFormat::Kind kind) {
    Shape sh;
    sh.coll = Collective::AllReduce;
    sh.nranks = 4;
    sh.count = count;
    sh.hosts = hosts;
    sh.wire = kernels::WireFormat{kind, 128};
    return sh;
  };
  for (uint64_t count : {uint64_t{1} << 20, uint64_t{16} << 20}) {
    for (auto kind : {kernels::WireFormat::Bf16, kernels::WireFormat::Fp8E4m3}) {
      auto ch = tuner->choose(shape(count, kind), chorusFloat32);
      ASSERT_TRUE(ch.isOk()) << ch.status().message();
      EXPECT_EQ(ch->algo->name(), "compressed_hierarchical")
          << count << " elements, " << (kind == kernels::WireFormat::Bf16 ? "bf16" : "fp8");
    }
  }
  // The memo: on the built-in (fast) links a tuner that priced bf16 first
  // chooses for fp8 what a fresh one does.
  auto warm = tune::Tuner::create(reg, topo, "", 0, tune::CostProfile());
  auto fresh = tune::Tuner::create(reg, topo, "", 0, tune::CostProfile());
  ASSERT_TRUE(warm.isOk() && fresh.isOk());
  for (uint64_t count : {uint64_t{1} << 20, uint64_t{16} << 20}) {
    ASSERT_TRUE(warm->choose(shape(count, kernels::WireFormat::Bf16), chorusFloat32).isOk());
    auto a = warm->choose(shape(count, kernels::WireFormat::Fp8E4m3), chorusFloat32);
    auto b = fresh->choose(shape(count, kernels::WireFormat::Fp8E4m3), chorusFloat32);
    ASSERT_TRUE(a.isOk() && b.isOk());
    EXPECT_EQ(a->algo->name(), b->algo->name()) << count;
    EXPECT_DOUBLE_EQ(a->predicted_s, b->predicted_s) << count;
  }
}

// One rank per host: the compressed allreduce forwards the quantized sums
// around a ring, so the tuner cuts it in slices of kWireSliceCompressed wire
// bytes (bf16: twice that of fp32; fp8 with its scales: about four times),
// where other calls keep the across-hosts slice; several ranks per host keep
// it too, and CHORUS_CHUNK_BYTES (the override) wins.
TEST(CompressedPlan, TunerSlicesACompressedCallAcrossOneRankHostsByItsWireBytes) {
  Registry reg = Registry::builtin();
  auto choose = [&](std::vector<int> hosts, int local, std::optional<kernels::WireFormat> wire, uint64_t over = 0) {
    tune::Topology topo{static_cast<int>(hosts.size()), local, false, hosts, false};
    auto tuner = tune::Tuner::create(reg, topo, "", over, tune::CostProfile());
    EXPECT_TRUE(tuner.isOk());
    Shape sh;
    sh.coll = Collective::AllReduce;
    sh.nranks = static_cast<int>(hosts.size());
    sh.count = uint64_t{4} << 20;
    sh.hosts = hosts;
    sh.wire = wire;
    auto ch = tuner->choose(sh, chorusFloat32);
    EXPECT_TRUE(ch.isOk()) << ch.status().message();
    return *ch;
  };
  const std::vector<int> flat = {0, 1, 2, 3}, two_by_two = {0, 0, 1, 1};
  const kernels::WireFormat bf16{kernels::WireFormat::Bf16, 128}, fp8{kernels::WireFormat::Fp8E4m3, 128};
  const tune::Choice b = choose(flat, 1, bf16);
  EXPECT_EQ(b.algo->name(), "compressed_direct");
  EXPECT_EQ(b.chunk_bytes, 2 * tune::kWireSliceCompressed);
  const uint64_t f = choose(flat, 1, fp8).chunk_bytes;  // 4 B per element over 1 + 4/128 B
  EXPECT_GT(f, 3 * tune::kWireSliceCompressed);
  EXPECT_LT(f, 4 * tune::kWireSliceCompressed);
  EXPECT_EQ(choose(flat, 1, std::nullopt).chunk_bytes, plan::kChunkBytesAcrossHosts);
  EXPECT_EQ(choose(two_by_two, 2, bf16).chunk_bytes, plan::kChunkBytesAcrossHosts);
  // Hosts of 2 and 1 ranks: the rank alone on its host slices as its peers
  // do (programs cut differently on two ranks would not match).
  EXPECT_EQ(choose({0, 0, 1}, 1, bf16).chunk_bytes, plan::kChunkBytesAcrossHosts);
  EXPECT_EQ(choose({0, 0, 1}, 2, bf16).chunk_bytes, plan::kChunkBytesAcrossHosts);
  EXPECT_EQ(choose(flat, 1, bf16, 64u << 10).chunk_bytes, uint64_t{64} << 10);
}

}  // namespace
}  // namespace chorus::plan
