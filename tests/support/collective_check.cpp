#include "support/collective_check.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>

#include "kernels/dtype.hpp"

namespace chorus::testing {
namespace {

constexpr Coll kAll[] = {Coll::AllReduce, Coll::Broadcast, Coll::Reduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll,
                         Coll::AllGatherV, Coll::AllToAllV, Coll::Gather, Coll::Scatter, Coll::SendRecv, Coll::Barrier};

bool isSigned(chorusDataType_t d) { return d == chorusInt8 || d == chorusInt32 || d == chorusInt64; }
bool isInt(chorusDataType_t d) { return !kernels::isFloatType(d); }
size_t esize(chorusDataType_t d) { return kernels::dtypeSize(d); }
uint64_t mask(chorusDataType_t d) { return esize(d) == 8 ? ~0ull : ((1ull << (8 * esize(d))) - 1); }

// Raw integer bits of an element (zero-extended).
uint64_t loadBits(const void* p, chorusDataType_t d) {
  uint64_t v = 0;
  std::memcpy(&v, p, esize(d));  // little endian
  return v;
}
int64_t signExtend(uint64_t v, chorusDataType_t d) {
  const int bits = static_cast<int>(8 * esize(d));
  if (bits == 64) return static_cast<int64_t>(v);
  const uint64_t sign = 1ull << (bits - 1);
  return static_cast<int64_t>((v ^ sign) - sign);
}

// The input value of rank r, element i, before it is stored in the type.
double inputValue(const Case& c, int r, size_t i) {
  if (c.op == chorusProd) {
    if (isInt(c.dtype)) return static_cast<double>((r + i) % 3 + 1);
    return ((r * 5 + i) % 4 == 0) ? -1.0 : ((i % 7 == 0 && r < 3) ? 2.0 : 1.0);
  }
  double v = static_cast<double>((r * 31 + i * 17) % 23);
  return isSigned(c.dtype) || !isInt(c.dtype) ? v - 11 : v;
}

void fillInput(const Case& c, int r, std::byte* p, size_t n, size_t offset = 0) {
  for (size_t i = 0; i < n; ++i) {
    double v = inputValue(c, r, offset + i);
    if (isInt(c.dtype)) {
      uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(v)) & mask(c.dtype);
      std::memcpy(p + i * esize(c.dtype), &bits, esize(c.dtype));
    } else {
      kernels::storeFromDouble(p + i * esize(c.dtype), c.dtype, v);
    }
  }
}

// Reference for one element of a reduction over ranks 0..n-1 of input
// element idx.  Returns the expected value: bits for integers, a double
// and a tolerance for floats.
struct Expect {
  uint64_t bits = 0;
  double value = 0, tol = 0;
};

double epsOf(chorusDataType_t d) {
  switch (d) {
    case chorusFloat16: return std::ldexp(1.0, -10);
    case chorusBfloat16: return std::ldexp(1.0, -7);
    case chorusFloat8e4m3: return std::ldexp(1.0, -3);
    case chorusFloat8e5m2: return std::ldexp(1.0, -2);
    case chorusFloat32: return std::ldexp(1.0, -23);
    default: return std::ldexp(1.0, -52);
  }
}

Expect reduceRef(const Case& c, int n, size_t idx) {
  Expect e;
  const chorusDataType_t d = c.dtype;
  std::byte tmp[8];
  if (isInt(d)) {
    uint64_t acc = 0;
    for (int r = 0; r < n; ++r) {
      fillInput(c, r, tmp, 1, idx);
      uint64_t x = loadBits(tmp, d);
      if (c.op == chorusNumOps) x = (x * 2) & mask(d);  // PreMulSum with scalar 2
      if (r == 0) {
        acc = x;
        continue;
      }
      switch (c.op) {
        case chorusProd: acc = (acc * x) & mask(d); break;
        case chorusMax:
          acc = isSigned(d) ? (signExtend(x, d) > signExtend(acc, d) ? x : acc) : std::max(acc, x);
          break;
        case chorusMin:
          acc = isSigned(d) ? (signExtend(x, d) < signExtend(acc, d) ? x : acc) : std::min(acc, x);
          break;
        default: acc = (acc + x) & mask(d); break;  // Sum, Avg
      }
    }
    if (c.op == chorusAvg) {
      if (isSigned(d))
        acc = static_cast<uint64_t>(signExtend(acc, d) / n) & mask(d);
      else
        acc = acc / static_cast<uint64_t>(n);
    }
    e.bits = acc;
    return e;
  }
  double acc = 0, mag = 0;
  for (int r = 0; r < n; ++r) {
    fillInput(c, r, tmp, 1, idx);
    double x = kernels::loadAsDouble(tmp, d);
    if (c.op == chorusNumOps) x *= 2.0;  // PreMulSum with scalar 2
    mag += std::fabs(x);
    if (r == 0) {
      acc = x;
      continue;
    }
    switch (c.op) {
      case chorusProd: acc *= x; break;
      case chorusMax: acc = std::max(acc, x); break;
      case chorusMin: acc = std::min(acc, x); break;
      default: acc += x; break;
    }
  }
  if (c.op == chorusAvg) {
    acc /= n;
    mag /= n;
  }
  e.value = acc;
  // Partial sums round at every step in the narrow types (in whatever order
  // the algorithm chose); integers in fp32/fp64 are exact.
  e.tol = (c.op == chorusSum || c.op == chorusAvg || c.op == chorusNumOps) ? epsOf(d) * mag * (n + 1) : epsOf(d) * std::fabs(acc);
  if (d == chorusFloat32 || d == chorusFloat64) e.tol = c.op == chorusAvg ? epsOf(d) * std::fabs(acc) * 2 : 0;
  return e;
}

// Checks output element at p against e.
bool matches(const Case& c, const std::byte* p, const Expect& e, std::string* why) {
  if (isInt(c.dtype)) {
    uint64_t got = loadBits(p, c.dtype);
    if (got == e.bits) return true;
    *why = fmt::format("got {} expected {}", signExtend(got, c.dtype), signExtend(e.bits, c.dtype));
    return false;
  }
  double got = kernels::loadAsDouble(p, c.dtype);
  if (std::fabs(got - e.value) <= e.tol) return true;
  *why = fmt::format("got {} expected {} (tolerance {})", got, e.value, e.tol);
  return false;
}

// Exact check of a moved (not reduced) element: it must equal what rank src
// stored at its input element idx.
bool movedMatches(const Case& c, const std::byte* p, int src, size_t idx, std::string* why) {
  std::byte want[8];
  fillInput(c, src, want, 1, idx);
  if (std::memcmp(p, want, esize(c.dtype)) == 0) return true;
  *why = fmt::format("holds bits {:#x} but rank {}'s input element {} is {:#x}", loadBits(p, c.dtype), src, idx,
                     loadBits(want, c.dtype));
  return false;
}

}  // namespace

