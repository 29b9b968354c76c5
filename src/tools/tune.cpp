#include "tools/tune.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "kernels/dtype.hpp"
#include "kernels/reduce.hpp"

namespace chorus::tools {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Status check(chorusResult_t r, chorusComm_t comm, const char* what) {
  if (r == chorusSuccess) return {};
  return makeError(r, "chorus-tune: {}: {}", what, chorusGetLastError(comm));
}

// Median over reps of the one-way time of `bytes` between ranks 0 and 1
// (ping-pong: half the round trip).  Ranks above 1 only take part in barriers.
Result<double> pingPong(chorusComm_t comm, size_t bytes, int reps, int iters) {
  int rank = 0;
  chorusCommUserRank(comm, &rank);
  std::vector<char> buf(std::max<size_t>(bytes, 1));
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    CHORUS_RETURN_IF_ERROR(check(chorusBarrier(comm, nullptr), comm, "barrier"));
    auto t0 = Clock::now();
    for (int i = 0; i < iters && rank < 2; ++i) {
      if (rank == 0) {
        CHORUS_RETURN_IF_ERROR(check(chorusSend(buf.data(), bytes, chorusUint8, 1, comm, nullptr), comm, "send"));
        CHORUS_RETURN_IF_ERROR(check(chorusRecv(buf.data(), bytes, chorusUint8, 1, comm, nullptr), comm, "recv"));
      } else {
        CHORUS_RETURN_IF_ERROR(check(chorusRecv(buf.data(), bytes, chorusUint8, 0, comm, nullptr), comm, "recv"));
        CHORUS_RETURN_IF_ERROR(check(chorusSend(buf.data(), bytes, chorusUint8, 0, comm, nullptr), comm, "send"));
      }
    }
    double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters / 2;
    CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&t, &t, 1, chorusFloat64, chorusMax, comm, nullptr), comm, "max"));
    times.push_back(t);
  }
  return median(times);
}

// Median over reps of the time of one burst: rank 1 sends k 8-byte messages to
// rank 0 in one group, rank 0 receives them in one group and answers with one.
// The k messages are in flight together, so T(k) - T(1) is k - 1 times the
// CPU cost of a message, not k - 1 latencies.
Result<double> burst(chorusComm_t comm, int k, int reps, int iters) {
  int rank = 0;
  chorusCommUserRank(comm, &rank);
  std::vector<uint64_t> buf(static_cast<size_t>(k) + 1);
  auto group = [&](bool send, int peer, int count) -> Status {
    CHORUS_RETURN_IF_ERROR(check(chorusGroupStart(), comm, "group start"));
    for (int i = 0; i < count; ++i) {
      chorusResult_t r = send ? chorusSend(&buf[i], 1, chorusUint64, peer, comm, nullptr)
                              : chorusRecv(&buf[i], 1, chorusUint64, peer, comm, nullptr);
      if (r != chorusSuccess) {
        chorusGroupEnd();
        return check(r, comm, send ? "send" : "recv");
      }
    }
    return check(chorusGroupEnd(), comm, "group end");
  };
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    CHORUS_RETURN_IF_ERROR(check(chorusBarrier(comm, nullptr), comm, "barrier"));
    auto t0 = Clock::now();
    for (int i = 0; i < iters && rank < 2; ++i) {
      CHORUS_RETURN_IF_ERROR(group(rank == 1, 1 - rank, k));
      CHORUS_RETURN_IF_ERROR(group(rank == 0, 1 - rank, 1));
    }
    double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&t, &t, 1, chorusFloat64, chorusMax, comm, nullptr), comm, "max"));
    times.push_back(t);
  }
  return median(times);
}

