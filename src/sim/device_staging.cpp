// The staging cost of collectives on device buffers (device_staging.hpp).
#include "sim/device_staging.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace chorus::sim {

const char* stagingModelName(StagingModel m) {
  switch (m) {
    case StagingModel::Map: return "map";
    case StagingModel::Pipeline: return "pipeline";
    case StagingModel::Whole: return "whole";
  }
  return "?";
}

Status validate(const DeviceStagingCalibration& c) {
  // A round trip of a nanosecond or of a minute, a copy slower than 1 MB/s or
  // faster than 10 TB/s: not a measurement of a device queue.
  if (!std::isfinite(c.command_us) || c.command_us < 1e-3 || c.command_us > 6e7)
    return invalidArgument("device staging calibration: command_us={} is outside 0.001..6e7 us", c.command_us);
  if (!std::isfinite(c.copy_gbps) || c.copy_gbps < 1e-3 || c.copy_gbps > 1e4)
    return invalidArgument("device staging calibration: copy_gbps={} is outside 0.001..10000 GB/s", c.copy_gbps);
  return {};
}

namespace {
double copyUs(uint64_t bytes, const DeviceStagingCalibration& c) {
  return static_cast<double>(bytes) / (c.copy_gbps * 1e3);  // GB/s = 1e3 bytes/us
}
}  // namespace

StagedPrice priceStaged(const StagedShape& s, const DeviceStagingCalibration& c, const HostTimeUs& host) {
  StagedPrice p;
  const uint64_t total = std::max(s.in_bytes, s.out_bytes);
  p.host_us = std::max(0.0, host(total));
  StagingModel mode = s.mode;
  const uint64_t chunk = std::max<uint64_t>(s.chunk_bytes, 1);
  if (mode == StagingModel::Pipeline && (!s.elementwise || total <= chunk)) mode = StagingModel::Whole;
  p.ran_as = mode;
  switch (mode) {
    case StagingModel::Map:
      p.total_us = c.command_us + p.host_us;
      if (!c.unified) p.total_us += copyUs(s.in_bytes, c) + copyUs(s.out_bytes, c);
      break;
    case StagingModel::Whole:
      p.total_us = c.command_us + copyUs(s.in_bytes, c) + p.host_us + copyUs(s.out_bytes, c);
      break;
    case StagingModel::Pipeline: {
      p.chunks = (total + chunk - 1) / chunk;
      const uint64_t cin = s.in_bytes > 0 ? chunk : 0, cout = s.out_bytes > 0 ? chunk : 0;
      double t = c.command_us + copyUs(std::min(cin, s.in_bytes), c);
      for (uint64_t k = 0; k < p.chunks; ++k) {
        const uint64_t b = std::min(chunk, total - k * chunk);
        const uint64_t bi = cin ? b : 0, bo = cout ? b : 0;
        t += std::max(std::max(0.0, host(b)), copyUs(bi + bo, c));
      }
      const uint64_t last = total - (p.chunks - 1) * chunk;
      p.total_us = t + copyUs(cout ? last : 0, c);
      break;
    }
  }
  p.staging_us = std::max(0.0, p.total_us - p.host_us);
  return p;
}

Result<DeviceStagingCalibration> parseDeviceStagingCalibration(const std::string& text) {
  using nlohmann::json;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("device staging calibration: not a JSON object");
  DeviceStagingCalibration c;
  auto number = [&](const char* key, double* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number())
      return invalidArgument("device staging calibration: \"{}\" is missing or not a number", key);
    *out = it->get<double>();
    return {};
  };
  CHORUS_RETURN_IF_ERROR(number("command_us", &c.command_us));
  CHORUS_RETURN_IF_ERROR(number("copy_gbps", &c.copy_gbps));
  if (auto it = j.find("unified"); it != j.end()) {
    if (!it->is_boolean()) return invalidArgument("device staging calibration: \"unified\" is not a boolean");
    c.unified = it->get<bool>();
  }
  CHORUS_RETURN_IF_ERROR(validate(c));
  return c;
}

}  // namespace chorus::sim
