/* train.c — the training loop: setup, resume, micro-batch accumulation, clipping,
 * non-finite skip, AdamW, logging, evaluation, periodic and final checkpoints.
 *
 * Sample accounting (DESIGN.md): optimizer step s (0-based) consumes global samples
 * s*global_batch .. s*global_batch + global_batch - 1, split contiguously over dp
 * replicas, then into micro-batches; the cursor (samples consumed) is saved in the
 * checkpoint, so a resume continues the exact sample stream. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ops_backend.h"
#include "comm.h"
#include "comm_dev.h"
#include "comm_mpi.h"
#include "data.h"
#include "deck.h"
#include "grid.h"
#include "layout.h"
#include "metrics.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "pipeline.h"
#include "plan.h"
#include "pp_exec.h"
#include "util.h"
#include "watchdog.h"
#include "zero.h"

static volatile sig_atomic_t g_stop_signal = 0;

static void on_signal(int sig) { g_stop_signal = sig; }

void tsr_train_install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  /* A file-size limit (ulimit -f) would kill the process in the middle of a checkpoint;
   * ignored, the write fails with EFBIG and is reported like a full disk. */
  signal(SIGXFSZ, SIG_IGN);
}

/* mkdir -p */
static int make_dirs(const char *path) {
  char buf[TSR_STR_PATH];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) break;
    *p = '/';
  }
  if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
    tsr_error("cannot create directory '%s': %s", path, strerror(errno));
    return TSR_ERR_INPUT;
  }
  return 0;
}

/* Failure handling across ranks.  Up to the first step, every rank reaches the same
 * agreement points (after setup, after resume) and an error anywhere makes all of them
 * return it together: a bad deck, data file or checkpoint ends the job with its exit code
 * and one message.  Inside the loop a failure on one rank would leave the others waiting
 * in a collective, so the failing rank aborts the whole job (CONVENTIONS.md).  Checkpoint
 * writes agree on their outcome themselves (ckpt.c), so a failed save returns on all. */
static int agree(MPI_Comm world, int rc) {
  int any = rc;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, world);
  return any;
}

static void abort_job(MPI_Comm world, int rc, const char *what) __attribute__((noreturn));
static void abort_job(MPI_Comm world, int rc, const char *what) {
  tsr_error("%s failed on this rank (code %d); aborting every rank", what, rc);
  MPI_Abort(world, rc);
  exit(rc); /* MPI_Abort does not return */
}

typedef struct {
  const tsr_config *cfg;
  MPI_Comm world;
  int rank, world_size, dp, dp_rank;
  int64_t grad_accum_steps;
  tsr_grid *grid;
  tsr_layout *lay;
  tsr_model *model;
  tsr_zero *zero;
  tsr_pp_schedule *sched; /* pp > 1: this stage's schedule and its executor */
  tsr_pp_exec *exec;
  tsr_comm *tied;         /* tied embeddings with pp > 1: first and last stage */
  double *bubble;         /* [pp] measured idle fraction per stage, last step */
  tsr_data *train_data, *valid_data;
  int32_t *inputs, *targets;
  tsr_metrics *metrics;
  tsr_train_state st;
  double flops_per_token;
  double peak_flops; /* per rank, the denominator of MFU (measured GEMM rate on the CPU) */
  double phase_s[3]; /* last step: forward, backward, optimizer (s); NAN: not separable */
  int fp16;          /* precision 'fp16': dynamic loss scaling (st.loss_scale) */
  const tsr_ops_backend *dev; /* the device the ops run on (NULL: the CPU) */
  int nccl_used, staged_used; /* device transports some groups got (comm_dev.h) */
  double *loss_acc; /* op memory: this step's micro-batch losses, read once per step */
} trainer;

static void trainer_destroy(trainer *t) {
  tsr_metrics_close(&t->metrics);
  tsr_data_destroy(&t->train_data);
  tsr_data_destroy(&t->valid_data);
  tsr_pp_exec_destroy(&t->exec);
  tsr_comm_destroy(&t->tied);
  tsr_pp_schedule_destroy(&t->sched);
  tsr_free(&t->bubble);
  tsr_zero_destroy(&t->zero);
  tsr_model_destroy(&t->model);
  tsr_free(&t->inputs);
  tsr_free(&t->targets);
  tsr_ops_free(&t->loss_acc);
  tsr_layout_destroy(&t->lay);
  tsr_grid_destroy(&t->grid);
  /* after every group that used them */
  if (t->nccl_used) tsr_comm_gpu_transport->close();
  if (t->staged_used) tsr_comm_staged_transport->close();
  t->nccl_used = t->staged_used = 0;
  if (t->dev) { /* every buffer of the device is freed by now */
    tsr_ops_set_backend(NULL);
    t->dev->close();
    t->dev = NULL;
  }
}

/* run.device: install the device backend before anything allocates op memory. */
static int open_device(trainer *t, const tsr_config *cfg, MPI_Comm world) {
  if (cfg->run.device == TSR_DEVICE_CPU) return 0;
  if (!tsr_ops_cuda_open) {
    TSR_CHECK(cfg->run.device != TSR_DEVICE_CUDA, TSR_ERR_INPUT,
              "run.device = 'cuda' but this tessera was built without CUDA (configure found no "
              "CUDA toolkit, or --without-cuda): rebuild with ./configure --with-cuda, or set "
              "run.device = 'cpu'");
    return 0;
  }
  TSR_CALL(tsr_ops_cuda_open(&world, tsr_deck_word(cfg, &cfg->run.device), cfg->run.gpu_share,
                             &t->dev));
  if (t->dev) tsr_ops_set_backend(t->dev);
  return 0;
}

