// Port state machine, BMCA and the end-to-end exchange, in a discrete-event
// simulation: ports exchange the bytes they build over a simulated link with
// a fixed delay plus deterministic jitter; each port has its own clock (a
// VirtualClockMapping over simulated true time), and a slave's servo steers
// its clock exactly as the daemon does.  No sockets, no sleeps.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <queue>
#include <random>

#include "clock/ptp/bmca.hpp"
#include "clock/ptp/clock.hpp"
#include "clock/ptp/port.hpp"
#include "clock/ptp/servo.hpp"

namespace chorus::clock::ptp {
namespace {

ClockIdentity idFor(uint8_t n) { return {0x02, 0x00, 0x00, 0xFF, 0xFE, 0x00, 0x00, n}; }

// --- BMCA ------------------------------------------------------------------

Dataset ds(uint8_t gm, uint8_t p1 = 128, uint8_t cls = 248, uint8_t p2 = 128, uint16_t steps = 0) {
  Dataset d;
  d.priority1 = p1;
  d.gm_identity = idFor(gm);
  d.quality = {cls, 0xFE, 0xFFFF};
  d.priority2 = p2;
  d.steps_removed = steps;
  d.sender = {idFor(gm), 1};
  d.receiver = {idFor(99), 1};
  return d;
}

TEST(PtpBmca, ComparesAttributesInSpecOrder) {
  EXPECT_EQ(compareDatasets(ds(5, 127), ds(1, 128)), DatasetOrder::ABetter);  // priority1 first
  EXPECT_EQ(compareDatasets(ds(5, 128, 6), ds(1, 128, 248)), DatasetOrder::ABetter);  // then clockClass
  Dataset acc = ds(5);
  acc.quality.clock_accuracy = 0x21;
  EXPECT_EQ(compareDatasets(acc, ds(1)), DatasetOrder::ABetter);  // then accuracy
  Dataset var = ds(5);
  var.quality.offset_scaled_log_variance = 0x4E5D;
  EXPECT_EQ(compareDatasets(var, ds(1)), DatasetOrder::ABetter);  // then variance
  EXPECT_EQ(compareDatasets(ds(5, 128, 248, 127), ds(1)), DatasetOrder::ABetter);  // then priority2
  EXPECT_EQ(compareDatasets(ds(1), ds(5)), DatasetOrder::ABetter);  // identity breaks the tie
  EXPECT_EQ(compareDatasets(ds(5), ds(1)), DatasetOrder::BBetter);
}

TEST(PtpBmca, SameGrandmasterComparesTopology) {
  EXPECT_EQ(compareDatasets(ds(1, 128, 248, 128, 0), ds(1, 128, 248, 128, 2)), DatasetOrder::ABetter);
  EXPECT_EQ(compareDatasets(ds(1, 128, 248, 128, 3), ds(1, 128, 248, 128, 1)), DatasetOrder::BBetter);
  Dataset a = ds(1, 128, 248, 128, 1), b = ds(1, 128, 248, 128, 1);
  a.sender = {idFor(3), 1};
  b.sender = {idFor(4), 1};
  EXPECT_EQ(compareDatasets(a, b), DatasetOrder::ABetterByTopology);
  EXPECT_EQ(compareDatasets(b, a), DatasetOrder::BBetterByTopology);
  EXPECT_EQ(compareDatasets(a, a), DatasetOrder::Equal);
}

TEST(PtpBmca, StateDecisionForAnOrdinaryClock) {
  const Dataset local = ds(10);
  EXPECT_EQ(stateDecision(local, std::nullopt, true), Recommendation::Unchanged);
  EXPECT_EQ(stateDecision(local, std::nullopt, false), Recommendation::Master);
  EXPECT_EQ(stateDecision(local, ds(20), false), Recommendation::Master);   // M2
  EXPECT_EQ(stateDecision(local, ds(3), false), Recommendation::Slave);     // S1
  const Dataset primary = ds(10, 128, 6);
  EXPECT_EQ(stateDecision(primary, ds(3, 1), false), Recommendation::Passive);  // P1
  EXPECT_EQ(stateDecision(primary, ds(3), false), Recommendation::Master);      // M1
  std::vector<Dataset> c = {ds(7), ds(4, 200), ds(5)};
  EXPECT_EQ(bestDataset(c)->gm_identity, idFor(5));
}

// --- simulation ------------------------------------------------------------

struct Node {
  std::unique_ptr<Port> port;
  std::unique_ptr<VirtualClockMapping> clock;
  std::unique_ptr<Servo> servo;
  bool up = true;
  std::vector<int64_t> true_offsets;  // per sample while SLAVE: clock - truth
  std::vector<int64_t> delays;
  int64_t samples = 0;
};

class Sim {
 public:
  Sim(int64_t delay_ns, double jitter_ns) : delay_(delay_ns), jitter_(0, jitter_ns) {}

