// chorus-bench dispatch | combine: MoE token dispatch and combine (docs/ep.md)
// measured the way chorus-bench measures a collective, next to the same
// exchange written as all-to-all-v.
//
// Two formulations of one MoE layer's communication, run in turn (paired) at
// each repeat so that both see the same machine:
//
//   ep         chorusEpLayout + chorusEpDispatch (dispatch), chorusEpCombine
//              (combine): one row per (token, rank) -- or with node-limited
//              routing one per (token, host) across the network -- plus the
//              ids and weights;
//   alltoallv  what a framework without an EP call writes (Megatron's
//              "alltoall" token dispatcher, torch's all_to_all_single with
//              splits): the per-(rank, local expert) counts exchanged with
//              chorusAllToAll, the rows permuted by expert (one row per
//              (token, expert)), chorusAllToAllV of the rows and of the
//              weights, and the received rows sorted into expert-major order;
//              combine is the reverse, the weighted sum at home.
//
// Both produce the same recvX (expert-major, then source rank, then token)
// and the same combined output (up to the rounding of the partial sums), which
// -c 1 checks against a reference each rank computes on its own from the
// routing and the inputs of every rank (both are derived from a hash, so a
// rank knows its peers' tokens without a message).
//
// The routing is uniform: each token picks `topk` distinct experts out of
// `experts`, or with --max-hosts M first M distinct hosts, then its experts
// among those hosts' experts (group-limited gating).  Hosts are the
// communicator's (chorusEpGetInfo), assumed to be equal groups of consecutive
// ranks (chorus-run per netns host, CHORUS_HOST_ID = rank / K); a placement
// that is not is refused.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace chorus::tools::bench {

enum class EpForm : uint8_t { Ep, AllToAllV };
const char* epFormName(EpForm f);

struct EpBenchOptions {
  bool combine = false;  // false: time layout + dispatch; true: time combine
  size_t tokens = 4096;  // per rank
  size_t hidden = 7168;
  int experts = 64;
  int topk = 8;
  int max_hosts = 0;                    // node-limited routing: 0 off
  chorusDataType_t dtype = chorusBfloat16;
  int compress = CHORUS_COMPRESS_OFF;  // -d fp8: bf16 data, fp8 dispatch wire (ep only)
  std::vector<EpForm> forms = {EpForm::Ep, EpForm::AllToAllV};
  int iters = 5, warmup = 1;
  int repeats = 1;       // rounds of (every form in turn), each printed
  bool check = true;
  int average = 3;       // as chorus-bench -a
  uint64_t seed = 1;
  std::string json_path;
  chorusComm_t bookkeeping = nullptr;  // the bench's own barriers and timing reductions
};

// The routing of token `t` of rank `rank`: `topk` distinct expert ids written
// to ids (uniform; with max_hosts > 0 within max_hosts distinct hosts of
// `nhosts` equal groups of consecutive experts).  Pure: any rank can compute
// any rank's routing.
void epRoute(uint64_t seed, int rank, size_t t, int experts, int topk, int nhosts, int max_hosts, int32_t* ids);
// The gate weight of (rank, t, j): (1 + h % 8) / 8, exact in float32.
float epWeight(uint64_t seed, int rank, size_t t, int j);
// Element i of token t of rank `rank`: an integer in -8..7 (exact in bf16 and
// in fp8 e4m3 after scaling), from a hash of (rank, t, i / 16).
float epValue(uint64_t seed, int rank, size_t t, size_t i);

// Runs as one rank of comm; rank 0 prints the table.  Returns the total
// number of wrong elements (all ranks), or the first error.
Result<uint64_t> runEpBench(const EpBenchOptions& o, chorusComm_t comm, std::FILE* out);

}  // namespace chorus::tools::bench
