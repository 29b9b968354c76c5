// The board runner (exec/board_runner.hpp) against a serial execution of the
// same programs with real messages: every one-shot plan, 2-7 ranks, in place
// and not, in rank order and in the canonical tree, on float data whose sums
// depend on the order of combination, so "the same bits" means "the same
// operations in the same order".  The board here is in-process: every rank
// publishes, then every rank runs (a rank only reads its peers' slots, which
// do not change during the call).  Also: the runner refuses plans the board
// cannot run, and a peer's slot of another call is a mismatch naming it.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "exec/board_runner.hpp"
#include "kernels/reduce.hpp"
#include "plan/plan.hpp"

namespace chorus {
namespace {

using plan::Buf;
using plan::Collective;
using plan::StepOp;

// Buffers of one rank: input and output (aliased in place) and scratch.
struct RankBufs {
  std::vector<std::byte> in, out, scratch;
  std::array<std::byte*, 3> ptrs{};
};

RankBufs makeBufs(const plan::Shape& sh, int r, const plan::Program& p, size_t es, uint32_t seed) {
  RankBufs b;
  const uint64_t in_e = sh.coll == Collective::Broadcast ? sh.count : sh.inputElems(r);
  const uint64_t out_e = sh.outputElems(r);
  b.in.resize(in_e * es);
  b.out.resize(std::max(out_e, in_e) * es);
  b.scratch.resize(p.scratch_elems * es + 8);
  std::mt19937 rng(seed * 977 + static_cast<uint32_t>(r));
  std::uniform_real_distribution<float> d(-1e3f, 1e3f);
  std::vector<std::byte>& src = sh.inplace ? b.out : b.in;
  const plan::Alias al = plan::inplaceAlias(sh, r);
  const uint64_t at = sh.inplace && al.to == Buf::Output ? al.offset : 0;
  for (uint64_t i = 0; i < in_e; ++i) {
    const float v = d(rng) * (i % 3 == 0 ? 1e-4f : 1.0f);
    std::memcpy(src.data() + (at + i) * es, &v, es);
  }
  b.ptrs = {b.in.data(), b.out.data(), b.scratch.data()};
  if (sh.inplace) {
    // NCCL's conventions: one user buffer; the program names only one.
    if (al.to == Buf::Output) b.ptrs[0] = b.out.data() + al.offset * es;
    if (al.to == Buf::Input) {  // reduce-scatter: the output is block r of the input
      b.in = b.out;
      b.ptrs[0] = b.in.data();
      b.ptrs[1] = b.in.data() + al.offset * es;
    }
  }
  return b;
}

std::byte* at(RankBufs& b, const plan::Region& r, size_t es) { return b.ptrs[static_cast<size_t>(r.buf)] + r.offset * es; }

// Runs every rank's program in program order with FIFO messages per pair
// (a rank blocks at a receive whose message has not been sent yet).
void runSerial(std::vector<plan::Program>& progs, std::vector<RankBufs>& bufs, size_t es, const kernels::Reducer& red,
               const kernels::Scalar& scalar) {
  const size_t n = progs.size();
  std::map<std::pair<int, int>, std::deque<std::vector<std::byte>>> q;
  std::vector<size_t> pc(n, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < n; ++r) {
      for (; pc[r] < progs[r].steps.size(); ++pc[r]) {
        const plan::Step& s = progs[r].steps[pc[r]];
        RankBufs& b = bufs[r];
        if (s.op == StepOp::Send) {
          const std::byte* p = at(b, s.src, es);
          q[{static_cast<int>(r), s.peer}].emplace_back(p, p + s.src.count * es);
        } else if (s.op == StepOp::Recv || s.op == StepOp::RecvReduce) {
          auto& fifo = q[{s.peer, static_cast<int>(r)}];
          if (fifo.empty()) break;
          std::vector<std::byte> m = std::move(fifo.front());
          fifo.pop_front();
          if (s.op == StepOp::Recv)
            std::memcpy(at(b, s.dst, es), m.data(), m.size());
          else
            red(at(b, s.dst, es), at(b, s.src, es), m.data(), s.dst.count);
        } else if (s.op == StepOp::Copy) {
          std::memmove(at(b, s.dst, es), at(b, s.src, es), s.dst.count * es);
        } else if (s.op == StepOp::Scale) {
          kernels::scale(at(b, s.dst, es), at(b, s.src, es), s.dst.count, scalar.dtype, scalar);
        } else if (s.op == StepOp::Divide) {
          kernels::divide(at(b, s.dst, es), at(b, s.dst, es), s.dst.count, red.dtype(), progs[r].divisor);
        } else {
          red(at(b, s.dst, es), at(b, s.src, es), at(b, s.src2, es), s.dst.count);
        }
        moved = true;
      }
    }
  }
  for (size_t r = 0; r < n; ++r) ASSERT_EQ(pc[r], progs[r].steps.size()) << "rank " << r << " is stuck";
}

// An in-process board: slot(k) of every rank, awaited at once.
class FakeBoard final : public transport::Board {
 public:
  FakeBoard(std::vector<std::vector<std::byte>>* slots, std::vector<transport::CallSignature>* sigs, int rank)
      : slots_(slots), sigs_(sigs), rank_(rank) {}
  std::byte* slot(uint64_t) override { return (*slots_)[static_cast<size_t>(rank_)].data(); }
  void publish(uint64_t, const transport::CallSignature& sig) override { (*sigs_)[static_cast<size_t>(rank_)] = sig; }
  void settle() override {}
  Result<const std::byte*> await(int peer, uint64_t, std::chrono::milliseconds, transport::CallSignature* sig) override {
    ++awaits;
    if (sig) *sig = (*sigs_)[static_cast<size_t>(peer)];
    return static_cast<const std::byte*>((*slots_)[static_cast<size_t>(peer)].data());
  }
  bool signature(int, uint64_t, transport::CallSignature*) const override { return false; }
  uint64_t slotCall(int, uint64_t) const override { return 0; }
  int awaits = 0;

