/* train_log.h — what the training loop (train.c) logs: the run's set-up once, the step
 * line with the measured pipeline bubble, and after the first step the traffic and the
 * measured memory beside the plan's. */
#ifndef TSR_TRAIN_LOG_H
#define TSR_TRAIN_LOG_H

#include <mpi.h>

#include "session.h"

typedef struct {
  double loss, grad_norm, lr, scale; /* scale: the fp16 loss scale it ran at (0: none) */
  int skipped;
  double phase_s[3]; /* forward, backward, optimizer (s); NAN where not separable */
} tsr_step_result;

/* Who runs what, where: the first lines of every run in tessera.log. */
void tsr_train_log_start(MPI_Comm world);
/* What the run is, once, after the effective deck. */
void tsr_train_log_setup(const tsr_session *s);
/* The step line (every log_every steps, the first and the last), the measured pipeline
 * bubble; after the first step of this run (`first`), the traffic and the measured memory
 * beside the plan's (a collective then).  avg_s: the mean step time since the last line. */
void tsr_train_log_step(const tsr_session *s, const tsr_step_result *r, double dt, double mfu,
                        double avg_s, int first);

#endif
