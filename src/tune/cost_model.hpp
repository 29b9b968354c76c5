// The α-β-γ cost model the tuner prices plans with.
//
// For a link (a transport: shared memory inside a host, TCP between hosts, ...) a message
// has a latency α, costs each end o of CPU time (posting, polling, matching)
// and the receiver b·β to move b bytes; reducing b bytes costs b·γ(dtype).
// A plan is priced from its rounds (plan::Round), one after another.  In a
// round every rank works through its own messages on its own core while their
// latencies overlap (they are in flight together), so a rank's time is
//   max α of its incoming messages + Σ_in (o + b·β + b·γ·[reduce](1 + [staged]))
//                                  + Σ_out o
// (a staged reduction lands in scratch first and pays one more pass over the
// bytes; a reduction straight out of the shared-memory ring pays β / 2, the
// copy in, instead of β: CostProfile::shm_ring_bytes; β and γ are the
// out-of-cache figures in proportion to how much of the call's footprint on
// the host -- input and output of its ranks, once for an in-place call --
// exceeds the last-level cache), the round lasts as long as its busiest rank, and a host whose ranks
// active in the round outnumber its cores runs them in turns (active / cores).
// For the one-message-per-rank patterns (ring, trees, recursive doubling) this
// is α + 2o + b·β (+ b·γ) per round; for the all-pairs rounds of the direct
// allreduce the n - 1 messages of a rank pay α once and o, β, γ each.
// A reduction op's Scale or Divide step (plan::Scaling) adds one pass over
// the busiest rank's region at γ.
// A one-shot plan on one host within the board's size (CostProfile::board_bytes)
// runs through the shared-memory board instead: board_call, then per rank
// its own write and n - 1 reads (β) and reductions (γ).
//
// The numbers come from a calibration profile written by chorus-tune
// (default ~/.cache/chorus/profile.json, CHORUS_TUNE_FILE overrides), or from
// built-in defaults measured on a 2-core x86 VM (docs/algorithms.md).
//
// The figures are typed (common/units.hpp): α, o and the fixed costs are
// Seconds, β and γ SecondsPerByte, so b·β is a Seconds and adding a β to an
// α does not compile.  The profile's JSON keeps its own units (alpha_us,
// bandwidth_gbps, ...).
#pragma once

#include <chorus/chorus.h>

#include <array>
#include <functional>
#include <map>
#include <cstdint>
#include <string_view>
#include <utility>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/units.hpp"
#include "plan/plan.hpp"

namespace chorus::tune {

struct LinkCost {
  Seconds alpha;               // latency of a message (overlaps with other messages in flight)
  SecondsPerByte beta;         // 1 / bandwidth while the data stay in the caches
  Seconds overhead;            // CPU time per message at each end
  SecondsPerByte beta_large;   // 1 / bandwidth beyond the caches (0: as beta)
};

// The transports a communicator's messages take, by their registered names
// (transport/registry.hpp), which key the profile's link figures: `intra`
// between ranks of one host group (host_of: the ranks a host-local transport
// such as shared memory joins), `inter` between groups.
struct Links {
  std::string intra = "shm";
  std::string inter = "tcp";
  // Every rank on this machine (tune::Topology::one_machine): the network
  // transport is loopback, so the host groups share this machine's cores and
  // cache -- ranks beyond the cores take turns and the footprint is every
  // rank's -- whatever groups the transports form (CHORUS_TRANSPORT=tcp on
  // one host: each rank a group of its own).
  bool one_machine = false;
  bool operator==(const Links&) const = default;
};
// The route of a whole communicator, which keys chorus-tune's corrections:
// links.intra when every rank is in one group (n <= 1 too), links.inter when
// each rank is a group of its own, else "<intra>+<inter>" (a mix; profiles
// written before transports had names say "mixed", read as "shm+tcp").
std::string routeKey(const std::vector<int>& host_of, const Links& links);

// A measured correction of the model for one algorithm on one kind of
// communicator: at each calibrated size (bytes = the collective's count x the
// element size, as the tuner keys calls), the time chorus-tune measured over
// the time the α-β-γ model gave for that call.  Between sizes the factor is
// interpolated linearly in log(bytes) and log(factor); beyond the ends it is
// the end's.  Communicators of another rank count or link class, and
// algorithms that were not calibrated, are priced by the model alone.
struct Correction {
  plan::Collective collective = plan::Collective::AllReduce;
  std::string algo;
  int nranks = 0;
  std::string link = "shm";  // routeKey() of the calibrated communicator
  std::vector<std::pair<double, double>> points;  // (bytes, factor), bytes strictly ascending
};

struct CostProfile {
  // α, β, o per transport, keyed by its registered name; the built-in
  // defaults carry "shm" and "tcp".  A transport the profile has no figures
  // for is priced with the figures of its kind (link()).
  std::map<std::string, LinkCost, std::less<>> links;
  // Time per byte reduced, per data type (fp16/bf16/fp8 pay the conversions).
  std::array<SecondsPerByte, chorusNumTypes> gamma{};
  Seconds op_overhead = us(1.5);  // per call: API, plan lookup, executor set-up
  // The largest input per rank a one-shot call runs through the
  // shared-memory board with (exec::kBoardBytes; 0: no board).  What the
  // library does, not a measurement: the communicator sets it, the profile's
  // JSON does not carry it.
  uint64_t board_bytes = 0;
  // A one-shot call through the shared-memory board (transport.hpp, Board;
  // board_bytes): the whole fixed cost of the call, publish and the wait
  // for running peers included, replacing op_overhead + α + o; the bytes
  // then cost β (the write into the slot and each peer's read) and γ.
  Seconds board_call = us(0.2);
  // Time per byte of a peer's slot read (and reduced: γ comes on top) on
  // the board; 0: the shm link's β.  The slots are read in place while still
  // in the writer's cache, not streamed like the ring's pieces, so this is
  // measured apart (chorus-tune: a 4 KiB against an 8-byte board call).
  SecondsPerByte board_beta;
  // Messages of the "shm" link below this size stream through the sender's
  // ring in the receiver's segment (transport/shm: every message below the
  // cross-memory-attach threshold, kCmaThreshold = CHORUS_SHM_CMA_BYTES'
  // default, 1 MiB; a pipelined plan's slices are its messages).  A copying
  // receive there is the sender's copy into the ring and the receiver's copy
  // out: the link's β, which chorus-tune measures with ring allgather rounds
  // (each rank copies every byte in and out), is those two memcpy of the same
  // bytes, half each.  A reducing receive (Round::reduce, not staged) reduces
  // straight out of the ring: it pays the copy in (β / 2) and the reduction
  // (γ), not the copy out.  What the library does, not a measurement: the
  // profile's JSON does not carry it; 0: every receive pays β.
  uint64_t shm_ring_bytes = uint64_t{1} << 20;
  // Calls whose buffers (input and output of every rank of a host) exceed the
  // last-level cache move bytes at beta_large and reduce no faster than
  // reduce_mem (fp32, out of the caches); in between, in proportion: the
  // share cache_size / footprint of the bytes at the in-cache rates.  The
  // nominal last-level cache by default; chorus-tune measures the effective
  // one (effectiveCacheBytes), which the ranks' other data (rings, slots,
  // the neighbours of a shared host) leave smaller.
  Bytes cache_size = mib(32);
  SecondsPerByte reduce_mem;  // 0: no out-of-cache floor
  // Cores per host: when a round puts more messages on a host than it has
  // cores, they take turns (8 ranks on 2 cores).
  int cores = 1;
  // chorus-tune's measured corrections (empty: the model alone).
  std::vector<Correction> corrections;
  std::string source = "built-in defaults";
  // chorus-tune's record of the run: when (UTC, ISO 8601), how many passes of
  // the figures it took until two agreed, and the figures that still moved
  // when they never did (empty: they agreed).
  std::string measured_at;
  int passes = 0;
  std::vector<std::string> unstable;

