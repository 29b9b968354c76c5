// The job secret over PMIx (launcher_secret.hpp).
#include "bootstrap/launcher_secret.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/log.hpp"

#if CHORUS_HAVE_PMIX
#include <dlfcn.h>
#include <pmix.h>
#endif

namespace chorus::bootstrap {

#if !CHORUS_HAVE_PMIX

Result<std::optional<LauncherSecret>> secretFromLauncher(int, int, std::chrono::milliseconds, std::string* why_not) {
  if (why_not) *why_not = "this chorus was built without PMIx headers (Debian: libpmix-dev)";
  return std::optional<LauncherSecret>();
}

#else

namespace {

// The entry points we use, resolved from libpmix.so.2 once.
struct Pmix {
  decltype(&PMIx_Init) init = nullptr;
  decltype(&PMIx_Finalize) finalize = nullptr;
  decltype(&PMIx_Put) put = nullptr;
  decltype(&PMIx_Commit) commit = nullptr;
  decltype(&PMIx_Fence) fence = nullptr;
  decltype(&PMIx_Get) get = nullptr;
  decltype(&PMIx_Value_destruct) value_destruct = nullptr;
  decltype(&PMIx_Error_string) error_string = nullptr;
  std::string error;  // why it could not be loaded

  static const Pmix& instance() {
    static const Pmix p = load();
    return p;
  }

 private:
  static Pmix load() {
    Pmix p;
    void* lib = ::dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = ::dlerror();
      p.error = fmt::format("libpmix.so.2 is not loadable: {}", e ? e : "unknown error");
      return p;
    }
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      if (fn == nullptr) {
        ok = false;
        p.error = fmt::format("libpmix.so.2 has no {}", name);
      }
    };
    sym(p.init, "PMIx_Init");
    sym(p.finalize, "PMIx_Finalize");
    sym(p.put, "PMIx_Put");
    sym(p.commit, "PMIx_Commit");
    sym(p.fence, "PMIx_Fence");
    sym(p.get, "PMIx_Get");
    sym(p.value_destruct, "PMIx_Value_destruct");
    sym(p.error_string, "PMIx_Error_string");
    if (!ok) p.init = nullptr;  // unusable; the library stays loaded (harmless)
    return p;
  }
};

void setKey(pmix_info_t& info, const char* key) {
  std::memset(&info, 0, sizeof info);
  std::strncpy(info.key, key, PMIX_MAX_KEYLEN);
}

// One PMIx_Init .. PMIx_Finalize (PMIx counts them: an MPI library that
// initialised PMIx too keeps it).
class Session {
 public:
  explicit Session(const Pmix& p) : p_(p) {}
  ~Session() {
    if (up_) (void)p_.finalize(nullptr, 0);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  pmix_status_t start(pmix_proc_t* me) {
    pmix_status_t rc = p_.init(me, nullptr, 0);
    up_ = rc == PMIX_SUCCESS;
    return rc;
  }

 private:
  const Pmix& p_;
  bool up_ = false;
};

}  // namespace

Result<std::optional<LauncherSecret>> secretFromLauncher(int world_size, int instance,
                                                         std::chrono::milliseconds timeout, std::string* why_not) {
  auto none = [&](std::string why) {
    if (why_not) *why_not = std::move(why);
    return std::optional<LauncherSecret>();
  };
  const Pmix& p = Pmix::instance();
  if (p.init == nullptr) return none(p.error);
  auto pmixError = [&](const char* what, pmix_status_t rc) {
    return internalError("job secret over PMIx: {} failed: {} ({})", what, p.error_string(rc), rc);
  };

  Session session(p);
  pmix_proc_t me{};
  if (pmix_status_t rc = session.start(&me); rc != PMIX_SUCCESS)
    return none(fmt::format("PMIx_Init failed: {}", p.error_string(rc)));

  // Every process of the namespace must fence: only when they are exactly
  // chorus's ranks.
  pmix_proc_t job{};
  std::memcpy(job.nspace, me.nspace, sizeof job.nspace);
  job.rank = PMIX_RANK_WILDCARD;
  pmix_value_t* size_val = nullptr;
  pmix_status_t rc = p.get(&job, PMIX_JOB_SIZE, nullptr, 0, &size_val);
  if (rc != PMIX_SUCCESS || size_val == nullptr) return none("PMIx does not say the job's size");
  uint64_t job_size = 0;
  if (size_val->type == PMIX_UINT32) job_size = size_val->data.uint32;
  p.value_destruct(size_val);
  std::free(size_val);
  if (job_size != static_cast<uint64_t>(world_size))
    return none(fmt::format("the PMIx namespace has {} processes, chorus's world {}", job_size, world_size));

  const std::string key = fmt::format("chorus.job_secret.{}", instance);
  auth::Secret secret;
  if (me.rank == 0) {
    secret = auth::Secret::random();
    if (!secret.present) return internalError("job secret over PMIx: the kernel gave no random bytes for it");
    pmix_value_t v{};
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = reinterpret_cast<char*>(secret.bytes.data());
    v.data.bo.size = secret.bytes.size();
    if ((rc = p.put(PMIX_GLOBAL, key.c_str(), &v)) != PMIX_SUCCESS) return pmixError("PMIx_Put", rc);
    if ((rc = p.commit()) != PMIX_SUCCESS) return pmixError("PMIx_Commit", rc);
  }
  pmix_info_t info[2];
  setKey(info[0], PMIX_COLLECT_DATA);
  info[0].value.type = PMIX_BOOL;
  info[0].value.data.flag = true;
  setKey(info[1], PMIX_TIMEOUT);
  info[1].value.type = PMIX_INT;
  info[1].value.data.integer = static_cast<int>(std::max<int64_t>(1, (timeout.count() + 999) / 1000));
  if ((rc = p.fence(nullptr, 0, info, 2)) != PMIX_SUCCESS) return pmixError("PMIx_Fence (every rank)", rc);
  if (me.rank != 0) {
    pmix_proc_t root{};
    std::memcpy(root.nspace, me.nspace, sizeof root.nspace);
    root.rank = 0;
    pmix_value_t* v = nullptr;
    if ((rc = p.get(&root, key.c_str(), nullptr, 0, &v)) != PMIX_SUCCESS || v == nullptr)
      return pmixError("PMIx_Get of rank 0's secret", rc);
    const bool good = v->type == PMIX_BYTE_OBJECT && v->data.bo.size == secret.bytes.size();
    if (good) std::memcpy(secret.bytes.data(), v->data.bo.bytes, secret.bytes.size());
    p.value_destruct(v);
    std::free(v);
    if (!good) return internalError("job secret over PMIx: rank 0's value under '{}' is not a {}-byte secret", key,
                                    secret.bytes.size());
    secret.present = true;
  }
  LauncherSecret out;
  out.secret = secret;
  out.origin = fmt::format("the launcher's PMIx exchange (namespace {}, {} processes)", me.nspace, job_size);
  return std::optional<LauncherSecret>(std::move(out));
}

#endif

}  // namespace chorus::bootstrap
