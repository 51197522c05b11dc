/* comm.c — comm.h: collectives and point-to-point on a duplicated MPI communicator, byte
 * counters under the ring convention, size-1 fast paths, and the hand-over of collectives
 * on device memory to a group's device transport (comm_dev.h: NCCL) when it has one, and
 * MPI's sum of bf16 / fp16 data (a user-defined operation, see comm_mpi.h).
 *
 * Counts are handed to MPI as int; a buffer of more than INT_MAX elements is an error
 * here (callers move gradients and parameters in buckets far below that). */
#include "comm.h"

#include "core/tsr_build.h" /* HAVE_MPI_EXT_H */

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "comm_dev.h"
#include "comm_mpi.h"
#ifdef HAVE_MPI_EXT_H
#include <mpi-ext.h> /* Open MPI: MPIX_Query_cuda_support */
#endif
#include "ops/ops.h"
#include "core/util.h"
#include "core/watchdog.h"

/* A blocking MPI call, marked for the watchdog: a rank stalled inside one is waiting for
 * a peer; a rank stalled outside any is the likely cause. */
#define BLOCKING(call)                \
  __extension__({                     \
    tsr_watchdog_blocked(1);          \
    const int blocking_rc_ = (call);  \
    tsr_watchdog_blocked(0);          \
    blocking_rc_;                     \
  })

struct tsr_comm_request {
  MPI_Request req;          /* MPI_REQUEST_NULL for a device operation */
  tsr_comm_dev_event *ev;   /* a device operation: the event after it */
  tsr_comm *comm;
  tsr_comm_kind kind;
  size_t recv_bytes; /* for recv: the size the message must have */
  int peer;
  int *counts, *displs; /* v-collectives: must live until the operation completes */
  struct tsr_comm_request *next; /* free list of the group */
};

struct tsr_comm {
  MPI_Comm comm;
  int size, rank;
  char name[32];
  double bytes[TSR_COMM_N_KINDS];
  int64_t ops[TSR_COMM_N_KINDS];
  /* Requests are recycled through a per-group free list, so a training step that keeps
   * the same operations in flight allocates nothing after its first step. */
  struct tsr_comm_request *free_list;
  int in_flight;
  /* the device transport (comm_dev.h), when one is attached */
  const tsr_comm_transport *tr;
  tsr_comm_dev *dev;
  size_t *even; /* size entries: the counts of an even reduce-scatter / all-gather */
};

const tsr_comm_transport *tsr_comm_gpu_transport;
const tsr_comm_transport *tsr_comm_staged_transport;

int tsr_comm_mpi_cuda_aware(void) {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1; /* built with it, and the runtime has it */
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return 0; /* this library was built without it */
#else
  return -1; /* no way to ask */
#endif
}

static const char *kind_names[TSR_COMM_N_KINDS] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "scalar",
    "all_to_all"};

void tsr_mpi_error(const char *file, int line, const char *func, const char *call, int rc) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
  tsr_error("%s:%d %s: %s failed: %s", file, line, func, call, msg);
}

/* ------------------------------------------------------------------ 16-bit sums */

/* MPI's combining step for 16-bit data: inout[i] = in[i] + inout[i], both widened to fp32
 * and the sum rounded to the type.  fp32 addition is commutative bit for bit, so the
 * step is too, and MPI may combine in any order (the error bound of comm.h holds for
 * every order: N - 1 steps over N ranks). */
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type) {
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++)
    b[i] = tsr_f32_to_bf16(tsr_bf16_to_f32(a[i]) + tsr_bf16_to_f32(b[i]));
}
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *type) {
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++)
    b[i] = tsr_f32_to_f16(tsr_f16_to_f32(a[i]) + tsr_f16_to_f32(b[i]));
}

/* The two operations (bf16, fp16), made once for the process by the first tsr_comm_create
 * (groups are created by the main thread during set-up, after MPI_Init). */
static MPI_Op sum16[2];
static int sum16_made;
static int sum16_key;

/* MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else, with MPI still
 * usable: the operations are freed there, so no caller has to remember it. */
static int free_sum16(MPI_Comm comm, int key, void *value, void *extra) {
  MPI_Op_free(&sum16[0]);
  MPI_Op_free(&sum16[1]);
  sum16_made = 0;
  MPI_Comm_free_keyval(&sum16_key);
  return MPI_SUCCESS;
}

static int make_sum16(void) {
  if (sum16_made) return 0;
  TSR_MPI_CALL(MPI_Op_create(sum_bf16, 1, &sum16[0]));
  TSR_MPI_CALL(MPI_Op_create(sum_f16, 1, &sum16[1]));
  TSR_MPI_CALL(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_sum16, &sum16_key, NULL));
  TSR_MPI_CALL(MPI_Comm_set_attr(MPI_COMM_SELF, sum16_key, NULL));
  sum16_made = 1;
  return 0;
}

