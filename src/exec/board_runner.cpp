#include "exec/board_runner.hpp"

#include <algorithm>
#include <optional>

#include "kernels/reduce.hpp"

namespace chorus::exec {
namespace {

using plan::Buf;
using plan::Region;
using plan::StepOp;
using Operand = BoardProgram::Operand;
using Op = BoardProgram::Op;

bool contains(const Region& outer, const Region& r) {
  return outer.buf == r.buf && r.offset >= outer.offset && r.end() <= outer.end();
}

// What one rank's sends read: one buffer's [base, end) (elements), and per
// destination the regions in program order (the i-th pairs with the
// destination's i-th receive from this rank).
struct Sends {
  bool any = false;
  Buf buf = Buf::Input;
  uint64_t base = 0, end = 0;
  std::vector<std::vector<Region>> to;
  // PreMulSum's leading Scale step (plan/scaling.cpp), when the program has
  // one: the sends may read what it writes, published scaled.
  std::optional<plan::Step> scale;
};

// The board publishes a rank's input once, before its program runs: every
// send must read one buffer (no user buffers of groups), and nothing the
// program does before the send may have written what it reads.
Result<Sends> sendsOf(const plan::Program& p, int n, size_t es) {
  Sends s;
  s.to.resize(static_cast<size_t>(n));
  std::vector<Region> written;
  for (const plan::Step& st : p.steps) {
    if (st.op == StepOp::Scale && written.empty() && !s.any && !s.scale) {
      s.scale = st;  // published scaled: not a write the sends must avoid
      continue;
    }
    if (st.op != StepOp::Send) {
      if (st.dst.buf > Buf::Scratch || st.src.buf > Buf::Scratch || st.src2.buf > Buf::Scratch)
        return internalError("board: rank {}'s program addresses a group's user buffer", p.rank);
      written.push_back(st.dst);
      continue;
    }
    if (st.peer < 0 || st.peer >= n || st.peer == p.rank || st.src.buf > Buf::Scratch)
      return internalError("board: rank {}'s program sends to {} from buffer {}", p.rank, st.peer,
                           static_cast<int>(st.src.buf));
    if (st.src.count == 0) continue;
    for (const Region& w : written)
      if (w.overlaps(st.src))
        return internalError("board: rank {} sends a region its program wrote before", p.rank);
    if (!s.any) {
      s.any = true;
      s.buf = st.src.buf;
      s.base = st.src.offset;
      s.end = st.src.end();
    } else if (st.src.buf != s.buf) {
      return internalError("board: rank {} sends from two buffers", p.rank);
    }
    s.base = std::min(s.base, st.src.offset);
    s.end = std::max(s.end, st.src.end());
    s.to[static_cast<size_t>(st.peer)].push_back(st.src);
  }
  if (s.any && s.scale && !(s.buf == s.scale->dst.buf && s.base >= s.scale->dst.offset && s.end <= s.scale->dst.end()))
    return internalError("board: rank {} sends both scaled and unscaled data", p.rank);
  if (s.any && (s.end - s.base) * es > transport::kBoardSlotBytes)
    return internalError("board: rank {} publishes {} bytes, more than a slot", p.rank, (s.end - s.base) * es);
  return s;
}

// Compiles one program's steps in program order.  A receive does not move
// data: its region becomes an alias of the sender's slot, which later reads
// of the region use.  An alias ends when a step writes all of its region;
// one that a step reads or writes only in part, or that holds part of the
// output at the end, is first copied into its region (materialised).
class Compiler {
 public:
  Compiler(int rank, int n, size_t es, const std::vector<Sends>& sends, BoardProgram* out)
      : rank_(rank), n_(n), es_(es), sends_(sends), out_(out), next_(static_cast<size_t>(n), 0),
        awaited_(static_cast<size_t>(n), 0), received_(static_cast<size_t>(n), 0) {
    awaited_[static_cast<size_t>(rank)] = 1;
  }

