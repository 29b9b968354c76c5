// libFuzzer target: KV agents' metadata blobs (prim/kv.hpp, docs/kv.md),
// which arrive from peers through the store or the application.
//
// Properties checked: unpackMetadata never crashes or reads past the blob;
// whatever it accepts packs again to exactly the same bytes (the format is
// canonical: no second spelling of a blob passes validation).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "prim/kv.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> blob(size);
  if (size != 0) std::memcpy(blob.data(), data, size);
  auto md = chorus::prim::kv::unpackMetadata(blob);
  if (!md.isOk()) return 0;
  if (chorus::prim::kv::packMetadata(*md) != blob) std::abort();
  return 0;
}
