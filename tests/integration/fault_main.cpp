// One rank of a fault-injection job: runs a stream of mixed collectives until
// one fails (a peer is killed by the test driver), then prints one JSON line
// {rank, code, message, ops, t_error_ns} and exits 0 if the failure was
// reported as a remote error, 2 otherwise, 1 if it never failed.
#include <chorus/chorus.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

int main() {
  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "init: %s\n", chorusGetLastError(nullptr));
    return 1;
  }
  int rank = 0, n = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &n);
  std::printf("{\"ready\": %d}\n", rank);
  std::fflush(stdout);
  std::vector<float> big(1 << 18, 1.0f), gathered(static_cast<size_t>(n) << 12);
  std::vector<float> small(8, 1.0f);
  chorusResult_t res = chorusSuccess;
  uint64_t ops = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (res == chorusSuccess && std::chrono::steady_clock::now() < give_up) {
    switch (ops % 4) {
      case 0: res = chorusAllReduce(big.data(), big.data(), big.size(), chorusFloat32, chorusSum, comm, nullptr); break;
      case 1: res = chorusAllGather(big.data(), gathered.data(), 1 << 12, chorusFloat32, comm, nullptr); break;
      case 2: res = chorusBroadcast(small.data(), small.data(), small.size(), chorusFloat32, 0, comm, nullptr); break;
      case 3: res = chorusBarrier(comm, nullptr); break;
    }
    if (res == chorusSuccess) ++ops;
    if (ops % 4 == 0) std::fill(big.begin(), big.end(), 1.0f);
  }
  const auto t = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json j{{"rank", rank}, {"code", res}, {"message", chorusGetLastError(comm)}, {"ops", ops},
                   {"t_error_ns", t}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  chorusCommDestroy(comm);
  if (res == chorusSuccess) return 1;
  return res == chorusRemoteError ? 0 : 2;
}
