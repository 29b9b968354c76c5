/*
 * chorus — memory spaces: collectives on device buffers (docs/device.md).
 *
 * An extension of the C ABI of <chorus/chorus.h>, in a header of its own.
 */
#ifndef CHORUS_DEVICE_H_
#define CHORUS_DEVICE_H_

#include <chorus/chorus.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Memory spaces (docs/device.md).  A call's buffers are in the memory space
 * of the stream it is issued on: host memory on the NULL stream and on
 * chorusStreamCreate's streams; OpenCL buffers on a stream made from an
 * OpenCL command queue (chorusStreamCreateOpenCL), as NCCL's calls take device
 * pointers and a cudaStream_t.  Host calls are unchanged.
 *
 * OpenCL buffers are named by device addresses: chorusMemRegisterOpenCL(clMem,
 * &dev) gives the cl_mem a range of reserved address space as long as the
 * buffer (never host memory; not dereferenceable), and a call passes
 * dev + byte offset where it would pass a pointer (in-place calls as usual:
 * the same address, or an address inside the other buffer).  A call on an
 * OpenCL stream checks each buffer: a host pointer (not in a registered
 * buffer), a length past the end of its cl_mem (CL_MEM_SIZE), or a buffer of
 * another context than the queue's is chorusInvalidArgument naming the
 * argument; a device address on a host stream likewise.
 *
 * Completion follows the queue's order, as NCCL's calls on a stream: the call
 * enqueues the reads (or maps) of its inputs after the queue's earlier
 * commands and the writes (or unmaps) of its outputs behind a user event, and
 * returns; the communicator's device worker runs the collective once the
 * inputs are there and then releases the writes, so later commands of the
 * queue see the results.  chorusStreamSynchronize (clFinish, then the first
 * error of a collective that failed after its call returned) or the call's
 * event (chorusStreamGetEventOpenCL) waits for them.  CHORUS_DEVICE_ASYNC=0:
 * the call returns after its collective ran.  A group of calls on OpenCL
 * streams only returns from chorusGroupEnd likewise.  CHORUS_DEVICE_STAGING says how
 * the bytes move (map, pipelined chunks, whole buffers; docs/device.md).
 * Every collective, send/recv and groups run on an OpenCL stream; primitives
 * and the EP calls do not (chorusInvalidUsage).  The OpenCL types are passed
 * as void* so that this header needs no OpenCL header. */
typedef enum {
  chorusMemHost = 0,
  chorusMemOpenCL = 1,
  chorusMemCuda = 2, /* device pointers (cuMemAlloc) on a stream made from a CUstream (chorusStreamCreateCuda) */
  chorusNumMemSpaces = 3,
  chorusMemSpaceMaxValue_ = 0x7fffffff /* not a space: makes the range all of int, as chorus.h's enums */
} chorusMemSpace_t;
/* *available = 1 when this process can use the space, else 0 and the reason
 * in why (NUL-terminated, truncated to len; why may be NULL): "no OpenCL
 * platform", "no CUDA driver (libcuda.so.1: ...)", "built without OpenCL". */
chorusResult_t chorusMemSpaceQuery(chorusMemSpace_t space, int* available, char* why, size_t len);
/* clMem: a cl_mem buffer (clCreateBuffer; not a sub-buffer).  *devPtr: its
 * device address.  The cl_mem is retained until chorusMemDeregister. */
chorusResult_t chorusMemRegisterOpenCL(void* clMem, void** devPtr);
chorusResult_t chorusMemDeregister(void* devPtr);
/* clQueue: an in-order cl_command_queue (retained by the stream). */
chorusResult_t chorusStreamCreateOpenCL(chorusStream_t* stream, void* clQueue);
/* CUDA (docs/device.md, "CUDA"): a stream whose calls take CUDA device
 * pointers (cuMemAlloc; passed as they are, no registration), enqueued on
 * cuStream (a CUstream; NULL: the legacy default stream of the calling
 * thread's current context) in its order, as NCCL's calls on a
 * cudaStream_t: the call returns once its copies and a wait of the stream
 * are enqueued, and the stream's later work sees the results.  The driver
 * (libcuda.so.1, or CHORUS_CUDA_DRIVER) is loaded at the first CUDA call;
 * without it this is chorusSystemError, saying why.  A pointer the driver
 * does not know as device memory, a buffer of another context, or a length
 * past its allocation (cuMemGetAddressRange) is chorusInvalidArgument naming
 * the argument. */
chorusResult_t chorusStreamCreateCuda(chorusStream_t* stream, void* cuStream);
chorusResult_t chorusStreamGetMemSpace(chorusStream_t stream, chorusMemSpace_t* space);
/* *clEvent: the cl_event of the stream's last call (complete when its outputs
 * are written), retained for the caller (clReleaseEvent it), or NULL. */
chorusResult_t chorusStreamGetEventOpenCL(chorusStream_t stream, void** clEvent);

#ifdef __cplusplus
}
#endif

#endif /* CHORUS_DEVICE_H_ */
