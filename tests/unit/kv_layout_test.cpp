// Paged KV layouts (prim/kv.hpp): the descriptor lists of kvBlockDescs,
// applied with memcpy between every prefill rank and every decode rank,
// give each decode rank exactly the heads and blocks it should hold, for
// layer-major and block-major regions and prefill/decode TP degrees of 1, 2
// and 4.  The reference builds and reads the regions by walking them in
// storage order (nested loops), never through kvElementOffset.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "prim/kv.hpp"

namespace chorus::prim::kv {
namespace {

constexpr uint32_t kEmpty = 0xffffffffu;

// A unique 32-bit id of a KV element: layer, plane, logical block of the
// request, token, global head, dim (each below 16).  `stray` marks source
// blocks that are not part of the request.
uint32_t elementId(uint32_t l, uint32_t p, uint32_t j, uint32_t t, uint32_t h, uint32_t d, bool stray = false) {
  return (stray ? 0x80000000u : 0u) | (l << 20) | (p << 19) | (j << 14) | (t << 9) | (h << 4) | d;
}

struct Walk {
  KvModel m;
  KvSide s;
  // Calls f(layer, plane, block, token, global head, dim) for the elements
  // of the region in storage order.
  template <typename F>
  void each(F&& f) const {
    const uint32_t heads = m.kv_heads / s.tp, first = s.tp_rank * heads;
    auto inner = [&](uint32_t l, uint32_t p, uint64_t b) {
      for (uint32_t t = 0; t < m.block_tokens; ++t)
        for (uint32_t h = 0; h < heads; ++h)
          for (uint32_t d = 0; d < m.head_dim; ++d) f(l, p, b, t, first + h, d);
    };
    if (s.order == KvOrder::LayerMajor) {
      for (uint32_t l = 0; l < m.layers; ++l)
        for (uint32_t p = 0; p < 2; ++p)
          for (uint64_t b = 0; b < s.blocks; ++b) inner(l, p, b);
    } else {
      for (uint64_t b = 0; b < s.blocks; ++b)
        for (uint32_t l = 0; l < m.layers; ++l)
          for (uint32_t p = 0; p < 2; ++p) inner(l, p, b);
    }
  }
};

using Param = std::tuple<KvOrder, KvOrder, uint32_t, uint32_t>;  // src order, dst order, src tp, dst tp

class KvLayoutTest : public testing::TestWithParam<Param> {};

TEST_P(KvLayoutTest, EveryDecodeRankGetsItsHeadsOfEveryBlock) {
  const auto [so, dord, stp, dtp] = GetParam();
  KvModel m{3, 4, 5, 4, 6};  // layers, kv_heads, head_dim, elem_bytes (u32 ids), block_tokens
  const std::vector<uint64_t> src_blocks{3, 0, 5, 2};
  const std::vector<uint64_t> dst_blocks{1, 4, 2, 3};
  const uint64_t base = 24;  // the KV data starts after a header
  auto logicalOfSrc = [&](uint64_t b) -> int {
    for (size_t j = 0; j < src_blocks.size(); ++j)
      if (src_blocks[j] == b) return static_cast<int>(j);
    return -1;
  };
  auto logicalOfDst = [&](uint64_t b) -> int {
    for (size_t j = 0; j < dst_blocks.size(); ++j)
      if (dst_blocks[j] == b) return static_cast<int>(j);
    return -1;
  };
  // Prefill ranks' regions, filled in storage order.
  std::vector<std::vector<std::byte>> src(stp);
  std::vector<KvSide> src_side(stp);
  for (uint32_t r = 0; r < stp; ++r) {
    src_side[r] = KvSide{so, stp, r, 6, 7, base};
    auto bytes = kvRegionBytes(m, src_side[r]);
    ASSERT_TRUE(bytes.isOk()) << bytes.status().message();
    src[r].assign(*bytes, std::byte{0xEE});
    size_t at = base;
    Walk{m, src_side[r]}.each([&](uint32_t l, uint32_t p, uint64_t b, uint32_t t, uint32_t h, uint32_t d) {
      const int j = logicalOfSrc(b);
      const uint32_t v = elementId(l, p, j < 0 ? static_cast<uint32_t>(b) : static_cast<uint32_t>(j), t, h, d, j < 0);
      std::memcpy(src[r].data() + at, &v, 4);
      at += 4;
    });
    ASSERT_EQ(at, src[r].size());
  }
  std::vector<std::vector<std::byte>> dst(dtp);
  std::vector<KvSide> dst_side(dtp);
  for (uint32_t r = 0; r < dtp; ++r) {
    dst_side[r] = KvSide{dord, dtp, r, 5, 9, base};
    auto bytes = kvRegionBytes(m, dst_side[r]);
    ASSERT_TRUE(bytes.isOk());
    dst[r].assign(*bytes, std::byte{0xFF});
  }
  // Every (prefill, decode) pair copies what its descriptors say.
  size_t total = 0;
  for (uint32_t a = 0; a < stp; ++a)
    for (uint32_t b = 0; b < dtp; ++b) {
      auto descs = kvBlockDescs(m, src_side[a], dst_side[b], src_blocks, dst_blocks);
      ASSERT_TRUE(descs.isOk()) << descs.status().message();
      for (const Desc& d : *descs) {
        ASSERT_EQ(d.local_region, 7u);
        ASSERT_EQ(d.remote_region, 9u);
        ASSERT_LE(d.local_offset + d.bytes, src[a].size());
        ASSERT_LE(d.remote_offset + d.bytes, dst[b].size());
        std::memcpy(dst[b].data() + d.remote_offset, src[a].data() + d.local_offset, d.bytes);
        total += d.bytes;
      }
    }
  // Each element of the request's blocks lands once: bytes moved = the
  // request's KV bytes.
  EXPECT_EQ(total, uint64_t{m.layers} * 2 * src_blocks.size() * m.block_tokens * m.kv_heads * m.head_dim * 4);
  for (uint32_t r = 0; r < dtp; ++r) {
    for (size_t i = 0; i < base; ++i) ASSERT_EQ(dst[r][i], std::byte{0xFF}) << "header byte " << i << " written";
    size_t at = base;
    size_t bad = 0;
    Walk{m, dst_side[r]}.each([&](uint32_t l, uint32_t p, uint64_t blk, uint32_t t, uint32_t h, uint32_t d) {
      uint32_t got;
      std::memcpy(&got, dst[r].data() + at, 4);
      at += 4;
      const int j = logicalOfDst(blk);
      const uint32_t want = j < 0 ? kEmpty : elementId(l, p, static_cast<uint32_t>(j), t, h, d);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << "decode rank " << r << " layer " << l << " kv " << p << " block " << blk << " token " << t
                      << " head " << h << " dim " << d << ": got " << std::hex << got << " want " << want;
    });
    EXPECT_EQ(bad, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvLayoutTest,
                         testing::Combine(testing::Values(KvOrder::LayerMajor, KvOrder::BlockMajor),
                                          testing::Values(KvOrder::LayerMajor, KvOrder::BlockMajor),
                                          testing::Values(1u, 2u, 4u), testing::Values(1u, 2u, 4u)));

TEST(KvLayout, EqualTpBlockMajorConsecutiveBlocksAreOneDescriptor) {
  KvModel m{4, 8, 16, 2, 16};
  KvSide s{KvOrder::BlockMajor, 2, 1, 10, 0, 0};
  KvSide d{KvOrder::BlockMajor, 2, 1, 10, 1, 4096};
  const std::vector<uint64_t> blocks{2, 3, 4};
  auto descs = kvBlockDescs(m, s, d, blocks, blocks);
  ASSERT_TRUE(descs.isOk());
  ASSERT_EQ(descs->size(), 1u);
  const uint64_t block_bytes = uint64_t{4} * 2 * 16 * 4 * 16 * 2;  // layers*2*tokens*heads(8/2)*dim*elem
  EXPECT_EQ((*descs)[0].bytes, 3 * block_bytes);
  EXPECT_EQ((*descs)[0].local_offset, 2 * block_bytes);
  EXPECT_EQ((*descs)[0].remote_offset, 4096 + 2 * block_bytes);
  // Layer-major: one run per (layer, plane) for the three consecutive blocks.
  s.order = d.order = KvOrder::LayerMajor;
  descs = kvBlockDescs(m, s, d, blocks, blocks);
  ASSERT_TRUE(descs.isOk());
  EXPECT_EQ(descs->size(), 4u * 2);
  // Decode TP=4 rank 0 shares no heads with prefill TP=2 rank 1.
  KvSide d4{KvOrder::LayerMajor, 4, 0, 10, 1, 0};
  descs = kvBlockDescs(m, s, d4, blocks, blocks);
  ASSERT_TRUE(descs.isOk());
  EXPECT_TRUE(descs->empty());
  // swapSides turns a write list into the read list of the other side.
  auto w = kvBlockDescs(m, s, d, blocks, blocks);
  auto r = swapSides(*w);
  EXPECT_EQ(r[0].local_region, 1u);
  EXPECT_EQ(r[0].remote_offset, (*w)[0].local_offset);
}

TEST(KvLayout, BadShapesAreErrors) {
  KvModel m{2, 6, 8, 2, 16};
  KvSide ok{KvOrder::LayerMajor, 2, 0, 4, 0, 0};
  const std::vector<uint64_t> one{1}, two{1, 2}, past{4};
  EXPECT_FALSE(kvBlockDescs(m, KvSide{KvOrder::LayerMajor, 4, 0, 4, 0, 0}, ok, one, one).isOk());  // 4 !| 6
  EXPECT_FALSE(kvBlockDescs(m, KvSide{KvOrder::LayerMajor, 2, 2, 4, 0, 0}, ok, one, one).isOk());  // rank >= tp
  EXPECT_FALSE(kvBlockDescs(m, ok, ok, one, two).isOk());                                           // lengths differ
  auto r = kvBlockDescs(m, ok, ok, past, one);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("past a region"), std::string::npos) << r.status().message();
  KvModel huge{1u << 30, 6, 1u << 30, 8, 1u << 20};
  auto b = kvRegionBytes(huge, ok);
  ASSERT_FALSE(b.isOk());
  EXPECT_NE(b.status().message().find("overflows"), std::string::npos) << b.status().message();
  EXPECT_FALSE(kvRegionBytes(KvModel{0, 6, 8, 2, 16}, ok).isOk());
  auto e = kvElementOffset(m, ok, 0, 0, 0, 0, 3, 0);  // head 3 is on TP rank 1
  EXPECT_FALSE(e.isOk());
}

TEST(KvLayout, CoalesceMergesOnlyWhenBothSidesContinue) {
  std::vector<Desc> in{{0, 0, 1, 100, 10}, {0, 10, 1, 110, 5}, {0, 15, 1, 200, 5}, {0, 20, 2, 205, 5}, {0, 25, 2, 210, 0}};
  auto out = coalesce(in);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], (Desc{0, 0, 1, 100, 15}));
  EXPECT_EQ(out[1], (Desc{0, 15, 1, 200, 5}));
  EXPECT_EQ(out[2], (Desc{0, 20, 2, 205, 5}));
}

}  // namespace
}  // namespace chorus::prim::kv
