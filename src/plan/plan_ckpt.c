/* plan_ckpt.c — the checkpoint of a planned job (plan.h): the file's size and its write time
 * at an assumed file-system bandwidth (hardware.fs_gbps), the host snapshot of asynchronous
 * writes, and with checkpoint.mtbf_hours the Young-Daly interval and the expected goodput
 * (ckpt_interval.h; docs/formats.md "Checkpoint interval"). */
#include <math.h>
#include <stdio.h>

#include "ckpt/ckpt_interval.h"
#include "plan.h"

tsr_plan_ckpt tsr_plan_checkpoint(const tsr_plan *p, const tsr_config *cfg) {
  tsr_plan_ckpt c = {0};
  c.bytes = 12.0 * (double)p->n_params; /* fp32 master, Adam m and v */
  c.write_s = c.bytes / (cfg->hardware.fs_gbps * 1e9);
  for (int s = 0; s < p->grid.pp; s++) /* 12 bytes per element of the shard: 1.5 x Adam's 8 */
    if (p->stages[s].done && 1.5 * p->stages[s].mem[TSR_PLAN_GPU].optim > c.snapshot_bytes)
      c.snapshot_bytes = 1.5 * p->stages[s].mem[TSR_PLAN_GPU].optim, c.snapshot_stage = s;
  c.mtbf_s = cfg->checkpoint.mtbf_hours * 3600.0;
  c.step_s = p->t_step;
  if (c.mtbf_s > 0) {
    c.young_daly = tsr_ckpt_young_daly(c.write_s, c.mtbf_s, c.step_s, 0);
    c.floor_steps = c.step_s > 0 ? (int64_t)ceil(c.write_s / c.step_s) : 1;
    const int64_t n = cfg->checkpoint.every_steps;
    if (n > 0) c.deck_goodput = tsr_ckpt_goodput(c.write_s, (double)n * c.step_s, c.mtbf_s);
  }
  return c;
}

void tsr_plan_print_checkpoint(FILE *out, const tsr_plan *p, const tsr_config *cfg) {
  const tsr_plan_ckpt c = tsr_plan_checkpoint(p, cfg);
  const int async = cfg->checkpoint.async;
  fprintf(out, "\ncheckpoint (write bandwidth hardware.fs_gbps = %g GB/s, an assumption)\n",
          cfg->hardware.fs_gbps);
  fprintf(out, "  file               %10.4f GB   12 bytes per parameter (fp32 weights, Adam m "
          "and v); written, verified and published in about %.4g s\n", c.bytes / 1e9,
          c.write_s);
  fprintf(out, "  host snapshot      %10.4f GB   per GPU (stage %d), host memory beside the "
          "GPU's, %s\n", c.snapshot_bytes / 1e9, c.snapshot_stage,
          async ? "for background writes (checkpoint.async)"
                : "were checkpoint.async on (it is off: none)");
  if (!(c.mtbf_s > 0)) {
    fprintf(out, "  interval           set checkpoint.mtbf_hours for the Young-Daly interval and "
            "the expected goodput\n");
    return;
  }
  const tsr_ckpt_interval *r = &c.young_daly;
  fprintf(out, "  Young-Daly         C = %.4g s (a synchronous write), MTBF %g h: sqrt(2 C MTBF) "
          "= %.4g s = %lld steps of %.4g s; expected goodput %.4f (1 - C/T - T/(2 MTBF))\n",
          c.write_s, cfg->checkpoint.mtbf_hours, r->period_s, (long long)r->steps, c.step_s,
          r->goodput);
  if (cfg->checkpoint.every_steps > 0)
    fprintf(out, "  every_steps %-6lld expected goodput %.4f with C = %.4g s\n",
            (long long)cfg->checkpoint.every_steps, c.deck_goodput, c.write_s);
  if (async)
    fprintf(out, "  asynchronous       training waits only for the snapshot copy, so C is far "
            "less than the write; every_steps = 'auto' measures it and keeps at least %lld "
            "step(s) between checkpoints, the write's length\n", (long long)c.floor_steps);
}

void tsr_plan_json_checkpoint(FILE *out, const tsr_plan *p, const tsr_config *cfg) {
  const tsr_plan_ckpt c = tsr_plan_checkpoint(p, cfg);
  fprintf(out, "  \"checkpoint\": {\"bytes\": %.0f, \"fs_gbps\": %.6g, \"write_s\": %.6g, "
          "\"async\": %s, \"snapshot_bytes\": %.0f, \"snapshot_stage\": %d, \"mtbf_hours\": "
          "%.6g", c.bytes, cfg->hardware.fs_gbps, c.write_s,
          cfg->checkpoint.async ? "true" : "false", c.snapshot_bytes, c.snapshot_stage,
          cfg->checkpoint.mtbf_hours);
  if (c.mtbf_s > 0)
    fprintf(out, ", \"young_daly\": {\"cost_s\": %.6g, \"step_s\": %.6g, \"period_s\": %.6g, "
            "\"steps\": %lld, \"goodput\": %.6g, \"async_floor_steps\": %lld}", c.write_s,
            c.step_s, c.young_daly.period_s, (long long)c.young_daly.steps, c.young_daly.goodput,
            (long long)c.floor_steps);
  fprintf(out, "},\n");
}
