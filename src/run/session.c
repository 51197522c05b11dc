/* session.c — building, resuming, saving and evaluating the objects of a run (session.h). */
#include "session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_compat.h"
#include "comm/comm_mpi.h"
#include "deck/deck.h"
#include "ops/gemm_probe.h"
#include "ops/ops.h"
#include "plan/plan.h"
#include "precision.h"
#include "core/fault.h"
#include "core/runctl.h"
#include "data/tokenizer.h"
#include "run_tokenizer.h"
#include "core/util.h"
#include "data/data.h"
#include "comm/grid.h"
#include "core/metrics.h"
#include "model/model.h"
#include "ops/ops_backend.h"
#include "sched/pipeline.h"
#include "parallel/pp_exec.h"
#include "parallel/zero.h"

int tsr_session_open_device(const tsr_config *cfg, MPI_Comm comm, const tsr_ops_backend **dev) {
  *dev = NULL;
  if (cfg->run.device == TSR_DEVICE_CPU) return 0;
  if (!tsr_ops_cuda_open) {
    TSR_CHECK(cfg->run.device != TSR_DEVICE_CUDA, TSR_ERR_INPUT,
              "run.device = 'cuda' but this tessera was built without CUDA (configure found no "
              "CUDA toolkit, or --without-cuda): rebuild with ./configure --with-cuda, or set "
              "run.device = 'cpu'");
    return 0;
  }
  TSR_CALL(tsr_ops_cuda_open(&comm, tsr_deck_word(cfg, &cfg->run.device), cfg->run.gpu_share,
                             dev));
  if (*dev) tsr_ops_set_backend(*dev);
  return 0;
}

/* Collective: the page-locked memory the optimizer and activation offloads will pin on
 * each node (the planner's host column of each rank's pipeline stage,
 * tsr_plan_stage_memory: what zero.c and model.c allocate) against what the node has
 * available (tsr_host_available; the test hook TSR_FAULT offload_host_mb replaces it), before anything is allocated: a node that
 * cannot hold it is bad input, named with the keys and bytes. */
static int check_offload_host(const tsr_session *s, const tsr_config *cfg) {
  const tsr_plan_grid g = tsr_plan_grid_of(cfg, s->grid);
  tsr_plan_memory m;
  double mine = 0;
  if (!tsr_plan_stage_memory(cfg, &g, s->grid->pp_rank, TSR_PLAN_GPU, &m)) mine = m.host;
  double node = mine, ranks = 1, per_node[2];
  MPI_Comm nc;
  if (MPI_Comm_split_type(s->world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &nc) ==
      MPI_SUCCESS) {
    double x[2] = {mine, 1};
    MPI_Allreduce(x, per_node, 2, MPI_DOUBLE, MPI_SUM, nc);
    node = per_node[0], ranks = per_node[1];
    MPI_Comm_free(&nc);
  }
  const long long hook = tsr_fault_int("offload_host_mb", -1);
  const double avail = hook >= 0 ? (double)hook * 1e6 : tsr_host_available();
  /* the node that lacks the most, its figures */
  double worst[4] = {node - avail, node, avail, ranks};
  struct {
    double v;
    int rank;
  } in = {node - avail, s->rank}, out;
  MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, s->world);
  MPI_Bcast(worst, 4, MPI_DOUBLE, out.rank, s->world);
  if (worst[0] <= 0) {
    if (s->rank == 0)
      tsr_log("offload: %.1f MB of page-locked host memory on the fullest node (%.0f ranks), "
              "%.0f MB available there", worst[1] / 1e6, worst[3], worst[2] / 1e6);
    return 0;
  }
  const int opt = cfg->parallel.offload == TSR_OFFLOAD_OPTIMIZER &&
                  cfg->parallel.offload_fraction > 0;
  if (s->rank == 0 && opt && !cfg->train.activation_offload)
    tsr_error("parallel.offload = 'optimizer': the %.0f ranks of a node would pin %.0f bytes "
              "(%.2f GB) of host memory for the optimizer's shard (its fp32 master weights, "
              "Adam m and v, the gradient's host copy and the compute copy's staging: "
              "parallel.offload_fraction = %g of it), more than the %.0f bytes (%.2f GB) "
              "available there: spread the model over more GPUs (a larger ZeRO group, "
              "parallel.zero_stage >= 1), or set parallel.offload = 'none' (tessera plan "
              "shows the host column against hardware.host_memory_gb)", worst[3], worst[1],
              worst[1] / 1e9, cfg->parallel.offload_fraction, worst[2], worst[2] / 1e9);
  else if (s->rank == 0)
    tsr_error("%s: the %.0f ranks of a node would pin %.0f bytes (%.2f GB) of host memory for "
              "%s, more than the %.0f bytes (%.2f GB) available there: set %s, or spread "
              "the model over more GPUs (tessera plan shows the host column against "
              "hardware.host_memory_gb)",
              opt ? "parallel.offload = 'optimizer' and train.activation_offload = .true."
                  : "train.activation_offload = .true.",
              worst[3], worst[1], worst[1] / 1e9,
              opt ? "the optimizer's shard and every layer's stored activations"
                  : "every layer's stored activations",
              worst[2], worst[2] / 1e9,
              opt ? "parallel.offload = 'none' or train.activation_offload = .false."
                  : "train.activation_offload = .false. (or train.recompute = 'full')");
  return TSR_ERR_INPUT;
}

