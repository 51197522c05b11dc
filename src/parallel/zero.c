/* zero.c — ZeRO stages 0-3 with hybrid sharding, as the model's parameter/gradient
 * provider (see zero.h for the stages).
 *
 * Buckets are the model's units (embedding block, each layer, head block): a unit's
 * gradient is final for the micro-batch when the model releases it, and its reduction
 * starts right then, non-blocking.  Because shards are contiguous ranges of the flat
 * buffer and units are too, unit u meets shard r in count[u][r] elements (often zero):
 * the unit's reduce-scatter and all-gather use those uneven blocks, and this rank's
 * piece of unit u sits at a fixed place in its shard, disjoint from other units'.
 *
 * Stage 2-3 unit buffers live in small pools of slots: gradient slots (a unit's
 * gradient of one micro-batch, then in flight to the shard accumulator) and, at stage
 * 3, parameter slots (a gathered unit, or one being prefetched).  Sizes are fixed at
 * setup; nothing is allocated inside a step. */
#include "zero.h"

#include <math.h>
#include <string.h>

#include "ops/ops.h"
#include "model/optim.h"
#include "core/fault.h"
#include "core/util.h"

/* SLOT_LANDING (host_grads): the reduction has landed, the piece's offloaded part is on
 * its way to the host (h_land, event ev) and is added into h_grad once it is there */
enum { SLOT_FREE = 0, SLOT_IN_USE, SLOT_PENDING, SLOT_READY, SLOT_LANDING };

typedef struct {
  void *buf; /* a unit's gradient (fp32), or its parameters (the storage type) */
  float *land; /* host_grads: where this rank's piece of the unit's reduction lands */
  float *h_land; /* ... the host copy of its offloaded part, page-locked */
  void *ev;      /* ... recorded after that copy */
  int64_t h0, hn; /* ... the copy's first flat index and length */
  int unit;
  int state;
  int refs;
  int64_t age; /* order of posting, to complete the oldest first */
  tsr_comm_handle h;
} slot;

struct tsr_zero {
  const tsr_layout *lay;
  tsr_model *model;
  const tsr_grid *grid;
  int stage;
  tsr_comm *shard_comm;     /* the group a shard is split over (dp for stage 0) */
  tsr_comm *replicate_comm; /* copies of a shard (stages 1-3 with hybrid sharding) */
  int S, shard_rank;
  int64_t n, s0, s1; /* flat length, this rank's shard [s0, s1) */
  int n_units;
  tsr_unit *units;
  size_t *counts; /* [n_units][S]: elements of unit u in shard r */
  int64_t max_unit;
  int last_micro;
  int64_t age;

  /* The shard [a0, a1) (stage 0: all of it) is split at `split`: master, m and v of
   * [a0, split) are op memory, updated by the backend's AdamW; those of [split, a1) (the
   * offloaded part, parallel.offload_fraction of the shard rounded up to 64 elements) are
   * page-locked host memory (h_master, h_m, h_v), updated by the host's AdamW from a host
   * copy of that part of the reduced gradient (h_grad); its new compute copy is formed in
   * h_compute (16-bit storage; fp32 copies the master) and copied to the device.  Without
   * offload split = a1; with the whole shard offloaded split = a0. */
  float *master, *adam_m, *adam_v; /* [a0, split) */
  int master_is_compute;           /* fp32: the master is the compute copy itself */
  int offload;                     /* a part is offloaded (split < a1) */
  int64_t a0, a1, split;
  float *h_master, *h_m, *h_v; /* [split, a1) */
  float *h_grad; /* [hg0, a1): the offloaded part's gradient, from split; with host_grads
                  * from the start of the gradient norm's range that crosses split, if any
                  * (its device part is copied there for the norm) */
  int64_t hg0;
  void *h_compute;
  /* The offloaded update (tsr_zero_update): the host's part of unit u (its offloaded range,
   * upd_range) runs when the next forward first asks for u's parameters (lazy_unit, from
   * start_gather at stage 3, hook_params_acquire below it), in pieces of piece_len
   * elements, each piece's compute copy queued back to the device as soon as it is
   * updated (h2d_ev after the last); lazy_left units still wait (lazy_todo[u]), with these
   * arguments.  Without host_grads each unit's gradient was queued to the host at the
   * update (unit_ev[u] after it; d2h_last the last queued: the next step's clearing of
   * the gradient waits for it).  Stages 1-2 then gather the updated shard a unit at a time
   * as the forward first asks for it (gather_todo[u]) instead of whole. */
  int64_t piece_len;
  void *h2d_ev;
  int lazy_left, gather_left;
  unsigned char *lazy_todo, *gather_todo;
  void **unit_ev, *d2h_last;
  tsr_optim_config lz_o;
  double lz_lr, lz_scale;
  int64_t lz_t;
  /* Stages 2-3 offloaded: the reduced gradient of the offloaded part
   * lives on the host only (h_grad; no incoming on the device, grad_shard only for the
   * device's part [a0, split), grad_len long).  Each unit's reduce-scatter lands in its
   * slot's `land` (the largest piece long); the piece's device part is added into
   * grad_shard there, its offloaded part copied on the copy queue to the slot's h_land,
   * and added into h_grad on the host when the slot is next needed (the backward goes on
   * meanwhile). */
  int host_grads;
  int64_t max_piece;
  float *grad_shard;               /* stages 1-3: reduced gradient of the shard */
  int64_t grad_len;                /* its elements */
  float *incoming;                 /* stages 2-3: landing area of the unit reductions */
  void *param_shard;               /* stage 3: the compute copy of the shard (dt) */
  tsr_dtype dt;                    /* the model's storage type (the compute copy's) */
  size_t esz;                      /* its bytes per element */
  slot gslots[TSR_ZERO_GRAD_SLOTS], pslots[TSR_ZERO_PARAM_SLOTS];
  tsr_comm_handle *unit_handles; /* stages 0-1: one reduction per unit in flight */
  int64_t *norm_ranges;          /* [2 n_norm_ranges]: the flat ranges the gradient norm counts */
  int n_norm_ranges;
  tsr_comm *tied;        /* tied embeddings over pp: this rank and its twin stage */
  int64_t tied_b, tied_e;
  int deferred;          /* the unit reduced only after the tied sum (-1: none) */
  float *deferred_buf;   /* stages 2-3: its gradient, accumulated over the step */
  tsr_zero_memory mem;
};

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* This rank's piece of unit u: [a, b) of the flat buffer (empty when a >= b). */
static void piece(const tsr_zero *z, int u, int64_t *a, int64_t *b) {
  *a = max64(z->units[u].begin, z->s0);
  *b = min64(z->units[u].end, z->s1);
}