 private:
  std::vector<std::vector<std::byte>>* slots_;
  std::vector<transport::CallSignature>* sigs_;
  int rank_;
};

struct Case {
  Collective coll;
  int n;
  bool inplace, canonical;
  uint64_t count;
  // Avg: the plan ends in a Divide step; PreMulSum starts with a Scale step,
  // and the board publishes the input scaled.
  plan::Scaling scaling = plan::Scaling::None;
};

// The board runner's outputs for every rank equal the serial run's, bit for bit.
void checkCase(const plan::Registry& reg, const Case& c) {
  SCOPED_TRACE(::testing::Message() << plan::collectiveName(c.coll) << " n=" << c.n << " inplace=" << c.inplace
                                    << " canonical=" << c.canonical << " count=" << c.count
                                    << " scaling=" << static_cast<int>(c.scaling));
  const plan::Algorithm* algo = reg.find(c.coll, "oneshot");
  ASSERT_NE(algo, nullptr);
  plan::Shape sh;
  sh.coll = c.coll;
  sh.nranks = c.n;
  sh.count = c.count;
  sh.elem_size = 4;
  sh.root = c.n - 1;
  sh.inplace = c.inplace;
  sh.canonical = c.canonical;
  sh.scaling = c.scaling;
  if (!algo->supports(sh)) return;
  const size_t es = 4;
  const kernels::Reducer red(chorusFloat32, kernels::BinOp::Sum);
  std::vector<plan::Program> progs(static_cast<size_t>(c.n));
  std::vector<RankBufs> serial, board;
  for (int r = 0; r < c.n; ++r) {
    plan::expand(*algo, sh, r, &progs[static_cast<size_t>(r)]);
    serial.push_back(makeBufs(sh, r, progs[static_cast<size_t>(r)], es, 7));
    board.push_back(makeBufs(sh, r, progs[static_cast<size_t>(r)], es, 7));
  }
  kernels::Scalar scalar{chorusFloat32, {}};
  const float third = 1.0f / 3.0f;  // inexact: a scale applied twice or not at all shows
  std::memcpy(scalar.bytes, &third, sizeof third);
  runSerial(progs, serial, es, red, scalar);

  std::vector<std::vector<std::byte>> slots(static_cast<size_t>(c.n), std::vector<std::byte>(transport::kBoardSlotBytes));
  std::vector<transport::CallSignature> sigs(static_cast<size_t>(c.n));
  std::vector<exec::BoardProgram> bps;
  for (int r = 0; r < c.n; ++r) {
    auto bp = exec::compileBoard(*algo, sh, r, progs[static_cast<size_t>(r)], es);
    ASSERT_TRUE(bp.isOk()) << bp.status().message();
    bps.push_back(std::move(bp.value()));
    const exec::BoardProgram& p = bps.back();
    const std::byte* pub = board[static_cast<size_t>(r)].ptrs[p.publish_buf] + p.publish_offset;
    ASSERT_EQ(p.publish_scaled, p.publishes && c.scaling == plan::Scaling::PreMulSum);
    if (p.publish_scaled)
      kernels::scale(slots[static_cast<size_t>(r)].data(), pub, p.publish_bytes / es, chorusFloat32, scalar);
    else if (p.publishes)
      std::memcpy(slots[static_cast<size_t>(r)].data(), pub, p.publish_bytes);
  }
  for (int r = 0; r < c.n; ++r) {
    FakeBoard fb(&slots, &sigs, r);
    exec::BoardRunner runner(r, c.n, &fb, std::chrono::milliseconds(1000));
    RankBufs& b = board[static_cast<size_t>(r)];
    const exec::Job job{.program = &progs[static_cast<size_t>(r)], .buffers = b.ptrs, .elem_size = es,
                        .reduce_dtype = red.dtype(), .reduce_op = red.op(), .scalar = &scalar};
    exec::BoardMismatch mm;
    Status st = runner.run(bps[static_cast<size_t>(r)], job, 1, transport::CallSignature{}, &mm);
    ASSERT_TRUE(st.isOk()) << st.message();
    const uint64_t out_e = sh.outputElems(r);
    ASSERT_EQ(std::memcmp(b.ptrs[1], serial[static_cast<size_t>(r)].ptrs[1], out_e * es), 0) << "rank " << r;
  }
}

TEST(BoardRunner, EveryOneShotPlanGivesTheSerialExecutionsBits) {
  const plan::Registry reg = plan::Registry::builtin();
  for (Collective coll : {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::AllToAll,
                          Collective::Broadcast})
    for (int n = 2; n <= 7; ++n)
      for (bool inplace : {false, true})
        for (bool canonical : {false, true})
          for (uint64_t count : {uint64_t{1}, uint64_t{5}, uint64_t{64}}) {
            if (canonical && !plan::reduces(coll)) continue;
            checkCase(reg, {coll, n, inplace, canonical, count});
            if (plan::reduces(coll))
              for (plan::Scaling sc : {plan::Scaling::Avg, plan::Scaling::PreMulSum})
                checkCase(reg, {coll, n, inplace, canonical, count, sc});
            if (::testing::Test::HasFatalFailure()) return;
          }
}

// What the compiled program costs per call: an 8-byte 2-rank allreduce is an
// await and one reduction straight out of the peer's slot, one op, with no
// scratch.
TEST(BoardRunner, TwoRankAllReduceIsOneAwaitAndOneReduction) {
  const plan::Registry reg = plan::Registry::builtin();
  plan::Shape sh;
  sh.coll = Collective::AllReduce;
  sh.nranks = 2;
  sh.count = 2;
  for (bool inplace : {false, true}) {
    sh.inplace = inplace;
    plan::Program p;
    plan::expand(*reg.find(Collective::AllReduce, "oneshot"), sh, 0, &p);
    auto bp = exec::compileBoard(*reg.find(Collective::AllReduce, "oneshot"), sh, 0, p, 4);
    ASSERT_TRUE(bp.isOk()) << bp.status().message();
    ASSERT_EQ(bp->ops.size(), 1u) << inplace;
    EXPECT_EQ(bp->ops[0].kind, exec::BoardProgram::Kind::Reduce);
    EXPECT_EQ(bp->ops[0].await, 1);
    EXPECT_EQ(bp->scratch_bytes, 0u);
    EXPECT_TRUE(bp->awaits_all);
    EXPECT_TRUE(bp->publishes);
    EXPECT_EQ(bp->publish_bytes, 8u);
    // In place the own contribution is read from the own slot (the plan's copy
    // of it into scratch is elided), else from the input.
    EXPECT_EQ(bp->reads_own_slot, inplace);
  }
}

// A plan whose rank sends what it wrote first cannot publish its input once:
// the runner refuses it (on every rank alike, so all take the executor).
class SendsWhatItWrote final : public plan::Algorithm {
 public:
  std::string_view name() const override { return "sends_what_it_wrote"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool oneShot() const override { return true; }
  void generate(const plan::Shape& sh, int r, plan::ProgramBuilder& b) const override {
    const uint64_t N = sh.count;
    b.copy(plan::out(0, N), plan::in(0, N));
    if (r == 0) b.reduce(plan::out(0, N), plan::out(0, N), plan::out(0, N));  // rank 0 changes what it sends
    b.send(1 - r, plan::out(0, N));
    const plan::Region s = b.scratch(N);
    b.recv(1 - r, s);
    b.reduce(plan::out(0, N), plan::out(0, N), s);
  }
};

TEST(BoardRunner, RefusesAPlanWhoseSendsReadWhatItWrote) {
  SendsWhatItWrote algo;
  plan::Shape sh;
  sh.coll = Collective::AllReduce;
  sh.nranks = 2;
  sh.count = 4;
  for (int r = 0; r < 2; ++r) {
    plan::Program p;
    plan::expand(algo, sh, r, &p);
    auto bp = exec::compileBoard(algo, sh, r, p, 4);
    ASSERT_FALSE(bp.isOk()) << "rank " << r;
    EXPECT_NE(bp.status().message().find("rank 0 sends a region its program wrote"), std::string::npos)
        << bp.status().message();
  }
}

TEST(BoardRunner, APeersOtherCallIsAMismatchNamingIt) {
  const plan::Registry reg = plan::Registry::builtin();
  const plan::Algorithm& algo = *reg.find(Collective::AllReduce, "oneshot");
  plan::Shape sh;
  sh.coll = Collective::AllReduce;
  sh.nranks = 3;
  sh.count = 2;
  plan::Program p;
  plan::expand(algo, sh, 0, &p);
  std::vector<std::vector<std::byte>> slots(3, std::vector<std::byte>(transport::kBoardSlotBytes));
  std::vector<transport::CallSignature> sigs(3);
  sigs[2] = transport::CallSignature{42};
  FakeBoard fb(&slots, &sigs, 0);
  exec::BoardRunner runner(0, 3, &fb, std::chrono::milliseconds(1000));
  const exec::BoardProgram* bp = runner.programFor(algo, sh, p, 4);
  ASSERT_NE(bp, nullptr);
  EXPECT_EQ(runner.programFor(algo, sh, p, 4), bp) << "compiled once per program";
  std::array<float, 2> in{}, out{};
  std::array<std::byte*, 3> ptrs{reinterpret_cast<std::byte*>(in.data()), reinterpret_cast<std::byte*>(out.data()), nullptr};
  const exec::Job job{.program = &p, .buffers = ptrs, .elem_size = 4};  // float32 Sum
  exec::BoardMismatch mm;
  Status st = runner.run(*bp, job, 1, transport::CallSignature{}, &mm);
  EXPECT_EQ(st.code(), chorusMismatch);
  EXPECT_EQ(mm.peer, 2);
  EXPECT_EQ(mm.theirs, transport::CallSignature{42});
}

}  // namespace
}  // namespace chorus
