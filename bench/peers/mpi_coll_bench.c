/* mpi_coll_bench: the MPI peer of chorus-bench in the side-by-side comparison (bench/compare).
 *
 *   mpirun -np 2 --mca pml ob1 --mca btl self,vader mpi_coll_bench allreduce -b 8 -e 64M -f 2 --json out.jsonl
 *
 * It measures exactly as chorus-bench does (src/toolkit/bench_run.cpp), so the two sets of numbers can be put
 * side by side: per size, one checked call, `-w` warmup calls, a barrier, then `-n` timed calls; the time
 * of one call is the mean over the timed calls, and the slowest rank's mean (MPI_MAX) is the collective's
 * time.  Sizes, buffer shapes (per-rank blocks rounded down to 16-byte multiples), algbw and busbw follow
 * nccl-tests (doc/PERFORMANCE.md) and chorus-bench's shapeFor/busBwFactor.  Only float32 and the
 * out-of-place form are measured: that is what the comparison plots.
 *
 * Rank 0 prints an nccl-tests-like table and, with --json, writes one JSON object per size with the fields
 * of chorus-bench --json (collective, bytes, count, dtype, op, root, nranks, algo, inplace, time_us,
 * algbw_gbps, busbw_gbps, wrong).  algo is "openmpi-<btl>", the transport btl (vader, tcp) taken from
 * OMPI_MCA_btl that `mpirun --mca btl self,<btl>` sets, or --algo NAME.
 *
 * Exit status: 0 when every output element was right, 1 on a wrong result or a usage error.
 */
#define _POSIX_C_SOURCE 200809L  /* posix_memalign, strtok */

#include <mpi.h>

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, GATHER, SCATTER, SENDRECV, NCOLL };
static const char* const kNames[NCOLL] = {"allreduce", "broadcast", "reduce",  "allgather", "reducescatter",
                                          "alltoall",  "gather",    "scatter", "sendrecv"};

struct options {
  enum coll coll;
  uint64_t min_bytes, max_bytes, step_bytes;
  double factor;
  int iters, warmup, root, check;
  const char* json_path;
  char algo[64];
};

/* Buffers of one call, as chorus-bench's shapeFor (elements of float). */
struct shape {
  uint64_t bytes; /* printed size: max(send, recv) bytes */
  size_t count;   /* count argument (per-rank block for the gather/scatter family) */
  size_t send_count, recv_count;
};

static struct shape shapeFor(enum coll c, uint64_t bytes, int nranks) {
  const size_t elem = sizeof(float), n = (size_t)nranks;
  const size_t count = (size_t)(bytes / elem);
  const size_t base = (count / n) & ~(size_t)(16 / elem - 1);
  struct shape s = {0, count, count, count};
  switch (c) {
    case ALLGATHER:
    case GATHER: s = (struct shape){0, base, base, base * n}; break;
    case REDUCESCATTER:
    case SCATTER: s = (struct shape){0, base, base * n, base}; break;
    case ALLTOALL: s = (struct shape){0, base, base * n, base * n}; break;
    default: break;
  }
  s.bytes = (s.send_count > s.recv_count ? s.send_count : s.recv_count) * elem;
  return s;
}

/* nccl-tests' busbw factors and algbw data sizes. */
static double busFactor(enum coll c, int nranks) {
  const double n = nranks;
  switch (c) {
    case ALLREDUCE: return 2 * (n - 1) / n;
    case BROADCAST:
    case REDUCE:
    case SENDRECV: return 1;
    default: return (n - 1) / n;
  }
}
static uint64_t algBytes(enum coll c, const struct shape* s, int nranks) {
  switch (c) {
    case ALLREDUCE:
    case BROADCAST:
    case REDUCE:
    case SENDRECV: return s->count * sizeof(float);
    default: return s->count * sizeof(float) * (uint64_t)nranks;
  }
}

/* Input element i of rank r: a small integer, so float sums over any realistic number of ranks stay exact
 * and a misplaced block shows up. */
static float input(int r, uint64_t i) { return (float)(((uint64_t)r * 31u + i * 7u + i / 13u) % 17u); }
static float reduced(int nranks, uint64_t i) {
  float acc = 0;
  for (int r = 0; r < nranks; ++r) acc += input(r, i);
  return acc;
}