/* On a GPU, the groups that move device memory get a device transport (comm_dev.h):
 * NCCL for those inside a node always, for those across nodes only under &parallel
 * inter_node = 'nccl'.  What stays on MPI (groups across nodes by default, groups NCCL
 * declines because their ranks share a GPU, pipeline send/recv, builds without NCCL)
 * goes through pinned host buffers when MPI cannot take GPU memory itself (&parallel
 * mpi_gpu: 'auto' asks MPIX_Query_cuda_support), else straight to MPI.  Rank 0 logs
 * what its groups use. */
static int attach_gpu_comm(trainer *t) {
  if (!t->dev) return 0;
  const tsr_parallel_config *pc = &t->cfg->parallel;
  const int across = pc->inter_node == TSR_INTER_NODE_NCCL;
  /* every rank takes the same path (attaching is collective): CUDA-aware only if all are */
  int aware = tsr_comm_mpi_cuda_aware();
  TSR_CALL(tsr_comm_all_reduce_int(t->grid->world, &aware, 1, TSR_COMM_MIN));
  const int staged = tsr_comm_staged_transport &&
                     (pc->mpi_gpu == TSR_MPI_GPU_STAGED || (pc->mpi_gpu == TSR_MPI_GPU_AUTO && aware != 1));
  /* the groups ZeRO moves device memory over (zero.c): all of dp at stage 0, else the
   * shard and replicate halves; an NCCL communicator holds GPU memory, so no more; and
   * the pipeline's send/recv (NCCL has none here: staged MPI or MPI) */
  const int ddp = pc->zero_stage == 0;
  tsr_comm *g[] = {t->grid->tp_comm, ddp ? t->grid->dp_comm : t->grid->dp_shard,
                   ddp ? NULL : t->grid->dp_replicate, t->tied, t->grid->pp_comm};
  const int n = (int)(sizeof g / sizeof g[0]), pp = n - 1;
  char line[512] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0, spans = 0;
    for (int j = 0; j < i; j++) seen |= g[j] == g[i];
    if (!g[i] || seen || tsr_comm_size(g[i]) == 1) continue;
    TSR_CALL(tsr_grid_spans_nodes(t->grid, g[i], &spans));
    if (tsr_comm_gpu_transport && i != pp && (!spans || across)) {
      TSR_CALL(tsr_comm_attach_device(g[i], tsr_comm_gpu_transport));
      t->nccl_used = 1;
    }
    if (staged && !strcmp(tsr_comm_backend(g[i]), "mpi")) {
      TSR_CALL(tsr_comm_attach_device(g[i], tsr_comm_staged_transport));
      t->staged_used = 1;
    }
    if (used < sizeof line)
      used += (size_t)snprintf(line + used, sizeof line - used, "%s%s %s%s", used ? ", " : "",
                               tsr_comm_name(g[i]), tsr_comm_backend(g[i]),
                               spans ? " (across nodes)" : "");
  }
  if (t->rank == 0 && used)
    tsr_log("comm: %s; inter_node = '%s', mpi_gpu = '%s' (MPI %s)", line,
            tsr_deck_word(t->cfg, &pc->inter_node), tsr_deck_word(t->cfg, &pc->mpi_gpu),
            aware == 1 ? "is CUDA-aware" : aware == 0 ? "is not CUDA-aware" : "cannot say if it is CUDA-aware");
  return 0;
}

/* The groups whose traffic is logged, in a fixed order. */
#define N_LOGGED_GROUPS 6
static void comm_groups(const trainer *t, tsr_comm *g[N_LOGGED_GROUPS]) {
  g[0] = t->grid->dp_comm, g[1] = t->grid->dp_shard, g[2] = t->grid->dp_replicate;
  g[3] = t->grid->tp_comm, g[4] = t->grid->pp_comm, g[5] = t->grid->world;
}

static void reset_comm_counters(const trainer *t) {
  tsr_comm *g[N_LOGGED_GROUPS];
  comm_groups(t, g);
  for (int i = 0; i < N_LOGGED_GROUPS; i++) tsr_comm_reset_counters(g[i]);
}

/* "dp_shard 1.23 MB (reduce_scatter 0.61, all_gather 0.61)" for the groups that moved data. */
static void describe_comm(const trainer *t, char *buf, size_t len) {
  tsr_comm *g[N_LOGGED_GROUPS];
  comm_groups(t, g);
  const int n = N_LOGGED_GROUPS;
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n && used < len; i++) {
    if (tsr_comm_bytes(g[i]) <= 0 || (i > 0 && g[i] == g[0])) continue;
    used += (size_t)snprintf(buf + used, len - used, "%s%s %.3f MB (", used ? "; " : "",
                             tsr_comm_name(g[i]), tsr_comm_bytes(g[i]) / 1e6);
    int first = 1;
    for (int k = 0; k < TSR_COMM_N_KINDS && used < len; k++) {
      const double b = tsr_comm_bytes_of(g[i], (tsr_comm_kind)k);
      if (b <= 0) continue;
      used += (size_t)snprintf(buf + used, len - used, "%s%s %.3f", first ? "" : ", ",
                               tsr_comm_kind_name((tsr_comm_kind)k), b / 1e6);
      first = 0;
    }
    if (used < len) used += (size_t)snprintf(buf + used, len - used, ")");
  }
  if (!buf[0]) snprintf(buf, len, "none");
}

