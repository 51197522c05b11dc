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

#include "config.h"
#include "layout.h"

typedef struct tsr_model tsr_model;

typedef enum { TSR_RECOMPUTE_NONE = 0, TSR_RECOMPUTE_SELECTIVE, TSR_RECOMPUTE_FULL } tsr_recompute;

int tsr_model_create(tsr_model **out, const tsr_config *cfg, const tsr_layout *lay);
void tsr_model_destroy(tsr_model **m);

/* Compute-precision parameters (flat, layout order).  Set them with
 * tsr_model_set_params, which rounds to bf16 when precision is bf16. */
const float *tsr_model_params(const tsr_model *m);
void tsr_model_set_params(tsr_model *m, const float *master);
/* fp32 gradient, flat, layout order; accumulated by tsr_model_fwd_bwd. */
float *tsr_model_grads(tsr_model *m);
void tsr_model_zero_grads(tsr_model *m);

/* Forward + backward of one micro-batch (micro_batch sequences): inputs and targets are
 * [micro_batch * seq_len].  *loss = mean cross-entropy of this micro-batch.
 * grads += dloss * d(mean loss)/d(params).  For accumulation over k micro-batches
 * of one optimizer step, pass dloss = 1/k. */
int tsr_model_fwd_bwd(tsr_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                      double *loss);
/* Forward only: *loss = mean cross-entropy (evaluation). */
int tsr_model_forward(tsr_model *m, const int32_t *inputs, const int32_t *targets, double *loss);

/* Bytes of activation buffers allocated (for logs and, later, the planner). */
size_t tsr_model_activation_bytes(const tsr_model *m);

#endif
