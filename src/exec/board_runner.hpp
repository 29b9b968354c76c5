// The board runner: runs a one-shot plan's program (src/plan/oneshot.cpp)
// over the shared-memory transport's board (transport.hpp, Board) instead of
// its message rings.
//
// It interprets the program's steps, whatever the collective: this rank's
// sends all read its input before anything writes it, so they become the one
// write of that input into its board slot (comm::BoardCalls::publishCall;
// a PreMulSum plan's sends read its leading Scale step's copy, so the input
// is written scaled, BoardProgram::publish_scaled);
// a Recv from peer q is the region q's matching Send reads, found in place in
// q's slot (no copy into scratch: later steps read the slot; a receive into
// the output is copied there); a RecvReduce reduces straight out of q's slot;
// Copy, Reduce, Scale and Divide run as the executor runs them, in program
// order, which is
// a valid serial execution (plan.hpp) and the plan's combination order, so
// the result is the executor's bit for bit.
//
// Interpreting the steps per call would cost more than an 8-byte call's
// exchange, so a program is compiled once (compile(), cached per program by
// the runner): regions become (base, byte offset) pairs, the receives become
// aliases of peers' slots, and the ops left are awaits of peers, copies and
// reductions.  A call then costs the awaits and the local work, with no
// allocation and no virtual call but the transport's await.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.hpp"
#include "exec/executor.hpp"
#include "plan/plan.hpp"
#include "transport/transport.hpp"

namespace chorus::exec {

// One-shot calls whose input is at most kBoardBytes per rank run through the
// board: one write and n - 1 reads in place per rank.  The communicator hands
// the figure to the cost model (tune::CostProfile::board_bytes), which prices
// those calls at the board's cost.
inline constexpr uint64_t kBoardBytes = 4096;
static_assert(kBoardBytes <= transport::kBoardSlotBytes);
// What one rank publishes on the board for a one-shot call of `sh`: its
// whole input (a broadcast's root's: the vector), the same on every rank.
// The cost model computes the same figure (tune/cost_model.cpp).
inline uint64_t boardBytes(const plan::Shape& sh) { return sh.inputElems(sh.root) * sh.elem_size; }

// Copies for the board: at most a slot, to or from lines another core holds.
// glibc's memcpy switches to `rep movsb` from 2 KiB, which stalls on such
// lines: a 2.5 KiB one-shot allreduce took 1.14-1.29 us with it and 0.62 us
// with plain vector moves (GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold
// raised), 4 KiB 1.28-1.70 against 0.87-1.06 us.
inline void boardCopy(std::byte* dst, const std::byte* src, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) std::memcpy(dst + i, src + i, 64);  // inlined as vector moves
  for (; i + 8 <= n; i += 8) std::memcpy(dst + i, src + i, 8);
  for (; i < n; ++i) dst[i] = src[i];
}

// A program compiled for the board.  An operand's base is one of the job's
// buffers (plan::Buf: input, output, scratch) or a rank's board slot of the
// call (kSlotBase + rank; this rank's own slot holds its published input).
struct BoardProgram {
  static constexpr uint16_t kSlotBase = 3;
  struct Operand {
    uint16_t base = 0;
    uint64_t offset = 0;  // bytes
  };
  enum class Kind : uint8_t {
    None,    // only the await
    Copy,    // dst = a, bytes
    Reduce,  // dst = a (op) b, elems
    Scale,   // dst = a x the job's scalar, elems (plan::StepOp::Scale)
    Divide,  // dst = dst / divisor, elems (plan::StepOp::Divide)
  };
  struct Op {
    Kind kind = Kind::None;
    // First, when >= 0: await this peer's slot of the call (and compare its
    // signature).  Carried by the op that first reads the slot, so a call
    // walks one op per reduction, not two.
    int32_t await = -1;
    Operand dst, a, b;
    uint64_t n = 0;  // Copy: bytes; Reduce: elements
  };
  // What this rank publishes: `publish_bytes` of buffer `publish_buf` from
  // `publish_offset` (bytes); nothing (only the call number and signature)
  // when it sends nothing.
  bool publishes = false;
  uint16_t publish_buf = 0;
  uint64_t publish_offset = 0, publish_bytes = 0;
  // PreMulSum: the sends read the scaled copy of the input that the plan's
  // leading Scale step makes, so the input is published multiplied by the
  // job's scalar (the Scale op still runs, for the rank's own reads).
  bool publish_scaled = false;
  std::vector<Op> ops;
  uint64_t scratch_bytes = 0;  // scratch the ops touch (0: the receives elided it all)
  uint32_t divisor = 0;        // Divide ops' (plan::Program::divisor)
  bool awaits_all = false;     // every peer's slot is awaited (the board's lag bookkeeping)
  bool awaits_none = false;    // no peer's slot is (its signature is checked later)
  bool reads_own_slot = false;  // an op reads this rank's published input from its slot
};

// Compiles rank's program `prog` of algo for sh (elements of elem_size
// bytes) for the board.  Every rank's program is expanded to match the
// receives with their sends, and every rank must satisfy the board's
// conditions (sends read one buffer, unwritten before they run, at most a
// slot), so the ranks of a call all agree whether it runs on the board.
// chorusInternalError when the plan cannot run there.
Result<BoardProgram> compileBoard(const plan::Algorithm& algo, const plan::Shape& sh, int rank,
                                  const plan::Program& prog, size_t elem_size);

// A peer published another call's signature (BoardRunner::run).
struct BoardMismatch {
  int peer = -1;
  transport::CallSignature theirs;
};

class BoardRunner {
 public:
  BoardRunner(int rank, int nranks, transport::Board* board, std::chrono::milliseconds timeout);

  [[nodiscard]] transport::Board* board() const { return board_; }

  // prog (of algo for sh) compiled for the board, from the runner's cache;
  // nullptr when it cannot run there.  The last program's answer is
  // remembered, so a loop of equal calls costs one compare.
  const BoardProgram* programFor(const plan::Algorithm& algo, const plan::Shape& sh, const plan::Program& prog,
                                 size_t elem_size);

  // Runs bp for board call k (already published by the caller) on job's
  // buffers.  A peer's slot of another call fails with chorusMismatch and
  // fills *mismatch; other failures are the await's.
  Status run(const BoardProgram& bp, const Job& job, uint64_t k, transport::CallSignature mine,
             BoardMismatch* mismatch);

 private:
  static Status runScaling(const BoardProgram& bp, const BoardProgram::Op& op, const Job& job, std::byte* const* base);

  int rank_, nranks_;
  transport::Board* board_;
  std::chrono::milliseconds timeout_;
  // Per program of the communicator's cache (which outlives the runner's
  // use of it): its compiled form, or a refusal.
  std::unordered_map<const plan::Program*, BoardProgram> cache_;
  std::unordered_set<const plan::Program*> refused_;
  const plan::Program* last_prog_ = nullptr;
  const BoardProgram* last_bp_ = nullptr;
  std::vector<std::byte*> base_;  // per call: the operands' bases (slots are only read)
  std::vector<std::byte> scratch_;
};

}  // namespace chorus::exec