  // The figures of transport `name`; without any, this profile's "shm"
  // (host_local) or "tcp" figures: the same kind of link on this machine.
  [[nodiscard]] const LinkCost& link(std::string_view name, bool host_local) const;
  // The factor for a call (1 when nothing was calibrated for it); link: routeKey().
  [[nodiscard]] double correctionFor(plan::Collective c, std::string_view algo, int nranks, std::string_view link,
                                     double bytes) const;
  // Adds c, replacing an entry with the same collective, algorithm, ranks and link.
  void setCorrection(Correction c);

  CostProfile();
  // Parses a profile written by chorus-tune; errors name the key.
  static Result<CostProfile> fromJson(const std::string& text);
  [[nodiscard]] std::string toJson() const;
  // The profile at path (Config::tune.profile_path: CHORUS_TUNE_FILE, else
  // ~/.cache/chorus/profile.json), else the defaults: "" or a missing file.
  // A file that exists but does not parse is an error naming it.
  static Result<CostProfile> load(const std::string& path);
};

// The effective cache from one measurement: every local rank at once reduces
// fp32 operands whose footprint on the host (input and output of every rank)
// is `nominal`, at `rate_at_nominal` bytes of one operand per second; the
// in-cache rate (γ) is `rate_hot`, the out-of-cache one (reduce_mem)
// `rate_cold`.  The model prices such a call as the share cache / footprint
// of its bytes at the hot rate and the rest at the cold one, so the share
// that reproduces the measured time, times `nominal`, is the cache the model
// should use.  Clamped to [nominal / 16, nominal]: a rate at or above the hot
// one is the whole cache; one at or below the cold one, a sixteenth.
Bytes effectiveCacheBytes(Bytes nominal, double rate_at_nominal, double rate_hot, double rate_cold);

// host_of[r]: an identifier of rank r's host group (ranks with equal ids
// share memory); links: the transports within and between groups.
// The model's time times the profile's measured correction for the call.
Result<Seconds> predictSeconds(const plan::Algorithm& algo, const plan::Shape& shape, chorusDataType_t dtype,
                               const CostProfile& prof, const std::vector<int>& host_of, const Links& links = {});
// The α-β-γ model alone, without the measured correction (what chorus-tune
// divides its measurements by).
Result<Seconds> modelSeconds(const plan::Algorithm& algo, const plan::Shape& shape, chorusDataType_t dtype,
                             const CostProfile& prof, const std::vector<int>& host_of, const Links& links = {});

}  // namespace chorus::tune
