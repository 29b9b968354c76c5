// A communicator's health: the whole-signature exchange (CHORUS_CHECK, and
// every communicator's first collective), the flight recorder of its
// operations, the watchdog that answers other ranks' "where are you?" probes,
// and the diagnosis a timeout becomes.
//
// Threading: everything but the watchdog runs on the thread executing the
// communicator's batches; the watchdog reads the flight recorder (a sequence
// lock, flight.hpp) from its own thread over its own store connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "comm/call_signature.hpp"
#include "comm/flight.hpp"
#include "comm/op.hpp"
#include "common/config.hpp"
#include "common/status.hpp"
#include "exec/executor.hpp"
#include "plan/plan.hpp"

namespace chorus::comm {

class Health {
 public:
  // Re-estimates the clock offset over the watchdog's store connection;
  // false stops the watchdog (the store is gone).
  using Resync = std::function<bool(bootstrap::Store&)>;

  Health() = default;
  Health(const Health&) = delete;
  Health& operator=(const Health&) = delete;
  ~Health();

  // CHORUS_FLIGHT_DIR must exist when a failure comes: made at init (as
  // CHORUS_TRACE's), or the init fails naming it.
  static Status makeFlightDir(const std::string& dir);

  // store: the communicator's own (probes, answers and verdicts live there).
  void bind(int rank, int nranks, const Config& cfg, bootstrap::Store* store);
  // Opens the watchdog's own store connection and starts it (nothing on one
  // rank).  resync, when set, runs every `resync_period` between probes.
  // on_revoke(rank) runs on the watchdog's thread when a rank posts a revoke
  // notice (Communicator::revoke; rank -1 when the notice names none).
  Status startWatchdog(const bootstrap::UniqueId& id, const std::string& prefix, Resync resync,
                       std::chrono::milliseconds resync_period, std::function<void(int)> on_revoke = {});
  // Interrupts and joins the watchdog.
  void stopWatchdog();

  // Whether this batch exchanges its whole signature first.
  [[nodiscard]] bool wantsCheck() const { return check_ || !checked_once_; }
  // Exchanges the batch's signature with every rank; chorusMismatch naming the
  // ranks and fields that differ.  *broke: the exchange itself failed (the
  // communicator must break), not a mismatch.
  Status checkSignatures(const Signature& mine, uint64_t seq, exec::Executor& executor,
                         const plan::Registry& registry, bool* broke);

  // The flight recorder: starts every collective of the batch under its
  // number (the trace's too; sends and receives are numbered apart) and
  // returns the first one's entry, the one a failure is reported against.
  FlightEntry begin(std::span<OpDesc> ops, uint64_t* op_seq, uint64_t* p2p_seq);
  // The batch's end: a timeout of a batch with collectives explained (while
  // the other ranks are still waiting), any other breaking error given the
  // operation it hit, the flight entries finished, a mismatch left as the
  // verdict for ranks that only time out.
  Status conclude(Status st, bool breaks, uint64_t first_seq, uint64_t op_seq, const FlightEntry& stuck);
  // Writes the recorder to CHORUS_FLIGHT_DIR (when set).
  void dumpFlight() const;

 private:
  void watchdogLoop(const Resync& resync, std::chrono::milliseconds period);
  // Asks every rank where it is and turns a timeout into a diagnosis.
  Status explainTimeout(const Status& st, const FlightEntry& stuck);
  std::string peerVerdict(uint64_t seq);

  int rank_ = 0, nranks_ = 1;
  std::chrono::milliseconds timeout_{0};
  WireProtect protect_ = WireProtect::kOff;
  std::function<void(int)> on_revoke_;  // the watchdog's store connection (Config::net)
  bool check_ = false;
  std::string flight_dir_;
  bootstrap::Store* store_ = nullptr;
  bool checked_once_ = false;
  FlightRecorder flight_;
  std::shared_ptr<bootstrap::Store> watch_store_;  // the watchdog's own store connection
  std::thread watchdog_;
  plan::Program sig_program_;
  std::vector<std::byte> sig_buf_;
};

}  // namespace chorus::comm
