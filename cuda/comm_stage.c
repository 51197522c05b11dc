/* comm_stage.c — MPI on GPU memory through pinned host buffers (see comm_stage.h). */
#include "comm_stage.h"

#include <limits.h>
#include <mpi.h>
#include <string.h>

#include "comm_cuda.h"
#include "comm_mpi.h"

typedef enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_SEND,
               OP_RECV } op_kind;
static const char *const kind_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                         "broadcast", "send", "recv"};

/* One operation: its pinned buffers stay with it when it is recycled. */
struct tsr_comm_dev_event {
  struct tsr_comm_dev *d;
  op_kind kind;
  MPI_Request req;
  int posted;    /* MPI call posted, not yet completed */
  int landed;    /* MPI done and the copy back queued (done recorded) */
  int used;      /* done was ever recorded: a reuse waits for it before MPI writes */
  int failed;    /* completing it failed (reported then): wait fails too */
  void *dst;     /* device address the copy back goes to (NULL: none) */
  size_t dst_off, dst_bytes; /* which part of host it copies back */
  size_t want;   /* recv: the size the message must have */
  int peer, tag;
  unsigned char *host;
  size_t cap;
  int *counts, *displs; /* v-collectives, the group's size each */
  cudaEvent_t done;     /* after the copy back */
  struct tsr_comm_dev_event *next; /* the group's free list */
};

struct tsr_comm_dev {
  MPI_Comm comm;       /* a duplicate: staged operations never mix with comm.c's own */
  cudaStream_t stream; /* copies to and from the pinned buffers */
  cudaEvent_t ready;   /* the compute stream's work so far */
  int size, rank;
  char name[32];
  struct tsr_comm_dev_event *free_list;
  int in_flight;
};

/* MPI's error rc from `call` on e, reported as comm.c reports its own; TSR_ERR. */
static int mpi_failed(const struct tsr_comm_dev_event *e, const char *call, int rc) {
  char what[96];
  snprintf(what, sizeof what, "%s (%s on '%s', staged)", call, kind_names[e->kind], e->d->name);
  tsr_mpi_error(__FILE__, __LINE__, __func__, what, rc);
  return TSR_ERR;
}

/* ---------------------------------------------------------------- the communicator */

static void free_op(struct tsr_comm_dev_event *e) {
  if (e->done) {
    cudaEventSynchronize(e->done); /* a copy back may still read the buffer */
    cudaEventDestroy(e->done);
  }
  if (e->host) cudaFreeHost(e->host);
  tsr_free(&e->counts);
  tsr_free(&e->displs);
  tsr_free(&e);
}

static void st_destroy(tsr_comm_dev **dp) {
  tsr_comm_dev *d = *dp;
  if (!d) return;
  if (d->in_flight)
    tsr_warn("staged MPI on '%s': destroyed with %d operations not waited for", d->name,
             d->in_flight);
  while (d->free_list) {
    struct tsr_comm_dev_event *e = d->free_list;
    d->free_list = e->next;
    free_op(e);
  }
  if (d->stream) cudaStreamSynchronize(d->stream);
  if (d->ready) cudaEventDestroy(d->ready);
  if (d->stream) cudaStreamDestroy(d->stream);
  if (d->comm != MPI_COMM_NULL) MPI_Comm_free(&d->comm);
  tsr_free(dp);
}

