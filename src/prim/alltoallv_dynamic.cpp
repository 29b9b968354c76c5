// "alltoallv_dynamic": an all-to-all whose receive counts the receiver does
// not know in advance, the communication of a mixture-of-experts token
// dispatch: each rank says how many elements it sends to each peer, the ranks
// exchange those counts (one all-to-all of n words), and then the data moves
// in one all-to-all-v into the receiver's buffer, packed in peer order.
//
// Args: send (the elements for peer 0, then peer 1, ..., packed), counts (n
// send counts, elements), dtype, recv (room for `count` elements),
// out_counts (n entries: what arrived from each peer).  Every rank learns
// whether some rank's receive would overflow its `count` before any data
// moves, so a too-small buffer fails the call on every rank alike instead of
// leaving the ranks out of step.
#include <numeric>

#include "common/dtype.hpp"
#include "prim/primitive.hpp"

namespace chorus::prim {
namespace {

class AllToAllVDynamic final : public Primitive {
 public:
  std::string_view name() const override { return "alltoallv_dynamic"; }
  std::string_view summary() const override {
    return "all-to-all-v whose receive counts come from the senders (MoE dispatch): reads send, counts[n], "
           "datatype, recvbuff with room for count elements; writes outCounts[n]";
  }

  Status run(Context& ctx, const Args& a) const override {
    const auto n = static_cast<size_t>(ctx.size());
    if (a.counts.size() != n) return invalidArgument("counts has {} entries; it needs one per rank ({})", a.counts.size(), n);
    if (a.out_counts.size() != n)
      return invalidArgument("outCounts has {} entries; it needs one per rank ({})", a.out_counts.size(), n);
    if (!isValidDtype(static_cast<int>(a.dtype))) return invalidArgument("datatype {} is not a chorusDataType_t", static_cast<int>(a.dtype));
    std::vector<uint64_t> sc(n), rc(n);
    uint64_t sent = 0;
    for (size_t i = 0; i < n; ++i) {
      sc[i] = a.counts[i];
      if (sc[i] > (uint64_t{1} << 48)) return invalidArgument("counts[{}]={} is beyond 2^48 elements", i, sc[i]);
      sent += sc[i];
    }
    if (sent > 0 && a.send == nullptr) return invalidArgument("send is NULL but counts add up to {} elements", sent);
    CHORUS_RETURN_IF_ERROR(ctx.allToAll(sc.data(), rc.data(), 1, chorusUint64));
    const uint64_t arriving = std::accumulate(rc.begin(), rc.end(), uint64_t{0});
    // Every rank learns whether any receive overflows, and the first rank
    // that would, before data moves.
    const bool mine = arriving > a.count || (arriving > 0 && a.recv == nullptr);
    double over = mine ? static_cast<double>(n - static_cast<size_t>(ctx.rank())) : 0.0;
    CHORUS_RETURN_IF_ERROR(ctx.allReduce(&over, &over, 1, chorusFloat64, chorusMax));
    if (mine)
      return invalidArgument("{} elements arrive at rank {} but recvbuff has room for count={}", arriving, ctx.rank(), a.count);
    if (over > 0)
      return invalidArgument("rank {}'s receive does not fit its recvbuff (count); no data moved",
                             n - static_cast<size_t>(over));
    std::vector<size_t> scount(n), sdisp(n), rcount(n), rdisp(n);
    size_t s_at = 0, r_at = 0;
    for (size_t i = 0; i < n; ++i) {
      scount[i] = sc[i], sdisp[i] = s_at, s_at += sc[i];
      rcount[i] = rc[i], rdisp[i] = r_at, r_at += rc[i];
    }
    CHORUS_RETURN_IF_ERROR(ctx.allToAllV(a.send, scount, sdisp, a.recv, rcount, rdisp, a.dtype));
    for (size_t i = 0; i < n; ++i) a.out_counts[i] = rc[i];
    return {};
  }
};

}  // namespace

std::unique_ptr<Primitive> makeAllToAllVDynamic() { return std::make_unique<AllToAllVDynamic>(); }

}  // namespace chorus::prim
