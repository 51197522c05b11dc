/* pp_exec.h — runs this pipeline stage's schedule (pipeline.h) for one optimizer step:
 * forwards and backwards of the stage's chunks through the model, activations and their
 * gradients moved with non-blocking send/recv on the pp group, and the time spent
 * waiting for them measured (the bubble). */
#ifndef TSR_PP_EXEC_H
#define TSR_PP_EXEC_H

#include <stdint.h>

#include "core/config.h"
#include "data/data.h"
#include "comm/grid.h"
#include "model/model.h"
#include "sched/pipeline.h"
#include "zero.h"

typedef struct tsr_pp_exec tsr_pp_exec;

/* Activation slots the model needs for this stage's schedule: the most micro-batch-chunks
 * whose activations (or a posted receive) are alive at once. */
int tsr_pp_slots_needed(const tsr_pp_schedule *s);

/* The schedule for this stage: its kind and virtual stages from the parallel group, over
 * `micro_batches` micro-batches a step (global_batch / (micro_batch * dp)). */
int tsr_pp_schedule_for(tsr_pp_schedule **out, const tsr_parallel_config *par, int micro_batches,
                        const tsr_grid *grid);

/* The executor of `sched` on this stage; the micro-batch's shape and whether documents are
 * masked come from the model (tsr_model_spec_get). */
int tsr_pp_exec_create(tsr_pp_exec **out, const tsr_grid *grid, tsr_model *model, tsr_zero *zero,
                       tsr_pp_schedule *sched);
void tsr_pp_exec_destroy(tsr_pp_exec **ex);

typedef struct {
  double idle_s;    /* time this stage waited for activations or gradients */
  double total_s;   /* time of the whole schedule on this stage */
} tsr_pp_step_stats;

/* One step: micro-batch i of this dp rank is global sample first + i * micro_batch, ...
 * dloss = 1 / (micro-batches x dp).  Gradients are left in the zero object's buffers
 * (tsr_zero_reduce_grads follows).  The last stage adds each micro-batch's mean loss to
 * *loss_acc (a double of op memory: read it after the next tsr_ops_sync). */
int tsr_pp_exec_step(tsr_pp_exec *ex, const tsr_data *data, int64_t first, float dloss,
                     double *loss_acc, tsr_pp_step_stats *stats);

/* Forward only (evaluation) of one micro-batch through every stage, in chunk order;
 * *loss (mean over the micro-batch) is the same on every rank of the pp group. */
int tsr_pp_exec_eval(tsr_pp_exec *ex, const int32_t *inputs, const int32_t *targets,
                     double *loss);

#endif
