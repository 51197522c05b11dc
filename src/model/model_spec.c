/* model_spec.c — the model's view of a run's configuration, taken in one place: the model
 * group and the settings of other groups (storage type, recompute, micro-batch, fused head,
 * sequence parallelism, the schedule's split backward, document masking, context
 * parallelism) that shape what the model allocates and which kernels it calls. */
#include "model.h"
#include "sched/pipeline.h"

#include <string.h>

void tsr_model_spec_of(tsr_model_spec *spec, const tsr_config *cfg) {
  memset(spec, 0, sizeof *spec);
  spec->model = cfg->model;
  spec->precision = cfg->train.precision;
  spec->recompute = cfg->train.recompute;
  spec->micro_batch = cfg->train.micro_batch;
  spec->xent_chunk_tokens = cfg->train.xent_chunk_tokens;
  spec->sequence_parallel = cfg->parallel.sequence_parallel;
  spec->split_backward = tsr_pp_split_backward(cfg->parallel.schedule);
  spec->document_mask = cfg->data.document_mask;
  spec->eos_id = cfg->data.eos_id;
  spec->cp = cfg->parallel.cp;
  spec->cp_comm = cfg->parallel.cp_comm;
  spec->activation_offload = cfg->train.activation_offload;
}
