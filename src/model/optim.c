/* optim.c — learning-rate schedules, clipping factor, AdamW over the flat buffers. */
#include "optim.h"

#include <math.h>
#include <string.h>

#include "ops/ops.h"

double tsr_optim_lr(const tsr_optim_config *o, int64_t max_steps, int64_t step) {
  if (o->warmup_steps > 0 && step <= o->warmup_steps)
    return o->lr * (double)step / (double)o->warmup_steps;
  const int64_t total = o->decay_steps > 0 ? o->decay_steps : max_steps;
  if (o->decay == TSR_DECAY_CONSTANT || total <= o->warmup_steps) return o->lr;
  double p = (double)(step - o->warmup_steps) / (double)(total - o->warmup_steps);
  p = p < 0 ? 0 : p > 1 ? 1 : p;
  if (o->decay == TSR_DECAY_LINEAR) return o->lr + (o->min_lr - o->lr) * p;
  if (o->decay == TSR_DECAY_WSD) {
    /* warmup-stable-decay: hold lr, then decay linearly over the last fraction of the steps */
    const double start = 1.0 - o->wsd_decay_frac;
    if (p <= start) return o->lr;
    return o->lr + (o->min_lr - o->lr) * (p - start) / o->wsd_decay_frac;
  }
  return o->min_lr + (o->lr - o->min_lr) * 0.5 * (1.0 + cos(M_PI * p)); /* cosine */
}

double tsr_optim_clip_scale(double grad_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (grad_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

/* host: the host's kernel on host buffers (tsr_ops_host_adamw), else the ops' backend's.
 * AdamW is element-wise, so a run of adjacent tensors with the same weight decay is one
 * call (a kernel launch on a device) with the same bits as one call a tensor: a llama
 * layer's nine tensors are four runs (norm, the attention's matrices, norm, the MLP's). */
static void adamw_range(int host, const tsr_optim_config *o, const tsr_layout *lay,
                        int64_t begin, int64_t end, float *master, float *m, float *v,
                        const float *grad, double lr, int64_t step, double grad_scale,
                        void *compute, tsr_dtype dt) {
  for (int i = 0; i < lay->n_tensors; i++) {
    const tsr_tensor *t = &lay->tensors[i];
    int j = i; /* the run's last tensor */
    while (j + 1 < lay->n_tensors && lay->tensors[j + 1].decay == t->decay &&
           lay->tensors[j + 1].offset == lay->tensors[j].offset + lay->tensors[j].numel &&
           lay->tensors[j + 1].offset < end)
      j++;
    const tsr_tensor *u = &lay->tensors[j];
    i = j;
    const int64_t a = t->offset > begin ? t->offset : begin;
    const int64_t b = u->offset + u->numel < end ? u->offset + u->numel : end;
    if (a >= b) continue;
    const double wd = t->decay ? o->weight_decay : 0.0;
    const int64_t k = a - begin;
    if (host)
      tsr_ops_host_adamw(master + k, m + k, v + k, grad + k, (long)(b - a), (float)lr,
                         (float)o->beta1, (float)o->beta2, (float)o->eps, (float)wd,
                         (long)step, (float)grad_scale, tsr_dtype_at(compute, dt, k), dt);
    else
      tsr_ops_adamw(master + k, m + k, v + k, grad + k, (long)(b - a), (float)lr,
                    (float)o->beta1, (float)o->beta2, (float)o->eps, (float)wd, (long)step,
                    (float)grad_scale, tsr_dtype_at(compute, dt, k), dt);
  }
}

void tsr_optim_adamw_range(const tsr_optim_config *o, const tsr_layout *lay, int64_t begin,
                           int64_t end, float *master, float *m, float *v, const float *grad,
                           double lr, int64_t step, double grad_scale, void *compute,
                           tsr_dtype dt) {
  adamw_range(0, o, lay, begin, end, master, m, v, grad, lr, step, grad_scale,
              compute, dt);
}

void tsr_optim_adamw_range_host(const tsr_optim_config *o, const tsr_layout *lay, int64_t begin,
                                int64_t end, float *master, float *m, float *v,
                                const float *grad, double lr, int64_t step, double grad_scale,
                                void *compute, tsr_dtype dt) {
  adamw_range(1, o, lay, begin, end, master, m, v, grad, lr, step,
              grad_scale, compute, dt);
}

void tsr_optim_adamw(const tsr_optim_config *o, const tsr_layout *lay, float *master, float *m,
                     float *v, const float *grad, double lr, int64_t step, double grad_scale) {
  tsr_optim_adamw_range(o, lay, 0, lay->n_flat, master, m, v, grad, lr, step, grad_scale, NULL,
                        TSR_F32);
}
