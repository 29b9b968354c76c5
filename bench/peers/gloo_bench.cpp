// gloo_bench: the Gloo peer of chorus-bench in the side-by-side comparison (bench/compare).
//
//   gloo_bench allreduce --np 2 --algo ring -b 8 -e 64M -f 2 -n 20 -w 5 --json out.jsonl
//
// Native Gloo (Debian libgloo-dev, its C++ API) over its TCP transport on loopback.  The program is its own
// launcher: it forks --np ranks, which meet through a gloo::rendezvous::FileStore in a fresh temporary
// directory and connect a full mesh.  It measures exactly as chorus-bench and mpi_coll_bench do: per size,
// one checked call, -w warmup calls, a barrier, -n timed calls; the time of one call is the mean over the
// timed calls, and the slowest rank's mean is the collective's time.  Sizes, buffer shapes, algbw and busbw
// follow nccl-tests, as the other two.  Only float32, sum, out of place.
//
// Collectives: allreduce (--algo ring or bcube: gloo::allreduce with AllreduceOptions::setAlgorithm),
// allgather, broadcast, alltoall (Gloo has one algorithm each; algo "gloo"), and reducescatter through the
// older algorithm class gloo::ReduceScatterHalvingDoubling, which works in place on a buffer of n blocks: each
// call first copies the input into that buffer (n * count floats, part of the measured time — that is what an
// out-of-place caller of Gloo pays).
//
// Rank 0 prints an nccl-tests-like table and, with --json, writes the JSON rows of chorus-bench --json
// (collective, bytes, count, dtype, op, root, nranks, algo, inplace, time_us, algbw_gbps, busbw_gbps, wrong);
// algo is "gloo-ring" / "gloo-bcube" for allreduce and "gloo" otherwise.
//
// Exit status: 0 when every rank exited cleanly and every result was right; 1 otherwise.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

enum class Coll { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast };

struct Options {
  Coll coll = Coll::AllReduce;
  std::string coll_name = "allreduce";
  int np = 2;
  std::string algo = "ring";
  uint64_t min_bytes = 32ull << 20, max_bytes = 32ull << 20;
  double factor = 2;
  int iters = 20, warmup = 5, root = 0, check = 1;
  std::string json_path;
  int timeout_s = 600;
};

// The buffers of one call, as chorus-bench's shapeFor (elements of float).
struct Shape {
  uint64_t bytes;  // printed size: max(send, recv) bytes
  size_t count;    // count argument (per-rank block for allgather/reducescatter/alltoall)
  size_t send_count, recv_count;
};

Shape shapeFor(Coll c, uint64_t bytes, int nranks) {
  const size_t elem = sizeof(float), n = static_cast<size_t>(nranks);
  const size_t count = bytes / elem;
  const size_t base = (count / n) & ~(16 / elem - 1);
  Shape s{0, count, count, count};
  switch (c) {
    case Coll::AllGather: s = {0, base, base, base * n}; break;
    case Coll::ReduceScatter: s = {0, base, base * n, base}; break;
    case Coll::AllToAll: s = {0, base, base * n, base * n}; break;
    default: break;
  }
  s.bytes = std::max(s.send_count, s.recv_count) * elem;
  return s;
}

double busFactor(Coll c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Coll::AllReduce: return 2 * (n - 1) / n;
    case Coll::Broadcast: return 1;
    default: return (n - 1) / n;
  }
}

uint64_t algBytes(Coll c, const Shape& s, int nranks) {
  return (c == Coll::AllReduce || c == Coll::Broadcast) ? s.count * sizeof(float)
                                                          : s.count * sizeof(float) * static_cast<uint64_t>(nranks);
}

// The same inputs as mpi_coll_bench: small integers, so float sums stay exact.
float input(int r, uint64_t i) { return static_cast<float>((static_cast<uint64_t>(r) * 31u + i * 7u + i / 13u) % 17u); }
float reduced(int nranks, uint64_t i) {
  float acc = 0;
  for (int r = 0; r < nranks; ++r) acc += input(r, i);
  return acc;
}

