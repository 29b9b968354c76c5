// Calls on device memory (docs/device.md): the API layer's side of
// src/device/.  A call on an OpenCL stream is checked, its device buffers are
// staged through host memory by the stream, and the unchanged host call runs
// on the staging; a call on a host stream that names a device address is
// refused, naming the argument.
#pragma once

#include <functional>

#include "comm/op.hpp"
#include "common/status.hpp"
#include "device/memory.hpp"
#include "device/worker.hpp"

namespace chorus::api {

// The C entry point's name for error messages.
const char* entryName(const OpDesc& op);

// On a host stream: ok unless a buffer of op is a registered device address
// or CUDA device memory (one relaxed load each when nothing is registered
// and no CUDA stream was made).
Status checkHostBuffers(const OpDesc& op);

// The staging of OpenCL streams (CHORUS_DEVICE_STAGING, CHORUS_DEVICE_CHUNK_BYTES;
// read in api/config.cpp, as every knob).
Result<device::StagingOptions> deviceStagingFromEnv();

// Points the CUDA loader at CHORUS_CUDA_DRIVER (api/config.cpp); every
// entry point that may load the driver calls it first.
void configureCudaDriver();

// What op reads and writes of its buffers on this rank (point-to-point and
// the v-collectives included).
device::StagedCall describeOnDevice(const OpDesc& op, int rank, int nranks);

// Runs op on the OpenCL stream `cl`: submit(op) receives op with its buffers
// replaced by the host staging.  rank/nranks: the communicator's.  With a
// worker (and the stream's async, CHORUS_DEVICE_ASYNC), the call returns once
// its queue commands are enqueued and the worker runs submit later, in issue
// order (docs/device.md, "Returning before the queue"); an error of that
// later part is the stream's (chorusStreamSynchronize, chorusStreamQuery).
// Without, it returns when the host part ran.
Status runOnDevice(device::DeviceStream& cl, OpDesc op, int rank, int nranks, std::function<Status(OpDesc&)> submit,
                   device::Worker* worker = nullptr);

}  // namespace chorus::api
