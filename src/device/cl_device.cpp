// An OpenCL device of the process's own (cl_device.hpp).
#include "device/cl_device.hpp"

#include <mutex>
#include <vector>

#include "device/memory.hpp"

#ifdef CHORUS_HAVE_OPENCL
#include <CL/cl.h>
#endif

namespace chorus::device {

#ifdef CHORUS_HAVE_OPENCL
namespace {

class ClDeviceImpl final : public ToolDevice {
 public:
  ~ClDeviceImpl() override {
    if (queue_) clFinish(queue_);
    for (auto& [dev, mem] : buffers_) {
      (void)deregister(dev);
      clReleaseMemObject(mem);
    }
    if (queue_) clReleaseCommandQueue(queue_);
    if (ctx_) clReleaseContext(ctx_);
  }
  [[nodiscard]] void* queue() const override { return queue_; }
  [[nodiscard]] std::string name() const override { return name_; }

  Result<std::byte*> allocate(uint64_t bytes) override {
    cl_int e = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(ctx_, CL_MEM_READ_WRITE, std::max<uint64_t>(bytes, 1), nullptr, &e);
    if (e != CL_SUCCESS) return makeError(chorusSystemError, "OpenCL: clCreateBuffer of {} bytes: {}", bytes, e);
    auto dev = registerOpenCL(mem);
    if (!dev.isOk()) {
      clReleaseMemObject(mem);
      return dev.status();
    }
    buffers_.emplace_back(dev.value(), mem);
    return static_cast<std::byte*>(dev.value());
  }
  Status upload(std::byte* dev, const void* host, uint64_t bytes) override {
    auto reg = find(dev);
    if (!reg || bytes > reg->bytes - static_cast<uint64_t>(dev - reg->base))
      return invalidArgument("ToolDevice::upload: {} bytes at {} are not in a registered buffer", bytes,
                             static_cast<void*>(dev));
    const cl_int e = clEnqueueWriteBuffer(queue_, static_cast<cl_mem>(reg->handle), CL_TRUE,
                                          static_cast<size_t>(dev - reg->base), bytes, host, 0, nullptr, nullptr);
    if (e != CL_SUCCESS) return makeError(chorusSystemError, "OpenCL: clEnqueueWriteBuffer: {}", e);
    return {};
  }
  Status download(void* host, const std::byte* dev, uint64_t bytes) override {
    auto reg = find(dev);
    if (!reg || bytes > reg->bytes - static_cast<uint64_t>(dev - reg->base))
      return invalidArgument("ToolDevice::download: {} bytes at {} are not in a registered buffer", bytes,
                             static_cast<const void*>(dev));
    const cl_int e = clEnqueueReadBuffer(queue_, static_cast<cl_mem>(reg->handle), CL_TRUE,
                                         static_cast<size_t>(dev - reg->base), bytes, host, 0, nullptr, nullptr);
    if (e != CL_SUCCESS) return makeError(chorusSystemError, "OpenCL: clEnqueueReadBuffer: {}", e);
    return {};
  }

  cl_context ctx_ = nullptr;
  cl_command_queue queue_ = nullptr;
  std::string name_;
  std::vector<std::pair<void*, cl_mem>> buffers_;
};

}  // namespace

Result<std::unique_ptr<ToolDevice>> openClDevice() {
  CHORUS_RETURN_IF_ERROR(spaceAvailable(Space::OpenCL));
  // One set-up at a time per process: POCL's context set-up failed a later
  // clCreateBuffer when two threads (ranks as threads) ran it at once.
  static std::mutex setup;
  std::lock_guard lock(setup);
  cl_platform_id platform = nullptr;
  cl_device_id dev = nullptr;
  cl_int e = clGetPlatformIDs(1, &platform, nullptr);
  if (e == CL_SUCCESS) e = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr);
  if (e != CL_SUCCESS) return makeError(chorusSystemError, "OpenCL: no device ({})", e);
  auto d = std::make_unique<ClDeviceImpl>();
  d->ctx_ = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &e);
  if (e != CL_SUCCESS) return makeError(chorusSystemError, "OpenCL: clCreateContext: {}", e);
  d->queue_ = clCreateCommandQueue(d->ctx_, dev, 0, &e);
  if (e != CL_SUCCESS) return makeError(chorusSystemError, "OpenCL: clCreateCommandQueue: {}", e);
  char pname[256] = {}, dname[256] = {};
  clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof pname - 1, pname, nullptr);
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname - 1, dname, nullptr);
  d->name_ = std::string(pname) + " / " + dname;
  return std::unique_ptr<ToolDevice>(std::move(d));
}
#else
Result<std::unique_ptr<ToolDevice>> openClDevice() { return spaceAvailable(Space::OpenCL); }
#endif

}  // namespace chorus::device