/* The GEMM rate of this rank in the run's storage type (FLOP/s, the best of many 256 x 512
 * x 512 products; on a GPU 4096 x 4096 x 4096): on the CPU, where no peak is stated, MFU is
 * measured against it, as a GPU's MFU is against its GEMM peak.  The buffers are a
 * setup-time transient outside the counted allocations (the planner's memory figures do
 * not include them). */
static void *probe_alloc(size_t n, tsr_dtype dt) {
  return tsr_ops_on_device() ? tsr_ops_alloc(n, tsr_dtype_size(dt))
                             : malloc(n * tsr_dtype_size(dt));
}
static void probe_free(void *p) {
  if (tsr_ops_on_device())
    tsr_ops_free(&p);
  else
    free(p);
}

/* The probe's product y[n, out] = x[n, in] w[out, in]^T: a GPU needs one big enough to
 * fill it; TSR_GEMM_PROBE_N shrinks it (the emulated-GPU tests, where a GEMM is a plain
 * loop). */
static void probe_shape(int *n, int *in, int *out) {
  const char *probe = getenv("TSR_GEMM_PROBE_N");
  const int dev = tsr_ops_on_device();
  *n = probe && atoi(probe) > 0 ? atoi(probe) : dev ? 4096 : 256;
  *in = *out = dev ? *n : 2 * *n;
}

/* Values i % period * 0.01 stored in dt at op memory dst (through a host fp32 copy). */
static void probe_fill(void *dst, tsr_dtype dt, size_t n, int period) {
  float *h = malloc(n * sizeof(float));
  if (!h) return;
  for (size_t i = 0; i < n; i++) h[i] = (float)(i % (size_t)period) * 0.01f;
  void *d = tsr_ops_on_device() ? tsr_ops_alloc(n, sizeof(float)) : h;
  if (d) {
    if (d != h) tsr_ops_copy(d, h, n * sizeof(float));
    tsr_ops_cast(dt, dst, TSR_F32, d, (long)n);
    tsr_ops_sync();
  }
  if (d && d != h) tsr_ops_free(&d);
  free(h);
}

static double measure_gemm_rate(int n, int in, int out, tsr_dtype dt) {
  const char *probe = getenv("TSR_GEMM_PROBE_N");
  const int dev = tsr_ops_on_device();
  void *x = probe_alloc((size_t)n * in, dt), *w = probe_alloc((size_t)out * in, dt);
  void *y = probe_alloc((size_t)n * out, dt);
  double best = 0.0;
  if (x && w && y) {
    probe_fill(x, dt, (size_t)n * in, 7);
    probe_fill(w, dt, (size_t)out * in, 5);
    /* the first calls wake threads and touch pages: take the best of >= 30 calls, 0.1 s
     * (on a device: each call timed to its completion) */
    const double start = tsr_now();
    const int min_calls = dev && probe ? 3 : 30;
    for (int r = 0; r < min_calls || (tsr_now() - start < 0.1 && r < 1000); r++) {
      const double t0 = tsr_now();
      tsr_ops_matmul_fwd(dt, y, x, w, NULL, n, in, out);
      tsr_ops_sync();
      const double dt_s = tsr_now() - t0;
      if (dt_s > 0 && 2.0 * n * in * out / dt_s > best) best = 2.0 * n * in * out / dt_s;
    }
  }
  probe_free(x);
  probe_free(w);
  probe_free(y);
  tsr_ops_mem_reset_peak(); /* the probe is not the run's memory */
  return best;
}

