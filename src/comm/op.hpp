// An operation as the communicator runs it: one user-level call, validated
// by the API layer, and the reduction ops made with chorusRedOpCreatePreMulSum.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/reduction.hpp"
#include "common/wire_format.hpp"
#include "plan/plan.hpp"

namespace chorus {

// What an operation is: a collective (of all ranks, `coll`), or one side of
// a point-to-point transfer with `peer` (not a collective: no root, no plan,
// no signature; see plan::PointToPoint).
enum class OpKind : uint8_t { Collective, Send, Recv };

// One user-level operation, validated by the API layer.
struct OpDesc {
  OpKind kind = OpKind::Collective;
  plan::Collective coll = plan::Collective::AllReduce;  // kind == Collective
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  chorusDataType_t dtype = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  int root = 0;              // a rooted collective's root
  int peer = -1;             // a Send's or Recv's peer
  std::vector<size_t> counts, displs, counts2, displs2;  // v-collectives (owned copies)
  int64_t enqueue_ns = 0;    // with CHORUS_TRACE: when the user called (trace clock)
  uint64_t trace_seq = 0;    // set as the batch starts (Health::begin): the flight number, or a point-to-point number
  // Compressed collectives: the wire format (resolved and validated by the API
  // layer, src/api/compress.cpp); unset: uncompressed.
  std::optional<WireFormat> wire;

  [[nodiscard]] bool pointToPoint() const { return kind != OpKind::Collective; }
  // Send or Recv (pointToPoint() only).
  [[nodiscard]] plan::PointToPoint direction() const {
    return kind == OpKind::Send ? plan::PointToPoint::Send : plan::PointToPoint::Recv;
  }
  // A collective that combines values (point-to-point operations never do).
  [[nodiscard]] bool reduces() const { return kind == OpKind::Collective && plan::reduces(coll); }
};

// A user-defined reduction (chorusRedOpCreatePreMulSum).
struct PreMulSumOp {
  Scalar scalar;
  const void* device_scalar = nullptr;  // read at each call when set
  bool live = false;
};

}  // namespace chorus
