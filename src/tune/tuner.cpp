#include "tune/tuner.hpp"

#include <algorithm>
#include <bit>

#include "plan/plan_file.hpp"

namespace chorus::tune {

using plan::Collective;

Result<Tuner> Tuner::create(const plan::Registry& registry, Topology topo, std::string_view spec,
                            uint64_t chunk_bytes_override, CostProfile profile) {
  Tuner t(registry, topo);
  t.profile_ = std::move(profile);
  t.chunk_override_ = chunk_bytes_override;
  {
    std::vector<int> groups = topo.host_of;
    std::sort(groups.begin(), groups.end());
    t.hosts_of_one_rank_ = groups.size() > 1 && std::adjacent_find(groups.begin(), groups.end()) == groups.end();
  }
  auto need = [&](Collective c, std::string_view name, const plan::Algorithm** slot) -> Status {
    *slot = registry.find(c, name);
    if (*slot == nullptr) return internalError("the registry lacks the built-in {} algorithm '{}'", plan::collectiveName(c), name);
    return {};
  };
  // Each collective's default (the collective table), then the size rules' small-message algorithms.
  Defaults& d = t.defaults_;
  for (size_t i = 0; i < plan::kNumCollectives; ++i)
    CHORUS_RETURN_IF_ERROR(need(static_cast<Collective>(i), plan::kCollectiveFacts[i].default_algo, &d.by_coll[i]));
  CHORUS_RETURN_IF_ERROR(need(Collective::AllReduce, "recursive_doubling", &d.rd_allreduce));
  CHORUS_RETURN_IF_ERROR(need(Collective::Broadcast, "binomial", &d.binomial_bcast));
  CHORUS_RETURN_IF_ERROR(need(Collective::AllGather, "recursive_doubling", &d.rd_allgather));
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
      return invalidArgument("CHORUS_ALGO names unknown collective '{}' ({})", cname, plan::collectiveNamesText());
    if (aname.substr(0, plan::kAlgoFilePrefix.size()) == plan::kAlgoFilePrefix) {
      // A plan file (plan::loadAlgoFiles loaded it into the registry): every
      // call of the collective runs it, and one it does not take is an error.
      const std::string_view path = aname.substr(plan::kAlgoFilePrefix.size());
      const plan::FileAlgorithm* f = plan::findPlanFile(registry, c, path);
      if (f == nullptr)
        return invalidArgument("CHORUS_ALGO item '{}': no {} plan was loaded from '{}' (plan::loadAlgoFiles loads it)",
                               item, cname, path);
      t.forced_[static_cast<size_t>(c)] = f;
      t.strict_[static_cast<size_t>(c)] = true;
      continue;
    }
    const plan::Algorithm* a = registry.find(c, aname);
    if (a == nullptr) {
      std::string valid;
      for (const auto* x : registry.forCollective(c)) valid += fmt::format("{}{}", valid.empty() ? "" : ", ", x->name());
      return invalidArgument("CHORUS_ALGO names unknown {} algorithm '{}' (valid: {})", cname, aname, valid);
    }
    t.forced_[static_cast<size_t>(c)] = a;
    t.strict_[static_cast<size_t>(c)] = false;
  }
  return t;
}

// The built-in rules (the calibrated cost model replaces them where a
// profile is measured): small messages of allreduce, broadcast and allgather
// take a latency-bound algorithm; everything else the collective table's
// default.  Pointers are looked up once, at creation.
const plan::Algorithm* Tuner::defaultFor(const plan::Shape& sh) const {
  const uint64_t bytes = sh.count * sh.elem_size;
  const bool pof2 = std::has_single_bit(static_cast<unsigned>(sh.nranks));
  switch (sh.coll) {
    case Collective::AllReduce:
      if (bytes <= 32768 || sh.count < static_cast<uint64_t>(sh.nranks)) return defaults_.rd_allreduce;
      break;
    case Collective::Broadcast:
      if (bytes <= 65536 || sh.nranks <= 2) return defaults_.binomial_bcast;
      break;
    case Collective::AllGather:
      if (pof2 && bytes * sh.nranks <= 65536) return defaults_.rd_allgather;
      break;
    default: break;
  }
  return defaults_.by_coll[static_cast<size_t>(sh.coll)];
}