static int st_create(tsr_comm_dev **out, const void *mpi_comm, const char *name) {
  const MPI_Comm comm = *(const MPI_Comm *)mpi_comm;
  *out = NULL;
  tsr_comm_dev *d = tsr_calloc(1, sizeof *d);
  int ok = d != NULL;
  if (d) {
    d->comm = MPI_COMM_NULL;
    snprintf(d->name, sizeof d->name, "%s", name);
    MPI_Comm_size(comm, &d->size);
    MPI_Comm_rank(comm, &d->rank);
    ok = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking) == cudaSuccess &&
         cudaEventCreateWithFlags(&d->ready, cudaEventDisableTiming) == cudaSuccess;
  }
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  /* every rank duplicates, or none: MPI_Comm_dup is collective */
  if (ok && MPI_Comm_dup(comm, &d->comm) != MPI_SUCCESS) {
    d->comm = MPI_COMM_NULL;
    ok = 0;
  }
  if (ok) MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  if (!ok) {
    tsr_error("staged MPI: setting up '%s' failed (out of memory, a stream, an event or "
              "MPI_Comm_dup on some rank)", name);
    st_destroy(&d);
    return TSR_ERR;
  }
  *out = d;
  return 0;
}

/* ---------------------------------------------------------------- operations */

/* An operation of kind with at least bytes of pinned buffer, from the free list (the
 * first that is big enough, else the first, grown) or new. */
static int take(tsr_comm_dev *d, op_kind kind, size_t bytes, struct tsr_comm_dev_event **out) {
  struct tsr_comm_dev_event **pick = &d->free_list;
  for (struct tsr_comm_dev_event **p = &d->free_list; *p; p = &(*p)->next)
    if ((*p)->cap >= bytes) {
      pick = p;
      break;
    }
  struct tsr_comm_dev_event *e = *pick;
  if (e) {
    *pick = e->next;
  } else {
    e = tsr_calloc(1, sizeof *e);
    TSR_CHECK(e, TSR_ERR, "staged MPI on '%s': out of memory for an operation", d->name);
    e->counts = tsr_calloc((size_t)d->size, sizeof(int));
    e->displs = tsr_calloc((size_t)d->size, sizeof(int));
    cudaError_t ce = cudaEventCreateWithFlags(&e->done, cudaEventDisableTiming);
    if (!e->counts || !e->displs || ce != cudaSuccess) {
      if (ce != cudaSuccess) e->done = NULL;
      free_op(e);
      tsr_error("staged MPI on '%s': out of memory for an operation (or an event)", d->name);
      return TSR_ERR;
    }
  }
  /* the last copy back from this buffer has run before anything writes it again */
  if (e->used && cudaEventSynchronize(e->done) != cudaSuccess) {
    e->next = d->free_list, d->free_list = e;
    tsr_error("staged MPI on '%s': waiting for an earlier copy back failed", d->name);
    return TSR_ERR;
  }
  if (e->cap < bytes) {
    if (e->host) cudaFreeHost(e->host);
    e->host = NULL, e->cap = 0;
    void *h = NULL;
    cudaError_t ce = cudaMallocHost(&h, bytes);
    if (ce != cudaSuccess) {
      e->next = d->free_list, d->free_list = e;
      tsr_error("staged MPI on '%s': cudaMallocHost of %zu bytes: %s", d->name, bytes,
                cudaGetErrorString(ce));
      return TSR_ERR;
    }
    e->host = h, e->cap = bytes;
  }
  e->d = d, e->kind = kind, e->req = MPI_REQUEST_NULL;
  e->posted = e->landed = e->failed = 0;
  e->dst = NULL, e->dst_off = e->dst_bytes = 0, e->want = 0, e->peer = -1, e->tag = 0;
  e->next = NULL;
  d->in_flight++;
  *out = e;
  return 0;
}

/* e back onto its group's free list (its copy back, if any, is queued). */
static void give_back(struct tsr_comm_dev_event *e) {
  tsr_comm_dev *d = e->d;
  e->next = d->free_list;
  d->free_list = e;
  d->in_flight--;
}

/* bytes of src (device, written by the compute stream so far) into host at off, and the
 * host waits for them: MPI reads host next.  bytes 0 (a receive): only the ordering. */
