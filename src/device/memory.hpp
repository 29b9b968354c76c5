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

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

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
  bool recv_written = false;  // the call writes all of recv_bytes on this rank (copied back)
};

// The host collective that runs on the staged buffers: send and recv are host
// pointers with the same relation to each other as the device addresses
// (in-place calls stay in place).
using HostCall = std::function<Status(const void* send, void* recv)>;

// An OpenCL command queue as a chorus stream's device side.  A call on it
// waits (on the host) for the queue's earlier work, copies its device inputs
// into host staging, runs the host collective, and enqueues the copies of
// the results back into the device buffers on the queue: later work on the
// queue sees them, and lastEvent() completes when they are written.
class ClStream {
 public:
  virtual ~ClStream() = default;
  virtual Status run(const StagedCall& call, const HostCall& host) = 0;
  // Waits for every command of the queue (clFinish).
  virtual Status synchronize() = 0;
  // chorusInProgress while the last call's copy back is pending, else ok.
  virtual Status query() = 0;
  // The event of the last call's last command, retained for the caller
  // (nullptr when no call has run).
  virtual void* lastEvent() = 0;
  [[nodiscard]] virtual void* queue() const = 0;
};
// Checks the queue (a valid cl_command_queue, in order) and makes its stream.
Result<std::unique_ptr<ClStream>> makeClStream(void* cl_queue);

// For error messages: "OpenCL buffer 0x... (N bytes)" or "host memory".
std::string describe(const void* p);

}  // namespace chorus::device
