/* model.h — forward and backward of the decoder-only transformer (llama | gpt2) on one
 * pipeline stage.  The model owns the compute copy of the parameters and the activation
 * buffers (both in the run's storage type, train.precision: fp32, bf16 or fp16), the fp32
 * gradient buffer and the fp32 statistics, all allocated once at creation for
 * micro-batches of `micro_batch` sequences of seq_len tokens.  It calls only `ops`.
 *
 * Model definition (docs/model.md "Block"): pre-norm blocks x += attn(norm(x)); x += mlp(norm(x));
 * final norm; LM head; mean cross-entropy over all B*T targets. */
#ifndef TSR_MODEL_H
#define TSR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/config.h"
#include "layout.h"
#include "ops/ops.h"

typedef struct tsr_model tsr_model;

/* What the model is built from: its definition and the few settings of other groups that
 * shape its buffers and kernels.  tsr_model_spec_of derives it from a run's configuration;
 * nothing else of the configuration reaches the model. */
typedef struct {
  tsr_model_config model;
  tsr_dtype precision;       /* train.precision: the storage type */
  tsr_recompute recompute;   /* train.recompute */
  int64_t micro_batch;       /* train.micro_batch: sequences per micro-batch */
  int64_t xent_chunk_tokens; /* train.xent_chunk_tokens: 0 = unfused head */
  int sequence_parallel;     /* parallel.sequence_parallel (with tp > 1) */
  int split_backward;        /* the schedule runs W after B (a zero-bubble schedule) */
  int document_mask;         /* data.document_mask */
  int64_t eos_id;            /* data.eos_id: the end-of-document id; < 0: none */
  int64_t cp;                /* parallel.cp: ranks a sequence is split over (0, 1: none) */
  tsr_cp_comm cp_comm;       /* parallel.cp_comm: ring (p2p) or all-to-all (a2a) attention */
  int activation_offload;    /* train.activation_offload: stored activations to the host
                              * (a device backend only: the model ignores it on the CPU) */
} tsr_model_spec;
void tsr_model_spec_of(tsr_model_spec *spec, const tsr_config *cfg);

/* Every buffer tsr_model_create_opt allocates besides the parameters and gradients, in
 * elements, for one tp rank of a pipeline stage.  The model sizes its allocations from it
 * and the planner (plan.c) its memory figures, so the two cannot drift apart.  A count of
 * 0 means the buffer is absent (tokens off the first stage, the head off the last, the
 * shared-KV buffers without KV sharing, the sequence-parallel ones without it). */
typedef struct { /* one layer's activation set */
  int64_t norm1, norm2, qkv, atty, lse, h, fc, norm1_mean, norm1_rstd, norm2_mean, norm2_rstd, act;
} tsr_model_layer_sizes;
typedef struct {
  /* one tp rank's sizes: H, KV, F, V are its query heads, KV heads, MLP width and
   * vocabulary rows; N = B * T tokens, of which Ns in the residual stream (sequence
   * parallel: N / tp).  With context parallelism T is a cp rank's tokens of a sequence,
   * seq_len / cp, in its two chunks of Tc = T / 2 */
  int64_t B, T, C, H, KV, hd, F, V, N, Ns, qkv_dim, fc_dim;
  int64_t cp, Tc; /* cp ranks (1: none); chunk length */
  int cp_a2a;     /* the all-to-all attention (else the ring) */
  /* cp > 1: the attention's exchange buffers and accumulators, in the storage type and in
   * fp32 (model_cp.c) */
  int64_t cp_dt, cp_f32;
  int gpt2, sp, kv_shared, first, last, layers_per_chunk;
  tsr_recompute recompute;
  int64_t kv_seg; /* one KV head's wk, wv rows (+ bk, bv) */
  tsr_model_layer_sizes layer; /* which of them each layer owns: the recompute mode */
  int64_t resid, tokens;                            /* per slot (tokens: int32) */
  int64_t docs; /* per slot, document masking: the rows' document starts (int32) */
  int64_t final_norm, final_mean, final_rstd, logits; /* per slot, the head */
  /* the fused head (train.xent_chunk_tokens > 0; logits then 0): xent_chunk rows per
   * chunk (at most N), the one chunk's logits (shared), the targets kept per slot until
   * the backward (int32) */
  int64_t xent_chunk, head_scratch, head_targets;
  int64_t tmp_nc, d_resid, d_nc, d_atty, d_qkv, d_fc, d_act; /* gradient scratch */
  int64_t kv_keep, kv_sum;
  int64_t d_full, tmp_s, d_shard, norm_dw, norm_db;
  int64_t xent;      /* each of the three loss statistics (double) */
  int64_t act_elems; /* a chunk's input/output activation (tsr_model_act_elems) */
  /* split backward (the zero-bubble schedules, whose W pass comes after B): what B leaves
   * for W, per slot: each layer's GEMM output gradients (stored) and norm weight and bias
   * gradients (fp32), the embedding's input gradient, the final norm's weight gradients */
  int split;
  int64_t w_dy, w_norm, w_embed, w_head;
  /* activation offload (train.activation_offload on a device): every layer's stored set
   * (the groups the recompute mode keeps, and its input from the residual stream) lives in
   * page-locked host memory, one block of offload_set bytes a layer and slot; the device
   * keeps a window of offload_window such blocks, shared by all slots, and per slot only
   * the chunk's output (resid is then Ns * C) */
  int act_offload;
  int64_t offload_window, offload_set;
} tsr_model_sizes;
/* Stored activation sets a device keeps in its window under the activation offload: the
 * layer being computed and the one being copied to or from the host. */