  Status step(const plan::Step& st) {
    switch (st.op) {
      case StepOp::Send: return {};  // published before the program runs
      case StepOp::Recv: {
        CHORUS_ASSIGN_OR_RETURN(Operand x, incoming(st.peer, st.dst.count));
        beforeWrite(st.dst);
        aliases_.push_back({st.dst, x});
        written_.push_back(st.dst);
        return {};
      }
      case StepOp::RecvReduce: {
        CHORUS_ASSIGN_OR_RETURN(Operand x, incoming(st.peer, st.dst.count));
        beforeRead(st.src);
        const Operand a = resolve(st.src);
        beforeWrite(st.dst);
        emit({.kind = BoardProgram::Kind::Reduce, .dst = plain(st.dst), .a = a, .b = x, .n = st.dst.count});
        written_.push_back(st.dst);
        return {};
      }
      case StepOp::Copy: return copy(st.dst, st.src);
      case StepOp::Reduce: {
        beforeRead(st.src);
        beforeRead(st.src2);
        const Operand a = resolve(st.src), b = resolve(st.src2);
        beforeWrite(st.dst);
        emit({.kind = BoardProgram::Kind::Reduce, .dst = plain(st.dst), .a = a, .b = b, .n = st.dst.count});
        written_.push_back(st.dst);
        return {};
      }
      case StepOp::Scale:
      case StepOp::Divide: return scaling(st);
      case StepOp::Quantize:
      case StepOp::Dequantize:
      case StepOp::DequantizeReduce:
      case StepOp::Encode:
      case StepOp::Decode:
      case StepOp::DecodeAdd:
      case StepOp::EncodeAdd:
        // Compressed and exact plans are not one-shot programs; the board never gets one.
        return internalError("board: a compressed or exact plan's step ({}) on the board", static_cast<int>(st.op));
    }
    return internalError("board: unknown step");
  }

  // The program's end: aliases of the output are copied into it, and every
  // peer this rank received from is awaited (its signature compared) even if
  // no op read its slot; a program without messages (a call of no data)
  // awaits every peer, as the executor's path compares their signatures too.
  void finish(bool any_message) {
    for (size_t i = aliases_.size(); i-- > 0;)
      if (aliases_[i].r.buf != Buf::Scratch) materialise(i);
    for (int q = 0; q < n_; ++q)
      if (received_[static_cast<size_t>(q)] || !any_message) await(q);
  }

 private:
  struct Alias {
    Region r;
    Operand src;
  };

  Operand plain(const Region& r) const { return {static_cast<uint16_t>(r.buf), r.offset * es_}; }

  // The slot region that peer's next send to this rank reads.
  Result<Operand> incoming(int peer, uint64_t count) {
    if (peer < 0 || peer >= n_ || peer == rank_) return internalError("board: receive from rank {}", peer);
    const Sends& s = sends_[static_cast<size_t>(peer)];
    const auto& list = s.to[static_cast<size_t>(rank_)];
    size_t& i = next_[static_cast<size_t>(peer)];
    if (i >= list.size() || list[i].count != count)
      return internalError("board: rank {}'s receive {} from rank {} matches no send of {} elements", rank_, i, peer,
                           count);
    received_[static_cast<size_t>(peer)] = 1;
    const Region& src = list[i++];
    return Operand{static_cast<uint16_t>(BoardProgram::kSlotBase + peer), (src.offset - s.base) * es_};
  }

  Operand resolve(const Region& r) const {
    for (const Alias& a : aliases_)
      if (contains(a.r, r)) return {a.src.base, a.src.offset + (r.offset - a.r.offset) * es_};
    return plain(r);
  }
  void beforeRead(const Region& r) {
    for (size_t i = aliases_.size(); i-- > 0;)
      if (aliases_[i].r.overlaps(r) && !contains(aliases_[i].r, r)) materialise(i);
  }
  void beforeWrite(const Region& w) {
    for (size_t i = aliases_.size(); i-- > 0;) {
      if (!aliases_[i].r.overlaps(w)) continue;
      if (contains(w, aliases_[i].r))
        aliases_.erase(aliases_.begin() + static_cast<ptrdiff_t>(i));  // overwritten whole: nothing to keep
      else
        materialise(i);
    }
  }
  void materialise(size_t i) {
    const Alias a = aliases_[i];
    aliases_.erase(aliases_.begin() + static_cast<ptrdiff_t>(i));
    emit({.kind = BoardProgram::Kind::Copy, .dst = plain(a.r), .a = a.src, .n = a.r.count * es_});
  }

  // The op's arithmetic runs on plain memory: whatever aliases a slot in its
  // regions is copied out first.  (PreMulSum's leading Scale still runs for
  // the rank's own reads of its scaled input; its peers read the slot, which
  // holds the input published scaled.  Avg's Divide ends the program.)
  Status scaling(const plan::Step& st) {
    const bool scale = st.op == StepOp::Scale;
    beforeRead(st.src);
    const Operand a = resolve(st.src);
    for (size_t i = aliases_.size(); i-- > 0;)
      if (aliases_[i].r.overlaps(st.dst)) materialise(i);
    written_.push_back(st.dst);
    emit({.kind = scale ? BoardProgram::Kind::Scale : BoardProgram::Kind::Divide, .dst = plain(st.dst),
          .a = scale ? a : plain(st.dst), .n = st.dst.count});
    return {};
  }