// α, β and o of the link between ranks 0 and 1: o from a burst of 32 messages
// against one, then the ping-pong's one-way time is α + 2o (both ends) and the
// big message's extra time over it is bytes·β.
Result<tune::LinkCost> measureLink(chorusComm_t comm, const TuneOptions& o) {
  tune::LinkCost l;
  CHORUS_ASSIGN_OR_RETURN(double small, pingPong(comm, 8, o.reps, 2000));
  CHORUS_ASSIGN_OR_RETURN(double big, pingPong(comm, o.big_bytes, o.reps, 8));
  constexpr int kBurst = 32;
  CHORUS_ASSIGN_OR_RETURN(double one, burst(comm, 1, o.reps, 1000));
  CHORUS_ASSIGN_OR_RETURN(double many, burst(comm, kBurst, o.reps, 1000));
  l.overhead_s = std::clamp((many - one) / (kBurst - 1), 0.0, small / 2);
  l.alpha_s = std::max(0.0, small - 2 * l.overhead_s);
  l.beta_s_per_byte = std::max(1e-12, (big - small) / static_cast<double>(o.big_bytes));
  return l;
}

Result<chorusComm_t> initFromEnv() {
  chorusComm_t comm = nullptr;
  chorusResult_t r = chorusCommInitFromEnv(&comm);
  if (r != chorusSuccess) return makeError(r, "chorus-tune: chorusCommInitFromEnv: {}", chorusGetLastError(nullptr));
  return comm;
}

}  // namespace

Result<tune::CostProfile> measureProfile(const TuneOptions& o) {
  tune::CostProfile p;
  p.source = "chorus-tune";
  CHORUS_ASSIGN_OR_RETURN(chorusComm_t comm, initFromEnv());
  int n = 0, rank = 0;
  chorusCommCount(comm, &n);
  chorusCommUserRank(comm, &rank);
  if (n < 2) {
    chorusCommDestroy(comm);
    return invalidUsage("chorus-tune needs at least 2 ranks (run it with --np 2)");
  }
  auto shm = measureLink(comm, o);
  if (!shm.isOk()) {
    chorusCommAbort(comm);
    chorusCommDestroy(comm);
    return shm.status();
  }
  p.shm = shm.value();

  // Per-call overhead: an 8-byte allreduce on a communicator of one rank.
  chorusComm_t self = nullptr;
  CHORUS_RETURN_IF_ERROR(check(chorusCommSplit(comm, rank, 0, &self), comm, "split"));
  std::vector<double> oh;
  double x = 1;
  for (int rep = 0; rep < o.reps; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < 20000; ++i)
      CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&x, &x, 1, chorusFloat64, chorusSum, self, nullptr), self, "allreduce"));
    oh.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 20000);
  }
  p.op_overhead_s = median(oh);
  chorusCommDestroy(self);
  chorusCommDestroy(comm);

  // Reduction throughput per data type (bytes of one operand per second).
  const size_t bytes = 4u << 20;
  std::vector<std::byte> a(bytes), b(bytes);
  for (int d = 0; d < chorusNumTypes; ++d) {
    const auto dt = static_cast<chorusDataType_t>(d);
    const size_t count = bytes / kernels::dtypeSize(dt);
    for (size_t i = 0; i < count; ++i) {
      kernels::storeFromDouble(a.data() + i * kernels::dtypeSize(dt), dt, static_cast<double>(i % 7));
      kernels::storeFromDouble(b.data() + i * kernels::dtypeSize(dt), dt, 1.0);
    }
    kernels::Reducer red(dt, kernels::BinOp::Sum);
    std::vector<double> t;
    for (int rep = 0; rep < o.reps; ++rep) {
      auto t0 = Clock::now();
      red(a.data(), a.data(), b.data(), count);
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    p.gamma_s_per_byte[d] = median(t) / static_cast<double>(bytes);
  }

  if (o.tcp) {
    // A second job-wide communicator over TCP only.
    ::setenv("CHORUS_TRANSPORT", "tcp", 1);
    auto tc = initFromEnv();
    ::unsetenv("CHORUS_TRANSPORT");
    if (!tc.isOk()) return tc.status();
    auto tcp = measureLink(tc.value(), o);
    chorusCommDestroy(tc.value());
    if (!tcp.isOk()) return tcp.status();
    p.tcp = tcp.value();
  }
  return p;
}

}  // namespace chorus::tools
