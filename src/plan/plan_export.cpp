// chorus's plans written for other runtimes (plan_export.hpp, docs/msccl.md).
#include "plan/plan_export.hpp"

#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

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

// What both formats take: a rootless collective with equal counts, a rank
// count and chunk count in the plan IR's bounds, a plain (not compressed, not
// exact) plan that supports that shape.  Returns the shape to expand.
Result<Shape> exportShape(const Algorithm& algo, int nranks, int chunks, std::string_view where,
                          std::string_view format) {
  const Collective c = algo.collective();
  if (c != Collective::AllReduce && c != Collective::AllGather && c != Collective::AllToAll &&
      c != Collective::ReduceScatter)
    return invalidArgument("{}: {} have no root and no per-rank counts: allreduce, allgather, alltoall and "
                           "reducescatter are written", where, format);
  if (nranks < kPlanMinRanks || nranks > kPlanMaxRanks)
    return invalidArgument("{}: {} ranks (2 to {})", where, nranks, kPlanMaxRanks);
  if (chunks < 1 || static_cast<uint32_t>(chunks) > kPlanMaxChunks)
    return invalidArgument("{}: {} chunks (1 to {})", where, chunks, kPlanMaxChunks);
  if (algo.compressed() || algo.exact())
    return invalidArgument("{}: a compressed or exact plan's steps have no form in {}", where, format);
  Shape sh;
  sh.coll = c;
  sh.nranks = nranks;
  sh.count = static_cast<uint64_t>(chunks);
  if (!algo.supports(sh))
    return invalidArgument("{}: does not take {} ranks at {} chunks (it needs {})", where, nranks, chunks,
                           algo.requirement().empty() ? std::string_view("another shape") : algo.requirement());
  return sh;
}

}  // namespace