  Node& add(PortConfig pc, int64_t offset_ns = 0, double drift_ppb = 0) {
    pc.random_seed = static_cast<uint32_t>(nodes_.size() + 7);
    auto n = std::make_unique<Node>();
    n->port = std::make_unique<Port>(pc);
    n->clock = std::make_unique<VirtualClockMapping>(t_, offset_ns, drift_ppb);
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }

  void start() {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      PortEvents ev;
      nodes_[i]->port->start(now(i), ev);
      handle(i, ev);
    }
  }

  // Advances simulated time to `until_ns` after the start.
  void runFor(double seconds) {
    const int64_t until = t_ + static_cast<int64_t>(seconds * 1e9);
    for (;;) {
      int64_t next = until;
      if (!queue_.empty()) next = std::min(next, queue_.top().at);
      for (auto& n : nodes_)
        if (n->up) next = std::min(next, n->port->nextDeadline());
      if (next >= until && (queue_.empty() || queue_.top().at >= until)) {
        t_ = until;
        return;
      }
      t_ = std::max(t_, next);
      while (!queue_.empty() && queue_.top().at <= t_) {
        Delivery d = queue_.top();
        queue_.pop();
        if (!nodes_[d.to]->up) continue;
        auto m = parseMessage(d.bytes);
        ASSERT_TRUE(m.isOk()) << m.status().message();
        PortEvents ev;
        nodes_[d.to]->port->receive(*m, nodes_[d.to]->clock->toVirtual(d.at), now(d.to), ev);
        handle(d.to, ev);
      }
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (!nodes_[i]->up || nodes_[i]->port->nextDeadline() > t_) continue;
        PortEvents ev;
        nodes_[i]->port->tick(now(i), ev);
        handle(i, ev);
      }
    }
  }

  Node& node(size_t i) { return *nodes_[i]; }
  int64_t trueOffset(size_t i) { return nodes_[i]->clock->toVirtual(t_) - t_; }
  // Sends a raw message from outside (a management client) to node `to`.
  void inject(size_t to, const std::vector<uint8_t>& bytes) { queue_.push({t_ + delay_, to, bytes}); }
  std::vector<std::vector<uint8_t>> outside;  // everything the nodes sent, for the tests to inspect

 private:
  struct Delivery {
    int64_t at;
    size_t to;
    std::vector<uint8_t> bytes;
    bool operator>(const Delivery& o) const { return at > o.at; }
  };

  Now now(size_t i) { return {t_, nodes_[i]->clock->toVirtual(t_)}; }

  void handle(size_t from, PortEvents& ev) {
    Node& n = *nodes_[from];
    for (size_t k = 0; k < ev.send.size(); ++k) {
      const Outbound out = ev.send[k];
      outside.push_back(out.bytes);
      const int64_t lat = out.event() ? delay_ + std::llround(std::fabs(jitter_(rng_))) : delay_;
      for (size_t j = 0; j < nodes_.size(); ++j)
        if (j != from) queue_.push({t_ + lat, j, out.bytes});
      if (out.event()) n.port->txTimestamp(out.type, out.sequence_id, n.clock->toVirtual(t_), now(from), ev);
    }
    for (const SyncSample& s : ev.samples) {
      ++n.samples;
      if (!n.servo) {
        ServoConfig c;
        c.interval_s = std::ldexp(1.0, s.log_sync_interval);
        n.servo = std::move(makeServo(c)).value();
      }
      ServoOutput o = n.servo->sample(s.offset_ns, s.t2);
      if (o.step_ns) {
        n.clock->step(t_, *o.step_ns);
        n.port->clockStepped();
      }
      n.clock->setFrequency(t_, o.freq_ppb);
      PortEvents more;
      if (o.state != ServoState::Unlocked) n.port->setCalibrated(true, more);
      n.true_offsets.push_back(n.clock->toVirtual(t_) - t_);
      n.delays.push_back(s.path_delay_ns);
    }
    if (ev.parent_changed) n.servo.reset();
  }

