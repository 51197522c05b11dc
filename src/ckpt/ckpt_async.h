/* ckpt_async.h — checkpoints written in the background (checkpoint.async; docs/formats.md
 * "Asynchronous checkpoints").
 *
 * At a step boundary every rank copies the pieces of master, m and v it would write
 * (tsr_layout_writes under its view) and the train state into a host snapshot, which is
 * page-locked memory on a GPU, and training goes on; a thread of its own then writes the
 * same file tsr_ckpt_save_view writes, from the snapshot, with the same collective
 * parallel-HDF5 calls on a duplicate of the job's communicator (made here, at setup, by
 * the main thread), and verifies, fsyncs and publishes it the same way: a write cut short
 * leaves the previous checkpoint the newest complete one.
 *
 * HDF5 is not thread-safe in this build: while a write is in flight the main thread must
 * make no HDF5 call.  The trainer reads checkpoints only before its first step (resume,
 * before this object exists) and never during the loop (evaluation and sampling use the
 * model in memory; tessera eval and tools/tsr-export are other processes).
 *
 * At most one write is in flight: a checkpoint due while one is writing waits for it.
 * The outcome of a write is agreed inside tsr_ckpt_save_view (every phase ends in an
 * agreement), so every rank collects the same code. */
#ifndef TSR_CKPT_ASYNC_H
#define TSR_CKPT_ASYNC_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "core/config.h"

typedef struct tsr_ckpt_async tsr_ckpt_async;

typedef struct {
  int64_t step;   /* the checkpoint's step; -1: there was no write */
  int rc;         /* its outcome, the same on every rank */
  double write_s; /* the background write: file, verification, fsync, publish, prune */
} tsr_ckpt_async_done;

/* Collective over comm.  Writes are asynchronous when cfg->checkpoint.async is set and the
 * snapshots of the ranks of every node (12 bytes per element of each rank's shard) take at
 * most half the memory available there (MemAvailable, and the cgroup's limit); the decision,
 * the same on every rank, is logged.  Then *out holds the snapshot and a duplicate of
 * comm; otherwise *out is NULL and checkpoints are written synchronously. */
int tsr_ckpt_async_create(tsr_ckpt_async **out, const tsr_config *cfg,
                          const tsr_ckpt_view *view, MPI_Comm comm);

/* Checkpoint st->step: wait for the write in flight, if any (*waited_s, its outcome in
 * *prev; prev->step = -1 when there was none); if that write failed, start nothing and
 * return its code.  Otherwise copy this rank's pieces of master, m and v (k = 0, 1, 2) of
 * the view's shard, its elements [0, split) from op memory lo[k] and [split, end) from
 * host memory hi[k] (element split at hi[k][0]: the optimizer offload's part; split = the
 * shard's length without one), and *st into the snapshot (*copy_s) and start the
 * background write; deck_text (rank 0's) must stay valid until it ends.  m and v NULL in
 * both parts are written as zeros.  Every rank calls it for the same steps; on a device
 * the copy's outcome is agreed over the ranks. */
int tsr_ckpt_async_start(tsr_ckpt_async *a, float *const lo[3], float *const hi[3],
                         int64_t split, const tsr_train_state *st, const char *deck_text,
                         double *waited_s, double *copy_s, tsr_ckpt_async_done *prev);

/* Never blocks: 1 with the outcome in *done when the write in flight has ended (its thread
 * is joined; each write is reported once), 0 when none is in flight or it goes on. */
int tsr_ckpt_async_poll(tsr_ckpt_async *a, tsr_ckpt_async_done *done);
/* Blocks until the write in flight ends: 1 and its outcome, or 0 when there was none. */
int tsr_ckpt_async_wait(tsr_ckpt_async *a, tsr_ckpt_async_done *done);

/* Waits for a write in flight (collect its outcome before, it is dropped here), frees the
 * snapshot and the communicator.  NULL is fine; sets *a to NULL. */
void tsr_ckpt_async_destroy(tsr_ckpt_async **a);

#endif
