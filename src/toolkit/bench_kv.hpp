// chorus-bench kv: KV-cache block transfers between two agents of the KV
// engine (docs/kv.md), measured the way chorus-bench measures a collective.
//
// The job has two ranks: rank 0's agent ("kv0", the prefill side) moves
// batches of paged KV blocks to or from rank 1's agent ("kv1", the decode
// side); the communicator only carries the store's id, the barriers between
// rows and the check's count.  Each row is one (block size, layout, op):
//
//   block size  a block's whole KV (every layer, K and V): the sizes -b..-e;
//   blocks      --blocks per batch (one request's pages);
//   layout      layer-major (one descriptor per (layer, plane, block): 2 x
//               --layers pieces of block/(2 x layers) bytes) or block-major
//               (one descriptor per block), the same on both sides
//               (prim/kv.hpp kvBlockDescs);
//   op          write (rank 0 pushes into rank 1's cache) or read (rank 0
//               pulls from rank 1's cache), one notification per batch.
//
// The batch's blocks are blocks 0..n-1 of rank 0's pool and n scattered,
// reversed blocks of rank 1's (pool block 2(n-1-i)+1), so that no two
// pieces merge: a paged cache's blocks are rarely neighbours.  Time per batch
// is from the post to the origin's completion (which, with the notification,
// includes the round trip that tells the target).  -c 1 fills the source with
// a pattern of the row, clears the destination, and checks every byte of the
// destination pool after the row: each moved block equal to its source
// block, every other byte still zero.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace chorus::tools::bench {

struct KvBenchOptions {
  std::vector<uint64_t> block_bytes;  // the sizes -b..-e: bytes of one block (all layers, K and V)
  uint64_t blocks = 64;               // --blocks: blocks per batch
  uint32_t layers = 32;               // --layers
  // --tp-prefill, --tp-decode: the TP degree of rank 0's side (kv0) and rank
  // 1's (kv1).  Each agent's pool holds its side's TP ranks' regions, and a
  // batch is every (source rank, destination rank) pair's descriptors for
  // the heads they share (kv_layout's conversion: split or merged heads).
  uint32_t tp_prefill = 1, tp_decode = 1;
  std::vector<int> layouts = {0, 1};  // --layout: 0 layer-major, 1 block-major
  std::vector<bool> writes = {true, false};  // --kv-op: write, read
  int iters = 20, warmup = 5;
  bool check = true;
  std::string json_path;
};

// Runs as one of the two ranks of comm; rank 0 prints the table.  Returns
// the number of wrong bytes (both ranks), or the first error.
Result<uint64_t> runKvBench(const KvBenchOptions& o, chorusComm_t comm, std::FILE* out);

}  // namespace chorus::tools::bench