static int stage_in_(tsr_comm_dev *d, struct tsr_comm_dev_event *e, size_t off,
                     const void *src, size_t bytes) {
  /* the copy stream waits for the compute work queued so far: the copy in reads what it
   * wrote, and the copy back (queued later on the same stream) must not overwrite what
   * it still reads */
  TSR_CUDA_CALL(cudaEventRecord(d->ready, tsr_cuda_compute_stream()));
  TSR_CUDA_CALL(cudaStreamWaitEvent(d->stream, d->ready, 0));
  if (!bytes) return 0;
  TSR_CUDA_CALL(cudaMemcpyAsync(e->host + off, src, bytes, cudaMemcpyDefault, d->stream));
  TSR_CUDA_CALL(cudaStreamSynchronize(d->stream));
  return 0;
}

/* On failure the operation goes back unused (nothing of it is left on the stream).  The
 * other ranks of a collective then wait for this one: the error printed here, and the
 * trainer's abort of a rank that fails alone, end the job. */
static int stage_in(tsr_comm_dev *d, struct tsr_comm_dev_event *e, size_t off, const void *src,
                    size_t bytes) {
  if (!stage_in_(d, e, off, src, bytes)) return 0;
  cudaStreamSynchronize(d->stream);
  give_back(e);
  return TSR_ERR;
}

/* The MPI call has been posted (rc its return code); the copy back, if any, is host[off,
 * off + bytes) to dst.  On a failed post the operation goes back unused. */
static int posted(struct tsr_comm_dev_event *e, int rc, void *dst, size_t off, size_t bytes) {
  if (rc != MPI_SUCCESS) {
    give_back(e);
    return mpi_failed(e, "posting", rc);
  }
  e->posted = 1;
  e->dst = dst, e->dst_off = off, e->dst_bytes = bytes;
  return 0;
}

/* The operation just queued, for record (set by each operation). */
static struct tsr_comm_dev_event *last;

/* The element type of comm.h that t is (bf16 and fp16 are summed by comm.c's own MPI
 * operations, comm_mpi.h); fp32 for the others, which never reach it. */
static tsr_dtype data_type(tsr_comm_dev_type t) {
  return t == TSR_CUDA_BF16 ? TSR_BF16 : t == TSR_CUDA_F16 ? TSR_F16 : TSR_F32;
}
static MPI_Datatype mpi_type(tsr_comm_dev_type t) {
  return t == TSR_CUDA_DOUBLE ? MPI_DOUBLE : t == TSR_CUDA_INT ? MPI_INT
                                                             : tsr_comm_mpi_type(data_type(t));
}
static size_t type_size(tsr_comm_dev_type t) {
  return t == TSR_CUDA_DOUBLE ? sizeof(double) : t == TSR_CUDA_INT ? sizeof(int)
                                                                 : tsr_dtype_size(data_type(t));
}
/* op: 0 sum, 1 max, 2 min; 16-bit data is only ever summed. */
static MPI_Op mpi_op(tsr_comm_dev_type t, int op) {
  if (t == TSR_CUDA_BF16 || t == TSR_CUDA_F16) return tsr_comm_mpi_sum(data_type(t));
  return op == 1 ? MPI_MAX : op == 2 ? MPI_MIN : MPI_SUM;
}

static int st_all_reduce(tsr_comm_dev *d, void *buf, size_t count, tsr_comm_dev_type t, int op) {
  const size_t bytes = count * type_size(t);
  struct tsr_comm_dev_event *e;
  TSR_CALL(take(d, OP_ALL_REDUCE, bytes, &e));
  TSR_CALL(stage_in(d, e, 0, buf, bytes));
  TSR_CALL(posted(e, MPI_Iallreduce(MPI_IN_PLACE, e->host, (int)count, mpi_type(t), mpi_op(t, op),
                                    d->comm, &e->req),
                  buf, 0, bytes));
  last = e;
  return 0;
}

