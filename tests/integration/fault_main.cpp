// One rank of a fault-injection job: runs a stream of mixed collectives until
// one fails (a peer is killed by the test driver), then prints one JSON line
// {rank, code, message, ops, t_error_ns} and exits 0 if the failure was
// reported as a remote error, 2 otherwise, 1 if it never failed.
//
// With --shrink STEPS the rank then finishes the job on the survivors: it calls
// chorusCommShrink and runs STEPS steps on the new communicator (an int32
// allreduce checked against its closed form, and an allgather of the old ranks,
// which shows the membership and order every survivor agreed on); the JSON
// line gains {shrink: {code, message, size, rank, members, steps_ok}} and the
// exit status is 0 only if the shrink and every step succeeded.
#include <chorus/chorus.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

// The rest of the job on the shrunk communicator.  Returns "" or what went wrong.
std::string finishJob(chorusComm_t small, int old_rank, int steps, nlohmann::json& out) {
  int m = 0, me = 0;
  chorusCommCount(small, &m);
  chorusCommUserRank(small, &me);
  out["size"] = m;
  out["rank"] = me;
  std::vector<int32_t> members(static_cast<size_t>(m), -1);
  int32_t mine = old_rank;
  if (chorusAllGather(&mine, members.data(), 1, chorusInt32, small, nullptr) != chorusSuccess)
    return std::string("allgather of the old ranks: ") + chorusGetLastError(small);
  out["members"] = members;
  const size_t count = 100003;  // several chunks, and not a multiple of the rank count
  std::vector<int32_t> v(count);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < count; ++i) v[i] = (me + 1) * static_cast<int32_t>(i % 13 + 1) + s;
    if (chorusAllReduce(v.data(), v.data(), count, chorusInt32, chorusSum, small, nullptr) != chorusSuccess)
      return "step " + std::to_string(s) + ": allreduce: " + chorusGetLastError(small);
    for (size_t i = 0; i < count; ++i) {
      const int32_t want = static_cast<int32_t>(i % 13 + 1) * m * (m + 1) / 2 + s * m;
      if (v[i] != want)
        return "step " + std::to_string(s) + ": element " + std::to_string(i) + " is " + std::to_string(v[i]) +
               ", expected " + std::to_string(want);
    }
    out["steps_ok"] = s + 1;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  int shrink_steps = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--shrink") == 0 && i + 1 < argc) {
      shrink_steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--shrink STEPS]\n", argv[0]);
      return 64;
    }
  }
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
  bool shrink_ok = true;
  if (shrink_steps >= 0 && res == chorusRemoteError) {
    nlohmann::json s{{"steps_ok", 0}};
    chorusComm_t smaller = nullptr;
    chorusResult_t sr = chorusCommShrink(comm, CHORUS_SHRINK_DEFAULT, &smaller);
    s["code"] = sr;
    std::string why = sr == chorusSuccess ? finishJob(smaller, rank, shrink_steps, s) : chorusGetLastError(comm);
    s["message"] = why;
    shrink_ok = sr == chorusSuccess && why.empty();
    if (smaller != nullptr && chorusCommDestroy(smaller) != chorusSuccess) {
      s["message"] = std::string("destroying the shrunk communicator: ") + chorusGetLastError(nullptr);
      shrink_ok = false;
    }
    j["shrink"] = s;
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  chorusCommDestroy(comm);
  if (res == chorusSuccess) return 1;
  if (!shrink_ok) return 3;
  return res == chorusRemoteError ? 0 : 2;
}
