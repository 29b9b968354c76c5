// Calls on device memory (device_calls.hpp).
#include "api/device_calls.hpp"

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
  if (!device::anyRegistered()) return {};
  const char* fn = entryName(op);
  auto check = [&](const char* arg, const void* p) -> Status {
    if (p == nullptr) return {};
    if (auto reg = device::find(p))
      return invalidArgument("{}: {}={} is {}, but the call is on a host stream (NULL or chorusStreamCreate): issue "
                             "it on a stream of its memory space (chorusStreamCreateOpenCL)",
                             fn, arg, p, device::describe(p));
    return {};
  };
  CHORUS_RETURN_IF_ERROR(check("sendbuff", op.send));
  return check("recvbuff", op.recv);
}

Status runOnDevice(device::ClStream& cl, OpDesc op, int rank, int nranks,
                   const std::function<Status(OpDesc&)>& submit) {
  const char* fn = entryName(op);
  if (op.pointToPoint() || plan::variable(op.coll))
    return invalidUsage("{}: not supported on an OpenCL stream yet (device memory covers the collectives with one "
                        "count: allreduce, broadcast, reduce, allgather, reducescatter, alltoall, gather, scatter, "
                        "barrier; docs/device.md)",
                        fn);
  const plan::CollectiveFacts& f = plan::facts(op.coll);
  const uint64_t unit = uint64_t{op.count} * kernels::dtypeSize(op.dtype);
  const uint64_t n = static_cast<uint64_t>(nranks);
  const bool at_root = rank == op.root;
  using plan::Collective;
  // Which buffers this rank's part of the call reads and writes (NCCL's rules:
  // a broadcast's or scatter's input only at the root, a reduce's or gather's
  // output only at the root).
  const bool reads = !(op.coll == Collective::Broadcast || op.coll == Collective::Scatter) || at_root;
  const bool writes = !(op.coll == Collective::Reduce || op.coll == Collective::Gather) || at_root;
  device::StagedCall call;
  call.fn = fn;
  call.send = op.send;
  call.recv = op.recv;
  if (op.coll != Collective::Barrier) {
    call.send_bytes = reads ? unit * (f.input_per_rank ? n : 1) : 0;
    call.recv_bytes = writes ? unit * (f.output_per_rank ? n : 1) : 0;
    call.recv_written = writes;
  }
  return cl.run(call, [&](const void* send, void* recv) {
    op.send = send;
    op.recv = recv;
    return submit(op);
  });
}

}  // namespace chorus::api
