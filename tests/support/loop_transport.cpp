#include "support/loop_transport.hpp"

#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace chorus::testing {
namespace {

using transport::Request;

struct Message {
  std::vector<std::byte> data;
  uint64_t sig = 0;
};

struct PostedRecv {
  transport::RecvTarget target;
  Request* req = nullptr;
};

// One communicator's queues, shared by its ranks' transports.
struct Fabric {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t version = 0;  // bumped by every send and abort: what wait() waits for
  std::map<std::pair<int, int>, std::deque<Message>> queues;  // (src, dst)
  bool aborted = false;
  Status why;
};

std::mutex g_mu;
std::map<std::string, std::weak_ptr<Fabric>>& fabrics() {
  static auto* m = new std::map<std::string, std::weak_ptr<Fabric>>;
  return *m;
}

std::shared_ptr<Fabric> fabricFor(const std::string& tag) {
  std::lock_guard l(g_mu);
  auto& slot = fabrics()[tag];
  std::shared_ptr<Fabric> f = slot.lock();
  if (!f) {
    f = std::make_shared<Fabric>();
    slot = f;
  }
  return f;
}

class LoopTransport final : public transport::Transport {
 public:
  LoopTransport(int rank, std::vector<int> peers, std::shared_ptr<Fabric> f)
      : rank_(rank), peers_(std::move(peers)), f_(std::move(f)) {}

  std::string_view name() const override { return kLoopTransport; }

  Status postSend(int peer, const void* src, size_t bytes, Request* req) override {
    Message m;
    m.data.resize(bytes);
    if (bytes != 0) std::memcpy(m.data.data(), src, bytes);
    m.sig = req->sig;
    {
      std::lock_guard l(f_->mu);
      if (f_->aborted) return f_->why;
      f_->queues[{rank_, peer}].push_back(std::move(m));
      ++f_->version;
    }
    f_->cv.notify_all();
    req->complete();
    return {};
  }

  Status postRecv(int peer, const transport::RecvTarget& target, Request* req) override {
    req->state.store(Request::Posted, std::memory_order_release);
    pending_[peer].push_back(PostedRecv{target, req});
    return {};
  }

  Result<bool> poll() override {
    std::lock_guard l(f_->mu);
    if (f_->aborted) {
      for (auto& [peer, q] : pending_)
        for (PostedRecv& r : q) r.req->fail(f_->why);
      pending_.clear();
      return f_->why;
    }
    bool progressed = false;
    for (auto& [peer, q] : pending_) {
      auto it = f_->queues.find({peer, rank_});
      while (!q.empty() && it != f_->queues.end() && !it->second.empty()) {
        Message m = std::move(it->second.front());
        it->second.pop_front();
        PostedRecv r = q.front();
        q.pop_front();
        progressed = true;
        if (m.sig != r.req->sig) {
          r.req->fail(transport::signatureMismatch(rank_, peer, r.req->sig, m.sig));
          continue;
        }
        if (m.data.size() != r.target.bytes) {
          r.req->fail(makeError(chorusMismatch, "loop: message from rank {} has {} bytes but the receive expects {}",
                                peer, m.data.size(), r.target.bytes));
          continue;
        }
        if (r.target.reducer == nullptr) {
          if (!m.data.empty()) std::memcpy(r.target.dst, m.data.data(), m.data.size());
        } else {
          const size_t elem = r.target.reducer->elemSize();
          (*r.target.reducer)(r.target.dst, r.target.accum, m.data.data(), m.data.size() / elem);
        }
        r.req->complete();
      }
    }
    seen_ = f_->version;
    return progressed;
  }

  void wait(std::chrono::microseconds timeout) override {
    std::unique_lock l(f_->mu);
    f_->cv.wait_for(l, timeout, [&] { return f_->version != seen_ || f_->aborted || woken_; });
    woken_ = false;
  }

  void wake() override {
    {
      std::lock_guard l(f_->mu);
      woken_ = true;
    }
    f_->cv.notify_all();
  }

  void abort(const Status& why) override {
    {
      std::lock_guard l(f_->mu);
      if (!f_->aborted) {
        f_->aborted = true;
        f_->why = makeError(why.code() == chorusMismatch ? chorusMismatch : chorusRemoteError,
                            "rank {} aborted its communicator: {}", rank_, why.message());
      }
      ++f_->version;
    }
    f_->cv.notify_all();
  }

 private:
  int rank_;
  std::vector<int> peers_;
  std::shared_ptr<Fabric> f_;
  std::map<int, std::deque<PostedRecv>> pending_;  // by peer, in post order (executor's thread only)
  uint64_t seen_ = 0;  // the fabric's version at the last poll (under f_->mu)
  bool woken_ = false;  // under f_->mu
};

}  // namespace

void registerLoopTransport() {
  static std::once_flag once;
  std::call_once(once, [] {
    transport::TransportInfo t;
    t.name = kLoopTransport;
    t.preference = 1000;
    t.serves = [](const transport::WireView& v, int peer) {
      return v.ranks[static_cast<size_t>(peer)].pid == v.ranks[static_cast<size_t>(v.rank)].pid &&
             v.sameHost(peer);
    };
    t.create = [](const transport::SetupContext& c) -> Result<transport::Created> {
      transport::Created out;
      out.transport = std::make_unique<LoopTransport>(c.view.rank, c.peers, fabricFor(c.job_tag + "/loop"));
      return out;
    };
    (void)transport::registry().add(std::move(t));
  });
}

}  // namespace chorus::testing
