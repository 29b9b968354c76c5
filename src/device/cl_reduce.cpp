// OpenCL reduction kernels (cl_reduce.hpp).
#include "device/cl_reduce.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <utility>

#include "common/dtype.hpp"

#ifdef CHORUS_HAVE_OPENCL
#include <CL/cl.h>
#endif

namespace chorus::device {
namespace {

// The conversions of kernels/convert.hpp, in OpenCL C: the same bit
// manipulation, the format's parameters as arguments (constants at each call,
// folded by the compiler).
constexpr const char* kConvert = R"CL(
uint narrow_to_float_bits(uint v, int E, int M, int FN) {
  const int bias = (1 << (E - 1)) - 1;
  const uint expmax = (1u << E) - 1u, manmask = (1u << M) - 1u;
  const uint sign = ((v >> (E + M)) & 1u) << 31;
  const uint ex = (v >> M) & expmax;
  uint man = v & manmask;
  if (FN) {
    if (ex == expmax && man == manmask) return sign | 0x7fc00000u;
  } else if (ex == expmax) {
    return man == 0u ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (man << (23 - M)));
  }
  if (ex == 0u) {
    if (man == 0u) return sign;
    int e = 1 - bias;
    while ((man & (1u << M)) == 0u) { man <<= 1; --e; }
    man &= manmask;
    return sign | ((uint)(e + 127) << 23) | (man << (23 - M));
  }
  return sign | ((uint)((int)ex - bias + 127) << 23) | (man << (23 - M));
}
uint float_bits_to_narrow(uint u, int E, int M, int FN) {
  const int bias = (1 << (E - 1)) - 1, emin = 1 - bias;
  const uint expmax = (1u << E) - 1u, manmask = (1u << M) - 1u;
  const uint nan_bits = FN ? ((expmax << M) | manmask) : ((expmax << M) | (1u << (M - 1)));
  const uint inf_bits = FN ? nan_bits : (expmax << M);
  const uint maxfinite = FN ? ((expmax << M) | (manmask - 1u)) : ((expmax << M) - 1u);
  const uint sign = (u >> 31) << (E + M);
  const uint a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | nan_bits | (FN ? 0u : ((a >> (23 - M)) & manmask));
  if (a == 0x7f800000u) return sign | inf_bits;
  const uint fexp = a >> 23;
  if (fexp == 0u) return sign;
  const int e = (int)fexp - 127;
  const uint full = (a & 0x7fffffu) | 0x800000u;
  const int shift = 23 - M + (e < emin ? emin - e : 0);
  uint r = 0u;
  if (shift <= 31) {
    r = full >> shift;
    const uint rem = full & ((1u << shift) - 1u);
    const uint half_ = 1u << (shift - 1);
    if (rem > half_ || (rem == half_ && (r & 1u))) ++r;
  }
  const uint bits = e < emin ? r : (((uint)(e - emin) << M) + r);
  if (bits > maxfinite) return sign | inf_bits;
  return sign | bits;
}
uint bf16_from_float_bits(uint u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
)CL";

struct TypeSpec {
  const char* storage;  // the buffer's element type
  const char* compute;  // the type the op runs in
  const char* load;     // expression of `x` (storage) -> compute
  const char* store;    // expression of `y` (compute) -> storage
  bool is_float;
  bool unsigned_arith;  // sum and product on the unsigned twin (no signed overflow)
  const char* twin;     // that twin
  bool fp64;
};

TypeSpec spec(chorusDataType_t d) {
  switch (d) {
    case chorusInt8: return {"char", "char", "x", "y", false, true, "uchar", false};
    case chorusUint8: return {"uchar", "uchar", "x", "y", false, false, "uchar", false};
    case chorusInt32: return {"int", "int", "x", "y", false, true, "uint", false};
    case chorusUint32: return {"uint", "uint", "x", "y", false, false, "uint", false};
    case chorusInt64: return {"long", "long", "x", "y", false, true, "ulong", false};
    case chorusUint64: return {"ulong", "ulong", "x", "y", false, false, "ulong", false};
    case chorusFloat16:
      return {"ushort", "float", "as_float(narrow_to_float_bits(x, 5, 10, 0))",
              "(ushort)float_bits_to_narrow(as_uint(y), 5, 10, 0)", true, false, "", false};
    case chorusBfloat16:
      return {"ushort", "float", "as_float((uint)x << 16)", "(ushort)bf16_from_float_bits(as_uint(y))", true, false, "",
              false};
    case chorusFloat8e4m3:
      return {"uchar", "float", "as_float(narrow_to_float_bits(x, 4, 3, 1))",
              "(uchar)float_bits_to_narrow(as_uint(y), 4, 3, 1)", true, false, "", false};
    case chorusFloat8e5m2:
      return {"uchar", "float", "as_float(narrow_to_float_bits(x, 5, 2, 0))",
              "(uchar)float_bits_to_narrow(as_uint(y), 5, 2, 0)", true, false, "", false};
    case chorusFloat32: return {"float", "float", "x", "y", true, false, "", false};
    case chorusFloat64: return {"double", "double", "x", "y", true, false, "", true};
    default: break;
  }
  return {};
}

}  // namespace

