#include "clock/ptp/port.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace chorus::clock::ptp {
namespace {

int64_t intervalNs(int8_t log2_seconds) {
  return static_cast<int64_t>(std::ldexp(1e9, std::clamp<int>(log2_seconds, -10, 10)));
}

// correctionField is ns * 2^16; sub-ns residue is dropped (software
// timestamps carry none).
int64_t correctionNs(int64_t scaled) { return scaled / 65536; }

constexpr ClockIdentity kAllOnes{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};

}  // namespace

std::string_view portStateName(PortState s) {
  switch (s) {
    case PortState::Initializing: return "INITIALIZING";
    case PortState::Faulty: return "FAULTY";
    case PortState::Disabled: return "DISABLED";
    case PortState::Listening: return "LISTENING";
    case PortState::PreMaster: return "PRE_MASTER";
    case PortState::Master: return "MASTER";
    case PortState::Passive: return "PASSIVE";
    case PortState::Uncalibrated: return "UNCALIBRATED";
    case PortState::Slave: return "SLAVE";
  }
  return "?";
}

Port::Port(PortConfig config) : config_(config), rng_(config.random_seed) {
  if (config_.slave_only) config_.quality.clock_class = 255;
}

Dataset Port::localDataset() const {
  Dataset d;
  d.priority1 = config_.priority1;
  d.gm_identity = config_.clock_identity;
  d.quality = config_.quality;
  d.priority2 = config_.priority2;
  d.steps_removed = 0;
  d.sender = identity();
  d.receiver = identity();
  return d;
}

int64_t Port::randomNs(int64_t max_ns) {
  if (max_ns <= 0) return 0;
  return std::uniform_int_distribution<int64_t>(0, max_ns)(rng_);
}

void Port::setState(PortState to, std::string reason, PortEvents& out) {
  if (to == state_) return;
  out.transitions.push_back({state_, to, std::move(reason)});
  state_ = to;
}

void Port::start(const Now& now, PortEvents& out) {
  foreign_.clear();
  parent_.reset();
  resetMeasurement();
  announce_tx_at_ = sync_tx_at_ = delay_req_at_ = fault_reset_at_ = INT64_MAX;
  setState(PortState::Listening, "INIT_COMPLETE", out);
  armAnnounceReceipt(now);
}

void Port::armAnnounceReceipt(const Now& now) {
  const int64_t iv = intervalNs(config_.log_announce_interval);
  // As ptp4l: the timeout plus up to one interval of jitter, so two clocks
  // that start together do not both become master at the same instant.
  announce_receipt_at_ = now.mono_ns + config_.announce_receipt_timeout * iv + randomNs(iv);
}

void Port::armDelayReq(const Now& now) {
  // 9.5.11.2: uniformly in [0, 2^(logMinDelayReqInterval+1)] seconds.
  delay_req_at_ = now.mono_ns + randomNs(2 * intervalNs(master_log_min_delay_req_));
}

void Port::resetMeasurement() {
  pending_ = {};
  last_t1_t2_.reset();
  delay_req_outstanding_.reset();
  t3_.reset();
  delay_window_.clear();
  mean_delay_.reset();
  sync_awaiting_tx_.reset();
}

void Port::clockStepped() {
  // t2 and t3 were read on the clock before the step; t1 and t4 are the
  // master's.  Drop the local ones; the filtered delay stays valid.
  pending_ = {};
  last_t1_t2_.reset();
  t3_.reset();
  delay_req_outstanding_.reset();
}

void Port::fault(const Now& now, std::string_view why, PortEvents& out) {
  setState(PortState::Faulty, fmt::format("FAULT_DETECTED ({})", why), out);
  announce_receipt_at_ = announce_tx_at_ = sync_tx_at_ = delay_req_at_ = INT64_MAX;
  fault_reset_at_ = now.mono_ns + config_.fault_reset_ns;
  parent_.reset();
  resetMeasurement();
}

void Port::setCalibrated(bool calibrated, PortEvents& out) {
  if (calibrated && state_ == PortState::Uncalibrated) setState(PortState::Slave, "MASTER_CLOCK_SELECTED", out);
  if (!calibrated && state_ == PortState::Slave) setState(PortState::Uncalibrated, "SYNCHRONIZATION_FAULT", out);
}

int64_t Port::nextDeadline() const {
  return std::min({announce_receipt_at_, announce_tx_at_, sync_tx_at_, delay_req_at_, fault_reset_at_});
}

