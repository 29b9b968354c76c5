// Paged KV layouts (prim/kv.hpp): the descriptor lists that copy KV-cache
// blocks between a prefill and a decode rank, for layer-major and
// block-major regions and different tensor-parallel degrees.
#include <algorithm>

#include "prim/kv.hpp"

namespace chorus::prim::kv {
namespace {

Status mul(uint64_t a, uint64_t b, uint64_t* out, const char* what) {
  if (__builtin_mul_overflow(a, b, out)) return invalidArgument("kv layout: {} overflows 64 bits", what);
  return {};
}

Status checkModel(const KvModel& m) {
  if (m.layers == 0 || m.kv_heads == 0 || m.head_dim == 0 || m.elem_bytes == 0 || m.block_tokens == 0)
    return invalidArgument("kv layout: layers={}, kv_heads={}, head_dim={}, elem_bytes={}, block_tokens={}: each must be > 0",
                           m.layers, m.kv_heads, m.head_dim, m.elem_bytes, m.block_tokens);
  return {};
}

Status checkSide(const KvModel& m, const KvSide& s) {
  if (s.tp == 0 || m.kv_heads % s.tp != 0)
    return invalidArgument("kv layout: tp={} does not divide kv_heads={}", s.tp, m.kv_heads);
  if (s.tp_rank >= s.tp) return invalidArgument("kv layout: tp_rank={} is not below tp={}", s.tp_rank, s.tp);
  if (s.order != KvOrder::LayerMajor && s.order != KvOrder::BlockMajor)
    return invalidArgument("kv layout: order {} is not LayerMajor (0) or BlockMajor (1)", static_cast<int>(s.order));
  return {};
}

// Bytes of one (layer, kv) plane of one block on side s.
Result<uint64_t> planeBytes(const KvModel& m, const KvSide& s) {
  uint64_t v = 0;
  CHORUS_RETURN_IF_ERROR(mul(m.block_tokens, m.kv_heads / s.tp, &v, "the block size"));
  CHORUS_RETURN_IF_ERROR(mul(v, m.head_dim, &v, "the block size"));
  CHORUS_RETURN_IF_ERROR(mul(v, m.elem_bytes, &v, "the block size"));
  return v;
}

}  // namespace

Result<uint64_t> kvRegionBytes(const KvModel& m, const KvSide& s) {
  CHORUS_RETURN_IF_ERROR(checkModel(m));
  CHORUS_RETURN_IF_ERROR(checkSide(m, s));
  CHORUS_ASSIGN_OR_RETURN(uint64_t plane, planeBytes(m, s));
  uint64_t v = 0;
  CHORUS_RETURN_IF_ERROR(mul(plane, 2, &v, "the region size"));
  CHORUS_RETURN_IF_ERROR(mul(v, m.layers, &v, "the region size"));
  CHORUS_RETURN_IF_ERROR(mul(v, s.blocks, &v, "the region size"));
  if (__builtin_add_overflow(v, s.base_offset, &v)) return invalidArgument("kv layout: the region size overflows 64 bits");
  return v;
}

Result<uint64_t> kvElementOffset(const KvModel& m, const KvSide& s, uint32_t layer, uint32_t kv, uint64_t block,
                                 uint32_t token, uint32_t head, uint32_t d) {
  CHORUS_RETURN_IF_ERROR(kvRegionBytes(m, s).status());
  const uint32_t heads = m.kv_heads / s.tp;
  const uint64_t first = uint64_t{s.tp_rank} * heads;
  if (layer >= m.layers || kv >= 2 || block >= s.blocks || token >= m.block_tokens || d >= m.head_dim ||
      head < first || head >= first + heads)
    return invalidArgument(
        "kv layout: element (layer {}, kv {}, block {}, token {}, head {}, dim {}) is not on this side "
        "(layers {}, blocks {}, block_tokens {}, heads {}..{}, head_dim {})",
        layer, kv, block, token, head, d, m.layers, s.blocks, m.block_tokens, first, first + heads - 1, m.head_dim);
  const uint64_t plane = *planeBytes(m, s);
  const uint64_t planes = s.order == KvOrder::LayerMajor ? (uint64_t{layer} * 2 + kv) * s.blocks + block
                                                         : (block * m.layers + layer) * 2 + kv;
  const uint64_t in_plane = ((uint64_t{token} * heads + (head - first)) * m.head_dim + d) * m.elem_bytes;
  return s.base_offset + planes * plane + in_plane;  // below kvRegionBytes: no overflow
}

std::vector<Desc> coalesce(std::span<const Desc> descs) {
  std::vector<Desc> out;
  out.reserve(descs.size());
  for (const Desc& d : descs) {
    if (!out.empty()) {
      Desc& b = out.back();
      if (b.local_region == d.local_region && b.remote_region == d.remote_region &&
          b.local_offset + b.bytes == d.local_offset && b.remote_offset + b.bytes == d.remote_offset &&
          b.local_offset + b.bytes >= b.local_offset && b.remote_offset + b.bytes >= b.remote_offset) {
        b.bytes += d.bytes;
        continue;
      }
    }
    if (d.bytes != 0) out.push_back(d);
  }
  return out;
}

std::vector<Desc> swapSides(std::span<const Desc> descs) {
  std::vector<Desc> out(descs.begin(), descs.end());
  for (Desc& d : out) {
    std::swap(d.local_region, d.remote_region);
    std::swap(d.local_offset, d.remote_offset);
  }
  return out;
}

Result<std::vector<Desc>> kvBlockDescs(const KvModel& m, const KvSide& src, const KvSide& dst,
                                       std::span<const uint64_t> src_blocks, std::span<const uint64_t> dst_blocks) {
  CHORUS_RETURN_IF_ERROR(kvRegionBytes(m, src).status());
  CHORUS_RETURN_IF_ERROR(kvRegionBytes(m, dst).status());
  if (src_blocks.size() != dst_blocks.size())
    return invalidArgument("kv layout: {} source blocks but {} destination blocks", src_blocks.size(),
                           dst_blocks.size());
  for (size_t i = 0; i < src_blocks.size(); ++i)
    if (src_blocks[i] >= src.blocks || dst_blocks[i] >= dst.blocks)
      return invalidArgument("kv layout: block pair {} ({} -> {}) is past a region (source holds {}, destination {})",
                             i, src_blocks[i], dst_blocks[i], src.blocks, dst.blocks);
  // The heads both ranks hold.
  const uint32_t sh = m.kv_heads / src.tp, dh = m.kv_heads / dst.tp;
  const uint32_t h0 = std::max(src.tp_rank * sh, dst.tp_rank * dh);
  const uint32_t h1 = std::min((src.tp_rank + 1) * sh, (dst.tp_rank + 1) * dh);
  std::vector<Desc> out;
  if (h0 >= h1) return out;
  const uint64_t run = uint64_t{h1 - h0} * m.head_dim * m.elem_bytes;
  // Walk the source in its storage order, so that pieces that continue each
  // other on both sides are neighbours in the list and merge.
  auto piece = [&](size_t i, uint32_t l, uint32_t p) -> Status {
    for (uint32_t t = 0; t < m.block_tokens; ++t) {
      CHORUS_ASSIGN_OR_RETURN(uint64_t so, kvElementOffset(m, src, l, p, src_blocks[i], t, h0, 0));
      CHORUS_ASSIGN_OR_RETURN(uint64_t dof, kvElementOffset(m, dst, l, p, dst_blocks[i], t, h0, 0));
      if (!out.empty()) {  // merge as we go: a block of equal TP is one run per plane
        Desc& b = out.back();
        if (b.local_offset + b.bytes == so && b.remote_offset + b.bytes == dof) {
          b.bytes += run;
          continue;
        }
      }
      out.push_back(Desc{src.region, so, dst.region, dof, run});
    }
    return {};
  };
  if (src.order == KvOrder::LayerMajor) {
    for (uint32_t l = 0; l < m.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p)
        for (size_t i = 0; i < src_blocks.size(); ++i) CHORUS_RETURN_IF_ERROR(piece(i, l, p));
  } else {
    for (size_t i = 0; i < src_blocks.size(); ++i)
      for (uint32_t l = 0; l < m.layers; ++l)
        for (uint32_t p = 0; p < 2; ++p) CHORUS_RETURN_IF_ERROR(piece(i, l, p));
  }
  return coalesce(out);
}

}  // namespace chorus::prim::kv
