// Trace records: what every rank writes under CHORUS_TRACE=DIR, and the
// bounds-checked reader of those files.
//
// One file per communicator and rank, `DIR/chorus-<comm>-rank<R>.trace`:
// a fixed header, then records, each `kind u8 | 0 u8 | length u16 | payload`
// (little endian, the payload's length given so a reader skips kinds it does
// not know).  Times are the rank's trace clock (clock::traceNowNs, ns); the
// clock records say how to map them onto rank 0's clock.
//
//   Algo   id u16 | name (1..64 bytes)                  names used by Op records
//   Op     one collective (or point-to-point call): sequence, kind, dtype,
//          algorithm id, root or peer, count, bytes, enqueue/start/end, the
//          tuner's predicted time, ok or failed
//   Step   one step of an op's plan: op sequence, send / recv / recv-reduce /
//          copy / reduce, peer, bytes, start (posted, or begun) and end
//   Clock  an offset estimate: local time, offset to rank 0 (reference =
//          local + offset), round trip, error bound
//
// The writer (Recorder) keeps records in a buffer and appends it to the file
// when it fills and when the communicator is destroyed or breaks: a process
// killed outright loses at most its last buffer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.hpp"

namespace chorus::trace {

constexpr char kMagic[8] = {'C', 'H', 'T', 'R', 'A', 'C', 'E', '1'};
// Version 2: point-to-point operations are their own kinds (kOpSend,
// kOpRecv), no longer collective 10 ("sendrecv"), and barrier is 10, not 11;
// the reader still reads version 1 files and maps their kinds.
constexpr uint32_t kVersion = 2;

enum class Kind : uint8_t { Algo = 1, Op = 2, Step = 3, Clock = 4 };
// Step kinds (plan::StepOp values).
// The values of plan::StepOp (the executor records s.op; executor.cpp asserts
// they agree); 5-7 are compressed plans' local steps, 8-9 the reduction op's
// arithmetic (PreMulSum's scale, Avg's division), 10-13 exact plans'
// conversions to and from the accumulator's words.
enum class StepKind : uint8_t {
  Send = 0,
  Recv = 1,
  RecvReduce = 2,
  Copy = 3,
  Reduce = 4,
  Quantize = 5,
  Dequantize = 6,
  DequantizeReduce = 7,
  Scale = 8,
  Divide = 9,
  Encode = 10,
  Decode = 11,
  DecodeAdd = 12,
  EncodeAdd = 13,
};

struct Header {
  uint32_t version = kVersion;
  int32_t rank = 0;
  int32_t nranks = 0;
  int32_t pid = 0;
  uint64_t comm_id = 0;      // the same on every rank of a communicator
  int64_t open_ns = 0;       // trace clock when the file was opened
  int64_t open_unix_ns = 0;  // CLOCK_REALTIME then (for humans)
  std::string host;          // hostname (<= 64 bytes)
};

// OpRecord::coll of a point-to-point operation: not a collective (those are
// plan::Collective values, below plan::kNumCollectives).
constexpr uint8_t kOpSend = 0x80, kOpRecv = 0x81;
[[nodiscard]] constexpr bool isPointToPoint(uint8_t coll) { return coll == kOpSend || coll == kOpRecv; }

struct OpRecord {
  uint64_t seq = 0;     // the communicator's operation number ("#N")
  uint8_t coll = 0;     // plan::Collective, or kOpSend / kOpRecv
  uint8_t dtype = 0;    // chorusDataType_t
  uint16_t algo = 0;    // Algo record id; 0 = none
  uint8_t ok = 1;
  // One field in the file: a collective's root (0 where it has none) or a
  // send's or receive's peer; the reader fills the one the kind has and
  // leaves the other at its default.
  int32_t root = 0;
  int32_t peer = -1;
  uint64_t count = 0;
  uint64_t bytes = 0;   // the collective's message size as nccl-tests counts it
  int64_t enqueue_ns = 0, start_ns = 0, end_ns = 0;
  int64_t predicted_ns = -1;  // the tuner's prediction; < 0: none
};

struct StepRecord {
  uint64_t seq = 0;  // the op's
  uint8_t kind = 0;  // StepKind
  int32_t peer = -1;
  uint64_t bytes = 0;
  int64_t start_ns = 0, end_ns = 0;
};

struct ClockRecord {
  int64_t local_ns = 0;
  int64_t offset_ns = 0;  // rank 0's clock = local + offset
  int64_t rtt_ns = 0;
  int64_t bound_ns = 0;
};

// S of algbw = S / t (nccl-tests' rule): count x elem for allreduce,
// broadcast, reduce and a send or receive; count x elem x n for the gather
// and scatter types and alltoall; for the v-collectives, the sum of counts.
uint64_t algBytes(uint8_t coll, uint64_t count, size_t elem_size, int nranks, std::span<const size_t> vcounts = {});
// nccl-tests' busbw factor: allreduce 2(n-1)/n; allgather, reducescatter,
// alltoall(v), allgatherv, gather, scatter (n-1)/n; broadcast, reduce,
// send, recv 1; barrier 0.
double busBwFactor(uint8_t coll, int nranks);

// Writes one rank's trace.  op()/step()/algoId() from the executing thread
// (one at a time); clock() from any thread.
class Recorder {
 public:
  // Creates DIR (one level) if needed and opens the rank's file.
  static Result<std::unique_ptr<Recorder>> open(const std::string& dir, const Header& header);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  uint16_t algoId(std::string_view name);
  void op(const OpRecord& r);
  void step(const StepRecord& r);
  void clock(const ClockRecord& r);
  // Appends the buffer to the file.
  void flush();
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  Recorder() = default;
  void maybeFlush() {
    if (buf_.size() >= kFlushBytes) flush();
  }
  static constexpr size_t kFlushBytes = 1 << 20;

  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<std::byte> buf_;
  std::unordered_map<std::string, uint16_t> algos_;
  std::mutex clock_mu_;
  std::vector<ClockRecord> clock_pending_;
  std::mutex file_mu_;
};

// A parsed trace file.
struct TraceFile {
  std::string path;
  Header header;
  std::vector<std::string> algos;  // index = id (0 = "")
  std::vector<OpRecord> ops;
  std::vector<StepRecord> steps;
  std::vector<ClockRecord> clocks;
  bool truncated = false;  // the file ends inside a record (the writer was killed)
};

// Parses a file's bytes; every length is checked before use, every time and
// offset must lie within +-2^60 ns (so readers may add and subtract them).  A file cut
// inside its last record parses with truncated = true; anything else that
// breaks the format is chorusInvalidArgument naming the offset.
Result<TraceFile> parseTrace(std::span<const std::byte> bytes);
Result<TraceFile> readTraceFile(const std::string& path);

}  // namespace chorus::trace
