// Primitives: operations composed of collectives, point-to-point transfers
// and local work, registered by name (MoE dispatch and combine, KV-cache
// transfers, ...).  The layer sits between the communicator (comm/) and the
// C ABI (api/): a primitive sees the communicator only through a Context,
// which issues batches of operations (OpDesc, as the API layer makes them)
// and completes each before it returns; what it does between batches is
// local work on the rank's own memory.
//
// C face: chorusPrimitive(name, args, comm, stream) (include/chorus/chorus.h)
// validates the handle and the argument block's size, finds the primitive,
// and runs it on the caller's thread (on a stream, after the stream's queued
// work).  The primitive validates the fields it reads, naming them.
//
// Adding a primitive: a class below in its own file under src/prim/ and one
// line in builtinPrimitives() (primitive.cpp); a program may also add its
// own with registry().add() (tests/unit/primitive_test.cpp does).
#pragma once

#include <chorus/chorus.h>

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/op.hpp"
#include "common/status.hpp"

namespace chorus {
class Communicator;
}

namespace chorus::prim {

// The call's arguments as the C API passed them (chorusPrimitiveArgs_t).
struct Args {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  chorusDataType_t dtype = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  int root = 0;
  std::span<const size_t> counts;  // per peer or per item, when the primitive takes them
  std::span<size_t> out_counts;    // filled by primitives that report counts (e.g. what arrived from each peer)
  void* aux = nullptr;             // a primitive-specific block (its documentation gives the layout)
  size_t aux_bytes = 0;
};

// What a primitive runs on: this rank of a communicator.
class Context {
 public:
  explicit Context(Communicator& comm) : comm_(&comm) {}
  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  // Runs ops as one batch (a group: collectives and sends/receives issued
  // together) and returns once every one has completed.
  Status run(std::vector<OpDesc> ops);
  // Conveniences over run() for the common pieces.
  Status allReduce(const void* send, void* recv, size_t count, chorusDataType_t dtype, chorusRedOp_t op);
  Status allToAll(const void* send, void* recv, size_t count, chorusDataType_t dtype);
  Status allToAllV(const void* send, std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                   void* recv, std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                   chorusDataType_t dtype);

 private:
  Communicator* comm_;
};

class Primitive {
 public:
  virtual ~Primitive() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;  // [a-z0-9_.]{1,48}
  // One line: what it does and which fields of Args it reads.
  [[nodiscard]] virtual std::string_view summary() const = 0;
  // Collective over the communicator: every rank runs it with matching
  // arguments.  Errors name the primitive and the bad field.
  virtual Status run(Context& ctx, const Args& args) const = 0;
};

class PrimitiveRegistry {
 public:
  // Fails when the name is malformed or taken.
  Status add(std::unique_ptr<Primitive> p);
  [[nodiscard]] const Primitive* find(std::string_view name) const;
  [[nodiscard]] std::vector<std::string> names() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Primitive>> prims_;
};

// The process's registry, with the built-in primitives.
PrimitiveRegistry& registry();

// Runs the primitive `name` on comm (what chorusPrimitive calls): an unknown
// name is chorusInvalidArgument listing the registered ones.
Status runPrimitive(Communicator& comm, std::string_view name, const Args& args);

// Built-in primitives (one file each).
std::unique_ptr<Primitive> makeAllToAllVDynamic();
namespace ep {  // MoE expert parallelism (prim/ep.hpp)
std::unique_ptr<Primitive> makeEpLayout();
std::unique_ptr<Primitive> makeEpDispatch();
std::unique_ptr<Primitive> makeEpCombine();
std::unique_ptr<Primitive> makeEpReturnTopk();
std::unique_ptr<Primitive> makeEpLlDispatch();
std::unique_ptr<Primitive> makeEpLlCombine();
}  // namespace ep

}  // namespace chorus::prim
