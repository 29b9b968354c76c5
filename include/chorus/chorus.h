/*
 * chorus — collective communication for distributed deep learning.
 *
 * The C ABI. It is shaped like NCCL's so that an NCCL user feels at home:
 * the same result codes, data types, reduction ops, communicator lifecycle
 * and collective signatures, with CPU "streams" in place of CUDA streams.
 *
 * Semantics in brief
 *  - Operations on one communicator match across ranks in the order the
 *    program issues them, whichever stream (or none) they go to.
 *  - A NULL stream makes a call blocking on the caller's thread.  A stream is
 *    a FIFO that the communicator's progress engine executes in the
 *    background; calls on it return at once.  Buffers must stay valid until
 *    the stream is synchronised.
 *  - In-place works as in NCCL: sendbuff == recvbuff, or for gather-type
 *    operations sendbuff == recvbuff + rank * sendcount elements.
 *  - Between chorusGroupStart() and chorusGroupEnd() sends, receives and
 *    collectives are issued as one unit; matching Send/Recv pairs in any order
 *    complete without deadlock.
 *  - Every call returns a chorusResult_t; on failure chorusGetLastError()
 *    returns a message naming the argument, the value and a likely fix.
 *
 * Thread safety: a communicator may be used from one thread at a time, except
 * chorusCommAbort and chorusCommGetAsyncError, which may be called from any
 * thread.
 */
#ifndef CHORUS_CHORUS_H_
#define CHORUS_CHORUS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CHORUS_MAJOR 0
#define CHORUS_MINOR 1
#define CHORUS_PATCH 0
/* chorusGetVersion reports MAJOR*10000 + MINOR*100 + PATCH, as NCCL does. */
#define CHORUS_VERSION_CODE (CHORUS_MAJOR * 10000 + CHORUS_MINOR * 100 + CHORUS_PATCH)

#define CHORUS_UNIQUE_ID_BYTES 128

typedef enum {
  chorusSuccess = 0,
  chorusSystemError = 1,      /* an OS call failed (socket, shm, mmap ...) */
  chorusInternalError = 2,    /* a bug in chorus: please report it */
  chorusInvalidArgument = 3,  /* a bad pointer, count, dtype, op, root or peer */
  chorusInvalidUsage = 4,     /* a call that is not allowed now (destroyed comm, bad group nesting ...) */
  chorusRemoteError = 5,      /* a peer failed or disconnected */
  chorusInProgress = 6,       /* an asynchronous operation has not completed yet */
  chorusTimeout = 7,          /* an operation did not complete within its timeout */
  chorusMismatch = 8,         /* ranks called different operations, counts or types */
  chorusAborted = 9,          /* the communicator was aborted */
  chorusRevoked = 10,         /* a rank revoked the communicator (chorusCommRevoke): shrink it */
  chorusNumResults = 11
} chorusResult_t;

typedef enum {
  chorusInt8 = 0,
  chorusChar = 0,
  chorusUint8 = 1,
  chorusInt32 = 2,
  chorusInt = 2,
  chorusUint32 = 3,
  chorusInt64 = 4,
  chorusUint64 = 5,
  chorusFloat16 = 6,
  chorusHalf = 6,
  chorusFloat32 = 7,
  chorusFloat = 7,
  chorusFloat64 = 8,
  chorusDouble = 8,
  chorusBfloat16 = 9,
  chorusFloat8e4m3 = 10,
  chorusFloat8e5m2 = 11,
  chorusNumTypes = 12,
  /* Not types: they make the enum's range all of int, so that a C caller's
   * out-of-range value (checked and refused by every call) is well defined in C++. */
  chorusDataTypeMinValue_ = -0x7fffffff - 1,
  chorusDataTypeMaxValue_ = 0x7fffffff
} chorusDataType_t;

typedef enum {
  chorusSum = 0,
  chorusProd = 1,
  chorusMax = 2,
  chorusMin = 3,
  chorusAvg = 4,
  chorusNumOps = 5,
  /* Ops created by chorusRedOpCreatePreMulSum are >= chorusNumOps. */
  chorusMaxRedOp = 0x7fffffff,
  chorusMinRedOpValue_ = -0x7fffffff - 1 /* not an op: makes the range all of int (see above) */
} chorusRedOp_t;