static int trainer_setup(trainer *t, const tsr_config *cfg, MPI_Comm world, int need_train) {
  memset(t, 0, sizeof *t);
  t->cfg = cfg;
  t->world = world;
  MPI_Comm_rank(world, &t->rank);
  MPI_Comm_size(world, &t->world_size);
  const tsr_train_config *tc = &cfg->train;
  t->fp16 = tc->precision == TSR_F16;
  tsr_comm *w;
  TSR_CALL(tsr_comm_create(&w, world, "world"));
  const int rc = tsr_grid_create(&t->grid, cfg, w);
  tsr_comm_destroy(&w);
  if (rc) return rc;
  TSR_CALL(open_device(t, cfg, world));
  t->dp = t->grid->dp;
  t->dp_rank = t->grid->dp_rank;
  t->grad_accum_steps = tc->global_batch / (tc->micro_batch * t->dp);

  const int stage = (int)cfg->parallel.zero_stage;
  TSR_CALL(tsr_layout_create_part(&t->lay, &cfg->model, t->grid->tp, t->grid->tp_rank,
                                  t->grid->pp, t->grid->pp_rank,
                                  (int)cfg->parallel.virtual_stages));
  tsr_zero_pad_layout(t->lay, cfg, t->grid);
  tsr_model_options mo = {stage < 3, stage < 2, t->grid->tp_comm, 1};
  if (t->grid->pp > 1) {
    TSR_CALL(tsr_pp_schedule_for(&t->sched, cfg, t->grid));
    mo.n_slots = tsr_pp_slots_needed(t->sched);
    TSR_CHECK(mo.n_slots > 0, TSR_ERR, "pipeline: bad schedule");
    t->bubble = tsr_calloc((size_t)t->grid->pp, sizeof(double));
    TSR_CHECK(t->bubble, TSR_ERR, "out of memory");
  }
  TSR_CALL(tsr_model_create_opt(&t->model, cfg, t->lay, &mo));
  tsr_ops_shapes shapes;
  tsr_model_ops_shapes(t->model, &shapes);
  shapes.sumsq_elems = (long)t->lay->n_flat;
  shapes.deterministic = tc->deterministic;
  TSR_CALL(tsr_ops_reserve(&shapes));
  TSR_CALL(tsr_zero_create(&t->zero, cfg, t->lay, t->model, t->grid));
  if (t->sched) TSR_CALL(tsr_pp_exec_create(&t->exec, cfg, t->grid, t->model, t->zero, t->sched));
  if (cfg->model.tie_embeddings && t->grid->pp > 1) {
    /* the first stage's embed.weight and the last stage's copy: one group per (dp, tp) */
    const int ends = t->grid->pp_rank == 0 || t->grid->pp_rank == t->grid->pp - 1;
    MPI_Comm c;
    MPI_Comm_split(world, ends ? t->grid->dp_rank * t->grid->tp + t->grid->tp_rank : MPI_UNDEFINED,
                   t->grid->pp_rank, &c);
    if (ends) {
      const int made = tsr_comm_create(&t->tied, c, "embed_tied");
      MPI_Comm_free(&c);
      TSR_CALL(made);
      const tsr_tensor *e = tsr_layout_find(t->lay, "embed.weight");
      TSR_CHECK(e, TSR_ERR, "pipeline: no embed.weight on stage %d", t->grid->pp_rank);
      TSR_CALL(tsr_zero_set_tied(t->zero, t->tied, e->offset, e->offset + e->numel));
    }
  }
  TSR_CALL(attach_gpu_comm(t));
  const size_t ntok = (size_t)(tc->micro_batch * cfg->model.seq_len);
  t->inputs = tsr_calloc(ntok, sizeof(int32_t));
  t->targets = tsr_calloc(ntok, sizeof(int32_t));
  t->loss_acc = tsr_ops_alloc(1, sizeof(double));
  TSR_CHECK(t->inputs && t->targets && t->loss_acc, TSR_ERR, "out of memory for the batch");
  t->flops_per_token = tsr_plan_flops_per_token(&cfg->model); /* the planner's count */
  if (need_train) { /* MFU's denominator: the slowest rank's, so MFU <= 1 for all */
    int n, in, out;
    probe_shape(&n, &in, &out);
    /* a GPU's peak is its tensor cores' for 16-bit storage; a CPU computes in fp32 FMA
     * whatever the storage, so its peak is the fp32 GEMM's */
    const tsr_dtype dt = t->dev ? tsr_model_dtype(t->model) : TSR_F32;
    t->peak_flops = measure_gemm_rate(n, in, out, dt);
    MPI_Allreduce(MPI_IN_PLACE, &t->peak_flops, 1, MPI_DOUBLE, MPI_MIN, world);
    if (t->rank == 0)
      tsr_log("mfu: measured against this %s's GEMM rate (%s storage, fp32 accumulation), "
              "%.2f GFLOP/s per rank", t->dev ? "GPU" : "CPU", tsr_dtype_name(dt),
              t->peak_flops / 1e9);
  }

  const uint64_t seed = (uint64_t)cfg->run.seed;
  if (need_train) {
    TSR_CHECK(cfg->data.train[0], TSR_ERR_INPUT,
              "&data train is empty: set it to a path or glob of token shards (make them with "
              "tools/tsr-prepare)");
    TSR_CALL(tsr_data_open(&t->train_data, cfg->data.train, cfg->model.seq_len,
                           cfg->model.vocab_size, cfg->data.shuffle, seed));
  }
  if (cfg->data.valid[0])
    TSR_CALL(tsr_data_open(&t->valid_data, cfg->data.valid, cfg->model.seq_len,
                           cfg->model.vocab_size, 0, seed));
  t->st.seed = seed;
  t->st.loss_scale = t->fp16 ? tc->loss_scale : 1.0;
  t->st.scale_good_steps = t->fp16 ? 0 : -1;
  return 0;
}

/* What this rank holds, for checkpoint I/O: its (stage, tp) part, its ZeRO shard of that,
 * and which of the identical copies of the shard it is (dp replicas at zero 0, hybrid
 * replicas otherwise), so each piece is written once. */
static tsr_ckpt_view ckpt_view(const trainer *t) {
  tsr_ckpt_view v = {t->lay, tsr_zero_shard_begin(t->zero), tsr_zero_shard_end(t->zero), 0, 1};
  if (t->cfg->parallel.zero_stage == 0)
    v.copy_index = t->grid->dp_rank, v.n_copies = t->grid->dp;
  else
    v.copy_index = t->grid->replicate_rank, v.n_copies = t->grid->replicate_size;
  return v;
}


/* Mean validation loss over eval_steps micro-batches: the first samples of the valid set
 * (fewer when the set is smaller). */
static int evaluate(trainer *t, double *val_loss, int64_t *batches) {
  const tsr_config *cfg = t->cfg;
  const int64_t mb = cfg->train.micro_batch;
  int64_t n_batches = cfg->run.eval_steps;
  const int64_t avail = tsr_data_n_samples(t->valid_data) / mb;
  if (avail < n_batches) n_batches = avail > 0 ? avail : 1; /* small valid sets wrap */
  double sum = 0;
  for (int64_t b = 0; b < n_batches; b++) {
    double loss;
    tsr_data_batch(t->valid_data, b * mb, mb, t->inputs, t->targets);
    if (t->exec)
      TSR_CALL(tsr_pp_exec_eval(t->exec, t->inputs, t->targets, &loss));
    else
      TSR_CALL(tsr_model_forward(t->model, t->inputs, t->targets, &loss));
    sum += loss;
  }
  TSR_CALL(tsr_ops_status());
  *val_loss = sum / (double)n_batches;
  if (batches) *batches = n_batches;
  return 0;
}

