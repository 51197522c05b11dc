/* model.h — forward and backward of the decoder-only transformer (llama | gpt2) on one
 * pipeline stage.  The model owns the compute-precision parameter copy, the fp32
 * gradient buffer and the activation buffers, all allocated once at creation for
 * micro-batches of `micro_batch` sequences of seq_len tokens.  It calls only `ops`.
 *
 * Model definition (DESIGN.md): pre-norm blocks x += attn(norm(x)); x += mlp(norm(x));
 * final norm; LM head; mean cross-entropy over all B*T targets. */
#ifndef TSR_MODEL_H
#define TSR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "layout.h"

typedef struct tsr_model tsr_model;

typedef enum { TSR_RECOMPUTE_NONE = 0, TSR_RECOMPUTE_SELECTIVE, TSR_RECOMPUTE_FULL } tsr_recompute;

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
  const float *(*params_acquire)(void *ctx, int unit, int next);
  int (*params_release)(void *ctx, int unit);
  float *(*grads_acquire)(void *ctx, int unit);
  int (*grads_release)(void *ctx, int unit);
} tsr_model_hooks;

/* own_params / own_grads: allocate full flat buffers for them (without them, hooks must
 * be set before the first forward). */
int tsr_model_create(tsr_model **out, const tsr_config *cfg, const tsr_layout *lay);
int tsr_model_create_ext(tsr_model **out, const tsr_config *cfg, const tsr_layout *lay,
                         int own_params, int own_grads);
/* The general form: `lay` may be any (pipeline stage, tp rank) part (tsr_layout_create_part)
 * with tp its tp group (NULL: none); n_slots activation sets are kept for micro-batches in
 * flight (a pipeline schedule's peak). */
typedef struct {
  int own_params, own_grads;
  tsr_comm *tp;
  int n_slots;
} tsr_model_options;
int tsr_model_create_opt(tsr_model **out, const tsr_config *cfg, const tsr_layout *lay,
                         const tsr_model_options *opt);
void tsr_model_destroy(tsr_model **m);
void tsr_model_set_hooks(tsr_model *m, const tsr_model_hooks *hooks);
int tsr_model_n_units(const tsr_model *m);
tsr_unit tsr_model_unit(const tsr_model *m, int u);

/* Compute-precision parameters (flat, layout order; NULL when not owned).  Set them
 * with tsr_model_set_params, which rounds to bf16 when precision is bf16. */
const float *tsr_model_params(const tsr_model *m);
float *tsr_model_params_mut(tsr_model *m);
void tsr_model_set_params(tsr_model *m, const float *master);
/* fp32 gradient, flat, layout order (NULL when not owned); accumulated by
 * tsr_model_fwd_bwd. */
float *tsr_model_grads(tsr_model *m);
void tsr_model_zero_grads(tsr_model *m);
/* Round values to the compute precision (bf16 rounding, or a copy). */
void tsr_model_to_compute(const tsr_model *m, float *dst, const float *src, int64_t n);

/* Forward + backward of one micro-batch (micro_batch sequences): inputs and targets are
 * [micro_batch * seq_len].  *loss = mean cross-entropy of this micro-batch.
 * grads += dloss * d(mean loss)/d(params).  For accumulation over k micro-batches
 * of one optimizer step, pass dloss = 1/k. */
int tsr_model_fwd_bwd(tsr_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                      double *loss);
/* Forward only: *loss = mean cross-entropy (evaluation). */
int tsr_model_forward(tsr_model *m, const int32_t *inputs, const int32_t *targets, double *loss);

/* Pipeline stages.  The stage's layers form n_chunks chunks (virtual stages).  Forward of
 * chunk c for one micro-batch stores its activations in `slot` (in [0, n_slots)); x_in
 * is the chunk's input activation [micro_batch*seq_len, d_model], except for the first
 * stage's chunk 0, which embeds `inputs`.  The last stage's last chunk computes the mean
 * loss on `targets` (and, with grad, the gradient of dloss * loss w.r.t. its logits).
 * Its output is tsr_model_chunk_output(slot).  Backward of (chunk, slot) takes the
 * gradient of the chunk's output (NULL for the last chunk) and leaves the gradient of its
 * input in tsr_model_input_grad (overwritten by the next backward).  A slot is free again
 * once its backward has run. */
int tsr_model_n_chunks(const tsr_model *m);
int tsr_model_n_slots(const tsr_model *m);
int tsr_model_chunk_forward(tsr_model *m, int chunk, int slot, const int32_t *inputs,
                            const int32_t *targets, const float *x_in, float dloss, int grad,
                            double *loss);
int tsr_model_chunk_backward(tsr_model *m, int chunk, int slot, const float *d_out);
const float *tsr_model_chunk_output(const tsr_model *m, int slot);
/* Floats in a chunk's input/output activation: micro_batch * seq_len * d_model, or
 * 1/tp of it with sequence parallelism (each tp rank sends its own rows). */
size_t tsr_model_act_floats(const tsr_model *m);
float *tsr_model_input_grad(tsr_model *m);

/* Bytes of activation buffers allocated (for logs and, later, the planner). */
size_t tsr_model_activation_bytes(const tsr_model *m);

#endif
