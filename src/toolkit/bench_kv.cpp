// chorus-bench kv (toolkit/bench_kv.hpp).
#include "toolkit/bench_kv.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>

#include "prim/kv.hpp"

namespace chorus::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace kv = prim::kv;

constexpr int kWaitMs = 120000;
constexpr uint64_t kEndMark = 0xffffffffu;  // the value's low half that ends a row

Status apiError(chorusResult_t r, std::string_view what) {
  return Status(r, fmt::format("chorus-bench kv: {}: {}: {}", what, chorusGetErrorString(r),
                               chorusGetLastError(nullptr)));
}
#define KV_CALL(expr, what)                            \
  do {                                                 \
    if (chorusResult_t r_ = (expr); r_ != chorusSuccess) \
      return apiError(r_, what);                       \
  } while (0)

// Byte `off` of the source pool in row `row`: not periodic in any power of two
// below 2^16, different per row.
uint8_t pattern(uint64_t row, uint64_t off) {
  return static_cast<uint8_t>((off * 131 + (off >> 8) * 7 + row * 17) ^ (off >> 16));
}

class KvBench {
 public:
  KvBench(const KvBenchOptions& o, chorusComm_t comm, std::FILE* out) : o_(o), comm_(comm), out_(out) {}
  ~KvBench() {
    if (agent_ != nullptr) (void)chorusKvAgentDestroy(agent_);
  }

  Status setUp() {
    int n = 0;
    KV_CALL(chorusCommCount(comm_, &n), "chorusCommCount");
    KV_CALL(chorusCommUserRank(comm_, &rank_), "chorusCommUserRank");
    if (n != 2) return invalidArgument("chorus-bench kv: runs on 2 ranks (the two agents), not {}", n);
    if (o_.blocks == 0 || o_.blocks > (1u << 20)) return invalidArgument("chorus-bench kv: --blocks must be 1..2^20");
    if (o_.layers == 0 || o_.layers > 1024) return invalidArgument("chorus-bench kv: --layers must be 1..1024");
    uint64_t max_block = 0;
    for (uint64_t b : o_.block_bytes) max_block = std::max(max_block, b);
    if (max_block / (2 * o_.layers) == 0)
      return invalidArgument("chorus-bench kv: a block of {} bytes has less than a byte per (layer, plane) of {} "
                             "layers", max_block, o_.layers);
    if (max_block > (uint64_t{1} << 36) / (2 * o_.blocks))
      return invalidArgument("chorus-bench kv: --blocks {} x -e {} is more than this benchmark allocates (2^35 B)",
                             o_.blocks, max_block);
    pool_bytes_ = 2 * o_.blocks * max_block;  // 2n blocks: the destination's are scattered over it
    pool_.reset(new uint8_t[pool_bytes_]());
    expect_.reset(new uint8_t[pool_bytes_]());

    chorusUniqueId id{};
    if (rank_ == 0) KV_CALL(chorusGetUniqueId(&id), "chorusGetUniqueId");
    KV_CALL(chorusBroadcast(&id, &id, sizeof id, chorusUint8, 0, comm_, nullptr), "broadcast of the store's id");
    // Rank 0's agent runs the store; rank 1's connects to it once it exists.
    if (rank_ == 0) KV_CALL(chorusKvAgentCreate(&agent_, "kv0", id, 1), "chorusKvAgentCreate(kv0)");
    KV_CALL(chorusBarrier(comm_, nullptr), "barrier");
    if (rank_ == 1) KV_CALL(chorusKvAgentCreate(&agent_, "kv1", id, 0), "chorusKvAgentCreate(kv1)");
    KV_CALL(chorusKvRegister(agent_, pool_.get(), pool_bytes_, CHORUS_KV_READ | CHORUS_KV_WRITE, &region_),
            "chorusKvRegister");
    KV_CALL(chorusKvPublishMetadata(agent_), "chorusKvPublishMetadata");
    KV_CALL(chorusKvConnect(agent_, rank_ == 0 ? "kv1" : "kv0", kWaitMs), "chorusKvConnect");
    KV_CALL(chorusBroadcast(&region_, &reg0_, 1, chorusUint32, 0, comm_, nullptr), "region broadcast");
    KV_CALL(chorusBroadcast(&region_, &reg1_, 1, chorusUint32, 1, comm_, nullptr), "region broadcast");
    if (!o_.json_path.empty() && rank_ == 0) {
      json_.open(o_.json_path, std::ios::app);
      if (!json_) return invalidArgument("chorus-bench kv: cannot open --json {}", o_.json_path);
    }
    return Status();
  }