#define TSR_MODEL_OFFLOAD_WINDOW 2

/* The sizes for `spec` on a tp rank of a tp-way group, on a stage that is the first and/or
 * the last, with layers_per_chunk layers per chunk. */
void tsr_model_sizes_of(tsr_model_sizes *s, const tsr_model_spec *spec, int tp, int first,
                        int last, int layers_per_chunk);
/* Bytes of one activation slot and of the buffers outside the slots (the recompute scratch,
 * gradient scratch, loss statistics), with stored activations, logits and activation
 * gradients at act_bytes per element (the storage type's size) and statistics and the
 * shared-KV / sequence-parallel parameter gradients in fp32. */
double tsr_model_slot_bytes(const tsr_model_sizes *s, double act_bytes);
double tsr_model_workspace_bytes(const tsr_model_sizes *s, double act_bytes);
/* The activation offload's device window (offload_window blocks) and one slot's host
 * blocks (layers_per_chunk of them), in bytes; 0 without the offload. */
double tsr_model_offload_window_bytes(const tsr_model_sizes *s);
double tsr_model_offload_host_slot_bytes(const tsr_model_sizes *s);

/* Units: the model's parameters in forward order, each a contiguous range of the flat
 * buffer: unit 0 = everything before layer 0 (embed, pos_embed), unit 1 + l = layer l,
 * unit L + 1 = everything after the last layer (final_norm, lm_head, and the padding up
 * to n_flat).  ZeRO works in units: it gathers a unit's parameters before use and
 * reduces a unit's gradients as soon as backward has finished with them. */
typedef struct {
  int64_t begin, end; /* [begin, end) of the flat buffer */
} tsr_unit;

/* Where a unit's parameters and gradients live.  Without hooks the model uses its own
 * full buffers.  With hooks (zero.c) it asks for a unit's buffers when it needs them
 * and says when it is done:
 *   params_acquire(u, next): a pointer to unit u's parameters (element at flat offset o
 *       is at ptr[o - begin]); `next` is the unit the model will want after this one
 *       (-1: none) so the provider can prefetch it;
 *   params_release(u): not needed again until the next acquire;
 *   grads_acquire(u): where to accumulate unit u's gradient for this micro-batch;
 *   grads_release(u): unit u's gradient of this micro-batch is complete.
 * Acquires and releases come in pairs; a unit may be acquired again later in the same
 * micro-batch (backward after forward, recompute).  Every hook returns NULL / nonzero
 * on failure, which the model propagates. */