/* Number of wrong elements in rank's output; only elements the collective defines are read. */
static uint64_t countWrong(enum coll c, const struct shape* s, int root, int rank, int nranks, const float* out) {
  uint64_t wrong = 0;
  const size_t cnt = s->count;
  size_t n = cnt;
  if (c == ALLGATHER || c == ALLTOALL || c == GATHER) n = s->recv_count;
  if ((c == REDUCE || c == GATHER) && rank != root) return 0;
  for (size_t k = 0; k < n; ++k) {
    float want = 0;
    switch (c) {
      case ALLREDUCE:
      case REDUCE: want = reduced(nranks, k); break;
      case BROADCAST: want = input(root, k); break;
      case ALLGATHER:
      case GATHER: want = input((int)(k / cnt), k % cnt); break;
      case REDUCESCATTER: want = reduced(nranks, (uint64_t)rank * cnt + k); break;
      case ALLTOALL: want = input((int)(k / cnt), (uint64_t)rank * cnt + k % cnt); break;
      case SCATTER: want = input(root, (uint64_t)rank * cnt + k); break;
      case SENDRECV: want = input((rank + nranks - 1) % nranks, k); break;
      default: break;
    }
    if (out[k] != want) ++wrong;
  }
  return wrong;
}

static int issue(enum coll c, const float* send, float* recv, const struct shape* s, int root, int rank, int nranks) {
  const int cnt = (int)s->count;
  switch (c) {
    case ALLREDUCE: return MPI_Allreduce(send, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case BROADCAST:
      /* Out of place as NCCL: the root's send buffer reaches every recv buffer. */
      if (rank == root) memcpy(recv, send, s->count * sizeof(float));
      return MPI_Bcast(recv, cnt, MPI_FLOAT, root, MPI_COMM_WORLD);
    case REDUCE: return MPI_Reduce(send, recv, cnt, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
    case ALLGATHER: return MPI_Allgather(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, MPI_COMM_WORLD);
    case REDUCESCATTER: return MPI_Reduce_scatter_block(send, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case ALLTOALL: return MPI_Alltoall(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, MPI_COMM_WORLD);
    case GATHER: return MPI_Gather(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, root, MPI_COMM_WORLD);
    case SCATTER: return MPI_Scatter(send, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, root, MPI_COMM_WORLD);
    case SENDRECV:
      return MPI_Sendrecv(send, cnt, MPI_FLOAT, (rank + 1) % nranks, 0, recv, cnt, MPI_FLOAT,
                          (rank + nranks - 1) % nranks, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    default: return MPI_ERR_OTHER;
  }
}

/* "64", "8K", "64M", "1G" (powers of 1024, as nccl-tests).  Returns 0 on success. */
static int parseSize(const char* text, uint64_t* out) {
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text) return -1;
  uint64_t mult = 1;
  switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': mult = 1ull << 10; break;
    case 'M': mult = 1ull << 20; break;
    case 'G': mult = 1ull << 30; break;
    default: return -1;
  }
  if (*end != '\0' && end[1] != '\0') return -1;
  *out = (uint64_t)v * mult;
  return 0;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: mpi_coll_bench COLLECTIVE [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]\n"
          "                      [-r ROOT] [-c 0|1] [-d float] [--json FILE] [--algo NAME]\n"
          "  COLLECTIVE: allreduce|broadcast|reduce|allgather|reducescatter|alltoall|gather|scatter|sendrecv\n"
          "  sizes take K/M/G suffixes (powers of 1024); float32 sum, out of place, as chorus-bench's rows\n");
}

/* Returns 0, or 1 after printing why (every rank parses the same argv, so all agree). */
static int parseArgs(int argc, char** argv, struct options* o, int rank) {
  *o = (struct options){ALLREDUCE, 32ull << 20, 32ull << 20, 1ull << 20, 1, 20, 5, 0, 1, NULL, ""};
  const char* coll = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      if (rank == 0) usage(stdout);
      return 1;
    } else if (a[0] != '-') {
      coll = a;
      continue;
    } else if (v == NULL) {
      bad = 1;
    } else if (strcmp(a, "-b") == 0) {
      bad = parseSize(v, &o->min_bytes);
    } else if (strcmp(a, "-e") == 0) {
      bad = parseSize(v, &o->max_bytes);
    } else if (strcmp(a, "-i") == 0) {
      bad = parseSize(v, &o->step_bytes);
    } else if (strcmp(a, "-f") == 0) {
      o->factor = atof(v);
    } else if (strcmp(a, "-n") == 0) {
      o->iters = atoi(v);
    } else if (strcmp(a, "-w") == 0) {
      o->warmup = atoi(v);
    } else if (strcmp(a, "-r") == 0) {
      o->root = atoi(v);
    } else if (strcmp(a, "-c") == 0) {
      o->check = atoi(v);
    } else if (strcmp(a, "-d") == 0) {
      bad = strcmp(v, "float") != 0 && strcmp(v, "float32") != 0;
    } else if (strcmp(a, "--json") == 0) {
      o->json_path = v;
    } else if (strcmp(a, "--algo") == 0) {
      snprintf(o->algo, sizeof o->algo, "%s", v);
    } else {
      bad = 1;
    }
    if (bad) {
      if (rank == 0) {
        fprintf(stderr, "mpi_coll_bench: bad option '%s %s' (only float32 is measured)\n", a, v ? v : "");
        usage(stderr);
      }
      return 1;
    }
    ++i;
  }
  if (coll == NULL) {
    if (rank == 0) usage(stderr);
    return 1;
  }
  int found = 0;
  for (int c = 0; c < NCOLL; ++c)
    if (strcmp(coll, kNames[c]) == 0) o->coll = (enum coll)c, found = 1;
  if (!found || o->iters < 1 || o->warmup < 0 || o->min_bytes > o->max_bytes ||
      (o->factor > 1 && o->min_bytes == 0) || (o->factor <= 1 && o->step_bytes == 0 && o->min_bytes != o->max_bytes)) {
    if (rank == 0) {
      fprintf(stderr, "mpi_coll_bench: bad arguments (collective '%s', -n >= 1, -w >= 0, -b <= -e, a growing sweep)\n",
              coll);
      usage(stderr);
    }
    return 1;
  }
  if (o->algo[0] == '\0') {
    /* "self,vader" -> "openmpi-vader": the btl that is not self names the transport. */
    const char* btl = getenv("OMPI_MCA_btl");
    char name[48] = "default";
    if (btl != NULL) {
      char copy[128];
      snprintf(copy, sizeof copy, "%s", btl);
      for (char* tok = strtok(copy, ","); tok != NULL; tok = strtok(NULL, ","))
        if (strcmp(tok, "self") != 0) snprintf(name, sizeof name, "%s", tok);
    }
    snprintf(o->algo, sizeof o->algo, "openmpi-%s", name);
  }
  return 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  /* Errors come back as codes we report, rather than aborting the job silently. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  struct options o;
  if (parseArgs(argc, argv, &o, rank) != 0) {
    MPI_Finalize();
    return 1;
  }
  if (o.root < 0 || o.root >= nranks) {
    if (rank == 0) fprintf(stderr, "mpi_coll_bench: root %d (-r) is not a rank of this %d-rank job\n", o.root, nranks);
    MPI_Finalize();
    return 1;
  }

  /* Buffers are allocated once, at the largest size of the sweep. */
  size_t max_elems = 0;
  for (uint64_t b = o.min_bytes; b <= o.max_bytes;) {
    struct shape s = shapeFor(o.coll, b, nranks);
    size_t m = s.send_count > s.recv_count ? s.send_count : s.recv_count;
    if (m > max_elems) max_elems = m;
    uint64_t next = o.factor > 1 ? (uint64_t)((double)b * o.factor) : b + o.step_bytes;
    if (next <= b) break;
    b = next;
  }
  float* sendbuf = NULL;
  float* recvbuf = NULL;
  const size_t alloc = (max_elems * sizeof(float) + 4095) / 4096 * 4096 + 4096;
  if (posix_memalign((void**)&sendbuf, 4096, alloc) != 0 || posix_memalign((void**)&recvbuf, 4096, alloc) != 0) {
    fprintf(stderr, "mpi_coll_bench: rank %d: cannot allocate 2 x %zu bytes (lower -e)\n", rank, alloc);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(sendbuf, 0, alloc);
  memset(recvbuf, 0, alloc);

  FILE* json = NULL;
  if (rank == 0 && o.json_path != NULL && (json = fopen(o.json_path, "w")) == NULL) {
    fprintf(stderr, "mpi_coll_bench: cannot open --json file '%s' for writing: %s\n", o.json_path, strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const int rooted = o.coll == BROADCAST || o.coll == REDUCE || o.coll == GATHER || o.coll == SCATTER;
  const int has_op = o.coll == ALLREDUCE || o.coll == REDUCE || o.coll == REDUCESCATTER;
  if (rank == 0) {
    printf("# mpi_coll_bench %s  nranks %d  minBytes %llu maxBytes %llu  warmup iters: %d iters: %d validation: %d "
           "algo: %s\n#\n",
           kNames[o.coll], nranks, (unsigned long long)o.min_bytes, (unsigned long long)o.max_bytes, o.warmup, o.iters,
           o.check, o.algo);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root", "time",
           "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
           "(GB/s)", "");
  }

  uint64_t wrong_total = 0;
  for (uint64_t b = o.min_bytes; b <= o.max_bytes;) {
    const struct shape s = shapeFor(o.coll, b, nranks);
    long long wrong = -1; /* not checked */
    if (o.check) {
      for (size_t i = 0; i < s.send_count; ++i) sendbuf[i] = input(rank, i);
      memset(recvbuf, 0, s.recv_count * sizeof(float));
      int rc = issue(o.coll, sendbuf, recvbuf, &s, o.root, rank, nranks);
      if (rc != MPI_SUCCESS) {
        fprintf(stderr, "mpi_coll_bench: rank %d: %s of %zu floats failed (MPI error %d)\n", rank, kNames[o.coll],
                s.count, rc);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      uint64_t mine = countWrong(o.coll, &s, o.root, rank, nranks, recvbuf), all = 0;
      MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
      wrong = (long long)all;
      wrong_total += all;
    }
    for (int i = 0; i < o.warmup; ++i) issue(o.coll, sendbuf, recvbuf, &s, o.root, rank, nranks);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < o.iters; ++i) issue(o.coll, sendbuf, recvbuf, &s, o.root, rank, nranks);
    double mean = (MPI_Wtime() - t0) / o.iters, seconds = 0;
    /* The slowest rank's mean sets the collective's time, as chorus-bench. */
    MPI_Allreduce(&mean, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double algbw = seconds > 0 ? (double)algBytes(o.coll, &s, nranks) / 1e9 / seconds : 0;
    const double busbw = algbw * busFactor(o.coll, nranks);
    if (rank == 0) {
      char wrong_s[24] = "N/A";
      if (wrong >= 0) snprintf(wrong_s, sizeof wrong_s, "%lld", wrong);
      const double us = seconds * 1e6;
      printf("%12llu  %12zu  %8s  %6s  %6d  %7.*f  %6.2f  %6.2f  %6s\n", (unsigned long long)s.bytes, s.count,
             "float32", has_op ? "sum" : "none", rooted ? o.root : -1, us >= 10000 ? 0 : us >= 100 ? 1 : 2, us, algbw,
             busbw, wrong_s);
      fflush(stdout);
      if (json != NULL) {
        fprintf(json,
                "{\"collective\":\"%s\",\"bytes\":%llu,\"count\":%zu,\"dtype\":\"float32\",\"op\":\"%s\",\"root\":%d,"
                "\"nranks\":%d,\"algo\":\"%s\",\"inplace\":false,\"time_us\":%.17g,\"algbw_gbps\":%.17g,"
                "\"busbw_gbps\":%.17g,\"wrong\":%s}\n",
                kNames[o.coll], (unsigned long long)s.bytes, s.count, has_op ? "sum" : "none", rooted ? o.root : -1,
                nranks, o.algo, us, algbw, busbw, wrong >= 0 ? wrong_s : "null");
        fflush(json);
      }
    }
    uint64_t next = o.factor > 1 ? (uint64_t)((double)b * o.factor) : b + o.step_bytes;
    if (next <= b) break;
    b = next;
  }
  if (rank == 0) {
    printf("# Out of bounds values : %llu %s\n#\n", (unsigned long long)wrong_total, wrong_total ? "FAILED" : "OK");
    if (json != NULL && fclose(json) != 0) {
      fprintf(stderr, "mpi_coll_bench: writing --json file '%s' failed\n", o.json_path);
      wrong_total += 1;
    }
  }
  /* Every rank exits with rank 0's verdict (wrong_total is already a sum over ranks). */
  free(sendbuf);
  free(recvbuf);
  MPI_Finalize();
  return wrong_total == 0 ? 0 : 1;
}