  Status run() {
    if (rank_ == 0) {
      print(fmt::format("# chorus-bench kv: 2 agents, {} blocks per batch, {} layers, TP {} (kv0) -> {} (kv1), iters {} "
                        "warmup {}, check {}\n",
                        o_.blocks, o_.layers, o_.tp_prefill, o_.tp_decode, o_.iters, o_.warmup, o_.check ? 1 : 0));
      print(fmt::format("# {:>10}  {:>8}  {:>10}  {:>6}  {:>6}  {:>5}  {:>9}  {:>9}  {:>9}  {:>7}\n", "size",
                        "blocks", "block", "descs", "layout", "op", "time", "p50", "algbw", "#wrong"));
      print(fmt::format("# {:>10}  {:>8}  {:>10}  {:>6}  {:>6}  {:>5}  {:>9}  {:>9}  {:>9}  {:>7}\n", "(B)", "",
                        "(B)", "", "", "", "(us)", "(us)", "(GB/s)", ""));
    }
    for (uint64_t block : o_.block_bytes)
      for (int layout : o_.layouts)
        for (bool write : o_.writes) CHORUS_RETURN_IF_ERROR(row(block, layout, write));
    KV_CALL(chorusBarrier(comm_, nullptr), "barrier");
    if (rank_ == 0) print(fmt::format("# Out of bounds values : {} {}\n#\n", wrong_, wrong_ ? "FAILED" : "OK"));
    // The store lives in rank 0's agent: rank 1 leaves first.
    if (rank_ == 1) {
      KV_CALL(chorusKvAgentDestroy(agent_), "chorusKvAgentDestroy");
      agent_ = nullptr;
    }
    KV_CALL(chorusBarrier(comm_, nullptr), "barrier");
    return Status();
  }

  [[nodiscard]] uint64_t wrong() const { return wrong_; }

 private:
  void print(const std::string& s) {
    if (out_ != nullptr) {
      std::fputs(s.c_str(), out_);
      std::fflush(out_);
    }
  }

