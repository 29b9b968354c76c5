// The executor's posting order, against a transport that records every post
// and finishes one posted request per poll (oldest first), so the order is
// deterministic and no data moves; and a job's local work: its reduction
// given as (type, op), its prologue and epilogue (exec/local_ops.hpp).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "exec/executor.hpp"
#include "exec/local_ops.hpp"
#include "kernels/exact.hpp"
#include "plan/plan.hpp"
#include "transport/transport.hpp"

namespace chorus {
namespace {

using plan::in;
using plan::out;

class RecordingTransport final : public transport::Transport {
 public:
  std::vector<std::string> log;  // "S1" = send to rank 1 posted, "R1" = receive from rank 1, "done R1" ...

  std::string_view name() const override { return "recording"; }
  Status postSend(int peer, const void*, size_t, transport::Request* req) override {
    return post("S" + std::to_string(peer), req);
  }
  Status postRecv(int peer, const transport::RecvTarget&, transport::Request* req) override {
    return post("R" + std::to_string(peer), req);
  }
  Result<bool> poll() override {
    if (posted_.empty()) return false;
    auto [what, req] = posted_.front();
    posted_.pop_front();
    log.push_back("done " + what);
    req->complete();
    return true;
  }
  void wait(std::chrono::microseconds) override {}
  void wake() override {}
  void abort(const Status&) override {}

 private:
  Status post(std::string what, transport::Request* req) {
    log.push_back(what);
    req->state.store(transport::Request::Posted, std::memory_order_release);
    posted_.emplace_back(std::move(what), req);
    return {};
  }
  std::deque<std::pair<std::string, transport::Request*>> posted_;
};

// Runs rank 0's program over the recording transport (peers 1..3) and
// returns the log.
std::vector<std::string> runRecorded(const plan::Program& prog) {
  RecordingTransport t;
  exec::Executor ex(0, {nullptr, &t, &t, &t});
  std::array<std::byte, 64> buf{};
  std::array<std::byte*, 3> bufs{buf.data(), buf.data(), buf.data()};
  exec::Job job;
  job.program = &prog;
  job.buffers = bufs;
  job.elem_size = 1;
  Status st = ex.run(std::span<const exec::Job>(&job, 1), std::chrono::milliseconds(10000));
  EXPECT_TRUE(st.isOk()) << st.message();
  return t.log;
}

// Two exchange rounds (recursive doubling): round 2's send needs round 1's
// data.  Round 2's receive has no data dependency, but it is posted only once
// this rank posts round 2's send, so a partner that is a round ahead cannot
// have its data read (and its flow fed) while round 1's is still arriving.
TEST(Executor, AReceiveIsPostedAfterTheSendBeforeItInProgramOrder) {
  plan::ProgramBuilder b;
  b.reset(0);
  b.send(1, out(0, 8));
  b.recv(1, out(8, 8));
  b.send(2, out(0, 16));
  b.recv(2, out(16, 16));
  plan::Program prog;
  b.finish(&prog);
  ASSERT_TRUE(prog.depsOf(3).empty());  // no data dependency holds the last receive back

  const std::vector<std::string> want = {"S1", "R1", "done S1", "done R1", "S2", "R2", "done S2", "done R2"};
  EXPECT_EQ(runRecorded(prog), want);
}

// Receives before any send (a tree's leaves-to-root phase) are posted at once,
// and a receive is gated by the last send before it only: both children's
// receives go out together, before the send to the parent.
TEST(Executor, ReceivesBeforeTheFirstSendArePostedAtOnce) {
  plan::ProgramBuilder b;
  b.reset(0);
  b.recv(1, out(0, 8));
  b.recv(2, out(8, 8));
  b.send(3, out(0, 16));
  b.recv(3, out(16, 16));
  plan::Program prog;
  b.finish(&prog);

  const std::vector<std::string> want = {"R1", "R2", "done R1", "done R2", "S3", "R3", "done S3", "done R3"};
  EXPECT_EQ(runRecorded(prog), want);
}

template <typename T, size_t N>
std::byte* bytes(std::array<T, N>& a) {
  return reinterpret_cast<std::byte*>(a.data());
}

// The prologue runs before the program's first step and the epilogue after
// its last, and the program's Reduce combines with the job's (type, op):
// the input scaled by 2 into a staging buffer, its halves max-reduced into
// the output, the output divided by 2.  Without the prologue the max is of
// zeros; without the epilogue the result is twice as large; a Sum instead of
// the Max gives {8, -4}.
TEST(Executor, RunsAJobsPrologueBeforeItsStepsAndItsEpilogueAfter) {
  plan::ProgramBuilder b;
  b.reset(0);
  b.reduce(out(0, 2), in(0, 2), in(2, 2));
  plan::Program prog;
  b.finish(&prog);

  std::array<int32_t, 4> input{3, -8, 5, 4}, staged{};
  std::array<int32_t, 2> output{};
  Scalar two{chorusInt32, {}};
  const int32_t v = 2;
  std::memcpy(two.bytes, &v, sizeof v);
  const std::array<exec::LocalOp, 1> pre{exec::LocalOp::scale(staged.data(), input.data(), 4, chorusInt32, &two)};
  const std::array<exec::LocalOp, 1> post{exec::LocalOp::divide(output.data(), 2, chorusInt32, 2)};
  const std::array<std::byte*, 3> bufs{bytes(staged), bytes(output), nullptr};
  const exec::Job job{.program = &prog, .buffers = bufs, .elem_size = 4, .reduce_dtype = chorusInt32,
                      .reduce_op = BinOp::Max, .prologue = pre, .epilogue = post};
  exec::Executor ex(0, {nullptr});
  ASSERT_TRUE(ex.run(std::span<const exec::Job>(&job, 1), std::chrono::milliseconds(10000)).isOk());
  EXPECT_EQ(output, (std::array<int32_t, 2>{5, 4}));
}

// A job with no step (an exact call's exponent-range agreement on one rank)
// still runs its local work, and a job whose (type, op) names no kernel is
// refused before any step runs.
TEST(Executor, RunsTheLocalWorkOfAJobWithoutStepsAndRefusesAnUnknownReduction) {
  const plan::Program empty;
  const std::array<float, 3> x{0.75f, -12.0f, 0.0f};
  std::array<int64_t, 2> range{}, want{};
  kernels::exactRange(chorusFloat32, x.data(), x.size(), &want[0], &want[1]);
  const std::array<exec::LocalOp, 1> scan{exec::LocalOp::exactRange(range.data(), x.data(), x.size(), chorusFloat32)};
  const std::array<std::byte*, 3> bufs{bytes(range), bytes(range), nullptr};
  exec::Job job{.program = &empty, .buffers = bufs, .elem_size = 8, .prologue = scan};
  exec::Executor ex(0, {nullptr});
  ASSERT_TRUE(ex.run(std::span<const exec::Job>(&job, 1), std::chrono::milliseconds(10000)).isOk());
  EXPECT_EQ(range, want);
  EXPECT_NE(want[0], kernels::kNoExponent);

  job.reduce_op = static_cast<BinOp>(kNumBinOps);
  job.prologue = {};
  EXPECT_EQ(ex.run(std::span<const exec::Job>(&job, 1), std::chrono::milliseconds(10000)).code(), chorusInternalError);
  EXPECT_EQ(exec::reducerFor(chorusInt32, BinOp::Max), exec::reducerFor(chorusInt32, BinOp::Max)) << "one table";
  EXPECT_EQ(exec::reducerFor(static_cast<chorusDataType_t>(chorusNumTypes), BinOp::Sum), nullptr);
}

}  // namespace
}  // namespace chorus
