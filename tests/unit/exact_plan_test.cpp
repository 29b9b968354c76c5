// The exact plans (src/plan/exact.cpp), proven by the verifier for every
// rank count, ragged counts, slices, word counts and in place; hand-built
// plans that round a partial sum, combine floats or leave words in the
// output are rejected; the tuner offers exact plans only to exact shapes
// and the cost model prices their conversions.
#include <gtest/gtest.h>

#include "plan/plan.hpp"
#include "plan/verify.hpp"
#include "tune/cost_model.hpp"
#include "tune/tuner.hpp"

namespace chorus::plan {
namespace {

VerifyCase exactCase(Collective c, int n, uint64_t count, bool inplace, uint64_t chunk, uint32_t words) {
  VerifyCase vc;
  vc.shape.coll = c;
  vc.shape.nranks = n;
  vc.shape.count = count;
  vc.shape.inplace = inplace;
  vc.shape.chunk_elems = chunk;
  vc.shape.elem_size = 4;
  vc.shape.exact_words = words;
  return vc;
}

TEST(ExactPlan, EveryExactAlgorithmVerifies) {
  Registry reg = Registry::builtin();
  int verified = 0;
  for (const auto& algo : reg.all()) {
    if (!algo->exact()) continue;
    for (int n : {1, 2, 3, 4, 5, 8}) {
      for (uint64_t count : {0, 1, 7, 33}) {
        for (uint64_t chunk : {0, 2, 5}) {
          for (bool inplace : {false, true}) {
            for (uint32_t words : {1u, 2u}) {
              VerifyCase vc = exactCase(algo->collective(), n, count, inplace, chunk, words);
              ASSERT_TRUE(algo->supports(vc.shape));
              Status st = verify(*algo, vc);
              ASSERT_TRUE(st.isOk()) << st.message() << " chunk " << chunk << " words " << words;
              ++verified;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(verified, 2 * 6 * 4 * 3 * 2 * 2);
}

// Hand-built plans an exact shape must reject.  Two ranks, each element's
// words one int64 (8 bytes).
enum class Flaw { FloatSum, EncodeReceived, EncodeOutsideExact, DecodeFloats, DecodeAddReceived };
class FlawedAllReduce final : public Algorithm {
 public:
  explicit FlawedAllReduce(Flaw f) : flaw_(f) {}
  std::string_view name() const override { return "flawed"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool exact() const override { return true; }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const uint64_t c = sh.count;
    const int peer = 1 - r;
    switch (flaw_) {
      case Flaw::FloatSum:  // the plain exchange: floats added, rounded per add
        b.send(peer, in(0, c));
        b.recvReduce(peer, out(0, c), in(0, c));
        return;
      case Flaw::EncodeReceived: {  // the peer's words decoded, then re-encoded: a rounded partial sum
        const Region w = b.wire(8 * c), x = b.wire(8 * c), y = b.wire(8 * c);
        b.encode(w, in(0, c));
        b.send(peer, w);
        b.recv(peer, x);
        const Region tmp = b.scratch(c);
        b.decode(tmp, x);
        b.encode(y, tmp);
        b.recvReduce(peer, w, w);  // never sent: the verifier stops at the encode
        b.decode(out(0, c), y);
        return;
      }
      case Flaw::EncodeOutsideExact: {
        const Region w = b.wire(8 * c);
        b.encode(w, in(0, c));
        b.decode(out(0, c), w);
        return;
      }
      case Flaw::DecodeAddReceived: {  // the last term added is the peer's float, not this rank's input
        const Region w = b.wire(8 * c), x = b.wire(8 * c);
        const Region theirs = b.scratch(c);
        b.send(peer, in(0, c));
        b.recv(peer, theirs);
        b.encode(w, in(0, c));
        b.send(peer, w);
        b.recv(peer, x);
        b.decodeAdd(out(0, c), theirs, x);
        return;
      }
      case Flaw::DecodeFloats: {  // eight floats land where one element's words belong
        const Region w = b.wire(8);
        b.send(peer, in(0, 8));
        b.recv(peer, w);
        b.decode(out(0, 1), w);
        return;
      }
    }
  }

 private:
  Flaw flaw_;
};

TEST(ExactPlan, PlansThatRoundPartialSumsOrMixFloatsAreRejected) {
  auto check = [](Flaw f, uint32_t words, uint64_t count, std::string_view want) {
    FlawedAllReduce algo(f);
    VerifyCase vc = exactCase(Collective::AllReduce, 2, count, false, 0, words);
    Status st = verify(algo, vc);
    ASSERT_FALSE(st.isOk()) << want;
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  };
  check(Flaw::FloatSum, 1, 3, "an exact plan adds accumulator words only");
  check(Flaw::EncodeReceived, 1, 3, "(a rounded value)");
  check(Flaw::EncodeOutsideExact, 0, 3, "the plan is not exact");
  check(Flaw::DecodeFloats, 1, 8, "not accumulator words");
  check(Flaw::DecodeAddReceived, 1, 3, "as this rank's own input");
}

// The tuner offers the exact plans to exact shapes only (and nothing else to
// them); the price counts the words on the wire and the conversions.
TEST(ExactPlan, TunerOffersExactPlansOnlyToExactShapesAndPricesThem) {
  Registry reg = Registry::builtin();
  const std::vector<int> one_host(4, 0);
  tune::Topology topo{4, 4, true, one_host, true};
  auto tuner = tune::Tuner::create(reg, topo, "", 0);
  ASSERT_TRUE(tuner.isOk()) << tuner.status().message();
  for (Collective c : {Collective::AllReduce, Collective::ReduceScatter}) {
    Shape sh;
    sh.coll = c;
    sh.nranks = 4;
    sh.count = 1u << 20;
    sh.hosts = one_host;
    auto plain = tuner->choose(sh, chorusFloat32);
    ASSERT_TRUE(plain.isOk());
    EXPECT_FALSE(plain->algo->exact()) << collectiveName(c);
    sh.exact_words = 1;
    auto exact = tuner->choose(sh, chorusFloat32);
    ASSERT_TRUE(exact.isOk()) << exact.status().message();
    EXPECT_TRUE(exact->algo->exact()) << collectiveName(c);
    // The slice counts words: 8 bytes per element where the data has 4.
    EXPECT_EQ(exact->chunk_bytes, plain->chunk_bytes / 2) << collectiveName(c);
    tune::CostProfile prof;
    Shape priced = sh;
    priced.chunk_elems = exact->chunk_bytes / 4;
    auto t1 = tune::predictSeconds(*exact->algo, priced, chorusFloat32, prof, one_host);
    priced.exact_words = 2;
    auto t2 = tune::predictSeconds(*exact->algo, priced, chorusFloat32, prof, one_host);
    Shape unc = priced;
    unc.exact_words = 0;
    auto t0 = tune::predictSeconds(*plain->algo, unc, chorusFloat32, prof, one_host);
    ASSERT_TRUE(t0.isOk() && t1.isOk() && t2.isOk());
    EXPECT_GT(t1->value(), t0->value()) << collectiveName(c);
    EXPECT_GT(t2->value(), t1->value()) << collectiveName(c);
  }
  // No exact plan of a reduce: the call planner converts around a word plan.
  Shape red;
  red.coll = Collective::Reduce;
  red.nranks = 4;
  red.count = 1024;
  red.exact_words = 1;
  EXPECT_FALSE(tuner->choose(red, chorusFloat32).isOk());
}

// The rounds the cost models price move the bytes the programs send.
TEST(ExactPlan, RoundsCarryTheProgramsBytes) {
  Registry reg = Registry::builtin();
  for (const auto& algo : reg.all()) {
    if (!algo->exact()) continue;
    for (int n : {2, 3, 5}) {
      Shape sh = exactCase(algo->collective(), n, 60, false, 0, 2).shape;  // even blocks: rounds price the largest
      auto rounds = algo->rounds(sh);
      ASSERT_TRUE(rounds.isOk());
      double round_bytes = 0;
      for (const Round& rd : *rounds)
        forEachMessage(rd, n, [&](int, int, uint64_t e) { round_bytes += static_cast<double>(rd.repeat * e) * 4; });
      double sent = 0;
      for (int r = 0; r < n; ++r) {
        Program p;
        expand(*algo, sh, r, &p);
        for (const Step& st : p.steps)
          if (st.op == StepOp::Send) sent += static_cast<double>(regionBytes(st.src, sh.elem_size));
      }
      EXPECT_DOUBLE_EQ(round_bytes, sent) << algo->name() << " " << collectiveName(algo->collective()) << " n " << n;
    }
  }
}

}  // namespace
}  // namespace chorus::plan