/* parallel.offload and train.activation_offload: a CPU run has nothing to move to the
 * host (one line says so, so the same deck runs everywhere); a GPU run offloads
 * parallel.offload_fraction of the optimizer shard (zero.c) and the stored activations
 * (model.c).  Every rank decides the same from the same configuration. */
static int check_offload(const tsr_session *s, const tsr_config *cfg) {
  const int opt = cfg->parallel.offload == TSR_OFFLOAD_OPTIMIZER;
  const int act = cfg->train.activation_offload;
  if (!s->dev) {
    if ((opt || act) && s->rank == 0)
      tsr_log("offload: this run is on the CPU, whose memory already holds everything: %s%s%s "
              "has nothing to move", opt ? "parallel.offload = 'optimizer'" : "",
              opt && act ? " and " : "", act ? "train.activation_offload = .true." : "");
    return 0;
  }
  if (act && s->rank == 0)
    tsr_log("offload: every layer's stored activations go to page-locked host memory after "
            "its forward and come back ahead of its backward, on a copy stream; the GPU keeps "
            "a window of %d layers' sets (train.activation_offload)", TSR_MODEL_OFFLOAD_WINDOW);
  if (opt && cfg->parallel.offload_fraction > 0 && s->rank == 0) {
    char part[96] = "the optimizer's shard";
    if (cfg->parallel.offload_fraction < 1)
      snprintf(part, sizeof part, "the last %g of the optimizer's shard (rounded up to 64 "
               "elements)", cfg->parallel.offload_fraction);
    tsr_log("offload: %s (fp32 master weights, Adam m and v) lives in page-locked host memory "
            "and is updated by the CPU's AdamW after the gradient norm, in pieces whose copies "
            "to and from the GPU overlap it; each unit's part when the next forward first needs "
            "the unit", part);
  }
  return (opt && cfg->parallel.offload_fraction > 0) || act ? check_offload_host(s, cfg) : 0;
}

/* The layout part, the pipeline schedule, the model (with as many activation slots as the
 * schedule keeps in flight), the backend's scratch for its shapes, ZeRO. */
static int open_model(tsr_session *s, const tsr_config *cfg) {
  const tsr_grid *g = s->grid;
  TSR_CALL(tsr_layout_create_split(&s->lay, &cfg->model, g->tp, g->tp_rank, g->pp, g->pp_rank,
                                   (int)cfg->parallel.virtual_stages,
                                   cfg->parallel.stage_layers, cfg->parallel.schedule));
  tsr_zero_pad_layout(s->lay, &cfg->parallel, g);
  tsr_model_options mo = {0, 0, g->tp_comm, 1, g->cp_comm};
  tsr_zero_model_options(&cfg->parallel, &mo.own_params, &mo.own_grads);
  if (g->pp > 1) {
    const int64_t m = cfg->train.global_batch / (cfg->train.micro_batch * g->dp);
    TSR_CALL(tsr_pp_schedule_for(&s->sched, &cfg->parallel, (int)m, g));
    char split[1024]; /* which layers every stage holds */
    if (!tsr_pp_split_text(&cfg->model, cfg->parallel.schedule, g->pp,
                           (int)cfg->parallel.virtual_stages,
                           cfg->parallel.stage_layers, split, sizeof split))
      tsr_log("pipeline: %s", split);
    mo.n_slots = tsr_pp_slots_needed(s->sched);
    TSR_CHECK(mo.n_slots > 0, TSR_ERR, "pipeline: bad schedule");
    s->bubble = tsr_calloc((size_t)g->pp, sizeof(double));
    TSR_CHECK(s->bubble, TSR_ERR, "out of memory");
  }
  tsr_model_spec spec;
  tsr_model_spec_of(&spec, cfg);
  TSR_CALL(tsr_model_create_opt(&s->model, &spec, s->lay, &mo));
  if (cfg->data.document_mask) tsr_model_set_eos(s->model, s->eos);
  tsr_ops_shapes shapes;
  tsr_model_ops_shapes(s->model, &shapes);
  shapes.sumsq_elems = (long)s->lay->n_flat;
  shapes.deterministic = cfg->train.deterministic;
  TSR_CALL(tsr_ops_reserve(&shapes));
  TSR_CALL(tsr_zero_create(&s->zero, &cfg->parallel, s->lay, s->model, g));
  if (s->sched) TSR_CALL(tsr_pp_exec_create(&s->exec, g, s->model, s->zero, s->sched));
  /* The first stage's embed.weight and the last stage's copy; or, on a V placement, one
   * embed.weight that the first and the last chunk of stage 0 both use at different
   * times: its gradient is reduced once, after the step's last W. */
  const int tied_v = cfg->model.tie_embeddings && g->pp > 1 && s->lay->embeds && s->lay->heads;
  if (g->embed_tied || tied_v) {
    const tsr_tensor *e = tsr_layout_find(s->lay, "embed.weight");
    TSR_CHECK(e, TSR_ERR, "pipeline: no embed.weight on stage %d", g->pp_rank);
    TSR_CALL(tsr_zero_set_tied(s->zero, g->embed_tied, e->offset, e->offset + e->numel));
  }
  return 0;
}

