/* comm_nccl.c — the NCCL device transport of comm (src/comm_dev.h; see comm_nccl.h). */
#include "comm_nccl.h"

#include <mpi.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "comm_cuda.h"

struct tsr_comm_dev {
  ncclComm_t nccl;
  cudaStream_t stream; /* this group's operations, in order */
  cudaEvent_t ready;   /* the compute stream's work so far, for the stream to wait on */
  int size, rank;
  char name[32];
};

struct tsr_comm_dev_event {
  cudaEvent_t ev;
  struct tsr_comm_dev_event *next; /* the pool of events not in use */
};
static struct tsr_comm_dev_event *pool;

/* ---------------------------------------------------------------- the communicator */

static void nc_destroy(tsr_comm_dev **dp) {
  tsr_comm_dev *d = *dp;
  if (!d) return;
  if (d->stream) cudaStreamSynchronize(d->stream);
  if (d->nccl) ncclCommDestroy(d->nccl);
  if (d->ready) cudaEventDestroy(d->ready);
  if (d->stream) cudaStreamDestroy(d->stream);
  tsr_free(dp);
}

/* 1 when two ranks of comm drive the same physical GPU (NCCL refuses that). */
static int shares_gpu(MPI_Comm comm, int size) {
  char bus[32] = "";
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, tsr_cuda_ops_device()) != cudaSuccess) {
    cudaGetLastError();
    snprintf(bus, sizeof bus, "device %d", tsr_cuda_ops_device());
  }
  char *all = tsr_calloc((size_t)size, sizeof bus);
  if (!all) return 1; /* then MPI: slower, never wrong */
  int same = 0;
  if (MPI_Allgather(bus, sizeof bus, MPI_CHAR, all, sizeof bus, MPI_CHAR, comm) != MPI_SUCCESS)
    same = 1;
  for (int r = 0; r < size && !same; r++)
    for (int q = r + 1; q < size && !same; q++)
      same = strncmp(all + r * sizeof bus, all + q * sizeof bus, sizeof bus) == 0;
  tsr_free(&all);
  return same;
}

static int nc_create(tsr_comm_dev **out, const void *mpi_comm, const char *name) {
  const MPI_Comm comm = *(const MPI_Comm *)mpi_comm;
  *out = NULL;
  int size, rank;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  int any_shared = shares_gpu(comm, size);
  MPI_Allreduce(MPI_IN_PLACE, &any_shared, 1, MPI_INT, MPI_MAX, comm);
  if (any_shared) {
    if (tsr_rank() == 0)
      tsr_log("nccl: two ranks of '%s' share a GPU (run.gpu_share), which NCCL cannot do: its "
              "collectives stay on MPI",
              name);
    return 0;
  }
  tsr_comm_dev *d = tsr_calloc(1, sizeof *d);
  int ok = d != NULL;
  if (d) {
    d->size = size, d->rank = rank;
    snprintf(d->name, sizeof d->name, "%s", name);
    ok = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking) == cudaSuccess &&
         cudaEventCreateWithFlags(&d->ready, cudaEventDisableTiming) == cudaSuccess;
  }
  /* the unique id goes from the group's rank 0 to the others, with whether it has one */
  struct { ncclUniqueId id; int ok; } msg;
  memset(&msg, 0, sizeof msg);
  msg.ok = ok;
  if (rank == 0 && ok) msg.ok = ncclGetUniqueId(&msg.id) == ncclSuccess;
  MPI_Bcast(&msg, sizeof msg, MPI_BYTE, 0, comm);
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  if (!ok || !msg.ok) {
    tsr_error("nccl: setting up '%s' failed on %s (out of memory, a stream or an event, or "
              "ncclGetUniqueId)", name, ok ? "rank 0" : "some rank");
    nc_destroy(&d);
    return TSR_ERR;
  }
  ncclResult_t r = ncclCommInitRank(&d->nccl, size, msg.id, rank);
  int good = r == ncclSuccess;
  if (!good) {
    tsr_error("nccl: ncclCommInitRank for '%s' (rank %d of %d): %s (%s)", name, rank, size,
              ncclGetErrorString(r), ncclGetLastError(NULL));
    d->nccl = NULL;
  }
  MPI_Allreduce(MPI_IN_PLACE, &good, 1, MPI_INT, MPI_MIN, comm);
  if (!good) {
    nc_destroy(&d);
    return TSR_ERR;
  }
  *out = d;
  return 0;
}

/* ---------------------------------------------------------------- operations */

/* The group's stream waits for the compute work queued so far (which wrote the buffers). */
static int enter(tsr_comm_dev *d) {
  TSR_CUDA_CALL(cudaEventRecord(d->ready, tsr_cuda_compute_stream()));
  TSR_CUDA_CALL(cudaStreamWaitEvent(d->stream, d->ready, 0));
  return 0;
}

static ncclRedOp_t red_op(int op) { return op == 1 ? ncclMax : op == 2 ? ncclMin : ncclSum; }
/* NCCL's bf16 and fp16 sums add in fp32 and round each partial sum, as comm.h says. */
static ncclDataType_t nccl_type(tsr_comm_dev_type t) {
  switch (t) {
    case TSR_CUDA_DOUBLE: return ncclFloat64;
    case TSR_CUDA_INT: return ncclInt32;
    case TSR_CUDA_BF16: return ncclBfloat16;
    case TSR_CUDA_F16: return ncclFloat16;
    default: return ncclFloat32;
  }
}
static size_t type_size(tsr_comm_dev_type t) {
  return t == TSR_CUDA_DOUBLE ? 8 : t == TSR_CUDA_BF16 || t == TSR_CUDA_F16 ? 2 : 4;
}

