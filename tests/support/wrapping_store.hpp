// A store for tests that hook some calls and pass the rest to a MemoryStore:
// derive, override what the test intercepts, and call base_ (or the
// WrappingStore method) for the real work.
#pragma once

#include "bootstrap/memory_store.hpp"
#include "bootstrap/store.hpp"

namespace chorus::testing {

class WrappingStore : public bootstrap::Store {
 public:
  Status set(std::string_view key, std::span<const std::byte> value) override { return base_.set(key, value); }
  Result<bootstrap::Bytes> get(std::string_view key, std::chrono::milliseconds timeout) override {
    return base_.get(key, timeout);
  }
  Result<int64_t> add(std::string_view key, int64_t delta) override { return base_.add(key, delta); }

 protected:
  bootstrap::MemoryStore base_;
};

}  // namespace chorus::testing
