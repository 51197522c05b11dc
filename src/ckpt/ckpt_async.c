/* ckpt_async.c — the host snapshot and the background writer of a checkpoint
 * (ckpt_async.h). */
#include "ckpt_async.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "model/layout.h"
#include "ops/ops.h"
#include "core/util.h"

/* Elements per piece of the snapshot copy: 4 MB, so that OpenMP threads share it evenly. */
#define COPY_CHUNK (1 << 20)

typedef struct {
  int64_t at, n; /* elements [at, at + n) of the shard buffers */
} span;

struct tsr_ckpt_async {
  const tsr_config *cfg;
  tsr_ckpt_view view;
  MPI_Comm comm;  /* the writer's duplicate of the job's communicator */
  int64_t len;    /* elements of the view's shard */
  float *snap;    /* [3][len]: master, m, v; only the spans are ever written */
  span *spans;    /* what this rank writes, cut into pieces of at most COPY_CHUNK */
  int n_spans;
  int has_m, has_v;
  tsr_train_state st;
  const char *deck;
  pthread_t thread;
  int running;  /* a write was started and its outcome not yet collected */
  int joinable; /* ... by a thread of its own */
  int finished; /* set by the thread as it ends (atomic) */
  int rc;       /* the write's outcome and duration, read after the join */
  double write_s;
};

/* The pieces of the shard this rank writes, as tsr_ckpt_save_view chooses them: every
 * tensor of its layout but the tied copy, where this holder writes it, intersected with
 * the shard; adjacent ones merged, then cut into COPY_CHUNK pieces. */
static int make_spans(tsr_ckpt_async *a) {
  const tsr_ckpt_view *v = &a->view;
  for (int pass = 0; pass < 2; pass++) { /* count, then fill */
    int n = 0;
    int64_t open_at = -1, open_end = -1;
    for (int j = 0; j <= v->lay->n_tensors; j++) {
      int64_t at = -1, end = -1;
      if (j < v->lay->n_tensors) {
        const tsr_tensor *t = &v->lay->tensors[j];
        int64_t i0 = 0, i1 = 0;
        tsr_rect rect[3];
        if (t->tied_copy || !tsr_layout_writes(t, v->copy_index, v->n_copies)) continue;
        tsr_layout_piece(t, v->shard_begin, v->shard_end, &i0, &i1, rect);
        if (i1 <= i0) continue;
        at = t->offset + i0 - v->shard_begin, end = t->offset + i1 - v->shard_begin;
        if (at == open_end) { /* continues the open range */
          open_end = end;
          continue;
        }
      }
      for (int64_t p = open_at; open_at >= 0 && p < open_end; p += COPY_CHUNK, n++)
        if (pass) a->spans[n] = (span){p, open_end - p < COPY_CHUNK ? open_end - p : COPY_CHUNK};
      open_at = at, open_end = end;
    }
    if (!pass && !(a->spans = tsr_calloc((size_t)n + 1, sizeof *a->spans))) return TSR_ERR;
    a->n_spans = n;
  }
  return 0;
}

/* Bytes of memory this process may still take (tsr_host_available); the test hook TSR_FAULT
 * ckpt_host_mb replaces it. */
static double host_available(void) {
  const long long hook = tsr_fault_int("ckpt_host_mb", -1);
  return hook >= 0 ? (double)hook * 1e6 : tsr_host_available();
}

/* Collective: does every node hold its ranks' snapshots in half its available memory? */
static int snapshot_fits(double mine, MPI_Comm comm) {
  MPI_Comm node;
  double node_bytes = mine;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Allreduce(&mine, &node_bytes, 1, MPI_DOUBLE, MPI_SUM, node);
    MPI_Comm_free(&node);
  }
  const double avail = host_available();
  double worst[3] = {avail > 0 ? node_bytes / avail : 1e300, node_bytes, -avail};
  MPI_Allreduce(MPI_IN_PLACE, worst, 3, MPI_DOUBLE, MPI_MAX, comm);
  const int fits = worst[0] <= 0.5;
  if (fits)
    tsr_log("checkpoint: asynchronous writes (checkpoint.async): a host snapshot of %.3f MB "
            "on this rank, %.1f MB on the fullest node, within half the %.0f MB available "
            "there; training waits only for the copy", mine / 1e6, worst[1] / 1e6,
            -worst[2] / 1e6);
  else
    tsr_log("checkpoint: synchronous writes: the host snapshots of asynchronous ones would take "
            "%.1f MB on a node with %.0f MB available, more than half of it "
            "(checkpoint.async is off for this run)", worst[1] / 1e6, -worst[2] / 1e6);
  return fits;
}

