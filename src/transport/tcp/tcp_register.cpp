// The TCP transport in the registry (transport/registry.hpp): it serves any
// rank, after the transports that prefer a peer (shared memory on this host),
// with one-sided operations unless CHORUS_TCP_RMA=0.
#include <functional>

#include "transport/registry.hpp"
#include "transport/tcp/tcp.hpp"

namespace chorus::transport::tcp {

void registerTransport(TransportRegistry& r) {
  TransportInfo t;
  t.name = "tcp";
  t.preference = 50;
  t.caps.rma = true;  // unless CHORUS_TCP_RMA=0 (Config::tcp.rma): one more connection per pair
  t.caps.registered_memory = true;
  t.serves = [](const WireView&, int) { return true; };
  t.create = [](const SetupContext& c) -> Result<Created> {
    const Config& cfg = *c.view.cfg;
    TcpSetup s;
    s.rank = c.view.rank;
    s.peers = c.peers;
    s.comm_id = std::hash<std::string_view>{}(c.job_tag + "tcp");
    s.secret = c.id->secret;
    CHORUS_ASSIGN_OR_RETURN(s.bind_addr, net::chooseBindAddress(c.id->root, cfg.net.socket_ifname));
    s.sockets_per_peer = cfg.tcp.sockets;
    s.rendezvous_bytes = cfg.tcp.rendezvous_bytes;
    s.heartbeat_ms = cfg.tcp.heartbeat_ms;
    s.rma = cfg.tcp.rma;
    s.protect = cfg.net.wire_protect;
    s.spin = cfg.spin;
    s.timeout = cfg.timeout;
    auto t = createTcpTransport(s, *c.store);
    if (!t.isOk()) return t.status().withContext(fmt::format("init: rank {}: TCP transport: ", s.rank));
    Created out;
    out.transport = std::move(t.value());
    return out;
  };
  (void)r.add(std::move(t));
}

}  // namespace chorus::transport::tcp
