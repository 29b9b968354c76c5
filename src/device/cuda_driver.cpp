// Loads the CUDA driver API (cuda_driver.hpp).
#include "device/cuda_driver.hpp"

#include <dlfcn.h>

#include <mutex>

namespace chorus::device {
namespace {

std::mutex& libraryMutex() {
  static std::mutex mu;
  return mu;
}
std::string& libraryPath() {
  static std::string path = "libcuda.so.1";  // the driver's soname (libcuda.so is the toolkit's stub)
  return path;
}

// The versioned name first (the driver keeps the unversioned one for old
// binaries, with the old ABI: cuMemAlloc takes an unsigned int there).
template <typename F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, (std::string(name) + "_v2").c_str()));
  if (*out == nullptr) *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

CudaDriver load() {
  CudaDriver d;
  {
    std::lock_guard l(libraryMutex());
    d.library = libraryPath();
  }
  void* lib = ::dlopen(d.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    d.status = makeError(chorusSystemError, "no CUDA driver ({}: {})", d.library, why != nullptr ? why : "not found");
    return d;
  }
  const char* missing = nullptr;
  auto need = [&](const char* name, auto* out) {
    if (!resolve(lib, name, out) && missing == nullptr) missing = name;
  };
  need("cuInit", &d.cuInit);
  need("cuDriverGetVersion", &d.cuDriverGetVersion);
  need("cuDeviceGetCount", &d.cuDeviceGetCount);
  need("cuDeviceGet", &d.cuDeviceGet);
  need("cuDeviceGetName", &d.cuDeviceGetName);
  resolve(lib, "cuGetErrorName", &d.cuGetErrorName);
  if (missing != nullptr) {
    d.status = makeError(chorusSystemError, "CUDA driver: {} lacks the driver API entry point {}", d.library, missing);
    return d;
  }
  if (CUresult r = d.cuInit(0); r != kCudaSuccess) {
    d.status = makeError(chorusSystemError, "CUDA driver: cuInit failed: {}", d.errorName(r));
    return d;
  }
  d.cuDriverGetVersion(&d.driver_version);
  if (CUresult r = d.cuDeviceGetCount(&d.devices); r != kCudaSuccess || d.devices == 0) {
    d.status = makeError(chorusSystemError, "CUDA driver {}: no CUDA device ({})", d.driver_version,
                         r != kCudaSuccess ? d.errorName(r) : "count 0");
    return d;
  }
  CUdevice dev = 0;
  char buf[256] = {};
  if (d.cuDeviceGet(&dev, 0) == kCudaSuccess && d.cuDeviceGetName(buf, sizeof buf - 1, dev) == kCudaSuccess)
    d.device0 = buf;
  // The data path's entry points (cuStreamGetCtx: CUDA 9.2; cuStreamWaitValue32: 8.0).
  need("cuCtxGetCurrent", &d.cuCtxGetCurrent);
  need("cuCtxSetCurrent", &d.cuCtxSetCurrent);
  need("cuStreamGetCtx", &d.cuStreamGetCtx);
  need("cuStreamSynchronize", &d.cuStreamSynchronize);
  need("cuStreamWaitValue32", &d.cuStreamWaitValue32);
  need("cuEventCreate", &d.cuEventCreate);
  need("cuEventDestroy", &d.cuEventDestroy);
  need("cuEventRecord", &d.cuEventRecord);
  need("cuEventSynchronize", &d.cuEventSynchronize);
  need("cuEventQuery", &d.cuEventQuery);
  need("cuMemGetAddressRange", &d.cuMemGetAddressRange);
  need("cuPointerGetAttribute", &d.cuPointerGetAttribute);
  need("cuMemHostAlloc", &d.cuMemHostAlloc);
  need("cuMemFreeHost", &d.cuMemFreeHost);
  need("cuMemHostGetDevicePointer", &d.cuMemHostGetDevicePointer);
  need("cuMemcpyDtoHAsync", &d.cuMemcpyDtoHAsync);
  need("cuMemcpyHtoDAsync", &d.cuMemcpyHtoDAsync);
  resolve(lib, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain);
  resolve(lib, "cuDevicePrimaryCtxRelease", &d.cuDevicePrimaryCtxRelease);
  resolve(lib, "cuStreamCreate", &d.cuStreamCreate);
  resolve(lib, "cuStreamDestroy", &d.cuStreamDestroy);
  resolve(lib, "cuMemAlloc", &d.cuMemAlloc);
  resolve(lib, "cuMemFree", &d.cuMemFree);
  resolve(lib, "cuMemcpyHtoD", &d.cuMemcpyHtoD);
  resolve(lib, "cuMemcpyDtoH", &d.cuMemcpyDtoH);
  if (missing != nullptr)
    d.status = makeError(chorusSystemError, "CUDA driver {} ({}): the entry point {} is missing (a driver older than "
                         "CUDA 9.2?)", d.driver_version, d.library, missing);
  return d;
}

}  // namespace

std::string CudaDriver::errorName(CUresult r) const {
  const char* s = nullptr;
  if (cuGetErrorName != nullptr) cuGetErrorName(r, &s);
  return std::string(s != nullptr ? s : "CUDA error") + " (" + std::to_string(r) + ")";
}

Status CudaDriver::check(CUresult r, const char* what) const {
  if (r == kCudaSuccess) return {};
  return makeError(chorusSystemError, "{} failed: {}", what, errorName(r));
}

void setCudaDriverLibrary(std::string path) {
  std::lock_guard l(libraryMutex());
  if (!path.empty()) libraryPath() = std::move(path);
}

const CudaDriver& cudaDriver() {
  static const CudaDriver d = load();
  return d;
}

}  // namespace chorus::device
