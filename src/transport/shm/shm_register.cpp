// The shared-memory transport in the registry (transport/registry.hpp): it
// serves the ranks of this host (same host identity: hostname, boot id,
// network and IPC namespaces), before any other transport, and hands out
// the one-shot board when it serves every peer.
#include "transport/registry.hpp"
#include "transport/shm/shm.hpp"

namespace chorus::transport::shm {

void registerTransport(TransportRegistry& r) {
  TransportInfo t;
  t.name = "shm";
  t.preference = 10;
  t.host_local = true;
  t.caps.board = true;
  t.caps.rma = true;  // one-sided operations through a second ring per pair, CMA for large ones (docs/rma.md)
  t.caps.registered_memory = true;
  t.serves = [](const WireView& v, int peer) { return v.sameHost(peer); };
  t.create = [](const SetupContext& c) -> Result<Created> {
    const Config& cfg = *c.view.cfg;
    ShmSetup s;
    s.rank = c.view.rank;
    s.peers = c.peers;
    // One segment name per host set, from its lowest rank.
    const int lowest = std::min(s.rank, c.peers.front());
    s.segment_prefix = fmt::format("/chorus-{}-{}", c.job_tag, lowest);
    s.ring_bytes = cfg.shm.ring_bytes;
    s.allow_cma = cfg.shm.cma;
    s.cma_bytes = cfg.shm.cma_bytes;
    s.spread = cfg.shm.spread;
    s.spin = cfg.spin;
    s.timeout = cfg.timeout;
    bootstrap::PrefixStore host_store(c.base, c.prefix + fmt::format("h{}/", lowest));
    Created out;
    auto t = createShmTransport(s, host_store, &out.board);
    if (!t.isOk()) return t.status().withContext(fmt::format("init: rank {}: shared-memory transport: ", s.rank));
    out.transport = std::move(t.value());
    if (!c.serves_all) out.board = nullptr;  // the board serves calls of the whole communicator only
    return out;
  };
  (void)r.add(std::move(t));
}

}  // namespace chorus::transport::shm