static void *compute_shard(tsr_zero *z);
static float *reduced_grads(tsr_zero *z);
static void settle(tsr_zero *z);
static void lazy_unit(tsr_zero *z, int u);
static const size_t *unit_counts(const tsr_zero *z, int u) { return z->counts + (size_t)u * z->S; }

void tsr_zero_pad_layout(tsr_layout *lay, const tsr_parallel_config *par, const tsr_grid *grid) {
  const int64_t S = par->zero_stage == 0 ? grid->dpcp : grid->shard_size;
  lay->n_flat = tsr_zero_padded_length(lay->n_params, S);
}

void tsr_zero_model_options(const tsr_parallel_config *par, int *own_params, int *own_grads) {
  *own_params = par->zero_stage < 3;
  *own_grads = par->zero_stage < 2;
}

int tsr_zero_device_groups(const tsr_parallel_config *par, const tsr_grid *grid,
                           tsr_comm *out[2]) {
  if (par->zero_stage == 0) {
    out[0] = grid->dp_comm;
    return 1;
  }
  out[0] = grid->dp_shard;
  out[1] = grid->dp_replicate;
  return 2;
}

int64_t tsr_zero_padded_length(int64_t n_params, int64_t shard) {
  const int64_t q = 64 * shard;
  return (n_params + q - 1) / q * q;
}

/* ---------------------------------------------------------------- gradient slots */

/* host_grads: this rank's piece [a, b) of a unit's reduction, landed in slot s's `land`:
 * its part below split added into grad_shard on the device, the rest copied to the slot's
 * h_land on the copy queue (after the ops queued so far: the landing included); the slot
 * is then SLOT_LANDING until drain_slot adds the copy into h_grad. */
static void land_on_host(tsr_zero *z, slot *s, int64_t a, int64_t b) {
  const int64_t m = min64(b, z->split), h = max64(a, z->split);
  if (a < m) tsr_ops_acc(z->grad_shard + (a - z->s0), s->land, (long)(m - a));
  s->state = SLOT_FREE;
  if (h >= b) return;
  s->h0 = h;
  s->hn = b - h;
  tsr_ops_copy_async(s->h_land, s->land + (h - a), (size_t)s->hn * sizeof(float), s->ev);
  s->state = SLOT_LANDING;
}

/* A landing slot's copy, once it is on the host, added into h_grad: the same fp32
 * additions as tsr_ops_acc, in the same order for every element (one piece per unit and
 * micro-batch, the micro-batches' in turn). */
static int drain_slot(tsr_zero *z, slot *s) {
  if (s->state != SLOT_LANDING) return 0;
  settle(z); /* h_grad is the last update's until it has run (the forward runs it) */
  tsr_ops_event_sync(s->ev);
  TSR_CALL(tsr_ops_status());
  float *restrict g = z->h_grad + (s->h0 - z->hg0);
  const float *restrict x = s->h_land;
  const long n = (long)s->hn;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (long i = 0; i < n; i++) g[i] += x[i];
  s->state = SLOT_FREE;
  return 0;
}

/* Complete a pending unit reduction and add this rank's piece into the shard (with
 * host_grads the host's part only starts on its way: drain_slot ends it). */
static int finish_grad_slot(tsr_zero *z, slot *s) {
  if (s->state != SLOT_PENDING) return 0;
  TSR_CALL(tsr_comm_wait(&s->h));
  int64_t a, b;
  piece(z, s->unit, &a, &b);
  s->state = SLOT_FREE;
  if (a < b && z->host_grads)
    land_on_host(z, s, a, b);
  else if (a < b)
    tsr_ops_acc(z->grad_shard + (a - z->s0), z->incoming + (a - z->s0), (long)(b - a));
  return 0;
}

/* The gradient slot whose reduction was posted first, or NULL. */
static slot *oldest_pending(tsr_zero *z) {
  slot *old = NULL;
  for (int i = 0; i < TSR_ZERO_GRAD_SLOTS; i++)
    if (z->gslots[i].state == SLOT_PENDING && (!old || z->gslots[i].age < old->age))
      old = &z->gslots[i];
  return old;
}

static int finish_all_grad_slots(tsr_zero *z) {
  /* oldest first, so reductions complete in the order they were posted */
  for (slot *old; (old = oldest_pending(z)) != NULL;) TSR_CALL(finish_grad_slot(z, old));
  for (int i = 0; i < TSR_ZERO_GRAD_SLOTS; i++) TSR_CALL(drain_slot(z, &z->gslots[i]));
  return 0;
}

/* Give MPI a chance to move every operation in flight: Open MPI advances non-blocking
 * collectives only inside MPI calls, so without this a reduction posted early in
 * backward would wait for the final waitall instead of overlapping the layers after it. */
static int progress(tsr_zero *z) {
  int done;
  for (int u = 0; u < z->n_units; u++)
    if (z->unit_handles[u]) TSR_CALL(tsr_comm_test(&z->unit_handles[u], &done));
  for (int i = 0; i < TSR_ZERO_GRAD_SLOTS; i++)
    if (z->gslots[i].state == SLOT_PENDING && z->gslots[i].h) {
      TSR_CALL(tsr_comm_test(&z->gslots[i].h, &done));
      if (done) TSR_CALL(finish_grad_slot(z, &z->gslots[i])); /* lands in the shard now */
    }
  for (int i = 0; i < TSR_ZERO_PARAM_SLOTS; i++)
    if (z->pslots[i].state == SLOT_PENDING) TSR_CALL(tsr_comm_test(&z->pslots[i].h, &done));
  return 0;
}

