// The UCX transport in the registry (transport/registry.hpp): it can serve
// any rank, but it comes after shared memory and TCP, so it runs only where
// it is asked for (CHORUS_TRANSPORT=ucx; docs/ucx.md).  Built when the build
// finds UCX (CHORUS_WITH_UCX); libucp itself is loaded at the first create.
#include <functional>

#include "transport/registry.hpp"
#include "transport/ucx/ucx.hpp"

namespace chorus::transport::ucx {

void registerTransport(TransportRegistry& r) {
  TransportInfo t;
  t.name = "ucx";
  t.preference = 70;  // after shm (10) and tcp (50), which serve every peer: `auto` never picks it
  t.caps.rma = true;  // target-checked one-sided operations (ucx_wire.hpp)
  t.caps.registered_memory = true;
  t.serves = [](const WireView&, int) { return true; };
  t.create = [](const SetupContext& c) -> Result<Created> {
    const Config& cfg = *c.view.cfg;
    UcxSetup s;
    s.rank = c.view.rank;
    s.peers = c.peers;
    s.comm_id = std::hash<std::string_view>{}(c.job_tag + "ucx");
    s.secret = c.id->secret;
    s.tls = cfg.ucx.tls;
    s.user_set = cfg.ucx.user_set;
    s.heartbeat_ms = cfg.tcp.heartbeat_ms;
    s.spin = cfg.spin;
    s.timeout = cfg.timeout;
    s.protect = cfg.net.wire_protect;
    auto t = createUcxTransport(s, *c.store);
    if (!t.isOk()) return t.status().withContext(fmt::format("init: rank {}: UCX transport: ", s.rank));
    Created out;
    out.transport = std::move(t.value());
    return out;
  };
  (void)r.add(std::move(t));
}

}  // namespace chorus::transport::ucx