  // A copy into scratch of a peer's slot, or of this rank's input not yet
  // written (its own slot holds it), is an alias too.
  Status copy(const Region& dst, const Region& src) {
    beforeRead(src);
    Operand a = resolve(src);
    const Sends& own = sends_[static_cast<size_t>(rank_)];
    const bool published = a.base < BoardProgram::kSlotBase && own.any && src.buf == own.buf &&
                           src.offset >= own.base && src.end() <= own.end &&
                           std::none_of(written_.begin(), written_.end(), [&](const Region& w) { return w.overlaps(src); });
    if (published) a = {static_cast<uint16_t>(BoardProgram::kSlotBase + rank_), (src.offset - own.base) * es_};
    beforeWrite(dst);
    written_.push_back(dst);
    if (dst.buf == Buf::Scratch && a.base >= BoardProgram::kSlotBase) {
      aliases_.push_back({dst, a});
      return {};
    }
    emit({.kind = BoardProgram::Kind::Copy, .dst = plain(dst), .a = a, .n = dst.count * es_});
    return {};
  }

  // An await of q, on `op` when it has none yet, else an op of its own.
  void await(int q, Op* op = nullptr) {
    if (awaited_[static_cast<size_t>(q)]) return;
    awaited_[static_cast<size_t>(q)] = 1;
    if (op != nullptr && op->await < 0)
      op->await = q;
    else
      out_->ops.push_back({.kind = BoardProgram::Kind::None, .await = q});
  }
  // Awaits a peer at the first op that reads its slot, so the reductions of
  // the peers that are there overlap the wait for those that are not.
  void emit(Op op) {
    if (op.n == 0) return;
    for (const Operand* o : {&op.b, &op.a})
      if (o->base >= BoardProgram::kSlotBase) await(o->base - BoardProgram::kSlotBase, &op);
    for (const Operand* o : {&op.dst, &op.a, &op.b})
      if (o->base == static_cast<uint16_t>(Buf::Scratch) && (o != &op.b || op.kind == BoardProgram::Kind::Reduce))
        uses_scratch_ = true;
    out_->ops.push_back(op);
  }

 public:
  bool uses_scratch_ = false;

