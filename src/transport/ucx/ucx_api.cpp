// Loads libucp at the ucx transport's first use (ucx_api.hpp says why).
#include "transport/ucx/ucx_api.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace chorus::transport::ucx {
namespace {

// The soname of every UCX 1.x release; the unversioned name is what a
// development install without the runtime package would have.
constexpr const char* kLibraries[] = {"libucp.so.0", "libucp.so"};

struct Loaded {
  UcpApi api;
  Status status;
};

Loaded load() {
  Loaded out;
  void* handle = nullptr;
  std::string tried;
  for (const char* lib : kLibraries) {
    // RTLD_LOCAL: UCX's symbols stay out of the global namespace (a process
    // that loaded another UCX itself keeps resolving its own).
    handle = ::dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char* why = ::dlerror();
    tried += fmt::format("{}{}: {}", tried.empty() ? "" : "; ", lib, why != nullptr ? why : "not found");
  }
  if (handle == nullptr) {
    out.status = makeError(chorusSystemError,
                           "ucx transport: UCX's library cannot be loaded ({}); install UCX (Debian: libucx0, or "
                           "libucx-dev ucx-utils) or choose another transport (CHORUS_TRANSPORT)",
                           tried);
    return out;
  }
  // dlsym on the handle also searches libucp's dependencies (libucs has
  // ucs_status_string).
#define CHORUS_UCP_RESOLVE(name)                                                                                  \
  if (out.status.isOk()) {                                                                                        \
    out.api.name = reinterpret_cast<decltype(out.api.name)>(::dlsym(handle, #name));                              \
    if (out.api.name == nullptr)                                                                                  \
      out.status = makeError(chorusSystemError, "ucx transport: the loaded libucp has no {} (UCX older than 1.10?)", \
                             #name);                                                                              \
  }
  CHORUS_UCP_FUNCTIONS(CHORUS_UCP_RESOLVE)
#undef CHORUS_UCP_RESOLVE
  if (out.status.isOk()) {
    out.api.ucm_set_event_handler =
        reinterpret_cast<decltype(out.api.ucm_set_event_handler)>(::dlsym(handle, "ucm_set_event_handler"));
    out.api.ucm_unset_event_handler =
        reinterpret_cast<decltype(out.api.ucm_unset_event_handler)>(::dlsym(handle, "ucm_unset_event_handler"));
    if (out.api.ucm_unset_event_handler == nullptr) out.api.ucm_set_event_handler = nullptr;
  }
  if (out.status.isOk()) {
    unsigned major = 0, minor = 0, release = 0;
    out.api.ucp_get_version(&major, &minor, &release);
    if (major != UCP_API_MAJOR || minor < 10)
      out.status = makeError(chorusSystemError,
                             "ucx transport: the loaded UCX is version {}.{}.{}; this build needs 1.10 or later of "
                             "major version {} (built against {}.{})",
                             major, minor, release, UCP_API_MAJOR, UCP_API_MAJOR, UCP_API_MINOR);
  }
  // Not dlclose'd on failure either: UCX's constructors have run.
  return out;
}

}  // namespace

Result<const UcpApi*> ucpApi() {
  static const Loaded* loaded = [] { return new Loaded(load()); }();
  if (!loaded->status.isOk()) return loaded->status;
  return &loaded->api;
}

}  // namespace chorus::transport::ucx