MPI_Datatype tsr_comm_mpi_type(tsr_dtype t) { return t == TSR_F32 ? MPI_FLOAT : MPI_UINT16_T; }
MPI_Op tsr_comm_mpi_sum(tsr_dtype t) {
  if (t == TSR_F32) return MPI_SUM;
  return sum16_made ? sum16[t == TSR_F16] : MPI_OP_NULL;
}

/* ------------------------------------------------------------------ the group */

int tsr_comm_create(tsr_comm **out, MPI_Comm comm, const char *name) {
  *out = NULL;
  TSR_CALL(make_sum16());
  tsr_comm *c = tsr_calloc(1, sizeof *c);
  TSR_CHECK(c, TSR_ERR, "out of memory for communicator '%s'", name);
  snprintf(c->name, sizeof c->name, "%s", name);
  int rc = MPI_Comm_dup(comm, &c->comm);
  if (rc != MPI_SUCCESS) {
    tsr_mpi_error(__FILE__, __LINE__, __func__, "MPI_Comm_dup(comm, &c->comm)", rc);
    tsr_free(&c);
    return TSR_ERR;
  }
  *out = c; /* from here on tsr_comm_destroy cleans up */
  TSR_MPI_CALL(MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN));
  TSR_MPI_CALL(MPI_Comm_set_name(c->comm, c->name));
  TSR_MPI_CALL(MPI_Comm_size(c->comm, &c->size));
  TSR_MPI_CALL(MPI_Comm_rank(c->comm, &c->rank));
  return 0;
}

void tsr_comm_destroy(tsr_comm **cp) {
  if (!cp || !*cp) return;
  tsr_comm *c = *cp;
  if (c->in_flight)
    tsr_warn("communicator '%s' destroyed with %d operations not waited for", c->name,
             c->in_flight);
  while (c->free_list) {
    struct tsr_comm_request *r = c->free_list;
    c->free_list = r->next;
    tsr_free(&r->counts);
    tsr_free(&r->displs);
    tsr_free(&r);
  }
  if (c->dev) c->tr->destroy(&c->dev);
  tsr_free(&c->even);
  if (c->comm != MPI_COMM_NULL) {
    int rc = MPI_Comm_free(&c->comm);
    if (rc != MPI_SUCCESS) tsr_mpi_error(__FILE__, __LINE__, __func__, "MPI_Comm_free", rc);
  }
  tsr_watchdog_forget_group(c->name); /* the watchdog and heartbeat read the name */
  tsr_free(cp);
}

MPI_Comm tsr_comm_mpi(const tsr_comm *c) { return c->comm; }
const char *tsr_comm_backend(const tsr_comm *c) { return c->dev ? c->tr->name : "mpi"; }

int tsr_comm_attach_device(tsr_comm *c, const tsr_comm_transport *t) {
  if (c->dev || c->size == 1) return 0;
  if (!c->even) c->even = tsr_calloc((size_t)c->size, sizeof(size_t));
  int ok = c->even != NULL, all = 0;
  TSR_MPI_CALL(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, c->comm));
  TSR_CHECK(all, TSR_ERR, "out of memory attaching %s to '%s'", t->name, c->name);
  TSR_CALL(t->create(&c->dev, &c->comm, c->name));
  c->tr = c->dev ? t : NULL; /* a transport may decline the group (NCCL: a shared GPU) */
  return 0;
}
int tsr_comm_size(const tsr_comm *c) { return c->size; }
int tsr_comm_rank(const tsr_comm *c) { return c->rank; }
const char *tsr_comm_name(const tsr_comm *c) { return c->name; }

/* ------------------------------------------------------------------ counters */

double tsr_comm_bytes(const tsr_comm *c) {
  double s = 0;
  for (int k = 0; k < TSR_COMM_N_KINDS; k++) s += c->bytes[k];
  return s;
}

double tsr_comm_bytes_of(const tsr_comm *c, tsr_comm_kind kind) {
  return (kind >= 0 && kind < TSR_COMM_N_KINDS) ? c->bytes[kind] : 0.0;
}

int64_t tsr_comm_ops_of(const tsr_comm *c, tsr_comm_kind kind) {
  return (kind >= 0 && kind < TSR_COMM_N_KINDS) ? c->ops[kind] : 0;
}

const char *tsr_comm_kind_name(tsr_comm_kind kind) {
  return (kind >= 0 && kind < TSR_COMM_N_KINDS) ? kind_names[kind] : "?";
}

void tsr_comm_reset_counters(tsr_comm *c) {
  memset(c->bytes, 0, sizeof c->bytes);
  memset(c->ops, 0, sizeof c->ops);
}

static void tally(tsr_comm *c, tsr_comm_kind kind, double bytes) {
  c->bytes[kind] += bytes;
  c->ops[kind]++;
  tsr_watchdog_operation(c->name, kind_names[kind]); /* named if the job stalls here */
}

/* Ring cost per rank of an all-reduce of s bytes, and of a reduce-scatter or all-gather
 * whose full buffer is s bytes. */