static float *hook_grads_acquire(void *ctx, int u) {
  tsr_zero *z = ctx;
  if (progress(z)) return NULL;
  if (z->stage < 2) return tsr_model_grads(z->model) + z->units[u].begin;
  if (u == z->deferred) return z->deferred_buf; /* accumulates over the step */
  slot *s = NULL;
  for (int i = 0; i < TSR_ZERO_GRAD_SLOTS && !s; i++)
    if (z->gslots[i].state == SLOT_FREE) s = &z->gslots[i];
  for (int i = 0; i < TSR_ZERO_GRAD_SLOTS && !s; i++) /* a landed one, its copy added */
    if (z->gslots[i].state == SLOT_LANDING) {
      if (drain_slot(z, &z->gslots[i])) return NULL;
      s = &z->gslots[i];
    }
  if (!s) { /* all busy: complete the oldest reduction and take its slot */
    slot *old = oldest_pending(z);
    if (!old || finish_grad_slot(z, old) || drain_slot(z, old)) return NULL;
    s = old;
  }
  s->unit = u;
  s->state = SLOT_IN_USE;
  tsr_ops_zero(s->buf, (size_t)(z->units[u].end - z->units[u].begin) * sizeof(float));
  return s->buf;
}

static int hook_grads_release(void *ctx, int u) {
  tsr_zero *z = ctx;
  if (u == z->deferred) return 0; /* reduced after the tied sum, in reduce_grads */
  const tsr_unit *U = &z->units[u];
  const size_t len = (size_t)(U->end - U->begin);
  if (z->stage < 2) {
    if (!z->last_micro) return 0; /* accumulate locally; reduce after the last micro-batch */
    float *g = tsr_model_grads(z->model) + U->begin;
    if (z->stage == 0)
      return tsr_comm_iall_reduce(z->shard_comm, g, len, TSR_F32, &z->unit_handles[u]);
    int64_t a, b;
    piece(z, u, &a, &b);
    return tsr_comm_ireduce_scatter_v(z->shard_comm, g, z->grad_shard + (a < b ? a - z->s0 : 0),
                                      unit_counts(z, u), TSR_F32, &z->unit_handles[u]);
  }
  for (int i = 0; i < TSR_ZERO_GRAD_SLOTS; i++) {
    slot *s = &z->gslots[i];
    if (s->state != SLOT_IN_USE || s->unit != u) continue;
    int64_t a, b;
    piece(z, u, &a, &b);
    s->state = SLOT_PENDING;
    s->age = z->age++;
    float *dst = z->host_grads ? s->land : z->incoming + (a < b ? a - z->s0 : 0);
    return tsr_comm_ireduce_scatter_v(z->shard_comm, s->buf, dst, unit_counts(z, u), TSR_F32,
                                      &s->h);
  }
  tsr_error("zero: gradient of unit %d released but not acquired", u);
  return TSR_ERR;
}

/* ---------------------------------------------------------------- parameter slots */

/* Stages 1-2 after a lazy update: unit u's pieces of every rank's shard, updated, to every
 * rank (the forward asks for the units in the same order on every rank of the group). */
static int gather_unit(tsr_zero *z, int u) {
  void *unit = tsr_dtype_at(tsr_model_params_mut(z->model), z->dt, z->units[u].begin);
  const size_t *cnt = unit_counts(z, u);
  int64_t at = 0; /* this rank's block of the unit: in place */
  for (int r = 0; r < z->shard_rank; r++) at += (int64_t)cnt[r];
  z->gather_todo[u] = 0;
  z->gather_left--;
  return tsr_comm_all_gather_v(z->shard_comm, tsr_dtype_at(unit, z->dt, at), unit, cnt, z->dt);
}

static slot *find_pslot(tsr_zero *z, int u) {
  for (int i = 0; i < TSR_ZERO_PARAM_SLOTS; i++)
    if (z->pslots[i].state != SLOT_FREE && z->pslots[i].unit == u) return &z->pslots[i];
  return NULL;
}

/* Start gathering unit u into a free slot; NULL when no slot is free. */
static slot *start_gather(tsr_zero *z, int u) {
  lazy_unit(z, u); /* the unit's piece of the last update, if it waits */
  slot *s = NULL;
  for (int i = 0; i < TSR_ZERO_PARAM_SLOTS && !s; i++)
    if (z->pslots[i].state == SLOT_FREE) s = &z->pslots[i];
  if (!s) return NULL;
  int64_t a, b;
  piece(z, u, &a, &b);
  s->unit = u;
  s->refs = 0;
  s->state = SLOT_PENDING;
  void *own = tsr_dtype_at(z->param_shard, z->dt, a < b ? a - z->s0 : 0);
  if (tsr_comm_iall_gather_v(z->shard_comm, own, s->buf, unit_counts(z, u), z->dt, &s->h)) {
    s->state = SLOT_FREE;
    return NULL;
  }
  return s;
}

static const void *hook_params_acquire(void *ctx, int u, int next) {
  tsr_zero *z = ctx;
  if (z->stage < 3) {
    lazy_unit(z, u); /* the unit's range of the last update, if it waits */
    if (z->gather_left && z->gather_todo[u] && gather_unit(z, u)) return NULL;
    return tsr_dtype_at_c(tsr_model_params(z->model), z->dt, z->units[u].begin);
  }
  if (progress(z)) return NULL;
  slot *s = find_pslot(z, u);
  if (!s && !(s = start_gather(z, u))) {
    tsr_error("zero: no free parameter slot for unit %d", u);
    return NULL;
  }
  if (s->state == SLOT_PENDING) {
    if (tsr_comm_wait(&s->h)) return NULL;
    s->state = SLOT_READY;
  }
  s->refs++;
  if (next >= 0 && !find_pslot(z, next)) start_gather(z, next); /* prefetch, best effort */
  return s->buf;
}