/* counts/displs of e as int, and the total; 0 or TSR_ERR past INT_MAX. */
static int v_counts(tsr_comm_dev *d, struct tsr_comm_dev_event *e, const size_t *counts,
                    size_t *total) {
  *total = 0;
  for (int r = 0; r < d->size; r++) {
    TSR_CHECK(counts[r] <= INT_MAX && *total <= (size_t)INT_MAX - counts[r], TSR_ERR,
              "staged MPI on '%s': more than %d elements in one operation", d->name, INT_MAX);
    e->counts[r] = (int)counts[r], e->displs[r] = (int)*total;
    *total += counts[r];
  }
  return 0;
}

static size_t total_of(const tsr_comm_dev *d, const size_t *counts) {
  size_t n = 0;
  for (int r = 0; r < d->size; r++) n += counts[r];
  return n;
}

/* host: the whole send buffer, then this rank's block of the result after it */
static int st_reduce_scatter(tsr_comm_dev *d, const void *send, void *recv, const size_t *counts,
                             tsr_comm_dev_type t) {
  const size_t n = total_of(d, counts), mine = counts[d->rank], es = type_size(t);
  struct tsr_comm_dev_event *e;
  TSR_CALL(take(d, OP_REDUCE_SCATTER, es * (n + mine), &e));
  size_t total;
  if (v_counts(d, e, counts, &total)) {
    give_back(e);
    return TSR_ERR;
  }
  TSR_CALL(stage_in(d, e, 0, send, es * n));
  TSR_CALL(posted(e, MPI_Ireduce_scatter(e->host, e->host + es * n, e->counts, mpi_type(t),
                                         mpi_op(t, 0), d->comm, &e->req),
                  recv, es * n, es * mine));
  last = e;
  return 0;
}

/* host: the whole result, this rank's block filled in place */
static int st_all_gather(tsr_comm_dev *d, const void *send, void *recv, const size_t *counts,
                         tsr_comm_dev_type t) {
  const size_t n = total_of(d, counts), es = type_size(t);
  struct tsr_comm_dev_event *e;
  TSR_CALL(take(d, OP_ALL_GATHER, es * n, &e));
  size_t total;
  if (v_counts(d, e, counts, &total)) {
    give_back(e);
    return TSR_ERR;
  }
  TSR_CALL(stage_in(d, e, es * (size_t)e->displs[d->rank], send, es * counts[d->rank]));
  TSR_CALL(posted(e, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, e->host, e->counts,
                                     e->displs, mpi_type(t), d->comm, &e->req),
                  recv, 0, es * n));
  last = e;
  return 0;
}

static int st_broadcast(tsr_comm_dev *d, void *buf, size_t bytes, int root) {
  TSR_CHECK(bytes <= INT_MAX, TSR_ERR, "staged MPI on '%s': broadcast of %zu bytes", d->name,
            bytes);
  struct tsr_comm_dev_event *e;
  TSR_CALL(take(d, OP_BROADCAST, bytes, &e));
  TSR_CALL(stage_in(d, e, 0, buf, d->rank == root ? bytes : 0));
  TSR_CALL(posted(e, MPI_Ibcast(e->host, (int)bytes, MPI_BYTE, root, d->comm, &e->req),
                  d->rank == root ? NULL : buf, 0, bytes));
  last = e;
  return 0;
}

static int st_send(tsr_comm_dev *d, const void *buf, size_t bytes, int peer, int tag) {
  struct tsr_comm_dev_event *e;
  TSR_CALL(take(d, OP_SEND, bytes, &e));
  TSR_CALL(stage_in(d, e, 0, buf, bytes));
  TSR_CALL(posted(e, MPI_Isend(e->host, (int)bytes, MPI_BYTE, peer, tag, d->comm, &e->req),
                  NULL, 0, 0));
  last = e;
  return 0;
}

