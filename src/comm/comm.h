/* comm.h — the one interface through which tensor data moves between ranks.
 *
 * A tsr_comm is a group of ranks (one communicator of the grid: tp, pp, dp, dp_shard,
 * dp_replicate, node, world).  Model, ZeRO and pipeline code see only this header; it
 * never includes mpi.h (the MPI side is in comm_mpi.h, for grid.c and the driver).
 *
 * Data collectives (all-reduce, reduce-scatter, all-gather and their uneven forms) take
 * the element type of their buffers (dtype.h: fp32, bf16, fp16) and counts in elements;
 * their reductions always sum.  Broadcast and send/recv move bytes; the scalar
 * all-reduces work on doubles and ints.  A 16-bit sum adds two values in fp32 and rounds
 * the result to the type at every combining step (MPI: a user-defined operation over
 * MPI_UINT16_T; NCCL: its own bf16 / fp16 sums, which do the same), so a sum over N
 * ranks carries at most N - 1 roundings, in whatever order the library combines.  That
 * step is commutative bit for bit, and the libraries reduce each element once (along a
 * ring or a tree) and copy the result to the others, so every rank of the group holds
 * the same bits: replicated activations stay equal (test_comm checks it).  Gradients are
 * summed in fp32.
 *
 * Each operation has a blocking form and a non-blocking form that returns a handle;
 * complete it with tsr_comm_wait / tsr_comm_waitall before touching the buffers.  A
 * group of size 1 moves nothing: its operations are copies (or nothing) and complete at
 * once (the handle comes back NULL, and waiting on NULL is a no-op).  Every function
 * returns 0 on success, otherwise an error code from util.h after printing what failed.
 *
 * Byte counters.  Each group counts, per kind of operation, the bytes this rank moves
 * under the bandwidth-optimal (ring) algorithm, whatever MPI actually does, with S the
 * bytes the buffers hold (4 per fp32 element, 2 per bf16 or fp16 element):
 *   all-reduce of S bytes                    2 (N-1)/N * S
 *   reduce-scatter / all-gather, where S is the full (unsharded) buffer,
 *     S = N * block bytes                    (N-1)/N * S
 *   broadcast of S bytes                     S on every rank but the root, 0 on the root
 *                                            (what it receives; the sum over the group
 *                                            is the (N-1) S a broadcast must move)
 *   send / recv of S bytes                   S, counted as "send" on the sender and
 *                                            "recv" on the receiver
 *   scalar all-reduces (doubles, ints)       2 (N-1)/N * S, under their own kind
 * N is the group size; a group of size 1 counts 0.  Counters are doubles because
 * 2 (N-1)/N * S is not a whole number in general (exact for totals below 2^53 bytes).
 * An operation is counted when it is started (blocking or not). */
#ifndef TSR_COMM_H
#define TSR_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct tsr_comm tsr_comm;                   /* a group of ranks */
typedef struct tsr_comm_request *tsr_comm_handle;   /* an operation in flight, or NULL */

typedef enum {
  TSR_COMM_ALL_REDUCE = 0,
  TSR_COMM_REDUCE_SCATTER,
  TSR_COMM_ALL_GATHER,
  TSR_COMM_BROADCAST,
  TSR_COMM_SEND,
  TSR_COMM_RECV,
  TSR_COMM_SCALAR, /* all-reduces of doubles and ints (norms, flags, counts) */
  TSR_COMM_ALL_TO_ALL,
  TSR_COMM_N_KINDS
} tsr_comm_kind;

typedef enum { TSR_COMM_SUM = 0, TSR_COMM_MAX, TSR_COMM_MIN } tsr_comm_op;

/* Created from an MPI communicator by tsr_comm_create (comm_mpi.h). Collective. */
void tsr_comm_destroy(tsr_comm **c); /* collective over the group; NULLs *c */

int tsr_comm_size(const tsr_comm *c);
int tsr_comm_rank(const tsr_comm *c);
const char *tsr_comm_name(const tsr_comm *c);
/* "mpi", or the device transport the group's collectives on device memory go through
 * ("nccl"; comm_dev.h). */
const char *tsr_comm_backend(const tsr_comm *c);

/* ---- blocking operations ---- */

/* buf[0..count) (elements of dt) summed over the group, in place. */
int tsr_comm_all_reduce(tsr_comm *c, void *buf, size_t count, tsr_dtype dt);
/* send holds size * recv_count elements (block r for rank r); recv gets this rank's block
 * summed over the group.  send and recv must not overlap. */
int tsr_comm_reduce_scatter(tsr_comm *c, const void *send, void *recv, size_t recv_count,
                            tsr_dtype dt);
