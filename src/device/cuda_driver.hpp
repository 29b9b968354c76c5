// The CUDA driver API, loaded at run time (docs/device.md): libcuda.so.1
// through dlopen, with the prototypes chorus uses declared here, so that
// chorus builds without the CUDA toolkit and finds the driver wherever one is
// installed.  The data path (cuda_stream.cpp) uses only these entry points;
// the tests run it over a test double of the driver (tests/fake_cuda), and
// bench/device_check.sh over a real one where a GPU is at hand.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.hpp"

// The handles' struct tags, global as in cuda.h (so that a function pointer
// here has the very type of the driver's function).
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;

namespace chorus::device {

// The driver API's types, as cuda.h declares them (the handles are opaque
// pointers; a device pointer is an integer of the unified address space).
using CUresult = int;
using CUdevice = int;
using CUcontext = ::CUctx_st*;
using CUstream = ::CUstream_st*;
using CUevent = ::CUevent_st*;
using CUdeviceptr = unsigned long long;

// The constants chorus passes or compares (cuda.h's values).
inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorInvalidValue = 1;
inline constexpr CUresult kCudaErrorNotReady = 600;
inline constexpr int kCuPointerAttributeContext = 1;
inline constexpr int kCuPointerAttributeMemoryType = 2;
inline constexpr unsigned kCuMemoryTypeHost = 1;
inline constexpr unsigned kCuMemoryTypeDevice = 2;
inline constexpr unsigned kCuMemoryTypeUnified = 4;
inline constexpr unsigned kCuMemHostAllocPortable = 1;
inline constexpr unsigned kCuMemHostAllocDeviceMap = 2;
inline constexpr unsigned kCuEventDisableTiming = 2;
inline constexpr unsigned kCuStreamWaitValueGeq = 0;  // (int32_t)(*addr - value) >= 0: cyclic

struct CudaDriver {
  // Ok when the library loaded, cuInit(0) succeeded, a device exists and
  // every entry point of the data path resolved; else "no CUDA driver
  // (...)" or what failed, by name.
  Status status;
  std::string library;     // what was loaded ("libcuda.so.1", or CHORUS_CUDA_DRIVER's path)
  int driver_version = 0;  // cuDriverGetVersion: 1000 * major + 10 * minor
  int devices = 0;
  std::string device0;     // cuDeviceGetName of device 0

  // "CUDA_ERROR_INVALID_VALUE (1)", for messages.
  [[nodiscard]] std::string errorName(CUresult r) const;
  // Ok, or "<what> failed: <error name>".
  [[nodiscard]] Status check(CUresult r, const char* what) const;

  // The entry points chorus resolves (nullptr when not loaded).  Where the
  // driver exports a versioned name (cuMemAlloc_v2, ...), that one.
  CUresult (*cuInit)(unsigned int) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, unsigned int, unsigned int) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned int) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventQuery)(CUevent) = nullptr;
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr) = nullptr;
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned int) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned int) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  // For tools with a device of their own (openCudaDevice: chorus-bench
  // --memory cuda); not needed by the data path, nullptr where missing.
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned int) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
};

// A context current on this thread for a scope, the thread's own restored
// after (the caller's thread, the device worker, ranks as threads).
class CudaCtxScope {
 public:
  CudaCtxScope(const CudaDriver& d, CUcontext ctx) : d_(d) {
    d_.cuCtxGetCurrent(&saved_);
    if (saved_ != ctx) {
      d_.cuCtxSetCurrent(ctx);
      swapped_ = true;
    }
  }
  ~CudaCtxScope() { release(); }
  // Restores the thread's context now (before the context goes).
  void release() {
    if (swapped_) d_.cuCtxSetCurrent(saved_);
    swapped_ = false;
  }
  CudaCtxScope(const CudaCtxScope&) = delete;
  CudaCtxScope& operator=(const CudaCtxScope&) = delete;

 private:
  const CudaDriver& d_;
  CUcontext saved_ = nullptr;
  bool swapped_ = false;
};

// The library to load instead of libcuda.so.1 (CHORUS_CUDA_DRIVER, read by
// the API layer): takes effect only before the first cudaDriver().
void setCudaDriverLibrary(std::string path);
// Loads the driver once per process (thread-safe) and returns what it found.
const CudaDriver& cudaDriver();

}  // namespace chorus::device
