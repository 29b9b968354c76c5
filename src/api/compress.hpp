// Compressed collectives at the API (issue 19): the communicator's default
// (chorusConfig_t.compress, CHORUS_COMPRESS) and a call's options resolved
// into the call's wire format, with every unsupported request refused.
#pragma once

#include <chorus/chorus.h>

#include "comm/communicator.hpp"
#include "common/config.hpp"
#include "common/status.hpp"

namespace chorus::api {

// chorusConfig_t.compress / compressBlock over cfg (-1: cfg's).
Status applyCompressConfig(int compress, int block, Config& cfg);

// Sets op.wire for a call of fn (op's collective, dtype and op already
// checked): the options' format, or the communicator's default where the
// call can be compressed.  An explicit request the call cannot honour is an
// invalid-argument error naming the argument and the supported values (the
// check depends only on the arguments, so every rank refuses alike).
Status resolveCompression(const char* fn, const chorusCallOptions_t* options, const Config& cfg, OpDesc& op);

}  // namespace chorus::api
