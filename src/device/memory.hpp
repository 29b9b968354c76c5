// Device memory (docs/device.md): memory spaces, the process-wide registry of
// device buffers, and the OpenCL stream that stages a call's device buffers
// through host memory around the unchanged host collective.
//
// A registered device buffer gets a *device address*: the start of a range of
// reserved, inaccessible address space (mmap PROT_NONE) exactly as long as the
// buffer.  A call passes `address + byte offset` where NCCL passes a device
// pointer; the registry maps it back to (buffer, offset) and knows the
// buffer's length and context.  No host allocation can ever lie in such a
// range, so a host pointer is never mistaken for a device one, and a host
// access through a device address faults at once instead of corrupting memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.hpp"

namespace chorus::device {

enum class Space : uint8_t { Host = 0, OpenCL = 1, Cuda = 2 };
const char* spaceName(Space s);

// Ok when this process can use the space, else an error whose message says
// why ("not built with OpenCL", "no OpenCL platform", "no CUDA driver
// (libcuda.so.1: ...)").  Host is always available.
Status spaceAvailable(Space s);
// Whether the library was built with the space's backend (OpenCL: the
// headers and loader were found at configure time; CUDA: always, the driver
// is loaded at run time).
bool spaceBuilt(Space s);

// One registered device buffer.
struct Registration {
  Space space = Space::Host;
  void* handle = nullptr;   // cl_mem (retained while registered)
  void* context = nullptr;  // cl_context
  std::byte* base = nullptr;  // the device address
  uint64_t bytes = 0;
};

// Registers an OpenCL buffer (a cl_mem made by clCreateBuffer) and returns its
// device address.  Retains the cl_mem until deregistered.
Result<void*> registerOpenCL(void* cl_mem);
// Forgets the registration whose device address is `address` (its start).
Status deregister(void* address);
// Whether any device buffer is registered (one relaxed load: host calls
// check their pointers only when this is true).
bool anyRegistered();
// The registration whose range contains p, if any.
std::optional<Registration> find(const void* p);

// A call's device buffers as the API layer describes them (byte lengths from
// the collective's facts; names for error messages).
struct StagedCall {
  const char* fn = "";
  const void* send = nullptr;
  uint64_t send_bytes = 0;  // 0: the call reads no input on this rank
  void* recv = nullptr;
  uint64_t recv_bytes = 0;    // what the call may touch of recvbuff on this rank
  bool recv_written = false;  // the call writes recvbuff on this rank (copied back)
  // The call writes only parts of recv_bytes (the v-collectives' displacements
  // leave gaps): the rest must keep the device's bytes, so the staging starts
  // as a copy of them.
  bool recv_partial = false;
  // Elementwise calls (allreduce, broadcast, reduce; uncompressed): element i
  // of the output depends only on element i of the inputs, so the call may run
  // as consecutive chunks of `count` elements of `elem_bytes`, each a call of
  // its own on every rank (ranks chunk alike: the count and the chunk size
  // are the same everywhere).
  bool elementwise = false;
  uint64_t count = 0;
  uint64_t elem_bytes = 0;
};

// The host collective that runs on the staged buffers: send and recv are host
// pointers with the same relation to each other as the device addresses
// (in-place calls stay in place); count is the call's count, or a chunk's
// when an elementwise call is pipelined.
using HostCall = std::function<Status(const void* send, void* recv, uint64_t count)>;

// How a stream moves a call's device buffers to the host collective
// (docs/device.md, "The data path").
enum class Staging : uint8_t {
  Auto,      // Map on a device whose memory is the host's (CL_DEVICE_HOST_UNIFIED_MEMORY: CPUs, integrated
             // GPUs), else Pipeline
  Map,       // clEnqueueMapBuffer: the host call runs on the mapped buffers (zero-copy where memory is shared)
  Pipeline,  // chunked copies through a ring of pinned chunks, overlapped with the chunks' host calls
             // (elementwise calls of at least two chunks; others as Whole)
  Whole,     // one read of the whole input, the host call, one write of the whole output
};
const char* stagingName(Staging s);
// "auto", "map", "pipeline", "whole"; nullopt for anything else.
std::optional<Staging> parseStaging(std::string_view s);

struct StagingOptions {
  Staging mode = Staging::Auto;
  uint64_t chunk_bytes = uint64_t{1} << 20;  // Pipeline: bytes of one chunk (per buffer)
  // The call returns once its queue commands are enqueued; its host part runs
  // on the communicator's device worker (CHORUS_DEVICE_ASYNC; docs/device.md).
  bool async = true;
};

// What a stream did, for tests and the bench's header.
struct StagingStats {
  Staging resolved = Staging::Whole;  // what Auto became on this queue's device
  uint64_t calls = 0;
  uint64_t mapped_calls = 0;
  uint64_t pipelined_calls = 0;
  uint64_t chunks = 0;  // host calls of pipelined calls
  uint64_t whole_calls = 0;
};

// Where a staged call's buffers lie in host staging (every backend): two
// buffers that overlap on the device (in_at and out_at: their byte
// positions in one allocation, or in the unified address space; `same`:
// both lie in one allocation) are staged as their union, so the host
// pointers keep the device addresses' relation (in-place calls stay in
// place); otherwise each is a region of its own, the output 64-byte aligned
// after the input.
struct StageLayout {
  bool unite = false;
  uint64_t lo = 0, total = 0;         // unite: the union's position and length
  uint64_t send_at = 0, recv_at = 0;  // the buffers' offsets in the staging
};
StageLayout stageLayout(const StagedCall& call, bool has_in, bool has_out, bool same, uint64_t in_at, uint64_t out_at);
// A buffer the call does not use on this rank (a broadcast's sendbuff off
// the root, a reduce's recvbuff) is passed on only as the other one's alias,
// so that the host call still sees an in-place call as in place.
void aliasUnused(const StagedCall& call, std::byte*& send_host, std::byte*& recv_host);

// Pipelined staging (every backend): an elementwise call of at least two
// chunks of chunk_bytes whose buffers are the same (in place) or disjoint
// (positions as stageLayout's).
bool pipelinable(const StagedCall& call, uint64_t chunk_bytes, bool has_in, bool has_out, bool same, uint64_t in_at,
                 uint64_t out_at);
// The ring of pinned chunks a pipelined call runs through: kSlots slots,
// each an input chunk and (out of place) an output chunk after it, 64-byte
// aligned; chunk k uses slot k % kSlots and holds bytes(k).
struct ChunkRing {
  static constexpr uint64_t kAhead = 2;  // chunks read ahead of the one whose host part runs
  static constexpr uint64_t kSlots = kAhead + 1;
  uint64_t elems = 0;    // per chunk
  uint64_t nchunks = 0;
  uint64_t chunk = 0;    // bytes of a full chunk
  uint64_t recv_at = 0;  // the output's offset in a slot (0 in place)
  uint64_t slot = 0;     // bytes of a slot
  uint64_t count = 0, elem_bytes = 0;
  [[nodiscard]] uint64_t bytes(uint64_t k) const { return std::min(elems, count - k * elems) * elem_bytes; }
  [[nodiscard]] uint64_t slotOffset(uint64_t k) const { return (k % kSlots) * slot; }
  [[nodiscard]] uint64_t total() const { return slot * kSlots; }
};
ChunkRing chunkRing(const StagedCall& call, uint64_t chunk_bytes, bool out_of_place);

// A call's buffers mapped into host memory for a host call that runs later
// (a call inside chorusGroupStart/End): send and recv as the host call takes
// them, and the mappings to undo.
struct MappedCall {
  const void* send = nullptr;
  void* recv = nullptr;
  std::vector<std::pair<void*, void*>> maps;  // (cl_mem, mapped pointer)
  void* ready = nullptr;  // a non-blocking mapCall's: the event after which send/recv hold the data
  std::shared_ptr<void> state;  // the backend's own (CUDA: the call's pinned staging and write-backs)
};

// A call whose queue commands are all enqueued (the maps or reads of its
// inputs; the unmaps or writes of its outputs, each behind a user event) and
// whose host part is still to run: run() waits for each part's inputs, runs
// its host call and completes the part's user event, which releases the
// queue's commands behind it.  Destroyed without run() (or after a failed
// one), it completes the user events left, so the queue never stalls; the
// outputs are then undefined.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  // Runs the host parts, each opening its gate (the user event its
  // write-back or unmap waits for) when done, after a failure too.  `late`:
  // the call has returned (the device worker runs this), so a failure is
  // made the stream's error before the gate it failed at opens: a clFinish
  // that returns then finds it (DeviceStream::synchronize).
  virtual Status run(const HostCall& host, bool late) = 0;
};