static double ring_all_reduce(const tsr_comm *c, double s) {
  return 2.0 * (c->size - 1) * s / c->size;
}
static double ring_half(const tsr_comm *c, double s) { return (c->size - 1) * s / c->size; }

/* ------------------------------------------------------------------ argument checks */

static int check_count(const tsr_comm *c, const char *op, size_t count) {
  TSR_CHECK(count <= (size_t)INT_MAX, TSR_ERR,
            "%s on '%s': %zu elements is more than one MPI call takes (%d); split the buffer",
            op, c->name, count, INT_MAX);
  return 0;
}

static int check_dtype(const tsr_comm *c, const char *op, tsr_dtype dt) {
  TSR_CHECK(dt == TSR_F32 || dt == TSR_BF16 || dt == TSR_F16, TSR_ERR,
            "%s on '%s': element type %d is not fp32, bf16 or fp16", op, c->name, (int)dt);
  return 0;
}

static int check_peer(const tsr_comm *c, const char *op, int peer, int tag) {
  TSR_CHECK(peer >= 0 && peer < c->size && peer != c->rank, TSR_ERR,
            "%s on '%s' (rank %d of %d): peer %d is not another rank of the group", op, c->name,
            c->rank, c->size, peer);
  TSR_CHECK(tag >= 0 && tag <= 32767, TSR_ERR, "%s on '%s': tag %d is outside 0..32767", op,
            c->name, tag); /* 32767 is the smallest MPI_TAG_UB the standard allows */
  return 0;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
  return na && nb && pa < pb + nb && pb < pa + na;
}

/* ------------------------------------------------------------------ requests */

/* A request from the group's free list, or a new one; NULL when out of memory. */
static struct tsr_comm_request *pop_request(tsr_comm *c) {
  struct tsr_comm_request *r = c->free_list;
  if (r) c->free_list = r->next;
  else r = tsr_calloc(1, sizeof *r);
  return r;
}

/* r back onto the group's free list. */
static void push_request(tsr_comm *c, struct tsr_comm_request *r) {
  r->next = c->free_list;
  c->free_list = r;
}

/* A posted operation becomes the request r (taken from the group's free list or new). */
static int track(tsr_comm *c, struct tsr_comm_request *r, MPI_Request req, tsr_comm_kind kind,
                 tsr_comm_handle *h) {
  r->req = req;
  r->ev = NULL;
  r->comm = c;
  r->kind = kind;
  r->recv_bytes = 0;
  r->peer = -1;
  r->next = NULL;
  c->in_flight++;
  *h = r;
  return 0;
}

static int post(tsr_comm *c, MPI_Request req, tsr_comm_kind kind, tsr_comm_handle *h) {
  struct tsr_comm_request *r = pop_request(c);
  if (!r) {
    MPI_Wait(&req, MPI_STATUS_IGNORE); /* never leave an operation nobody can complete */
    tsr_error("out of memory for a request on '%s'", c->name);
    return TSR_ERR;
  }
  return track(c, r, req, kind, h);
}

/* Bookkeeping once a request has completed with status st (MPI code rc; st NULL for a
 * device operation, whose transport checked a receive's size itself). */
static int complete(tsr_comm_handle *h, int rc, MPI_Status *st) {
  struct tsr_comm_request *r = *h;
  tsr_comm *c = r->comm;
  int bad_size = 0, got = -1;
  if (rc == MPI_SUCCESS && st && r->kind == TSR_COMM_RECV) {
    MPI_Get_count(st, MPI_BYTE, &got);
    bad_size = (size_t)got != r->recv_bytes;
  }
  const tsr_comm_kind kind = r->kind;
  const int peer = r->peer;
  const size_t want = r->recv_bytes;
  push_request(c, r);
  c->in_flight--;
  *h = NULL;
  if (rc != MPI_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "MPI_Wait (%s on '%s')", kind_names[kind], c->name);
    tsr_mpi_error(__FILE__, __LINE__, __func__, what, rc);
    return TSR_ERR;
  }
  TSR_CHECK(!bad_size, TSR_ERR, "recv on '%s': rank %d sent %d bytes, %zu were expected",
            c->name, peer, got, want);
  return 0;
}

/* ------------------------------------------------------------------ device operations */

/* 1 when the group's transport takes an operation on buffers a and b (b may be NULL):
 * one is attached and both are device memory. */
static int dev_for(const tsr_comm *c, const void *a, const void *b) {
  return c->dev && c->tr->on_device(a) && (!b || c->tr->on_device(b));
}

/* 1 when the group's transport takes point-to-point traffic on buf. */
static int dev_p2p(const tsr_comm *c, const void *buf) {
  return c->dev && c->tr->send && dev_for(c, buf, NULL);
}

/* After a device operation was queued (rc: how that went): a blocking call (h NULL)
 * orders later compute work after it; a non-blocking one gets a handle on its event. */
