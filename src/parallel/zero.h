/* zero.h — data parallelism with ZeRO stages 0-3 and hybrid sharding.
 *
 * The flat parameter buffer (layout order, n_flat elements, padded to a multiple of
 * 64 x shard_size) is cut into shard_size contiguous shards (docs/sharding.md "ZeRO shards"): shard s
 * owns [s n/S, (s+1) n/S).  The shard group is dp_shard (shard_scope); copies of a
 * shard on other nodes form dp_replicate.
 *
 *   stage 0  every rank holds everything; gradients all-reduced over dp
 *   stage 1  fp32 master + Adam m, v only for the own shard; gradients reduce-scattered
 *            once per step, parameters all-gathered after the update
 *   stage 2  + only the gradient shard is kept: each micro-batch's unit gradients are
 *            reduce-scattered as backward produces them, into the shard accumulator
 *   stage 3  + parameters sharded: a unit is all-gathered before use (the next one
 *            prefetched) and its buffer released after
 * Gradient reductions are non-blocking, one per model unit (the buckets), started
 * the moment backward is done with the unit, so they overlap the rest of backward.
 * With dp_replicate > 1 (hybrid), the reduced shard is then all-reduced across it.
 *
 * The model gets its parameter and gradient buffers through tsr_model_hooks (model.h). */
#ifndef TSR_ZERO_H
#define TSR_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "comm/grid.h"
#include "model/layout.h"
#include "model/model.h"

typedef struct tsr_zero tsr_zero;

/* Bytes this rank holds for training state, by kind, as allocated. */
typedef struct {
  size_t params;     /* compute-precision parameters (full, or the shard at stage 3) */
  size_t grads;      /* gradients: full buffer (stages 0-1) or shard accumulator */
  size_t master;     /* fp32 master weights */
  size_t adam;       /* Adam m and v */
  size_t unit_bufs;  /* stage 2-3 per-unit gathering / reduction buffers */
  /* parallel.offload = 'optimizer' on a device: master and Adam's m and v (counted above
   * but not in op memory) and the gradient and compute-copy staging, in page-locked host
   * memory; 0 otherwise */
  size_t host;
} tsr_zero_memory;

/* What the model must own for this config's stage: its full parameter buffer below
 * stage 3, its full gradient buffer below stage 2 (the rest ZeRO provides through the
 * model's hooks).  Create the model with these options; pad the layout with
 * tsr_zero_pad_layout first. */
void tsr_zero_model_options(const tsr_parallel_config *par, int *own_params, int *own_grads);
/* The groups ZeRO moves device memory over: the whole dp group at stage 0, else the shard
 * and replicate halves.  Returns how many (written to out). */
int tsr_zero_device_groups(const tsr_parallel_config *par, const tsr_grid *grid,
                           tsr_comm *out[2]);
int tsr_zero_create(tsr_zero **out, const tsr_parallel_config *par, const tsr_layout *lay,
                    tsr_model *model, const tsr_grid *grid);
void tsr_zero_destroy(tsr_zero **z);
/* Pads lay->n_flat to a multiple of 64 x the shard size this config uses. */
void tsr_zero_pad_layout(tsr_layout *lay, const tsr_parallel_config *par, const tsr_grid *grid);
/* That padded length for n_params elements and a shard group of `shard` ranks (also what
 * the planner, plan.c, counts). */
int64_t tsr_zero_padded_length(int64_t n_params, int64_t shard);
/* Unit buffers of stages 2-3, each as long as the largest unit: gradient slots (the tied
 * embedding held, the unit in backward, one in flight) and, at stage 3, parameter slots
 * (the tied embedding, the current unit, the prefetched one, one spare). */
enum { TSR_ZERO_GRAD_SLOTS = 3, TSR_ZERO_PARAM_SLOTS = 4 };
/* The host's AdamW of the offloaded update (parallel.offload) runs in pieces of this many
 * elements (8 MB of fp32 gradient), each piece's compute copy queued back to the device as
 * soon as it is updated. */
enum { TSR_ZERO_OFFLOAD_PIECE = 1 << 21 };

int tsr_zero_stage(const tsr_zero *z);
int64_t tsr_zero_shard_begin(const tsr_zero *z); /* this rank's shard of the flat buffer */
int64_t tsr_zero_shard_end(const tsr_zero *z);
/* fp32 master of the shard (stage 0: all of it), Adam m and v; NULL when a part of the
 * shard is offloaded (parallel.offload): tsr_zero_state_of then. */