 private:
  int rank_, n_;
  size_t es_;
  const std::vector<Sends>& sends_;
  BoardProgram* out_;
  std::vector<size_t> next_;  // per peer: receives matched so far
  std::vector<char> awaited_, received_;
  std::vector<Alias> aliases_;
  std::vector<Region> written_;
};

}  // namespace

Result<BoardProgram> compileBoard(const plan::Algorithm& algo, const plan::Shape& sh, int rank,
                                  const plan::Program& prog, size_t elem_size) {
  const int n = sh.nranks;
  std::vector<Sends> sends;
  sends.reserve(static_cast<size_t>(n));
  bool any_message = false;
  plan::Program peer;
  for (int q = 0; q < n; ++q) {
    const plan::Program* p = &prog;
    if (q != rank) {
      plan::expand(algo, sh, q, &peer);
      p = &peer;
    }
    CHORUS_ASSIGN_OR_RETURN(Sends s, sendsOf(*p, n, elem_size));
    sends.push_back(std::move(s));
  }
  BoardProgram bp;
  Compiler c(rank, n, elem_size, sends, &bp);
  for (const plan::Step& st : prog.steps) {
    any_message = any_message || st.op == StepOp::Send || st.op == StepOp::Recv || st.op == StepOp::RecvReduce;
    CHORUS_RETURN_IF_ERROR(c.step(st));
  }
  c.finish(any_message);
  const Sends& own = sends[static_cast<size_t>(rank)];
  bp.publishes = own.any;
  bp.publish_buf = static_cast<uint16_t>(own.buf);
  bp.publish_offset = own.base * elem_size;
  bp.publish_bytes = (own.end - own.base) * elem_size;
  if (own.any && own.scale) {  // publish the Scale's source, scaled
    bp.publish_scaled = true;
    bp.publish_buf = static_cast<uint16_t>(own.scale->src.buf);
    bp.publish_offset = (own.scale->src.offset + own.base - own.scale->dst.offset) * elem_size;
  }
  bp.scratch_bytes = c.uses_scratch_ ? prog.scratch_elems * elem_size : 0;
  bp.divisor = prog.divisor;
  int awaited = 0;
  for (const Op& op : bp.ops) awaited += op.await >= 0;
  bp.awaits_all = awaited == n - 1;
  bp.awaits_none = awaited == 0;
  const uint16_t own_slot = static_cast<uint16_t>(BoardProgram::kSlotBase + rank);
  bp.reads_own_slot = std::any_of(bp.ops.begin(), bp.ops.end(), [&](const Op& op) {
    return op.kind != BoardProgram::Kind::None && (op.a.base == own_slot || op.b.base == own_slot);
  });
  return bp;
}

BoardRunner::BoardRunner(int rank, int nranks, transport::Board* board, std::chrono::milliseconds timeout)
    : rank_(rank), nranks_(nranks), board_(board), timeout_(timeout),
      base_(BoardProgram::kSlotBase + static_cast<size_t>(nranks), nullptr) {}

const BoardProgram* BoardRunner::programFor(const plan::Algorithm& algo, const plan::Shape& sh,
                                            const plan::Program& prog, size_t elem_size) {
  if (&prog == last_prog_) return last_bp_;
  const BoardProgram* bp = nullptr;
  if (auto it = cache_.find(&prog); it != cache_.end()) {
    bp = &it->second;
  } else if (!refused_.contains(&prog)) {
    Result<BoardProgram> c = compileBoard(algo, sh, rank_, prog, elem_size);
    if (c.isOk())
      bp = &cache_.emplace(&prog, std::move(c.value())).first->second;
    else
      refused_.insert(&prog);
  }
  last_prog_ = &prog;
  last_bp_ = bp;
  return bp;
}

// A Scale or Divide op (the job's scalar; its reduce_dtype).
Status BoardRunner::runScaling(const BoardProgram& bp, const BoardProgram::Op& op, const Job& job,
                               std::byte* const* base) {
  std::byte* dst = base[op.dst.base] + op.dst.offset;
  if (op.kind == BoardProgram::Kind::Divide) {
    if (bp.divisor == 0) return internalError("board: a Divide without a divisor");
    kernels::divide(dst, dst, op.n, job.reduce_dtype, bp.divisor);
    return {};
  }
  if (job.scalar == nullptr) return internalError("board: a Scale without the op's scalar");
  kernels::scale(dst, base[op.a.base] + op.a.offset, op.n, job.scalar->dtype, *job.scalar);
  return {};
}

Status BoardRunner::run(const BoardProgram& bp, const Job& job, uint64_t k, transport::CallSignature mine,
                        BoardMismatch* mismatch) {
  std::byte** base = base_.data();
  base[static_cast<size_t>(Buf::Input)] = job.buffers[static_cast<size_t>(Buf::Input)];
  base[static_cast<size_t>(Buf::Output)] = job.buffers[static_cast<size_t>(Buf::Output)];
  if (bp.scratch_bytes != 0) [[unlikely]] {
    if (scratch_.size() < bp.scratch_bytes) scratch_.resize(bp.scratch_bytes);
    base[static_cast<size_t>(Buf::Scratch)] = scratch_.data();
  }
  if (bp.reads_own_slot) base[BoardProgram::kSlotBase + static_cast<size_t>(rank_)] = board_->slot(k);
  const kernels::Reducer* reducer = reducerFor(job.reduce_dtype, job.reduce_op);
  if (reducer == nullptr) [[unlikely]]
    return internalError("board: no reduction kernel for datatype {} and op {}", static_cast<int>(job.reduce_dtype),
                         static_cast<int>(job.reduce_op));
  for (const Op& op : bp.ops) {
    if (op.await >= 0) {
      // The signature is read with the slot (its call bits are k's: the
      // peer cannot reuse the slot before this rank publishes k + 1).
      transport::CallSignature theirs;
      Result<const std::byte*> x = board_->await(op.await, k, timeout_, &theirs);
      if (!x.isOk()) [[unlikely]] return x.status();
      if (!(theirs == mine)) [[unlikely]] {
        mismatch->peer = op.await;
        mismatch->theirs = theirs;
        return makeError(chorusMismatch, "board: rank {} published another call", op.await);
      }
      base[BoardProgram::kSlotBase + static_cast<size_t>(op.await)] = const_cast<std::byte*>(*x);
    }
    if (op.kind == BoardProgram::Kind::Reduce)
      (*reducer)(base[op.dst.base] + op.dst.offset, base[op.a.base] + op.a.offset, base[op.b.base] + op.b.offset,
                 op.n);
    else if (op.kind == BoardProgram::Kind::Copy)
      boardCopy(base[op.dst.base] + op.dst.offset, base[op.a.base] + op.a.offset, op.n);
    else if (op.kind != BoardProgram::Kind::None) [[unlikely]]
      CHORUS_RETURN_IF_ERROR(runScaling(bp, op, job, base));
  }
  return {};
}

}  // namespace chorus::exec