Result<std::string> writeMscclXml(const Algorithm& algo, int nranks, int chunks, const ExportOptions& opt) {
  const Collective c = algo.collective();
  const std::string where = fmt::format("msccl-xml export of {} '{}'", collectiveName(c), algo.name());
  if (opt.proto != "LL" && opt.proto != "LL128" && opt.proto != "Simple")
    return invalidArgument("{}: protocol '{}' is not LL, LL128 or Simple", where, opt.proto);
  auto shape = exportShape(algo, nranks, chunks, where, "MSCCL's XML");
  if (!shape.isOk()) return shape.status();
  const Shape sh = *shape;
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

// MSCCL++'s execution plan (plan_export.hpp).  Messages first: the k-th send
// from a to b is the k-th receive of b from a; each gets a landing run of
// scratch chunks of its own on b, after the algorithm's own scratch.
Result<std::string> writeMscclppJson(const Algorithm& algo, int nranks, int chunks, const ExportOptions& opt) {
  using Json = nlohmann::ordered_json;
  const Collective c = algo.collective();
  const std::string where = fmt::format("mscclpp-json export of {} '{}'", collectiveName(c), algo.name());
  auto shape = exportShape(algo, nranks, chunks, where, "MSCCL++'s execution plans");
  if (!shape.isOk()) return shape.status();
  const Shape sh = *shape;
  const auto n = static_cast<size_t>(nranks);
  std::vector<Program> progs(n);
  for (int r = 0; r < nranks; ++r) expand(algo, sh, r, &progs[static_cast<size_t>(r)]);
  // landing[b][a]: the landing offsets of b's receives from a, in order.
  std::vector<std::vector<std::vector<uint64_t>>> landing(n, std::vector<std::vector<uint64_t>>(n));
  std::vector<uint64_t> scratch(n);
  for (size_t b = 0; b < n; ++b) {
    uint64_t top = progs[b].scratch_elems;
    for (const Step& s : progs[b].steps) {
      const Region* regs[] = {&s.dst, &s.src, &s.src2};
      for (const Region* g : regs)
        if (g->count != 0 && g->buf != Buf::Input && g->buf != Buf::Output && g->buf != Buf::Scratch)
          return invalidArgument("{}: rank {} uses a buffer MSCCL++ lacks", where, b);
      if (s.op == StepOp::Recv || s.op == StepOp::RecvReduce) {
        landing[b][static_cast<size_t>(s.peer)].push_back(top);
        top += s.op == StepOp::Recv ? s.dst.count : s.src.count;
      }
    }
    scratch[b] = top;
    if (top > kPlanMaxScratch) return invalidArgument("{}: rank {} needs {} scratch chunks (at most {})", where, b, top,
                                                      kPlanMaxScratch);
  }
  auto operand = [](const Region& g) {
    return Json{{"type", std::string(letter(g.buf))}, {"index", g.offset}, {"size", g.count}};
  };
  Json gpus = Json::array();
  for (size_t r = 0; r < n; ++r) {
    const Program& prog = progs[r];
    // Peers: one memory channel to each GPU it talks to; a remote buffer (the
    // peer's scratch) for each it sends to.
    std::set<int> peers, targets;
    for (const Step& s : prog.steps)
      if (!isLocal(s.op)) {
        peers.insert(s.peer);
        if (s.op == StepOp::Send) targets.insert(s.peer);
      }
    for (size_t b = 0; b < n; ++b)
      for (const Step& s : progs[b].steps)
        if (!isLocal(s.op) && s.peer == static_cast<int>(r)) peers.insert(static_cast<int>(b));
    std::map<int, int> chan_of, buf_of;
    Json connected = Json::array(), chan_ids = Json::array(), rbufs = Json::array(), rbuf_ids = Json::array();
    for (int p : peers) {
      chan_of[p] = static_cast<int>(chan_of.size());
      connected.push_back(p);
      chan_ids.push_back(chan_of[p]);
    }
    for (int p : targets) {
      buf_of[p] = static_cast<int>(buf_of.size());
      rbufs.push_back(Json{{"rank", p}, {"type", "s"}, {"access_channel_types", Json::array({"memory"})}});
      rbuf_ids.push_back(buf_of[p]);
    }
    std::vector<size_t> sent(n), got(n);
    Json ops = Json::array();
    auto chan = [&](int p) { return Json{{"channel_ids", Json::array({chan_of[p]})}, {"channel_type", "memory"}}; };
    for (size_t i = 0; i < prog.steps.size(); ++i) {
      const Step& s = prog.steps[i];
      auto recvSlot = [&](uint64_t cnt) {
        const auto p = static_cast<size_t>(s.peer);
        return Json{{"type", "s"}, {"index", landing[r][p][got[p]++]}, {"size", cnt}};
      };
      switch (s.op) {
        case StepOp::Send: {
          const auto p = static_cast<size_t>(s.peer);
          const uint64_t at = landing[p][r][sent[p]++];
          Json put{{"name", "put"},
                   {"src_buff", Json::array({operand(s.src)})},
                   {"dst_buff", Json::array({Json{{"buffer_id", buf_of[s.peer]}, {"index", at}, {"size", s.src.count}}})},
                   {"channel_type", "memory"}};
          ops.push_back(std::move(put));
          Json sig{{"name", "signal"}};
          sig.update(chan(s.peer));
          ops.push_back(std::move(sig));
          break;
        }
        case StepOp::Recv:
        case StepOp::RecvReduce: {
          Json w{{"name", "wait"}};
          w.update(chan(s.peer));
          ops.push_back(std::move(w));
          if (s.op == StepOp::Recv) {
            ops.push_back(Json{{"name", "copy"},
                               {"src_buff", Json::array({recvSlot(s.dst.count)})},
                               {"dst_buff", Json::array({operand(s.dst)})}});
          } else {
            ops.push_back(Json{{"name", "re"},
                               {"src_buff", Json::array({operand(s.src), recvSlot(s.src.count)})},
                               {"dst_buff", Json::array({operand(s.dst)})}});
          }
          break;
        }
        case StepOp::Copy:
          if (s.dst.count == 0 || (s.dst.buf == s.src.buf && s.dst.offset == s.src.offset)) break;
          ops.push_back(Json{{"name", "copy"},
                             {"src_buff", Json::array({operand(s.src)})},
                             {"dst_buff", Json::array({operand(s.dst)})}});
          break;
        case StepOp::Reduce:
          ops.push_back(Json{{"name", "re"},
                             {"src_buff", Json::array({operand(s.src), operand(s.src2)})},
                             {"dst_buff", Json::array({operand(s.dst)})}});
          break;
        default:
          return invalidArgument("{}: rank {} step {} is a step MSCCL++'s plans lack (op {})", where, r, i,
                                 static_cast<int>(s.op));
      }
    }
    Json tb{{"id", 0}, {"ops", std::move(ops)},
            {"channels", Json::array({Json{{"channel_type", "memory"}, {"channel_ids", chan_ids}}})},
            {"remote_buffer_refs",
             Json::array({Json{{"access_channel_type", "memory"}, {"remote_buffer_ids", rbuf_ids}}})}};
    gpus.push_back(Json{{"id", r},
                        {"input_chunks", sh.inputElems(static_cast<int>(r))},
                        {"output_chunks", sh.outputElems(static_cast<int>(r))},
                        {"scratch_chunks", scratch[r]},
                        {"channels", Json::array({Json{{"channel_type", "memory"}, {"connected_to", connected}}})},
                        {"remote_buffers", std::move(rbufs)},
                        {"threadblocks", Json::array({std::move(tb)})}});
  }
  Json doc{{"name", opt.name.empty() ? fmt::format("{}{}", algo.name(), nranks) : opt.name},
           {"collective", std::string(collectiveName(c))},
           {"protocol", "Simple"},
           {"inplace", false},
           {"reuse_resources", false},
           {"num_threads_per_block", 1024},
           {"use_double_scratch_buffer", false},
           {"min_message_size", 0},
           {"max_message_size", std::numeric_limits<uint64_t>::max()},
           {"gpus", std::move(gpus)}};
  return doc.dump(1) + "\n";
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
  if (opt.format == "mscclpp-json" || opt.format == "msccl++-json") return writeMscclppJson(*algo, opt.ranks, chunks, opt);
  return invalidArgument("export: format '{}' is not one of msccl-xml, mscclpp-json, chorus", opt.format);
}

}  // namespace chorus::plan
