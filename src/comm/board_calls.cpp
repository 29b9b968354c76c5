#include "comm/board_calls.hpp"

#include <algorithm>
#include <bit>

#include "common/dtype.hpp"
#include "exec/local_ops.hpp"

namespace chorus::comm {

void BoardCalls::attach(int rank, int nranks, transport::Board* board, std::chrono::milliseconds timeout) {
  rank_ = rank;
  nranks_ = nranks;
  timeout_ = timeout;
  board_ = board;
  if (board != nullptr) runner_ = std::make_unique<exec::BoardRunner>(rank, nranks, board, timeout);
}

// Board call k = board_calls_ + 1: waits until every peer is past call
// k - kBoardSlots + 1 (see publishCallSlow), copies `bytes` of `inp` into the slot
// when `data`, and publishes it with the batch's signature.  The waits and
// the earlier calls' checks are out of line (publishCallSlow): in a loop of
// symmetric calls neither is needed, and the call costs a copy and a store.
inline Status BoardCalls::publishCall(const std::byte* inp, size_t bytes, bool data, const Scalar* scale) {
  const uint64_t k = board_calls_ + 1;
  if (unverified_count_ != 0 || board_seen_all_ + kBoardLag < k) [[unlikely]]
    CHORUS_RETURN_IF_ERROR(publishCallSlow(k));
  if (data && scale != nullptr)  // PreMulSum: the input scaled on its way into the slot
    exec::runLocalOp(exec::LocalOp::scale(board_->slot(k), inp, bytes / dtypeSize(scale->dtype), scale->dtype, scale));
  else if (data)
    exec::boardCopy(board_->slot(k), inp, bytes);
  board_->publish(k, transport::CallSignature{boardAt(board_base_, k)});
  board_calls_ = k;
  return {};
}

Status BoardCalls::publishCallSlow(uint64_t k) {
  if (unverified_count_ != 0) CHORUS_RETURN_IF_ERROR(verifyEarlierCalls());
  // This call rewrites the slot of call k - kBoardSlots: every peer must be
  // past that call, i.e. have published k - kBoardSlots + 1.  After a
  // symmetric board call this rank has seen far more already; a run of
  // broadcasts (whose ranks await only the root) or of calls that move their
  // data elsewhere waits here, so no rank runs more than kBoardSlots - 1
  // calls ahead of its slowest peer's publishes.
  if (board_seen_all_ + kBoardLag < k) {
    for (int q = 0; q < nranks_; ++q)
      if (q != rank_) CHORUS_RETURN_IF_ERROR(board_->await(q, k - kBoardLag, timeout_).status());
    board_seen_all_ = k - kBoardLag;
  }
  return {};
}

Status BoardCalls::announce(const Signature& sig, uint64_t board_base) {
  sig_ = &sig;
  board_base_ = board_base;
  CHORUS_RETURN_IF_ERROR(publishCall(nullptr, 0, false));
  deferVerification(board_calls_);
  return {};
}

// The one-shot plan through the board: publishes this rank's input (the
// plan's sends) with the call's number and signature, then the board runner
// runs the program (exec/board_runner.hpp): reads of the peers' slots in
// place, the plan's reductions in the plan's order, so the result is the
// executor's bit for bit.  What is left here is the board's protocol: the
// call numbers, the lag of the slowest peer, and a call that read no peer's
// slot has its peers' signatures checked later.
Status BoardCalls::run(const exec::BoardProgram& bp, const exec::Job& job, const Signature& sig,
                       uint64_t board_base) {
  sig_ = &sig;
  board_base_ = board_base;
  if (bp.publish_scaled && job.scalar == nullptr) [[unlikely]]
    return internalError("board: a PreMulSum program without the op's scalar");
  exec::runLocalOps(job.prologue);  // e.g. exact's input converted into the words it publishes
  CHORUS_RETURN_IF_ERROR(publishCall(job.buffers[bp.publish_buf] + bp.publish_offset, bp.publish_bytes, bp.publishes,
                                     bp.publish_scaled ? job.scalar : nullptr));
  const uint64_t k = board_calls_;
  const transport::CallSignature mine{boardAt(board_base_, k)};
  exec::BoardMismatch mismatch;
  if (Status st = runner_->run(bp, job, k, mine, &mismatch); !st.isOk()) [[unlikely]]
    return mismatch.peer >= 0 ? boardMismatch(mismatch.peer, mismatch.theirs, mine, *sig_) : st;
  if (bp.awaits_all) board_seen_all_ = k;  // every peer's k was awaited
  if (bp.awaits_none) deferVerification(k);  // e.g. a broadcast's root reads nobody's slot
  board_->settle();
  exec::runLocalOps(job.epilogue);
  return {};
}

// Compares the peers' signatures of this rank's unverified earlier calls
// with its own, for each peer that has published that call and not yet
// reused its slot (one that has cannot be checked any more; one that has
// not published it yet is checked at a later call).
Status BoardCalls::verifyEarlierCalls() {
  const size_t words = (static_cast<size_t>(nranks_) + 63) / 64;
  for (size_t i = 0; i < unverified_count_;) {
    Unverified& u = board_unverified_[(unverified_first_ + i) % board_unverified_.size()];
    bool pending = false;
    for (size_t w = 0; w < words; ++w) {
      for (uint64_t bits = u.peers[w]; bits != 0; bits &= bits - 1) {
        const int q = static_cast<int>(w * 64 + static_cast<size_t>(std::countr_zero(bits)));
        const uint64_t c = board_->slotCall(q, u.call);
        if (c < u.call) {
          pending = true;
          continue;
        }
        u.peers[w] &= ~(uint64_t{1} << (q % 64));
        // A slot reused meanwhile (a later call, or a torn read while it is
        // rewritten) can no longer be checked.
        transport::CallSignature theirs;
        if (const transport::CallSignature mine{u.board_word};
            c == u.call && board_->signature(q, u.call, &theirs) && !(theirs == mine))
          return boardMismatch(q, theirs, mine, u.sig);
      }
    }
    if (pending || i != 0) {
      ++i;
      continue;
    }
    unverified_first_ = (unverified_first_ + 1) % board_unverified_.size();  // the oldest is done
    --unverified_count_;
  }
  return {};
}

void BoardCalls::deferVerification(uint64_t k) {
  if (board_unverified_.empty()) {
    board_unverified_.resize(transport::kBoardSlots);
    for (Unverified& u : board_unverified_) u.peers.assign((static_cast<size_t>(nranks_) + 63) / 64, 0);
  }
  if (unverified_count_ == board_unverified_.size()) {  // the oldest can no longer be checked: its slots are reused
    unverified_first_ = (unverified_first_ + 1) % board_unverified_.size();
    --unverified_count_;
  }
  Unverified& u = board_unverified_[(unverified_first_ + unverified_count_) % board_unverified_.size()];
  ++unverified_count_;
  u.call = k;
  u.sig = *sig_;
  u.board_word = boardAt(board_base_, k);
  std::fill(u.peers.begin(), u.peers.end(), ~uint64_t{0});
  if (nranks_ % 64) u.peers.back() = (uint64_t{1} << (nranks_ % 64)) - 1;
  u.peers[static_cast<size_t>(rank_) / 64] &= ~(uint64_t{1} << (rank_ % 64));
}

// A peer published another call's signature on the board: chorusMismatch
// naming both ranks' calls and the fields that differ.
Status BoardCalls::boardMismatch(int peer, const transport::CallSignature& theirs,
                                   const transport::CallSignature& mine_word, const Signature& mine_full) const {
  // The fields compared as both words hold them, so only real differences
  // show; this rank's call described in full.
  const Signature mine = fromCallSignature(mine_word, mine_full.seq);
  const Signature other = fromCallSignature(theirs, mine.seq);
  const bool saturated = other.count == 8191 || other.root == 4095;
  return makeError(chorusMismatch,
                   "rank {}: collective mismatch: rank {} called {}; rank {} called {}{} (differs in {}) (are all "
                   "ranks calling the same collectives in the same order with the same count, dtype, op and root?)",
                   rank_, rank_, describe(mine_full), peer, describe(other),
                   saturated ? " (a board word holds counts up to 8191 and roots up to 4095)" : "",
                   differing(other, mine));
}

}  // namespace chorus::comm
