// Runs collectives on a communicator and checks every output element against
// an independent reference computed here (not with chorus's kernels: integers
// in wrapping 64-bit arithmetic truncated to the type's width, floats in
// double with a tolerance that only the narrow types need).
//
// Used both by the threads-as-ranks unit tests and by the multi-process
// integration program, so a rank-as-thread and a rank-as-process run the same
// checks.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <string>
#include <vector>

namespace chorus::testing {

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, AllGatherV, AllToAllV, Gather, Scatter, SendRecv, Barrier };
const char* collName(Coll c);
bool collHasOp(Coll c);
bool collHasRoot(Coll c);

struct Case {
  Coll coll = Coll::AllReduce;
  chorusDataType_t dtype = chorusFloat32;
  chorusRedOp_t op = chorusSum;  // chorusNumOps = PreMulSum with scalar 2
  size_t count = 7;
  int root = 0;
  bool inplace = false;
  [[nodiscard]] std::string name() const;
};

// Device memory for runCase (tests/unit/device_*_test.cpp): each host buffer
// of the case is mirrored into a device buffer before the call, the call gets
// the device addresses (same offsets, so in-place stays in place), and after
// it every device buffer is copied back over its host buffer, which the
// reference then checks.
class DeviceMirror {
 public:
  virtual ~DeviceMirror() = default;
  // A device copy of [host, host + bytes); returns its device address.
  virtual void* upload(std::byte* host, size_t bytes) = 0;
  // Copies every device buffer back over its host buffer ("" or an error).
  virtual std::string download() = 0;
  // Frees the device buffers.
  virtual void clear() = 0;
};

// Runs one case on comm (every rank calls it with the same case; stream may
// be NULL).  Returns "" when every element is right, else a description of
// the first wrong element.
// With a mirror, stream is a stream of the mirror's memory space.
std::string runCase(chorusComm_t comm, const Case& c, chorusStream_t stream = nullptr, DeviceMirror* mirror = nullptr);

// The standard matrix: every collective x dtype x op (with in-place and
// out-of-place) at small counts, plus float32 at the given large counts.
std::vector<Case> standardCases(int nranks, const std::vector<size_t>& counts, bool all_dtypes);

}  // namespace chorus::testing