/* checkpoint.async = 'auto', collective: background writes where they pay.  With a GPU
 * the training runs on the device and the host's cores are free for the writer; on a
 * CPU-only node they pay only where the node's ranks and their threads leave a core free:
 * where they use every core, the writer takes its time from the steps it overlaps, and
 * at an MTBF of 60 s the goodput measured 0.37 with background writes against 0.63 with
 * synchronous ones (bench/RESULTS.md).  1 when every node qualifies, 0 otherwise; the log
 * says which rule decided. */
static int async_by_rule(MPI_Comm comm) {
  int ranks = 1;
  MPI_Comm node;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &ranks);
    MPI_Comm_free(&node);
  }
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  const long cores = sysconf(_SC_NPROCESSORS_ONLN); /* the node's, as main.c's threads */
  /* [device everywhere, a free core everywhere]: minimum over the ranks */
  int v[2] = {tsr_ops_on_device() != 0, (long)ranks * threads < cores};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, comm);
  if (v[0])
    tsr_log("checkpoint: checkpoint.async = 'auto': background writes, the training runs on the "
            "GPUs and leaves the host's cores to the writer");
  else if (v[1])
    tsr_log("checkpoint: checkpoint.async = 'auto': background writes, this node's %d rank(s) x "
            "%d thread(s) leave at least one of its %ld cores free for the writer", ranks, threads,
            cores);
  else
    tsr_log("checkpoint: checkpoint.async = 'auto': synchronous writes, this node's %d rank(s) x "
            "%d thread(s) use all its %ld cores and a background writer would slow the steps "
            "it overlaps (set checkpoint.async = .true. to write in the background anyway)",
            ranks, threads, cores);
  return v[0] || v[1];
}

int tsr_ckpt_async_create(tsr_ckpt_async **out, const tsr_config *cfg,
                          const tsr_ckpt_view *view, MPI_Comm comm) {
  *out = NULL;
  if (!cfg->checkpoint.async) {
    tsr_log("checkpoint: synchronous writes (checkpoint.async = .false.)");
    return 0;
  }
  if (cfg->checkpoint.async == TSR_LOGI_AUTO && !async_by_rule(comm)) return 0;
  const int64_t len = view->shard_end - view->shard_begin;
  if (!snapshot_fits(12.0 * (double)len, comm)) return 0;
  tsr_ckpt_async *a = tsr_calloc(1, sizeof *a);
  int rc = a ? 0 : TSR_ERR;
  if (a) {
    a->cfg = cfg, a->view = *view, a->len = len, a->comm = MPI_COMM_NULL;
    rc = make_spans(a);
    if (!rc && !(a->snap = tsr_ops_host_alloc(3 * (size_t)(len > 0 ? len : 1) * sizeof(float))))
      rc = TSR_ERR;
  }
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, comm);
  if (!rc && MPI_Comm_dup(comm, &a->comm) != MPI_SUCCESS) rc = TSR_ERR;
  if (rc) {
    tsr_error("checkpoint: cannot set up asynchronous writes (out of host memory?)");
    tsr_ckpt_async_destroy(&a);
    return rc;
  }
  *out = a;
  return 0;
}