/* MFU's denominator: the slowest rank's GEMM rate, so MFU <= 1 for all.  A GPU's peak is
 * its tensor cores' for 16-bit storage; a CPU computes in fp32 FMA whatever the storage,
 * so its peak is the fp32 GEMM's. */
static void measure_peak(tsr_session *s) {
  const tsr_dtype dt = s->dev ? tsr_model_dtype(s->model) : TSR_F32;
  s->peak_flops = tsr_gemm_probe_rate(dt);
  MPI_Allreduce(MPI_IN_PLACE, &s->peak_flops, 1, MPI_DOUBLE, MPI_MIN, s->world);
  tsr_log("mfu: measured against this %s's GEMM rate (%s storage, fp32 accumulation), "
          "%.2f GFLOP/s per rank", s->dev ? "GPU" : "CPU", tsr_dtype_name(dt),
          s->peak_flops / 1e9);
}

double tsr_session_mfu(tsr_session *s, double tok_per_s) {
  if (s->peak_flops <= 0) return -1;
  const double rate = tok_per_s * s->flops_per_token / s->world_size;
  if (rate > s->peak_flops) {
    if (!s->peak_raised++)
      tsr_log("mfu: step %lld ran at %.2f GFLOP/s per rank, above the %.2f GFLOP/s the GEMM "
              "probe measured at start-up (taken while the cores were busy?): that figure is "
              "suspect; the fastest step's rate, a lower bound of the peak, is the denominator "
              "from here on", (long long)s->st.step, rate / 1e9, s->peak_flops / 1e9);
    s->peak_flops = rate;
  }
  return rate / s->peak_flops;
}

/* Train and valid shards made with different tokenizers would train happily and evaluate
 * nonsense: refuse them.  The data's tokenizer goes into every checkpoint. */
static int same_tokenizer(tsr_session *s) {
  const tsr_data_config *dc = &s->cfg->data;
  const char *train = s->train_data ? tsr_data_tokenizer(s->train_data) : NULL;
  const char *valid = s->n_valid ? tsr_data_tokenizer(s->valid_data[0]) : NULL;
  for (int i = 0; i < s->n_valid; i++) {
    const char *v = tsr_data_tokenizer(s->valid_data[i]);
    const char *other = train ? train : valid;
    TSR_CHECK(!strcmp(other, v), TSR_ERR_INPUT,
              "data: the %s shards (%s) were made with tokenizer '%s' but the valid shards "
              "(%s) with '%s': prepare both with the same tokenizer (tools/tsr-prepare)",
              train ? "train" : "valid", train ? dc->train_glob[0] : dc->valid_glob[0], other,
              dc->valid_glob[i], v);
  }
  snprintf(s->st.tokenizer, sizeof s->st.tokenizer, "%s", train ? train : valid ? valid : "");
  return 0;
}

/* data.document_mask when training: the end-of-document id, the deck's or the training
 * shards' tokenizer's. */
static int document_eos(tsr_session *s, const tsr_config *cfg) {
  if (cfg->data.eos_id >= 0)
    s->eos = (int32_t)cfg->data.eos_id;
  else
    TSR_CALL(tsr_tokenizer_eos(cfg->data.train_glob[0], cfg->model.vocab_size, &s->eos));
  tsr_log("document masking: documents end with token %d (%s, tokenizer '%s'); attention and "
          "positions restart at each document", (int)s->eos,
          cfg->data.eos_id >= 0 ? "data.eos_id" : "the tokenizer's", s->st.tokenizer);
  return 0;
}