const char* collName(Coll c) {
  static const char* names[] = {"allreduce", "broadcast", "reduce",  "allgather", "reducescatter", "alltoall",
                                "allgatherv", "alltoallv", "gather", "scatter",   "sendrecv",      "barrier"};
  return names[static_cast<int>(c)];
}
bool collHasOp(Coll c) { return c == Coll::AllReduce || c == Coll::Reduce || c == Coll::ReduceScatter; }
bool collHasRoot(Coll c) { return c == Coll::Broadcast || c == Coll::Reduce || c == Coll::Gather || c == Coll::Scatter; }

std::string Case::name() const {
  std::string opname = op == chorusNumOps ? "premulsum" : fmt::format("op{}", static_cast<int>(op));
  return fmt::format("{}/{}/{}/n{}/root{}/{}", collName(coll), kernels::dtypeName(dtype), opname, count, root,
                     inplace ? "inplace" : "outofplace");
}

std::string runCase(chorusComm_t comm, const Case& c, chorusStream_t stream, DeviceMirror* mirror) {
  int n = 0, r = 0;
  chorusCommCount(comm, &n);
  chorusCommUserRank(comm, &r);
  const size_t es = esize(c.dtype);
  const size_t cnt = c.count;
  // Sizes of this rank's buffers (elements).
  size_t in_n = cnt, out_n = cnt;
  std::vector<size_t> vcounts(n), vdispls(n), scounts(n), sdispls(n), rcounts(n), rdispls(n);
  auto sendAmount = [&](int from, int to) { return (cnt + static_cast<size_t>(from) * 3 + static_cast<size_t>(to)) % 5; };
  switch (c.coll) {
    case Coll::AllGather: out_n = cnt * n; break;
    case Coll::ReduceScatter: in_n = cnt * n; break;
    case Coll::AllToAll: in_n = out_n = cnt * n; break;
    case Coll::Gather: out_n = cnt * n; break;
    case Coll::Scatter: in_n = cnt * n; break;
    case Coll::AllGatherV: {
      size_t off = 0;
      for (int i = 0; i < n; ++i) {
        vcounts[i] = (cnt + i) % 4 + (i == 0 ? cnt : 0);
        vdispls[i] = off;
        off += vcounts[i] + 1;
      }
      in_n = vcounts[r];
      out_n = off;
      break;
    }
    case Coll::AllToAllV: {
      size_t so = 0, ro = 0;
      for (int p = 0; p < n; ++p) {
        scounts[p] = sendAmount(r, p);
        sdispls[p] = so;
        so += scounts[p];
        rcounts[p] = sendAmount(p, r);
        rdispls[p] = ro;
        ro += rcounts[p] + 2;
      }
      in_n = so;
      out_n = ro;
      break;
    }
    default: break;
  }
  std::vector<std::byte> inbuf(std::max<size_t>(in_n, 1) * es), outbuf(std::max<size_t>(out_n, 1) * es);
  // Poison the output so that unwritten elements are caught.
  std::memset(outbuf.data(), 0xA5, outbuf.size());
  const bool root_side = !collHasRoot(c.coll) || r == c.root;
  // Input: for gather-type in-place, the rank's input is its slot of the output.
  std::byte* sendp = inbuf.data();
  std::byte* recvp = outbuf.data();
  if (c.coll == Coll::AllGatherV) {
    fillInput(c, r, inbuf.data(), in_n);
  } else if (c.coll == Coll::AllToAllV) {
    for (int p = 0; p < n; ++p) fillInput(c, r, inbuf.data() + sdispls[p] * es, scounts[p], sdispls[p]);
  } else {
    fillInput(c, r, inbuf.data(), in_n);
  }
  if (c.inplace) {
    switch (c.coll) {
      case Coll::AllReduce:
      case Coll::Broadcast:
      case Coll::Reduce:
      case Coll::AllToAll:
        outbuf.resize(std::max(in_n, out_n) * es);
        std::memcpy(outbuf.data(), inbuf.data(), in_n * es);
        sendp = recvp = outbuf.data();
        break;
      case Coll::AllGather:
      case Coll::Gather:
        if (!root_side && c.coll == Coll::Gather) break;
        std::memcpy(outbuf.data() + r * cnt * es, inbuf.data(), cnt * es);
        sendp = outbuf.data() + r * cnt * es;
        break;
      case Coll::AllGatherV:
        std::memcpy(outbuf.data() + vdispls[r] * es, inbuf.data(), in_n * es);
        sendp = outbuf.data() + vdispls[r] * es;
        break;
      case Coll::ReduceScatter:
        recvp = inbuf.data() + r * cnt * es;
        break;
      case Coll::Scatter:
        if (root_side) recvp = inbuf.data() + r * cnt * es;
        break;
      default: break;
    }
  }

  chorusRedOp_t op = c.op;
  if (c.op == chorusNumOps) {
    std::byte two[8];
    kernels::storeFromDouble(two, c.dtype, 2.0);
    if (chorusRedOpCreatePreMulSum(&op, two, c.dtype, chorusScalarHostImmediate, comm) != chorusSuccess)
      return fmt::format("chorusRedOpCreatePreMulSum failed: {}", chorusGetLastError(comm));
  }
  // Host pointers (checked below) and the pointers the call gets.
  std::byte* const host_recvp = recvp;
  if (mirror != nullptr) {
    std::byte* dev_in = static_cast<std::byte*>(mirror->upload(inbuf.data(), inbuf.size()));
    std::byte* dev_out = static_cast<std::byte*>(mirror->upload(outbuf.data(), outbuf.size()));
    auto translate = [&](std::byte* p) -> std::byte* {
      if (p >= inbuf.data() && p < inbuf.data() + inbuf.size()) return dev_in + (p - inbuf.data());
      return dev_out + (p - outbuf.data());
    };
    sendp = translate(sendp);
    recvp = translate(recvp);
  }
  chorusResult_t res = chorusSuccess;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  switch (c.coll) {
    case Coll::AllReduce: res = chorusAllReduce(sendp, recvp, cnt, c.dtype, op, comm, stream); break;
    case Coll::Broadcast: res = chorusBroadcast(sendp, recvp, cnt, c.dtype, c.root, comm, stream); break;
    case Coll::Reduce: res = chorusReduce(sendp, recvp, cnt, c.dtype, op, c.root, comm, stream); break;
    case Coll::AllGather: res = chorusAllGather(sendp, recvp, cnt, c.dtype, comm, stream); break;
    case Coll::ReduceScatter: res = chorusReduceScatter(sendp, recvp, cnt, c.dtype, op, comm, stream); break;
    case Coll::AllToAll: res = chorusAllToAll(sendp, recvp, cnt, c.dtype, comm, stream); break;
    case Coll::AllGatherV:
      res = chorusAllGatherV(sendp, in_n, recvp, vcounts.data(), vdispls.data(), c.dtype, comm, stream);
      break;
    case Coll::AllToAllV:
      res = chorusAllToAllV(sendp, scounts.data(), sdispls.data(), recvp, rcounts.data(), rdispls.data(), c.dtype, comm,
                            stream);
      break;
    case Coll::Gather: res = chorusGather(sendp, recvp, cnt, c.dtype, c.root, comm, stream); break;
    case Coll::Scatter: res = chorusScatter(sendp, recvp, cnt, c.dtype, c.root, comm, stream); break;
    case Coll::SendRecv:
      // A ring shift inside a group: receive posted before send on purpose.
      chorusGroupStart();
      chorusRecv(recvp, cnt, c.dtype, prev, comm, stream);
      chorusSend(sendp, cnt, c.dtype, next, comm, stream);
      res = chorusGroupEnd();
      break;
    case Coll::Barrier: res = chorusBarrier(comm, stream); break;
  }
  if (res == chorusSuccess && stream) res = chorusStreamSynchronize(stream);
  if (c.op == chorusNumOps) chorusRedOpDestroy(op, comm);
  if (res != chorusSuccess) {
    if (mirror != nullptr) mirror->clear();
    return fmt::format("{}: returned {}: {}", c.name(), static_cast<int>(res), chorusGetLastError(comm));
  }
  if (mirror != nullptr) {
    std::string err = mirror->download();
    mirror->clear();
    if (!err.empty()) return fmt::format("{}: {}", c.name(), err);
  }

  std::string why;
  auto bad = [&](size_t i, const std::string& w) { return fmt::format("{}: rank {} element {}: {}", c.name(), r, i, w); };
  const std::byte* o = host_recvp;
  switch (c.coll) {
    case Coll::AllReduce:
      for (size_t i = 0; i < cnt; ++i)
        if (!matches(c, o + i * es, reduceRef(c, n, i), &why)) return bad(i, why);
      break;
    case Coll::Reduce:
      if (r == c.root)
        for (size_t i = 0; i < cnt; ++i)
          if (!matches(c, o + i * es, reduceRef(c, n, i), &why)) return bad(i, why);
      break;
    case Coll::ReduceScatter:
      for (size_t i = 0; i < cnt; ++i)
        if (!matches(c, o + i * es, reduceRef(c, n, r * cnt + i), &why)) return bad(i, why);
      break;
    case Coll::Broadcast:
      for (size_t i = 0; i < cnt; ++i)
        if (!movedMatches(c, o + i * es, c.root, i, &why)) return bad(i, why);
      break;
    case Coll::AllGather:
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < cnt; ++i)
          if (!movedMatches(c, o + (j * cnt + i) * es, j, i, &why)) return bad(j * cnt + i, why);
      break;
    case Coll::Gather:
      if (r == c.root)
        for (int j = 0; j < n; ++j)
          for (size_t i = 0; i < cnt; ++i)
            if (!movedMatches(c, o + (j * cnt + i) * es, j, i, &why)) return bad(j * cnt + i, why);
      break;
    case Coll::AllToAll:
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < cnt; ++i)
          if (!movedMatches(c, o + (j * cnt + i) * es, j, r * cnt + i, &why)) return bad(j * cnt + i, why);
      break;
    case Coll::Scatter:
      for (size_t i = 0; i < cnt; ++i)
        if (!movedMatches(c, o + i * es, c.root, r * cnt + i, &why)) return bad(i, why);
      break;
    case Coll::AllGatherV:
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < vcounts[j]; ++i)
          if (!movedMatches(c, o + (vdispls[j] + i) * es, j, i, &why)) return bad(vdispls[j] + i, why);
      break;
    case Coll::AllToAllV:
      for (int j = 0; j < n; ++j) {
        // Rank j's block for r sits at j's send displacement for r.
        size_t jdispl = 0;
        for (int p = 0; p < r; ++p) jdispl += sendAmount(j, p);
        for (size_t i = 0; i < rcounts[j]; ++i)
          if (!movedMatches(c, o + (rdispls[j] + i) * es, j, jdispl + i, &why)) return bad(rdispls[j] + i, why);
      }
      break;
    case Coll::SendRecv:
      for (size_t i = 0; i < cnt; ++i)
        if (!movedMatches(c, o + i * es, prev, i, &why)) return bad(i, why);
      break;
    case Coll::Barrier: break;
  }
  return "";
}