uint64_t countWrong(Coll c, const Shape& s, int root, int rank, int nranks, const float* out) {
  uint64_t wrong = 0;
  const size_t cnt = s.count;
  const size_t n = (c == Coll::AllGather || c == Coll::AllToAll) ? s.recv_count : cnt;
  for (size_t k = 0; k < n; ++k) {
    float want = 0;
    switch (c) {
      case Coll::AllReduce: want = reduced(nranks, k); break;
      case Coll::Broadcast: want = input(root, k); break;
      case Coll::AllGather: want = input(static_cast<int>(k / cnt), k % cnt); break;
      case Coll::ReduceScatter: want = reduced(nranks, static_cast<uint64_t>(rank) * cnt + k); break;
      case Coll::AllToAll: want = input(static_cast<int>(k / cnt), static_cast<uint64_t>(rank) * cnt + k % cnt); break;
    }
    if (out[k] != want) ++wrong;
  }
  return wrong;
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// One rank's state for one size: the reduce-scatter algorithm object is built once per size (it registers
// its buffers with the pairs), the other collectives take their buffers per call.
class Caller {
 public:
  Caller(std::shared_ptr<gloo::Context> ctx, const Options& o, const Shape& s, float* send, float* recv)
      : ctx_(std::move(ctx)), o_(o), s_(s), send_(send), recv_(recv) {
    if (o.coll == Coll::ReduceScatter && s.count > 0) {
      work_.assign(s.send_count, 0.f);
      std::vector<int> elems(static_cast<size_t>(ctx_->size), static_cast<int>(s.count));
      rs_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
          ctx_, std::vector<float*>{work_.data()}, static_cast<int>(s.send_count), elems);
    }
  }

  void call() {
    if (s_.count == 0) return;
    const int n = ctx_->size;
    switch (o_.coll) {
      case Coll::AllReduce: {
        gloo::AllreduceOptions opts(ctx_);
        opts.setAlgorithm(o_.algo == "bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                             : gloo::AllreduceOptions::Algorithm::RING);
        opts.setInput(send_, s_.count);
        opts.setOutput(recv_, s_.count);
        opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
        gloo::allreduce(opts);
        break;
      }
      case Coll::AllGather: {
        gloo::AllgatherOptions opts(ctx_);
        opts.setInput(send_, s_.count);
        opts.setOutput(recv_, s_.count * static_cast<size_t>(n));
        gloo::allgather(opts);
        break;
      }
      case Coll::AllToAll: {
        gloo::AlltoallOptions opts(ctx_);
        opts.setInput(send_, s_.send_count);
        opts.setOutput(recv_, s_.recv_count);
        gloo::alltoall(opts);
        break;
      }
      case Coll::Broadcast: {
        gloo::BroadcastOptions opts(ctx_);
        if (ctx_->rank == o_.root) opts.setInput(send_, s_.count);
        opts.setOutput(recv_, s_.count);
        opts.setRoot(o_.root);
        gloo::broadcast(opts);
        break;
      }
      case Coll::ReduceScatter: {
        std::memcpy(work_.data(), send_, s_.send_count * sizeof(float));
        rs_->run();
        // Gloo leaves the rank's reduced block at the start of the work buffer, whatever the rank.
        std::memcpy(recv_, work_.data(), s_.count * sizeof(float));
        break;
      }
    }
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  const Options& o_;
  Shape s_;
  float* send_;
  float* recv_;
  std::vector<float> work_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs_;
};

template <typename T>
T allreduceScalar(const std::shared_ptr<gloo::Context>& ctx, T v, ReduceFn fn) {
  T out = 0;
  gloo::AllreduceOptions opts(ctx);
  opts.setInput(&v, 1);
  opts.setOutput(&out, 1);
  opts.setReduceFunction(fn);
  gloo::allreduce(opts);
  return out;
}

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  gloo::barrier(opts);
}

// One rank: returns the total number of wrong elements (summed over ranks), or throws on a Gloo error.
uint64_t runRank(const Options& o, int rank, const std::string& store_dir) {
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, o.np);
  ctx->setTimeout(std::chrono::seconds(o.timeout_s));
  ctx->connectFullMesh(store, dev);
  const int n = o.np;

  size_t max_elems = 0;
  for (uint64_t b = o.min_bytes; b <= o.max_bytes; b = static_cast<uint64_t>(static_cast<double>(b) * o.factor)) {
    const Shape s = shapeFor(o.coll, b, n);
    max_elems = std::max({max_elems, s.send_count, s.recv_count});
    if (o.factor <= 1) break;
  }
  std::vector<float> send(max_elems + 1024, 0.f), recv(max_elems + 1024, 0.f);

  FILE* json = nullptr;
  if (rank == 0 && !o.json_path.empty() && (json = std::fopen(o.json_path.c_str(), "w")) == nullptr)
    throw std::runtime_error("cannot open --json file '" + o.json_path + "' for writing: " + std::strerror(errno));
  const std::string algo =
      o.coll == Coll::AllReduce ? "gloo-" + o.algo : std::string("gloo");
  const bool has_op = o.coll == Coll::AllReduce || o.coll == Coll::ReduceScatter;
  const bool rooted = o.coll == Coll::Broadcast;
  if (rank == 0) {
    std::printf("# gloo_bench %s  nranks %d  minBytes %" PRIu64 " maxBytes %" PRIu64
                "  warmup iters: %d iters: %d validation: %d algo: %s\n#\n",
                o.coll_name.c_str(), n, o.min_bytes, o.max_bytes, o.warmup, o.iters, o.check, algo.c_str());
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root", "time",
                "algbw", "busbw", "#wrong");
  }
  uint64_t wrong_total = 0;
  for (uint64_t b = o.min_bytes; b <= o.max_bytes;) {
    const Shape s = shapeFor(o.coll, b, n);
    Caller caller(ctx, o, s, send.data(), recv.data());
    long long wrong = -1;
    if (o.check) {
      for (size_t i = 0; i < s.send_count; ++i) send[i] = input(rank, i);
      std::fill(recv.begin(), recv.begin() + static_cast<long>(s.recv_count), 0.f);
      caller.call();
      const uint64_t mine = s.count ? countWrong(o.coll, s, o.root, rank, n, recv.data()) : 0;
      const double all = allreduceScalar<double>(ctx, static_cast<double>(mine), static_cast<ReduceFn>(&gloo::sum<double>));
      wrong = static_cast<long long>(all);
      wrong_total += static_cast<uint64_t>(wrong);
    }
    for (int i = 0; i < o.warmup; ++i) caller.call();
    barrier(ctx);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) caller.call();
    const double mean = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
    const double seconds = allreduceScalar<double>(ctx, mean, static_cast<ReduceFn>(&gloo::max<double>));
    const double algbw = seconds > 0 ? static_cast<double>(algBytes(o.coll, s, n)) / 1e9 / seconds : 0;
    const double busbw = algbw * busFactor(o.coll, n);
    if (rank == 0) {
      char wrong_s[24] = "N/A";
      if (wrong >= 0) std::snprintf(wrong_s, sizeof wrong_s, "%lld", wrong);
      const double us = seconds * 1e6;
      std::printf("%12" PRIu64 "  %12zu  %8s  %6s  %6d  %7.*f  %6.2f  %6.2f  %6s\n", s.bytes, s.count, "float32",
                  has_op ? "sum" : "none", rooted ? o.root : -1, us >= 10000 ? 0 : us >= 100 ? 1 : 2, us, algbw, busbw,
                  wrong_s);
      std::fflush(stdout);
      if (json != nullptr) {
        std::fprintf(json,
                     "{\"collective\":\"%s\",\"bytes\":%" PRIu64 ",\"count\":%zu,\"dtype\":\"float32\",\"op\":\"%s\","
                     "\"root\":%d,\"nranks\":%d,\"algo\":\"%s\",\"inplace\":false,\"time_us\":%.17g,"
                     "\"algbw_gbps\":%.17g,\"busbw_gbps\":%.17g,\"wrong\":%s}\n",
                     o.coll_name.c_str(), s.bytes, s.count, has_op ? "sum" : "none", rooted ? o.root : -1, n,
                     algo.c_str(), us, algbw, busbw, wrong >= 0 ? wrong_s : "null");
        std::fflush(json);
      }
    }
    const auto next = static_cast<uint64_t>(static_cast<double>(b) * o.factor);
    if (next <= b) break;
    b = next;
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %" PRIu64 " %s\n#\n", wrong_total, wrong_total ? "FAILED" : "OK");
    if (json != nullptr && std::fclose(json) != 0) ++wrong_total;
  }
  barrier(ctx);
  return wrong_total;
}

