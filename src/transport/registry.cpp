#include "transport/registry.hpp"

#include <algorithm>

namespace chorus::transport {

namespace {

bool validName(std::string_view n) {
  if (n.empty() || n.size() > 16 || n == "auto" || n == "mixed") return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

bool isAuto(std::string_view forced) { return forced.empty() || forced == "auto"; }

}  // namespace

Status TransportRegistry::add(TransportInfo info) {
  if (!validName(info.name))
    return invalidArgument("transport registry: '{}' is not a transport name ([a-z0-9_]{{1,16}}, not auto or mixed)",
                           info.name);
  if (!info.serves || !info.create)
    return invalidArgument("transport registry: transport '{}' needs both serves() and create()", info.name);
  std::lock_guard l(mu_);
  for (const auto& i : infos_)
    if (i->name == info.name) return invalidArgument("transport registry: '{}' is registered already", info.name);
  auto p = std::make_unique<TransportInfo>(std::move(info));
  auto at = std::upper_bound(infos_.begin(), infos_.end(), p->preference,
                             [](int pref, const std::unique_ptr<TransportInfo>& i) { return pref < i->preference; });
  infos_.insert(at, std::move(p));
  return {};
}

const TransportInfo* TransportRegistry::find(std::string_view name) const {
  std::lock_guard l(mu_);
  for (const auto& i : infos_)
    if (i->name == name) return i.get();
  return nullptr;
}

std::vector<std::string> TransportRegistry::names() const {
  std::lock_guard l(mu_);
  std::vector<std::string> out;
  for (const auto& i : infos_) out.push_back(i->name);
  return out;
}

std::string TransportRegistry::namesText() const {
  std::string s;
  for (const std::string& n : names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

Status TransportRegistry::checkName(std::string_view name) const {
  if (isAuto(name) || find(name) != nullptr) return {};
  return invalidArgument("CHORUS_TRANSPORT='{}' is not a registered transport (accepted: auto, {})", name, namesText());
}

const TransportInfo* TransportRegistry::routeFor(const WireView& view, int from, int to, std::string_view forced) const {
  WireView v = view;
  v.rank = from;
  std::lock_guard l(mu_);
  if (!isAuto(forced))
    for (const auto& i : infos_)
      if (i->name == forced && i->serves(v, to)) return i.get();
  for (const auto& i : infos_)
    if (i->serves(v, to)) return i.get();
  return nullptr;
}

Result<RouteChoice> TransportRegistry::choose(const WireView& view, std::string_view forced) const {
  CHORUS_RETURN_IF_ERROR(checkName(forced));
  RouteChoice rc;
  rc.by_rank.assign(view.ranks.size(), nullptr);
  for (int q = 0; q < static_cast<int>(view.ranks.size()); ++q) {
    if (q == view.rank) continue;
    const TransportInfo* t = routeFor(view, view.rank, q, forced);
    if (t == nullptr)
      return invalidUsage("init: rank {}: no registered transport ({}) can reach rank {} (host {})", view.rank,
                          namesText(), q, view.ranks[static_cast<size_t>(q)].host.hostname);
    rc.by_rank[static_cast<size_t>(q)] = t;
    if (std::find(rc.used.begin(), rc.used.end(), t) == rc.used.end()) rc.used.push_back(t);
  }
  std::sort(rc.used.begin(), rc.used.end(), [](const TransportInfo* a, const TransportInfo* b) {
    return a->preference < b->preference || (a->preference == b->preference && a->name < b->name);
  });
  return rc;
}

TransportRegistry& registry() {
  static TransportRegistry* r = [] {
    auto* reg = new TransportRegistry;
    registerBuiltinTransports(*reg);
    return reg;
  }();
  return *r;
}

}  // namespace chorus::transport