/* Pre-flight of the data, first of all (seconds, not after the model, the backend and the
 * GEMM probe are built): every rank opens and checks its view of the shards (each file
 * there, a regular file, its header, every token, one sample at least), and rank 0 prints
 * one error for all, naming the file and, when only some ranks failed, the first of them
 * and its host. */
/* One glob of &data train (valid: of &data valid), dataset i of n: a glob that matches
 * nothing is reported where the deck gave it. */
static int open_set(tsr_data **d, const tsr_config *cfg, int valid, int i, int n,
                    int shuffle, uint64_t seed) {
  const tsr_data_config *dc = &cfg->data;
  const char *glob = valid ? dc->valid_glob[i] : dc->train_glob[i];
  const char *at = valid ? dc->valid_at[i] : dc->train_at[i];
  const char *name = valid ? dc->valid_names[i] : dc->names[i];
  char which[TSR_SET_NAME + 64] = "";
  if (n > 1) snprintf(which, sizeof which, " value %d (dataset '%s')", i + 1, name);
  struct stat st;
  if (glob[0] && !strpbrk(glob, "*?[")) { /* one file named as it is: there, and a file */
    const int gone = stat(glob, &st) != 0;
    if (gone || S_ISDIR(st.st_mode)) {
      tsr_error("%s%sdata.%s%s: %s '%s'%s%s; give token shard files or a glob such as "
                "'DIR/train_*.bin' (make them with tools/tsr-prepare)", at, at[0] ? ": " : "",
                valid ? "valid" : "train", which, gone ? "cannot find" : "a directory, not a file:",
                glob, gone ? ": " : "", gone ? strerror(errno) : "");
      return TSR_ERR_INPUT;
    }
  }
  if (tsr_data_n_matches(glob) == 0) {
    tsr_error("%s%sdata.%s%s: no files match the data glob '%s'; check the path, or create "
              "shards with tools/tsr-prepare", at, at[0] ? ": " : "", valid ? "valid" : "train",
              which, glob);
    return TSR_ERR_INPUT;
  }
  return tsr_data_open(d, glob, cfg->model.seq_len, cfg->model.vocab_size, shuffle, seed);
}

/* &data train: one dataset as it always was, or a mixture of several, each shuffled on
 * its own seed. */
static int open_train(tsr_session *s, const tsr_config *cfg, uint64_t seed) {
  const tsr_data_config *dc = &cfg->data;
  const int n = dc->n_train;
  if (n == 1) return open_set(&s->train_data, cfg, 0, 0, 1, dc->shuffle, seed);
  tsr_data *sets[TSR_MAX_DATASETS] = {0};
  const char *names[TSR_MAX_DATASETS];
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    names[i] = dc->names[i];
    rc = open_set(&sets[i], cfg, 0, i, n, dc->shuffle, tsr_data_set_seed(seed, dc->names[i]));
  }
  if (rc) {
    for (int i = 0; i < n; i++) tsr_data_destroy(&sets[i]);
    return rc;
  }
  return tsr_data_mix(&s->train_data, sets, dc->weights, names, n);
}

static int open_data(tsr_session *s, const tsr_config *cfg, int training) {
  const uint64_t seed = (uint64_t)cfg->run.seed;
  const tsr_data_config *dc = &cfg->data;
  char why[1024];
  int rc = 0;
  tsr_error_hold(why, sizeof why);
  if (training && dc->n_train == 1 && !dc->train_glob[0][0]) {
    if (dc->train_at[0][0]) /* set, to '': where (the deck's place, or the override's) */
      tsr_error("%s: data.train is empty: set it to a path or glob of token shards (make them "
                "with tools/tsr-prepare)", dc->train_at[0]);
    else
      tsr_error("data.train is not set: give &data train = a path or glob of token shards, in "
                "the deck or as data.train=... (make them with tools/tsr-prepare)");
    rc = TSR_ERR_INPUT;
  }
  if (!rc && training) rc = open_train(s, cfg, seed);
  const int n_valid = dc->n_valid == 1 && !dc->valid_glob[0][0] ? 0 : dc->n_valid;
  double sum = 0;
  for (int i = 0; i < n_valid && !rc; i++) {
    rc = open_set(&s->valid_data[i], cfg, 1, i, n_valid, 0, seed);
    if (!rc) s->n_valid = i + 1;
    sum += dc->valid_weights[i];
  }
  for (int i = 0; i < s->n_valid; i++) s->valid_weight[i] = dc->valid_weights[i] / sum;
  if (!rc) rc = same_tokenizer(s);
  /* evaluation: from the checkpoint's tokenizer once it is known (tsr_session_eval_eos) */
  if (!rc && cfg->data.document_mask && training) rc = document_eos(s, cfg);
  tsr_error_release();
  return tsr_run_agree_report(s->world, rc, why);
}