static int dev_done(tsr_comm *c, int rc, tsr_comm_kind kind, tsr_comm_handle *h) {
  TSR_CALL(rc);
  tsr_comm_dev_event *ev = NULL;
  TSR_CALL(c->tr->record(c->dev, &ev));
  if (!h) return BLOCKING(c->tr->wait(&ev)); /* staged: MPI_Wait inside */
  struct tsr_comm_request *r = pop_request(c);
  if (!r) {
    c->tr->wait(&ev);
    tsr_error("out of memory for a request on '%s'", c->name);
    return TSR_ERR;
  }
  track(c, r, MPI_REQUEST_NULL, kind, h);
  r->ev = ev;
  return 0;
}

/* The transport's name for an element type of comm.h. */
static tsr_comm_dev_type dev_type(tsr_dtype dt) {
  return dt == TSR_BF16 ? TSR_CUDA_BF16 : dt == TSR_F16 ? TSR_CUDA_F16 : TSR_CUDA_FLOAT;
}

/* The counts of an even reduce-scatter / all-gather, for the transport. */
static const size_t *even_counts(tsr_comm *c, size_t n) {
  for (int i = 0; i < c->size; i++) c->even[i] = n;
  return c->even;
}

int tsr_comm_wait(tsr_comm_handle *h) {
  if (!h || !*h) return 0;
  if ((*h)->ev) {
    const int rc = BLOCKING((*h)->comm->tr->wait(&(*h)->ev)); /* staged: MPI_Wait inside */
    complete(h, MPI_SUCCESS, NULL);
    return rc;
  }
  MPI_Status st;
  const int rc = BLOCKING(MPI_Wait(&(*h)->req, &st));
  return complete(h, rc, &st);
}

int tsr_comm_test(tsr_comm_handle *h, int *done) {
  *done = 1;
  if (!h || !*h) return 0;
  if ((*h)->ev) {
    TSR_CALL((*h)->comm->tr->query((*h)->ev, done));
    return *done ? tsr_comm_wait(h) : 0;
  }
  MPI_Status st;
  int flag = 0;
  const int rc = MPI_Test(&(*h)->req, &flag, &st);
  if (rc == MPI_SUCCESS && !flag) {
    *done = 0;
    return 0;
  }
  return complete(h, rc, &st);
}

int tsr_comm_waitall(int n, tsr_comm_handle *h) {
  int first = 0;
  for (int i = 0; i < n; i++) { /* MPI progresses every posted operation meanwhile */
    int rc = tsr_comm_wait(&h[i]);
    if (rc && !first) first = rc;
  }
  return first;
}

/* ------------------------------------------------------------------ all-reduce */

static int all_reduce_args(tsr_comm *c, const char *op, size_t count, tsr_dtype dt) {
  TSR_CALL(check_dtype(c, op, dt));
  TSR_CALL(check_count(c, op, count));
  tally(c, TSR_COMM_ALL_REDUCE, ring_all_reduce(c, (double)tsr_dtype_size(dt) * (double)count));
  return 0;
}

int tsr_comm_all_reduce(tsr_comm *c, void *buf, size_t count, tsr_dtype dt) {
  TSR_CALL(all_reduce_args(c, "all_reduce", count, dt));
  if (c->size == 1 || count == 0) return 0;
  if (dev_for(c, buf, NULL))
    return dev_done(c, c->tr->all_reduce(c->dev, buf, count, dev_type(dt), TSR_COMM_SUM),
                    TSR_COMM_ALL_REDUCE, NULL);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, tsr_comm_mpi_type(dt),
                                      tsr_comm_mpi_sum(dt), c->comm)));
  return 0;
}

int tsr_comm_iall_reduce(tsr_comm *c, void *buf, size_t count, tsr_dtype dt,
                         tsr_comm_handle *h) {
  *h = NULL;
  TSR_CALL(all_reduce_args(c, "iall_reduce", count, dt));
  if (c->size == 1 || count == 0) return 0;
  if (dev_for(c, buf, NULL))
    return dev_done(c, c->tr->all_reduce(c->dev, buf, count, dev_type(dt), TSR_COMM_SUM),
                    TSR_COMM_ALL_REDUCE, h);
  MPI_Request req;
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, tsr_comm_mpi_type(dt),
                              tsr_comm_mpi_sum(dt), c->comm, &req));
  return post(c, req, TSR_COMM_ALL_REDUCE, h);
}

/* ------------------------------------------------------------------ reduce-scatter */

static int reduce_scatter_args(tsr_comm *c, const char *op, const void *send, void *recv,
                               size_t recv_count, tsr_dtype dt) {
  TSR_CALL(check_dtype(c, op, dt));
  TSR_CALL(check_count(c, op, recv_count));
  const size_t block = tsr_dtype_size(dt) * recv_count;
  TSR_CHECK(!overlap(send, block * c->size, recv, block), TSR_ERR,
            "%s on '%s': send and recv buffers overlap", op, c->name);
  tally(c, TSR_COMM_REDUCE_SCATTER, ring_half(c, (double)block * c->size));
  if (c->size == 1 && recv_count) tsr_ops_copy(recv, send, block);
  return 0;
}

