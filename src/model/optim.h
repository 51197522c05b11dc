/* optim.h — learning-rate schedules, global-norm clipping and AdamW over flat buffers. */
#ifndef TSR_OPTIM_H
#define TSR_OPTIM_H

#include <stdint.h>

#include "core/config.h"
#include "layout.h"
#include "ops/ops.h"

/* Learning rate of optimizer step `step` (1-based).
 * warmup: lr * step / warmup_steps for step <= warmup_steps.
 * Then with decay_steps D (0 = max_steps) and progress p = (step - warmup) / (D - warmup)
 * clamped to [0, 1]:
 *   constant: lr;  linear: lr + (min_lr - lr) p;  cosine: min_lr + (lr - min_lr)(1 + cos(pi p))/2;
 *   wsd: lr until the last wsd_decay_frac of D, then linear to min_lr over that fraction. */
double tsr_optim_lr(const tsr_optim_config *o, int64_t max_steps, int64_t step);

/* Multiplier for the gradients after global-norm clipping (torch.nn.utils.clip_grad_norm_):
 * max_norm / (norm + 1e-6) if that is < 1, else 1.  max_norm <= 0: no clipping. */
double tsr_optim_clip_scale(double grad_norm, double max_norm);

/* One AdamW update of every tensor in `lay` (decay only where tensor->decay). */
void tsr_optim_adamw(const tsr_optim_config *o, const tsr_layout *lay, float *master, float *m,
                     float *v, const float *grad, double lr, int64_t step, double grad_scale);
/* The same on the flat range [begin, end) only (a ZeRO shard): the buffers hold that
 * range (element i of them is flat element begin + i).  Padding is left alone.
 * compute (NULL: none; overlapping no other buffer), laid out as master in storage type
 * dt, receives the updated master stored as dt in the same pass (the compute copy's
 * refresh; its padding is left alone too). */
void tsr_optim_adamw_range(const tsr_optim_config *o, const tsr_layout *lay, int64_t begin,
                           int64_t end, float *master, float *m, float *v, const float *grad,
                           double lr, int64_t step, double grad_scale, void *compute,
                           tsr_dtype dt);
/* The same with the host's kernel on host buffers, whatever the ops' backend (the
 * optimizer offload, parallel.offload). */
void tsr_optim_adamw_range_host(const tsr_optim_config *o, const tsr_layout *lay, int64_t begin,
                                int64_t end, float *master, float *m, float *v,
                                const float *grad, double lr, int64_t step, double grad_scale,
                                void *compute, tsr_dtype dt);

#endif
