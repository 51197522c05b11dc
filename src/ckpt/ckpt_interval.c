/* ckpt_interval.c — the Young-Daly checkpoint interval and its goodput (ckpt_interval.h). */
#include "ckpt_interval.h"

#include <math.h>

double tsr_ckpt_goodput(double cost_s, double period_s, double mtbf_s) {
  if (!(period_s > 0) || !(mtbf_s > 0)) return 0;
  const double g = 1.0 - cost_s / period_s - period_s / (2.0 * mtbf_s);
  return g < 0 ? 0 : g > 1 ? 1 : g;
}

tsr_ckpt_interval tsr_ckpt_young_daly(double cost_s, double mtbf_s, double step_s,
                                      double write_s) {
  tsr_ckpt_interval r = {0, 1, 0, 0};
  r.period_s = sqrt(2.0 * (cost_s > 0 ? cost_s : 0) * (mtbf_s > 0 ? mtbf_s : 0));
  if (!(step_s > 0)) return r;
  const double steps = round(r.period_s / step_s);
  r.floor_steps = write_s > 0 ? (int64_t)ceil(write_s / step_s) : 0;
  r.steps = steps > 1 ? (steps < 1e15 ? (int64_t)steps : (int64_t)1e15) : 1;
  if (r.floor_steps > r.steps) r.steps = r.floor_steps;
  r.goodput = tsr_ckpt_goodput(cost_s, (double)r.steps * step_s, mtbf_s);
  return r;
}