int tsr_comm_reduce_scatter(tsr_comm *c, const void *send, void *recv, size_t recv_count,
                            tsr_dtype dt) {
  TSR_CALL(reduce_scatter_args(c, "reduce_scatter", send, recv, recv_count, dt));
  if (c->size == 1 || recv_count == 0) return 0;
  if (dev_for(c, send, recv))
    return dev_done(c, c->tr->reduce_scatter(c->dev, send, recv, even_counts(c, recv_count),
                                             dev_type(dt)),
                    TSR_COMM_REDUCE_SCATTER, NULL);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Reduce_scatter_block(send, recv, (int)recv_count,
                                                 tsr_comm_mpi_type(dt), tsr_comm_mpi_sum(dt),
                                                 c->comm)));
  return 0;
}

int tsr_comm_ireduce_scatter(tsr_comm *c, const void *send, void *recv, size_t recv_count,
                             tsr_dtype dt, tsr_comm_handle *h) {
  *h = NULL;
  TSR_CALL(reduce_scatter_args(c, "ireduce_scatter", send, recv, recv_count, dt));
  if (c->size == 1 || recv_count == 0) return 0;
  if (dev_for(c, send, recv))
    return dev_done(c, c->tr->reduce_scatter(c->dev, send, recv, even_counts(c, recv_count),
                                             dev_type(dt)),
                    TSR_COMM_REDUCE_SCATTER, h);
  MPI_Request req;
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(MPI_Ireduce_scatter_block(send, recv, (int)recv_count, tsr_comm_mpi_type(dt),
                                         tsr_comm_mpi_sum(dt), c->comm, &req));
  return post(c, req, TSR_COMM_REDUCE_SCATTER, h);
}

/* ------------------------------------------------------------------ all-gather */

/* Sets *in_place when send is already this rank's block of recv (ZeRO-3 gathers into
 * the full buffer that holds the local shard). */
static int all_gather_args(tsr_comm *c, const char *op, const void *send, void *recv,
                           size_t send_count, tsr_dtype dt, int *in_place) {
  TSR_CALL(check_dtype(c, op, dt));
  TSR_CALL(check_count(c, op, send_count));
  const size_t block = tsr_dtype_size(dt) * send_count;
  *in_place = send == tsr_dtype_at(recv, dt, (int64_t)((size_t)c->rank * send_count));
  TSR_CHECK(*in_place || !overlap(send, block, recv, block * c->size), TSR_ERR,
            "%s on '%s': send overlaps recv without being this rank's block", op, c->name);
  tally(c, TSR_COMM_ALL_GATHER, ring_half(c, (double)block * c->size));
  if (c->size == 1 && !*in_place && send_count) tsr_ops_copy(recv, send, block);
  return 0;
}

int tsr_comm_all_gather(tsr_comm *c, const void *send, void *recv, size_t send_count,
                        tsr_dtype dt) {
  int in_place;
  TSR_CALL(all_gather_args(c, "all_gather", send, recv, send_count, dt, &in_place));
  if (c->size == 1 || send_count == 0) return 0;
  if (dev_for(c, send, recv))
    return dev_done(c, c->tr->all_gather(c->dev, send, recv, even_counts(c, send_count),
                                         dev_type(dt)),
                    TSR_COMM_ALL_GATHER, NULL);
  const MPI_Datatype t = tsr_comm_mpi_type(dt);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)send_count, t, recv,
                                     (int)send_count, t, c->comm)));
  return 0;
}

int tsr_comm_all_to_all(tsr_comm *c, const void *send, void *recv, size_t bytes) {
  TSR_CHECK(c && send && recv && send != recv, TSR_ERR,
            "all_to_all on '%s': needs a group and two distinct buffers",
            c ? c->name : "(null)");
  const int n = c->size, me = c->rank;
  if (bytes == 0) return 0;
  if (n == 1) {
    tsr_ops_copy(recv, send, bytes);
    return 0;
  }
  TSR_CALL(check_count(c, "all_to_all", bytes));
  if (!dev_for(c, send, recv)) {
    tally(c, TSR_COMM_ALL_TO_ALL, (double)(n - 1) * (double)bytes);
    tsr_ops_sync(); /* queued device work on the buffers is done before MPI touches them */
    TSR_MPI_CALL(BLOCKING(MPI_Alltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                                       c->comm)));
    return 0;
  }
  /* device memory on a transport without an all-to-all: its point-to-point pairs, the own
   * block copied; each send and receive is counted once as all_to_all */
  const double before_s = c->bytes[TSR_COMM_SEND], before_r = c->bytes[TSR_COMM_RECV];
  const int64_t ops_s = c->ops[TSR_COMM_SEND], ops_r = c->ops[TSR_COMM_RECV];
  tsr_comm_handle h[2 * n];
  int k = 0, rc = 0;
  for (int j = 0; j < n && !rc; j++) {
    if (j == me) continue;
    rc = tsr_comm_irecv(c, (char *)recv + (size_t)j * bytes, bytes, j, 0x7a2a, &h[k++]);
    if (!rc) rc = tsr_comm_isend(c, (const char *)send + (size_t)j * bytes, bytes, j, 0x7a2a,
                                 &h[k++]);
  }
  tsr_ops_copy((char *)recv + (size_t)me * bytes, (const char *)send + (size_t)me * bytes, bytes);
  const int rw = tsr_comm_waitall(k, h);
  c->bytes[TSR_COMM_SEND] = before_s, c->bytes[TSR_COMM_RECV] = before_r;
  c->ops[TSR_COMM_SEND] = ops_s, c->ops[TSR_COMM_RECV] = ops_r;
  tally(c, TSR_COMM_ALL_TO_ALL, (double)(n - 1) * (double)bytes);
  return rc ? rc : rw;
}

