// The default Algorithm::rounds(): rounds derived from the expanded programs.
//
// Round j is every rank's j-th send.  Where all ranks' j-th sends go the same
// distance with the same size, the round is a Shift pattern (merged with an
// identical predecessor into one Round with repeat > 1); otherwise its
// messages are listed (Peers::Explicit).  This makes any algorithm priceable
// by the simulator for small n; the families that scale override rounds().
#include <map>

#include "plan/plan.hpp"

namespace chorus::plan {

Result<std::vector<Round>> deriveRounds(const Algorithm& algo, const Shape& shape) {
  const int n = shape.nranks;
  if (n > kMaxDerivedRanks)
    return invalidArgument(
        "{} '{}' on {} ranks: the algorithm has no round pattern (Algorithm::rounds) and deriving one "
        "expands every rank's program, which is limited to {} ranks (override rounds() in its plan file)",
        collectiveName(algo.collective()), algo.name(), n, kMaxDerivedRanks);
  struct Msg {
    int dst;
    uint64_t elems;
    bool reduce;
  };
  std::vector<std::vector<Msg>> sends(n);
  // recv_ops[p][r]: p's receive steps from r in program order (true = reduces).
  std::vector<std::map<int, std::vector<bool>>> recv_ops(n);
  Program prog;
  for (int r = 0; r < n; ++r) {
    expand(algo, shape, r, &prog);
    for (size_t i = 0; i < prog.steps.size(); ++i) {
      const Step& s = prog.steps[i];
      if (s.op == StepOp::Send) sends[r].push_back({s.peer, s.src.count, false});
      if (s.op != StepOp::Recv && s.op != StepOp::RecvReduce) continue;
      // A plain receive reduces too when a later local Reduce reads it.
      bool reduce = s.op == StepOp::RecvReduce;
      for (size_t k = i + 1; k < prog.steps.size() && !reduce; ++k) {
        const Step& t = prog.steps[k];
        reduce = t.op == StepOp::Reduce && (t.src.overlaps(s.dst) || t.src2.overlaps(s.dst));
      }
      recv_ops[r][s.peer].push_back(reduce);
    }
  }
  size_t depth = 0;
  for (int r = 0; r < n; ++r) {
    std::map<int, size_t> seen;
    for (Msg& m : sends[r]) {
      const auto& ops = recv_ops[m.dst][r];
      const size_t i = seen[m.dst]++;
      m.reduce = i < ops.size() && ops[i];
    }
    depth = std::max(depth, sends[r].size());
  }
  std::vector<Round> rounds;
  for (size_t j = 0; j < depth; ++j) {
    Round rd;
    bool uniform = true;
    int64_t shift = -1;
    for (int r = 0; r < n; ++r) {
      if (j >= sends[r].size()) {
        uniform = false;
        continue;
      }
      const Msg& m = sends[r][j];
      const int64_t d = ((m.dst - r) % n + n) % n;
      if (shift < 0) {
        shift = d;
        rd.elems = m.elems;
        rd.reduce = m.reduce;
      } else if (d != shift || m.elems != rd.elems || m.reduce != rd.reduce) {
        uniform = false;
      }
      rd.msgs.push_back({r, m.dst, m.elems});
      rd.reduce = rd.reduce || m.reduce;
    }
    if (uniform && shift > 0) {
      rd.peers = Peers::Shift;
      rd.arg = shift;
      rd.msgs.clear();
      if (!rounds.empty() && rounds.back().peers == Peers::Shift && rounds.back().arg == rd.arg &&
          rounds.back().elems == rd.elems && rounds.back().reduce == rd.reduce) {
        ++rounds.back().repeat;
        continue;
      }
    } else {
      rd.peers = Peers::Explicit;
      rd.elems = 0;
      for (const RoundMessage& m : rd.msgs) rd.elems = std::max(rd.elems, m.elems);
    }
    rounds.push_back(std::move(rd));
  }
  return rounds;
}

}  // namespace chorus::plan
