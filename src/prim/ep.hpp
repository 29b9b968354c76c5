// Expert parallelism (MoE dispatch and combine): the state a chorusEpHandle_t
// holds and the call block the ep_* primitives read (include/chorus/chorus.h,
// "Expert parallelism"; docs/ep.md).  One primitive per file:
//
//   ep_layout.cpp       layout from the top-k ids + the count exchange
//   ep_dispatch.cpp     tokens to the ranks of their experts, grouped by expert
//   ep_combine.cpp      expert outputs home, weighted, summed in a fixed order
//   ep_return_topk.cpp  per-row values back to their (token, k) slot
//
// The primitives are reached through the chorusEp* entry points, which fill
// the Call block; a chorusPrimitive call naming them must pass that block
// (aux, auxBytes == sizeof(Call), the magic set), else it is refused.
//
// Every primitive agrees before data moves (agree()): each rank's own checks
// become one entry of an allreduce, so a rank's bad input fails the call on
// every rank, naming the rank, instead of leaving its peers waiting.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/wire_format.hpp"
#include "plan/ep_route.hpp"
#include "prim/primitive.hpp"

namespace chorus::prim::ep {

struct Config {
  int experts = 0, topk = 0;
  size_t hidden = 0;
  chorusDataType_t dtype = chorusBfloat16;
  chorusDataType_t index_type = chorusInt64;
  int max_hosts = 0;
  int compress = CHORUS_COMPRESS_OFF;  // dispatch's wire: CHORUS_COMPRESS_OFF, _BF16 or _FP8
  int fp8_block = -1;                  // -1: 128
  int ll_max_tokens = 0;               // low-latency mode: tokens per rank at most (0: off)
  // Dispatch's wire format when compressed (compress != OFF).
  [[nodiscard]] WireFormat wire() const {
    return {compress == CHORUS_COMPRESS_FP8 ? WireFormat::Fp8E4m3 : WireFormat::Bf16,
            fp8_block < 0 ? kFp8DefaultBlock : fp8_block};
  }
  [[nodiscard]] bool compressed() const { return compress == CHORUS_COMPRESS_BF16 || compress == CHORUS_COMPRESS_FP8; }
};

// Validates a config for a communicator of n ranks, naming the field.
Status checkConfig(const Config& c, int nranks);

struct State {
  Config cfg;
  int nranks = 1, rank = 0;
  std::vector<int> host_of;  // rank -> host index 0..nhosts-1 (first appearance in rank order)
  int nhosts = 1;
  std::vector<std::vector<int>> host_ranks;  // host -> its ranks, ascending
  int local_index = 0;                       // this rank's index among its host's ranks
  plan::ep::Geometry geo;                    // the same, as the routing code (plan/ep_route.hpp) takes it
  [[nodiscard]] int localExperts() const { return cfg.experts / nranks; }
  [[nodiscard]] int rankOf(int expert) const { return expert / localExperts(); }
  [[nodiscard]] int hostOfExpert(int expert) const { return host_of[static_cast<size_t>(rankOf(expert))]; }
  [[nodiscard]] bool nodeLimited() const { return cfg.max_hosts > 0; }
  // Node-limited routing: the rank of host h that relays this rank's tokens
  // (the one with this rank's local index, modulo the host's size: DeepEP's
  // "same GPU index on every node"); on this rank's own host, this rank.
  [[nodiscard]] int relayFor(int h) const {
    const auto& rs = host_ranks[static_cast<size_t>(h)];
    return rs[static_cast<size_t>(local_index) % rs.size()];
  }
  [[nodiscard]] size_t elemBytes() const;
  [[nodiscard]] size_t rowBytes() const { return cfg.hidden * elemBytes(); }