Header Port::header(MessageType type, uint16_t seq, int8_t log_interval) const {
  Header h;
  h.type = type;
  h.domain = config_.domain;
  h.source = identity();
  h.sequence_id = seq;
  h.log_message_interval = log_interval;
  return h;
}

void Port::emit(Message m, PortEvents& out) {
  auto bytes = buildMessage(m);
  if (!bytes.isOk()) {  // a bug in this file, not a runtime condition
    out.warnings.push_back(bytes.status().message());
    return;
  }
  out.send.push_back({m.header.type, m.header.sequence_id, std::move(bytes).value()});
}

void Port::enterMaster(const Now& now, std::string reason, PortEvents& out) {
  if (state_ == PortState::Master) return;
  setState(PortState::Master, std::move(reason), out);
  parent_.reset();
  resetMeasurement();
  announce_receipt_at_ = delay_req_at_ = INT64_MAX;
  // Syncs run half the shorter of the two intervals after the Announces, so
  // that no Sync leaves right behind an Announce.  Over a software bridge a
  // packet sent right behind another crosses in ~5 us where one alone takes
  // ~27 (the stack is already awake), so with both on one phase every
  // Announce interval had one fast Sync; a ptp4l slave reports one Sync per
  // second (freq_est_interval 0) and, when its phase hit that one, read this
  // master ~20 us off for a whole run (docs/ptp.md, "Bridged network").
  // Both intervals are powers of two: the Announces then always fall
  // midway between Syncs, or Syncs midway between Announces.
  announce_tx_at_ = now.mono_ns;
  sync_tx_at_ = now.mono_ns +
                std::min(intervalNs(config_.log_sync_interval), intervalNs(config_.log_announce_interval)) / 2;
}

void Port::enterSlave(const PortIdentity& parent, const Now& now, std::string reason, PortEvents& out) {
  const bool same = parent_ && *parent_ == parent &&
                    (state_ == PortState::Slave || state_ == PortState::Uncalibrated);
  if (same) return;
  parent_ = parent;
  out.parent_changed = true;
  resetMeasurement();
  master_log_min_delay_req_ = config_.log_min_delay_req_interval;
  announce_tx_at_ = sync_tx_at_ = INT64_MAX;
  armAnnounceReceipt(now);
  armDelayReq(now);
  if (state_ == PortState::Uncalibrated) {
    out.transitions.push_back({state_, state_, std::move(reason)});
  } else {
    setState(PortState::Uncalibrated, std::move(reason), out);
  }
}

void Port::pruneForeign(const Now& now) {
  for (ForeignMaster& f : foreign_) {
    const int64_t window = 4 * intervalNs(f.header.log_message_interval);
    while (!f.rx_mono.empty() && f.rx_mono.front() < now.mono_ns - window) f.rx_mono.pop_front();
  }
  std::erase_if(foreign_, [](const ForeignMaster& f) { return f.rx_mono.empty(); });
}

std::optional<Dataset> Port::bestForeign(const Now& now, PortIdentity* sender) {
  pruneForeign(now);
  std::vector<Dataset> qualified;
  for (const ForeignMaster& f : foreign_) {
    // FOREIGN_MASTER_THRESHOLD (9.3.2.4.4): two Announces inside the window.
    if (f.rx_mono.size() < 2) continue;
    Dataset d;
    d.priority1 = f.announce.gm_priority1;
    d.gm_identity = f.announce.gm_identity;
    d.quality = f.announce.gm_quality;
    d.priority2 = f.announce.gm_priority2;
    d.steps_removed = f.announce.steps_removed;
    d.sender = f.sender;
    d.receiver = identity();
    qualified.push_back(d);
  }
  auto best = bestDataset(qualified);
  if (best && sender) *sender = best->sender;
  return best;
}