static int hook_params_release(void *ctx, int u) {
  tsr_zero *z = ctx;
  if (z->stage < 3) return 0;
  slot *s = find_pslot(z, u);
  TSR_CHECK(s && s->refs > 0, TSR_ERR, "zero: parameters of unit %d released but not acquired",
            u);
  if (--s->refs == 0) s->state = SLOT_FREE; /* freed after use: gathered again when needed */
  return 0;
}

/* ---------------------------------------------------------------- setup */

int tsr_zero_create(tsr_zero **out, const tsr_parallel_config *par, const tsr_layout *lay,
                    tsr_model *model, const tsr_grid *grid) {
  *out = NULL;
  tsr_zero *z = tsr_calloc(1, sizeof *z);
  TSR_CHECK(z, TSR_ERR, "out of memory");
  z->lay = lay;
  z->model = model;
  z->grid = grid;
  z->stage = (int)par->zero_stage;
  /* Stage 0 keeps no shards; its "shard" is only this rank's slice for the norm. */
  z->shard_comm = z->stage == 0 ? grid->dp_comm : grid->dp_shard;
  z->replicate_comm = z->stage == 0 ? NULL : grid->dp_replicate;
  z->S = tsr_comm_size(z->shard_comm);
  z->shard_rank = tsr_comm_rank(z->shard_comm);
  z->n = lay->n_flat;
  z->dt = tsr_model_dtype(model);
  z->esz = tsr_dtype_size(z->dt);
  int rc = TSR_ERR;
  if (z->n % (64 * z->S) != 0) {
    tsr_error("zero: flat length %lld is not padded to 64 x %d (call tsr_zero_pad_layout)",
              (long long)z->n, z->S);
    goto fail;
  }
  const int64_t len = z->n / z->S;
  z->s0 = z->shard_rank * len;
  z->s1 = z->s0 + len;
  z->n_units = tsr_model_n_units(model);
  z->units = tsr_calloc((size_t)z->n_units, sizeof *z->units);
  z->counts = tsr_calloc((size_t)z->n_units * z->S, sizeof(size_t));
  z->unit_handles = tsr_calloc((size_t)z->n_units, sizeof *z->unit_handles);
  z->norm_ranges = tsr_calloc(2 * (size_t)lay->n_tensors + 2, sizeof *z->norm_ranges);
  if (!z->units || !z->counts || !z->unit_handles || !z->norm_ranges) goto fail;
  /* Every element of the model is counted once by the gradient norm: each rank its own
   * shard (dp replicas hold equal shards and stay out of the sum), and of a tensor that
   * several tp ranks hold identically (norms, row-parallel biases, shared KV heads) only
   * copy 0. */
  for (int i = 0; i < lay->n_tensors; i++) {
    const tsr_tensor *t = &lay->tensors[i];
    const int64_t a = max64(t->offset, z->s0), b = min64(t->offset + t->numel, z->s1);
    if (t->tp_copy != 0 || t->tied_copy || a >= b) continue;
    z->norm_ranges[2 * z->n_norm_ranges] = a;
    z->norm_ranges[2 * z->n_norm_ranges + 1] = b;
    z->n_norm_ranges++;
  }
  for (int u = 0; u < z->n_units; u++) {
    z->units[u] = tsr_model_unit(model, u);
    z->max_unit = max64(z->max_unit, z->units[u].end - z->units[u].begin);
    for (int r = 0; r < z->S; r++) {
      const int64_t a = max64(z->units[u].begin, r * len), b = min64(z->units[u].end, (r + 1) * len);
      z->counts[(size_t)u * z->S + r] = a < b ? (size_t)(b - a) : 0;
    }
  }
  if (z->units[z->n_units - 1].end != z->n) {
    tsr_error("zero: the model's units do not cover the flat buffer");
    goto fail;
  }

  const size_t F = sizeof(float);
  const size_t own = (size_t)(z->stage == 0 ? z->n : len);
  z->a0 = z->stage == 0 ? 0 : z->s0;
  z->a1 = z->stage == 0 ? z->n : z->s1;
  const size_t nh = par->offload == TSR_OFFLOAD_OPTIMIZER && tsr_ops_on_device()
                        ? (size_t)tsr_zero_offloaded_length((int64_t)own, par->offload_fraction)
                        : 0;
  const size_t nd = own - nh;
  z->split = z->a1 - (int64_t)nh;
  z->offload = nh > 0;
  if (nh > 0) {
    if (!(z->h_m = tsr_ops_host_alloc(nh * F)) || !(z->h_v = tsr_ops_host_alloc(nh * F)) ||
        !(z->h_master = tsr_ops_host_alloc(nh * F)) ||
        (z->dt != TSR_F32 && !(z->h_compute = tsr_ops_host_alloc(nh * z->esz))))
      goto fail;
    z->mem.host = 3 * nh * F + (z->dt != TSR_F32 ? nh * z->esz : 0);
  }
  if (nd > 0 && (!(z->adam_m = tsr_ops_alloc(nd, F)) || !(z->adam_v = tsr_ops_alloc(nd, F))))
    goto fail;
  z->mem.adam = 2 * own * F;
  z->mem.params = (z->stage < 3 ? (size_t)z->n : (size_t)len) * z->esz;
  z->mem.grads = z->stage < 2 ? (size_t)z->n * F : 0;
  z->host_grads = z->stage >= 2 && nh > 0;
  /* the norm's ranges split as host_grads needs them: in flat order, at most one across
   * split (its start then begins h_grad) */
  z->hg0 = z->split;
  for (int k = 0; k < z->n_norm_ranges; k++) {
    const int64_t ra = z->norm_ranges[2 * k], rb = z->norm_ranges[2 * k + 1];
    if (k > 0 && ra < z->norm_ranges[2 * k - 1]) z->host_grads = 0; /* not in order */
    if (ra < z->split && rb > z->split) z->hg0 = ra;
  }
  if (!z->host_grads) z->hg0 = z->split;
  for (int u = 0; u < z->n_units; u++) {
    int64_t a, b;
    piece(z, u, &a, &b);
    z->max_piece = max64(z->max_piece, b - a);
  }
  if (nh > 0) {
    const size_t hn = (size_t)(z->a1 - z->hg0);
    if (!(z->h_grad = tsr_ops_host_alloc(hn * F))) goto fail;
    z->mem.host += hn * F;
    const long long hook = tsr_fault_int("offload_piece", 0); /* tests: several pieces */
    z->piece_len = hook >= 64 ? hook / 64 * 64 : TSR_ZERO_OFFLOAD_PIECE;
    if (!(z->h2d_ev = tsr_ops_event_create())) goto fail;
    if (!(z->lazy_todo = tsr_calloc((size_t)z->n_units, 1)) ||
        !(z->gather_todo = tsr_calloc((size_t)z->n_units, 1)))
      goto fail;
    if (!z->host_grads) {
      if (!(z->unit_ev = tsr_calloc((size_t)z->n_units, sizeof *z->unit_ev))) goto fail;
      for (int u = 0; u < z->n_units; u++)
        if (!(z->unit_ev[u] = tsr_ops_event_create())) goto fail;
    }
  }
  z->grad_len = z->stage == 0 ? 0 : z->host_grads ? (int64_t)nd : len;
  if (z->grad_len > 0) {
    if (!(z->grad_shard = tsr_ops_alloc((size_t)z->grad_len, F))) goto fail;
    z->mem.grads += (size_t)z->grad_len * F;
  }
  if (z->stage >= 2 && !z->host_grads) {
    if (!(z->incoming = tsr_ops_alloc((size_t)len, F))) goto fail;
    z->mem.unit_bufs += (size_t)len * F;
  }
  if (z->stage >= 2) {
    for (int i = 0; i < TSR_ZERO_GRAD_SLOTS; i++) {
      if (!(z->gslots[i].buf = tsr_ops_alloc((size_t)z->max_unit, F))) goto fail;
      z->mem.unit_bufs += (size_t)z->max_unit * F;
      if (!z->host_grads) continue;
      slot *g = &z->gslots[i];
      if (!(g->land = tsr_ops_alloc((size_t)max64(z->max_piece, 1), F)) ||
          !(g->h_land = tsr_ops_host_alloc((size_t)max64(z->max_piece, 1) * F)) ||
          !(g->ev = tsr_ops_event_create()))
        goto fail;
      z->mem.unit_bufs += (size_t)z->max_piece * F;
      z->mem.host += (size_t)z->max_piece * F;
    }
  }
  if (z->stage >= 3) {
    if (!(z->param_shard = tsr_ops_alloc((size_t)len, z->esz))) goto fail;
    for (int i = 0; i < TSR_ZERO_PARAM_SLOTS; i++) {
      if (!(z->pslots[i].buf = tsr_ops_alloc((size_t)z->max_unit, z->esz))) goto fail;
      z->mem.unit_bufs += (size_t)z->max_unit * z->esz;
    }
  }
  if ((z->stage < 3) != (tsr_model_params(model) != NULL) ||
      (z->stage < 2) != (tsr_model_grads(model) != NULL)) {
    tsr_error("zero: the model's own buffers do not match stage %d", z->stage);
    goto fail;
  }
  /* In fp32 the compute copy of this rank's shard already holds the master values: the
   * master is that memory (16 bytes per parameter with Adam, not 20); in bf16 and fp16 a
   * separate fp32 master. */
  z->master_is_compute = z->dt == TSR_F32 && nd > 0;
  z->mem.master = nh * F; /* the offloaded part's: host memory, allocated above */
  if (z->master_is_compute) {
    z->master = compute_shard(z);
  } else if (nd > 0) {
    if (!(z->master = tsr_ops_alloc(nd, F))) goto fail;
    z->mem.master += nd * F;
  }
  z->deferred = -1;
  tsr_model_hooks hooks = {z, hook_params_acquire, hook_params_release, hook_grads_acquire,
                           hook_grads_release};
  tsr_model_set_hooks(model, &hooks);
  *out = z;
  return 0;
fail:
  tsr_zero_destroy(&z);
  return rc;
}

