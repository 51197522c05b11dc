/* plan.c — the planner (plan.h): layout checks, memory per rank by kind for the GPU and
 * for this CPU build, FLOPs, pipeline bubble, traffic per process group, predicted step
 * time and MFU, whether it fits, and the trainer's planned-vs-measured memory line and
 * FLOP count.  The command around it is plan_cli.c (output, options) and plan_search.c.
 *
 * Memory follows the allocations buffer by buffer: model.c (parameters and gradients it
 * owns; activation slots, the recompute target and gradient scratch sized by
 * tsr_model_sizes_of, the function model.c allocates them by), zero.c (master, Adam,
 * shard and unit buffers; its padding and slot counts from zero.h), pp_exec.c
 * (send/receive slots of tsr_model_sizes.act_elems) and session.c (the batch, the initial
 * copy).  Traffic follows the collectives model.c, zero.c and pp_exec.c issue,
 * counted as comm.c counts them.  The step time is plan_sim.c's replay of the schedule
 * with every kernel priced by the machine's profile (plan_profile.h); the closed form
 * here (busy time stretched by the ideal bubble, the exposed reductions and the update
 * after it) stays beside it as a cross-check. */
#include "plan.h"
#include "plan_sim.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "deck/deck.h"
#include "model/layout.h"
#include "deck/layout_check.h"
#include "model/model.h"
#include "cpu/ops_cpu.h"
#include "sched/pipeline.h"
#include "sched/registry.h"
#include "parallel/pp_exec.h"
#include "core/util.h"
#include "parallel/zero.h"

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int half_precision(const tsr_config *cfg) { return cfg->train.precision != TSR_F32; }
static int is(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* ---------------------------------------------------------------- layout checks */

/* The ZeRO shard group for shard_scope over the dp x cp = dpcp ranks holding the same
 * parameters, on whole nodes of rpn ranks (grid.c's rule; the layout checks have refused
 * what does not fit). */
static int shard_size(int64_t scope, int dpcp, int tp, int rpn) {
  if (scope == TSR_SHARD_GLOBAL) return dpcp;
  if (scope == TSR_SHARD_NODE) return rpn % (dpcp * tp) == 0 ? dpcp : rpn / tp;
  return (int)scope;
}

int tsr_plan_layout(const tsr_config *cfg, int world, int ranks_per_node, tsr_plan_grid *g,
                    char *msg, size_t len) {
  tsr_layout_issue is[TSR_LAYOUT_MAX_ISSUES];
  const int n = tsr_layout_check(cfg, world, ranks_per_node, is, TSR_LAYOUT_MAX_ISSUES);
  size_t used = 0;
  if (msg && len) msg[0] = 0;
  for (int i = 0; i < n && i < TSR_LAYOUT_MAX_ISSUES && msg && used + 2 < len; i++) {
    tsr_layout_issue_text(&is[i], cfg, NULL, NULL, msg + used, len - used - 1);
    used += strlen(msg + used);
    msg[used++] = '\n';
    msg[used] = 0;
  }
  if (n) return n;
  const tsr_parallel_config *pc = &cfg->parallel;
  const int tp = (int)pc->tp, pp = (int)pc->pp, cp = pc->cp > 1 ? (int)pc->cp : 1;
  const int dp = world / (tp * cp * pp), dpcp = dp * cp;
  const int S = shard_size(pc->shard_scope, dpcp, tp, ranks_per_node);
  const int m = (int)(cfg->train.global_batch / (cfg->train.micro_batch * dp));
  *g = (tsr_plan_grid){.world = world, .tp = tp, .pp = pp, .dp = dp,
                       .v = (int)pc->virtual_stages, .shard = S, .replicate = dpcp / S,
                       .ranks_per_node = ranks_per_node, .micro_batches = m, .cp = cp,
                       .dpcp = dpcp};
  return 0;
}

tsr_plan_grid tsr_plan_grid_of(const tsr_config *cfg, const tsr_grid *grid) {
  const int64_t m = cfg->train.global_batch / (cfg->train.micro_batch * grid->dp);
  const int cp = grid->cp > 1 ? grid->cp : 1;
  return (tsr_plan_grid){.world = grid->world_size, .tp = grid->tp, .pp = grid->pp,
                         .dp = grid->dp, .v = (int)cfg->parallel.virtual_stages,
                         .shard = grid->shard_size, .replicate = grid->replicate_size,
                         .ranks_per_node = grid->ranks_per_node, .micro_batches = (int)m,
                         .cp = cp, .dpcp = grid->dp * cp};
}

/* ---------------------------------------------------------------- what a stage holds */

/* A pipeline stage's tp rank 0, from the tensor table.  Units (model.h): the embedding unit
 * before the first layer, one per layer, and the head unit after the last (with the
 * padding). */
typedef struct {
  int64_t n_params;  /* elements held, before ZeRO's padding */
  int64_t unit0;     /* elements of the embedding unit */
  int64_t last_end;  /* where the last layer ends: the head unit is [last_end, n_flat) */
  int64_t max_layer; /* largest layer unit */
  int layers, first, last, n_tensors;
  int max_chunk;     /* the most layers in one of its chunks (parallel.stage_layers) */
  double gemm;       /* weight elements that take part in GEMMs here */
  double layer_gemm; /* of which in the layers (recomputed with recompute = 'full') */
} part;

static int gemm_weight(const tsr_tensor *t, const tsr_model_config *m, int pp) {
  if (t->ndim != 2 || is(t->name, "pos_embed.weight")) return 0;
  if (!is(t->name, "embed.weight")) return 1;
  return t->tied_copy || (m->tie_embeddings && pp == 1); /* the tied head; else a lookup */
}

/* Parts of recently planned layouts.  A search plans every ZeRO stage, recompute mode and
 * micro-batch of one (tp, pp, v) in a row, and building the tensor table is most of the
 * time of a plan; a part depends only on the model's shapes and where the rank sits.  The
 * planner runs on one thread (rank 0 of `tessera plan`, of the trainer's memory line). */
enum { PART_MEMO = 64 }; /* every stage of an uneven split of up to 64 stages */
static struct {
  tsr_model_config model;
  char split[TSR_STR_PATH];
  int tp, pp, v, stage, used;
  tsr_schedule_choice kind; /* the chunk placement */
  part p;
} memo[PART_MEMO];
static int memo_next;

static int build_part(const tsr_model_config *m, const char *split, tsr_schedule_choice kind,
                      int tp, int pp, int v, int stage, part *p) {
  tsr_layout *lay;
  TSR_CALL(tsr_layout_create_split(&lay, m, tp, 0, pp, stage, v, split, kind));
  memset(p, 0, sizeof *p);
  p->max_chunk = tsr_pp_stage_max_chunk(m, kind, pp, v, split, stage);
  int64_t begin = 0, end = 0;
  int cur = -1;
  for (int i = 0; i < lay->n_tensors; i++) {
    const tsr_tensor *t = &lay->tensors[i];
    if (gemm_weight(t, m, pp)) {
      p->gemm += (double)t->numel;
      if (t->layer >= 0) p->layer_gemm += (double)t->numel;
    }
    if (t->layer < 0) continue;
    if (t->layer != cur) { /* a new layer unit */
      if (cur < 0) p->unit0 = t->offset;
      p->max_layer = max64(p->max_layer, end - begin);
      begin = end = t->offset;
      cur = t->layer;
      p->layers++;
    }
    end = max64(end, t->offset + t->numel);
  }
  p->max_layer = max64(p->max_layer, end - begin);
  p->last_end = end;
  p->n_params = lay->n_params;
  p->n_tensors = lay->n_tensors;
  p->first = lay->embeds;
  p->last = lay->heads;
  tsr_layout_destroy(&lay);
  return 0;
}

static int make_part(const tsr_model_config *m, const char *split, tsr_schedule_choice kind,
                     int tp, int pp, int v, int stage, part *p) {
  const tsr_sched_desc *sd = tsr_sched(kind);
  TSR_CHECK(sd, TSR_ERR_INPUT, "plan: schedule %d is not one of the registry's", (int)kind);
  kind = tsr_sched_for(sd->placement, 1); /* one schedule per placement in the memo */
  for (int i = 0; i < PART_MEMO; i++)
    if (memo[i].used && memo[i].tp == tp && memo[i].pp == pp && memo[i].v == v &&
        memo[i].kind == kind &&
        memo[i].stage == stage && !memcmp(&memo[i].model, m, sizeof *m) &&
        !strcmp(memo[i].split, split)) {
      *p = memo[i].p;
      return 0;
    }
  TSR_CALL(build_part(m, split, kind, tp, pp, v, stage, p));
  TSR_CHECK(strlen(split) < sizeof memo[0].split, TSR_ERR_INPUT, "plan: stage_layers too long");
  strcpy(memo[memo_next].split, split);
  memcpy(&memo[memo_next].model, m, sizeof *m); /* compared bytewise */
  memo[memo_next].tp = tp, memo[memo_next].pp = pp, memo[memo_next].v = v;
  memo[memo_next].kind = kind;
  memo[memo_next].stage = stage, memo[memo_next].used = 1;
  memo[memo_next].p = *p;
  memo_next = (memo_next + 1) % PART_MEMO;
  return 0;
}

static int64_t shard_of(const tsr_config *cfg, const tsr_plan_grid *g) {
  return cfg->parallel.zero_stage == 0 ? g->dpcp : g->shard;
}
/* The unit whose gradient zero.c sums with its tied twin before reducing (pp > 1). */
static double tied_unit(const tsr_config *cfg, const tsr_plan_grid *g, const part *p, int64_t n) {
  if (!cfg->model.tie_embeddings || g->pp == 1) return 0;
  return p->first ? (double)p->unit0 : p->last ? (double)(n - p->last_end) : 0;
}

/* Sizes on one tp rank of the stage, for one cp rank's tokens. */
static tsr_model_sizes sizes_of(const tsr_config *cfg, const tsr_plan_grid *g, const part *p) {
  tsr_model_sizes s;
  tsr_plan_model_sizes(cfg, g->tp, g->cp, p->first, p->last, p->max_chunk, &s);
  return s;
}

/* ---------------------------------------------------------------- memory */

/* Bytes per element of the parameters' compute copy and of the stored activations (and
 * activation gradients): the deck's precision, on the CPU as on a GPU. */
typedef struct {
  double param, act;
} storage;

static storage storage_of(const tsr_config *cfg) {
  const int half = half_precision(cfg);
  return (storage){half ? 2 : 4, half ? 2 : 4};
}

tsr_plan_memory tsr_plan_state(double n, int stage, int S, int half, double f) {
  tsr_plan_memory mem;
  memset(&mem, 0, sizeof mem);
  const double len = n / S, own = stage == 0 ? n : len;
  const double x = tsr_plan_offloaded(own, f); /* the offloaded elements */
  mem.params = (stage < 3 ? n : len) * (half ? 2 : 4);
  mem.grads = (stage < 2 ? n : len) * 4;
  mem.master = half ? 4 * (own - x) : 0; /* fp32: the weights are it (zero.c) */
  mem.optim = 8 * (own - x);
  if (x > 0) { /* zero.c's page-locked buffers of the offloaded part */
    mem.host_master = 4 * x;
    mem.host_optim = 8 * x;
    mem.host_grads = 4 * x;
    mem.host_staging = half ? 2 * x : 0;
    mem.host = mem.host_master + mem.host_optim + mem.host_grads + mem.host_staging;
  }
  mem.total = mem.peak = mem.params + mem.grads + mem.master + mem.optim;
  return mem;
}


/* Host-side tables of this build: the model object and its tables, as model.c counts them
 * (tsr_model_table_bytes). */
static double model_books(const tsr_config *cfg, const tsr_plan_grid *g, const part *p,
                          int slots) {
  const tsr_model_sizes s = sizes_of(cfg, g, p);
  return tsr_model_table_bytes(&s, (int)cfg->model.n_layer, p->layers, g->v, slots);
}
/* ... and the layout's tensor table, zero.c's per-unit tables. */
static double other_books(const part *p, int64_t S) {
  double cap = 64;
  while (cap < p->n_tensors) cap *= 2;
  return cap * (double)sizeof(tsr_tensor) + (p->layers + 2.0) * (24 + 8.0 * (double)S);
}

/* zero.c's buffers besides the state: the shard a reduce-scatter lands in, the unit
 * slots of stages 2-3, the tied unit's accumulator. */
/* zero.c's host_grads: at ZeRO 2-3 offloaded (fraction off), with or without hybrid
 * replicas (whose all-reduce of the offloaded part then runs over host memory), the
 * reduced gradient of the offloaded part lives on the host only, the device's shard only
 * covering the rest; each gradient slot then has a landing area of the largest piece of a
 * unit in a shard (at most a unit, at most the shard) instead of one shard-long area.
 * (zero.c's host gradient also starts at the norm range across the split, if any: up to
 * a tensor more, not counted.) */
static int grads_on_host(const tsr_config *cfg, const tsr_plan_grid *g, double off) {
  return cfg->parallel.zero_stage >= 2 && off > 0;
}

static double zero_buffers(const tsr_config *cfg, const tsr_plan_grid *g, const part *p,
                           const storage *st, double off) {
  const int zs = (int)cfg->parallel.zero_stage;
  const int64_t S = shard_of(cfg, g), n = tsr_zero_padded_length(p->n_params, S);
  const double len = (double)n / (double)S;
  const double unit = (double)max64(max64(p->max_layer, p->unit0), n - p->last_end);
  double b = zs == 1 ? 4 * len : 0;
  if (zs >= 2 && grads_on_host(cfg, g, off))
    b += TSR_ZERO_GRAD_SLOTS * 4 * (unit + fmin(unit, len)) + 4 * tied_unit(cfg, g, p, n);
  else if (zs >= 2)
    b += 4 * len + TSR_ZERO_GRAD_SLOTS * 4 * unit + 4 * tied_unit(cfg, g, p, n);
  if (zs >= 3) b += TSR_ZERO_PARAM_SLOTS * st->param * unit;
  return b;
}

/* The GPU backend's scratch beyond hardware.reserved_gb: the tensor-core attention
 * backward's per-query-head dk, dv sums under grouped-query attention (cuda/attention.cu,
 * tsr_ops_shapes.attn_part), and its D; with 16-bit storage, cuDNN attention's workspace,
 * unless TSR_CUDA_ATTENTION in the environment asks for another attention (mma): cuDNN's
 * is the default of a GPU build with cuDNN (cuda/backend.h), the one planned for.  The
 * other scratch parts (column sums, the embedding sort, cross-entropy rows) are kilobytes
 * to a few megabytes, left to the reserve.  With cp's all-to-alls the attention runs over
 * the whole sequence on H / cp heads: the same B H T rows as a cp rank's own, but cuDNN's
 * [T, T] workspace at the whole T. */
static double gpu_scratch(const tsr_config *cfg, const tsr_plan_grid *g,
                          const tsr_model_sizes *d) {
  tsr_ops_shapes s;
  tsr_model_ops_shapes_of(d, &s);
  double b = (double)tsr_ops_attention_scratch_bytes(s.attn_bht, s.attn_part);
  const char *attention = getenv("TSR_CUDA_ATTENTION");
  if (half_precision(cfg) && (!attention || !*attention || !strcmp(attention, "cudnn")))
    b += (double)tsr_ops_cudnn_attention_workspace_bytes(&s);
  return b;
}

/* The CPU kernels' conversion buffers of 16-bit storage (src/cpu/cpu.c), for this process's
 * threads. */
static double cpu_buffers(const tsr_config *cfg, const tsr_model_sizes *d) {
  tsr_ops_shapes s;
  tsr_model_ops_shapes_of(d, &s);
  s.dt = cfg->train.precision;
  return (double)tsr_cpu_reserve_bytes(&s, tsr_cpu_threads());
}

/* The offloaded fraction of a column: the GPU's (zero.c offloads on a device only) */
static double offload_in(const tsr_config *cfg, tsr_plan_backend b) {
  return b == TSR_PLAN_GPU ? tsr_plan_offload_fraction(cfg) : 0;
}

/* act_off: the activation offload applies (a GPU column with train.activation_offload):
 * the device keeps the model's window of layer blocks and each slot's rest, the host every
 * slot's blocks (model_sizes.c); otherwise the sizes without it (the CPU build moves
 * nothing). */
static tsr_plan_memory memory_of(const tsr_config *cfg, const tsr_plan_grid *g, const part *p,
                                 int slots, tsr_plan_backend b, double off, int act_off) {
  const storage st = storage_of(cfg);
  const int zs = (int)cfg->parallel.zero_stage;
  const int64_t S = shard_of(cfg, g), n = tsr_zero_padded_length(p->n_params, S);
  tsr_model_sizes d = sizes_of(cfg, g, p);
  if (d.act_offload && !act_off) {
    tsr_config c = *cfg;
    c.train.activation_offload = 0;
    d = sizes_of(&c, g, p);
  }
  tsr_plan_memory mem = tsr_plan_state((double)n, zs, (int)S, half_precision(cfg), off);
  mem.activations = slots * tsr_model_slot_bytes(&d, st.act) + tsr_model_offload_window_bytes(&d);
  mem.host_acts = slots * tsr_model_offload_host_slot_bytes(&d);
  mem.host += mem.host_acts;
  mem.comm = zero_buffers(cfg, g, p, &st, off);
  const double len = (double)n / (double)S;
  if (grads_on_host(cfg, g, off)) { /* the offloaded part's gradient on the host only */
    const double unit = (double)max64(max64(p->max_layer, p->unit0), n - p->last_end);
    mem.grads -= 4 * tsr_plan_offloaded(len, off);
    /* each gradient slot's host copy of its piece */
    mem.host_grads += TSR_ZERO_GRAD_SLOTS * 4 * fmin(unit, len);
    mem.host += TSR_ZERO_GRAD_SLOTS * 4 * fmin(unit, len);
  }
  if (g->pp > 1) /* pp_exec.c: input activation, two gradients per slot; the eval buffer */
    mem.comm += (3.0 * slots + 1) * (double)d.act_elems * st.act;
  /* context parallelism's exchange buffers are the model's (model_sizes.c), in its
   * workspace: shown as communication buffers (its fp32 sums stay workspace) */
  const double cp_comm = (double)d.cp_dt * st.act;
  mem.comm += cp_comm;
  const double model_ws = tsr_model_workspace_bytes(&d, st.act);
  const double batch = 2 * d.N * 4 * (g->pp > 1 ? 2 : 1) + 8.0 * g->pp * (g->pp > 1);
  const double books = b == TSR_PLAN_CPU ? model_books(cfg, g, p, slots) : 0;
  mem.workspace = model_ws - cp_comm + batch + books +
                  (b == TSR_PLAN_CPU ? other_books(p, S) + cpu_buffers(cfg, &d)
                                     : gpu_scratch(cfg, g, &d));
  mem.model = (zs < 3 ? mem.params : 0) + (zs < 2 ? 4.0 * (double)n : 0) + mem.activations +
              model_ws + books;
  mem.total = mem.params + mem.grads + mem.master + mem.optim + mem.activations + mem.comm +
              mem.workspace;
  mem.peak = mem.total + (b == TSR_PLAN_CPU ? 4.0 * (double)n : 0); /* session.c's initial copy */
  mem.in_flight = slots;
  return mem;
}

int tsr_plan_in_flight(tsr_schedule_choice schedule, int pp, int stage, int m, int v) {
  const tsr_sched_desc *d = tsr_sched(schedule);
  if (pp == 1 || !d) return 1;
  return d->in_flight(pp, stage, m, d->chunks == 0 ? v : d->chunks);
}

/* This build keeps a slot per micro-batch-chunk alive or with a receive posted. */
static int cpu_slots(const tsr_config *cfg, const tsr_plan_grid *g, int stage) {
  if (g->pp == 1) return 1;
  tsr_pp_schedule *s;
  if (tsr_pp_schedule_create(&s, cfg->parallel.schedule, g->pp, stage, g->micro_batches, g->v))
    return -1;
  const int n = tsr_pp_slots_needed(s);
  tsr_pp_schedule_destroy(&s);
  return n;
}

static int slots_for(const tsr_config *cfg, const tsr_plan_grid *g, int stage,
                     tsr_plan_backend b) {
  return b == TSR_PLAN_CPU ? cpu_slots(cfg, g, stage)
                           : tsr_plan_in_flight(cfg->parallel.schedule, g->pp, stage,
                                                g->micro_batches, g->v);
}

int tsr_plan_stage_memory(const tsr_config *cfg, const tsr_plan_grid *g, int stage,
                          tsr_plan_backend b, tsr_plan_memory *out) {
  part p;
  TSR_CALL(make_part(&cfg->model, cfg->parallel.stage_layers, cfg->parallel.schedule, g->tp,
                     g->pp, g->v, stage, &p));
  const int slots = slots_for(cfg, g, stage, b);
  TSR_CHECK(slots > 0, TSR_ERR, "plan: no pipeline schedule for stage %d", stage);
  *out = memory_of(cfg, g, &p, slots, b, offload_in(cfg, b),
                   b == TSR_PLAN_GPU && cfg->train.activation_offload);
  return 0;
}

/* ---------------------------------------------------------------- traffic */

static void add(tsr_plan_traffic *t, tsr_comm_kind k, double bytes) {
  t->bytes[k] += bytes;
  if (k != TSR_COMM_SCALAR) t->total += bytes;
}
static double ring_all(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }
static double ring_half(int n) { return n > 1 ? (double)(n - 1) / n : 0.0; }

/* model.c per micro-batch: per layer two row-parallel sums forward, two input-gradient
 * sums backward (sequence parallel: all-gathers before the column-parallel GEMMs and
 * reduce-scatters after the row-parallel ones, plus the norm weights' gradient sums),
 * again for what recomputation reruns; the shared-KV gradient sum; the embedding and the
 * LM head; the cross-entropy's row statistics (doubles, "scalar").  Activations and
 * their gradients move in the storage type, parameter gradients in fp32. */
static void tp_traffic(const tsr_config *cfg, const tsr_model_sizes *d, const part *p, int tp,
                       double k, tsr_plan_traffic *t) {
  if (tp == 1) return;
  const double A = d->N * d->C * storage_of(cfg).act, ar = ring_all(tp) * A;
  const double half = ring_half(tp) * A;
  const double norm = ring_all(tp) * d->C * 4 * (d->gpt2 ? 2 : 1);
  const int full = cfg->train.recompute == TSR_RECOMPUTE_FULL;
  const int sel = cfg->train.recompute == TSR_RECOMPUTE_SELECTIVE;
  const double L = p->layers;
  if (!d->sp) {
    add(t, TSR_COMM_ALL_REDUCE, k * L * (4 + 2 * full) * ar + k * (p->first + p->last) * ar);
  } else {
    add(t, TSR_COMM_ALL_GATHER, k * L * (4 + 2 * (sel || full)) * half);
    add(t, TSR_COMM_REDUCE_SCATTER, k * L * (4 + 2 * full) * half);
    add(t, TSR_COMM_ALL_REDUCE, k * L * 2 * norm + k * p->last * norm);
    add(t, TSR_COMM_ALL_GATHER, k * (p->first + p->last) * half);
    add(t, TSR_COMM_REDUCE_SCATTER, k * (p->first + p->last) * half);
  }
  if (d->kv_shared)
    add(t, TSR_COMM_ALL_REDUCE,
        k * L * ring_all(tp) * d->kv_seg * (double)cfg->model.n_kv_head * 4);
  /* a split backward's W pass reduces the fused head's statistics again */
  const int again = d->split && d->xent_chunk > 0;
  if (p->last) add(t, TSR_COMM_SCALAR, k * 3 * (1 + again) * ring_all(tp) * d->N * 8);
}

/* zero.c per step, B = the stage's fp32 gradient, W = its parameters' compute copy (the
 * storage type), over the dp x cp ranks that hold the same parameters: stage 0
 * all-reduces B over them; 1 reduce-scatters it once and
 * all-gathers W; 2 reduce-scatters every micro-batch (the tied unit once); 3 also gathers
 * each unit of W before forward and backward (not the embedding's for backward, but the
 * tied head's twice more, or once: the fused head's forward does not use it); copies
 * across the shard groups (hybrid) all-reduce the shard. */
static void dp_traffic(const tsr_config *cfg, const tsr_plan_grid *g, const part *p,
                       tsr_plan_traffic *t) {
  const int zs = (int)cfg->parallel.zero_stage, S = (int)shard_of(cfg, g);
  const int64_t n = tsr_zero_padded_length(p->n_params, S);
  const double B = 4.0 * (double)n, k = g->micro_batches, tied = 4 * tied_unit(cfg, g, p, n);
  const double W = storage_of(cfg).param * (double)n;
  if (zs == 0) {
    add(&t[TSR_PLAN_DP], TSR_COMM_ALL_REDUCE, ring_all(g->dpcp) * B);
    return;
  }
  tsr_plan_traffic *sh = &t[TSR_PLAN_DP_SHARD];
  add(sh, TSR_COMM_REDUCE_SCATTER, ring_half(S) * (zs == 1 ? B : k * (B - tied) + tied));
  if (zs < 3) {
    add(sh, TSR_COMM_ALL_GATHER, ring_half(S) * W);
  } else {
    const double u0 = storage_of(cfg).param * (double)p->unit0;
    const int head_is_embed = cfg->model.tie_embeddings && p->first && p->last;
    const int head_gathers = cfg->train.xent_chunk_tokens > 0 ? 1 : 2;
    add(sh, TSR_COMM_ALL_GATHER,
        k * ring_half(S) * (2 * W - u0 + head_gathers * u0 * head_is_embed));
  }
  add(&t[TSR_PLAN_DP_REPLICATE], TSR_COMM_ALL_REDUCE, ring_all(g->replicate) * B / S);
}

/* The cp group per step: tsr_plan_cp_layer's elements (plan_cost.c) per layer and
 * micro-batch, K, V and the all-to-alls in the storage type, the ring's dK, dV in fp32;
 * recompute 'full' runs each layer's forward again, its traffic too. */
static void cp_traffic(const tsr_config *cfg, const tsr_plan_grid *g, const tsr_model_sizes *d,
                       const part *p, tsr_plan_traffic *t) {
  tsr_plan_cp_elems x;
  if (g->cp <= 1) return;
  tsr_plan_cp_layer(cfg, g, d, &x);
  const double e = storage_of(cfg).act, k = g->micro_batches, L = p->layers;
  const int runs = cfg->train.recompute == TSR_RECOMPUTE_FULL ? 2 : 1;
  const double bytes = k * L * ((runs * x.fwd + x.bwd) * e + x.bwd32 * 4);
  if (cfg->parallel.cp_comm == TSR_CP_A2A) {
    add(t, TSR_COMM_ALL_TO_ALL, bytes);
  } else {
    add(t, TSR_COMM_SEND, bytes);
    add(t, TSR_COMM_RECV, bytes);
  }
}

/* pp_exec.c per micro-batch and chunk: the input activation in, its gradient out; the
 * output activation out, its gradient in.  Tied embeddings: one all-reduce of the
 * embedding's gradient between the first and the last stage per step. */
static void pp_traffic(const tsr_config *cfg, const tsr_plan_grid *g, const tsr_model_sizes *d,
                       const part *p, int stage, tsr_plan_traffic *t) {
  const double msg = d->Ns * d->C * storage_of(cfg).act, k = g->micro_batches;
  const int chunks = g->pp * g->v;
  const tsr_schedule_choice kind = cfg->parallel.schedule;
  for (int j = 0; j < g->v && g->pp > 1; j++) {
    const int c = tsr_pp_stage_chunk(kind, g->pp, g->v, stage, j);
    /* neighbours of this chunk on other stages (a V's bend hands over in place) */
    const int sides = (c > 0 && tsr_pp_chunk_owner(kind, g->pp, g->v, c - 1) != stage) +
                      (c < chunks - 1 && tsr_pp_chunk_owner(kind, g->pp, g->v, c + 1) != stage);
    add(&t[TSR_PLAN_PP], TSR_COMM_SEND, sides * k * msg);
    add(&t[TSR_PLAN_PP], TSR_COMM_RECV, sides * k * msg);
  }
  if (cfg->model.tie_embeddings && g->pp > 1 && (p->first != p->last))
    add(&t[TSR_PLAN_TIED], TSR_COMM_ALL_REDUCE, ring_all(2) * d->V * d->C * 4);
}

/* Names (the trainer's: dp_comm is "dp_cp" with cp > 1), sizes and whether a group's ranks
 * span nodes (ranks: tp fastest, then cp, dp, pp; the dp x cp ranks of a (pp, tp) position
 * are dp_comm and ZeRO's). */
static void name_groups(const tsr_plan_grid *g, tsr_plan_traffic t[TSR_PLAN_N_GROUPS]) {
  static const char *names[TSR_PLAN_N_GROUPS] = {"dp", "dp_shard", "dp_replicate",
                                                 "tp", "cp", "pp", "embed_tied"};
  const int size[TSR_PLAN_N_GROUPS] = {g->dpcp, g->shard, g->replicate, g->tp, g->cp, g->pp, 2};
  const long span[TSR_PLAN_N_GROUPS] = {(long)g->dpcp * g->tp, (long)g->shard * g->tp,
                                        (long)g->dpcp * g->tp, g->tp, (long)g->cp * g->tp,
                                        g->world, g->world};
  memset(t, 0, TSR_PLAN_N_GROUPS * sizeof *t);
  for (int i = 0; i < TSR_PLAN_N_GROUPS; i++) {
    t[i].name = names[i];
    t[i].size = size[i];
    t[i].inter_node = tsr_plan_group_link(size[i], span[i], g->ranks_per_node) == TSR_LINK_INTER;
  }
  if (g->cp > 1) t[TSR_PLAN_DP].name = "dp_cp";
}

static void traffic_of(const tsr_config *cfg, const tsr_plan_grid *g, const part *p, int stage,
                       tsr_plan_traffic t[TSR_PLAN_N_GROUPS]) {
  const tsr_model_sizes d = sizes_of(cfg, g, p);
  name_groups(g, t);
  tp_traffic(cfg, &d, p, g->tp, g->micro_batches, &t[TSR_PLAN_TP]);
  cp_traffic(cfg, g, &d, p, &t[TSR_PLAN_CP]);
  dp_traffic(cfg, g, p, t);
  pp_traffic(cfg, g, &d, p, stage, t);
}

int tsr_plan_stage_traffic(const tsr_config *cfg, const tsr_plan_grid *g, int stage,
                           tsr_plan_traffic out[TSR_PLAN_N_GROUPS]) {
  part p;
  TSR_CALL(make_part(&cfg->model, cfg->parallel.stage_layers, cfg->parallel.schedule, g->tp,
                     g->pp, g->v, stage, &p));
  traffic_of(cfg, g, &p, stage, out);
  return 0;
}

/* ---------------------------------------------------------------- FLOPs and time */

/* The causal attention core's forward per token and layer on all heads: QK^T and PV, each
 * query row against T / 2 keys on average, 2 FLOPs per multiply-add: 2 T d. */
static double attention_core(const tsr_model_config *m) {
  return 2.0 * (double)m->seq_len * (double)m->d_model;
}

double tsr_plan_run_flops_per_token(const tsr_config *cfg) {
  const tsr_model_config *m = &cfg->model;
  return tsr_plan_flops_per_token(m) - 3.0 * (double)m->n_layer * attention_core(m) *
                                           (1.0 - tsr_plan_doc_attention_share(cfg));
}

double tsr_plan_forward_flops_per_token(const tsr_model_config *m) {
  part whole;
  if (make_part(m, "", TSR_SCHEDULE_DEFAULT, 1, 1, 1, 0, &whole)) return 0.0;
  return 2.0 * whole.gemm + (double)m->n_layer * attention_core(m);
}

double tsr_plan_flops_per_token(const tsr_model_config *m) {
  return 3.0 * tsr_plan_forward_flops_per_token(m);
}

/* What one GPU of the stage computes per token of its dp rank's share: the forward of
 * its GEMM weights (a KV head replicated over tp ranks counts on each) and of its heads'
 * share of the attention core, three times (backward twice forward), plus what
 * recomputation runs again.  recompute = 'full' reruns the forward of the stage's layers
 * (model_layer_recompute; not the embedding, the head or the loss); 'selective' rebuilds
 * the norm outputs and the MLP activation, element-wise work, which this count leaves out
 * like every element-wise op, the lookups and the loss.  The fused head (xent_chunk_tokens)
 * runs its logits' GEMM once more in a split backward's W pass. */
static double stage_forward(const tsr_config *cfg, const tsr_plan_grid *g, const part *p) {
  return 2.0 * p->gemm +
         p->layers * attention_core(&cfg->model) * tsr_plan_doc_attention_share(cfg) / g->tp;
}
static double stage_recompute(const tsr_config *cfg, const tsr_plan_grid *g, const part *p) {
  double head = 0; /* a split backward's W pass computes the fused head's logits again */
  if (tsr_pp_split_backward(cfg->parallel.schedule) && p->last &&
      cfg->train.xent_chunk_tokens > 0)
    head = 2.0 * (double)cfg->model.d_model * (double)cfg->model.vocab_size / g->tp;
  if (cfg->train.recompute != TSR_RECOMPUTE_FULL) return head;
  return head + 2.0 * p->layer_gemm +
         p->layers * attention_core(&cfg->model) * tsr_plan_doc_attention_share(cfg) / g->tp;
}
/* A GPU's tokens per step: its dp rank's sequences, of which a cp rank holds 1 / cp.  The
 * per-token counts above hold for a cp rank's tokens as they are: the 2 cp chunk split
 * gives every cp rank 2 cp - 1 whole key blocks and 2 diagonal ones, 1 / cp of the causal
 * attention's pairs exactly (docs/context_parallel.md), so the attention core per token,
 * 2 T d on average over the whole sequence, is the same on every rank. */
static double stage_tokens(const tsr_config *cfg, const tsr_plan_grid *g) {
  return (double)cfg->train.global_batch * (double)cfg->model.seq_len / g->dp / g->cp;
}

/* bf16 runs on the tensor cores; fp32 runs true fp32 (no TF32), at the fp32 peak. */
static double peak_flops(const tsr_hardware *hw, const tsr_config *cfg) {
  return (half_precision(cfg) ? hw->peak_tflops : hw->peak_fp32_tflops) * 1e12;
}

/* The bytes of a group's traffic at its link's rate (the table's "time s"). */
static double link_time(const tsr_hardware *hw, const tsr_plan_traffic *t, double bytes) {
  return tsr_plan_link_s(hw, t->inter_node ? TSR_LINK_INTER : TSR_LINK_INTRA, bytes, 0);
}

/* The closed form, beside the replay of plan_sim.c: a stage's chunks priced by the profile
 * (plan_cost.c) for each micro-batch, tensor-parallel time apart; pipeline transfers on
 * the critical path; gradient reductions overlap backward (stages 0-1: the last
 * micro-batch's; 2-3: every one's); stage 3's gathers overlap compute; stages 1-2 gather
 * after the update, and the hybrid copies' all-reduce follows the reduction: those are
 * exposed.  AdamW streams the shard's master, m, v and gradient in and out of HBM; with
 * parallel.offload the offloaded part's update runs beside it (tsr_plan_offload_place). */
static int stage_times(const tsr_config *cfg, const tsr_hardware *hw, const tsr_plan_grid *g,
                       int stage, int units, tsr_plan_stage *s) {
  const int zs = (int)cfg->parallel.zero_stage;
  const tsr_plan_traffic *dp = &s->comm[zs == 0 ? TSR_PLAN_DP : TSR_PLAN_DP_SHARD];
  const tsr_plan_traffic *tied = &s->comm[TSR_PLAN_TIED], *rep = &s->comm[TSR_PLAN_DP_REPLICATE];
  s->t_compute = s->t_tp = s->t_cp = s->act_bytes = s->act_back = s->act_exposed = 0;
  for (int c = 0; c < g->pp * g->v; c++) {
    if (tsr_pp_chunk_owner(cfg->parallel.schedule, g->pp, g->v, c) != stage) continue;
    tsr_plan_chunk ch;
    TSR_CALL(tsr_plan_chunk_cost(cfg, hw, g, c, &ch));
    const double tp = ch.f_tp + ch.b_tp + ch.w_tp, cp = ch.f_cp + ch.b_cp;
    s->t_compute += g->micro_batches * (ch.f + ch.b + ch.w - tp - cp);
    s->t_tp += g->micro_batches * tp;
    s->t_cp += g->micro_batches * cp;
    /* to the host and back: twice each with a split backward (after B, for W) */
    const int trips = tsr_pp_split_backward(cfg->parallel.schedule) ? 2 : 1;
    s->act_bytes += g->micro_batches * ch.layers * ch.act_block * trips;
    s->act_back += g->micro_batches * ch.layers * ch.act_block * trips;
    s->act_exposed += g->micro_batches * ch.act_exposed;
  }
  s->t_pp = s->comm[TSR_PLAN_PP].seconds + tied->seconds;
  const double backward = 2.0 / 3.0 * s->t_compute * (zs < 2 ? 1.0 / g->micro_batches : 1.0);
  const double grads = link_time(hw, dp, dp->bytes[TSR_COMM_ALL_REDUCE] +
                                             dp->bytes[TSR_COMM_REDUCE_SCATTER]);
  const double gathers = link_time(hw, dp, dp->bytes[TSR_COMM_ALL_GATHER]);
  /* Adam holds 8 bytes per element, on the device or the host */
  const double own = (s->mem[TSR_PLAN_GPU].optim + s->mem[TSR_PLAN_GPU].host_optim) / 8;
  s->offload = tsr_plan_offload_of(cfg, hw, own);
  /* placed with a third of a micro-batch's compute as the first forward (plan_sim.c places
   * it again with the replay's); the device's AdamW over the rest runs beside it */
  tsr_plan_offload_place(&s->offload, zs, units, s->t_compute / (3.0 * g->micro_batches),
                         s->t_compute / g->micro_batches, g->micro_batches);
  tsr_plan_offload *o = &s->offload;
  /* the replicas' all-reduce: with the gradient on the host its offloaded part runs over
   * host memory after the device's (tsr_plan_replica_all_reduce_s) */
  const double host = g->replicate > 1 ? tsr_plan_replica_host_elems(o, own) : 0;
  o->replica_host_bytes = ring_all(g->replicate) * 4 * host;
  o->replica_host_s = tsr_plan_host_all_reduce_s(
      hw, rep->inter_node ? TSR_LINK_INTER : TSR_LINK_INTRA, g->replicate, 4 * host);
  s->comm[TSR_PLAN_DP_REPLICATE].seconds =
      link_time(hw, rep, rep->total - o->replica_host_bytes) + o->replica_host_s;
  s->t_dp = fmax(0.0, grads - backward) +
            (zs == 3 ? fmax(0.0, gathers - s->t_compute) : gathers) +
            rep->seconds;
  s->t_optimizer = tsr_plan_update_s(hw, o, own, half_precision(cfg) ? 2 : 4, NULL) +
                   o->host_norm_s + o->accum_exposed_s;
  return 0;
}

/* ---------------------------------------------------------------- a whole plan */

static int plan_stage(tsr_plan *p, const tsr_config *cfg, const part *pt, int s, int cpu) {
  tsr_plan_stage *st = &p->stages[s];
  /* hardware 'cpu' runs on this host, where the offload moves nothing */
  const int host_is_device = !strcmp(p->hw.name, "cpu");
  for (int b = 0; b < TSR_PLAN_N_BACKENDS; b++) {
    if (b == TSR_PLAN_CPU && !cpu) continue;
    const int slots = slots_for(cfg, &p->grid, s, (tsr_plan_backend)b);
    TSR_CHECK(slots > 0, TSR_ERR, "plan: no pipeline schedule for stage %d", s);
    st->mem[b] = memory_of(cfg, &p->grid, pt, slots, (tsr_plan_backend)b,
                           host_is_device ? 0 : offload_in(cfg, (tsr_plan_backend)b),
                           !host_is_device && b == TSR_PLAN_GPU &&
                               cfg->train.activation_offload);
  }
  traffic_of(cfg, &p->grid, pt, s, st->comm);
  for (int i = 0; i < TSR_PLAN_N_GROUPS; i++) { /* sends and receives run side by side */
    tsr_plan_traffic *t = &st->comm[i];
    const double send = t->bytes[TSR_COMM_SEND], recv = t->bytes[TSR_COMM_RECV];
    t->seconds = link_time(&p->hw, t, t->total - send - recv + fmax(send, recv));
  }
  const double tokens = stage_tokens(cfg, &p->grid);
  st->recompute_flops = tokens * stage_recompute(cfg, &p->grid, pt);
  st->flops = tokens * 3.0 * stage_forward(cfg, &p->grid, pt) + st->recompute_flops;
  TSR_CALL(stage_times(cfg, &p->hw, &p->grid, s, pt->layers + pt->first + pt->last, st));
  st->layers = pt->layers;
  st->done = 1;
  return 0;
}

/* Whole-job numbers from the stages: FLOPs, bubble, step time, MFU, the worst memory. */
static void plan_totals(tsr_plan *p, const tsr_config *cfg) {
  const tsr_model_config *m = &cfg->model;
  const tsr_plan_grid *g = &p->grid;
  const double tokens = (double)cfg->train.global_batch * (double)m->seq_len;
  const double share = tsr_plan_doc_attention_share(cfg);
  p->attention_saved_flops = 3.0 * (double)m->n_layer * attention_core(m) * tokens * (1 - share);
  p->forward_flops = tsr_plan_forward_flops_per_token(m) * tokens - p->attention_saved_flops / 3;
  p->model_flops = 3.0 * p->forward_flops;
  p->attention_flops = 3.0 * (double)m->n_layer * attention_core(m) * tokens * share;
  p->bubble =
      g->pp > 1 ? tsr_pp_ideal_bubble(cfg->parallel.schedule, g->pp, g->micro_batches, g->v) : 0;
  double busy = 0, tail = 0;
  for (int s = 0; s < g->pp; s++) {
    const tsr_plan_stage *st = p->stages[s].done ? &p->stages[s] : &p->stages[1]; /* alike */
    p->executed_flops += st->flops * g->tp * g->dpcp;
    p->recompute_flops += st->recompute_flops * g->tp * g->dpcp;
    const double mine = st->t_compute + st->t_tp + st->t_cp + st->t_pp;
    if (mine > busy) p->critical = p->stages[s].done ? s : 1;
    busy = fmax(busy, mine);
    tail = fmax(tail, st->t_dp + st->t_optimizer);
    for (int b = 0; b < TSR_PLAN_N_BACKENDS; b++)
      if (p->stages[s].done && st->mem[b].total > p->stages[p->worst[b]].mem[b].total)
        p->worst[b] = s;
  }
  p->t_pipeline = busy / (1.0 - p->bubble);
  p->t_step = p->t_pipeline + tail;
  p->tokens_per_s = tokens / p->t_step;
  p->mfu = p->model_flops / (p->t_step * g->world * peak_flops(&p->hw, cfg));
  const double need = p->stages[p->worst[TSR_PLAN_GPU]].mem[TSR_PLAN_GPU].peak;
  p->fits_gpu = need + p->hw.reserved_gb * 1e9 <= p->hw.max_mem_frac * p->hw.hbm_gb * 1e9;
  /* the offload's page-locked memory of a node: its GPUs as those of the stage holding the
   * most (a node's ranks are of one stage unless a stage has fewer ranks than a node) */
  for (int s = 0; s < g->pp; s++)
    if (p->stages[s].done &&
        p->stages[s].mem[TSR_PLAN_GPU].host > p->stages[p->host_stage].mem[TSR_PLAN_GPU].host)
      p->host_stage = s;
  p->host_node = p->stages[p->host_stage].mem[TSR_PLAN_GPU].host * g->ranks_per_node;
  p->fits_host = p->host_node <= p->hw.host_memory_gb * 1e9;
  p->fits = p->fits_gpu && p->fits_host;
}

int tsr_plan_make(tsr_plan *p, const tsr_config *cfg, const tsr_hardware *hw,
                  const tsr_plan_grid *g, int all_stages) {
  memset(p, 0, sizeof *p);
  p->grid = *g;
  p->hw = *hw;
  p->stages = tsr_calloc((size_t)g->pp, sizeof *p->stages);
  TSR_CHECK(p->stages, TSR_ERR, "out of memory");
  /* stage 0, a middle stage, the last stage: with equal chunks the middle stages hold the
   * same; a split set by parallel.stage_layers may differ on every stage: all are planned */
  const char *split = cfg->parallel.stage_layers;
  const int uneven = split[0] != 0;
  const tsr_schedule_choice kind = cfg->parallel.schedule; /* its placement: schedule.h */
  part kinds[3];
  TSR_CALL(make_part(&cfg->model, split, kind, g->tp, g->pp, g->v, 0, &kinds[0]));
  if (g->pp > 2) TSR_CALL(make_part(&cfg->model, split, kind, g->tp, g->pp, g->v, 1, &kinds[1]));
  if (g->pp > 1)
    TSR_CALL(make_part(&cfg->model, split, kind, g->tp, g->pp, g->v, g->pp - 1, &kinds[2]));
  for (int s = 0; s < g->pp; s++) {
    if (!all_stages && !uneven && s > 1 && s < g->pp - 1) continue;
    part here;
    const part *pt = s == 0 ? &kinds[0] : s == g->pp - 1 ? &kinds[2] : &kinds[1];
    if (uneven && s > 1 && s < g->pp - 1) {
      TSR_CALL(make_part(&cfg->model, split, kind, g->tp, g->pp, g->v, s, &here));
      pt = &here;
    }
    TSR_CALL(plan_stage(p, cfg, pt, s, all_stages));
  }
  part whole;
  TSR_CALL(make_part(&cfg->model, "", TSR_SCHEDULE_DEFAULT, 1, 1, 1, 0, &whole));
  p->n_params = whole.n_params;
  p->n_gemm = (int64_t)whole.gemm;
  plan_totals(p, cfg);
  return tsr_plan_sim_step(p, cfg); /* the step from the replay; the closed form kept */
}

void tsr_plan_destroy(tsr_plan *p) {
  if (p) tsr_free(&p->stages);
}

/* ---------------------------------------------------------------- the trainer's check */

void tsr_plan_log_memory(const tsr_config *cfg, const tsr_grid *grid, tsr_plan_backend ran,
                         int64_t step, double in_use, double peak, double host) {
  if (tsr_rank() != 0) return;
  const tsr_plan_grid g = tsr_plan_grid_of(cfg, grid);
  double total = 0, top = 0, gpu = 0, pinned = 0;
  for (int s = 0; s < g.pp; s++) {
    tsr_plan_memory cpu, dev;
    if (tsr_plan_stage_memory(cfg, &g, s, TSR_PLAN_CPU, &cpu) ||
        tsr_plan_stage_memory(cfg, &g, s, TSR_PLAN_GPU, &dev))
      return;
    total = fmax(total, cpu.total);
    top = fmax(top, cpu.peak);
    gpu = fmax(gpu, dev.total);
    pinned = fmax(pinned, dev.host);
  }
  const char *dt = tsr_dtype_name(cfg->train.precision);
  char off[192] = "";
  /* zero.c's page-locked buffers of the optimizer offload and model.c's of the activation
   * offload */
  const int opt = tsr_plan_offload_fraction(cfg) > 0, act = cfg->train.activation_offload;
  if (ran == TSR_PLAN_GPU && host > 0)
    snprintf(off, sizeof off, " | page-locked host memory of the %s: %.3f MB, "
             "planned %.3f MB (%+.2f%% of measured)",
             opt && act ? "optimizer and activation offloads"
             : act      ? "activation offload"
                        : "optimizer offload",
             host / 1e6, pinned / 1e6, 100 * (pinned / host - 1));
  if (ran == TSR_PLAN_GPU) /* device memory: the backend's reserve apart (hardware.reserved_gb) */
    tsr_log("memory at step %lld, most on any rank: in use %.3f MB, peak %.3f MB | planned on "
            "a GPU (%s storage): %.3f MB (%+.2f%% of measured)%s",
            (long long)step, in_use / 1e6, peak / 1e6, dt, gpu / 1e6, 100 * (gpu / in_use - 1),
            off);
  else
    tsr_log("memory at step %lld, most on any rank: in use %.3f MB, peak %.3f MB | planned for "
            "this build (%s storage): %.3f MB in use, %.3f MB peak with the setup's fp32 "
            "initial copy (%+.2f%%, %+.2f%% of measured) | planned on a GPU: %.3f MB",
            (long long)step, in_use / 1e6, peak / 1e6, dt, total / 1e6, top / 1e6, 100 * (total / in_use - 1),
            100 * (top / peak - 1), gpu / 1e6);
}
