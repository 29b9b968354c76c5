// Loads the CUDA driver API (cuda_driver.hpp).
#include "device/cuda_driver.hpp"

#include <dlfcn.h>

namespace chorus::device {
namespace {

template <typename F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

CudaDriver load() {
  CudaDriver d;
  // The driver's soname (the unversioned libcuda.so is a toolkit stub).
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    d.status = makeError(chorusSystemError, "no CUDA driver (libcuda.so.1: {})", why != nullptr ? why : "not found");
    return d;
  }
  CudaDriver f;
  if (!resolve(lib, "cuInit", &f.cuInit) || !resolve(lib, "cuDriverGetVersion", &f.cuDriverGetVersion) ||
      !resolve(lib, "cuDeviceGetCount", &f.cuDeviceGetCount) || !resolve(lib, "cuDeviceGet", &f.cuDeviceGet) ||
      !resolve(lib, "cuDeviceGetName", &f.cuDeviceGetName)) {
    d.status = makeError(chorusSystemError, "CUDA driver: libcuda.so.1 lacks a driver API entry point (cuInit, ...)");
    return d;
  }
  resolve(lib, "cuGetErrorName", &f.cuGetErrorName);
  auto name = [&](CUresult r) {
    const char* s = nullptr;
    if (f.cuGetErrorName != nullptr) f.cuGetErrorName(r, &s);
    return std::string(s != nullptr ? s : "CUDA error") + " (" + std::to_string(r) + ")";
  };
  if (CUresult r = f.cuInit(0); r != 0) {
    f.status = makeError(chorusSystemError, "CUDA driver: cuInit failed: {}", name(r));
    return f;
  }
  f.cuDriverGetVersion(&f.driver_version);
  if (CUresult r = f.cuDeviceGetCount(&f.devices); r != 0 || f.devices == 0) {
    f.status = makeError(chorusSystemError, "CUDA driver {}: no CUDA device ({})", f.driver_version,
                         r != 0 ? name(r) : "count 0");
    return f;
  }
  CUdevice dev = 0;
  char buf[256] = {};
  if (f.cuDeviceGet(&dev, 0) == 0 && f.cuDeviceGetName(buf, sizeof buf - 1, dev) == 0) f.device0 = buf;
  return f;
}

}  // namespace

const CudaDriver& cudaDriver() {
  static const CudaDriver d = load();
  return d;
}

}  // namespace chorus::device