float *tsr_zero_master(tsr_zero *z);
float *tsr_zero_adam_m(tsr_zero *z);
float *tsr_zero_adam_v(tsr_zero *z);
/* The elements of a shard of `own` that parallel.offload_fraction = fraction offloads: the
 * fraction rounded up to a multiple of 64, at most own (0 for fraction 0). */
int64_t tsr_zero_offloaded_length(int64_t own, double fraction);
/* The optimizer state of the shard (k = 0 master, 1 m, 2 v), its elements 0 .. len-1
 * (flat tsr_zero_shard_begin + i) in two parts: [0, split) in op memory at dev[k], the
 * offloaded part [split, len) in page-locked host memory at host[k] (element split is
 * host[k][0]).  Without offload split = len; with the whole shard offloaded split = 0. */
typedef struct {
  float *dev[3], *host[3];
  int64_t split, len;
} tsr_zero_state;
tsr_zero_state tsr_zero_state_of(tsr_zero *z);
/* State k, all len elements, into dst (host or op memory; queued copies on a device:
 * tsr_ops_sync before the host reads dst), or from src (NULL: zeros). */
void tsr_zero_state_read(const tsr_zero_state *st, int k, float *dst);
void tsr_zero_state_write(const tsr_zero_state *st, int k, const float *src);
tsr_zero_memory tsr_zero_memory_of(const tsr_zero *z);
/* Tied embeddings across pipeline stages: the flat range [begin, end) (embed.weight on the
 * first stage, its copy on the last) holds one micro-batch-summed gradient that must be
 * added to its twin's over `tied` (those two ranks) before the data-parallel reduction.
 * The unit holding it is then reduced in tsr_zero_reduce_grads instead of as backward
 * releases it.  tied = NULL: no twin (stage 0 of a V placement holds the embedding and the head's use
 * of it), only the deferral, so that the two uses may acquire and release it apart. */
int tsr_zero_set_tied(tsr_zero *z, tsr_comm *tied, int64_t begin, int64_t end);
/* After tsr_zero_reduce_grads: the reduced gradient of the shard (stage 0: all of it); with
 * tsr_zero_grads_on_host, that of the device's part of the shard (op memory), or page-locked
 * host memory when the whole shard is offloaded. */
float *tsr_zero_reduced_grads(tsr_zero *z);
/* Stages 2-3 offloaded (parallel.offload): the reduced gradient of the offloaded part is
 * accumulated on the host as each unit's reduction lands (with hybrid replicas, then
 * all-reduced across them over host memory), the device keeping a gradient shard only for
 * its own part; returns the elements of a gradient
 * slot's landing area in op memory (the largest piece of a unit in this rank's shard, at
 * least 1).  0 otherwise. */
int64_t tsr_zero_grads_on_host(const tsr_zero *z);
/* The shard's first reduced gradient element := v, wherever it lives (fault injection). */
void tsr_zero_poison_grad(tsr_zero *z, float v);

/* A step: begin_step, then for each micro-batch begin_micro(last) + model fwd_bwd,
 * then reduce_grads, grad_norm, update. */
int tsr_zero_begin_step(tsr_zero *z);
int tsr_zero_begin_micro(tsr_zero *z, int last);
int tsr_zero_reduce_grads(tsr_zero *z);
/* Global L2 norm of the reduced gradient, each element counted once; bitwise the same
 * on every rank. */
int tsr_zero_grad_norm(tsr_zero *z, double *norm);
/* AdamW on this rank's shard (optimizer step t, 1-based), refreshing the shard's
 * compute-precision copy in the same pass, then the all-gather of stages 1-2.  With
 * parallel.offload the host's part is left to the next forward: unit u's part is updated
 * and copied to the device when that forward first asks for u (at stages 1-2 u is then
 * gathered alone), so the host's AdamW overlaps the device computing the units before
 * it; anything that reads the state (tsr_zero_state_of, the gathers, a load) completes
 * what is left first. */
int tsr_zero_update(tsr_zero *z, const tsr_optim_config *o, double lr, int64_t t,
                    double grad_scale);
/* Master shard -> compute-precision parameters everywhere they are needed. */
int tsr_zero_publish_params(tsr_zero *z);

/* Whole-model state for checkpoints: gather the shards into full n_flat buffers (any of
 * the three may be NULL), or take this rank's shard from full buffers. Collective. */
int tsr_zero_gather_state(tsr_zero *z, float *master, float *m, float *v);
int tsr_zero_scatter_state(tsr_zero *z, const float *master, const float *m, const float *v);

#endif
