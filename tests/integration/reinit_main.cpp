// A job that destroys and re-creates its world communicator from the
// environment, as a training script that tears down and rebuilds its process
// group does: three rounds of init / allreduce / destroy, then two
// environment communicators alive at once.  Each allreduce is checked against
// its closed form; any failure exits non-zero with the reason.
#include <chorus/chorus.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

int fail(const std::string& what, chorusComm_t comm) {
  std::fprintf(stderr, "reinit_main: %s: %s\n", what.c_str(), chorusGetLastError(comm));
  return 1;
}

// Sum over ranks of (rank + salt), which every rank must get back.
int checkSum(chorusComm_t comm, int salt, const std::string& what) {
  int n = 0, rank = 0;
  chorusCommCount(comm, &n);
  chorusCommUserRank(comm, &rank);
  long long v = rank + salt;
  if (chorusAllReduce(&v, &v, 1, chorusInt64, chorusSum, comm, nullptr) != chorusSuccess)
    return fail(what + ": allreduce", comm);
  const long long want = static_cast<long long>(n) * (n - 1) / 2 + static_cast<long long>(n) * salt;
  if (v != want) {
    std::fprintf(stderr, "reinit_main: %s: rank %d got %lld, expected %lld\n", what.c_str(), rank, v, want);
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  for (int round = 0; round < 3; ++round) {
    const std::string what = "round " + std::to_string(round);
    chorusComm_t comm = nullptr;
    if (chorusCommInitFromEnv(&comm) != chorusSuccess) return fail(what + ": init", nullptr);
    if (int rc = checkSum(comm, 100 * round, what)) return rc;
    if (chorusCommDestroy(comm) != chorusSuccess) return fail(what + ": destroy", nullptr);
  }
  chorusComm_t a = nullptr, b = nullptr;
  if (chorusCommInitFromEnv(&a) != chorusSuccess) return fail("two at once: first init", nullptr);
  if (chorusCommInitFromEnv(&b) != chorusSuccess) return fail("two at once: second init", nullptr);
  if (int rc = checkSum(b, 7, "two at once: second")) return rc;
  if (int rc = checkSum(a, 5, "two at once: first")) return rc;
  if (chorusCommDestroy(a) != chorusSuccess || chorusCommDestroy(b) != chorusSuccess)
    return fail("two at once: destroy", nullptr);
  std::printf("reinit ok\n");
  return 0;
}
