#include "tune/tuner.hpp"

#include <bit>

namespace chorus::tune {

using plan::Collective;

Result<Tuner> Tuner::create(const plan::Registry& registry, Topology topo, std::string_view spec,
                            uint64_t chunk_bytes_override) {
  Tuner t(registry, topo);
  t.chunk_override_ = chunk_bytes_override;
  // spec: "coll:name;coll:name" (',' also accepted as a separator).
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find_first_of(";,", pos);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    size_t colon = item.find(':');
    if (colon == std::string_view::npos)
      return invalidArgument("CHORUS_ALGO item '{}' is not of the form collective:algorithm", item);
    Collective c;
    std::string_view cname = item.substr(0, colon), aname = item.substr(colon + 1);
    if (!plan::parseCollective(cname, &c))
      return invalidArgument("CHORUS_ALGO names unknown collective '{}' (allreduce, broadcast, reduce, allgather, "
                             "reducescatter, alltoall, allgatherv, alltoallv, gather, scatter, barrier)",
                             cname);
    const plan::Algorithm* a = registry.find(c, aname);
    if (a == nullptr) {
      std::string valid;
      for (const auto* x : registry.forCollective(c)) valid += fmt::format("{}{}", valid.empty() ? "" : ", ", x->name());
      return invalidArgument("CHORUS_ALGO names unknown {} algorithm '{}' (valid: {})", cname, aname, valid);
    }
    t.forced_[static_cast<size_t>(c)] = a;
  }
  return t;
}

Result<Choice> Tuner::choose(const plan::Shape& sh) const {
  const Collective c = sh.coll;
  const uint64_t bytes = sh.count * sh.elem_size;
  Choice ch;
  ch.chunk_bytes = chunk_override_;
  if (const plan::Algorithm* f = forced_[static_cast<size_t>(c)]; f != nullptr && f->supports(sh)) {
    ch.algo = f;
  } else {
    std::string_view name;
    switch (c) {
      case Collective::AllReduce:
        name = (bytes <= 32768 || sh.count < static_cast<uint64_t>(sh.nranks)) ? "recursive_doubling" : "ring";
        break;
      case Collective::Broadcast: name = bytes <= 65536 || sh.nranks <= 2 ? "binomial" : "ring"; break;
      case Collective::AllGather:
        name = std::has_single_bit(static_cast<unsigned>(sh.nranks)) && bytes * sh.nranks <= 65536
                   ? "recursive_doubling"
                   : "ring";
        break;
      case Collective::Reduce:
      case Collective::Gather:
      case Collective::Scatter: name = "binomial"; break;
      case Collective::ReduceScatter:
      case Collective::AllGatherV: name = "ring"; break;
      case Collective::AllToAll:
      case Collective::AllToAllV: name = "pairwise"; break;
      case Collective::Barrier: name = "dissemination"; break;
      case Collective::SendRecv: return internalError("send/recv does not go through the tuner");
    }
    ch.algo = registry_->find(c, name);
    if (ch.algo == nullptr) return internalError("no built-in {} algorithm '{}'", plan::collectiveName(c), name);
  }
  if (ch.chunk_bytes == 0) {
    // Pipeline large messages in slices big enough to amortise a message's
    // fixed cost yet small enough to keep several in flight and in cache.
    ch.chunk_bytes = topo_.all_local ? (512u << 10) : (1u << 20);
  }
  return ch;
}

}  // namespace chorus::tune