void tsr_zero_destroy(tsr_zero **zp) {
  if (!zp || !*zp) return;
  tsr_zero *z = *zp;
  if (z->model) tsr_model_set_hooks(z->model, NULL);
  if (z->offload) tsr_ops_sync(); /* no copy in flight from the buffers freed below */
  tsr_ops_event_destroy(&z->h2d_ev);
  tsr_free(&z->lazy_todo);
  tsr_free(&z->gather_todo);
  for (int u = 0; z->unit_ev && u < z->n_units; u++) tsr_ops_event_destroy(&z->unit_ev[u]);
  tsr_free(&z->unit_ev);
  for (int i = 0; i < TSR_ZERO_GRAD_SLOTS; i++) {
    tsr_comm_wait(&z->gslots[i].h);
    tsr_ops_free(&z->gslots[i].buf);
    tsr_ops_free(&z->gslots[i].land);
    tsr_ops_event_destroy(&z->gslots[i].ev); /* after the copy queue is done */
    tsr_ops_host_free(&z->gslots[i].h_land);
  }
  for (int i = 0; i < TSR_ZERO_PARAM_SLOTS; i++) {
    tsr_comm_wait(&z->pslots[i].h);
    tsr_ops_free(&z->pslots[i].buf);
  }
  if (z->unit_handles) tsr_comm_waitall(z->n_units, z->unit_handles);
  tsr_free(&z->unit_handles);
  tsr_free(&z->norm_ranges);
  tsr_free(&z->units);
  tsr_free(&z->counts);
  if (z->master_is_compute)
    z->master = NULL; /* the model's or param_shard's memory */
  else
    tsr_ops_free(&z->master);
  tsr_ops_host_free(&z->h_master);
  tsr_ops_host_free(&z->h_m);
  tsr_ops_host_free(&z->h_v);
  tsr_ops_host_free(&z->h_grad);
  tsr_ops_host_free(&z->h_compute);
  tsr_ops_free(&z->adam_m);
  tsr_ops_free(&z->adam_v);
  tsr_ops_free(&z->grad_shard);
  tsr_ops_free(&z->incoming);
  tsr_ops_free(&z->param_shard);
  tsr_ops_free(&z->deferred_buf);
  tsr_free(zp);
}