/* Rank 0, training: the files of the data's tokenizer, for the checkpoints to carry
 * (docs/formats.md "Checkpoint datasets").  Shards whose tokenizer file is missing still
 * train: their checkpoints then name the tokenizer only, which the log says. */
static void carry_tokenizer(tsr_session *s, const tsr_config *cfg) {
  char why[1024], name[232];
  tsr_error_hold(why, sizeof why);
  const int rc = tsr_tokenizer_shard_files(cfg->data.train_glob[0], cfg->model.vocab_size, name,
                                           sizeof name, &s->tok_files, &s->n_tok_files);
  tsr_error_release();
  if (rc) {
    tsr_warn("the checkpoints of this run will name their tokenizer '%s' but not carry it: %s",
             s->st.tokenizer, why);
    return;
  }
  s->st.tokenizer_files = s->tok_files;
  s->st.n_tokenizer_files = s->n_tok_files;
}

int tsr_session_open(tsr_session *s, const tsr_config *cfg, MPI_Comm world, int training) {
  memset(s, 0, sizeof *s);
  s->eos = -1;
  s->cfg = cfg;
  s->world = world;
  MPI_Comm_rank(world, &s->rank);
  MPI_Comm_size(world, &s->world_size);
  TSR_CALL(open_data(s, cfg, training));
  if (training && s->rank == 0) carry_tokenizer(s, cfg);
  tsr_comm *w;
  TSR_CALL(tsr_comm_create(&w, world, "world"));
  tsr_grid_spec gs;
  tsr_grid_spec_of(&gs, cfg);
  const int rc = tsr_grid_create(&s->grid, &gs, w);
  tsr_comm_destroy(&w);
  if (rc) return rc;
  TSR_CALL(tsr_session_open_device(cfg, world, &s->dev));
  TSR_CALL(check_offload(s, cfg));
  s->dp = s->grid->dp;
  s->dpcp = s->grid->dpcp;
  s->dp_rank = s->grid->dp_rank;
  s->grad_accum_steps = cfg->train.global_batch / (cfg->train.micro_batch * s->dp);
  /* every rank's outcome agreed before the next collective: a stage may run out of device
   * memory alone (the embedding's, the head's); out of memory is bad input (exit 2) */
  int mrc = open_model(s, cfg);
  if (mrc && s->dev && tsr_ops_status() == TSR_ERR_INPUT) mrc = TSR_ERR_INPUT;
  TSR_CALL(tsr_run_agree(world, mrc));
  if (s->dev) {
    tsr_comm *zg[2];
    const int n = tsr_zero_device_groups(&cfg->parallel, s->grid, zg);
    TSR_CALL(tsr_grid_attach_device(s->grid, &cfg->parallel, zg, n));
  }
  const size_t ntok = (size_t)(cfg->train.micro_batch * cfg->model.seq_len);
  s->inputs = tsr_calloc(ntok, sizeof(int32_t));
  s->targets = tsr_calloc(ntok, sizeof(int32_t));
  s->loss_acc = tsr_ops_alloc(1, sizeof(double));
  int brc = 0;
  if (!s->inputs || !s->targets || !s->loss_acc) {
    tsr_error("out of memory for the batch");
    brc = s->dev && tsr_ops_status() == TSR_ERR_INPUT ? TSR_ERR_INPUT : TSR_ERR;
  }
  TSR_CALL(tsr_run_agree(world, brc)); /* measure_peak's collective next */
  s->flops_per_token = tsr_plan_run_flops_per_token(cfg); /* the planner's count */
  if (training) measure_peak(s);
  s->st.seed = (uint64_t)cfg->run.seed;
  tsr_loss_scale_start(&cfg->train, &s->st);
  return 0;
}