  // The last layout (ep_layout).
  bool laid_out = false;
  size_t tokens = 0;
  std::vector<int32_t> ids;          // tokens x topk, validated
  // What this rank sends (the first hop): without node-limited routing the
  // tokens to each rank holding their experts, with it the tokens to each
  // host's relay (one copy per host).  Token indices, rank-major, ascending
  // within a rank.
  std::vector<size_t> send_counts;
  std::vector<size_t> send_order;
  std::vector<size_t> recv_rows;     // wire rows this rank's experts receive, from each rank (the last hop)
  std::vector<size_t> recv_per_expert;  // rows per local expert (all sources)
  size_t num_recv = 0;               // sum of recv_per_expert
  // Node-limited routing's relay hop: the first hop's rows arriving here from
  // each rank (hop1_rows), their top-k ids (hop1_ids, k per row, arrival
  // order), and what this rank forwards inside its host: hop2_counts rows to
  // each rank, hop2_rows the first-hop row index of each, rank-major.
  std::vector<size_t> hop1_rows;
  std::vector<int32_t> hop1_ids;
  std::vector<size_t> hop2_counts;
  std::vector<size_t> hop2_rows;

  // The last dispatch: for received wire row i (in arrival order: source rank,
  // or relay, then the sender's order), its rows of recvX in ascending expert
  // id are slots[slot_begin[i] .. slot_begin[i + 1]), and for each the
  // position j of the expert in the token's top-k list (slot_k).
  bool dispatched = false;
  std::vector<size_t> slot_begin;
  std::vector<size_t> slots;
  std::vector<int32_t> slot_k;

  // Scratch reused across calls: the wire buffers of dispatch and combine
  // (hundreds of MB for a training step's tokens).  Allocated anew per call
  // they would be fresh pages, each paying a fault and the kernel's zeroing
  // on first touch, every call (DeepEP keeps its buffers in its Buffer too).
  std::vector<uint8_t> scratch[4];
  // The pipelined exchanges (exchangeChunked): at most max_chunks batches,
  // each at least chunk_bytes of the busiest rank's sends.
  int max_chunks = 8;
  int64_t chunk_bytes = int64_t{1} << 20;
  // Combine's summation lists (ep_combine's sumRows): for each output row,
  // the input rows it adds, in the documented order.
  std::vector<size_t> sum_begin, sum_rows;