/* recv[r * send_count ..] = rank r's send.  In place when send is recv's element
 * rank * send_count. */
int tsr_comm_all_gather(tsr_comm *c, const void *send, void *recv, size_t send_count,
                        tsr_dtype dt);
/* Every rank sends block j of send (bytes each, blocks in rank order) to rank j, which
 * receives it as block i (this rank's index) of recv; send and recv do not overlap.
 * Counted as (size - 1) * bytes sent by this rank. */
int tsr_comm_all_to_all(tsr_comm *c, const void *send, void *recv, size_t bytes);
/* root's bytes to every rank of the group. */
int tsr_comm_broadcast(tsr_comm *c, void *buf, size_t bytes, int root);
/* Point to point with another rank of the group (peer is a rank in c, not itself);
 * tag >= 0 tells messages between the same pair apart. */
int tsr_comm_send(tsr_comm *c, const void *buf, size_t bytes, int peer, int tag);
int tsr_comm_recv(tsr_comm *c, void *buf, size_t bytes, int peer, int tag);

/* Uneven blocks (ZeRO buckets that cut shard boundaries): counts[r] elements belong to
 * rank r, blocks in rank order, sum(counts) in all.  reduce_scatter_v: send holds every
 * block, recv gets this rank's counts[rank] elements summed over the group.
 * all_gather_v: recv gets every block; send is this rank's block (in place when send
 * is its block of recv).  Counted like their even forms with S = sum(counts) elements. */
int tsr_comm_reduce_scatter_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                              tsr_dtype dt);
int tsr_comm_all_gather_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                          tsr_dtype dt);

/* Scalars for the trainer (grad norm, loss, non-finite flags, signal agreement). */
int tsr_comm_all_reduce_double(tsr_comm *c, double *x, size_t count, tsr_comm_op op);
int tsr_comm_all_reduce_int(tsr_comm *c, int *x, size_t count, tsr_comm_op op);
int tsr_comm_barrier(tsr_comm *c);
/* Sum of one double per rank, added in rank order: bitwise the same on every rank (an
 * all-reduce does not promise that), so decisions taken from it (clipping, skipping a
 * non-finite step) agree everywhere. */
int tsr_comm_sum_ordered(tsr_comm *c, double x, double *sum);

/* ---- non-blocking forms: same arguments plus the handle to wait on ---- */

int tsr_comm_iall_reduce(tsr_comm *c, void *buf, size_t count, tsr_dtype dt,
                         tsr_comm_handle *h);
int tsr_comm_ireduce_scatter(tsr_comm *c, const void *send, void *recv, size_t recv_count,
                             tsr_dtype dt, tsr_comm_handle *h);
int tsr_comm_iall_gather(tsr_comm *c, const void *send, void *recv, size_t send_count,
                         tsr_dtype dt, tsr_comm_handle *h);
int tsr_comm_ibroadcast(tsr_comm *c, void *buf, size_t bytes, int root, tsr_comm_handle *h);
int tsr_comm_isend(tsr_comm *c, const void *buf, size_t bytes, int peer, int tag,
                   tsr_comm_handle *h);
int tsr_comm_irecv(tsr_comm *c, void *buf, size_t bytes, int peer, int tag, tsr_comm_handle *h);
int tsr_comm_ireduce_scatter_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                               tsr_dtype dt, tsr_comm_handle *h);
int tsr_comm_iall_gather_v(tsr_comm *c, const void *send, void *recv, const size_t *counts,
                           tsr_dtype dt, tsr_comm_handle *h);

/* Complete one operation / n operations (any mix of groups and kinds); the handles
 * are set to NULL.  waitall completes every handle even when one fails, and returns
 * the first error. */
int tsr_comm_wait(tsr_comm_handle *h);
int tsr_comm_waitall(int n, tsr_comm_handle *h);
/* Drive an operation forward without blocking (MPI progresses non-blocking collectives
 * only inside MPI calls); *done = 1 once it has completed (the handle is then NULL). */
int tsr_comm_test(tsr_comm_handle *h, int *done);

/* ---- byte counters (see the convention above) ---- */

double tsr_comm_bytes(const tsr_comm *c);                          /* all kinds */
double tsr_comm_bytes_of(const tsr_comm *c, tsr_comm_kind kind);
int64_t tsr_comm_ops_of(const tsr_comm *c, tsr_comm_kind kind);    /* operations started */
const char *tsr_comm_kind_name(tsr_comm_kind kind);                 /* "all_reduce", ... */
void tsr_comm_reset_counters(tsr_comm *c);

#endif