/* Where the PreMulSum scalar lives. */
typedef enum {
  chorusScalarDevice = 0, /* pointer read at each call (CPU memory here) */
  chorusScalarHostImmediate = 1 /* value read once, at creation */
} chorusScalarResidence_t;

typedef struct chorusComm* chorusComm_t;
typedef struct chorusStream* chorusStream_t;

typedef struct {
  char internal[CHORUS_UNIQUE_ID_BYTES];
} chorusUniqueId;

/* Library information and errors */
chorusResult_t chorusGetVersion(int* version);
const char* chorusGetErrorString(chorusResult_t result);
/* The message of the last failed call on this thread (comm may be NULL), or of
 * the communicator's asynchronous error.  Never NULL; empty when none. */
const char* chorusGetLastError(chorusComm_t comm);

/* Bootstrap */
chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId);
chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId commId, int rank);
/* Per-communicator settings (NCCL's ncclConfig_t): start from
 * CHORUS_CONFIG_INITIALIZER and change what you need; -1 means "from the
 * environment" (CHORUS_TIMEOUT_MS, CHORUS_CHECK, CHORUS_REPRODUCIBLE). */
typedef struct {
  size_t size;            /* sizeof(chorusConfig_t), set by the initializer */
  unsigned int magic;     /* CHORUS_CONFIG_MAGIC, set by the initializer */
  unsigned int version;   /* CHORUS_VERSION_CODE, set by the initializer */
  int timeoutMs;          /* timeout of every operation and of init, in ms (> 0) */
  int checkMode;          /* 1: every collective checks its signature; 0: only the first */
  /* Reproducible reductions (CHORUS_REPRODUCIBLE): one of CHORUS_REPRODUCIBLE_*.
   * Appended in 0.1: a caller compiled against the older, shorter layout
   * (size without this field) is accepted and gets the environment's value. */
  int reproducible;
  /* Compressed collectives' default (CHORUS_COMPRESS): one of CHORUS_COMPRESS_*
   * (-1: the environment's), and fp8's block, 32..1024 elements per scale
   * (-1: the environment's, else 128).  The default applies to the calls that
   * can be compressed (fp32 allreduce and reduce-scatter with sum, avg or a
   * premulsum op, fp32 allgather); others run uncompressed.  Appended in 0.1,
   * as reproducible was. */
  int compress;
  int compressBlock;
} chorusConfig_t;
#define CHORUS_REPRODUCIBLE_OFF 0       /* plan-dependent rounding (fastest) */
#define CHORUS_REPRODUCIBLE_CANONICAL 1 /* bitwise identical for a given number of ranks */
#define CHORUS_REPRODUCIBLE_EXACT 2     /* correctly rounded sum: identical for any number of ranks */
#define CHORUS_CONFIG_MAGIC 0x63686f72u /* "chor" */
#define CHORUS_CONFIG_INITIALIZER \
  { sizeof(chorusConfig_t), CHORUS_CONFIG_MAGIC, CHORUS_VERSION_CODE, -1, -1, -1, -1, -1 }
chorusResult_t chorusCommInitRankConfig(chorusComm_t* comm, int nranks, chorusUniqueId commId, int rank,
                                        const chorusConfig_t* config);
/* Reads CHORUS_*, torchrun, Open MPI or Slurm variables; see chorus-run --print-env. */
chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm);
/* Collective over comm. color < 0 (CHORUS_SPLIT_NOCOLOR) yields *newcomm = NULL. */
#define CHORUS_SPLIT_NOCOLOR (-1)
chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm);
chorusResult_t chorusCommDestroy(chorusComm_t comm);
chorusResult_t chorusCommAbort(chorusComm_t comm);
/* Fault tolerance: the ranks that are still alive agree on who they are and
 * get a new communicator without the others (ranks renumbered in order).  Call
 * it on every surviving rank after an operation failed with chorusRemoteError;
 * comm may be broken.  A rank that has not joined within the agreement window
 * (CHORUS_SHRINK_WINDOW_MS) is left out and its call fails.  flags must be 0
 * (CHORUS_SHRINK_DEFAULT).  Needs the rendezvous store (rank 0 of the job's
 * first communicator) to be alive. */
