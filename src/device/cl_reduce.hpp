// Device-side reductions for the OpenCL memory space (docs/device.md):
// OpenCL C kernels for every data type x BinOp the host kernels have
// (kernels/reduce.hpp), with the host's results bit for bit: integers wrap
// (sum and product on the unsigned twin), fp16 / bf16 / fp8 are widened to
// fp32 by integer bit manipulation, combined and rounded to nearest even
// with the host's overflow and NaN rules (kernels/convert.hpp), and max/min
// propagate NaN as the host does.  A program per (context, data type) is
// compiled at its first use and cached for the process (the context is
// retained while cached).
//
// Not yet on the collective path: a call on an OpenCL stream reduces its
// staged data on the host (memory.hpp); this is the kernel library the
// device-side pipeline will use, tested against the host kernels.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <string>

#include "common/reduction.hpp"
#include "common/status.hpp"

namespace chorus::device {

// The OpenCL C source of the program for one data type (four kernels,
// reduce_sum, reduce_prod, reduce_max, reduce_min).
std::string clReduceSource(chorusDataType_t dtype);

// Enqueues dst[i] = a[i] (op) b[i] for i < count on the in-order queue:
// dst, a, b are cl_mem buffers of the queue's context, each with a byte offset
// (a multiple of the element size).  dst may be a or b (same offset).  When
// event is not null it receives the kernel's event (release it).
Status enqueueReduce(void* cl_queue, chorusDataType_t dtype, BinOp op, void* dst, uint64_t dst_offset, void* a,
                     uint64_t a_offset, void* b, uint64_t b_offset, uint64_t count, void** event = nullptr);

}  // namespace chorus::device