void Port::decide(const Now& now, std::string_view why, bool listening, PortEvents& out) {
  if (state_ == PortState::Faulty || state_ == PortState::Initializing || state_ == PortState::Disabled) return;
  PortIdentity sender;
  const auto best = bestForeign(now, &sender);
  Recommendation rec = stateDecision(localDataset(), best, listening);
  if (config_.master_only && rec != Recommendation::Unchanged) rec = Recommendation::Master;
  // A slave-only clock follows the best foreign master whatever D0 says
  // (9.2.2: it never takes the MASTER role, so comparing with it is moot).
  if (config_.slave_only && best) rec = Recommendation::Slave;
  if (config_.slave_only && (rec == Recommendation::Master || rec == Recommendation::Passive)) {
    // A slave-only clock has nobody to follow: wait for one.
    if (state_ != PortState::Listening) {
      parent_.reset();
      resetMeasurement();
      delay_req_at_ = announce_tx_at_ = sync_tx_at_ = INT64_MAX;
      setState(PortState::Listening, std::string(why), out);
    }
    armAnnounceReceipt(now);
    return;
  }
  switch (rec) {
    case Recommendation::Unchanged: return;
    case Recommendation::Master: enterMaster(now, fmt::format("{} (BMCA: local clock is best)", why), out); return;
    case Recommendation::Passive:
      if (state_ != PortState::Passive) {
        parent_.reset();
        resetMeasurement();
        announce_tx_at_ = sync_tx_at_ = delay_req_at_ = INT64_MAX;
        setState(PortState::Passive, std::string(why), out);
        armAnnounceReceipt(now);
      }
      return;
    case Recommendation::Slave:
      for (const ForeignMaster& f : foreign_)
        if (f.sender == sender) parent_announce_ = f.announce;
      enterSlave(sender, now, fmt::format("RS_SLAVE (best master {})", toString(sender)), out);
      return;
  }
}

void Port::tick(const Now& now, PortEvents& out) {
  const int64_t t = now.mono_ns;
  if (fault_reset_at_ <= t) {
    fault_reset_at_ = INT64_MAX;
    setState(PortState::Initializing, "FAULT_CLEARED", out);
    start(now, out);
    return;
  }
  if (announce_receipt_at_ <= t) {
    announce_receipt_at_ = INT64_MAX;
    if (parent_) {
      // The parent went silent: forget it, then choose again.
      std::erase_if(foreign_, [&](const ForeignMaster& f) { return f.sender == *parent_; });
      parent_.reset();
      resetMeasurement();
      delay_req_at_ = INT64_MAX;
    }
    if (state_ == PortState::Listening || state_ == PortState::Passive || state_ == PortState::Slave ||
        state_ == PortState::Uncalibrated) {
      // Decide as if not listening: no qualified foreign master now means MASTER.
      decide(now, "ANNOUNCE_RECEIPT_TIMEOUT_EXPIRES", /*listening=*/false, out);
      if (announce_receipt_at_ == INT64_MAX && state_ != PortState::Master) armAnnounceReceipt(now);
    }
  }
  if (state_ == PortState::Master) {
    if (announce_tx_at_ <= t) {
      const int64_t iv = intervalNs(config_.log_announce_interval);
      announce_tx_at_ = std::max(announce_tx_at_ + iv, t + 1);
      Message m{header(MessageType::Announce, announce_seq_++, config_.log_announce_interval), AnnounceBody{}};
      auto& a = std::get<AnnounceBody>(m.body);
      // ARB timescale, UTC offset not valid: what a software-timestamping
      // ptp4l sends too, so a ptp4l slave compares our time with UTC directly.
      a.origin = timestampFromNs(now.ptp_ns);
      a.current_utc_offset = config_.current_utc_offset;
      a.gm_priority1 = config_.priority1;
      a.gm_quality = config_.quality;
      a.gm_priority2 = config_.priority2;
      a.gm_identity = config_.clock_identity;
      a.steps_removed = 0;
      emit(std::move(m), out);
    }
    if (sync_tx_at_ <= t) {
      const int64_t iv = intervalNs(config_.log_sync_interval);
      sync_tx_at_ = std::max(sync_tx_at_ + iv, t + 1);
      const uint16_t seq = sync_seq_++;
      Header h = header(MessageType::Sync, seq, config_.log_sync_interval);
      h.flags = kFlagTwoStep;
      emit(Message{h, SyncBody{timestampFromNs(now.ptp_ns)}}, out);
      sync_awaiting_tx_ = seq;
    }
  }
  if ((state_ == PortState::Slave || state_ == PortState::Uncalibrated) && delay_req_at_ <= t) {
    armDelayReq(now);
    // Without a Sync there is nothing to pair t3/t4 with yet.
    if (last_t1_t2_ || pending_.have_sync) {
      const uint16_t seq = delay_req_seq_++;
      emit(Message{header(MessageType::DelayReq, seq, kLogIntervalUnused), DelayReqBody{timestampFromNs(now.ptp_ns)}},
           out);
      delay_req_outstanding_ = seq;
      t3_.reset();
    }
  }
}

void Port::txTimestamp(MessageType type, uint16_t seq, int64_t tx, const Now& /*now*/, PortEvents& out) {
  if (type == MessageType::Sync && state_ == PortState::Master && sync_awaiting_tx_ == seq) {
    sync_awaiting_tx_.reset();
    emit(Message{header(MessageType::FollowUp, seq, config_.log_sync_interval), FollowUpBody{timestampFromNs(tx)}},
         out);
  } else if (type == MessageType::DelayReq && delay_req_outstanding_ == seq) {
    t3_ = tx;
  }
}