std::vector<Case> standardCases(int nranks, const std::vector<size_t>& counts, bool all_dtypes) {
  std::vector<Case> out;
  const chorusDataType_t dtypes[] = {chorusInt8,    chorusUint8,   chorusInt32,    chorusUint32,
                                     chorusInt64,   chorusUint64,  chorusFloat16,  chorusBfloat16,
                                     chorusFloat32, chorusFloat64, chorusFloat8e4m3, chorusFloat8e5m2};
  const chorusRedOp_t ops[] = {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg, static_cast<chorusRedOp_t>(chorusNumOps)};
  for (Coll coll : kAll) {
    for (chorusDataType_t d : dtypes) {
      if (!all_dtypes && d != chorusFloat32) continue;
      for (chorusRedOp_t op : ops) {
        if (!collHasOp(coll) && op != chorusSum) continue;
        if (!all_dtypes && op != chorusSum) continue;
        for (size_t cnt : counts) {
          for (bool inplace : {false, true}) {
            if (inplace && (coll == Coll::AllToAllV || coll == Coll::SendRecv || coll == Coll::Barrier)) continue;
            if (coll == Coll::Barrier && (cnt != counts.front() || d != chorusFloat32)) continue;
            Case c{coll, d, op, cnt, collHasRoot(coll) ? (nranks > 1 ? nranks - 1 : 0) : 0, inplace};
            out.push_back(c);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace chorus::testing