uint64_t Tuner::defaultChunk() const {
  // Pipeline large messages in slices big enough to amortise a message's
  // fixed cost yet small enough to keep several in flight and in cache.
  if (chunk_override_ != 0) return chunk_override_;
  if (topo_.all_local) return plan::kChunkBytesOneHost;
  return topo_.one_machine ? kChunkBytesLoopback : plan::kChunkBytesAcrossHosts;
}

Result<double> Tuner::price(const plan::Algorithm& algo, const plan::Shape& sh, chorusDataType_t dtype) const {
  Links links = topo_.links;
  links.one_machine = topo_.one_machine;
  CHORUS_ASSIGN_OR_RETURN(Seconds t, predictSeconds(algo, sh, dtype, profile_, topo_.host_of, links));
  return t.value();
}

Result<Choice> Tuner::choose(const plan::Shape& sh, chorusDataType_t dtype) {
  const Collective c = sh.coll;
  Choice ch;
  ch.chunk_bytes = defaultChunk();
  // A compressed call takes a compressed plan, and only a call the caller
  // allowed to compress (Shape::wire) takes one.
  const bool compressed = sh.wire.has_value();
  // Every rank decides alike: a slice from this rank's own host (its local
  // rank count) would cut the program differently from its peers'.
  if (compressed && chunk_override_ == 0 && hosts_of_one_rank_ && sh.elem_size > 0) {
    constexpr size_t kProbe = size_t{1} << 16;  // elements: the wire's share of the fp32 bytes
    const double wire_share = static_cast<double>(kernels::wireBytes(*sh.wire, kProbe)) /
                              static_cast<double>(kProbe * sh.elem_size);
    ch.chunk_bytes = std::min(ch.chunk_bytes, static_cast<uint64_t>(static_cast<double>(kWireSliceCompressed) / wire_share));
  }
  // An exact call's slice counts its words (8 x exact_words bytes per
  // element), which are what crosses the wire and sits in the plan's slots.
  const bool exact = sh.exact_words > 0;
  if (exact && chunk_override_ == 0 && sh.elem_size > 0)
    ch.chunk_bytes = std::max<uint64_t>(sh.elem_size, ch.chunk_bytes * sh.elem_size / (uint64_t{8} * sh.exact_words));
  auto eligible = [&](const plan::Algorithm* a) {
    return a->compressed() == compressed && a->exact() == exact && a->supports(sh);
  };
  if (const plan::Algorithm* f = forced_[static_cast<size_t>(c)]; f != nullptr && eligible(f)) {
    ch.algo = f;
    return ch;
  } else if (f != nullptr && strict_[static_cast<size_t>(c)]) {
    const auto* file = dynamic_cast<const plan::FileAlgorithm*>(f);
    return invalidArgument("CHORUS_ALGO {}:file:{} forces plan '{}', which does not take this call ({} ranks, count "
                           "{}, {}{}{}): it needs {}", plan::collectiveName(c), file ? file->spec().origin : "",
                           f->name(), sh.nranks, sh.count, sh.inplace ? "in place" : "out of place",
                           compressed ? ", compressed" : "", exact || sh.canonical ? ", reproducible" : "",
                           f->requirement());
  }
  const uint64_t bytes = sh.count * sh.elem_size;
  const Key key{static_cast<uint8_t>(c), static_cast<uint8_t>(std::bit_width(bytes)), sh.inplace,
                static_cast<uint8_t>(dtype),
                static_cast<uint8_t>(compressed ? 1 + static_cast<int>(sh.wire->kind) : 0),
                static_cast<uint8_t>(std::min<uint32_t>(sh.exact_words, 255))};
  if (auto it = cache_.find(key); it != cache_.end() && eligible(it->second.algo)) return it->second;

  // Price every candidate that handles the shape; the rule-based default is
  // the fallback when nothing can be priced.
  plan::Shape priced = sh;
  priced.chunk_elems = sh.elem_size ? std::max<uint64_t>(1, ch.chunk_bytes / sh.elem_size) : 0;
  for (const plan::Algorithm* a : registry_->forCollective(c)) {
    if (!eligible(a)) continue;
    auto t = price(*a, priced, dtype);
    if (!t.isOk()) continue;
    if (ch.algo == nullptr || t.value() < ch.predicted_s) {
      ch.algo = a;
      ch.predicted_s = t.value();
    }
  }
  if (ch.algo == nullptr && !compressed && !exact) ch.algo = defaultFor(sh);
  if (ch.algo == nullptr) return internalError("no {} algorithm handles this call", plan::collectiveName(c));
  cache_[key] = ch;
  return ch;
}

}  // namespace chorus::tune
