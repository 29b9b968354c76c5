// An OpenCL device of this process's own (the first device of the first
// platform), for tools that have no device of their own: chorus-bench
// --memory opencl.  Registered buffers and copies by device address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.hpp"

namespace chorus::device {

class ClDevice {
 public:
  virtual ~ClDevice() = default;
  [[nodiscard]] virtual void* queue() const = 0;  // cl_command_queue (in order)
  [[nodiscard]] virtual std::string name() const = 0;  // "platform / device"
  // A registered cl_mem of `bytes` (freed with the device): its device address.
  virtual Result<std::byte*> allocate(uint64_t bytes) = 0;
  // Blocking copies between host memory and a device address (of allocate).
  virtual Status upload(std::byte* dev, const void* host, uint64_t bytes) = 0;
  virtual Status download(void* host, const std::byte* dev, uint64_t bytes) = 0;
};

Result<std::unique_ptr<ClDevice>> openClDevice();

}  // namespace chorus::device
