// Soak program for bench/soak.sh: one rank of a job launched by chorus-run.
// Runs many small and many large allreduces on one communicator and prints
// one JSON line with its resident memory (VmRSS) and open descriptor count
// after a warm-up and again at the end, so the script can assert that a long
// run leaks neither memory nor descriptors.
//
// Uses only the C ABI (chorus.h), as an application would.
//
//   soak [small_count] [large_count] [large_bytes] [warmup_small_count]
//        (defaults 1000000 10000 16777216 100000)
#include <chorus/chorus.h>
#include <dirent.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// Resident memory from /proc/self/status, in KiB: total (VmRSS) and its
// anonymous (heap, stacks) and shared-memory (the shm transport's segments)
// parts.  A leak shows in anon; shm grows only until every ring page has been
// touched once (bounded by the segment size).
struct Rss {
  long total = -1, anon = -1, shmem = -1;
};
Rss rss() {
  Rss r;
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return r;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) r.total = std::strtol(line + 6, nullptr, 10);
    if (std::strncmp(line, "RssAnon:", 8) == 0) r.anon = std::strtol(line + 8, nullptr, 10);
    if (std::strncmp(line, "RssShmem:", 9) == 0) r.shmem = std::strtol(line + 9, nullptr, 10);
  }
  std::fclose(f);
  return r;
}

// Entries of /proc/self/fd (the directory's own descriptor included, the same
// one each time, so before and after compare like with like).
long openFds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  long n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

bool check(chorusResult_t r, const char* what, chorusComm_t comm) {
  if (r == chorusSuccess) return true;
  std::fprintf(stderr, "soak: %s failed: %s: %s\n", what, chorusGetErrorString(r), chorusGetLastError(comm));
  return false;
}

// count allreduces of `elems` floats; every rank contributes 1, so each result
// element must equal nranks.
bool run(chorusComm_t comm, chorusStream_t stream, std::vector<float>& in, std::vector<float>& out, size_t elems,
         long count, int nranks) {
  for (long i = 0; i < count; ++i) {
    if (!check(chorusAllReduce(in.data(), out.data(), elems, chorusFloat32, chorusSum, comm, stream), "allreduce",
               comm) ||
        !check(chorusStreamSynchronize(stream), "stream synchronize", comm))
      return false;
  }
  if (count > 0 && (out[0] != static_cast<float>(nranks) || out[elems - 1] != static_cast<float>(nranks))) {
    std::fprintf(stderr, "soak: wrong result %g (expected %d)\n", out[0], nranks);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long small = argc > 1 ? std::atol(argv[1]) : 1000000;
  long large = argc > 2 ? std::atol(argv[2]) : 10000;
  size_t large_bytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : size_t{16} << 20;
  long warmup = argc > 4 ? std::atol(argv[4]) : 100000;
  size_t large_elems = large_bytes / sizeof(float);
  if (small < 0 || large < 0 || warmup < 0 || large_elems == 0) {
    std::fprintf(stderr, "usage: soak [small_count] [large_count] [large_bytes >= 4] [warmup_small_count]\n");
    return 2;
  }

  chorusComm_t comm = nullptr;
  if (!check(chorusCommInitFromEnv(&comm), "init", nullptr)) return 1;
  int rank = 0, nranks = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &nranks);
  chorusStream_t stream = nullptr;
  if (!check(chorusStreamCreate(&stream), "stream create", comm)) return 1;

  std::vector<float> small_in(2, 1.0f), small_out(2), large_in(large_elems, 1.0f), large_out(large_elems);
  // Warm-up: every buffer, pool and cached plan the loops use exists before
  // the first measurement, and the shm rings (1 MiB each, 16 bytes per small
  // message) have wrapped, so every ring page is resident: what follows is
  // growth, not first use.
  if (!run(comm, stream, small_in, small_out, 2, warmup, nranks) ||
      !run(comm, stream, large_in, large_out, large_elems, 5, nranks))
    return 1;
  Rss r0 = rss();
  long fds0 = openFds();
  auto t0 = std::chrono::steady_clock::now();
  if (!run(comm, stream, small_in, small_out, 2, small, nranks)) return 1;
  auto t1 = std::chrono::steady_clock::now();
  Rss r1 = rss();
  long fds1 = openFds();
  if (!run(comm, stream, large_in, large_out, large_elems, large, nranks)) return 1;
  auto t2 = std::chrono::steady_clock::now();
  Rss r2 = rss();
  long fds2 = openFds();

  auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
  std::printf(
      "{\"rank\": %d, \"nranks\": %d, \"warmup_count\": %ld, \"small_count\": %ld, \"small_seconds\": %.3f, "
      "\"large_count\": %ld, \"large_bytes\": %zu, \"large_seconds\": %.3f, "
      "\"rss_kib_before\": %ld, \"rss_kib_after_small\": %ld, \"rss_kib_after\": %ld, "
      "\"anon_kib_before\": %ld, \"anon_kib_after\": %ld, \"shmem_kib_before\": %ld, \"shmem_kib_after\": %ld, "
      "\"fds_before\": %ld, \"fds_after_small\": %ld, \"fds_after\": %ld}\n",
      rank, nranks, warmup, small, secs(t1 - t0), large, large_elems * sizeof(float), secs(t2 - t1), r0.total,
      r1.total, r2.total, r0.anon, r2.anon, r0.shmem, r2.shmem, fds0, fds1, fds2);
  std::fflush(stdout);
  chorusStreamDestroy(stream);
  return check(chorusCommDestroy(comm), "destroy", comm) ? 0 : 1;
}