static int save(trainer *t, const char *deck_text) {
  const double t0 = tsr_now();
  tsr_watchdog_activity(t->st.step, "a checkpoint write");
  const tsr_ckpt_view view = ckpt_view(t);
  tsr_ops_sync(); /* the update has landed before the host reads the state */
  TSR_CALL(tsr_ckpt_save_view(t->cfg, &view, tsr_zero_master(t->zero), tsr_zero_adam_m(t->zero),
                              tsr_zero_adam_v(t->zero), &t->st, deck_text, t->world));
  char detail[64];
  snprintf(detail, sizeof detail, "%.3f s", tsr_now() - t0);
  tsr_metrics_event(t->metrics, t->st.step, "checkpoint", detail);
  return 0;
}

static int resume_or_init(trainer *t) {
  char path[TSR_STR_PATH];
  TSR_CALL(tsr_ckpt_resolve(t->cfg, path, sizeof path, t->world));
  if (path[0]) {
    const tsr_ckpt_view view = ckpt_view(t);
    tsr_ops_sync(); /* the host writes the state */
    TSR_CALL(tsr_ckpt_load_view(path, &t->cfg->checkpoint, &view, tsr_zero_master(t->zero),
                                tsr_zero_adam_m(t->zero), tsr_zero_adam_v(t->zero), &t->st,
                                t->world));
    TSR_CALL(tsr_zero_publish_params(t->zero));
  } else {
    /* the whole of this rank's part from the seed, then its shard kept */
    float *init = tsr_calloc((size_t)t->lay->n_flat, sizeof(float));
    TSR_CHECK(init, TSR_ERR, "out of memory for %lld parameters", (long long)t->lay->n_flat);
    tsr_layout_init(t->lay, init, (uint64_t)t->cfg->run.seed);
    const int rc = tsr_zero_scatter_state(t->zero, init, NULL, NULL);
    tsr_free(&init);
    TSR_CALL(rc);
  }
  if (path[0]) {
    TSR_CHECK(t->st.seed == (uint64_t)t->cfg->run.seed, TSR_ERR_INPUT,
              "checkpoint %s was written with run.seed = %llu but the deck has seed = %lld; the "
              "data order would change: use the same seed or checkpoint.resume = 'none'",
              path, (unsigned long long)t->st.seed, (long long)t->cfg->run.seed);
    tsr_log("resumed from %s at step %lld (%lld samples consumed)", path, (long long)t->st.step,
            (long long)t->st.data_cursor);
    /* the loss scale goes on from an fp16 checkpoint; otherwise it starts (or stays off) */
    if (t->fp16 && t->st.scale_good_steps < 0) {
      t->st.loss_scale = t->cfg->train.loss_scale;
      t->st.scale_good_steps = 0;
      tsr_log("the checkpoint is not from an fp16 run: the loss scale starts at %g",
              t->st.loss_scale);
    } else if (t->fp16) {
      tsr_log("fp16 loss scale %g (%lld steps since it last changed)", t->st.loss_scale,
              (long long)t->st.scale_good_steps);
    } else {
      t->st.loss_scale = 1.0;
      t->st.scale_good_steps = -1;
    }
    tsr_metrics_event(t->metrics, t->st.step, "resume", path);
  } else {
    tsr_metrics_event(t->metrics, 0, "start", "initialised from seed");
  }
  return 0;
}

/* One optimizer step: accumulate gradients over the micro-batches of this rank's share
 * of the global batch (reductions overlap backward, see zero.c), then clip and update
 * (or skip on a non-finite gradient: the norm is bitwise equal on every rank, so every
 * rank decides the same).
 * fp16: the loss is multiplied by the loss scale S (a power of two) before backward, so
 * that small activation gradients survive fp16 storage; the gradients stay scaled and
 * the update divides by S (with the clipping factor: no pass of its own).  A non-finite
 * norm is an overflow: the update is skipped and S halved (not below min_loss_scale);
 * after loss_scale_window steps without one, S doubles. */