int tsr_comm_iall_gather(tsr_comm *c, const void *send, void *recv, size_t send_count,
                         tsr_dtype dt, tsr_comm_handle *h) {
  *h = NULL;
  int in_place;
  TSR_CALL(all_gather_args(c, "iall_gather", send, recv, send_count, dt, &in_place));
  if (c->size == 1 || send_count == 0) return 0;
  if (dev_for(c, send, recv))
    return dev_done(c, c->tr->all_gather(c->dev, send, recv, even_counts(c, send_count),
                                         dev_type(dt)),
                    TSR_COMM_ALL_GATHER, h);
  MPI_Request req;
  const MPI_Datatype t = tsr_comm_mpi_type(dt);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)send_count, t, recv,
                              (int)send_count, t, c->comm, &req));
  return post(c, req, TSR_COMM_ALL_GATHER, h);
}

/* ------------------------------------------------------------------ uneven blocks */

/* A request whose counts/displs arrays (size of the group) outlive the call, as MPI
 * requires of non-blocking v-collectives.  The arrays stay with the recycled request. */
static struct tsr_comm_request *take_request(tsr_comm *c) {
  struct tsr_comm_request *r = pop_request(c);
  if (!r) return NULL;
  if (!r->counts) {
    r->counts = tsr_calloc((size_t)c->size, sizeof(int));
    r->displs = tsr_calloc((size_t)c->size, sizeof(int));
  }
  if (!r->counts || !r->displs) {
    push_request(c, r);
    return NULL;
  }
  return r;
}

/* counts as MPI's ints (ic), their displacements (id) and their total, in elements. */
static int fill_counts(tsr_comm *c, const char *op, const size_t *counts, int *ic, int *id,
                       size_t *total) {
  size_t t = 0;
  for (int i = 0; i < c->size; i++) {
    TSR_CHECK(counts[i] <= (size_t)INT_MAX && t <= (size_t)INT_MAX - counts[i], TSR_ERR,
              "%s on '%s': blocks add up to more than one MPI call takes; split the buffer", op,
              c->name);
    ic[i] = (int)counts[i];
    id[i] = (int)t;
    t += counts[i];
  }
  *total = t;
  return 0;
}

int tsr_comm_ireduce_scatter_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                               tsr_dtype dt, tsr_comm_handle *h) {
  *h = NULL;
  TSR_CALL(check_dtype(c, "ireduce_scatter_v", dt));
  const size_t es = tsr_dtype_size(dt);
  struct tsr_comm_request *r = take_request(c);
  TSR_CHECK(r, TSR_ERR, "out of memory for a request on '%s'", c->name);
  size_t total;
  int rc = fill_counts(c, "ireduce_scatter_v", counts, r->counts, r->displs, &total);
  if (!rc && overlap(send, es * total, recv, es * counts[c->rank])) {
    tsr_error("ireduce_scatter_v on '%s': send and recv buffers overlap", c->name);
    rc = TSR_ERR;
  }
  if (rc || c->size == 1 || total == 0) {
    if (!rc) {
      tally(c, TSR_COMM_REDUCE_SCATTER, ring_half(c, (double)es * (double)total));
      if (c->size == 1 && total) tsr_ops_copy(recv, send, es * total);
    }
    push_request(c, r);
    return rc;
  }
  tally(c, TSR_COMM_REDUCE_SCATTER, ring_half(c, (double)es * (double)total));
  if (dev_for(c, send, recv)) {
    push_request(c, r); /* the transport takes the counts at once */
    return dev_done(c, c->tr->reduce_scatter(c->dev, send, recv, counts, dev_type(dt)),
                    TSR_COMM_REDUCE_SCATTER, h);
  }
  MPI_Request req;
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  int mrc = MPI_Ireduce_scatter(send, recv, r->counts, tsr_comm_mpi_type(dt),
                                tsr_comm_mpi_sum(dt), c->comm, &req);
  if (mrc != MPI_SUCCESS) {
    push_request(c, r);
    tsr_mpi_error(__FILE__, __LINE__, __func__, "MPI_Ireduce_scatter", mrc);
    return TSR_ERR;
  }
  return track(c, r, req, TSR_COMM_REDUCE_SCATTER, h);
}

