// chorus's plans written for other runtimes (plan_export.hpp, docs/msccl.md).
#include "plan/plan_export.hpp"

#include <map>

#include "plan/plan_file.hpp"

namespace chorus::plan {
namespace {

std::string_view letter(Buf b) { return b == Buf::Input ? "i" : b == Buf::Output ? "o" : "s"; }

struct XStep {
  std::string_view type;
  Region src, dst;  // count: chunks
  bool has_src = false, has_dst = false;
  int depid = -1, deps = -1;
  bool hasdep = false;
};
struct XTb {
  int send = -1, recv = -1;
  std::vector<XStep> steps;
};

}  // namespace

Result<std::string> writeMscclXml(const Algorithm& algo, int nranks, int chunks, const ExportOptions& opt) {
  const Collective c = algo.collective();
  const std::string where = fmt::format("msccl-xml export of {} '{}'", collectiveName(c), algo.name());
  if (c != Collective::AllReduce && c != Collective::AllGather && c != Collective::AllToAll &&
      c != Collective::ReduceScatter)
    return invalidArgument("{}: MSCCL's XML has no root and no per-rank counts: allreduce, allgather, alltoall and "
                           "reducescatter are written", where);
  if (nranks < kPlanMinRanks || nranks > kPlanMaxRanks)
    return invalidArgument("{}: {} ranks (2 to {})", where, nranks, kPlanMaxRanks);
  if (chunks < 1 || static_cast<uint32_t>(chunks) > kPlanMaxChunks)
    return invalidArgument("{}: {} chunks (1 to {})", where, chunks, kPlanMaxChunks);
  if (algo.compressed() || algo.exact())
    return invalidArgument("{}: a compressed or exact plan's steps have no MSCCL form", where);
  if (opt.proto != "LL" && opt.proto != "LL128" && opt.proto != "Simple")
    return invalidArgument("{}: protocol '{}' is not LL, LL128 or Simple", where, opt.proto);
  Shape sh;
  sh.coll = c;
  sh.nranks = nranks;
  sh.count = static_cast<uint64_t>(chunks);
  if (!algo.supports(sh))
    return invalidArgument("{}: does not take {} ranks at {} chunks (it needs {})", where, nranks, chunks,
                           algo.requirement().empty() ? std::string_view("another shape") : algo.requirement());
  const std::string name = opt.name.empty() ? fmt::format("{}{}", algo.name(), nranks) : opt.name;
  const uint64_t per_loop = c == Collective::AllReduce ? sh.count : sh.count * static_cast<uint64_t>(nranks);
  std::string out = fmt::format("<!-- {} '{}' on {} ranks, {} chunks per rank block: written by chorus-plan export "
                                "-->\n", collectiveName(c), algo.name(), nranks, chunks);
  out += fmt::format("<algo name=\"{}\" proto=\"{}\" nchannels=\"1\" nchunksperloop=\"{}\" ngpus=\"{}\" coll=\"{}\" "
                     "inplace=\"0\" outofplace=\"1\" minBytes=\"0\" maxBytes=\"0\">\n", name, opt.proto, per_loop,
                     nranks, collectiveName(c));
  for (int r = 0; r < nranks; ++r) {
    Program prog;
    expand(algo, sh, r, &prog);
    // Thread blocks: 0 local, then one per (direction, peer) in order of use.
    std::vector<XTb> tbs(1);
    std::map<std::pair<bool, int>, int> tb_of;  // (sends?, peer) -> tb
    std::vector<std::pair<int, int>> placed(prog.steps.size(), {-1, -1});  // step -> (tb, index of its last)
    for (size_t i = 0; i < prog.steps.size(); ++i) {
      const Step& s = prog.steps[i];
      int t = 0;
      if (!isLocal(s.op)) {
        const bool sends = s.op == StepOp::Send;
        auto [it, fresh] = tb_of.emplace(std::pair{sends, s.peer}, static_cast<int>(tbs.size()));
        if (fresh) {
          tbs.emplace_back();
          (sends ? tbs.back().send : tbs.back().recv) = s.peer;
        }
        t = it->second;
      }
      const Region* regs[] = {&s.dst, &s.src, &s.src2};
      for (const Region* g : regs)
        if (g->count != 0 && g->buf != Buf::Input && g->buf != Buf::Output && g->buf != Buf::Scratch)
          return invalidArgument("{}: rank {} step {} uses a buffer MSCCL lacks", where, r, i);
      // Dependencies on other thread blocks: the latest step of each.
      std::map<int, int> need;
      for (uint32_t d : prog.depsOf(i)) {
        const auto [dt, di] = placed[d];
        if (dt < 0 || dt == t) continue;
        need[dt] = std::max(need[dt], di);
      }
      std::vector<XStep> mine;
      XStep x;
      switch (s.op) {
        case StepOp::Send: x.type = "s", x.src = s.src, x.has_src = true; mine.push_back(x); break;
        case StepOp::Recv: x.type = "r", x.dst = s.dst, x.has_dst = true; mine.push_back(x); break;
        case StepOp::RecvReduce:
          x.type = "rrc", x.src = s.src, x.dst = s.dst, x.has_src = x.has_dst = true;
          mine.push_back(x);
          break;
        case StepOp::Copy:
          if (s.dst.count == 0 || (s.dst.buf == s.src.buf && s.dst.offset == s.src.offset)) break;
          x.type = "cpy", x.src = s.src, x.dst = s.dst, x.has_src = x.has_dst = true;
          mine.push_back(x);
          break;
        case StepOp::Reduce: {
          auto same = [](const Region& a, const Region& b) { return a.buf == b.buf && a.offset == b.offset; };
          x.type = "re", x.dst = s.dst, x.has_src = x.has_dst = true;
          if (same(s.dst, s.src)) {
            x.src = s.src2;
          } else if (same(s.dst, s.src2)) {
            x.src = s.src;
          } else {
            XStep cp = x;
            cp.type = "cpy", cp.src = s.src;
            mine.push_back(cp);
            x.src = s.src2;
          }
          mine.push_back(x);
          break;
        }
        default:
          return invalidArgument("{}: rank {} step {} is a step MSCCL lacks (op {})", where, r, i,
                                 static_cast<int>(s.op));
      }
      if (mine.empty()) {
        // Nothing to run (a copy onto itself); later steps that wait for it
        // wait for what it waited for: none in the same thread block suffices.
        continue;
      }
      // All but one dependency as nops, the last on the first real step.
      auto& steps = tbs[static_cast<size_t>(t)].steps;
      auto it = need.begin();
      for (size_t k = 0; k + 1 < need.size(); ++k, ++it) {
        XStep nop;
        nop.type = "nop";
        nop.depid = it->first;
        nop.deps = it->second;
        steps.push_back(nop);
      }
      if (it != need.end()) {
        mine.front().depid = it->first;
        mine.front().deps = it->second;
      }
      for (XStep& m : mine) steps.push_back(m);
      placed[i] = {t, static_cast<int>(steps.size()) - 1};
    }
    for (XTb& tb : tbs)
      for (XStep& st : tb.steps)
        if (st.depid >= 0) tbs[static_cast<size_t>(st.depid)].steps[static_cast<size_t>(st.deps)].hasdep = true;
    out += fmt::format("  <gpu id=\"{}\" i_chunks=\"{}\" o_chunks=\"{}\" s_chunks=\"{}\">\n", r, sh.inputElems(r),
                       sh.outputElems(r), prog.scratch_elems);
    for (size_t t = 0; t < tbs.size(); ++t) {
      if (t == 0 && tbs[0].steps.empty()) continue;  // no local work
      out += fmt::format("    <tb id=\"{}\" send=\"{}\" recv=\"{}\" chan=\"0\">\n", t, tbs[t].send, tbs[t].recv);
      for (size_t k = 0; k < tbs[t].steps.size(); ++k) {
        const XStep& st = tbs[t].steps[k];
        const Region& cntr = st.has_dst ? st.dst : st.src;
        out += fmt::format("      <step s=\"{}\" type=\"{}\" srcbuf=\"{}\" srcoff=\"{}\" dstbuf=\"{}\" dstoff=\"{}\" "
                           "cnt=\"{}\" depid=\"{}\" deps=\"{}\" hasdep=\"{}\"/>\n", k, st.type,
                           st.has_src ? letter(st.src.buf) : "i", st.has_src ? static_cast<int64_t>(st.src.offset) : -1,
                           st.has_dst ? letter(st.dst.buf) : "o", st.has_dst ? static_cast<int64_t>(st.dst.offset) : -1,
                           st.type == "nop" ? 0 : cntr.count, st.depid, st.deps, st.hasdep ? 1 : 0);
      }
      out += "    </tb>\n";
    }
    out += "  </gpu>\n";
  }
  out += "</algo>\n";
  return out;
}

Result<std::string> exportPlan(const ExportOptions& opt) {
  Collective c;
  if (!parseCollective(opt.collective, &c))
    return invalidArgument("export: '{}' is not a collective ({})", opt.collective, collectiveNamesText());
  static const Registry kBuiltin = Registry::builtin();
  const Algorithm* algo = kBuiltin.find(c, opt.algo);
  if (algo == nullptr) {
    std::string names;
    for (const Algorithm* a : kBuiltin.forCollective(c))
      names += fmt::format("{}{}", names.empty() ? "" : ", ", a->name());
    return invalidArgument("export: no built-in {} algorithm '{}' (there are: {})", opt.collective, opt.algo, names);
  }
  const int chunks = opt.chunks > 0 ? opt.chunks : opt.ranks;
  if (opt.format == "msccl-xml") return writeMscclXml(*algo, opt.ranks, chunks, opt);
  if (opt.format == "chorus")
    return dumpPlanText(*algo, opt.ranks, chunks, {.name = opt.name, .inplace = PlanInPlace::No});
  if (opt.format == "msccl++-json")
    return invalidArgument("export: format 'msccl++-json' is not written yet (docs/msccl.md says why); msccl-xml and "
                           "chorus are");
  return invalidArgument("export: format '{}' is not one of msccl-xml, chorus", opt.format);
}

}  // namespace chorus::plan