#define CHORUS_SHRINK_DEFAULT 0
chorusResult_t chorusCommShrink(chorusComm_t comm, int flags, chorusComm_t* newcomm);
/* Revoke: breaks comm on every rank, so that survivors blocked in a call with
 * a dead rank, or about to start one, stop at once and can shrink.  On this
 * rank at once; on every other rank within about a store round trip (each
 * rank's watchdog is parked on the rendezvous store and reads the notice).
 * Every in-flight and later call on comm fails with chorusRevoked naming the
 * revoking rank.  Safe from any thread; a second revoke is a no-op.  Needs the
 * rendezvous store to tell the others (without it only this rank breaks). */
chorusResult_t chorusCommRevoke(chorusComm_t comm);
/* Grow: every rank of comm calls chorusCommGrow(comm, nnew, &newcomm) while nnew
 * new processes call chorusCommJoin with the job's unique id (the id of the
 * communicator the job's first communicator was made from: the root store's
 * address and the job secret).  *newcomm holds comm's ranks under their
 * numbers, then the joiners in the order they arrived (ranks comm's size ...
 * size + nnew - 1).  Joiners are served first come, first served across the
 * job's grows.  comm must be healthy (shrink a broken one first). */
chorusResult_t chorusCommGrow(chorusComm_t comm, int nnew, chorusComm_t* newcomm);
chorusResult_t chorusCommJoin(chorusUniqueId commId, chorusComm_t* newcomm);
chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError);
chorusResult_t chorusCommCount(const chorusComm_t comm, int* count);
chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank);

/* Reduction ops */
chorusResult_t chorusRedOpCreatePreMulSum(chorusRedOp_t* op, void* scalar, chorusDataType_t datatype,
                                          chorusScalarResidence_t residence, chorusComm_t comm);
chorusResult_t chorusRedOpDestroy(chorusRedOp_t op, chorusComm_t comm);

/* Collectives */
chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                               int root, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                            chorusRedOp_t op, int root, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                               chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                   chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                   chorusStream_t stream);
chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                              chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusAllGatherV(const void* sendbuff, size_t sendcount, void* recvbuff, const size_t* recvcounts,
                                const size_t* displs, chorusDataType_t datatype, chorusComm_t comm,
                                chorusStream_t stream);
chorusResult_t chorusAllToAllV(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                               void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                               chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                            int root, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount, chorusDataType_t datatype,
                             int root, chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                          chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer, chorusComm_t comm,
                          chorusStream_t stream);
chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream);

/* Groups (may nest; the outermost End issues the group) */
chorusResult_t chorusGroupStart(void);
chorusResult_t chorusGroupEnd(void);

/* Streams: FIFOs executed in the background by communicators' progress engines. */
chorusResult_t chorusStreamCreate(chorusStream_t* stream);
/* Waits for every operation queued on the stream; returns the first error among them. */
chorusResult_t chorusStreamSynchronize(chorusStream_t stream);
/* chorusSuccess when all queued work is done, chorusInProgress otherwise, or its error. */
chorusResult_t chorusStreamQuery(chorusStream_t stream);
chorusResult_t chorusStreamDestroy(chorusStream_t stream);

/* chorus extensions */

/* The algorithm the communicator's tuner picks for a call of this shape
 * (collective as chorus-bench names it: "allreduce", "allgather", ...; count as
 * the collective's own count argument) and the cost model's predicted time in
 * microseconds, for the call as a plain call runs it: with the communicator's
 * default compression (config.compress / CHORUS_COMPRESS) where that applies
 * (a sum of float32).  algo receives a NUL-terminated name (truncated to algo_len). */
chorusResult_t chorusCommPredict(chorusComm_t comm, const char* collective, size_t count,
                                 chorusDataType_t datatype, int inplace, char* algo, size_t algo_len,
                                 double* predicted_us);