int tsr_comm_iall_gather_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                           tsr_dtype dt, tsr_comm_handle *h) {
  *h = NULL;
  TSR_CALL(check_dtype(c, "iall_gather_v", dt));
  const size_t es = tsr_dtype_size(dt);
  struct tsr_comm_request *r = take_request(c);
  TSR_CHECK(r, TSR_ERR, "out of memory for a request on '%s'", c->name);
  size_t total;
  int rc = fill_counts(c, "iall_gather_v", counts, r->counts, r->displs, &total);
  const int in_place = !rc && send == tsr_dtype_at(recv, dt, r->displs[c->rank]);
  if (!rc && !in_place && overlap(send, es * counts[c->rank], recv, es * total)) {
    tsr_error("iall_gather_v on '%s': send overlaps recv without being this rank's block",
              c->name);
    rc = TSR_ERR;
  }
  if (rc || c->size == 1 || total == 0) {
    if (!rc) {
      tally(c, TSR_COMM_ALL_GATHER, ring_half(c, (double)es * (double)total));
      if (c->size == 1 && !in_place && total) tsr_ops_copy(recv, send, es * total);
    }
    push_request(c, r);
    return rc;
  }
  tally(c, TSR_COMM_ALL_GATHER, ring_half(c, (double)es * (double)total));
  if (dev_for(c, send, recv)) {
    push_request(c, r); /* the transport takes the counts at once */
    return dev_done(c, c->tr->all_gather(c->dev, send, recv, counts, dev_type(dt)),
                    TSR_COMM_ALL_GATHER, h);
  }
  MPI_Request req;
  const MPI_Datatype t = tsr_comm_mpi_type(dt);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  int mrc = MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, r->counts[c->rank], t, recv,
                            r->counts, r->displs, t, c->comm, &req);
  if (mrc != MPI_SUCCESS) {
    push_request(c, r);
    tsr_mpi_error(__FILE__, __LINE__, __func__, "MPI_Iallgatherv", mrc);
    return TSR_ERR;
  }
  return track(c, r, req, TSR_COMM_ALL_GATHER, h);
}

int tsr_comm_reduce_scatter_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                              tsr_dtype dt) {
  tsr_comm_handle h;
  TSR_CALL(tsr_comm_ireduce_scatter_v(c, send, recv, counts, dt, &h));
  return tsr_comm_wait(&h);
}

int tsr_comm_all_gather_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                          tsr_dtype dt) {
  tsr_comm_handle h;
  TSR_CALL(tsr_comm_iall_gather_v(c, send, recv, counts, dt, &h));
  return tsr_comm_wait(&h);
}

/* ------------------------------------------------------------------ broadcast */

static int broadcast_args(tsr_comm *c, const char *op, size_t bytes, int root) {
  TSR_CALL(check_count(c, op, bytes));
  TSR_CHECK(root >= 0 && root < c->size, TSR_ERR, "%s on '%s': root %d is not a rank of 0..%d",
            op, c->name, root, c->size - 1);
  tally(c, TSR_COMM_BROADCAST, c->rank == root ? 0.0 : (double)bytes);
  return 0;
}

int tsr_comm_broadcast(tsr_comm *c, void *buf, size_t bytes, int root) {
  TSR_CALL(broadcast_args(c, "broadcast", bytes, root));
  if (c->size == 1 || bytes == 0) return 0;
  if (dev_for(c, buf, NULL))
    return dev_done(c, c->tr->broadcast(c->dev, buf, bytes, root), TSR_COMM_BROADCAST, NULL);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->comm)));
  return 0;
}

int tsr_comm_ibroadcast(tsr_comm *c, void *buf, size_t bytes, int root, tsr_comm_handle *h) {
  *h = NULL;
  TSR_CALL(broadcast_args(c, "ibroadcast", bytes, root));
  if (c->size == 1 || bytes == 0) return 0;
  if (dev_for(c, buf, NULL))
    return dev_done(c, c->tr->broadcast(c->dev, buf, bytes, root), TSR_COMM_BROADCAST, h);
  MPI_Request req;
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->comm, &req));
  return post(c, req, TSR_COMM_BROADCAST, h);
}

/* ------------------------------------------------------------------ send / recv */

int tsr_comm_send(tsr_comm *c, const void *buf, size_t bytes, int peer, int tag) {
  TSR_CALL(check_count(c, "send", bytes));
  TSR_CALL(check_peer(c, "send", peer, tag));
  tally(c, TSR_COMM_SEND, (double)bytes);
  if (dev_p2p(c, buf))
    return dev_done(c, c->tr->send(c->dev, buf, bytes, peer, tag), TSR_COMM_SEND, NULL);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Send(buf, (int)bytes, MPI_BYTE, peer, tag, c->comm)));
  return 0;
}

