// An outside C++ program built with find_package(chorus) / chorus::chorus and
// run under the installed chorus-run: every rank allgathers its rank and
// allreduces a vector, checking each element. Exit 0 on success.
#include <chorus/chorus.h>
#include <chorus/chorus.hpp>  // the C++ layer must compile outside the source tree, with no standard set by the project

#include <cstdio>
#include <numeric>
#include <vector>

namespace {

bool ok(chorusResult_t r, const char* what, chorusComm_t comm) {
  if (r == chorusSuccess) return true;
  std::fprintf(stderr, "hello_cpp: %s: %s: %s\n", what, chorusGetErrorString(r), chorusGetLastError(comm));
  return false;
}

}  // namespace

int main() {
  chorusComm_t comm = nullptr;
  if (!ok(chorusCommInitFromEnv(&comm), "chorusCommInitFromEnv", nullptr)) return 1;
  int rank = 0, n = 0;
  chorusCommUserRank(comm, &rank);
  chorusCommCount(comm, &n);

  std::vector<int> ranks(static_cast<size_t>(n), -1);
  int mine = rank;
  bool good = ok(chorusAllGather(&mine, ranks.data(), 1, chorusInt32, comm, nullptr), "chorusAllGather", comm);
  for (int i = 0; good && i < n; ++i)
    if (ranks[static_cast<size_t>(i)] != i) {
      std::fprintf(stderr, "hello_cpp rank %d: allgather slot %d holds %d\n", rank, i, ranks[static_cast<size_t>(i)]);
      good = false;
    }

  std::vector<double> v(4099);
  std::iota(v.begin(), v.end(), static_cast<double>(rank));
  good = good && ok(chorusAllReduce(v.data(), v.data(), v.size(), chorusFloat64, chorusSum, comm, nullptr),
                    "chorusAllReduce", comm);
  // sum over r of (i + r) = n*i + n(n-1)/2, exact in double.
  for (size_t i = 0; good && i < v.size(); ++i) {
    const double want = n * static_cast<double>(i) + n * (n - 1) / 2.0;
    if (v[i] != want) {
      std::fprintf(stderr, "hello_cpp rank %d: element %zu is %g, expected %g\n", rank, i, v[i], want);
      good = false;
    }
  }
  good = ok(chorusCommDestroy(comm), "chorusCommDestroy", nullptr) && good;
  if (good && rank == 0) std::printf("hello_cpp: %d ranks ok\n", n);
  return good ? 0 : 1;
}
