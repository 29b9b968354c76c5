// The flight recorder: each communicator's last operations, so that a timeout
// can say which rank is where ("ranks 0,1,2 are waiting in allreduce #1042;
// rank 3 last completed allreduce #1041 and is in barrier #7").
//
// Entries are small PODs in a fixed ring.  start/finish are called by the
// thread executing the communicator's operations (one at a time), snapshot by
// any thread: a sequence lock — the writer makes the version odd, writes the
// entry's words, makes it even; a reader copies and retries if the version
// moved — so the two calls per operation cost plain stores, not a mutex.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace chorus {

struct FlightEntry {
  uint64_t seq = 0;
  uint8_t coll = 0;   // plan::Collective
  uint8_t state = 0;  // State
  uint8_t pad[2] = {};
  int32_t dtype = 0;
  uint64_t count = 0;
  int32_t root = 0;
  int32_t pad2 = 0;
  int64_t start_ns = 0, end_ns = 0;  // CLOCK_REALTIME_COARSE (ms resolution)
  enum State : uint8_t { Running = 1, Done = 2, Failed = 3 };
};

// What a rank says about itself when asked (the wire form is this struct).
struct FlightSummary {
  uint32_t magic = 0x464c5431;  // "FLT1"
  int32_t rank = -1;
  int32_t pid = 0;
  uint32_t has_current = 0;  // 1: `current` is running now
  uint32_t has_last = 0;     // 1: `last` completed
  uint32_t pad = 0;
  FlightEntry current;
  FlightEntry last;
};

class FlightRecorder {
 public:
  static constexpr size_t kSize = 64;

  void start(uint64_t seq, uint8_t coll, int32_t dtype, uint64_t count, int32_t root);
  void finish(uint64_t seq, bool ok);
  [[nodiscard]] std::vector<FlightEntry> snapshot() const;
  [[nodiscard]] FlightSummary summary(int rank) const;

 private:
  static constexpr size_t kWords = sizeof(FlightEntry) / sizeof(uint64_t);
  using Slot = std::array<std::atomic<uint64_t>, kWords>;
  [[nodiscard]] FlightEntry load(const Slot& s) const;
  void store(Slot& s, const FlightEntry& e, uint64_t next);

  std::atomic<uint64_t> version_{0};  // odd while the writer is changing an entry
  std::atomic<uint64_t> next_{0};     // entries started so far
  std::array<Slot, kSize> ring_{};
  FlightEntry last_;  // the writer's copy of the newest entry (writers are serialised)
};
static_assert(sizeof(FlightEntry) % sizeof(uint64_t) == 0, "FlightEntry is stored as whole words");

// "allreduce #12 count=1024 float32" for an entry.
std::string describeEntry(const FlightEntry& e);
// The diagnosis of a hang from every reachable rank's summary (nullopt-like:
// rank < 0 = did not answer), relative to the operation `seq` that timed out.
// A rank whose current entry failed stopped in it.  offline: from files in
// CHORUS_FLIGHT_DIR (a rank < 0 wrote none), not from live answers.
std::string diagnoseHang(const FlightEntry& stuck, const std::vector<FlightSummary>& ranks, bool offline = false);

// JSON form of a recorder, as dumped to CHORUS_FLIGHT_DIR and read by
// `chorus-trace hang`.
std::string flightJson(int rank, int nranks, const std::vector<FlightEntry>& entries);
// Parses what flightJson wrote; errors name the field.
Result<FlightSummary> summaryFromJson(const std::string& text, int* nranks);

}  // namespace chorus