std::string clReduceSource(chorusDataType_t dtype) {
  const TypeSpec t = spec(dtype);
  std::string src = "// chorus: reductions of " + std::string(dtypeName(dtype)) + " (src/device/cl_reduce.cpp)\n";
  if (t.fp64) src += "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n";
  src += kConvert;
  src += fmt::format("typedef {} S;\ntypedef {} C;\n", t.storage, t.compute);
  src += fmt::format("C load_c(S x) {{ return {}; }}\nS store_c(C y) {{ return {}; }}\n", t.load, t.store);
  // The ops, as kernels/reduce_isa.hpp defines them.
  if (t.unsigned_arith) {
    src += fmt::format("C op_sum(C a, C b) {{ return as_{0}(({1})(as_{1}(a) + as_{1}(b))); }}\n", t.compute, t.twin);
    src += fmt::format("C op_prod(C a, C b) {{ return as_{0}(({1})(as_{1}(a) * as_{1}(b))); }}\n", t.compute, t.twin);
  } else {
    src += "C op_sum(C a, C b) { return (C)(a + b); }\nC op_prod(C a, C b) { return (C)(a * b); }\n";
  }
  if (t.is_float) {
    src += "C op_max(C a, C b) { return ((a > b) || (a != a)) ? a : b; }\n"
           "C op_min(C a, C b) { return ((a < b) || (a != a)) ? a : b; }\n";
  } else {
    src += "C op_max(C a, C b) { return a > b ? a : b; }\nC op_min(C a, C b) { return a < b ? a : b; }\n";
  }
  for (const char* op : {"sum", "prod", "max", "min"}) {
    src += fmt::format(
        "__kernel void reduce_{0}(__global uchar* dst, ulong dst_off, __global const uchar* a, ulong a_off,\n"
        "                        __global const uchar* b, ulong b_off, ulong n) {{\n"
        "  __global S* d = (__global S*)(dst + dst_off);\n"
        "  __global const S* x = (__global const S*)(a + a_off);\n"
        "  __global const S* y = (__global const S*)(b + b_off);\n"
        "  for (ulong i = get_global_id(0); i < n; i += get_global_size(0))\n"
        "    d[i] = store_c(op_{0}(load_c(x[i]), load_c(y[i])));\n"
        "}}\n",
        op);
  }
  return src;
}

#ifdef CHORUS_HAVE_OPENCL
namespace {

struct Program {
  cl_program program = nullptr;
  cl_kernel kernels[kNumBinOps] = {};
  std::mutex mu;  // clSetKernelArg + enqueue of one kernel object
  Status status;
};

struct Cache {
  std::mutex mu;
  std::map<std::pair<cl_context, int>, std::unique_ptr<Program>> programs;
};
Cache& cache() {
  static Cache c;
  return c;
}

std::unique_ptr<Program> build(cl_context ctx, cl_device_id dev, chorusDataType_t dtype) {
  auto p = std::make_unique<Program>();
  const std::string src = clReduceSource(dtype);
  const char* text = src.c_str();
  cl_int e = CL_SUCCESS;
  p->program = clCreateProgramWithSource(ctx, 1, &text, nullptr, &e);
  if (e != CL_SUCCESS) {
    p->status = makeError(chorusSystemError, "OpenCL: clCreateProgramWithSource for {} reductions: {}", dtypeName(dtype), e);
    return p;
  }
  // No fast-math flags: the host's IEEE results, denormals included.
  e = clBuildProgram(p->program, 1, &dev, "", nullptr, nullptr);
  if (e != CL_SUCCESS) {
    size_t len = 0;
    clGetProgramBuildInfo(p->program, dev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &len);
    std::string log(len, '\0');
    clGetProgramBuildInfo(p->program, dev, CL_PROGRAM_BUILD_LOG, len, log.data(), nullptr);
    p->status = makeError(chorusSystemError, "OpenCL: building the {} reduction kernels failed ({}): {}", dtypeName(dtype),
                          e, log.substr(0, 2000));
    return p;
  }
  const char* names[kNumBinOps] = {"reduce_sum", "reduce_prod", "reduce_max", "reduce_min"};
  for (int i = 0; i < kNumBinOps; ++i) {
    p->kernels[i] = clCreateKernel(p->program, names[i], &e);
    if (e != CL_SUCCESS) {
      p->status = makeError(chorusSystemError, "OpenCL: clCreateKernel({}): {}", names[i], e);
      return p;
    }
  }
  clRetainContext(ctx);  // the cache's key stays this context for the process
  return p;
}

}  // namespace
#endif