bool parseSize(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text) return false;
  uint64_t mult = 1;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1ull << 10; break;
    case 'm': case 'M': mult = 1ull << 20; break;
    case 'g': case 'G': mult = 1ull << 30; break;
    default: return false;
  }
  if (*end != '\0' && end[1] != '\0') return false;
  *out = v * mult;
  return true;
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: gloo_bench COLLECTIVE [--np N] [--algo ring|bcube] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS]\n"
               "                  [-w WARMUP] [-r ROOT] [-c 0|1] [--json FILE] [--timeout SEC]\n"
               "  COLLECTIVE: allreduce|allgather|reducescatter|alltoall|broadcast (float32 sum, out of place)\n");
}

bool parseArgs(int argc, char** argv, Options* o) {
  bool have_coll = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    }
    if (a[0] != '-') {
      o->coll_name = a;
      have_coll = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    bool ok = true;
    if (a == "-b") ok = parseSize(v, &o->min_bytes);
    else if (a == "-e") ok = parseSize(v, &o->max_bytes);
    else if (a == "-f") o->factor = std::atof(v);
    else if (a == "-n") o->iters = std::atoi(v);
    else if (a == "-w") o->warmup = std::atoi(v);
    else if (a == "-r") o->root = std::atoi(v);
    else if (a == "-c") o->check = std::atoi(v);
    else if (a == "--np") o->np = std::atoi(v);
    else if (a == "--algo") o->algo = v;
    else if (a == "--json") o->json_path = v;
    else if (a == "--timeout") o->timeout_s = std::atoi(v);
    else if (a == "-d") ok = std::strcmp(v, "float") == 0 || std::strcmp(v, "float32") == 0;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "gloo_bench: bad option '%s %s' (only float32 is measured)\n", a.c_str(), v);
      return false;
    }
  }
  if (!have_coll) return false;
  static const std::pair<const char*, Coll> kColls[] = {{"allreduce", Coll::AllReduce},
                                                       {"allgather", Coll::AllGather},
                                                       {"reducescatter", Coll::ReduceScatter},
                                                       {"alltoall", Coll::AllToAll},
                                                       {"broadcast", Coll::Broadcast}};
  bool found = false;
  for (const auto& [name, c] : kColls)
    if (o->coll_name == name) o->coll = c, found = true;
  if (!found) {
    std::fprintf(stderr, "gloo_bench: collective '%s' is not measured (allreduce, allgather, reducescatter, "
                 "alltoall, broadcast)\n", o->coll_name.c_str());
    return false;
  }
  if (o->algo != "ring" && o->algo != "bcube") {
    std::fprintf(stderr, "gloo_bench: --algo '%s' is neither ring nor bcube\n", o->algo.c_str());
    return false;
  }
  if (o->np < 1 || o->iters < 1 || o->warmup < 0 || o->min_bytes == 0 || o->min_bytes > o->max_bytes ||
      o->factor <= 1 || o->root < 0 || o->root >= o->np || o->timeout_s < 1) {
    std::fprintf(stderr, "gloo_bench: bad arguments (--np >= 1, -n >= 1, -w >= 0, 0 < -b <= -e, -f > 1, "
                 "0 <= -r < --np)\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parseArgs(argc, argv, &o)) {
    usage(stderr);
    return 1;
  }
  char tmpl[] = "/tmp/gloo_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "gloo_bench: mkdtemp for the rendezvous store failed: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string store_dir = tmpl;
  std::fflush(stdout);
  std::vector<pid_t> kids;
  for (int r = 0; r < o.np; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "gloo_bench: fork of rank %d failed: %s\n", r, std::strerror(errno));
      for (pid_t k : kids) kill(k, SIGTERM);
      break;
    }
    if (pid == 0) {
      // A rank never returns into the launcher's code: it leaves through _exit with its verdict.
      int rc = 1;
      try {
        rc = runRank(o, r, store_dir) == 0 ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_bench: rank %d of %d: %s\n", r, o.np, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  int failed = static_cast<int>(kids.size()) == o.np ? 0 : 1;
  for (size_t r = 0; r < kids.size(); ++r) {
    int status = 0;
    if (waitpid(kids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "gloo_bench: rank %zu failed (%s %d)\n", r,
                   WIFSIGNALED(status) ? "signal" : "exit status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      failed = 1;
      // One dead rank leaves its peers waiting up to --timeout: end them now.
      for (size_t k = r + 1; k < kids.size(); ++k) kill(kids[k], SIGTERM);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  return failed;
}
