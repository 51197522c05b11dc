/* test_zero.c — ZeRO stages 0-3 with global and hybrid sharding (MPI; run with 2, 3 or 4
 * ranks; hybrid cases use ranks_per_node = 2 and need 4).  For every (stage, scope):
 *
 *  1. memory as allocated, per rank, against the ZeRO formulas (fp32 CPU storage, so the
 *     compute copy and the gradient are 4 bytes per element like the master weights);
 *     Psi = flat length (padded), S = shard group size, U = largest unit:
 *       stage 0: params 4Psi  grads 4Psi          master 4Psi    adam 8Psi
 *       stage 1: params 4Psi  grads 4Psi + 4Psi/S  master 4Psi/S  adam 8Psi/S
 *       stage 2: params 4Psi  grads 4Psi/S         master 4Psi/S  adam 8Psi/S  + 4Psi/S + 3*4U
 *       stage 3: params 4Psi/S grads 4Psi/S        master 4Psi/S  adam 8Psi/S  + 4Psi/S + 7*4U
 *     and the bytes tsr_calloc handed out while creating the zero object match them;
 *  2. the reduced gradient (gathered from the shards) equals the gradient of the whole
 *     global batch computed on one rank without any communication (relative 1e-5: only
 *     the summation order differs);
 *  3. bytes moved per group in one step (k = 2 micro-batches) equal the ring-algorithm
 *     count, with full-buffer size B = 4 Psi:
 *       stage 0: dp all-reduce 2(D-1)/D B
 *       stage 1: shard reduce-scatter (S-1)/S B; shard all-gather (S-1)/S B
 *       stage 2: shard reduce-scatter k (S-1)/S B; shard all-gather (S-1)/S B
 *       stage 3: shard reduce-scatter k (S-1)/S B; shard all-gather k (S-1)/S (2B - 4|unit 0|)
 *                (forward gathers every unit, backward every unit but the embedding's)
 *       hybrid, stages 1-3: replicate all-reduce 2(R-1)/R B/S
 *  4. the sharded AdamW update equals, bit for bit, a single-process AdamW step on the
 *     gathered reduced gradient, and the published parameters are the same everywhere. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "deck/deck.h"
#include "comm/grid.h"
#include "model/layout.h"
#include "model/model.h"
#include "ops/ops.h"
#include "cpu/ops_cpu.h"
#include "model/optim.h"
#include "testutil.h"
#include "core/util.h"
#include "parallel/zero.h"

static int world_rank, world_size;

/* A check every rank agrees on: passes only if it passed everywhere. */
static int all(int ok) {
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok;
}
#define CHECK_ALL(cond, ...)                       \
  do {                                             \
    int ok_ = all(cond);                           \
    if (world_rank == 0) TU_CHECK(ok_, __VA_ARGS__); \
  } while (0)

static double max_rel(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs((double)b[i]));
  }
  return num / (den > 0 ? den : 1);
}

