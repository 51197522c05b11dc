/* precision.h — what train.precision decides beyond the storage type (dtype.h): fp16's
 * dynamic loss scale, whose state lives in the checkpointed tsr_train_state.
 *
 * fp16 multiplies the loss by the scale S (a power of two) before backward, so that small
 * activation gradients survive fp16 storage; the gradients stay scaled and the update
 * divides by S (with the clipping factor: no pass of its own).  A step whose gradient
 * norm is not finite overflowed: its update is skipped and S halves (not below
 * train.min_loss_scale); after train.loss_scale_window steps without an overflow, S
 * doubles.  bf16 and fp32 runs use S = 1 and keep scale_good_steps = -1. */
#ifndef TSR_PRECISION_H
#define TSR_PRECISION_H

#include "ckpt/ckpt.h" /* tsr_train_state */
#include "core/config.h"

/* A run starting from its seed: the deck's initial scale (fp16), or none. */
void tsr_loss_scale_start(const tsr_train_config *tc, tsr_train_state *st);
/* After loading a checkpoint: an fp16 run goes on with the checkpoint's scale, or starts
 * one when the checkpoint is not from an fp16 run; others drop it.  Logs which. */
void tsr_loss_scale_resumed(const tsr_train_config *tc, tsr_train_state *st);
/* The scale this step runs at (1 without loss scaling). */
double tsr_loss_scale(const tsr_train_config *tc, const tsr_train_state *st);
/* After the step: its gradients overflowed (the update was skipped) or not. */
void tsr_loss_scale_update(const tsr_train_config *tc, tsr_train_state *st, int overflowed);

#endif
