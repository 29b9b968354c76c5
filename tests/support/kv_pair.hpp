// Two KV agents of one test process connected both ways (each publishes its
// metadata, then each connects to the other, at once, as two workers would).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "prim/kv.hpp"

namespace chorus::support {

inline void connectBoth(prim::kv::Agent& a, prim::kv::Agent& b) {
  using namespace std::chrono_literals;
  ASSERT_TRUE(a.publishMetadata().isOk());
  ASSERT_TRUE(b.publishMetadata().isOk());
  std::thread tb([&] {
    auto r = b.connect(a.name(), 20s);
    EXPECT_TRUE(r.isOk()) << r.status().message();
  });
  auto r = a.connect(b.name(), 20s);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  tb.join();
}

}  // namespace chorus::support
