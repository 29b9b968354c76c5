// The board's protocol on a one-host communicator (every peer on this host):
// the board call numbers, the lag of the slowest peer, publishing each
// collective call's signature, running one-shot programs through the board
// runner (exec/board_runner.hpp), and checking later the signatures of calls
// that read no peer's slot.  The data movement is the runner's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/call_signature.hpp"
#include "common/reduction.hpp"
#include "common/status.hpp"
#include "exec/board_runner.hpp"
#include "exec/executor.hpp"
#include "transport/transport.hpp"

namespace chorus::comm {

class BoardCalls {
 public:
  // board: the shm transport's; nullptr (not every peer on this host) leaves
  // the board off.
  void attach(int rank, int nranks, transport::Board* board, std::chrono::milliseconds timeout);
  [[nodiscard]] bool on() const { return board_ != nullptr; }
  // The runner (nullptr when the board is off).
  [[nodiscard]] exec::BoardRunner* runner() const { return runner_.get(); }

  // A collective call that moves its data elsewhere still publishes its
  // signature on the board, so a rank whose call runs through the board (a
  // small one) notices a peer that is in another call here.  sig: the
  // batch's, board_base: its board word without the call bits.
  Status announce(const Signature& sig, uint64_t board_base);
  // Runs job (a one-shot plan compiled into bp) through the board, with its
  // prologue before its input is published and its epilogue after.
  Status run(const exec::BoardProgram& bp, const exec::Job& job, const Signature& sig, uint64_t board_base);

 private:
  // How many calls a rank may run ahead of its slowest peer's publishes.
  static constexpr uint64_t kBoardLag = transport::kBoardSlots - 1;
  Status publishCall(const std::byte* inp, size_t bytes, bool data, const Scalar* scale = nullptr);
  Status publishCallSlow(uint64_t k);
  Status boardMismatch(int peer, const transport::CallSignature& theirs, const transport::CallSignature& mine,
                       const Signature& mine_full) const;
  Status verifyEarlierCalls();
  void deferVerification(uint64_t k);

  int rank_ = 0, nranks_ = 1;
  std::chrono::milliseconds timeout_{0};
  transport::Board* board_ = nullptr;
  std::unique_ptr<exec::BoardRunner> runner_;
  uint64_t board_calls_ = 0;     // the board calls made so far
  uint64_t board_seen_all_ = 0;  // the last call whose publish this rank has seen from every peer
  // The running call's signature and its board word without the call bits.
  const Signature* sig_ = nullptr;
  uint64_t board_base_ = 0;
  // Calls of this rank whose peers' board signatures it has not compared yet
  // (it read no slot of theirs): checked at the start of later calls.
  struct Unverified {
    uint64_t call = 0;
    Signature sig;
    uint64_t board_word = 0;
    std::vector<uint64_t> peers;  // bit q: peer q still to check
  };
  std::vector<Unverified> board_unverified_;  // a ring of kBoardSlots, allocated at the first use
  size_t unverified_first_ = 0, unverified_count_ = 0;
};

}  // namespace chorus::comm