/* Replaces the communicator's CHORUS_ALGO overrides for later calls (same
 * syntax, e.g. "allreduce:ring;allgather:bruck"; "" lets the cost model choose
 * again).  Waits for queued work.  Every rank must set the same overrides at
 * the same point in its sequence of calls (as with CHORUS_ALGO).  Unknown
 * names are chorusInvalidArgument and leave the overrides unchanged. */
chorusResult_t chorusCommSetAlgo(chorusComm_t comm, const char* spec);

/* Compressed collectives (docs/algorithms.md, "Compressed reductions"): fp32
 * data crosses the wire as bf16, or as fp8 e4m3 with one fp32 scale per block
 * of elements, and is summed in fp32 wherever contributions combine.  Each
 * element is quantized at most twice by an allreduce and once by a
 * reduce-scatter or an allgather, which bounds the error (the derivation is in
 * the docs).  Every rank gets the same bits.
 * A call's options: start from CHORUS_CALL_OPTIONS_INITIALIZER.  compress is
 * CHORUS_COMPRESS_DEFAULT (the communicator's: chorusConfig_t.compress or
 * CHORUS_COMPRESS), _OFF, _BF16 or _FP8; fp8Block 32..1024 or -1 (the
 * communicator's, else 128).  Asking for a format the call cannot use (a type
 * other than chorusFloat32, an op other than sum, avg or premulsum, a block out
 * of range, CHORUS_REPRODUCIBLE set) is chorusInvalidArgument naming the
 * argument and the supported values, never a silently uncompressed call.
 * All ranks must pass the same options.  options == NULL: the defaults. */
#define CHORUS_COMPRESS_DEFAULT (-1)
#define CHORUS_COMPRESS_OFF 0
#define CHORUS_COMPRESS_BF16 1
#define CHORUS_COMPRESS_FP8 2
typedef struct {
  size_t size; /* sizeof(chorusCallOptions_t), set by the initializer */
  int compress;
  int fp8Block;
} chorusCallOptions_t;
#define CHORUS_CALL_OPTIONS_INITIALIZER { sizeof(chorusCallOptions_t), CHORUS_COMPRESS_DEFAULT, -1 }
chorusResult_t chorusAllReduceEx(const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                                 chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream,
                                 const chorusCallOptions_t* options);
chorusResult_t chorusReduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                     chorusStream_t stream, const chorusCallOptions_t* options);
chorusResult_t chorusAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount, chorusDataType_t datatype,
                                 chorusComm_t comm, chorusStream_t stream, const chorusCallOptions_t* options);

/* Primitives: operations composed of collectives, point-to-point transfers and
 * local work, registered by name (docs/architecture.md, "Primitives"), e.g.
 * "alltoallv_dynamic" (an all-to-all-v whose receive counts come from the
 * senders: MoE dispatch's communication).  Start from
 * CHORUS_PRIMITIVE_ARGS_INITIALIZER and set the fields the primitive reads
 * (chorusPrimitiveList gives each one's summary).  Collective over comm: every
 * rank calls it with the same name.  It runs on the caller's thread; on a
 * stream it first waits for the stream's queued work; it is complete when it
 * returns.  Not allowed inside a group.  An unknown name is
 * chorusInvalidArgument listing the registered ones. */
typedef struct {
  size_t size; /* sizeof(chorusPrimitiveArgs_t), set by the initializer */
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  chorusDataType_t datatype;
  chorusRedOp_t op;
  int root;
  const size_t* counts; /* ncounts entries (per peer or per item) */
  size_t ncounts;
  size_t* outCounts; /* nOutCounts entries the primitive fills */
  size_t nOutCounts;
  void* aux; /* a primitive-specific block of auxBytes */
  size_t auxBytes;
} chorusPrimitiveArgs_t;
#define CHORUS_PRIMITIVE_ARGS_INITIALIZER \
  { sizeof(chorusPrimitiveArgs_t), NULL, NULL, 0, chorusFloat32, chorusSum, 0, NULL, 0, NULL, 0, NULL, 0 }
chorusResult_t chorusPrimitive(const char* name, const chorusPrimitiveArgs_t* args, chorusComm_t comm,
                               chorusStream_t stream);