void Port::receive(const Message& m, int64_t rx, const Now& now, PortEvents& out) {
  const Header& h = m.header;
  if (h.domain != config_.domain) return;
  if (h.source.clock == config_.clock_identity) return;  // our own, looped back
  if (state_ == PortState::Faulty || state_ == PortState::Initializing || state_ == PortState::Disabled) return;
  switch (h.type) {
    case MessageType::Announce: onAnnounce(m, now, out); break;
    case MessageType::Sync: onSync(m, rx, out); break;
    case MessageType::FollowUp: onFollowUp(m, out); break;
    case MessageType::DelayReq: onDelayReq(m, rx, out); break;
    case MessageType::DelayResp: onDelayResp(m, out); break;
    case MessageType::Management: onManagement(m, out); break;
    default: break;
  }
}

void Port::onAnnounce(const Message& m, const Now& now, PortEvents& out) {
  const auto& a = std::get<AnnounceBody>(m.body);
  // 9.3.2.5: an Announce that went around a loop, or too many hops, is not a candidate.
  if (a.steps_removed >= 255 || a.gm_identity == config_.clock_identity) return;
  auto it = std::find_if(foreign_.begin(), foreign_.end(),
                         [&](const ForeignMaster& f) { return f.sender == m.header.source; });
  if (it == foreign_.end()) {
    foreign_.push_back({m.header.source, {}, m.header, a});
    it = foreign_.end() - 1;
  }
  it->rx_mono.push_back(now.mono_ns);
  it->header = m.header;
  it->announce = a;
  if (parent_ && *parent_ == m.header.source) {
    parent_announce_ = a;
    armAnnounceReceipt(now);
  } else if (state_ == PortState::Listening || state_ == PortState::Passive) {
    armAnnounceReceipt(now);
  }
  decide(now, "STATE_DECISION_EVENT", state_ == PortState::Listening, out);
}

void Port::onSync(const Message& m, int64_t rx, PortEvents& out) {
  if (!parent_ || m.header.source != *parent_) return;
  if (state_ != PortState::Slave && state_ != PortState::Uncalibrated) return;
  const bool two_step = (m.header.flags & kFlagTwoStep) != 0;
  if (pending_.have_follow_up && pending_.seq == m.header.sequence_id) {
    // Follow_Up overtook its Sync.
  } else {
    pending_ = {};
    pending_.seq = m.header.sequence_id;
  }
  pending_.have_sync = true;
  pending_.two_step = two_step;
  pending_.t2 = rx;
  pending_.sync_correction_ns = correctionNs(m.header.correction);
  pending_.log_interval = m.header.log_message_interval;
  if (!two_step) {
    pending_.have_follow_up = true;
    pending_.precise_origin = timestampToNs(std::get<SyncBody>(m.body).origin);
    pending_.fup_correction_ns = 0;
  }
  if (pending_.have_follow_up) completeSync(out);
}

void Port::onFollowUp(const Message& m, PortEvents& out) {
  if (!parent_ || m.header.source != *parent_) return;
  if (state_ != PortState::Slave && state_ != PortState::Uncalibrated) return;
  if (pending_.seq != m.header.sequence_id || !pending_.have_sync) {
    if (pending_.have_sync && !pending_.have_follow_up) return;  // stale Follow_Up
    pending_ = {};
    pending_.seq = m.header.sequence_id;
  }
  pending_.have_follow_up = true;
  pending_.precise_origin = timestampToNs(std::get<FollowUpBody>(m.body).precise_origin);
  pending_.fup_correction_ns = correctionNs(m.header.correction);
  if (pending_.have_sync) completeSync(out);
}

void Port::completeSync(PortEvents& out) {
  const int64_t t1 = pending_.precise_origin + pending_.sync_correction_ns + pending_.fup_correction_ns;
  const int64_t t2 = pending_.t2;
  last_t1_t2_ = {t1, t2};
  const uint16_t seq = pending_.seq;
  const int8_t log_interval = pending_.log_interval;
  pending_ = {};
  if (!mean_delay_) return;  // no offset without a path delay (as ptp4l)
  last_offset_ns_ = t2 - t1 - *mean_delay_;
  out.samples.push_back({seq, t1, t2, last_offset_ns_, *mean_delay_, log_interval});
}

