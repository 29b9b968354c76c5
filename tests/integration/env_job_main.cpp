// One rank of a job started by any launcher (chorus-run, torchrun, mpirun):
// chorusCommInitFromEnv, an allreduce of every rank's number and an allgather
// of the ranks, each element checked; prints one JSON line
//   {"rank": r, "world": n, "ok": true}
// and exits 0, or prints chorus's error on stderr and exits 1.
#include <chorus/chorus.h>

#include <cstdio>
#include <vector>

namespace {

bool ok(chorusResult_t r, const char* what, chorusComm_t comm) {
  if (r == chorusSuccess) return true;
  std::fprintf(stderr, "env_job_main: %s: %s: %s\n", what, chorusGetErrorString(r), chorusGetLastError(comm));
  return false;
}

}  // namespace

int main() {
  chorusComm_t comm = nullptr;
  if (!ok(chorusCommInitFromEnv(&comm), "chorusCommInitFromEnv", nullptr)) return 1;
  int rank = -1, n = 0;
  if (!ok(chorusCommUserRank(comm, &rank), "chorusCommUserRank", comm) || !ok(chorusCommCount(comm, &n), "chorusCommCount", comm))
    return 1;
  std::vector<double> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(rank + 1) * static_cast<double>(i);
  if (!ok(chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat64, chorusSum, comm, nullptr), "chorusAllReduce", comm))
    return 1;
  const double ranks_sum = n * (n + 1) / 2.0;
  bool good = true;
  for (size_t i = 0; i < v.size(); ++i) good = good && v[i] == ranks_sum * static_cast<double>(i);
  int mine = rank;
  std::vector<int> all(static_cast<size_t>(n), -1);
  if (!ok(chorusAllGather(&mine, all.data(), 1, chorusInt32, comm, nullptr), "chorusAllGather", comm)) return 1;
  for (int r = 0; r < n; ++r) good = good && all[static_cast<size_t>(r)] == r;
  if (!ok(chorusCommDestroy(comm), "chorusCommDestroy", nullptr)) return 1;
  std::printf("{\"rank\": %d, \"world\": %d, \"ok\": %s}\n", rank, n, good ? "true" : "false");
  return good ? 0 : 1;
}
