// The knobs -> chorus::Config (api/config.cpp): defaults, each knob's one
// rule and its message, and the knob table covering every knob read.  The
// variables come from a map (api::parseConfig's lookup), so nothing here
// touches the process's environment.
#include "api/config.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "common/env.hpp"

namespace chorus::api {
namespace {

using Vars = std::map<std::string, std::string, std::less<>>;

Result<Config> parse(const Vars& vars, std::set<std::string>* asked = nullptr) {
  return parseConfig([&](std::string_view name) -> std::optional<std::string> {
    if (asked != nullptr) asked->insert(std::string(name));
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// The message of parsing one knob set to value ("" when it parses).
std::string errorOf(const std::string& knob, const std::string& value) {
  auto c = parse({{knob, value}});
  return c.isOk() ? "" : c.status().message();
}

TEST(ConfigParse, AnEmptyEnvironmentGivesTheDefaults) {
  auto c = parse({{"HOME", "/home/u"}});
  ASSERT_TRUE(c.isOk()) << c.status().message();
  const Config d;
  EXPECT_EQ(c->timeout, d.timeout);
  EXPECT_EQ(c->check, d.check);
  EXPECT_EQ(c->net.socket_ifname, d.net.socket_ifname);
  EXPECT_EQ(c->net.host_id, d.net.host_id);
  EXPECT_EQ(c->net.transport, d.net.transport);
  EXPECT_EQ(c->spin, d.spin);
  EXPECT_EQ(c->shm.ring_bytes, d.shm.ring_bytes);
  EXPECT_EQ(c->shm.cma, d.shm.cma);
  EXPECT_EQ(c->shm.cma_bytes, d.shm.cma_bytes);
  EXPECT_EQ(c->shm.spread, d.shm.spread);
  EXPECT_TRUE(d.shm.spread);
  EXPECT_EQ(c->tcp.sockets, d.tcp.sockets);
  EXPECT_EQ(c->tcp.rendezvous_bytes, d.tcp.rendezvous_bytes);
  EXPECT_EQ(c->tcp.heartbeat_ms, d.tcp.heartbeat_ms);
  EXPECT_EQ(c->tcp.rma, d.tcp.rma);
  EXPECT_EQ(c->ucx.tls, d.ucx.tls);
  EXPECT_TRUE(d.ucx.tls.empty());  // UCX's own choice (and its UCX_TLS)
  EXPECT_TRUE(c->ucx.user_set.empty());
  EXPECT_EQ(c->tune.algo_spec, d.tune.algo_spec);
  EXPECT_EQ(c->tune.chunk_bytes, d.tune.chunk_bytes);
  EXPECT_EQ(c->tune.profile_path, "/home/u/.cache/chorus/profile.json");
  EXPECT_EQ(c->flight.dir, d.flight.dir);
  EXPECT_EQ(c->shrink.window, d.shrink.window);
  EXPECT_EQ(c->trace.dir, d.trace.dir);
  EXPECT_EQ(c->trace.clock_sync_s, d.trace.clock_sync_s);
  EXPECT_EQ(c->trace.clock_offset_ns, d.trace.clock_offset_ns);
  EXPECT_EQ(c->log.level, d.log.level);
  // No HOME: /tmp, as before.
  EXPECT_EQ(parse({})->tune.profile_path, "/tmp/.cache/chorus/profile.json");
}

TEST(ConfigParse, EveryKnobReadIsInTheTableAndEveryTableKnobIsRead) {
  std::set<std::string> asked;
  ASSERT_TRUE(parse({}, &asked).isOk());
  for (const std::string& name : asked) {
    // HOME, and UCX's own variables the UCX transport defers to when set.
    const bool ucx_own = std::find_if(std::begin(Config::Ucx::kDefaulted), std::end(Config::Ucx::kDefaulted),
                                      [&](const char* v) { return name == v; }) != std::end(Config::Ucx::kDefaulted);
    if (name != "HOME" && !ucx_own) {
      EXPECT_NE(env::findKnob(name), nullptr) << name << " is read but not in env.cpp's table";
    }
  }
  // The job's own knobs are read by bootstrap::readEnvJob, not into Config.
  const std::set<std::string> job = {"CHORUS_RANK",   "CHORUS_WORLD_SIZE", "CHORUS_LOCAL_RANK",    "CHORUS_MASTER_ADDR",
                                     "CHORUS_MASTER_PORT", "CHORUS_SECRET", "CHORUS_REQUIRE_SECRET",
                                     "CHORUS_SECRET_FILE", "CHORUS_SECRET_DIR"};
  for (const env::Knob& k : env::knobs()) {
    const std::string name(k.name);
    EXPECT_TRUE(asked.count(name) || job.count(name)) << name << " is in the table but nothing reads it";
  }
}

TEST(ConfigParse, ValuesReachTheirFields) {
  auto c = parse({{"CHORUS_TIMEOUT_MS", "1500"},
                  {"CHORUS_CHECK", "yes"},
                  {"CHORUS_SOCKET_IFNAME", "lo"},
                  {"CHORUS_HOST_ID", "h2"},
                  {"CHORUS_TRANSPORT", "tcp"},
                  {"CHORUS_SPIN_US", "0"},
                  {"CHORUS_SHM_RING_BYTES", "65536"},
                  {"CHORUS_SHM_CMA", "0"},
                  {"CHORUS_SHM_CMA_BYTES", "4096"},
                  {"CHORUS_SHM_SPREAD", "0"},
                  {"CHORUS_TCP_SOCKETS", "4"},
                  {"CHORUS_TCP_RENDEZVOUS_BYTES", "0"},
                  {"CHORUS_HEARTBEAT_MS", "0"},
                  {"CHORUS_TCP_RMA", "0"},
                  {"CHORUS_UCX_TLS", "rc_x,sm,self,^ib:1"},
                  {"UCX_TCP_RX_SEG_SIZE", "128K"},
                  {"CHORUS_ALGO", "allreduce:ring"},
                  {"CHORUS_CHUNK_BYTES", "8192"},
                  {"CHORUS_TUNE_FILE", "/p.json"},
                  {"CHORUS_FLIGHT_DIR", "/f"},
                  {"CHORUS_SHRINK_WINDOW_MS", "700"},
                  {"CHORUS_TRACE", "/t"},
                  {"CHORUS_CLOCK_SYNC_S", "0"},
                  {"CHORUS_CLOCK_OFFSET_NS", "-5000"},
                  {"CHORUS_DEBUG", "INFO"}});
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->timeout.count(), 1500);
  EXPECT_TRUE(c->check);
  EXPECT_EQ(c->net.socket_ifname, "lo");
  EXPECT_EQ(c->net.host_id, "h2");
  EXPECT_EQ(c->net.transport, "tcp");
  EXPECT_EQ(c->spin.count(), 0);
  EXPECT_EQ(c->shm.ring_bytes, 65536u);
  EXPECT_FALSE(c->shm.spread);
  EXPECT_FALSE(c->shm.cma);
  EXPECT_EQ(c->shm.cma_bytes, 4096u);
  EXPECT_EQ(c->tcp.sockets, 4);
  EXPECT_EQ(c->tcp.rendezvous_bytes, 0u);
  EXPECT_EQ(c->tcp.heartbeat_ms, 0);
  EXPECT_FALSE(c->tcp.rma);
  EXPECT_EQ(c->ucx.tls, "rc_x,sm,self,^ib:1");
  EXPECT_EQ(c->ucx.user_set, std::vector<std::string>{"UCX_TCP_RX_SEG_SIZE"});
  EXPECT_EQ(c->tune.algo_spec, "allreduce:ring");
  EXPECT_EQ(c->tune.chunk_bytes, 8192u);
  EXPECT_EQ(c->tune.profile_path, "/p.json");
  EXPECT_EQ(c->flight.dir, "/f");
  EXPECT_EQ(c->shrink.window.count(), 700);
  EXPECT_EQ(c->trace.dir, "/t");
  EXPECT_EQ(c->trace.clock_sync_s, 0);
  EXPECT_EQ(c->trace.clock_offset_ns, -5000);
  EXPECT_EQ(c->log.level, log::Level::Info);
  // Any registered transport is accepted; an unknown log level is the default.
  EXPECT_EQ(parse({{"CHORUS_TRANSPORT", "shm"}})->net.transport, "shm");
  EXPECT_EQ(parse({{"CHORUS_DEBUG", "LOUD"}})->log.level, log::Level::Warn);
}

// Each bad value fails naming the knob, the value and what is accepted.
TEST(ConfigParse, EachKnobHasOneRuleAndItsMessageSaysWhatIsAccepted) {
  struct Bad {
    const char* knob;
    const char* value;
    const char* accepted;
  };
  const Bad cases[] = {
      {"CHORUS_TIMEOUT_MS", "0", "a positive number of ms"},
      {"CHORUS_TIMEOUT_MS", "1s", "a positive number of ms"},
      {"CHORUS_TIMEOUT_MS", "", "a positive number of ms"},
      {"CHORUS_CHECK", "maybe", "0, 1"},
      {"CHORUS_TRANSPORT", "ib", "auto, shm, tcp"},
      {"CHORUS_SPIN_US", "-1", "an integer >= 0"},
      {"CHORUS_SHM_RING_BYTES", "5000", "a power of two in 4096..4294967296"},
      {"CHORUS_SHM_RING_BYTES", "2048", "a power of two in 4096..4294967296"},
      {"CHORUS_SHM_RING_BYTES", "8589934592", "a power of two in 4096..4294967296"},
      {"CHORUS_SHM_CMA", "2", "0, 1"},
      {"CHORUS_SHM_CMA_BYTES", "-1", "an integer >= 0"},
      {"CHORUS_SHM_SPREAD", "yes please", "0, 1"},
      {"CHORUS_TCP_SOCKETS", "17", "1..16"},
      {"CHORUS_TCP_SOCKETS", "0", "1..16"},
      {"CHORUS_TCP_RENDEZVOUS_BYTES", "-1", "an integer >= 0"},
      {"CHORUS_HEARTBEAT_MS", "3600001", "0..3600000"},
      {"CHORUS_TCP_RMA", "2", "0, 1"},
      {"CHORUS_UCX_TLS", "tcp;sm", "UCX_TLS's syntax"},
      {"CHORUS_UCX_TLS", "tcp sm", "UCX_TLS's syntax"},
      {"CHORUS_CHUNK_BYTES", "x", "an integer >= 0"},
      {"CHORUS_SHRINK_WINDOW_MS", "-5", "an integer >= 0"},
      {"CHORUS_CLOCK_SYNC_S", "86401", "0..86400"},
      {"CHORUS_CLOCK_OFFSET_NS", "1.5", "an integer"},
      {"CHORUS_DEVICE_STAGING", "gpu", "auto, map, pipeline, whole"},
      {"CHORUS_DEVICE_CHUNK_BYTES", "0", "a positive number of bytes"},
  };
  for (const Bad& b : cases) {
    const std::string m = errorOf(b.knob, b.value);
    EXPECT_NE(m.find(b.knob), std::string::npos) << b.knob << "=" << b.value << ": " << m;
    EXPECT_NE(m.find(b.value), std::string::npos) << b.knob << "=" << b.value << ": " << m;
    EXPECT_NE(m.find(std::string("accepted: ") + b.accepted), std::string::npos) << b.knob << "=" << b.value << ": " << m;
  }
  EXPECT_EQ(parse({{"CHORUS_TIMEOUT_MS", "0"}}).status().code(), chorusInvalidArgument);
}

}  // namespace
}  // namespace chorus::api