static void run_case(int stage, const char *scope) {
  tsr_config cfg;
  tsr_deck_defaults(&cfg);
  cfg.model.arch = TSR_ARCH_LLAMA;
  cfg.model.n_layer = 3;
  cfg.model.d_model = 32;
  cfg.model.n_head = 4;
  cfg.model.n_kv_head = 2;
  cfg.model.d_ff = 40;
  cfg.model.vocab_size = 53;
  cfg.model.seq_len = 8;
  cfg.model.init_std = 0.1;
  cfg.parallel.zero_stage = stage;
  cfg.parallel.shard_scope = !strcmp(scope, "global") ? TSR_SHARD_GLOBAL
                             : !strcmp(scope, "node") ? TSR_SHARD_NODE
                                                      : atoi(scope);
  cfg.parallel.ranks_per_node = strcmp(scope, "node") == 0 ? 2 : 0;
  const int k = 2; /* micro-batches per rank per step */
  cfg.train.micro_batch = 2;
  cfg.train.global_batch = (int64_t)k * cfg.train.micro_batch * world_size;

  tsr_comm *w;
  tsr_comm_create(&w, MPI_COMM_WORLD, "world");
  tsr_grid *g;
  tsr_grid_spec gs;
  tsr_grid_spec_of(&gs, &cfg);
  if (tsr_grid_create(&g, &gs, w)) {
    tsr_comm_destroy(&w);
    CHECK_ALL(0, "stage %d scope %s: grid", stage, scope);
    return;
  }
  tsr_comm_destroy(&w);
  const int D = g->dp, S = stage == 0 ? g->dp : g->shard_size, R = stage == 0 ? 1 : g->replicate_size;

  tsr_layout *lay;
  tsr_layout_create(&lay, &cfg.model);
  tsr_zero_pad_layout(lay, &cfg.parallel, g);
  const int64_t psi = lay->n_flat;
  tsr_model *model;
  tsr_model_spec spec;
  tsr_model_spec_of(&spec, &cfg);
  tsr_model_create_ext(&model, &spec, lay, stage < 3, stage < 2);
  const size_t before = tsr_mem_bytes();
  tsr_zero *z;
  int rc = tsr_zero_create(&z, &cfg.parallel, lay, model, g);
  const size_t allocated = tsr_mem_bytes() - before;
  CHECK_ALL(rc == 0, "stage %d scope %s (dp %d = shard %d x replicate %d): zero created", stage,
            scope, D, S, R);
  if (rc) return;

  /* 1. memory */
  int64_t umax = 0;
  for (int u = 0; u < tsr_model_n_units(model); u++) {
    tsr_unit U = tsr_model_unit(model, u);
    if (U.end - U.begin > umax) umax = U.end - U.begin;
  }
  const size_t F = 4, full = F * (size_t)psi, shard = full / (size_t)S;
  tsr_zero_memory want = {0};
  want.params = stage < 3 ? full : shard;
  want.grads = stage == 0 ? full : stage == 1 ? full + shard : shard;
  want.master = 0; /* fp32: the compute copy of the shard is the master (zero.c) */
  want.adam = 2 * (stage == 0 ? full : shard);
  want.unit_bufs = stage == 2 ? shard + 3 * F * (size_t)umax
                   : stage == 3 ? shard + 7 * F * (size_t)umax : 0;
  tsr_zero_memory got = tsr_zero_memory_of(z);
  CHECK_ALL(!memcmp(&got, &want, sizeof got),
            "stage %d %s: memory per rank params %zu grads %zu master %zu adam %zu bufs %zu "
            "match the formulas (Psi %lld, S %d)", stage, scope, got.params, got.grads, got.master,
            got.adam, got.unit_bufs, (long long)psi, S);
  if (stage < 3)
    CHECK_ALL((const float *)tsr_zero_master(z) ==
                  (const float *)tsr_model_params(model) + tsr_zero_shard_begin(z),
              "stage %d %s: in fp32 the master is the model's parameters at the shard", stage,
              scope);
  /* the zero object allocates its share (everything but the model-owned params/grads) */
  const size_t zero_owned = got.master + got.adam + got.unit_bufs +
                            (stage >= 1 ? shard : 0) + (stage == 3 ? shard : 0);
  CHECK_ALL(allocated >= zero_owned && allocated - zero_owned < 4096 + zero_owned / 100,
            "stage %d %s: %zu bytes allocated by zero_create ~ %zu from the formulas", stage,
            scope, allocated, zero_owned);
  if (stage == 3)
    CHECK_ALL(got.params * (size_t)S == full, "stage 3 %s: holds 1/%d of the parameters", scope, S);

  /* initial state: every rank builds the full model from the seed and takes its shard */
  float *init = tsr_calloc((size_t)psi, sizeof(float));
  tsr_layout_init(lay, init, 99);
  tsr_zero_scatter_state(z, init, NULL, NULL);

  /* the global batch: the same random tokens on every rank; dp rank r takes its part */
  const int T = (int)cfg.model.seq_len, mb = (int)cfg.train.micro_batch;
  const int n_seq = (int)cfg.train.global_batch;
  int32_t *in = tsr_calloc((size_t)n_seq * T, sizeof(int32_t));
  int32_t *tg = tsr_calloc((size_t)n_seq * T, sizeof(int32_t));
  srand(1234);
  for (int i = 0; i < n_seq * T; i++) in[i] = rand() % 53, tg[i] = rand() % 53;

  /* 3. one step with counters */
  tsr_comm *groups[3] = {g->dp_comm, g->dp_shard, g->dp_replicate};
  for (int i = 0; i < 3; i++) tsr_comm_reset_counters(groups[i]);
  tsr_zero_begin_step(z);
  for (int a = 0; a < k; a++) {
    double loss;
    const int first = g->dp_rank * k * mb + a * mb;
    tsr_zero_begin_micro(z, a == k - 1);
    tsr_model_fwd_bwd(model, in + first * T, tg + first * T, 1.0f / (float)(k * D), &loss);
  }
  tsr_zero_reduce_grads(z);

  /* 2. gradient vs one process on the whole batch */
  tsr_config one = cfg;
  one.train.micro_batch = n_seq;
  one.parallel.zero_stage = 0;
  tsr_model *ref;
  tsr_model_spec spec_one;
  tsr_model_spec_of(&spec_one, &one);
  tsr_model_create(&ref, &spec_one, lay);
  tsr_model_set_params(ref, init);
  tsr_model_zero_grads(ref);
  double ref_loss;
  tsr_model_fwd_bwd(ref, in, tg, 1.0f, &ref_loss);
  const int64_t a0 = tsr_zero_shard_begin(z), a1 = tsr_zero_shard_end(z);
  const float *rg = tsr_zero_reduced_grads(z);
  const double gerr = max_rel(rg, tsr_model_grads(ref) + a0, a1 - a0);
  CHECK_ALL(gerr < 1e-5, "stage %d %s: reduced gradient of the shard == single-process "
            "full-batch gradient (max rel %.2e, tol 1e-5)", stage, scope, gerr);
  double norm, ref_norm = sqrt(TU_SUMSQ(tsr_model_grads(ref), lay->n_params));
  tsr_zero_grad_norm(z, &norm);
  double norms[2] = {norm, -norm};
  MPI_Allreduce(MPI_IN_PLACE, norms, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  CHECK_ALL(norms[0] == -norms[1] && fabs(norm - ref_norm) < 1e-5 * ref_norm,
            "stage %d %s: global grad norm %.8f bitwise equal on all ranks, == %.8f", stage,
            scope, norm, ref_norm);

  /* 4. update; the reference uses the very gradient the shards hold */
  float *gfull = tsr_calloc((size_t)psi, sizeof(float));
  if (stage == 0)
    memcpy(gfull, rg, (size_t)psi * sizeof(float));
  else
    MPI_Allgather(rg, (int)(a1 - a0), MPI_FLOAT, gfull, (int)(a1 - a0), MPI_FLOAT,
                  tsr_comm_mpi(g->dp_shard));
  tsr_zero_update(z, &cfg.optim, 1e-2, 1, 0.5);

  /* 3. bytes counted for the step (reductions, and the parameter gather after the update) */
  const double B = 4.0 * (double)psi;
  const tsr_unit u0 = tsr_model_unit(model, 0);
  double want_ar = 0, want_rs = 0, want_ag = 0, want_rep = 0;
  if (stage == 0) {
    want_ar = 2.0 * (D - 1) / D * B;
  } else {
    want_rs = (stage == 1 ? 1 : k) * (double)(S - 1) / S * B;
    want_ag = stage == 3 ? k * (double)(S - 1) / S * (2 * B - 4.0 * (double)(u0.end - u0.begin))
                         : (double)(S - 1) / S * B;
    want_rep = R > 1 ? 2.0 * (R - 1) / R * B / S : 0;
  }
  tsr_comm *shard_g = stage == 0 ? g->dp_comm : g->dp_shard;
  const double got_ar = tsr_comm_bytes_of(g->dp_comm, TSR_COMM_ALL_REDUCE) +
                        (stage ? tsr_comm_bytes_of(g->dp_shard, TSR_COMM_ALL_REDUCE) : 0);
  const double got_rs = tsr_comm_bytes_of(shard_g, TSR_COMM_REDUCE_SCATTER);
  const double got_ag = tsr_comm_bytes_of(shard_g, TSR_COMM_ALL_GATHER);
  const double got_rep = stage ? tsr_comm_bytes_of(g->dp_replicate, TSR_COMM_ALL_REDUCE) : 0;
#define NEAR(a, b) (fabs((a) - (b)) <= 0.01 * (b) + 1e-9)
  CHECK_ALL(NEAR(got_ar, want_ar) && NEAR(got_rs, want_rs) && NEAR(got_ag, want_ag) &&
                NEAR(got_rep, want_rep),
            "stage %d %s: bytes per step all-reduce %.0f (ring %.0f), reduce-scatter %.0f (%.0f), "
            "all-gather %.0f (%.0f), replicate all-reduce %.0f (%.0f)", stage, scope, got_ar,
            want_ar, got_rs, want_rs, got_ag, want_ag, got_rep, want_rep);
  float *rm = tsr_calloc((size_t)psi, sizeof(float)), *rv = tsr_calloc((size_t)psi, sizeof(float));
  tsr_optim_adamw(&cfg.optim, lay, init, rm, rv, gfull, 1e-2, 1, 0.5);
  float *after = tsr_calloc((size_t)psi, sizeof(float));
  float *am = tsr_calloc((size_t)psi, sizeof(float)), *av = tsr_calloc((size_t)psi, sizeof(float));
  tsr_zero_gather_state(z, after, am, av);
  CHECK_ALL(!memcmp(after, init, (size_t)psi * 4) && !memcmp(am, rm, (size_t)psi * 4) &&
                !memcmp(av, rv, (size_t)psi * 4),
            "stage %d %s: sharded AdamW (master, m, v) bitwise == single-process AdamW on the "
            "same gradient", stage, scope);
  tsr_free(&am);
  tsr_free(&av);
  tsr_free(&gfull);
  if (stage < 3) { /* the compute copy everyone uses is the same on every rank */
    const void *p = tsr_model_params(model);
    const size_t bytes = (size_t)psi * tsr_dtype_size(tsr_model_dtype(model));
    char *p0 = tsr_calloc(bytes, 1);
    memcpy(p0, p, bytes);
    MPI_Bcast(p0, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK_ALL(!memcmp(p0, p, bytes),
              "stage %d %s: published parameters bitwise equal on every rank", stage, scope);
    tsr_free(&p0);
  }

  tsr_free(&after);
  tsr_free(&rm);
  tsr_free(&rv);
  tsr_model_destroy(&ref);
  tsr_free(&in);
  tsr_free(&tg);
  tsr_free(&init);
  tsr_zero_destroy(&z);
  tsr_model_destroy(&model);
  tsr_layout_destroy(&lay);
  tsr_grid_destroy(&g);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  tsr_set_rank(world_rank);
  tsr_cpu_open(1);
  for (int stage = 0; stage <= 3; stage++) {
    run_case(stage, "global");
    if (world_size == 4) run_case(stage, "node");
  }
  int rc = 0;
  if (world_rank == 0) {
    char name[64];
    snprintf(name, sizeof name, "test_zero (%d ranks)", world_size);
    rc = tu_summary(name);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
