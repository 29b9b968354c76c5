// Where a job's GPUs sit in the cluster's NVLink domains.
//
// A cluster file describes whole domains (ClusterSpec::node.gpus GPUs each:
// an 8-GPU HGX board, a 72-GPU NVL72 rack).  A job need not fill them: Slurm's
// topology/block plugin allocates NVL72 racks in segments (NVIDIA recommends
// 16 trays, 64 GPUs, per rack for jobs of 128+ GPUs), and frameworks lay out
// ranks in Megatron's order (tp, cp, ep, dp, pp) so that the innermost
// process groups stay inside one domain.  A job that uses U GPUs of each
// domain is priced on the cluster it sees: domains of U GPUs with U/G of the
// domain's NICs (placedCluster), ranks filling one domain after the next.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.hpp"
#include "sim/config.hpp"

namespace chorus::sim {

struct TrainConfig;

// GPUs of each domain a training layout uses by default: the largest count
// <= the domain size that holds a whole number of each of the layout's
// process-group blocks that fit in one domain (tp, tp x cp, tp x cp x dp, the
// expert-parallel group's block), so that none of them straddles two
// domains.  The domain size itself when the blocks divide it (8-GPU nodes,
// or tp 8 on an NVL72 rack), and when the job would not fit otherwise.
int64_t alignedDomainUse(const ClusterSpec& c, const TrainConfig& k);

// The cluster a job using `used` GPUs of each domain sees (node.gpus = used,
// node.domain_gpus = the physical size, the NICs and NVSwitch reduction
// throughput scaled to the GPUs in use).  Errors name the rule: 1 <= used <=
// domain size, and domains x used >= the job's GPUs.
Result<ClusterSpec> placedCluster(const ClusterSpec& c, int64_t used, int64_t job_gpus);

// "64 of 72 GPUs in each of 4 NVLink domains" (or "8 GPUs in each of 2 ...").
std::string describePlacement(const ClusterSpec& placed, int64_t job_gpus);

}  // namespace chorus::sim