typedef struct {
  void *ctx;
  const void *(*params_acquire)(void *ctx, int unit, int next);
  int (*params_release)(void *ctx, int unit);
  float *(*grads_acquire)(void *ctx, int unit);
  int (*grads_release)(void *ctx, int unit);
} tsr_model_hooks;

/* own_params / own_grads: allocate full flat buffers for them (without them, hooks must
 * be set before the first forward). */
int tsr_model_create(tsr_model **out, const tsr_model_spec *spec, const tsr_layout *lay);
int tsr_model_create_ext(tsr_model **out, const tsr_model_spec *spec, const tsr_layout *lay,
                         int own_params, int own_grads);
/* The general form: `lay` may be any (pipeline stage, tp rank) part (tsr_layout_create_part)
 * with tp its tp group (NULL: none); n_slots activation sets are kept for micro-batches in
 * flight (a pipeline schedule's peak). */
typedef struct {
  int own_params, own_grads;
  tsr_comm *tp;
  int n_slots;
  tsr_comm *cp; /* the cp group (spec.cp ranks); NULL without context parallelism */
} tsr_model_options;
int tsr_model_create_opt(tsr_model **out, const tsr_model_spec *spec, const tsr_layout *lay,
                         const tsr_model_options *opt);
void tsr_model_destroy(tsr_model **m);
void tsr_model_set_hooks(tsr_model *m, const tsr_model_hooks *hooks);
int tsr_model_n_units(const tsr_model *m);
tsr_unit tsr_model_unit(const tsr_model *m, int u);

/* The compute copy of the parameters (flat, layout order, in tsr_model_dtype; NULL when
 * not owned).  tsr_model_set_params stores fp32 master values into it (rounded to the
 * storage type). */
const void *tsr_model_params(const tsr_model *m);
void *tsr_model_params_mut(tsr_model *m);
void tsr_model_set_params(tsr_model *m, const float *master);
/* fp32 gradient, flat, layout order (NULL when not owned); accumulated by
 * tsr_model_fwd_bwd. */
float *tsr_model_grads(tsr_model *m);
void tsr_model_zero_grads(tsr_model *m);
/* n fp32 values stored into dst in the storage type (rounded, or a copy in fp32). */
void tsr_model_to_compute(const tsr_model *m, void *dst, const float *src, int64_t n);
tsr_dtype tsr_model_dtype(const tsr_model *m); /* that storage type */

/* Document masking (data.document_mask, docs/model.md "Document masking"): the
 * end-of-document id that splits the input tokens into documents; data.eos_id when the
 * deck sets it, else the session's, from the shards' tokenizer.  Needed before the first
 * forward of a masked model. */
void tsr_model_set_eos(tsr_model *m, int32_t eos);

/* Forward + backward of one micro-batch (micro_batch sequences): inputs and targets are
 * [micro_batch * seq_len].  *loss = mean cross-entropy of this micro-batch.
 * grads += dloss * d(mean loss)/d(params).  For accumulation over k micro-batches
 * of one optimizer step, pass dloss = 1/k. */
int tsr_model_fwd_bwd(tsr_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                      double *loss);
/* Forward only: *loss = mean cross-entropy (evaluation); loss NULL: no loss wanted (the
 * fused head then computes no logits, tsr_model_row_logits does). */
int tsr_model_forward(tsr_model *m, const int32_t *inputs, const int32_t *targets, double *loss);

/* Pipeline stages.  The stage's layers form n_chunks chunks (virtual stages).  Forward of
 * chunk c for one micro-batch stores its activations in `slot` (in [0, n_slots)); x_in
 * is the chunk's input activation [micro_batch*seq_len, d_model], except for the first
 * stage's chunk 0, which embeds `inputs`.  With document masking every chunk takes the
 * micro-batch's `inputs` (host memory), which the document starts of its attention and
 * positions come from; they stay in the slot for its backward.  The last stage's last chunk computes the mean
 * loss on `targets` (and, with grad, the gradient of dloss * loss w.r.t. its logits) and
 * adds it to *loss_acc, a double of op memory (NULL: not wanted): on a GPU the host reads
 * it when it next synchronises, not once per micro-batch.  With the fused head
 * (train.xent_chunk_tokens > 0) and grad, the loss is added by that slot's backward (its
 * B pass when split), which computes the logits once for the loss and the gradients.
 * Its output is tsr_model_chunk_output(slot).  Backward of (chunk, slot) takes the
 * gradient of the chunk's output (NULL for the last chunk) and leaves the gradient of its
 * input in tsr_model_input_grad (overwritten by the next backward).  A slot is free again
 * once its backward has run. */
