#include "prim/primitive.hpp"

#include <algorithm>

#include "comm/communicator.hpp"

namespace chorus::prim {

int Context::rank() const { return comm_->rank(); }
int Context::size() const { return comm_->size(); }

Status Context::run(std::vector<OpDesc> ops) {
  if (ops.empty()) return {};
  return comm_->submit(std::move(ops), nullptr);
}

Status Context::allReduce(const void* send, void* recv, size_t count, chorusDataType_t dtype, chorusRedOp_t op) {
  OpDesc d;
  d.coll = plan::Collective::AllReduce;
  d.send = send, d.recv = recv, d.count = count, d.dtype = dtype, d.op = op;
  return run({std::move(d)});
}

Status Context::allToAll(const void* send, void* recv, size_t count, chorusDataType_t dtype) {
  OpDesc d;
  d.coll = plan::Collective::AllToAll;
  d.send = send, d.recv = recv, d.count = count, d.dtype = dtype;
  return run({std::move(d)});
}

Status Context::allToAllV(const void* send, std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                          void* recv, std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                          chorusDataType_t dtype) {
  const auto n = static_cast<size_t>(size());
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n || recv_displs.size() != n)
    return internalError("Context::allToAllV: {} ranks but {}/{}/{}/{} counts and displacements", n,
                         send_counts.size(), send_displs.size(), recv_counts.size(), recv_displs.size());
  OpDesc d;
  d.coll = plan::Collective::AllToAllV;
  d.send = send, d.recv = recv, d.dtype = dtype;
  d.counts.assign(send_counts.begin(), send_counts.end());
  d.displs.assign(send_displs.begin(), send_displs.end());
  d.counts2.assign(recv_counts.begin(), recv_counts.end());
  d.displs2.assign(recv_displs.begin(), recv_displs.end());
  return run({std::move(d)});
}

namespace {
bool validName(std::string_view n) {
  return !n.empty() && n.size() <= 48 &&
         std::all_of(n.begin(), n.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.'; });
}
}  // namespace

Status PrimitiveRegistry::add(std::unique_ptr<Primitive> p) {
  if (p == nullptr) return invalidArgument("primitive registry: null primitive");
  if (!validName(p->name())) return invalidArgument("primitive registry: '{}' is not a primitive name ([a-z0-9_.]{{1,48}})", p->name());
  std::lock_guard l(mu_);
  for (const auto& q : prims_)
    if (q->name() == p->name()) return invalidArgument("primitive registry: '{}' is registered already", p->name());
  prims_.push_back(std::move(p));
  return {};
}

const Primitive* PrimitiveRegistry::find(std::string_view name) const {
  std::lock_guard l(mu_);
  for (const auto& p : prims_)
    if (p->name() == name) return p.get();
  return nullptr;
}

std::vector<std::string> PrimitiveRegistry::names() const {
  std::lock_guard l(mu_);
  std::vector<std::string> out;
  for (const auto& p : prims_) out.emplace_back(p->name());
  std::sort(out.begin(), out.end());
  return out;
}

PrimitiveRegistry& registry() {
  static PrimitiveRegistry* r = [] {
    auto* reg = new PrimitiveRegistry;
    (void)reg->add(makeAllToAllVDynamic());
    (void)reg->add(ep::makeEpLayout());
    (void)reg->add(ep::makeEpDispatch());
    (void)reg->add(ep::makeEpCombine());
    (void)reg->add(ep::makeEpReturnTopk());
    (void)reg->add(ep::makeEpLlDispatch());
    (void)reg->add(ep::makeEpLlCombine());
    return reg;
  }();
  return *r;
}

Status runPrimitive(Communicator& comm, std::string_view name, const Args& args) {
  const Primitive* p = registry().find(name);
  if (p == nullptr) {
    std::string list;
    for (const std::string& n : registry().names()) list += (list.empty() ? "" : ", ") + n;
    return invalidArgument("'{}' is not a registered primitive (registered: {})", name, list);
  }
  Context ctx(comm);
  Status st = p->run(ctx, args);
  return st.isOk() ? st : st.withContext(fmt::format("{}: ", p->name()));
}

}  // namespace chorus::prim
