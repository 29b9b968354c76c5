// An in-process Store for tests that run ranks as threads without a server.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "bootstrap/store.hpp"
#include "clock/offset.hpp"

namespace chorus::bootstrap {

class MemoryStore final : public Store {
 public:
  Status set(std::string_view key, std::span<const std::byte> value) override {
    std::lock_guard lock(mu_);
    data_[std::string(key)] = Bytes(value.begin(), value.end());
    cv_.notify_all();
    return {};
  }
  Result<Bytes> get(std::string_view key, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    std::string k(key);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(k) != 0; }))
      return makeError(chorusTimeout, "store key '{}' did not appear within {} ms", key, timeout.count());
    return data_[k];
  }
  Result<int64_t> add(std::string_view key, int64_t delta) override {
    std::lock_guard lock(mu_);
    auto& v = counters_[std::string(key)];
    v += delta;
    data_[std::string(key)] = toBytes(std::to_string(v));
    cv_.notify_all();
    return v;
  }

  Result<int64_t> serverTimeNs() override { return clock::traceNowNs(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes, std::less<>> data_;
  std::map<std::string, int64_t, std::less<>> counters_;
};

}  // namespace chorus::bootstrap