int tsr_model_n_chunks(const tsr_model *m);
int tsr_model_n_slots(const tsr_model *m);
/* Host bytes of the model object and its tables (layer ids, chunk starts, units, per-layer
 * offsets, activation-slot tables, the split backward's stash tables, the document starts'
 * host copy) for a stage of `layers` layers in `chunks` chunks, the largest max_chunk, of
 * a model of n_layer layers, n_slots slots: what the planner counts besides the buffers. */
double tsr_model_table_bytes(const tsr_model_sizes *s, int n_layer, int layers, int chunks,
                             int n_slots);
/* What the model was built from (its micro-batch, sequence length, document masking). */
const tsr_model_spec *tsr_model_spec_get(const tsr_model *m);
int tsr_model_chunk_forward(tsr_model *m, int chunk, int slot, const int32_t *inputs,
                            const int32_t *targets, const void *x_in, float dloss, int grad,
                            double *loss_acc);
int tsr_model_chunk_backward(tsr_model *m, int chunk, int slot, const void *d_out);
/* The same backward in two passes, for the schedules that split it (a descriptor's
 * split_backward, src/sched/): the model then keeps, per slot, what B leaves for W; recompute
 * 'none').  B: the input gradients only (tsr_model_input_grad after it, as after the whole
 * backward); no parameter gradient is touched.  W, later, on the same slot: every weight
 * gradient of the chunk.  B then W gives the whole backward's gradients. */
int tsr_model_chunk_backward_input(tsr_model *m, int chunk, int slot, const void *d_out);
int tsr_model_chunk_backward_weight(tsr_model *m, int chunk, int slot);
const void *tsr_model_chunk_output(const tsr_model *m, int slot);
/* The logits of row `row` (a token of the micro-batch) after the last chunk's forward
 * without grad in `slot` (the last stage only; NULL elsewhere, or on a failure, said):
 * [*count] in tsr_model_dtype, this tp rank's vocabulary ids [*first, *first + *count).
 * The unfused head stored them all (op memory: read after tsr_ops_sync); the fused one
 * (train.xent_chunk_tokens) computes the row's now, which acquires the head's weight
 * (collective under ZeRO-3: every rank of the model calls it) and syncs.  tessera
 * generate and the trainer's sample line read them. */
const void *tsr_model_row_logits(tsr_model *m, int slot, int row, int *first, int *count);
/* Elements (of tsr_model_dtype) in a chunk's input/output activation and in its gradient:
 * micro_batch * seq_len * d_model, or 1/tp of it with sequence parallelism (each tp rank
 * sends its own rows). */
size_t tsr_model_act_elems(const tsr_model *m);
void *tsr_model_input_grad(tsr_model *m);

/* The largest shapes this model calls the ops with (tsr_ops_reserve); sumsq_elems is
 * left 0: the optimizer's caller knows its longest range. */
void tsr_model_ops_shapes(const tsr_model *m, tsr_ops_shapes *s);
/* The same from the sizes alone (what tessera plan sizes the device's scratch by). */
void tsr_model_ops_shapes_of(const tsr_model_sizes *z, tsr_ops_shapes *s);

/* Bytes of activation buffers allocated (for logs and, later, the planner). */
size_t tsr_model_activation_bytes(const tsr_model *m);
/* Bytes of the activations kept for the backward: the layers' stored sets and the residual
 * stream, on the device (*dev; with the offload its window and every slot's chunk output)
 * and in page-locked host memory (*host; 0 without the offload), and with the offload one
 * layer's block (*set: its stored set and input; 0 without).  Returns whether the offload
 * is on. */
int tsr_model_stored_bytes(const tsr_model *m, size_t *dev, size_t *host, size_t *set);

#endif
