/* train.h — the training and evaluation drivers (called by main.c after the deck is
 * parsed and broadcast). */
#ifndef TSR_TRAIN_H
#define TSR_TRAIN_H

#include <mpi.h>

#include "core/config.h"

/* Train per the config.  deck_text is the effective deck (logged, stored in checkpoints).
 * Returns 0 when max_steps is reached, TSR_ERR_SIGNAL after a stop-on-signal checkpoint
 * (SIGUSR1 / SIGTERM: runctl.h), or an error code. */
int tsr_train(const tsr_config *cfg, const char *deck_text, MPI_Comm world);

/* Load checkpoint.resume and report the validation loss (eval_steps batches; eval.c).
 * tokenizer: --tokenizer PATH (NULL: the checkpoint's), for data.document_mask's
 * end-of-document id. */
int tsr_eval(const tsr_config *cfg, const char *tokenizer, MPI_Comm world);

#endif
