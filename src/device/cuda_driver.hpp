// The CUDA driver API, loaded at run time (docs/device.md): libcuda.so.1
// through dlopen, with the few prototypes chorus uses declared here, so that
// chorus builds without the CUDA toolkit and finds the driver wherever one is
// installed.  Only the loader exists so far: it tells whether a driver and a
// device are present (chorus-run --print-env, chorus-bench); the CUDA memory
// space's data path is future work.
#pragma once

#include <string>

#include "common/status.hpp"

namespace chorus::device {

// CUresult and the handles, as the driver API declares them (cuda.h).
using CUresult = int;
using CUdevice = int;

struct CudaDriver {
  // Ok when libcuda.so.1 loaded, cuInit(0) succeeded and a device exists;
  // else "no CUDA driver (...)" or what failed, by name.
  Status status;
  int driver_version = 0;  // cuDriverGetVersion: 1000 * major + 10 * minor
  int devices = 0;
  std::string device0;     // cuDeviceGetName of device 0
  // The entry points chorus resolves (nullptr when not loaded).
  CUresult (*cuInit)(unsigned int) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
};

// Loads the driver once per process (thread-safe) and returns what it found.
const CudaDriver& cudaDriver();

}  // namespace chorus::device