Status enqueueReduce(void* queue, chorusDataType_t dtype, BinOp op, void* dst, uint64_t dst_offset, void* a,
                     uint64_t a_offset, void* b, uint64_t b_offset, uint64_t count, void** event) {
#ifdef CHORUS_HAVE_OPENCL
  if (!isValidDtype(static_cast<int>(dtype))) return invalidArgument("enqueueReduce: datatype {} is invalid", static_cast<int>(dtype));
  const uint64_t es = dtypeSize(dtype);
  if (dst_offset % es != 0 || a_offset % es != 0 || b_offset % es != 0)
    return invalidArgument("enqueueReduce: offsets {}, {}, {} are not multiples of the {}-byte {} element", dst_offset,
                           a_offset, b_offset, es, dtypeName(dtype));
  auto q = static_cast<cl_command_queue>(queue);
  cl_context ctx = nullptr;
  cl_device_id dev = nullptr;
  cl_int e = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, nullptr);
  if (e == CL_SUCCESS) e = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof dev, &dev, nullptr);
  if (e != CL_SUCCESS) return invalidArgument("enqueueReduce: not an OpenCL command queue ({})", e);
  Program* p = nullptr;
  {
    Cache& c = cache();
    std::lock_guard l(c.mu);
    auto& slot = c.programs[{ctx, static_cast<int>(dtype)}];
    if (!slot) slot = build(ctx, dev, dtype);  // at first use; compile errors are cached too
    p = slot.get();
  }
  if (!p->status.isOk()) return p->status;
  if (count == 0) return {};
  cl_kernel k = p->kernels[static_cast<int>(op)];
  const auto mem = [](void* m) { return static_cast<cl_mem>(m); };
  cl_mem d = mem(dst), x = mem(a), y = mem(b);
  const cl_ulong doff = dst_offset, xoff = a_offset, yoff = b_offset, n = count;
  // One work-item per element up to 2^20 items; each strides beyond that.
  const size_t global = static_cast<size_t>(std::min<uint64_t>(count, uint64_t{1} << 20));
  cl_event ev = nullptr;
  std::lock_guard l(p->mu);
  e = clSetKernelArg(k, 0, sizeof d, &d);
  e |= clSetKernelArg(k, 1, sizeof doff, &doff);
  e |= clSetKernelArg(k, 2, sizeof x, &x);
  e |= clSetKernelArg(k, 3, sizeof xoff, &xoff);
  e |= clSetKernelArg(k, 4, sizeof y, &y);
  e |= clSetKernelArg(k, 5, sizeof yoff, &yoff);
  e |= clSetKernelArg(k, 6, sizeof n, &n);
  if (e != CL_SUCCESS) return invalidArgument("enqueueReduce: clSetKernelArg failed (are dst, a, b cl_mem buffers?)");
  e = clEnqueueNDRangeKernel(q, k, 1, nullptr, &global, nullptr, 0, nullptr, event != nullptr ? &ev : nullptr);
  if (e != CL_SUCCESS) return makeError(chorusSystemError, "OpenCL: clEnqueueNDRangeKernel (reduction): {}", e);
  if (event != nullptr) *event = ev;
  return {};
#else
  (void)queue, (void)dtype, (void)op, (void)dst, (void)dst_offset, (void)a, (void)a_offset, (void)b, (void)b_offset,
      (void)count, (void)event;
  return makeError(chorusSystemError, "OpenCL: this chorus was built without OpenCL");
#endif
}

}  // namespace chorus::device