  int64_t t_ = 1'700'000'000'000'000'000;
  int64_t delay_;
  std::normal_distribution<double> jitter_;
  std::mt19937_64 rng_{1234};
  std::vector<std::unique_ptr<Node>> nodes_;
  std::priority_queue<Delivery, std::vector<Delivery>, std::greater<>> queue_;
};

PortConfig config(uint8_t n, uint8_t priority1 = 128) {
  PortConfig pc;
  pc.clock_identity = idFor(n);
  pc.priority1 = priority1;
  pc.log_sync_interval = -4;
  pc.log_announce_interval = 0;
  pc.log_min_delay_req_interval = -4;
  return pc;
}

TEST(PtpPort, BetterClockBecomesMasterOtherFollowsAndConverges) {
  Sim sim(2'000, 200);
  sim.add(config(1, 127));
  sim.add(config(2), 1'000'000, 50'000);  // 1 ms ahead, 50 ppm fast
  sim.start();
  sim.runFor(40);
  Node& m = sim.node(0);
  Node& s = sim.node(1);
  EXPECT_EQ(m.port->state(), PortState::Master);
  EXPECT_EQ(s.port->state(), PortState::Slave);
  ASSERT_TRUE(s.port->parent().has_value());
  EXPECT_EQ(s.port->parent()->clock, idFor(1));
  ASSERT_GT(s.samples, 16 * 25);  // ~16 samples/s once following
  // The clock is within a few hundred ns of the truth at the end; path delay
  // is the 2 us link plus the mean |jitter| of the event messages.
  EXPECT_LT(std::llabs(sim.trueOffset(1)), 500);
  EXPECT_NEAR(static_cast<double>(s.delays.back()), 2'000 + 160, 150);
  // Locked within 30 s: from then on every sample's true offset is < 2 us.
  const size_t from = static_cast<size_t>(16 * 30);
  ASSERT_GT(s.true_offsets.size(), from);
  for (size_t i = from; i < s.true_offsets.size(); ++i) ASSERT_LT(std::llabs(s.true_offsets[i]), 2'000) << i;
}

// A master never sends a Sync in the tick of an Announce, nor close to one:
// every Announce lies at least a quarter of the shorter interval from every
// Sync (docs/ptp.md, "Bridged network": a Sync right behind an Announce
// crosses a software bridge ~20 us faster than one alone).
TEST(PtpPort, MasterSendsItsSyncsAwayFromItsAnnounces) {
  for (const auto& [log_sync, log_announce] : {std::pair<int8_t, int8_t>{-4, 0}, {0, 0}, {-3, 1}, {1, 0}, {-7, -2}}) {
    PortConfig pc = config(1);
    pc.log_sync_interval = log_sync;
    pc.log_announce_interval = log_announce;
    Port port(pc);
    int64_t t = 1'000'000'000;
    PortEvents ev;
    port.start({t, t}, ev);
    std::vector<int64_t> syncs, announces;
    const int64_t end = t + 60'000'000'000;
    while (t < end) {
      const int64_t next = port.nextDeadline();
      ASSERT_NE(next, INT64_MAX);
      t = std::max(t + 1, next);
      PortEvents e;
      port.tick({t, t}, e);
      for (const Outbound& o : e.send) {
        if (o.type == MessageType::Sync) syncs.push_back(t);
        if (o.type == MessageType::Announce) announces.push_back(t);
      }
    }
    ASSERT_EQ(port.state(), PortState::Master);
    ASSERT_GE(announces.size(), 10u);
    ASSERT_GE(syncs.size(), 10u);
    const int64_t quarter = static_cast<int64_t>(std::ldexp(1e9, std::min(log_sync, log_announce))) / 4;
    for (int64_t a : announces) {
      int64_t nearest = INT64_MAX;
      for (int64_t s : syncs) nearest = std::min(nearest, s > a ? s - a : a - s);
      EXPECT_GE(nearest, quarter) << "Announce at " << a << " ns, sync 2^" << int{log_sync} << " s, announce 2^"
                                  << int{log_announce} << " s";
    }
  }
}

TEST(PtpPort, LoneClockGoesListeningToMasterOnAnnounceTimeout) {
  Sim sim(1'000, 0);
  Node& a = sim.add(config(1));
  sim.start();
  EXPECT_EQ(a.port->state(), PortState::Listening);
  sim.runFor(2.5);  // timeout 3 intervals of 1 s (+ up to 1 s jitter)
  EXPECT_EQ(a.port->state(), PortState::Listening);
  sim.runFor(2);
  EXPECT_EQ(a.port->state(), PortState::Master);
}

TEST(PtpPort, SlaveOnlyClockNeverBecomesMaster) {
  Sim sim(1'000, 0);
  PortConfig pc = config(1, 1);  // would win any BMCA...
  pc.slave_only = true;          // ...but clockClass 255 and slave-only
  Node& a = sim.add(pc);
  sim.add(config(2));
  sim.start();
  sim.runFor(20);
  EXPECT_EQ(a.port->state(), PortState::Slave);
  EXPECT_EQ(sim.node(1).port->state(), PortState::Master);
}

TEST(PtpPort, SlaveTakesOverWhenTheMasterFallsSilent) {
  Sim sim(1'000, 0);
  Node& m = sim.add(config(1, 100));
  Node& s = sim.add(config(2));
  sim.start();
  sim.runFor(15);
  ASSERT_EQ(s.port->state(), PortState::Slave);
  m.up = false;
  sim.runFor(2);
  EXPECT_EQ(s.port->state(), PortState::Slave);  // not yet: 3 announce intervals
  sim.runFor(4);
  EXPECT_EQ(s.port->state(), PortState::Master);
}

TEST(PtpPort, ABetterMasterAppearingTakesOver) {
  Sim sim(1'000, 0);
  Node& a = sim.add(config(5));
  Node& b = sim.add(config(6));
  sim.start();
  sim.runFor(15);
  // Same priorities: the lower clock identity wins.
  EXPECT_EQ(a.port->state(), PortState::Master);
  EXPECT_EQ(b.port->state(), PortState::Slave);
  Node& c = sim.add(config(9, 50));
  PortEvents ev;
  c.port->start({15'000'000'000 + 1'700'000'000'000'000'000, 0}, ev);
  sim.runFor(15);
  EXPECT_EQ(c.port->state(), PortState::Master);
  EXPECT_EQ(a.port->state(), PortState::Slave);
  EXPECT_EQ(b.port->state(), PortState::Slave);
  EXPECT_EQ(b.port->parent()->clock, idFor(9));
}

TEST(PtpPort, AnswersManagementGet) {
  Sim sim(1'000, 0);
  sim.add(config(1, 100));
  sim.add(config(2));
  sim.start();
  sim.runFor(10);
  ManagementBody get;
  get.target = {ClockIdentity{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, 0xFFFF};
  get.management_id = kMgmtPortDataSet;
  Header h;
  h.type = MessageType::Management;
  h.source = {idFor(77), 1};
  h.sequence_id = 42;
  sim.outside.clear();
  sim.inject(1, std::move(buildMessage({h, get})).value());
  sim.runFor(0.001);
  bool found = false;
  for (const auto& bytes : sim.outside) {
    auto m = parseMessage(bytes);
    ASSERT_TRUE(m.isOk());
    if (m->header.type != MessageType::Management) continue;
    const auto& r = std::get<ManagementBody>(m->body);
    EXPECT_EQ(r.action, ManagementAction::Response);
    EXPECT_EQ(r.management_id, kMgmtPortDataSet);
    EXPECT_EQ(r.target.clock, idFor(77));
    EXPECT_EQ(m->header.sequence_id, 42);
    ASSERT_EQ(r.data.size(), 26u);
    EXPECT_EQ(r.data[10], static_cast<uint8_t>(PortState::Slave));  // portState
    found = true;
  }
  EXPECT_TRUE(found);
}

TEST(PtpPort, FaultThenRecovery) {
  Sim sim(1'000, 0);
  PortConfig pc = config(1);
  pc.fault_reset_ns = 2'000'000'000;
  Node& a = sim.add(pc);
  sim.start();
  PortEvents ev;
  a.port->fault({1'700'000'000'000'000'000, 0}, "sendto: ENETDOWN", ev);
  ASSERT_EQ(ev.transitions.size(), 1u);
  EXPECT_EQ(a.port->state(), PortState::Faulty);
  sim.runFor(2.5);
  EXPECT_EQ(a.port->state(), PortState::Listening);
}

}  // namespace
}  // namespace chorus::clock::ptp