void tsr_session_close(tsr_session *s) {
  tsr_session_ckpt_close(s); /* a write in flight ends first, and is reported */
  tsr_tokenizer_files_free(&s->tok_files, s->n_tok_files);
  tsr_metrics_close(&s->metrics);
  tsr_data_destroy(&s->train_data);
  for (int i = 0; i < s->n_valid; i++) tsr_data_destroy(&s->valid_data[i]);
  s->n_valid = 0;
  tsr_pp_exec_destroy(&s->exec);
  tsr_pp_schedule_destroy(&s->sched);
  tsr_free(&s->bubble);
  tsr_zero_destroy(&s->zero);
  tsr_model_destroy(&s->model);
  tsr_free(&s->inputs);
  tsr_free(&s->targets);
  tsr_ops_free(&s->loss_acc);
  tsr_layout_destroy(&s->lay);
  tsr_grid_destroy(&s->grid); /* and the device transports its groups used */
  if (s->dev) { /* every buffer of the device is freed by now */
    tsr_ops_set_backend(NULL);
    s->dev->close();
    s->dev = NULL;
  }
}

/* The file into the parameters and, unless weights_only, into Adam's m and v and the train
 * state; weights_only zeroes m and v and leaves the state, the file's in *file_st. */
static int session_load(tsr_session *s, const char *path, int weights_only,
                        tsr_train_state *file_st) {
  TSR_CALL(tsr_ckpt_compat_check(s->cfg, path, s->train_data != NULL && !weights_only,
                                  s->st.tokenizer, s->world));
  const tsr_ckpt_view view = tsr_session_ckpt_view(s);
  char data_tokenizer[sizeof s->st.tokenizer];
  memcpy(data_tokenizer, s->st.tokenizer, sizeof data_tokenizer);
  float *hb[3];
  TSR_CALL(tsr_session_state_host(s, hb));
  const int rc = tsr_ckpt_load_view(path, &s->cfg->checkpoint, &view, hb[0],
                                    weights_only ? NULL : hb[1], weights_only ? NULL : hb[2],
                                    file_st, s->world);
  tsr_session_state_release(s, hb, rc == 0);
  TSR_CALL(rc);
  if (weights_only) { /* a fresh optimizer */
    const tsr_zero_state st = tsr_zero_state_of(s->zero);
    tsr_zero_state_write(&st, 1, NULL);
    tsr_zero_state_write(&st, 2, NULL);
  } else {
    /* the check above refused another tokenizer; a checkpoint from before checkpoints
     * named theirs takes the data's */
    if (!file_st->tokenizer[0]) memcpy(file_st->tokenizer, data_tokenizer, sizeof data_tokenizer);
  }
  return tsr_zero_publish_params(s->zero);
}

int tsr_session_load(tsr_session *s, const char *path) {
  return session_load(s, path, 0, &s->st);
}

int tsr_session_load_weights(tsr_session *s, const char *path, int64_t *step) {
  tsr_train_state st = s->st;
  TSR_CALL(session_load(s, path, 1, &st));
  if (step) *step = st.step;
  return 0;
}

/* checkpoint.init_from: a new run from a checkpoint's weights (resume found nothing). */
static int init_from(tsr_session *s) {
  const char *path = s->cfg->checkpoint.init_from;
  int rc = 0;
  if (s->rank == 0) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
      tsr_error("checkpoint.init_from = '%s': %s; give a checkpoint file (one of a run's "
                "step_NNNNNNNN.h5, or the .h5 tools/tsr-import wrote)", path,
                stat(path, &sb) != 0 ? strerror(errno) : "not a regular file");
      rc = TSR_ERR_INPUT;
    }
  }
  TSR_CALL(tsr_run_agree(s->world, rc));
  int64_t step = 0;
  TSR_CALL(tsr_session_load_weights(s, path, &step));
  tsr_log("initialised from the weights of %s (checkpoint.init_from; written at its step %lld): "
          "step 0, a fresh optimizer, this deck's schedule and data", path, (long long)step);
  char detail[TSR_STR_PATH + 64];
  snprintf(detail, sizeof detail, "initialised from %s", path);
  tsr_metrics_event(s->metrics, 0, "start", detail);
  return 0;
}

static int resume_state(tsr_session *s);

int tsr_session_resume(tsr_session *s) {
  TSR_CALL(tsr_run_agree(s->world, resume_state(s)));
  /* a run that will write checkpoints finds out now, not at the first one, whether it can
   * (the deck's few kB are left out of the size) */
  if (s->st.step >= s->cfg->run.max_steps) return 0;
  TSR_CALL(tsr_ckpt_preflight(s->cfg, 0, s->world));
  return tsr_session_ckpt_open(s); /* resume read every file it needed: writes may start */
}

/* The mixture's blend goes on from the checkpoint's state: the same sample sequence when
 * the deck's mixture is the checkpoint's, else (said in the log) a new blend from its
 * cursor, each dataset where the checkpoint left it. */