int tsr_comm_recv(tsr_comm *c, void *buf, size_t bytes, int peer, int tag) {
  TSR_CALL(check_count(c, "recv", bytes));
  TSR_CALL(check_peer(c, "recv", peer, tag));
  tally(c, TSR_COMM_RECV, (double)bytes);
  if (dev_p2p(c, buf))
    return dev_done(c, c->tr->recv(c->dev, buf, bytes, peer, tag), TSR_COMM_RECV, NULL);
  MPI_Status st;
  int got = -1;
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, tag, c->comm, &st)));
  TSR_MPI_CALL(MPI_Get_count(&st, MPI_BYTE, &got));
  TSR_CHECK((size_t)got == bytes, TSR_ERR,
            "recv on '%s': rank %d sent %d bytes with tag %d, %zu were expected", c->name, peer,
            got, tag, bytes);
  return 0;
}

int tsr_comm_isend(tsr_comm *c, const void *buf, size_t bytes, int peer, int tag,
                   tsr_comm_handle *h) {
  *h = NULL;
  TSR_CALL(check_count(c, "isend", bytes));
  TSR_CALL(check_peer(c, "isend", peer, tag));
  tally(c, TSR_COMM_SEND, (double)bytes);
  if (dev_p2p(c, buf))
    return dev_done(c, c->tr->send(c->dev, buf, bytes, peer, tag), TSR_COMM_SEND, h);
  MPI_Request req;
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, c->comm, &req));
  return post(c, req, TSR_COMM_SEND, h);
}

int tsr_comm_irecv(tsr_comm *c, void *buf, size_t bytes, int peer, int tag, tsr_comm_handle *h) {
  *h = NULL;
  TSR_CALL(check_count(c, "irecv", bytes));
  TSR_CALL(check_peer(c, "irecv", peer, tag));
  tally(c, TSR_COMM_RECV, (double)bytes);
  if (dev_p2p(c, buf)) /* the transport checks the size when it completes */
    return dev_done(c, c->tr->recv(c->dev, buf, bytes, peer, tag), TSR_COMM_RECV, h);
  MPI_Request req;
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, c->comm, &req));
  TSR_CALL(post(c, req, TSR_COMM_RECV, h));
  (*h)->recv_bytes = bytes;
  (*h)->peer = peer;
  return 0;
}

/* ------------------------------------------------------------------ scalars */

static MPI_Op mpi_op(tsr_comm_op op) {
  return op == TSR_COMM_MAX ? MPI_MAX : op == TSR_COMM_MIN ? MPI_MIN : MPI_SUM;
}

int tsr_comm_all_reduce_double(tsr_comm *c, double *x, size_t count, tsr_comm_op op) {
  TSR_CALL(check_count(c, "all_reduce_double", count));
  tally(c, TSR_COMM_SCALAR, ring_all_reduce(c, (double)sizeof(double) * (double)count));
  if (c->size == 1 || count == 0) return 0;
  if (dev_for(c, x, NULL))
    return dev_done(c, c->tr->all_reduce(c->dev, x, count, TSR_CUDA_DOUBLE, (int)op),
                    TSR_COMM_SCALAR, NULL);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_DOUBLE, mpi_op(op), c->comm)));
  return 0;
}

int tsr_comm_all_reduce_int(tsr_comm *c, int *x, size_t count, tsr_comm_op op) {
  TSR_CALL(check_count(c, "all_reduce_int", count));
  tally(c, TSR_COMM_SCALAR, ring_all_reduce(c, (double)sizeof(int) * (double)count));
  if (c->size == 1 || count == 0) return 0;
  if (dev_for(c, x, NULL))
    return dev_done(c, c->tr->all_reduce(c->dev, x, count, TSR_CUDA_INT, (int)op),
                    TSR_COMM_SCALAR, NULL);
  tsr_ops_sync(); /* queued device work on the buffer is done before MPI touches it */
  TSR_MPI_CALL(BLOCKING(MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_INT, mpi_op(op), c->comm)));
  return 0;
}

int tsr_comm_sum_ordered(tsr_comm *c, double x, double *sum) {
  tally(c, TSR_COMM_SCALAR, ring_half(c, (double)sizeof(double) * c->size));
  if (c->size == 1) {
    *sum = x;
    return 0;
  }
  double stack[64], *all = c->size <= 64 ? stack : tsr_calloc((size_t)c->size, sizeof(double));
  TSR_CHECK(all, TSR_ERR, "out of memory in sum_ordered on '%s'", c->name);
  int rc = BLOCKING(MPI_Allgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, c->comm));
  double s = 0;
  for (int i = 0; i < c->size; i++) s += all[i];
  if (all != stack) tsr_free(&all);
  if (rc != MPI_SUCCESS) {
    tsr_mpi_error(__FILE__, __LINE__, __func__, "MPI_Allgather", rc);
    return TSR_ERR;
  }
  *sum = s;
  return 0;
}

int tsr_comm_barrier(tsr_comm *c) {
  if (c->size == 1) return 0;
  TSR_MPI_CALL(BLOCKING(MPI_Barrier(c->comm)));
  return 0;
}