int tsr_zero_stage(const tsr_zero *z) { return z->stage; }
int64_t tsr_zero_shard_begin(const tsr_zero *z) { return z->stage == 0 ? 0 : z->s0; }
int64_t tsr_zero_shard_end(const tsr_zero *z) { return z->stage == 0 ? z->n : z->s1; }
float *tsr_zero_master(tsr_zero *z) { return z->offload ? NULL : z->master; }
float *tsr_zero_adam_m(tsr_zero *z) { return z->offload ? NULL : z->adam_m; }
float *tsr_zero_adam_v(tsr_zero *z) { return z->offload ? NULL : z->adam_v; }

int64_t tsr_zero_offloaded_length(int64_t own, double fraction) {
  if (fraction <= 0 || own <= 0) return 0;
  const int64_t n = (int64_t)ceil(fraction * (double)own / 64) * 64;
  return n < own ? n : own;
}

tsr_zero_state tsr_zero_state_of(tsr_zero *z) {
  settle(z); /* the last update, all of it */
  tsr_zero_state st = {{z->master, z->adam_m, z->adam_v},
                       {z->h_master, z->h_m, z->h_v},
                       z->split - z->a0,
                       z->a1 - z->a0};
  return st;
}

void tsr_zero_state_read(const tsr_zero_state *st, int k, float *dst) {
  const size_t nd = (size_t)st->split, nh = (size_t)(st->len - st->split);
  if (nd) tsr_ops_copy(dst, st->dev[k], nd * sizeof(float));
  if (nh) tsr_ops_copy(dst + nd, st->host[k], nh * sizeof(float));
}

void tsr_zero_state_write(const tsr_zero_state *st, int k, const float *src) {
  const size_t nd = (size_t)st->split, nh = (size_t)(st->len - st->split);
  if (nd && src) tsr_ops_copy(st->dev[k], src, nd * sizeof(float));
  if (nd && !src) tsr_ops_zero(st->dev[k], nd * sizeof(float));
  if (nh && src) memcpy(st->host[k], src + nd, nh * sizeof(float));
  if (nh && !src) memset(st->host[k], 0, nh * sizeof(float));
}
tsr_zero_memory tsr_zero_memory_of(const tsr_zero *z) { return z->mem; }
int64_t tsr_zero_grads_on_host(const tsr_zero *z) {
  return z->host_grads ? max64(z->max_piece, 1) : 0;
}
void tsr_zero_poison_grad(tsr_zero *z, float v) {
  settle(z);
  float *g = reduced_grads(z);
  if (z->host_grads && z->split == z->a0)
    g[0] = v; /* page-locked host memory */
  else
    tsr_ops_copy(g, &v, sizeof v);
}

/* ---------------------------------------------------------------- the step */

int tsr_zero_set_tied(tsr_zero *z, tsr_comm *tied, int64_t begin, int64_t end) {
  z->tied = tied;
  z->tied_b = begin;
  z->tied_e = end;
  for (int u = 0; u < z->n_units; u++)
    if (z->units[u].begin <= begin && end <= z->units[u].end) z->deferred = u;
  TSR_CHECK(z->deferred >= 0, TSR_ERR, "zero: the tied range is not inside one unit");
  if (z->stage >= 2) {
    const int64_t len = z->units[z->deferred].end - z->units[z->deferred].begin;
    z->deferred_buf = tsr_ops_alloc((size_t)len, sizeof(float));
    TSR_CHECK(z->deferred_buf, TSR_ERR, "out of memory");
    z->mem.unit_bufs += (size_t)len * sizeof(float);
  }
  return 0;
}

/* The tied sum, then the data-parallel reduction of the deferred unit. */
static int reduce_deferred(tsr_zero *z) {
  const int u = z->deferred;
  const tsr_unit *U = &z->units[u];
  float *g = z->stage < 2 ? tsr_model_grads(z->model) + U->begin : z->deferred_buf;
  if (z->tied) /* else both uses are on this rank (a V's stage 0): nothing to sum */
    TSR_CALL(tsr_comm_all_reduce(z->tied, g + (z->tied_b - U->begin),
                                 (size_t)(z->tied_e - z->tied_b), TSR_F32));
  const size_t len = (size_t)(U->end - U->begin);
  if (z->stage == 0) return tsr_comm_all_reduce(z->shard_comm, g, len, TSR_F32);
  int64_t a, b;
  piece(z, u, &a, &b);
  if (z->host_grads) { /* the slots are all finished: the first one's landing area */
    slot *s = &z->gslots[0];
    TSR_CALL(tsr_comm_reduce_scatter_v(z->shard_comm, g, s->land, unit_counts(z, u), TSR_F32));
    if (a < b) land_on_host(z, s, a, b);
    return drain_slot(z, s);
  }
  float *dst = z->stage == 1 ? z->grad_shard : z->incoming;
  TSR_CALL(tsr_comm_reduce_scatter_v(z->shard_comm, g, dst + (a < b ? a - z->s0 : 0),
                                     unit_counts(z, u), TSR_F32));
  if (z->stage >= 2 && a < b)
    tsr_ops_acc(z->grad_shard + (a - z->s0), z->incoming + (a - z->s0), (long)(b - a));
  return 0;
}

