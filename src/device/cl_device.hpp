// A device of this process's own, for tools that have no device of their
// own (chorus-bench --memory opencl|cuda): an OpenCL device (the first device
// of the first platform; registered buffers, copies by device address) or a
// CUDA one (device 0's primary context; cuMemAlloc buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.hpp"

namespace chorus::device {

class ToolDevice {
 public:
  virtual ~ToolDevice() = default;
  [[nodiscard]] virtual void* queue() const = 0;  // cl_command_queue (in order) or CUstream
  [[nodiscard]] virtual std::string name() const = 0;  // "platform / device"
  // A registered cl_mem of `bytes` (freed with the device): its device address.
  virtual Result<std::byte*> allocate(uint64_t bytes) = 0;
  // Blocking copies between host memory and a device address (of allocate).
  virtual Status upload(std::byte* dev, const void* host, uint64_t bytes) = 0;
  virtual Status download(void* host, const std::byte* dev, uint64_t bytes) = 0;
};

Result<std::unique_ptr<ToolDevice>> openClDevice();
// Device 0 of the CUDA driver (cuda_device.cpp): its primary context and a
// stream of its own.
Result<std::unique_ptr<ToolDevice>> openCudaDevice();

}  // namespace chorus::device
