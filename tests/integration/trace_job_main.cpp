// One rank of a traced job (tests/integration/trace_test.py, the cluster
// straggler test): `--iters` allreduces of `--bytes`, with rank
// `--delay-rank` arriving `--delay-us` late at every call, checked against
// the closed-form sum; with `--alltoall-bytes`, an alltoall (every rank to
// every rank, so every link carries data) after each allreduce.  `--clock-offset-ns` shifts the trace clock of rank
// `--clock-offset-rank` (CHORUS_CLOCK_OFFSET_NS, set before init) so the
// clock alignment has a known offset to find.  Prints one JSON line.
#include <chorus/chorus.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"traced allreduce job with an injected straggler"};
  size_t bytes = 1 << 20;
  int iters = 20, delay_rank = -1, offset_rank = -1;
  long delay_us = 0;
  size_t a2a_bytes = 0;
  long long offset_ns = 0;
  app.add_option("--bytes", bytes);
  app.add_option("--iters", iters);
  app.add_option("--delay-rank", delay_rank);
  app.add_option("--delay-us", delay_us);
  app.add_option("--clock-offset-rank", offset_rank);
  app.add_option("--clock-offset-ns", offset_ns);
  app.add_option("--alltoall-bytes", a2a_bytes, "also an alltoall of this many bytes per rank after each allreduce");
  CLI11_PARSE(app, argc, argv);

  const char* rank_env = std::getenv("CHORUS_RANK");
  const int my_rank = rank_env ? std::atoi(rank_env) : -1;
  if (my_rank == offset_rank) setenv("CHORUS_CLOCK_OFFSET_NS", std::to_string(offset_ns).c_str(), 1);

  chorusComm_t comm = nullptr;
  if (chorusCommInitFromEnv(&comm) != chorusSuccess) {
    std::fprintf(stderr, "init: %s\n", chorusGetLastError(nullptr));
    return 1;
  }
  int rank = 0, n = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &n);
  const size_t count = bytes / sizeof(float);
  std::vector<float> buf(count);
  const size_t a2a_count = a2a_bytes / sizeof(float) / static_cast<size_t>(n);
  std::vector<float> a2a_in(a2a_count * static_cast<size_t>(n)), a2a_out(a2a_in.size());
  size_t wrong = 0;
  chorusResult_t res = chorusSuccess;
  for (int it = 0; it < iters && res == chorusSuccess; ++it) {
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(rank + 1 + (i % 7));
    // The injected fault: this rank computes longer before each call.
    if (rank == delay_rank) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    res = chorusAllReduce(buf.data(), buf.data(), count, chorusFloat32, chorusSum, comm, nullptr);
    for (size_t i = 0; i < count && res == chorusSuccess; ++i) {
      const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
      if (buf[i] != want) ++wrong;
    }
    if (a2a_count == 0 || res != chorusSuccess) continue;
    // Block p of rank r's input goes to rank p as block r: value r * n + p.
    for (size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = static_cast<float>(rank * n + static_cast<int>(i / a2a_count));
    res = chorusAllToAll(a2a_in.data(), a2a_out.data(), a2a_count, chorusFloat32, comm, nullptr);
    for (size_t i = 0; i < a2a_out.size() && res == chorusSuccess; ++i)
      if (a2a_out[i] != static_cast<float>(static_cast<int>(i / a2a_count) * n + rank)) ++wrong;
  }
  nlohmann::json j{{"rank", rank}, {"code", res}, {"wrong", wrong}, {"iters", iters}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  chorusCommDestroy(comm);
  return res == chorusSuccess && wrong == 0 ? 0 : 1;
}