void Port::onDelayReq(const Message& m, int64_t rx, PortEvents& out) {
  if (state_ != PortState::Master) return;
  Header h = header(MessageType::DelayResp, m.header.sequence_id, config_.log_min_delay_req_interval);
  h.correction = m.header.correction;  // 11.3.2 c): copied from the Delay_Req
  emit(Message{h, DelayRespBody{timestampFromNs(rx), m.header.source}}, out);
}

void Port::onDelayResp(const Message& m, PortEvents& out) {
  const auto& r = std::get<DelayRespBody>(m.body);
  if (!parent_ || m.header.source != *parent_ || r.requesting != identity()) return;
  if (!delay_req_outstanding_ || *delay_req_outstanding_ != m.header.sequence_id) return;
  delay_req_outstanding_.reset();
  // Follow the master's pace for Delay_Req (7.7.2.4), within sane bounds.
  if (m.header.log_message_interval != kLogIntervalUnused)
    master_log_min_delay_req_ = static_cast<int8_t>(std::clamp<int>(m.header.log_message_interval, -7, 8));
  if (!t3_ || !last_t1_t2_) return;
  const int64_t t4 = timestampToNs(r.receive) - correctionNs(m.header.correction);
  const auto [t1, t2] = *last_t1_t2_;
  // 11.3.2: <meanPathDelay> = ((t2 - t1) + (t4 - t3)) / 2.
  const int64_t raw = ((t2 - t1) + (t4 - *t3_)) / 2;
  t3_.reset();
  delay_window_.push_back(raw);
  while (delay_window_.size() > std::max<size_t>(config_.delay_filter_length, 1)) delay_window_.pop_front();
  std::vector<int64_t> sorted(delay_window_.begin(), delay_window_.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  mean_delay_ = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  (void)out;
}

void Port::onManagement(const Message& m, PortEvents& out) {
  const auto& req = std::get<ManagementBody>(m.body);
  if (req.action != ManagementAction::Get || req.tlv_type != kTlvManagement) return;
  const bool for_us = (req.target.clock == kAllOnes || req.target.clock == config_.clock_identity) &&
                      (req.target.port == 0xFFFF || req.target.port == config_.port_number);
  if (!for_us) return;
  ManagementBody resp;
  resp.target = m.header.source;
  resp.starting_boundary_hops = static_cast<uint8_t>(req.starting_boundary_hops - req.boundary_hops);
  resp.boundary_hops = req.boundary_hops;
  resp.action = ManagementAction::Response;
  resp.management_id = req.management_id;
  const bool following = parent_ && (state_ == PortState::Slave || state_ == PortState::Uncalibrated);
  switch (req.management_id) {
    case kMgmtDefaultDataSet:
      resp.data = encodeDefaultDataSet({true, config_.slave_only, 1, config_.priority1, config_.quality,
                                        config_.priority2, config_.clock_identity, config_.domain});
      break;
    case kMgmtCurrentDataSet:
      resp.data = encodeCurrentDataSet({static_cast<uint16_t>(following ? parent_announce_.steps_removed + 1 : 0),
                                        following ? last_offset_ns_ * 65536 : 0,
                                        following && mean_delay_ ? *mean_delay_ * 65536 : 0});
      break;
    case kMgmtParentDataSet:
      if (following) {
        resp.data = encodeParentDataSet({*parent_, parent_announce_.gm_priority1, parent_announce_.gm_quality,
                                         parent_announce_.gm_priority2, parent_announce_.gm_identity});
      } else {
        resp.data = encodeParentDataSet(
            {identity(), config_.priority1, config_.quality, config_.priority2, config_.clock_identity});
      }
      break;
    case kMgmtPortDataSet:
      resp.data = encodePortDataSet({identity(), static_cast<uint8_t>(state_), config_.log_min_delay_req_interval,
                                     config_.log_announce_interval, config_.announce_receipt_timeout,
                                     config_.log_sync_interval});
      break;
    default: {
      // MANAGEMENT_ERROR_STATUS (15.5.4): NOT_SUPPORTED, the id, 4 reserved, empty displayData.
      resp.tlv_type = kTlvManagementErrorStatus;
      resp.management_id = kMgmtErrorNotSupported;
      resp.data = {static_cast<uint8_t>(req.management_id >> 8), static_cast<uint8_t>(req.management_id), 0, 0, 0, 0,
                   0, 0};
      break;
    }
  }
  emit(Message{header(MessageType::Management, m.header.sequence_id, kLogIntervalUnused), std::move(resp)}, out);
}

}  // namespace chorus::clock::ptp
