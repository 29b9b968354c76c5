// Point-to-point operations are their own kind (issue 18 part 4), not a
// pseudo-collective whose "root" is the peer: a send or receive names its
// peer, stays out of a batch's signature, and the trace records it as a send
// to or receive from that peer, while a rooted collective in the same group
// keeps its root.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>

#include "comm/call_signature.hpp"
#include "comm/communicator.hpp"
#include "support/rank_threads.hpp"
#include "trace/analysis.hpp"

namespace chorus::testing {
namespace {

OpDesc sendTo(int peer) {
  OpDesc o;
  o.kind = OpKind::Send;
  o.count = 4;
  o.dtype = chorusInt32;
  o.peer = peer;
  return o;
}

OpDesc broadcastFrom(int root) {
  OpDesc o;
  o.coll = plan::Collective::Broadcast;
  o.count = 4;
  o.dtype = chorusInt32;
  o.root = root;
  return o;
}

TEST(PointToPoint, SignatureHoldsTheCollectivesOnly) {
  // The sends' peers differ by rank by design: batches that differ only in
  // them have one signature, that of their broadcast and its root.
  std::vector<OpDesc> a = {sendTo(1), broadcastFrom(2)}, b = {sendTo(3), broadcastFrom(2)}, c = {broadcastFrom(2)};
  const comm::Signature sa = comm::signatureOf(a, 7), sb = comm::signatureOf(b, 7), sc = comm::signatureOf(c, 7);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(sa, sc);
  EXPECT_EQ(sa.nops, 1u);
  EXPECT_EQ(sa.coll, static_cast<uint32_t>(plan::Collective::Broadcast));
  EXPECT_EQ(sa.root, 2);
  // The root is the broadcast's, never a send's peer.
  std::vector<OpDesc> d = {sendTo(2), broadcastFrom(1)};
  EXPECT_EQ(comm::signatureOf(d, 7).root, 1);
  EXPECT_NE(comm::signatureOf(d, 7), sa);
  // A group of sends alone has no collective to agree on.
  std::vector<OpDesc> p2p = {sendTo(1), sendTo(2)};
  EXPECT_EQ(comm::signatureOf(p2p, 7).nops, 0u);
  EXPECT_TRUE(sendTo(1).pointToPoint());
  EXPECT_FALSE(sendTo(1).reduces());  // whatever `coll` holds: a send combines nothing
  EXPECT_FALSE(broadcastFrom(0).pointToPoint());
  EXPECT_EQ(sendTo(1).direction(), plan::PointToPoint::Send);
}

// A ring exchange and a broadcast from rank 1 in one group, traced: each
// rank's trace holds a send to its successor and a receive from its
// predecessor (kinds kOpSend / kOpRecv, the peer in `peer`, no root), and the
// broadcast with its root; the Chrome trace names the peers.
TEST(PointToPoint, TraceNamesThePeerAndTheCollectiveItsRoot) {
  const int n = 3;
  const std::string dir = ::testing::TempDir() + "/chorus-p2p-trace-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  Config cfg;
  cfg.trace.dir = dir;
  auto msgs = runRanks(n, cfg, [&](int r, chorusComm_t comm) -> std::string {
    std::vector<int> out(16, r), in(16, -1), b(16, r == 1 ? 42 : 0);
    chorusGroupStart();
    chorusSend(out.data(), out.size(), chorusInt32, (r + 1) % n, comm, nullptr);
    chorusRecv(in.data(), in.size(), chorusInt32, (r + n - 1) % n, comm, nullptr);
    chorusBroadcast(b.data(), b.data(), b.size(), chorusInt32, 1, comm, nullptr);
    if (chorusGroupEnd() != chorusSuccess) return std::string("group: ") + chorusGetLastError(comm);
    if (in[0] != (r + n - 1) % n || b[15] != 42) return "wrong data";
    return "";
  });
  ASSERT_EQ(failures(msgs), "");
  auto comms = trace::loadTraceDir(dir);
  ASSERT_TRUE(comms.isOk()) << comms.status().message();
  ASSERT_EQ(comms->size(), 1u);
  const trace::CommTrace& t = comms->front();
  ASSERT_EQ(t.nranks, n);
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    std::map<uint8_t, const trace::OpRecord*> by_kind;
    for (const trace::OpRecord& o : t.ranks[r].file.ops) by_kind[o.coll] = &o;
    ASSERT_EQ(t.ranks[r].file.ops.size(), 3u);
    ASSERT_TRUE(by_kind.count(trace::kOpSend) && by_kind.count(trace::kOpRecv));
    const auto bcast = static_cast<uint8_t>(plan::Collective::Broadcast);
    ASSERT_TRUE(by_kind.count(bcast));
    EXPECT_EQ(by_kind[trace::kOpSend]->peer, (r + 1) % n);
    EXPECT_EQ(by_kind[trace::kOpSend]->root, 0);
    EXPECT_EQ(by_kind[trace::kOpSend]->bytes, 64u);
    EXPECT_EQ(by_kind[trace::kOpRecv]->peer, (r + n - 1) % n);
    EXPECT_EQ(by_kind[bcast]->root, 1);
    EXPECT_EQ(by_kind[bcast]->peer, -1);
    EXPECT_EQ(t.ranks[r].file.algos[by_kind[trace::kOpSend]->algo], "send");
  }
  const std::string chrome = trace::chromeTrace(*comms).dump();
  EXPECT_NE(chrome.find("\"send to 1\""), std::string::npos);
  EXPECT_NE(chrome.find("\"recv from 2\""), std::string::npos);
  EXPECT_NE(chrome.find("\"broadcast #0\""), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus::testing