/* The registered primitives, one "name: summary" per line, NUL-terminated
 * (truncated to len); *needed (may be NULL) receives the full length + 1. */
chorusResult_t chorusPrimitiveList(char* list, size_t len, size_t* needed);

/* Expert parallelism: MoE token dispatch and combine (DeepEP-shaped; docs/ep.md).
 *
 * Experts are spread evenly over the ranks: expert e lives on rank
 * e / (numExperts / nranks), which holds numExperts / nranks "local" experts.
 * A step of a MoE layer is, on every rank:
 *
 *   chorusEpLayout(ep, topkIdx, numTokens, ...)     the router's top-k ids [numTokens x topk]:
 *                                                   per-rank / per-host / per-expert counts,
 *                                                   the send order, and (one all-to-all of
 *                                                   counts) how many rows this rank receives
 *   chorusEpDispatch(ep, x, topkWeights, recvX, ...) each token crosses once to each rank that
 *                                                   holds one of its experts (not once per
 *                                                   expert); recvX holds the received tokens
 *                                                   grouped by local expert
 *   ... the local experts run on recvX ...
 *   chorusEpCombine(ep, expertOut, weights, out)    expert outputs back to their tokens,
 *                                                   weighted and summed in a fixed order
 *
 * The handle holds the layout of the last chorusEpLayout and the received
 * rows' routing of the last chorusEpDispatch (the "index to undo it"):
 * combine undoes that dispatch.  Every call is collective over comm (the
 * communicator the handle was created on) and complete when it returns (on a
 * stream it first waits for the stream's queued work).  Not allowed inside a
 * group.  Handles are not thread-safe: one thread at a time per handle.
 *
 * Layout of recvX: rows of `hidden` elements, expert-major: all rows of local
 * expert 0 (recvPerExpert[0] of them), then local expert 1, ...; within an
 * expert, by source rank, then by the source's token index.  A token that
 * chose two experts of one rank crosses once and appears in both groups.
 *
 * Combine's order (deterministic, bitwise equal to any reference that sums
 * the same way): for each token, on each rank holding its experts, a float32
 * accumulator starting at +0 adds weight * expertOut of the token's experts
 * there in ascending expert id (each product rounded to float32, then added);
 * the partial is rounded to the datatype and sent home; at home a float32
 * accumulator starting at +0 adds the partials in ascending rank order and is
 * rounded once to the datatype.  Experts of a rank are consecutive ids, so this
 * visits the token's experts in ascending id, summed per rank then across ranks.
 * The result depends on the rank count (the grouping), not on timing.
 * With node-limited routing the rank partials of one host are first summed at
 * the host's relay (a float32 accumulator from +0, the host's ranks in
 * ascending order, rounded to the datatype: one row per host crosses the
 * network), and home adds those host partials from +0 in ascending host order
 * (hosts numbered by their lowest rank), rounded once.
 *
 * Bad input is refused on every rank (chorusInvalidArgument naming the
 * argument on the rank that passed it, and that rank on the others), before
 * any data moves: a rank's bad call fails the call everywhere, never hangs
 * its peers.  A peer that dies mid-call fails the call (chorusRemoteError),
 * as in any collective. */
