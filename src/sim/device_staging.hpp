// The staging cost of collectives on device buffers (issue 41, item 5;
// docs/device.md, "What staging costs"): what a call on an OpenCL stream
// adds to the host collective it runs, from a calibration of the device's
// queue (one command's round trip) and copy rate, for each staging mode of
// src/device/memory.hpp.  First principles over the data path's structure;
// the calibration comes from microbenchmarks (bench/micro/device_staging_calib),
// never from collective runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.hpp"

namespace chorus::sim {

struct DeviceStagingCalibration {
  // One queue command's round trip: enqueued by a host thread, run by the
  // runtime, the waiting host thread woken (clEnqueueMarkerWithWaitList +
  // clWaitForEvents), microseconds.
  double command_us = 0;
  // Host <-> device copies (clEnqueueReadBuffer / WriteBuffer of large
  // buffers, the round trip taken out), GB/s (1e9 bytes/s).
  double copy_gbps = 0;
  // A map is the buffer itself (CL_DEVICE_HOST_UNIFIED_MEMORY): no copy.
  bool unified = true;
};
Status validate(const DeviceStagingCalibration& c);

enum class StagingModel : uint8_t { Map, Pipeline, Whole };
const char* stagingModelName(StagingModel m);

struct StagedShape {
  StagingModel mode = StagingModel::Map;
  uint64_t in_bytes = 0;   // what the call reads of sendbuff on this rank
  uint64_t out_bytes = 0;  // what it writes of recvbuff
  uint64_t chunk_bytes = uint64_t{1} << 20;  // Pipeline: one chunk of each buffer
  // Pipeline applies only to an elementwise call of more than one chunk
  // (others run as Whole, as the stream does).
  bool elementwise = true;
};

// The host collective's time (us) on a part of the call of `bytes` bytes of
// its buffer (the whole call, or one pipelined chunk).
using HostTimeUs = std::function<double(uint64_t bytes)>;

struct StagedPrice {
  double total_us = 0;    // the call on device buffers, back to back (steady state)
  double host_us = 0;     // the host collective on the whole buffer
  double staging_us = 0;  // total_us - host_us (>= 0)
  uint64_t chunks = 1;
  StagingModel ran_as = StagingModel::Map;  // Pipeline falls back to Whole
};

// Steady-state time of a call issued back to back on one stream:
//  Map:      host(all) + one round trip (the map waits for the previous
//            call's unmap, which waits for its host part) [+ both copies
//            when the map is not the memory itself];
//  Whole:    one round trip + in/copy + host(all) + out/copy;
//  Pipeline: one round trip + chunk_in/copy + sum over chunks of
//            max(host(chunk), (chunk_in + chunk_out)/copy) + chunk_out/copy
//            (the copies of one chunk overlap the host part of the next).
StagedPrice priceStaged(const StagedShape& s, const DeviceStagingCalibration& c, const HostTimeUs& host);

// A calibration read from the JSON object device_staging_calib prints
// ({"command_us": .., "copy_gbps": .., "unified": true}); bounds-checked.
Result<DeviceStagingCalibration> parseDeviceStagingCalibration(const std::string& json);

}  // namespace chorus::sim