  // The last low-latency dispatch (ep_ll_dispatch): the tokens sent to each
  // rank in block order (ll_sent[q]), and for each row received (source
  // block, position) its slots in recvX (ll_slot_begin / ll_slots: index
  // into [L][nranks * max] rows, ascending expert id).
  bool ll_dispatched = false;
  std::vector<std::vector<size_t>> ll_sent;
  std::vector<size_t> ll_rows_from;   // rows received from each rank
  std::vector<size_t> ll_slot_begin;  // per received row (sources ascending, block order), prefix
  std::vector<size_t> ll_slots;
  size_t ll_tokens = 0;
};

// v's first n elements, growing v when it is shorter (never shrinking it,
// never writing the elements it keeps).
template <class T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// The ep_* primitives' aux block.
inline constexpr uint64_t kCallMagic = 0x63686f7275736570ull;  // "chorusep"
struct Call {
  uint64_t magic = kCallMagic;
  State* state = nullptr;
  // layout
  const void* topk_idx = nullptr;
  size_t tokens = 0;
  size_t* tokens_per_rank = nullptr;
  size_t* tokens_per_host = nullptr;
  size_t* tokens_per_expert = nullptr;
  size_t* recv_per_expert = nullptr;
  size_t* num_recv = nullptr;
  // dispatch
  const void* x = nullptr;
  const float* topk_weights = nullptr;
  void* recv_x = nullptr;
  float* recv_weights = nullptr;
  size_t recv_capacity = 0;
  // dispatch with fp8 codes out (chorusEpDispatchFp8): recv_x receives the
  // e4m3 codes (hidden bytes per row), recv_scales the row's float32 scales
  // (hidden / fp8Block per row; room for scales_capacity floats).
  bool fp8_out = false;
  float* recv_scales = nullptr;
  size_t scales_capacity = 0;
  // combine
  const void* expert_out = nullptr;
  const float* weights = nullptr;
  void* out = nullptr;
  // return_topk
  const float* row_values = nullptr;
  float* topk_values = nullptr;
  // low-latency dispatch (also topk_idx, tokens, x, topk_weights, recv_x,
  // recv_weights) and combine (expert_out, weights, out)
  size_t* recv_count = nullptr;
};

// Low-latency mode's block from one rank to another: a header of two
// uint64 (0 or the sender's refusal, then its rows), then room for
// ll_max_tokens wire rows (plan::ep::dispatchRowBytes each; combine: rows of
// the datatype).  A fixed-size all-to-all, so no count travels before the data.
inline constexpr size_t kLlHeader = 2 * sizeof(uint64_t);
inline constexpr uint64_t kLlRefused = 0x726566757365ull;  // "refuse"

// The Call block of args (refused unless it is one), with its state.
Result<const Call*> callOf(const Args& args);

// The router's ids (tokens x topk of cfg.index_type) checked and read into
// ids: each in [0, numExperts), none twice in a token's row (the error names
// the entry).
Status readIds(const Config& cfg, const void* topk_idx, size_t tokens, std::vector<int32_t>* ids);

// The agreement before data moves.  `mine` is this rank's verdict on its own
// arguments; `params` are values every rank must pass alike (each named in
// `names`).  Returns `mine` on a rank that failed, an error naming the first
// failing rank on the others, an error naming a differing parameter on all;
// ok only when every rank is ok and every parameter agrees.
// max_value (optional): in, this rank's value; out, the largest over the ranks.
Status agree(Context& ctx, const Status& mine, std::span<const int64_t> params = {},
             std::span<const char* const> names = {}, int64_t* max_value = nullptr);

// One all-to-all-v of rows of rowBytes bytes: send_rows[p] rows to rank p
// (packed in rank order), recv_rows[p] from rank p (packed in rank order).
// skip >= 0: the block to and from rank `skip` (this rank) is left out, its
// place in recv unwritten (the caller reads those rows from send).
Status exchangeRows(Context& ctx, const void* send, std::span<const size_t> send_rows, void* recv,
                    std::span<const size_t> recv_rows, size_t row_bytes, int skip = -1);

// Built with -DCHORUS_EP_PHASES (a measurement build: the library reads no
// environment outside its API layer), each dispatch and combine appends one
// line to /tmp/chorus-ep-phases.rank<R>: the op and the wall time (us) of
// each of its phases, for finding where a step's time goes.  Otherwise it
// costs a branch per phase.
class PhaseClock {
 public:
  PhaseClock(const char* op, int rank);
  void mark(const char* phase);  // the time since the previous mark (or the start) is `phase`'s
  ~PhaseClock();

 private:
  const char* op_;
  int rank_;
  bool on_;
  int64_t last_ = 0;
  std::string line_;
};

// Chunk c of `chunks` of a block of `rows` rows starts at row rowsBefore(rows, c, chunks).
inline size_t chunkStart(size_t rows, size_t c, size_t chunks) { return rows * c / chunks; }

// The batches a pipelined exchange takes when the busiest rank sends
// max_send_bytes (the same on every rank: the value is agree()'s maximum).
size_t chunksFor(const State& s, int64_t max_send_bytes);

// exchangeRows in `chunks` batches, pipelined: batch c carries chunk c of
// every block (chunkStart: both sides of a pair cut their block alike, as
// they agree on its rows).  prepare(c) writes chunk c of the send blocks,
// consume(c) reads chunk c of the received ones; while batch c is on the wire
// a second thread runs prepare(c + 1) and consume(c - 1) (they must touch no
// communicator).  prepare(0) runs before the first batch, consume(chunks - 1)
// after the last.  Either may be empty.
Status exchangeChunked(Context& ctx, const void* send, std::span<const size_t> send_rows, void* recv,
                       std::span<const size_t> recv_rows, size_t row_bytes, int skip, size_t chunks,
                       const std::function<void(size_t)>& prepare, const std::function<void(size_t)>& consume);

// Collective: checks and compares every rank's config.
Result<std::unique_ptr<State>> create(Communicator& comm, const Config& cfg, std::vector<int> host_ids);

}  // namespace chorus::prim::ep
