// Admission on a listener that strangers can reach (the store server's and
// the TCP transport's).  Anyone who can connect to a port can open sockets
// and then say nothing, dribble bytes, or send garbage; none of that may
// delay the job's own connections or use up the process's descriptors.
//
// The Gate accepts every pending connection at once and drives each one's
// job-secret handshake (auth::ServerHandshakeMachine) without blocking, all
// of them concurrently in the owner's poll loop:
//  - each unauthenticated connection has a short deadline of its own
//    (GateOptions::handshake_timeout), after which it is closed;
//  - at most GateOptions::max_pending may be unauthenticated at once; a new
//    one displaces the oldest that has sent nothing (else the oldest), so a
//    flood holds a bounded number of descriptors and the rest stay free for
//    the job's own sockets (the default cap is an eighth of RLIMIT_NOFILE);
//  - when accept() itself fails for want of descriptors, accepting pauses
//    for 100 ms instead of spinning on the backlog.
// An honest peer answers the greeting at once and is admitted within a round
// trip, whatever else sits on the listener.
//
// Refusals are counted by a StrangerLog: the first is logged with its
// reason, later ones are summarised in one line at most every 10 s (a
// stranger cannot make the job's log grow with its connection rate), and
// summary() names them in the owner's own errors (a setup that times out
// says what else knocked, instead of blaming only the ranks it waited for).
//
// Single-threaded: a Gate belongs to the thread that polls it.
#pragma once

#include <poll.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire_protect.hpp"

namespace chorus::auth {

// Why a connection was refused (StrangerLog's categories).
enum class Refusal : uint8_t {
  kSilent,    // no complete handshake before its deadline
  kBadAuth,   // the handshake failed: wrong secret, garbage, an oversized hello
  kClosed,    // closed or reset before finishing the handshake
  kEvicted,   // displaced by a newer connection while max_pending were waiting
  kRejected,  // authenticated, then refused by the owner (another communicator, a duplicate)
};
inline constexpr size_t kRefusalKinds = 5;

class StrangerLog {
 public:
  // `where` names the listener in log lines: "store server 10.0.0.1:29500".
  explicit StrangerLog(std::string where);
  ~StrangerLog();  // logs what was refused since the last line, if anything
  StrangerLog(const StrangerLog&) = delete;
  StrangerLog& operator=(const StrangerLog&) = delete;

  void refused(std::string_view peer, Refusal why, std::string_view detail);
  // Logs the summary line when one is due (call it from the owner's loop).
  void tick();
  // When tick() next has something to say; time_point::max() when nothing.
  [[nodiscard]] net::Clock::time_point nextReport() const;

  [[nodiscard]] const std::string& where() const { return where_; }
  [[nodiscard]] size_t total() const;
  [[nodiscard]] size_t count(Refusal why) const { return counts_[static_cast<size_t>(why)]; }
  // "4 connections refused (3 silent past the handshake deadline, 1 failed
  // authentication) from 127.0.0.1"; empty when none was refused.
  [[nodiscard]] std::string summary() const;

  static constexpr auto kReportEvery = std::chrono::seconds(10);

 private:
  std::string describe(const std::array<size_t, kRefusalKinds>& counts) const;

  std::string where_;
  std::array<size_t, kRefusalKinds> counts_{};
  std::array<size_t, kRefusalKinds> unreported_{};
  std::vector<std::string> hosts_;  // distinct host addresses seen, the first few
  size_t more_hosts_ = 0;
  net::Clock::time_point last_line_{};
  bool logged_first_ = false;
};

struct GateOptions {
  // A stranger's connection lives at most this long unauthenticated.  An
  // honest peer answers within a round trip; the margin is for a peer that
  // is descheduled on a loaded host (a sanitizer run with 8 ranks on 2 cores).
  std::chrono::milliseconds handshake_timeout{5000};
  // Unauthenticated connections held at once; 0: min(64, max(4, the
  // descriptor limit / 8)).
  size_t max_pending = 0;
};

// A connection that proved the job secret (the proof is sent), in
// non-blocking mode.
struct Admitted {
  net::Fd fd;
  std::string peer;
  std::vector<std::byte> hello;
  SessionKeys keys;  // this (server) end's, for wire protection
};

class Gate {
 public:
  // `listen_fd` stays the caller's; it is made non-blocking here.
  Gate(int listen_fd, const Secret& secret, std::string where, GateOptions options = {});
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Appends the poll entries of the listener (fd -1 while accepting is
  // paused) and of every pending connection; returns how many.  Hand the
  // same entries, after poll(), to onPoll().
  size_t appendPollFds(std::vector<pollfd>& fds);
  // Accepts, reads and writes what the entries say is ready, closes the
  // connections past their deadline, and returns the ones that completed
  // the handshake since the last call.
  std::vector<Admitted> onPoll(std::span<const pollfd> entries);
  // Call after a poll() timeout too: expires deadlines, logs due summaries.
  void expire();
  // The earliest deadline of a pending connection, of the accept pause or of
  // the log's next summary (for the owner's poll timeout).
  [[nodiscard]] net::Clock::time_point nextDeadline() const;

  [[nodiscard]] size_t pending() const { return pending_.size(); }
  [[nodiscard]] size_t maxPending() const { return max_pending_; }
  StrangerLog& strangers() { return log_; }
  [[nodiscard]] const StrangerLog& strangers() const { return log_; }

 private:
  struct Pending;
  void acceptReady();
  void drive(Pending& p, short revents);
  void refuse(Pending& p, Refusal why, std::string_view detail);
  void evictOne();

  int listen_fd_;
  Secret secret_;
  GateOptions options_;
  size_t max_pending_;
  StrangerLog log_;
  std::vector<std::unique_ptr<Pending>> pending_;  // oldest first
  std::vector<Pending*> polled_;                    // the entries of the last appendPollFds, after the listener
  std::vector<Admitted> admitted_;
  net::Clock::time_point accept_paused_until_{};
  size_t accept_failures_ = 0;
};

// A pending connection budget from the descriptor limit (GateOptions's default).
size_t defaultMaxPending();

}  // namespace chorus::auth