static int resume_mixture(tsr_session *s, const char *path) {
  const int64_t cursor = s->st.data_cursor;
  if (!s->train_data) return 0;
  if (tsr_data_n_sets(s->train_data) == 0) {
    if (s->st.data_mix[0])
      tsr_warn("checkpoint %s was written by a run on a mixture of datasets; this deck has "
               "one dataset (%s), which goes on at its sample %lld (the samples consumed)",
               path, s->cfg->data.train_glob[0], (long long)cursor);
    return 0;
  }
  char why[2048];
  const int rc = tsr_data_mix_resume(s->train_data, cursor, s->st.data_mix, why, sizeof why);
  if (rc < 0) return rc;
  if (rc == 1)
    tsr_warn("data: the deck's mixture is not the one checkpoint %s was written with (%s): a "
             "new blend of the weights starts at sample %lld", path, why, (long long)cursor);
  return 0;
}

static int resume_state(tsr_session *s) {
  const tsr_config *cfg = s->cfg;
  char path[TSR_STR_PATH];
  TSR_CALL(tsr_ckpt_resolve(cfg, path, sizeof path, s->world));
  if (!path[0] && cfg->checkpoint.init_from[0]) return init_from(s);
  if (!path[0]) {
    /* the whole of this rank's part from the seed, then its shard kept */
    float *init = tsr_calloc((size_t)s->lay->n_flat, sizeof(float));
    TSR_CHECK(init, TSR_ERR, "out of memory for %lld parameters", (long long)s->lay->n_flat);
    tsr_layout_init(s->lay, init, (uint64_t)cfg->run.seed);
    const int rc = tsr_zero_scatter_state(s->zero, init, NULL, NULL);
    tsr_free(&init);
    TSR_CALL(rc);
    tsr_metrics_event(s->metrics, 0, "start", "initialised from seed");
    return 0;
  }
  TSR_CALL(tsr_session_load(s, path));
  TSR_CHECK(s->st.seed == (uint64_t)cfg->run.seed, TSR_ERR_INPUT,
            "checkpoint %s was written with run.seed = %llu but the deck has seed = %lld; the "
            "data order would change: use the same seed or checkpoint.resume = 'none'",
            path, (unsigned long long)s->st.seed, (long long)cfg->run.seed);
  tsr_loss_scale_resumed(&cfg->train, &s->st);
  TSR_CALL(resume_mixture(s, path));
  if (s->st.step >= cfg->run.max_steps) { /* nothing to do: nothing written */
    tsr_log("checkpoint %s is at step %lld: run.max_steps = %lld is reached, nothing to train",
            path, (long long)s->st.step, (long long)cfg->run.max_steps);
    return 0;
  }
  tsr_log("resumed from %s at step %lld (%lld samples consumed)%s", path, (long long)s->st.step,
          (long long)s->st.data_cursor,
          cfg->checkpoint.init_from[0] ? "; checkpoint.init_from is not used: this run resumes "
                                         "its own checkpoint" : "");
  tsr_metrics_event(s->metrics, s->st.step, "resume", path);
  return 0;
}

int tsr_session_eval_eos(tsr_session *s, const char *ckpt_path, const char *tokenizer) {
  const tsr_config *cfg = s->cfg;
  if (!cfg->data.document_mask) return 0;
  int32_t eos = cfg->data.eos_id >= 0 ? (int32_t)cfg->data.eos_id : -1;
  const char *from = "data.eos_id";
  char name[232] = "";
  int rc = 0;
  if (s->rank == 0 && eos < 0) {
    tsr_tokenizer *t = NULL;
    rc = tsr_run_tokenizer_open(&t, tokenizer, ckpt_path, cfg->data.valid_glob[0],
                                cfg->model.vocab_size, &from);
    if (rc == 0 && (eos = tsr_tokenizer_eod(t)) < 0) {
      tsr_error("data.document_mask: the tokenizer '%s' (%s) has no end-of-document token; "
                "set data.eos_id to the id that ends the documents", tsr_tokenizer_name(t), from);
      rc = TSR_ERR_INPUT;
    }
    if (t) snprintf(name, sizeof name, "%s", tsr_tokenizer_name(t));
    tsr_tokenizer_close(&t);
  }
  TSR_CALL(tsr_run_agree(s->world, rc));
  MPI_Bcast(&eos, 1, MPI_INT32_T, 0, s->world);
  s->eos = eos;
  tsr_model_set_eos(s->model, eos);
  if (name[0])
    tsr_log("document masking: documents end with token %d (the end of document of tokenizer "
            "'%s', from %s)", (int)eos, name, from);
  else
    tsr_log("document masking: documents end with token %d (data.eos_id)", (int)eos);
  return 0;
}

