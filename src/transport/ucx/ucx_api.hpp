// Private to the UCX transport: the UCP functions it calls, resolved from
// libucp at run time.
//
// Why not link libucp: loading libucs (which libucp pulls in) runs its
// constructors in every process that loads libchorus.so, whether or not it
// ever selects the ucx transport; they install UCX's own SIGSEGV, SIGBUS,
// SIGILL and SIGFPE handlers (UCX_HANDLE_ERRORS, measured: the handler of
// SIGSEGV changes at load time), which replace a sanitizer's or an
// application's, and they parse the UCX_* environment.  Loaded on the first
// use of the transport instead, UCX only affects processes that asked for it,
// and libchorus.so still loads (and reports the ucx transport's library
// missing by name) on a machine without libucx.  The headers still come from
// the build's UCX (pkg-config ucx), so the types and constants are UCX's own.
#pragma once

#include <ucm/api/ucm.h>
#include <ucp/api/ucp.h>

#include "common/status.hpp"

namespace chorus::transport::ucx {

// X(name): every UCP/UCS function the transport uses.  ucp_init is an inline
// wrapper in ucp.h; the library's symbol is ucp_init_version.
#define CHORUS_UCP_FUNCTIONS(X) \
  X(ucp_get_version)            \
  X(ucp_config_read)            \
  X(ucp_config_modify)          \
  X(ucp_config_release)         \
  X(ucp_init_version)           \
  X(ucp_cleanup)                \
  X(ucp_worker_create)          \
  X(ucp_worker_destroy)         \
  X(ucp_worker_get_address)     \
  X(ucp_worker_release_address) \
  X(ucp_worker_get_efd)         \
  X(ucp_worker_arm)             \
  X(ucp_worker_progress)        \
  X(ucp_ep_create)              \
  X(ucp_ep_print_info)          \
  X(ucp_ep_close_nbx)           \
  X(ucp_ep_flush_nbx)           \
  X(ucp_request_check_status)   \
  X(ucp_request_cancel)         \
  X(ucp_request_free)           \
  X(ucp_tag_send_nbx)           \
  X(ucp_tag_recv_nbx)           \
  X(ucp_tag_probe_nb)           \
  X(ucp_tag_msg_recv_nbx)       \
  X(ucp_mem_map)                \
  X(ucp_mem_unmap)              \
  X(ucp_rkey_pack)              \
  X(ucp_rkey_buffer_release)    \
  X(ucp_ep_rkey_unpack)         \
  X(ucp_rkey_destroy)           \
  X(ucp_put_nbx)                \
  X(ucp_get_nbx)                \
  X(ucs_status_string)

struct UcpApi {
#define CHORUS_UCP_MEMBER(name) decltype(&::name) name = nullptr;
  CHORUS_UCP_FUNCTIONS(CHORUS_UCP_MEMBER)
#undef CHORUS_UCP_MEMBER

  // ucp_init of the header this transport was built with.
  ucs_status_t init(const ucp_params_t* params, const ucp_config_t* config, ucp_context_h* context) const {
    return ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context);
  }
  [[nodiscard]] const char* text(ucs_status_t s) const { return ucs_status_string(s); }

  // Optional (libucm, which libucs loads): memory events, for the origin's
  // registration cache (ucx_transport.cpp); null when absent: no cache.
  decltype(&::ucm_set_event_handler) ucm_set_event_handler = nullptr;
  decltype(&::ucm_unset_event_handler) ucm_unset_event_handler = nullptr;
};

// The loaded library's functions (loaded once per process, never unloaded:
// UCX does not support being unloaded).  Fails naming the library and what
// dlopen said when libucp is absent or lacks a function.
Result<const UcpApi*> ucpApi();

}  // namespace chorus::transport::ucx
