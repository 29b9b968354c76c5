// CUDA device 0 for tools (cl_device.hpp, openCudaDevice): its primary
// context, a non-blocking stream and cuMemAlloc buffers, every call made
// with the context current on the calling thread (ranks may be threads).
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "device/cl_device.hpp"
#include "device/cuda_driver.hpp"
#include "device/memory.hpp"

namespace chorus::device {
namespace {

constexpr unsigned kCuStreamNonBlocking = 1;

class CudaDeviceImpl final : public ToolDevice {
 public:
  explicit CudaDeviceImpl(const CudaDriver& d) : d_(d) {}
  ~CudaDeviceImpl() override {
    if (ctx_ == nullptr) return;
    CudaCtxScope s(d_, ctx_);
    if (stream_ != nullptr) {
      d_.cuStreamSynchronize(stream_);
      d_.cuStreamDestroy(stream_);
    }
    for (CUdeviceptr p : buffers_) d_.cuMemFree(p);
    s.release();
    d_.cuDevicePrimaryCtxRelease(dev_);
  }

  Status open() {
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuDeviceGet(&dev_, 0), "cuDeviceGet(0)"));
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuDevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain"));
    CudaCtxScope s(d_, ctx_);
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuStreamCreate(&stream_, kCuStreamNonBlocking), "cuStreamCreate"));
    name_ = "CUDA device 0: " + d_.device0 + " (driver " + std::to_string(d_.driver_version / 1000) + "." +
            std::to_string(d_.driver_version % 1000 / 10) + ", " + d_.library + ")";
    return {};
  }

  [[nodiscard]] void* queue() const override { return stream_; }
  [[nodiscard]] std::string name() const override { return name_; }
  Result<std::byte*> allocate(uint64_t bytes) override {
    CudaCtxScope s(d_, ctx_);
    CUdeviceptr p = 0;
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemAlloc(&p, std::max<uint64_t>(bytes, 1)), "cuMemAlloc"));
    buffers_.push_back(p);
    return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(p));
  }
  Status upload(std::byte* dev, const void* host, uint64_t bytes) override {
    CudaCtxScope s(d_, ctx_);
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuStreamSynchronize(stream_), "cuStreamSynchronize"));
    return d_.check(d_.cuMemcpyHtoD(ptr(dev), host, bytes), "cuMemcpyHtoD");
  }
  Status download(void* host, const std::byte* dev, uint64_t bytes) override {
    CudaCtxScope s(d_, ctx_);
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuStreamSynchronize(stream_), "cuStreamSynchronize"));
    return d_.check(d_.cuMemcpyDtoH(host, ptr(dev), bytes), "cuMemcpyDtoH");
  }

 private:
  static CUdeviceptr ptr(const std::byte* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }
  const CudaDriver& d_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  std::string name_;
  std::vector<CUdeviceptr> buffers_;
};

}  // namespace

Result<std::unique_ptr<ToolDevice>> openCudaDevice() {
  const CudaDriver& d = cudaDriver();
  CHORUS_RETURN_IF_ERROR(d.status);
  if (d.cuDevicePrimaryCtxRetain == nullptr || d.cuDevicePrimaryCtxRelease == nullptr || d.cuStreamCreate == nullptr ||
      d.cuStreamDestroy == nullptr || d.cuMemAlloc == nullptr || d.cuMemFree == nullptr || d.cuMemcpyHtoD == nullptr ||
      d.cuMemcpyDtoH == nullptr)
    return makeError(chorusSystemError, "CUDA driver ({}): an entry point of cuMemAlloc/cuStreamCreate/cuMemcpy is "
                     "missing", d.library);
  auto dev = std::make_unique<CudaDeviceImpl>(d);
  CHORUS_RETURN_IF_ERROR(dev->open());
  return std::unique_ptr<ToolDevice>(std::move(dev));
}

}  // namespace chorus::device