/* The mean loss of one validation set's first batches. */
static int evaluate_set(tsr_session *s, const tsr_data *d, double *val_loss, int64_t *batches) {
  const int64_t mb = s->cfg->train.micro_batch;
  int64_t n_batches = s->cfg->run.eval_steps;
  const int64_t avail = tsr_data_n_samples(d) / mb;
  if (avail < n_batches) n_batches = avail > 0 ? avail : 1; /* small valid sets wrap */
  double sum = 0;
  for (int64_t b = 0; b < n_batches; b++) {
    double loss;
    tsr_data_batch(d, b * mb, mb, s->inputs, s->targets);
    if (s->exec)
      TSR_CALL(tsr_pp_exec_eval(s->exec, s->inputs, s->targets, &loss));
    else
      TSR_CALL(tsr_model_forward(s->model, s->inputs, s->targets, &loss));
    sum += loss;
  }
  TSR_CALL(tsr_ops_status());
  if (s->grid->cp > 1) { /* each cp rank's loss is the mean over its part of the tokens */
    TSR_CALL(tsr_comm_sum_ordered(s->grid->cp_comm, sum, &sum));
    sum /= s->grid->cp;
  }
  *val_loss = sum / (double)n_batches;
  if (batches) *batches = n_batches;
  return 0;
}

int tsr_session_evaluate(tsr_session *s, double *val_loss, double *set_loss, int64_t *batches) {
  double total = 0;
  for (int i = 0; i < s->n_valid; i++) {
    double loss;
    TSR_CALL(evaluate_set(s, s->valid_data[i], &loss, batches ? &batches[i] : NULL));
    if (set_loss) set_loss[i] = loss;
    /* one set: its loss as it always was */
    total = s->n_valid == 1 ? loss : total + s->valid_weight[i] * loss;
  }
  *val_loss = total;
  return 0;
}

void tsr_session_val_text(const tsr_session *s, double val_loss, const double *set_loss,
                          char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "val loss %.4f", val_loss);
  for (int i = 0; s->n_valid > 1 && i < s->n_valid && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s %.4f%s", i ? ", " : " (",
                          s->cfg->data.valid_names[i], set_loss[i],
                          i == s->n_valid - 1 ? ")" : "");
}

void tsr_session_log_data(const tsr_session *s) {
  const int n_sets = tsr_data_n_sets(s->train_data);
  if (n_sets == 0)
    tsr_log("data: %s: %d file(s), %lld tokens, %lld samples of %lld+1 tokens (tokenizer %s)%s",
            s->cfg->data.train_glob[0], tsr_data_n_files(s->train_data),
            (long long)tsr_data_n_tokens(s->train_data),
            (long long)tsr_data_n_samples(s->train_data), (long long)s->cfg->model.seq_len,
            tsr_data_tokenizer(s->train_data), s->cfg->data.shuffle ? ", shuffled" : "");
  else
    tsr_log("data: a mixture of %d datasets, samples of %lld+1 tokens (tokenizer %s)%s; the run "
            "takes %lld samples", n_sets, (long long)s->cfg->model.seq_len,
            tsr_data_tokenizer(s->train_data),
            s->cfg->data.shuffle ? ", each shuffled on its own seed" : "",
            (long long)(s->cfg->run.max_steps * s->cfg->train.global_batch));
  for (int i = 0; i < n_sets; i++) { /* the blend keeps each within a sample of its share */
    const tsr_data *set = tsr_data_set(s->train_data, i);
    const double w = tsr_data_set_weight(s->train_data, i);
    const double take = w * (double)(s->cfg->run.max_steps * s->cfg->train.global_batch);
    tsr_log("data: %-12s %s: %d file(s), %lld tokens, %lld samples; weight %.4f: %.0f "
            "samples, %.3f epochs", tsr_data_set_name(s->train_data, i),
            s->cfg->data.train_glob[i], tsr_data_n_files(set), (long long)tsr_data_n_tokens(set),
            (long long)tsr_data_n_samples(set), w, take,
            take / (double)tsr_data_n_samples(set));
  }
  for (int i = 0; i < s->n_valid && s->n_valid > 1; i++)
    tsr_log("data: validation set %s: %s, %lld samples, weight %.4f in the total val loss",
            s->cfg->data.valid_names[i], s->cfg->data.valid_glob[i],
            (long long)tsr_data_n_samples(s->valid_data[i]), s->valid_weight[i]);
}

int tsr_session_set_samples(const tsr_session *s, const char **names, int64_t *samples) {
  const int n = tsr_data_n_sets(s->train_data);
  if (n) tsr_data_mix_counts(s->train_data, s->st.data_cursor, samples);
  for (int i = 0; i < n; i++) names[i] = tsr_data_set_name(s->train_data, i);
  return n;
}