int tsr_zero_begin_step(tsr_zero *z) {
  /* a lazy update's gradient copies to the host (stages 0-1) are read before it is cleared */
  if (z->lazy_left && z->d2h_last) tsr_ops_event_wait(z->d2h_last);
  tsr_model_zero_grads(z->model);
  if (z->deferred_buf)
    tsr_ops_zero(z->deferred_buf,
           (size_t)(z->units[z->deferred].end - z->units[z->deferred].begin) * sizeof(float));
  if (z->grad_shard) tsr_ops_zero(z->grad_shard, (size_t)z->grad_len * sizeof(float));
  /* with the last update still to run (lazy), each piece is cleared once it is used */
  if (z->host_grads && !z->lazy_left)
    memset(z->h_grad, 0, (size_t)(z->a1 - z->hg0) * sizeof(float));
  return 0;
}

int tsr_zero_begin_micro(tsr_zero *z, int last) {
  z->last_micro = last;
  return finish_all_grad_slots(z); /* the previous micro-batch's reductions land first */
}

int tsr_zero_reduce_grads(tsr_zero *z) {
  TSR_CALL(tsr_comm_waitall(z->n_units, z->unit_handles));
  TSR_CALL(finish_all_grad_slots(z)); /* the incoming area is free again */
  if (z->deferred >= 0) TSR_CALL(reduce_deferred(z));
  if (!(z->stage >= 1 && z->replicate_comm && tsr_comm_size(z->replicate_comm) > 1)) return 0;
  if (!z->host_grads)
    return tsr_comm_all_reduce(z->replicate_comm, z->grad_shard, (size_t)(z->s1 - z->s0),
                               TSR_F32);
  /* the device's part on the device, the offloaded part's over host memory (MPI): each
   * element the same sum of the replicas' values */
  if (z->grad_len > 0)
    TSR_CALL(tsr_comm_all_reduce(z->replicate_comm, z->grad_shard, (size_t)z->grad_len,
                                 TSR_F32));
  return tsr_comm_all_reduce(z->replicate_comm, z->h_grad + (z->split - z->hg0),
                             (size_t)(z->a1 - z->split), TSR_F32);
}

/* The reduced gradient of this rank's shard (stage 0: the full buffer). */
static float *reduced_grads(tsr_zero *z) {
  if (z->stage == 0) return tsr_model_grads(z->model);
  return z->host_grads && z->split == z->a0 ? z->h_grad : z->grad_shard;
}
float *tsr_zero_reduced_grads(tsr_zero *z) {
  settle(z);
  return reduced_grads(z);
}

int tsr_zero_grad_norm(tsr_zero *z, double *norm) {
  /* This rank's ranges (z->norm_ranges, from tsr_zero_create), then sums in rank order,
   * so the norm is bitwise the same everywhere. */
  const float *g = reduced_grads(z) - (z->stage == 0 ? 0 : z->s0); /* indexed by flat offset */
  double dp_total, total;
  /* with host_grads the ranges below hg0 on the device, the rest on the host (the device
   * part of a range across split copied to h_grad first), each added in order: the same
   * bits as on the device alone, every backend summing in one order (ops/sumsq_order.h) */
  double local;
  if (!z->host_grads) {
    local = tsr_ops_sumsq_ranges(g, z->norm_ranges, z->n_norm_ranges); /* one sync on a GPU */
  } else {
    int k = 0;
    while (k < z->n_norm_ranges && z->norm_ranges[2 * k + 1] <= z->hg0) k++;
    local = k > 0 ? tsr_ops_sumsq_ranges(z->grad_shard - z->s0, z->norm_ranges, k) : 0.0;
    if (z->hg0 < z->split)
      tsr_ops_read(z->h_grad, z->grad_shard + (z->hg0 - z->s0),
                   (size_t)(z->split - z->hg0) * sizeof(float));
    for (; k < z->n_norm_ranges; k++)
      local += tsr_ops_host_sumsq_ranges(z->h_grad - z->hg0, z->norm_ranges + 2 * k, 1);
  }
  TSR_CALL(tsr_comm_sum_ordered(z->shard_comm, local, &dp_total));
  double tp_total;
  TSR_CALL(tsr_comm_sum_ordered(z->grid->tp_comm, dp_total, &tp_total));
  TSR_CALL(tsr_comm_sum_ordered(z->grid->pp_comm, tp_total, &total)); /* stages: disjoint */
  *norm = sqrt(total);
  return 0;
}

/* Where the compute copy of this rank's master shard lives (the model owns its parameters
 * below stage 3: tsr_zero_create sees to it). */
static void *compute_shard(tsr_zero *z) {
  void *p = tsr_model_params_mut(z->model);
  if (z->stage == 0) return p;
  return z->stage < 3 ? tsr_dtype_at(p, z->dt, z->s0) : z->param_shard;
}

/* Stages 1-2: every rank's compute shard to every rank (stage 3 gathers per unit), in the
 * storage type: 2 bytes per parameter in bf16 and fp16. */
static int gather_params(tsr_zero *z) {
  if (z->stage == 0 || z->stage == 3) return 0;
  void *p = tsr_model_params_mut(z->model);
  return tsr_comm_all_gather(z->shard_comm, tsr_dtype_at(p, z->dt, z->s0), p,
                             (size_t)(z->s1 - z->s0), z->dt);
}

/* The compute copy of the offloaded part [split, a1): formed on the host, copied to the
 * device. */
static void offload_to_compute(tsr_zero *z) {
  const int64_t nd = z->split - z->a0, nh = z->a1 - z->split;
  const void *src = z->h_master;
  if (z->dt != TSR_F32) {
    tsr_ops_host_cast(z->dt, z->h_compute, TSR_F32, z->h_master, (long)nh);
    src = z->h_compute;
  }
  tsr_ops_copy(tsr_dtype_at(compute_shard(z), z->dt, nd), src, (size_t)nh * z->esz);
}

int tsr_zero_publish_params(tsr_zero *z) {
  settle(z);
  void *c = compute_shard(z);
  const int64_t nd = z->split - z->a0;
  if (c && nd > 0 && !z->master_is_compute) tsr_model_to_compute(z->model, c, z->master, nd);
  if (c && z->offload) offload_to_compute(z);
  if (z->gather_left) memset(z->gather_todo, 0, (size_t)z->n_units), z->gather_left = 0;
  return gather_params(z);
}