typedef struct chorusEpHandle* chorusEpHandle_t;
typedef struct {
  size_t size;                /* sizeof(chorusEpConfig_t), set by the initializer */
  int numExperts;             /* > 0, a multiple of the rank count */
  int topk;                   /* experts per token, 1..numExperts */
  size_t hidden;              /* elements per token row, > 0 */
  chorusDataType_t datatype;  /* payload of dispatch and combine: chorusFloat32 or chorusBfloat16 */
  chorusDataType_t indexType; /* topkIdx's type: chorusInt32 or chorusInt64 (torch.topk gives int64) */
  /* Node-limited routing: 0 = off (each token goes straight to every rank
   * holding one of its experts).  M > 0: every token's experts must lie on at
   * most M hosts (the router's job, e.g. group-limited gating; a token beyond
   * is chorusInvalidArgument), and a token crosses once to each of its hosts,
   * to that host's relay (the rank of that host with the sender's local
   * index, modulo the host's size), which forwards it to the ranks of its host
   * that hold its experts.  Hosts: ranks joined by shared memory
   * (CHORUS_HOST_ID splits a machine). */
  int maxHostsPerToken;
  /* Dispatch's wire format (combine always moves the datatype):
   * CHORUS_COMPRESS_OFF (or _DEFAULT): the datatype; CHORUS_COMPRESS_BF16;
   * CHORUS_COMPRESS_FP8: e4m3 with one float32 scale per fp8Block elements of
   * a row (the compressed collectives' encoding, docs/algorithms.md
   * "Compressed wire formats").  The receiver decodes each row once into
   * float32 and rounds it to the datatype into recvX; the weights and ids
   * travel exactly.  fp8Block: 32..1024, or -1 (128). */
  int dispatchCompress;
  int fp8Block;
  /* Low-latency mode (decode; chorusEpLowLatencyDispatch/Combine): at most
   * this many tokens per rank per call, which sizes the fixed receive
   * buffers; 0 = off.  Needs maxHostsPerToken = 0. */
  int lowLatencyMaxTokens;
} chorusEpConfig_t;
#define CHORUS_EP_CONFIG_INITIALIZER \
  { sizeof(chorusEpConfig_t), 0, 0, 0, chorusBfloat16, chorusInt64, 0, CHORUS_COMPRESS_OFF, -1, 0 }
/* Collective over comm: every rank's config is checked and compared (a bad or
 * differing one fails the call on every rank, naming the field). */
chorusResult_t chorusEpCreate(chorusEpHandle_t* ep, const chorusEpConfig_t* config, chorusComm_t comm);
chorusResult_t chorusEpDestroy(chorusEpHandle_t ep);
/* The number of hosts of the handle's communicator (tokensPerHost's length)
 * and of local experts (recvPerExpert's length). */
chorusResult_t chorusEpGetInfo(chorusEpHandle_t ep, int* numHosts, int* numLocalExperts);
/* topkIdx: numTokens x topk ids of config.indexType, each in [0, numExperts),
 * no id twice in a row.  Outputs (each may be NULL): tokensPerRank[nranks] and
 * tokensPerHost[numHosts] (tokens this rank sends to each rank / host, a
 * token counted once however many of its experts are there),
 * tokensPerExpert[numExperts] (this rank's tokens per expert), recvPerExpert
 * [numLocalExperts] (rows dispatch will write per local expert, from all
 * ranks), *numRecv (their sum: recvX's rows).  numTokens may be 0. */
chorusResult_t chorusEpLayout(chorusEpHandle_t ep, const void* topkIdx, size_t numTokens, size_t* tokensPerRank,
                              size_t* tokensPerHost, size_t* tokensPerExpert, size_t* recvPerExpert,
                              size_t* numRecv, chorusComm_t comm, chorusStream_t stream);
/* The send order of the last layout: the token indices sent to rank 0 (in
 * ascending order), then to rank 1, ...: sum(tokensPerRank) entries, or with
 * node-limited routing the tokens sent to each host's relay, sum(tokensPerHost)
 * (*needed receives it; order may be NULL). */
chorusResult_t chorusEpSendOrder(chorusEpHandle_t ep, size_t* order, size_t len, size_t* needed);
/* x: numTokens x hidden of datatype (the layout's tokens).  topkWeights:
 * numTokens x topk float32 (the gate's scores) or NULL (all 1).  recvX: room
 * for recvCapacity rows (>= *numRecv of the layout); recvWeights: NULL or
 * recvCapacity float32, row i receives the weight of its (token, expert). */
chorusResult_t chorusEpDispatch(chorusEpHandle_t ep, const void* x, const float* topkWeights, void* recvX,
                                float* recvWeights, size_t recvCapacity, chorusComm_t comm, chorusStream_t stream);
