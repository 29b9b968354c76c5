#include "comm/tracing.hpp"

#include <unistd.h>

#include <ctime>
#include <vector>

#include "clock/offset.hpp"
#include "common/dtype.hpp"

namespace chorus::comm {

Status Tracing::open(const std::string& dir, int rank, int nranks, uint64_t comm_id, const std::string& host) {
  trace::Header h;
  h.rank = rank;
  h.nranks = nranks;
  h.pid = static_cast<int32_t>(getpid());
  h.comm_id = comm_id;
  h.open_ns = clock::traceNowNs();
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  h.open_unix_ns = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  h.host = host;
  auto r = trace::Recorder::open(dir, h);
  if (!r.isOk()) return r.status().withContext(fmt::format("rank {}: ", rank));
  recorder_ = std::move(r.value());
  return {};
}

Result<int64_t> Tracing::syncClock(bootstrap::Store& store, int rounds) {
  std::vector<clock::Exchange> xs;
  xs.reserve(static_cast<size_t>(rounds));
  for (int i = 0; i < rounds; ++i) {
    clock::Exchange x;
    x.t1 = clock::traceNowNs();
    CHORUS_ASSIGN_OR_RETURN(int64_t server, store.serverTimeNs());
    x.t4 = clock::traceNowNs();
    x.t2 = x.t3 = server;  // the server stamps once, between receiving and answering
    xs.push_back(x);
  }
  const clock::OffsetEstimate e = clock::estimateOffset(xs);
  clock_offset_ns_.store(e.offset_ns, std::memory_order_relaxed);
  if (recorder_) recorder_->clock({xs.back().t4, e.offset_ns, e.rtt_ns, e.bound_ns});
  return e.offset_ns;
}

void Tracing::batchStarted() {
  if (recorder_) batch_start_ns_ = clock::traceNowNs();  // the rank's arrival
}

// The batch's operations in the trace: one record each, with the batch's
// start (the rank's arrival) and end.
void Tracing::batchEnded(std::span<const OpDesc> ops, size_t n, const CallPlanner& planner, int nranks, bool ok) {
  if (!recorder_) return;
  const int64_t start_ns = batch_start_ns_;
  const int64_t end_ns = clock::traceNowNs();
  for (size_t i = 0; i < n; ++i) {
    const OpDesc& o = ops[i];
    trace::OpRecord r;
    r.seq = o.trace_seq;
    r.coll = o.kind == OpKind::Send   ? trace::kOpSend
             : o.kind == OpKind::Recv ? trace::kOpRecv
                                      : static_cast<uint8_t>(o.coll);
    r.dtype = static_cast<uint8_t>(o.dtype);
    r.algo = planner.traceAlgo(i);
    r.ok = ok ? 1 : 0;
    if (o.pointToPoint())
      r.peer = o.peer;
    else
      r.root = o.root;
    r.count = o.count;
    r.bytes = trace::algBytes(r.coll, o.count, dtypeSize(o.dtype), nranks, o.counts);
    r.enqueue_ns = o.enqueue_ns ? o.enqueue_ns : start_ns;
    r.start_ns = start_ns;
    r.end_ns = end_ns;
    r.predicted_ns = planner.tracePredicted(i);
    recorder_->op(r);
  }
  if (!ok) recorder_->flush();
}

}  // namespace chorus::comm