/* The host's AdamW over [p, q) of the offloaded part [split, a1), its gradient in h_grad,
 * in pieces of piece_len; with host_grads each piece's gradient is cleared once used (the
 * next step accumulates there meanwhile).  Each piece's new compute copy (fp32: the
 * master) is queued to the device right behind its update, so the copies overlap the
 * host's work; the ops queued from then on wait for the last. */
static void host_update(tsr_zero *z, int64_t p, int64_t q) {
  const int64_t P = z->piece_len, n = (q - p + P - 1) / P;
  for (int64_t k = 0; k < n; k++) {
    const int64_t a = p + k * P, b = min64(q, a + P), i = a - z->split;
    float *g = z->h_grad + (a - z->hg0);
    void *hc = tsr_dtype_at(z->h_compute, z->dt, i); /* NULL in fp32 */
    tsr_optim_adamw_range_host(&z->lz_o, z->lay, a, b, z->h_master + i, z->h_m + i, z->h_v + i,
                               g, z->lz_lr, z->lz_t, z->lz_scale, hc, z->dt);
    if (z->host_grads) memset(g, 0, (size_t)(b - a) * sizeof(float));
    tsr_ops_copy_async(tsr_dtype_at(compute_shard(z), z->dt, a - z->a0),
                       hc ? hc : (void *)(z->h_master + i), (size_t)(b - a) * z->esz,
                       z->h2d_ev);
  }
  tsr_ops_event_wait(z->h2d_ev);
}

/* Unit u's part of the offloaded range [split, a1) of this rank's shard (stage 0: of the
 * whole buffer), [a, b), empty when a >= b. */
static void upd_range(const tsr_zero *z, int u, int64_t *a, int64_t *b) {
  if (z->stage == 0)
    *a = z->units[u].begin, *b = z->units[u].end;
  else
    piece(z, u, a, b);
  *a = max64(*a, z->split);
  *b = min64(*b, z->a1);
}

/* The lazy update of unit u's range, if it still waits: its gradient on the host (without
 * host_grads: its copy waited for), the host's AdamW, the compute copy back to the device
 * (the ops that follow, the gather or the layer, wait for it). */
static void lazy_unit(tsr_zero *z, int u) {
  if (!z->lazy_left || !z->lazy_todo[u]) return;
  int64_t a, b;
  upd_range(z, u, &a, &b);
  if (z->unit_ev) tsr_ops_event_sync(z->unit_ev[u]);
  host_update(z, a, b);
  z->lazy_todo[u] = 0;
  z->lazy_left--;
}

/* Whatever of the last update still waits, now. */
static void settle(tsr_zero *z) {
  for (int u = 0; u < z->n_units && z->lazy_left; u++) lazy_unit(z, u);
}

int tsr_zero_update(tsr_zero *z, const tsr_optim_config *o, double lr, int64_t t,
                    double grad_scale) {
  settle(z);
  const int64_t a = z->a0, s = z->split;
  const float *g = reduced_grads(z);
  void *c = compute_shard(z);
  /* offloaded: the host's part of each unit is left for when the next forward first
   * needs the unit, and at stages 1-2 each unit's gather then too (the device's part
   * included); each unit's gradient starts to the host now (there already with
   * host_grads), so that the copies run beside the device's AdamW */
  if (z->offload) {
    tsr_ops_event_sync(z->h2d_ev); /* the last copies back are done */
    z->lz_o = *o;
    z->lz_lr = lr, z->lz_t = t, z->lz_scale = grad_scale;
    z->d2h_last = NULL;
    z->gather_left = 0;
    for (int u = 0; u < z->n_units; u++) {
      int64_t pa, pb;
      upd_range(z, u, &pa, &pb);
      z->lazy_todo[u] = pb > pa;
      z->lazy_left += z->lazy_todo[u];
      z->gather_todo[u] = z->stage == 1 || z->stage == 2; /* every unit, pieces or not */
      z->gather_left += z->gather_todo[u];
      if (pb <= pa || z->host_grads) continue;
      tsr_ops_copy_async(z->h_grad + (pa - z->hg0), g + (pa - a),
                         (size_t)(pb - pa) * sizeof(float), z->unit_ev[u]);
      z->d2h_last = z->unit_ev[u];
    }
  }
  /* the device's part: the compute copy is refreshed inside AdamW's pass, no second pass
   * over the shard */
  if (s > a)
    tsr_optim_adamw_range(o, z->lay, a, s, z->master, z->adam_m, z->adam_v, g, lr, t,
                          grad_scale, z->master_is_compute ? NULL : c, z->dt);
  return z->offload ? 0 : gather_params(z);
}

/* ---------------------------------------------------------------- checkpoints */

int tsr_zero_gather_state(tsr_zero *z, float *master, float *m, float *v) {
  const size_t len = (size_t)(z->a1 - z->a0);
  float *full[3] = {master, m, v};
  const tsr_zero_state st = tsr_zero_state_of(z);
  float *own = NULL; /* stages 1-3: the shard in one piece of op memory, then gathered */
  if (z->stage > 0 && !(own = tsr_ops_alloc(len, sizeof(float)))) return TSR_ERR;
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++) {
    if (!full[i]) continue;
    if (z->stage == 0) {
      tsr_zero_state_read(&st, i, full[i]);
      continue;
    }
    tsr_zero_state_read(&st, i, own);
    rc = tsr_comm_all_gather(z->shard_comm, own, full[i], len, TSR_F32);
  }
  tsr_ops_sync();
  tsr_ops_free(&own);
  return rc;
}

int tsr_zero_scatter_state(tsr_zero *z, const float *master, const float *m, const float *v) {
  const float *full[3] = {master, m, v};
  const tsr_zero_state st = tsr_zero_state_of(z); /* settles a waiting update, then overwritten */
  for (int i = 0; i < 3; i++) tsr_zero_state_write(&st, i, full[i] ? full[i] + z->a0 : NULL);
  return tsr_zero_publish_params(z);
}