/* chorusEpDispatch handing the experts the fp8 wire itself (DeepEP's fp8
 * recv_x and its per-block scales), not decoded: config.dispatchCompress must
 * be CHORUS_COMPRESS_FP8 and config.hidden a multiple of the fp8 block
 * (config.fp8Block, -1: 128).  recvCodes: room for recvCapacity rows of
 * hidden e4m3 codes (uint8, row i at i * hidden, the rows grouped as
 * chorusEpDispatch's recvX); recvScales: scalesCapacity float32 (>= numRecv *
 * hidden / block), row i's scales at i * hidden / block, block j's at + j.
 * Element h of row i is e4m3(recvCodes[i * hidden + h]) * its block's scale:
 * the codes and scales the sender's quantizer made (scale = amax / 256 per
 * block; docs/ep.md).  recvWeights and recvCapacity as chorusEpDispatch; a
 * chorusEpCombine after it undoes it (expertOut in the datatype). */
chorusResult_t chorusEpDispatchFp8(chorusEpHandle_t ep, const void* x, const float* topkWeights, uint8_t* recvCodes,
                                   float* recvScales, size_t scalesCapacity, float* recvWeights, size_t recvCapacity,
                                   chorusComm_t comm, chorusStream_t stream);
/* expertOut: numRecv x hidden of datatype, rows as dispatch's recvX.
 * weights: numRecv float32 (e.g. dispatch's recvWeights) or NULL (all 1).
 * out: numTokens x hidden of datatype (the layout's tokens). */
chorusResult_t chorusEpCombine(chorusEpHandle_t ep, const void* expertOut, const float* weights, void* out,
                               chorusComm_t comm, chorusStream_t stream);
/* The adjoint of dispatch's recvWeights: rowValues (numRecv float32, rows as
 * recvX) go back to topkValues[t * topk + j] (numTokens x topk float32), the
 * (token, expert) each row came from.  No arithmetic: each value lands once
 * (a torch backward's gradient of the gate scores). */
chorusResult_t chorusEpReturnTopk(chorusEpHandle_t ep, const float* rowValues, float* topkValues,
                                  chorusComm_t comm, chorusStream_t stream);

/* Low-latency mode (config.lowLatencyMaxTokens = M > 0; DeepEP's low-latency
 * kernels' shape): no layout call and no count exchange before the data.
 * Dispatch takes the router's ids itself and sends every rank one block of a
 * fixed size (room for M rows, padding included: the bytes do not depend on
 * the routing) in one all-to-all.  recvX: numLocalExperts x (nranks * M)
 * rows of hidden elements, expert e's rows at [e * nranks * M, + recvCount[e])
 * by source rank then token (the normal dispatch's grouping at fixed
 * offsets); recvWeights (may be NULL) likewise, one float32 per row;
 * recvCount[numLocalExperts].  numTokens > M on any rank (its blocks would
 * overflow), or any bad argument, fails the call on every rank
 * (chorusInvalidArgument, naming the rank) before anything is written.
 * Combine undoes the last low-latency dispatch: expertOut and weights (may
 * be NULL) in recvX's layout; out: numTokens x hidden, summed in the normal
 * combine's order (the same bits as chorusEpCombine with direct routing). */
chorusResult_t chorusEpLowLatencyDispatch(chorusEpHandle_t ep, const void* topkIdx, size_t numTokens, const void* x,
                                          const float* topkWeights, void* recvX, float* recvWeights, size_t* recvCount,
                                          chorusComm_t comm, chorusStream_t stream);
chorusResult_t chorusEpLowLatencyCombine(chorusEpHandle_t ep, const void* expertOut, const float* weights, void* out,
                                         chorusComm_t comm, chorusStream_t stream);

/* ---------------------------------------------------------------------------
 * KV-cache transfer engine (docs/kv.md): agents register memory, exchange a
 * metadata blob, and move descriptor lists with one-sided writes and reads.
 * Every pair of agents that load each other's metadata gets a transport of
 * its own through the bootstrap store (no communicator).  An agent is used
 * by one thread at a time; its transfers and its peers' accesses move only
 * inside its calls (chorusKvTest, chorusKvWait, chorusKvProgress,
 * chorusKvGetNotif). */
