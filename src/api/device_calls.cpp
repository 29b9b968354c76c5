// Calls on device memory (device_calls.hpp).
#include "api/device_calls.hpp"

#include <algorithm>
#include <memory>

#include "device/cuda_driver.hpp"
#include "kernels/dtype.hpp"

namespace chorus::api {

const char* entryName(const OpDesc& op) {
  switch (op.kind) {
    case OpKind::Send: return "chorusSend";
    case OpKind::Recv: return "chorusRecv";
    case OpKind::Collective: break;
  }
  return plan::facts(op.coll).c_entry.data();  // string literals: NUL-terminated
}

Status checkHostBuffers(const OpDesc& op) {
  const bool cuda = device::cudaInUse();
  if (!device::anyRegistered() && !cuda) return {};
  const char* fn = entryName(op);
  auto check = [&](const char* arg, const void* p) -> Status {
    if (p == nullptr) return {};
    if (auto reg = device::find(p))
      return invalidArgument("{}: {}={} is {}, but the call is on a host stream (NULL or chorusStreamCreate): issue "
                             "it on a stream of its memory space (chorusStreamCreateOpenCL)",
                             fn, arg, p, device::describe(p));
    if (const unsigned t = cuda ? device::cudaMemoryType(p) : 0;
        t == device::kCuMemoryTypeDevice || t == device::kCuMemoryTypeUnified)
      return invalidArgument("{}: {}={} is CUDA device memory, but the call is on a host stream (NULL or "
                             "chorusStreamCreate): issue it on a CUDA stream (chorusStreamCreateCuda)",
                             fn, arg, p);
    return {};
  };
  CHORUS_RETURN_IF_ERROR(check("sendbuff", op.send));
  return check("recvbuff", op.recv);
}

namespace {
// The extent of a v-collective's buffer: the end of its last nonempty block.
uint64_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  uint64_t t = 0;
  for (size_t i = 0; i < counts.size() && i < displs.size(); ++i)
    if (counts[i] != 0) t = std::max<uint64_t>(t, uint64_t{counts[i]} + displs[i]);
  return t;
}
}  // namespace

device::StagedCall describeOnDevice(const OpDesc& op, int rank, int nranks) {
  const uint64_t es = kernels::dtypeSize(op.dtype);
  device::StagedCall call;
  call.fn = entryName(op);
  call.send = op.send;
  call.recv = op.recv;
  call.count = op.count;
  call.elem_bytes = es;
  if (op.pointToPoint()) {
    // A send reads count elements, a receive writes them.
    if (op.kind == OpKind::Send) {
      call.send_bytes = uint64_t{op.count} * es;
    } else {
      call.recv_bytes = uint64_t{op.count} * es;
      call.recv_written = true;
    }
    return call;
  }
  using plan::Collective;
  if (op.coll == Collective::Barrier) return call;
  if (op.coll == Collective::AllGatherV) {
    call.send_bytes = uint64_t{op.count} * es;
    call.recv_bytes = extent(op.counts, op.displs) * es;
    call.recv_written = call.recv_partial = true;  // the blocks, not the gaps between them
    return call;
  }
  if (op.coll == Collective::AllToAllV) {
    call.send_bytes = extent(op.counts, op.displs) * es;
    call.recv_bytes = extent(op.counts2, op.displs2) * es;
    call.recv_written = call.recv_partial = true;
    return call;
  }
  const plan::CollectiveFacts& f = plan::facts(op.coll);
  const uint64_t unit = uint64_t{op.count} * es;
  const uint64_t n = static_cast<uint64_t>(nranks);
  const bool at_root = rank == op.root;
  // Which buffers this rank's part of the call reads and writes (NCCL's rules:
  // a broadcast's or scatter's input only at the root, a reduce's or gather's
  // output only at the root).
  const bool reads = !(op.coll == Collective::Broadcast || op.coll == Collective::Scatter) || at_root;
  const bool writes = !(op.coll == Collective::Reduce || op.coll == Collective::Gather) || at_root;
  call.send_bytes = reads ? unit * (f.input_per_rank ? n : 1) : 0;
  call.recv_bytes = writes ? unit * (f.output_per_rank ? n : 1) : 0;
  call.recv_written = writes;
  // Chunks of an elementwise call are calls of their own; a compressed call's
  // scale blocks and its error feedback span the whole buffer, so it is not.
  call.elementwise = (op.coll == Collective::AllReduce || op.coll == Collective::Broadcast ||
                      op.coll == Collective::Reduce) &&
                     !op.wire.has_value();
  return call;
}

Status runOnDevice(device::DeviceStream& cl, OpDesc op, int rank, int nranks, std::function<Status(OpDesc&)> submit,
                   device::Worker* worker) {
  const device::StagedCall call = describeOnDevice(op, rank, nranks);
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<device::PendingCall> pending, cl.enqueue(call));
  auto host = [](OpDesc& o, const std::function<Status(OpDesc&)>& sub) {
    return [&o, &sub](const void* send, void* recv, uint64_t count) {
      o.send = send;
      o.recv = recv;
      o.count = static_cast<size_t>(count);
      return sub(o);
    };
  };
  if (worker == nullptr || !cl.async()) return pending->run(host(op, submit), /*late=*/false);
  // std::function needs a copyable job: the pending call is shared.
  std::shared_ptr<device::PendingCall> p(std::move(pending));
  worker->post([p, op = std::move(op), submit = std::move(submit), host]() mutable {
    // A failure becomes the stream's error before its gate opens (run's
    // `late`): a clFinish that returns after it sees it.
    (void)p->run(host(op, submit), /*late=*/true);
    p.reset();
  });
  return {};
}

}  // namespace chorus::api