static int train_step(trainer *t, double *loss, double *grad_norm, double *lr, int *skipped) {
  const tsr_config *cfg = t->cfg;
  const int64_t mb = cfg->train.micro_batch, k = t->grad_accum_steps;
  const int64_t first = t->st.data_cursor + t->dp_rank * (cfg->train.global_batch / t->dp);
  /* each rank's micro-batch loss is a mean over its tokens: 1/(k dp) makes the summed
   * gradient the mean over the global batch */
  const double S = t->fp16 ? t->st.loss_scale : 1.0;
  const float dloss = (float)(S / ((double)k * t->dp));
  const double t_begin = tsr_now();
  TSR_CALL(tsr_zero_begin_step(t->zero));
  double opt_s = tsr_now() - t_begin, fwd_s = 0, bwd_s = 0;
  /* the micro-batch losses add up in op memory: no host round trip per micro-batch */
  tsr_ops_zero(t->loss_acc, sizeof(double));
  if (t->exec) { /* pipeline: the schedule runs the k micro-batches */
    tsr_pp_step_stats ps;
    TSR_CALL(tsr_pp_exec_step(t->exec, t->train_data, first, dloss, t->loss_acc, &ps));
    memset(t->bubble, 0, (size_t)t->grid->pp * sizeof(double));
    t->bubble[t->grid->pp_rank] = ps.total_s > 0 ? ps.idle_s / ps.total_s : 0;
    TSR_CALL(tsr_comm_all_reduce_double(t->grid->pp_comm, t->bubble, (size_t)t->grid->pp,
                                        TSR_COMM_SUM));
  } else {
    for (int64_t a = 0; a < k; a++) {
      TSR_CALL(tsr_zero_begin_micro(t->zero, a == k - 1));
      tsr_data_batch(t->train_data, first + a * mb, mb, t->inputs, t->targets);
      const double t_fwd = tsr_now(); /* tsr_model_fwd_bwd, timed in its two phases */
      TSR_CALL(tsr_model_chunk_forward(t->model, 0, 0, t->inputs, t->targets, NULL, dloss, 1,
                                       t->loss_acc));
      const double t_bwd = tsr_now();
      TSR_CALL(tsr_model_chunk_backward(t->model, 0, 0, NULL));
      fwd_s += t_bwd - t_fwd;
      bwd_s += tsr_now() - t_bwd;
    }
  }
  const double t_opt = tsr_now();
  TSR_CALL(tsr_zero_reduce_grads(t->zero));
  /* fault injection for the tests: poison one gradient at the given step */
  const char *inject = getenv("TSR_FAULT_NAN_GRAD_STEP");
  if (inject && atoll(inject) == t->st.step + 1 && t->rank == 0) {
    const float nan = NAN;
    tsr_ops_copy(tsr_zero_reduced_grads(t->zero), &nan, sizeof nan);
  }
  TSR_CALL(tsr_zero_grad_norm(t->zero, grad_norm));
  *grad_norm /= S; /* of the unscaled gradient (exact: S is a power of two) */
  tsr_ops_sync(); /* done already on a device: the gradient norm was read */
  double loss_sum = *t->loss_acc;
  if (t->exec) /* the last stage's (0 on the others) */
    TSR_CALL(tsr_comm_sum_ordered(t->grid->pp_comm, loss_sum, &loss_sum));
  TSR_CALL(tsr_comm_sum_ordered(t->grid->dp_comm, loss_sum / (double)k, loss));
  *loss /= (double)t->dp;
  const int64_t step = t->st.step + 1;
  *lr = tsr_optim_lr(&cfg->optim, cfg->run.max_steps, step);
  *skipped = !isfinite(*grad_norm);
  if (*skipped) {
    t->st.skipped++;
    if (t->fp16) {
      t->st.loss_scale = fmax(S / 2, cfg->train.min_loss_scale);
      t->st.scale_good_steps = 0;
    }
  } else {
    const double scale = tsr_optim_clip_scale(*grad_norm, cfg->train.grad_clip) / S;
    /* Adam's bias correction counts the updates actually made (skipped steps do not
     * advance it, as with torch's GradScaler skipping optimizer.step()). */
    TSR_CALL(tsr_zero_update(t->zero, &cfg->optim, *lr, step - t->st.skipped, scale));
    if (t->fp16 && ++t->st.scale_good_steps >= cfg->train.loss_scale_window) {
      t->st.loss_scale = S * 2;
      t->st.scale_good_steps = 0;
    }
  }
  t->st.step = step;
  t->st.data_cursor += cfg->train.global_batch;
  t->st.tokens += cfg->train.global_batch * cfg->model.seq_len;
  /* a pipeline schedule interleaves forward and backward: only the optimizer is apart;
   * on a GPU the host only queues the forward and backward (the step synchronises once,
   * at the gradient norm), so none of the three is the device's time */
  t->phase_s[0] = t->exec || t->dev ? NAN : fwd_s;
  t->phase_s[1] = t->exec || t->dev ? NAN : bwd_s;
  t->phase_s[2] = t->dev ? NAN : opt_s + (tsr_now() - t_opt);
  return tsr_ops_status(); /* a failed device call fails the step */
}

static void fmt_eta(char *buf, size_t len, double seconds) {
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, len, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    snprintf(buf, len, "%ldm%02lds", s / 60, s % 60);
}

static int open_outputs(trainer *t) {
  const tsr_config *cfg = t->cfg;
  char path[TSR_STR_PATH + 32];
  TSR_CALL(make_dirs(cfg->run.out_dir));
  snprintf(path, sizeof path, "%s/tessera.log", cfg->run.out_dir);
  TSR_CALL(tsr_log_open(path));
  if (t->rank == 0) {
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->run.out_dir);
    TSR_CALL(tsr_metrics_open(&t->metrics, path));
  }
  return 0;
}