// A device queue as a chorus stream's device side: an OpenCL command queue
// (makeClStream) or a CUDA stream (makeCudaStream).  A call on it is
// enqueued in queue order (enqueue(): inputs read or mapped after the queue's
// earlier commands, outputs written back before its later ones, behind user
// events) and its host part runs later, on any thread (PendingCall::run), so
// the caller need not wait for the queue; lastEvent() completes when the
// call's outputs are written.  run() is both at once, on this thread.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;  // waits until no PendingCall of the stream is left
  virtual Result<std::unique_ptr<PendingCall>> enqueue(const StagedCall& call) = 0;
  Status run(const StagedCall& call, const HostCall& host) {
    CHORUS_ASSIGN_OR_RETURN(auto pending, enqueue(call));
    return pending->run(host, /*late=*/false);
  }
  // The first error of a host part that ran after its call returned (kept;
  // synchronize() and query() return it).
  virtual void recordError(const Status& st) = 0;
  // Waits for every command of the queue (clFinish); then the first recorded error, if any.
  virtual Status synchronize() = 0;
  // chorusInProgress while the last call's copy back is pending, else ok.
  virtual Status query() = 0;
  // The event of the last call's last command, retained for the caller
  // (nullptr when no call has run).
  virtual void* lastEvent() = 0;
  [[nodiscard]] virtual void* queue() const = 0;
  [[nodiscard]] virtual StagingStats stats() const = 0;
  [[nodiscard]] virtual bool async() const = 0;
  [[nodiscard]] virtual Space space() const = 0;
  // A call in two halves, whatever the stream's staging (a call inside a
  // group): its buffers mapped in queue order (blocking: the host waits for
  // the maps; else m.ready is the last map's event, waitMapped waits for it),
  // then, once its host call ran, unmapped (enqueued, each unmap after
  // `gate` when one is given; the stream's last event).
  virtual Result<MappedCall> mapCall(const StagedCall& call, bool blocking = true) = 0;
  virtual Status waitMapped(MappedCall& m) = 0;
  virtual Status unmapCall(MappedCall& m, void* gate = nullptr) = 0;
  // A user event of the stream's context to gate unmaps with; the stream
  // counts it as a pending call (its destructor waits) until openGate.
  virtual Result<void*> makeGate() = 0;
  virtual void openGate(void* gate) = 0;
};
// Checks the queue (a valid cl_command_queue, in order) and makes its stream.
Result<std::unique_ptr<DeviceStream>> makeClStream(void* cl_queue, const StagingOptions& options = {});

// Checks the CUDA stream (a CUstream of a context of the loaded driver;
// NULL: the legacy default stream of the calling thread's current context)
// and makes its stream (cuda_stream.cpp; docs/device.md, "CUDA").
Result<std::unique_ptr<DeviceStream>> makeCudaStream(void* cu_stream, const StagingOptions& options = {});
// Whether a CUDA stream was ever made in this process (host calls then check
// their pointers with the driver: one relaxed load until then).
bool cudaInUse();
// The CUDA memory type of p (kCuMemoryType*), or 0 where the driver does
// not know it (host memory it did not allocate) or no CUDA stream was made.
unsigned cudaMemoryType(const void* p);

// For error messages: "OpenCL buffer 0x... (N bytes)" or "host memory".
std::string describe(const void* p);

}  // namespace chorus::device