static void *writer(void *arg) {
  tsr_ckpt_async *a = arg;
  const double t0 = tsr_now();
  const float *snap = a->snap;
  a->rc = tsr_ckpt_save_view(a->cfg, &a->view, snap, a->has_m ? snap + a->len : NULL,
                             a->has_v ? snap + 2 * a->len : NULL, &a->st, a->deck, a->comm);
  a->write_s = tsr_now() - t0;
  __atomic_store_n(&a->finished, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void collect(tsr_ckpt_async *a, tsr_ckpt_async_done *done) {
  if (a->joinable) pthread_join(a->thread, NULL);
  a->running = a->joinable = 0;
  *done = (tsr_ckpt_async_done){a->st.step, a->rc, a->write_s};
}

int tsr_ckpt_async_poll(tsr_ckpt_async *a, tsr_ckpt_async_done *done) {
  done->step = -1;
  if (!a || !a->running || !__atomic_load_n(&a->finished, __ATOMIC_ACQUIRE)) return 0;
  collect(a, done);
  return 1;
}

int tsr_ckpt_async_wait(tsr_ckpt_async *a, tsr_ckpt_async_done *done) {
  done->step = -1;
  if (!a || !a->running) return 0;
  collect(a, done);
  return 1;
}

/* dst[span] = src[span] for every span, and the same for the three buffers, the source
 * element i at lo[k] + i below split and at hi[k] + (i - split) from it: on the CPU by
 * the OpenMP team, on a device as queued copies into page-locked memory. */
static void copy_piece(tsr_ckpt_async *a, int k, const span *p, float *const lo[3],
                       float *const hi[3], int64_t split, int dev) {
  float *dst = a->snap + k * a->len + p->at;
  const int64_t at = (int64_t)p->at, end = at + (int64_t)p->n;
  const int64_t nlo = end <= split ? end - at : at < split ? split - at : 0;
  if (nlo > 0 && lo[k]) {
    if (dev)
      tsr_ops_copy(dst, lo[k] + at, (size_t)nlo * sizeof(float));
    else
      memcpy(dst, lo[k] + at, (size_t)nlo * sizeof(float));
  }
  const int64_t from = at + nlo;
  if (end > from && hi[k]) /* host memory either way */
    memcpy(dst + nlo, hi[k] + (from - split), (size_t)(end - from) * sizeof(float));
}

static void copy_spans(tsr_ckpt_async *a, float *const lo[3], float *const hi[3],
                       int64_t split) {
  if (tsr_ops_on_device()) {
    for (int k = 0; k < 3; k++)
      for (int i = 0; i < a->n_spans; i++) copy_piece(a, k, &a->spans[i], lo, hi, split, 1);
    tsr_ops_sync();
    return;
  }
  const int n = 3 * a->n_spans;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; i++) copy_piece(a, i / a->n_spans, &a->spans[i % a->n_spans], lo, hi,
                                         split, 0);
}

int tsr_ckpt_async_start(tsr_ckpt_async *a, float *const lo[3], float *const hi[3],
                         int64_t split, const tsr_train_state *st, const char *deck_text,
                         double *waited_s, double *copy_s, tsr_ckpt_async_done *prev) {
  const double t0 = tsr_now();
  tsr_ckpt_async_wait(a, prev); /* at most one write in flight */
  *waited_s = tsr_now() - t0;
  *copy_s = 0;
  if (prev->step >= 0 && prev->rc) return prev->rc;
  const double t1 = tsr_now();
  copy_spans(a, lo, hi, split);
  a->has_m = lo[1] || hi[1], a->has_v = lo[2] || hi[2];
  a->st = *st;
  a->deck = deck_text;
  *copy_s = tsr_now() - t1;
  if (tsr_ops_on_device()) { /* a failed device copy is one rank's: agree (no write in flight) */
    int rc = tsr_ops_status();
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, a->comm);
    if (rc) return rc;
  }
  a->finished = 0;
  a->running = 1;
  /* the stop signals stay with the main thread, whose loop acts on them */
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  const int e = pthread_create(&a->thread, NULL, writer, a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  a->joinable = e == 0;
  if (e) { /* the other ranks write: this one too, now, on this thread */
    tsr_warn("checkpoint: cannot start a thread for the write of step %lld (%s): writing it "
             "synchronously", (long long)st->step, strerror(e));
    writer(a);
  }
  return 0;
}

void tsr_ckpt_async_destroy(tsr_ckpt_async **pa) {
  tsr_ckpt_async *a = pa ? *pa : NULL;
  if (!a) return;
  tsr_ckpt_async_done done;
  tsr_ckpt_async_wait(a, &done);
  if (a->comm != MPI_COMM_NULL) MPI_Comm_free(&a->comm);
  tsr_ops_host_free(&a->snap);
  tsr_free(&a->spans);
  tsr_free(pa);
}