int tsr_train(const tsr_config *cfg, const char *deck_text, MPI_Comm world) {
  trainer t;
  int rc = trainer_setup(&t, cfg, world, 1);
  if (!rc) rc = open_outputs(&t);
  if ((rc = agree(world, rc)) != 0) {
    trainer_destroy(&t);
    return rc;
  }
  /* GO: an error every rank shares (checkpoint I/O); GO_ALONE: one that may be this
   * rank's alone (a step, an evaluation): the job is aborted. */
#define GO(expr)                       \
  do {                                 \
    if ((rc = (expr)) != 0) goto done; \
  } while (0)
#define GO_ALONE(expr)                                   \
  do {                                                   \
    if ((rc = (expr)) != 0) abort_job(world, rc, #expr); \
  } while (0)
  tsr_log("effective deck:\n%s", deck_text);
  tsr_log("model: %s, %lld parameters (%.2f M), %d tensors; activations %.3f MB for "
          "micro-batches of %lld x %lld tokens",
          tsr_deck_word(cfg, &cfg->model.arch), (long long)t.lay->n_params, (double)t.lay->n_params / 1e6,
          t.lay->n_tensors, (double)tsr_model_activation_bytes(t.model) / 1e6,
          (long long)cfg->train.micro_batch, (long long)cfg->model.seq_len);
  tsr_log("data: %s: %d file(s), %lld tokens, %lld samples of %lld+1 tokens (tokenizer %s)%s",
          cfg->data.train, tsr_data_n_files(t.train_data),
          (long long)tsr_data_n_tokens(t.train_data), (long long)tsr_data_n_samples(t.train_data),
          (long long)cfg->model.seq_len, tsr_data_tokenizer(t.train_data),
          cfg->data.shuffle ? ", shuffled" : "");
  tsr_log("batch: global %lld sequences = %lld micro-batch(es) of %lld x dp %d; "
          "precision %s, recompute %s",
          (long long)cfg->train.global_batch, (long long)t.grad_accum_steps,
          (long long)cfg->train.micro_batch, t.dp, tsr_deck_word(cfg, &cfg->train.precision),
          tsr_deck_word(cfg, &cfg->train.recompute));
  tsr_grid_log(t.grid);
  if (t.sched)
    tsr_log("pipeline: schedule %s, %d micro-batches per step, %d chunk(s) per stage; stage "
            "%d keeps %d activation slot(s): %.2f MB (rank 0)",
            tsr_deck_word(cfg, &cfg->parallel.schedule),
            t.sched->m, t.sched->v, t.grid->pp_rank, tsr_model_n_slots(t.model),
            (double)tsr_model_activation_bytes(t.model) / 1e6);
  const tsr_zero_memory zm = tsr_zero_memory_of(t.zero);
  tsr_log("zero stage %lld: per rank params %.2f MB, grads %.2f MB, master %.2f MB, adam "
          "%.2f MB, unit buffers %.2f MB (shard of %lld of %lld elements)",
          (long long)cfg->parallel.zero_stage, zm.params / 1e6, zm.grads / 1e6, zm.master / 1e6,
          zm.adam / 1e6, zm.unit_bufs / 1e6,
          (long long)(tsr_zero_shard_end(t.zero) - tsr_zero_shard_begin(t.zero)),
          (long long)t.lay->n_flat);
  GO(agree(world, resume_or_init(&t)));
  if (cfg->checkpoint.save_initial && t.st.step == 0) GO(save(&t, deck_text));

  const double t_start = tsr_now();
  double t_last_ckpt = t_start, t_window = t_start;
  int64_t window_steps = 0;
  const int64_t first_step = t.st.step;
  while (t.st.step < cfg->run.max_steps) {
    /* Decisions every rank must take together, agreed at the step boundary: stop on a
     * signal (any rank's), and a time-based checkpoint (rank 0's clock decides). */
    int flags[2] = {g_stop_signal != 0,
                    t.rank == 0 && cfg->checkpoint.every_minutes > 0 && t.st.step > first_step &&
                        tsr_now() - t_last_ckpt >= 60.0 * cfg->checkpoint.every_minutes};
    GO_ALONE(tsr_comm_all_reduce_int(t.grid->world, flags, 2, TSR_COMM_MAX));
    const int stop = flags[0];
    if (flags[1] && !stop) {
      GO(save(&t, deck_text));
      t_last_ckpt = tsr_now();
    }
    if (stop) {
      tsr_log("signal %d received: writing a checkpoint at step %lld and stopping (exit 3)",
              (int)g_stop_signal, (long long)t.st.step);
      GO(save(&t, deck_text));
      rc = TSR_ERR_SIGNAL;
      goto done;
    }
    const double t0 = tsr_now();
    double loss, gnorm, lr;
    int skipped;
    reset_comm_counters(&t);
    tsr_watchdog_activity(t.st.step + 1, "a training step");
    /* fault injection for the tests: one rank stops responding at the given step */
    const char *hang = getenv("TSR_FAULT_HANG_STEP"), *hang_rank = getenv("TSR_FAULT_HANG_RANK");
    if (hang && atoll(hang) == t.st.step + 1 && t.rank == (hang_rank ? atoi(hang_rank) : 0))
      for (;;) sleep(1);
    const double step_scale = t.fp16 ? t.st.loss_scale : 0; /* the scale this step runs at */
    GO_ALONE(train_step(&t, &loss, &gnorm, &lr, &skipped));
    const double dt = tsr_now() - t0;
    const int64_t step = t.st.step;
    window_steps++;
    const double tok_per_s = (double)(cfg->train.global_batch * cfg->model.seq_len) / dt;
    const double mfu = t.peak_flops > 0
                           ? tok_per_s * t.flops_per_token / t.world_size / t.peak_flops : -1.0;
    tsr_step_metrics sm = {step, loss, lr, gnorm, t.st.tokens, tok_per_s, mfu,
                           (int64_t)tsr_ops_mem_bytes(), dt * 1e3, t.st.skipped,
                           t.phase_s[0] * 1e3, t.phase_s[1] * 1e3, t.phase_s[2] * 1e3,
                           step_scale};
    tsr_metrics_step(t.metrics, &sm);
    if (skipped && t.fp16) /* expected now and then: the scale searches for its level */
      tsr_log("step %lld: fp16 gradients overflowed at loss scale %g: update skipped, scale "
              "now %g (%lld skipped so far)",
              (long long)step, step_scale, t.st.loss_scale, (long long)t.st.skipped);
    else if (skipped)
      tsr_warn("step %lld: non-finite gradient norm; update skipped (%lld skipped so far)",
               (long long)step, (long long)t.st.skipped);
    if (step % cfg->run.log_every == 0 || step == first_step + 1 || step == cfg->run.max_steps) {
      const double now = tsr_now();
      const double avg = (now - t_window) / (double)window_steps;
      char eta[32];
      fmt_eta(eta, sizeof eta, avg * (double)(cfg->run.max_steps - step));
      char phases[96] = "", scale[48] = "";
      if (isfinite(t.phase_s[0]))
        snprintf(phases, sizeof phases, " (fwd %.1f bwd %.1f opt %.1f)", t.phase_s[0] * 1e3,
                 t.phase_s[1] * 1e3, t.phase_s[2] * 1e3);
      if (t.fp16) snprintf(scale, sizeof scale, " | scale %g", step_scale);
      tsr_log("step %6lld/%lld | loss %.4f | lr %.3e | grad norm %.4f%s | %8.0f tok/s | "
              "%7.1f ms%s | %.2f GFLOP/s/rank, MFU %.2f | mem %.1f MB | ETA %s",
              (long long)step, (long long)cfg->run.max_steps, loss, lr, gnorm, scale, tok_per_s,
              dt * 1e3, phases, tok_per_s * t.flops_per_token / 1e9 / t.world_size, mfu,
              (double)tsr_ops_mem_bytes() / 1e6, eta);
      t_window = now;
      window_steps = 0;
      if (t.sched) {
        char line[1024];
        size_t used = 0;
        for (int i = 0; i < t.grid->pp && used < sizeof line; i++)
          used += (size_t)snprintf(line + used, sizeof line - used, " %.3f", t.bubble[i]);
        tsr_log("pipeline bubble (measured idle / step time, stages 0..%d):%s | theory %s "
                "%.3f (p %d, m %d, v %d)", t.grid->pp - 1, line,
                tsr_deck_word(cfg, &cfg->parallel.schedule),
                tsr_pp_ideal_bubble(cfg->parallel.schedule, t.grid->pp, t.sched->m, t.sched->v),
                t.grid->pp, t.sched->m, t.sched->v);
      }
      if (step == first_step + 1 && t.world_size > 1) {
        char comm[1024];
        describe_comm(&t, comm, sizeof comm);
        tsr_log("comm per step (rank 0, ring-algorithm bytes): %s", comm);
      }
      if (step == first_step + 1) { /* measured memory next to tessera plan's (src/plan.c) */
        double mem[2] = {(double)tsr_ops_mem_bytes(), (double)tsr_ops_mem_peak_bytes()};
        MPI_Allreduce(MPI_IN_PLACE, mem, 2, MPI_DOUBLE, MPI_MAX, world);
        tsr_plan_log_memory(cfg, t.grid, mem[0], mem[1]);
      }
    }
    const int last = step == cfg->run.max_steps;
    if (t.valid_data && cfg->run.eval_every > 0 && (step % cfg->run.eval_every == 0 || last)) {
      double vl;
      tsr_watchdog_activity(step, "an evaluation");
      GO_ALONE(evaluate(&t, &vl, NULL));
      tsr_log("step %6lld | val loss %.4f", (long long)step, vl);
      tsr_metrics_eval(t.metrics, step, vl);
    }
    const int due_steps = cfg->checkpoint.every_steps > 0 && step % cfg->checkpoint.every_steps == 0;
    if (due_steps || last) {
      GO(save(&t, deck_text));
      t_last_ckpt = tsr_now();
    }
  }
  tsr_watchdog_activity(t.st.step, NULL);
  tsr_log("done: %lld steps in %.1f s this run, %lld skipped", (long long)(t.st.step - first_step),
          tsr_now() - t_start, (long long)t.st.skipped);
done:
#undef GO
#undef GO_ALONE
  trainer_destroy(&t);
  tsr_log_close();
  return rc;
}

int tsr_eval(const tsr_config *cfg, MPI_Comm world) {
  trainer t;
  int rc = trainer_setup(&t, cfg, world, 0);
  if (rc == 0 && !t.valid_data) {
    tsr_error("tessera eval needs &data valid (a path or glob of token shards)");
    rc = TSR_ERR_INPUT;
  }
  rc = agree(world, rc); /* from here on the ranks run collectives together */
  char path[TSR_STR_PATH];
  if (rc == 0) rc = tsr_ckpt_resolve(cfg, path, sizeof path, world);
  if (rc == 0 && !path[0]) {
    tsr_error("tessera eval: no checkpoint to evaluate (checkpoint.resume = '%s')",
              cfg->checkpoint.resume);
    rc = TSR_ERR_INPUT;
  }
  if (rc == 0) {
    const tsr_ckpt_view view = ckpt_view(&t);
    tsr_ops_sync(); /* the host writes the state */
    rc = tsr_ckpt_load_view(path, &cfg->checkpoint, &view, tsr_zero_master(t.zero),
                            tsr_zero_adam_m(t.zero), tsr_zero_adam_v(t.zero), &t.st, world);
  }
  if (rc == 0) rc = tsr_zero_publish_params(t.zero);
  double vl = 0;
  int64_t batches = 0;
  if (rc == 0 && (rc = evaluate(&t, &vl, &batches)) != 0) abort_job(world, rc, "evaluation");
  if (rc == 0) {
    tsr_log("eval %s: step %lld | val loss %.6f over %lld batch(es) of %lld", path,
            (long long)t.st.step, vl, (long long)batches, (long long)cfg->train.micro_batch);
    char mpath[TSR_STR_PATH + 32];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", cfg->run.out_dir);
    if (t.rank == 0 && make_dirs(cfg->run.out_dir) == 0 && tsr_metrics_open(&t.metrics, mpath) == 0)
      tsr_metrics_eval(t.metrics, t.st.step, vl);
  }
  trainer_destroy(&t);
  return rc;
}