typedef struct chorusKvAgent* chorusKvAgent_t;
typedef struct {
  uint32_t localRegion;  /* this agent's region (chorusKvRegister) */
  uint64_t localOffset;
  uint32_t remoteRegion; /* the peer's region, as its metadata lists it */
  uint64_t remoteOffset;
  uint64_t bytes;
} chorusKvDesc_t;
#define CHORUS_KV_READ 1  /* peers may read the region */
#define CHORUS_KV_WRITE 2 /* peers may write it */
/* name: [A-Za-z0-9_.-]{1,64}, unique among the store's agents.  storeId: the
 * store's chorusGetUniqueId; serveStore != 0: this agent runs the store
 * (the process that called chorusGetUniqueId; the store lives as long as
 * this agent).  The config comes from the environment (CHORUS_*). */
chorusResult_t chorusKvAgentCreate(chorusKvAgent_t* agent, const char* name, chorusUniqueId storeId, int serveStore);
chorusResult_t chorusKvAgentDestroy(chorusKvAgent_t agent);
/* access: CHORUS_KV_READ | CHORUS_KV_WRITE.  *region: its index. */
chorusResult_t chorusKvRegister(chorusKvAgent_t agent, void* base, size_t bytes, int access, uint32_t* region);
chorusResult_t chorusKvDeregister(chorusKvAgent_t agent, uint32_t region);
/* The metadata blob into blob[capacity] (*size: its length; a NULL blob or a
 * too-small capacity only sets *size).  chorusKvPublishMetadata puts it in
 * the store, where chorusKvConnect finds it by name. */
chorusResult_t chorusKvGetMetadata(chorusKvAgent_t agent, void* blob, size_t capacity, size_t* size);
chorusResult_t chorusKvPublishMetadata(chorusKvAgent_t agent);
/* Loads a peer's blob (untrusted bytes: validated); the first load of a peer
 * sets up the pair's transport, collectively with the peer's load of this
 * agent's blob (both must call it).  peerName (may be NULL): the peer's name,
 * NUL-terminated, into nameCapacity bytes. */
chorusResult_t chorusKvLoadRemote(chorusKvAgent_t agent, const void* blob, size_t size, char* peerName,
                                  size_t nameCapacity);
/* chorusKvLoadRemote of the blob `peer` published, waiting up to timeoutMs. */
chorusResult_t chorusKvConnect(chorusKvAgent_t agent, const char* peer, int timeoutMs);
chorusResult_t chorusKvDisconnect(chorusKvAgent_t agent, const char* peer);
/* A batch of n descriptors to `peer`: writes (local -> remote) or reads
 * (remote -> local).  notify != 0: the peer gets notifValue once every
 * descriptor completed.  Checked before anything moves; *xfer: its id. */
chorusResult_t chorusKvPostWrite(chorusKvAgent_t agent, const char* peer, const chorusKvDesc_t* descs, size_t n,
                                 int notify, uint64_t notifValue, uint64_t* xfer);
chorusResult_t chorusKvPostRead(chorusKvAgent_t agent, const char* peer, const chorusKvDesc_t* descs, size_t n,
                                int notify, uint64_t notifValue, uint64_t* xfer);
chorusResult_t chorusKvProgress(chorusKvAgent_t agent);
/* chorusSuccess: done; chorusInProgress: pending; chorusAborted: cancelled;
 * another code: the transfer failed (chorusGetLastError(NULL) says why). */
chorusResult_t chorusKvTest(chorusKvAgent_t agent, uint64_t xfer);
/* chorusKvTest's answers once the transfer is no longer pending, or
 * chorusTimeout after timeoutMs. */
chorusResult_t chorusKvWait(chorusKvAgent_t agent, uint64_t xfer, int timeoutMs);
chorusResult_t chorusKvCancel(chorusKvAgent_t agent, uint64_t xfer);
/* Forgets a finished transfer. */
chorusResult_t chorusKvRelease(chorusKvAgent_t agent, uint64_t xfer);
/* The oldest notification: *got = 1, its sender's name and value; or *got = 0. */
chorusResult_t chorusKvGetNotif(chorusKvAgent_t agent, char* peerName, size_t nameCapacity, uint64_t* value, int* got);

#ifdef __cplusplus
}
#endif

#endif /* CHORUS_CHORUS_H_ */