  // One (block size, layout, op): the source side is rank 0 for a write and
  // rank 1 for a read (its blocks 0..n-1), the destination the other side
  // (its blocks 2(n-1-i)+1).
  Status row(uint64_t block_in, int layout, bool write) {
    // Heads: enough for both TP degrees (each side's ranks hold kv_heads / tp of them).
    const uint32_t heads = std::lcm(o_.tp_prefill, o_.tp_decode);
    const uint64_t n = o_.blocks, piece = block_in / (2 * o_.layers) / heads, block = piece * heads * 2 * o_.layers;
    if (piece == 0)
      return invalidArgument("chorus-bench kv: a block of {} bytes has less than a byte per (layer, K|V, head) of {} "
                             "layers and {} heads (TP {} and {})", block_in, o_.layers, heads, o_.tp_prefill, o_.tp_decode);
    if (piece > UINT32_MAX) return invalidArgument("chorus-bench kv: a block of {} bytes is too large", block_in);
    // One byte elements, one token per block, `heads` heads of `piece`
    // bytes: a (layer, plane) piece of a block is one run of heads x piece
    // bytes, of which a TP rank holds its heads' share.
    const kv::KvModel m{.layers = o_.layers, .kv_heads = heads, .head_dim = static_cast<uint32_t>(piece),
                        .elem_bytes = 1, .block_tokens = 1};
    const auto order = layout == 0 ? kv::KvOrder::LayerMajor : kv::KvOrder::BlockMajor;
    const bool source = (rank_ == 0) == write;
    // Each agent's pool holds its side's TP ranks' regions one after another
    // (rank r's from r x pool / tp): rank 0's side has --tp-prefill ranks,
    // rank 1's --tp-decode.  A write moves rank 0's side into rank 1's, a
    // read rank 1's side into rank 0's.
    const uint32_t src_tp = write ? o_.tp_prefill : o_.tp_decode, dst_tp = write ? o_.tp_decode : o_.tp_prefill;
    const uint32_t src_region = write ? reg0_ : reg1_, dst_region = write ? reg1_ : reg0_;
    auto side = [&](uint32_t tp, uint32_t r, uint32_t region) {
      return kv::KvSide{.order = order, .tp = tp, .tp_rank = r, .blocks = 2 * n, .region = region,
                        .base_offset = r * (2 * n * block / tp)};
    };
    std::vector<uint64_t> sb(n), db(n);
    for (uint64_t i = 0; i < n; ++i) sb[i] = i, db[i] = 2 * (n - 1 - i) + 1;
    std::vector<kv::Desc> descs;
    for (uint32_t sr = 0; sr < src_tp; ++sr)
      for (uint32_t dr = 0; dr < dst_tp; ++dr) {
        CHORUS_ASSIGN_OR_RETURN(std::vector<kv::Desc> d,
                                kv::kvBlockDescs(m, side(src_tp, sr, src_region), side(dst_tp, dr, dst_region), sb, db));
        descs.insert(descs.end(), d.begin(), d.end());
      }
    // Rank 0 posts: a write's local side is the source, a read's the destination.
    const std::vector<kv::Desc> posted = write ? descs : kv::swapSides(descs);
    std::vector<chorusKvDesc_t> cd(posted.size());
    for (size_t i = 0; i < posted.size(); ++i)
      cd[i] = {posted[i].local_region, posted[i].local_offset, posted[i].remote_region, posted[i].remote_offset,
               posted[i].bytes};
    const uint64_t region_bytes = 2 * n * block;
    ++row_;
    if (o_.check) {
      if (source) {
        for (uint64_t i = 0; i < region_bytes; ++i) pool_[i] = pattern(row_, i);
      } else {
        std::memset(pool_.get(), 0, region_bytes);
      }
    }
    KV_CALL(chorusBarrier(comm_, nullptr), "barrier");
    std::vector<double> us;
    if (rank_ == 0) {
      for (int it = 0; it < o_.warmup + o_.iters; ++it) {
        uint64_t x = 0;
        const auto t0 = Clock::now();
        KV_CALL(write ? chorusKvPostWrite(agent_, "kv1", cd.data(), cd.size(), 1, (row_ << 32) | unsigned(it), &x)
                      : chorusKvPostRead(agent_, "kv1", cd.data(), cd.size(), 1, (row_ << 32) | unsigned(it), &x),
                "post");
        KV_CALL(chorusKvWait(agent_, x, kWaitMs), write ? "write batch" : "read batch");
        const auto t1 = Clock::now();
        KV_CALL(chorusKvRelease(agent_, x), "chorusKvRelease");
        if (it >= o_.warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      uint64_t x = 0;
      KV_CALL(chorusKvPostWrite(agent_, "kv1", nullptr, 0, 1, (row_ << 32) | kEndMark, &x), "end of row");
      KV_CALL(chorusKvWait(agent_, x, kWaitMs), "end of row");
      KV_CALL(chorusKvRelease(agent_, x), "chorusKvRelease");
    } else {
      // The target: serve the peer's accesses until the row's end mark.
      const auto deadline = Clock::now() + std::chrono::milliseconds(kWaitMs);
      uint64_t expect = 0;
      for (;;) {
        char name[80];
        uint64_t value = 0;
        int got = 0;
        KV_CALL(chorusKvGetNotif(agent_, name, sizeof name, &value, &got), "chorusKvGetNotif");
        if (got) {
          if (value >> 32 != row_)
            return invalidArgument("chorus-bench kv: notification {:#x} of another row (row {})", value, row_);
          if ((value & kEndMark) == kEndMark) break;
          if ((value & kEndMark) != expect)
            return invalidArgument("chorus-bench kv: batch {} notified out of order (expected {})",
                                   value & kEndMark, expect);
          ++expect;
        } else if (Clock::now() > deadline) {
          return Status(chorusTimeout, "chorus-bench kv: the row's end mark did not come");
        }
      }
      if (expect != uint64_t(o_.warmup + o_.iters))
        return invalidArgument("chorus-bench kv: {} notifications for {} batches", expect, o_.warmup + o_.iters);
    }
    uint64_t wrong = 0;
    if (o_.check && !source) {
      // What the destination must hold, element by element from the layout's
      // offsets (not from the descriptors): each (block, layer, plane, head)
      // of the batch from the source rank that holds the head, in the
      // destination rank that holds it; zero elsewhere.
      std::memset(expect_.get(), 0, region_bytes);
      for (uint64_t i = 0; i < n; ++i)
        for (uint32_t l = 0; l < o_.layers; ++l)
          for (uint32_t kvp = 0; kvp < 2; ++kvp)
            for (uint32_t h = 0; h < heads; ++h) {
              const uint32_t sr = h / (heads / src_tp), dr = h / (heads / dst_tp);
              CHORUS_ASSIGN_OR_RETURN(uint64_t so, kv::kvElementOffset(m, side(src_tp, sr, src_region), l, kvp, sb[i], 0, h, 0));
              CHORUS_ASSIGN_OR_RETURN(uint64_t dof, kv::kvElementOffset(m, side(dst_tp, dr, dst_region), l, kvp, db[i], 0, h, 0));
              for (uint64_t e = 0; e < piece; ++e) expect_[dof + e] = pattern(row_, so + e);
            }
      for (uint64_t i = 0; i < region_bytes; ++i) wrong += pool_[i] != expect_[i];
    }
    uint64_t total = 0;
    KV_CALL(chorusAllReduce(&wrong, &total, 1, chorusUint64, chorusSum, comm_, nullptr), "allreduce of #wrong");
    wrong_ += total;
    if (rank_ == 0) {
      std::vector<double> sorted = us;
      std::sort(sorted.begin(), sorted.end());
      double mean = 0;
      for (double u : us) mean += u;
      mean /= std::max<size_t>(1, us.size());
      const double p50 = sorted.empty() ? 0 : sorted[sorted.size() / 2];
      const uint64_t bytes = n * block;
      const double gbps = mean > 0 ? double(bytes) / (mean * 1e3) : 0;
      const char* lname = layout == 0 ? "layer" : "block";
      const char* op = write ? "write" : "read";
      print(fmt::format("  {:>10}  {:>8}  {:>10}  {:>6}  {:>6}  {:>5}  {:>9.1f}  {:>9.1f}  {:>9.3f}  {:>7}\n", bytes, n,
                        block, descs.size(), lname, op, mean, p50, gbps, o_.check ? fmt::format("{}", total) : "N/A"));
      if (json_)
        json_ << fmt::format("{{\"op\":\"kv\",\"kv_op\":\"{}\",\"layout\":\"{}\",\"bytes\":{},\"blocks\":{},"
                             "\"block_bytes\":{},\"layers\":{},\"descs\":{},\"time_us\":{:.3f},\"p50_us\":{:.3f},"
                             "\"algbw_gbps\":{:.6f},\"wrong\":{},\"tp_prefill\":{},\"tp_decode\":{}}}\n",
                             op, lname, bytes, n, block, o_.layers, descs.size(), mean, p50, gbps, total, o_.tp_prefill,
                             o_.tp_decode);
    }
    return Status();
  }

  KvBenchOptions o_;
  chorusComm_t comm_;
  std::FILE* out_;
  int rank_ = 0;
  chorusKvAgent_t agent_ = nullptr;
  uint32_t region_ = 0, reg0_ = 0, reg1_ = 0;  // this agent's region; rank 0's and rank 1's
  uint64_t pool_bytes_ = 0;
  std::unique_ptr<uint8_t[]> pool_, expect_;
  uint64_t row_ = 0, wrong_ = 0;
  std::ofstream json_;
};

}  // namespace

Result<uint64_t> runKvBench(const KvBenchOptions& o, chorusComm_t comm, std::FILE* out) {
  KvBench b(o, comm, out);
  CHORUS_RETURN_IF_ERROR(b.setUp());
  CHORUS_RETURN_IF_ERROR(b.run());
  return b.wrong();
}

}  // namespace chorus::tools::bench