static int st_recv(tsr_comm_dev *d, void *buf, size_t bytes, int peer, int tag) {
  struct tsr_comm_dev_event *e;
  TSR_CALL(take(d, OP_RECV, bytes, &e));
  e->want = bytes, e->peer = peer, e->tag = tag;
  TSR_CALL(stage_in(d, e, 0, NULL, 0));
  TSR_CALL(posted(e, MPI_Irecv(e->host, (int)bytes, MPI_BYTE, peer, tag, d->comm, &e->req), buf,
                  0, bytes));
  last = e;
  return 0;
}

/* ---------------------------------------------------------------- completion */

/* MPI has finished e (status st): check a receive's size, queue the copy back. */
static int land(struct tsr_comm_dev_event *e, MPI_Status *st) {
  tsr_comm_dev *d = e->d;
  e->posted = 0;
  if (e->kind == OP_RECV) {
    int got = -1;
    MPI_Get_count(st, MPI_BYTE, &got);
    TSR_CHECK((size_t)got == e->want, TSR_ERR,
              "recv on '%s' (staged): rank %d sent %d bytes with tag %d, %zu were expected",
              d->name, e->peer, got, e->tag, e->want);
  }
  cudaError_t ce = cudaSuccess;
  if (e->dst && e->dst_bytes)
    ce = cudaMemcpyAsync(e->dst, e->host + e->dst_off, e->dst_bytes, cudaMemcpyDefault,
                         d->stream);
  if (ce == cudaSuccess) ce = cudaEventRecord(e->done, d->stream);
  if (ce != cudaSuccess) {
    cudaStreamSynchronize(d->stream); /* no copy back may still read the buffer */
    tsr_error("staged MPI on '%s': the copy back of %s: %s", d->name, kind_names[e->kind],
              cudaGetErrorString(ce));
    return TSR_ERR;
  }
  e->used = e->landed = 1;
  return 0;
}

static int st_record(tsr_comm_dev *d, tsr_comm_dev_event **out) {
  *out = last;
  TSR_CHECK(last && last->d == d, TSR_ERR, "staged MPI on '%s': nothing to record", d->name);
  last = NULL;
  return 0;
}

static int st_wait(tsr_comm_dev_event **ep) {
  struct tsr_comm_dev_event *e = *ep;
  if (!e) return 0;
  *ep = NULL;
  int rc = 0;
  if (e->posted) {
    MPI_Status st;
    const int mrc = MPI_Wait(&e->req, &st);
    if (mrc != MPI_SUCCESS) {
      e->posted = 0;
      give_back(e);
      return mpi_failed(e, "MPI_Wait", mrc);
    }
    rc = land(e, &st);
  }
  if (e->failed) rc = TSR_ERR; /* an earlier test found it failed (and said so) */
  if (!rc && e->landed) {
    cudaError_t ce = cudaStreamWaitEvent(tsr_cuda_compute_stream(), e->done, 0);
    if (ce != cudaSuccess) {
      tsr_error("staged MPI on '%s': cudaStreamWaitEvent: %s", e->d->name,
                cudaGetErrorString(ce));
      rc = TSR_ERR;
    }
  }
  give_back(e);
  return rc;
}

static int st_query(tsr_comm_dev_event *e, int *done) {
  *done = 0;
  if (e->posted) {
    int flag = 0;
    MPI_Status st;
    const int mrc = MPI_Test(&e->req, &flag, &st);
    if (mrc != MPI_SUCCESS) { /* no request left to wait for; wait reports it again */
      e->posted = 0, e->failed = 1;
      return mpi_failed(e, "MPI_Test", mrc);
    }
    if (!flag) return 0;
    if (land(e, &st)) {
      e->failed = 1;
      return TSR_ERR;
    }
  }
  *done = 1; /* the copy back is ordered before later compute work by wait */
  return 0;
}

static void st_close(void) { last = NULL; }

const tsr_comm_transport tsr_cuda_staged_transport = {
    "mpi-staged", st_create, st_destroy, tsr_cuda_is_device_memory, st_all_reduce, st_reduce_scatter,
    st_all_gather, st_broadcast, st_record, st_wait, st_query, st_close, st_send, st_recv};