static int nc_all_reduce(tsr_comm_dev *d, void *buf, size_t count, tsr_comm_dev_type t, int op) {
  TSR_CALL(enter(d));
  TSR_NCCL_CALL(d, ncclAllReduce(buf, buf, count, nccl_type(t), red_op(op), d->nccl, d->stream));
  return 0;
}

static int even(const tsr_comm_dev *d, const size_t *counts) {
  for (int r = 1; r < d->size; r++)
    if (counts[r] != counts[0]) return 0;
  return 1;
}

/* Uneven blocks: one reduce to each block's owner, fused into one NCCL group. */
static int nc_reduce_scatter(tsr_comm_dev *d, const void *send, void *recv, const size_t *counts,
                             tsr_comm_dev_type t) {
  TSR_CALL(enter(d));
  const ncclDataType_t nt = nccl_type(t);
  if (even(d, counts)) {
    TSR_NCCL_CALL(d, ncclReduceScatter(send, recv, counts[0], nt, ncclSum, d->nccl, d->stream));
    return 0;
  }
  const size_t es = type_size(t);
  TSR_NCCL_CALL(d, ncclGroupStart());
  size_t off = 0;
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < d->size; off += counts[r], r++) {
    if (!counts[r]) continue; /* every rank skips the same blocks */
    ncclResult_t e = ncclReduce((const char *)send + es * off, recv, counts[r], nt, ncclSum, r,
                                d->nccl, d->stream);
    if (e != ncclSuccess && first == ncclSuccess) first = e;
  }
  TSR_NCCL_CALL(d, ncclGroupEnd());
  TSR_NCCL_CALL(d, first);
  return 0;
}

/* Uneven blocks: one broadcast from each block's owner, fused into one NCCL group.  In
 * place when send is this rank's block of recv (NCCL's in-place all-gather too). */
static int nc_all_gather(tsr_comm_dev *d, const void *send, void *recv, const size_t *counts,
                         tsr_comm_dev_type t) {
  TSR_CALL(enter(d));
  const ncclDataType_t nt = nccl_type(t);
  if (even(d, counts)) {
    TSR_NCCL_CALL(d, ncclAllGather(send, recv, counts[0], nt, d->nccl, d->stream));
    return 0;
  }
  const size_t es = type_size(t);
  TSR_NCCL_CALL(d, ncclGroupStart());
  size_t off = 0;
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < d->size; off += counts[r], r++) {
    if (!counts[r]) continue;
    char *block = (char *)recv + es * off;
    ncclResult_t e = ncclBroadcast(r == d->rank ? send : block, block, counts[r], nt, r, d->nccl,
                                   d->stream);
    if (e != ncclSuccess && first == ncclSuccess) first = e;
  }
  TSR_NCCL_CALL(d, ncclGroupEnd());
  TSR_NCCL_CALL(d, first);
  return 0;
}

static int nc_broadcast(tsr_comm_dev *d, void *buf, size_t bytes, int root) {
  TSR_CALL(enter(d));
  TSR_NCCL_CALL(d, ncclBroadcast(buf, buf, bytes, ncclUint8, root, d->nccl, d->stream));
  return 0;
}

/* ---------------------------------------------------------------- completion */

static int nc_record(tsr_comm_dev *d, tsr_comm_dev_event **out) {
  *out = NULL;
  struct tsr_comm_dev_event *e = pool;
  if (e) {
    pool = e->next;
  } else {
    e = tsr_calloc(1, sizeof *e);
    TSR_CHECK(e, TSR_ERR, "nccl: out of memory for an event");
    cudaError_t ce = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
      tsr_free(&e);
      tsr_error("nccl: cudaEventCreateWithFlags: %s", cudaGetErrorString(ce));
      return TSR_ERR;
    }
  }
  *out = e;
  TSR_CUDA_CALL(cudaEventRecord(e->ev, d->stream));
  return 0;
}

static int nc_wait(tsr_comm_dev_event **ep) {
  struct tsr_comm_dev_event *e = *ep;
  if (!e) return 0;
  *ep = NULL;
  cudaError_t ce = cudaStreamWaitEvent(tsr_cuda_compute_stream(), e->ev, 0);
  e->next = pool;
  pool = e;
  TSR_CUDA_CALL(ce);
  return 0;
}

static int nc_query(tsr_comm_dev_event *e, int *done) {
  cudaError_t ce = cudaEventQuery(e->ev);
  *done = ce == cudaSuccess;
  if (ce == cudaErrorNotReady) {
    cudaGetLastError(); /* not an error: still running */
    return 0;
  }
  TSR_CUDA_CALL(ce);
  return 0;
}

static void nc_close(void) {
  while (pool) {
    struct tsr_comm_dev_event *e = pool;
    pool = e->next;
    cudaEventDestroy(e->ev);
    tsr_free(&e);
  }
}

const tsr_comm_transport tsr_cuda_nccl_transport = {
    "nccl",        nc_create,    nc_destroy, tsr_cuda_is_device_memory, nc_all_reduce, nc_reduce_scatter,
    nc_all_gather, nc_broadcast, nc_record,  nc_wait,      nc_query,          nc_close,
    NULL /* send: the pipeline's point-to-point stays on MPI */, NULL};
