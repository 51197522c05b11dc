/* ckpt_policy.h — a run's checkpoint policy, one object of the checkpoint subsystem: when
 * to write (checkpoint.every_steps, or the Young-Daly interval of every_steps = 'auto',
 * re-estimated after each write from what writes cost), how (synchronously, or from a host
 * snapshot in the background: checkpoint.async and its 'auto' rule), and what the writes
 * cost the training (the time they held it up; for background writes, what they slowed
 * the steps they overlapped).  The session holds one; the session decides nothing of it.
 *
 * The policy never touches the training state itself: a synchronous write is the
 * caller's (it knows where the state lives; tsr_ckpt_policy_wrote reports it), a
 * background write starts from the state's op memory (tsr_ckpt_policy_start).  Every
 * function that may talk to the other ranks is collective and returns the same outcome on
 * each. */
#ifndef TSR_CKPT_POLICY_H
#define TSR_CKPT_POLICY_H

#include <mpi.h>
#include <stdint.h>

#include "ckpt.h"
#include "core/config.h"
#include "core/metrics.h"

typedef struct tsr_ckpt_policy tsr_ckpt_policy;

/* Before the first step (the run starts after `step` updates), collective over world:
 * the first 'auto' checkpoint a few steps on (logged), and the background writer unless
 * no checkpoint is planned at all or checkpoint.async (or its 'auto' rule, or the host
 * memory) says synchronous writes (tsr_ckpt_async_create, logged).  Checkpoint events go
 * to metrics (rank 0's; NULL on the others). */
int tsr_ckpt_policy_open(tsr_ckpt_policy **out, const tsr_config *cfg,
                         const tsr_ckpt_view *view, int64_t step, tsr_metrics *metrics,
                         MPI_Comm world);
/* Waits for a write in flight (its failure reported), frees everything; *p = NULL. */
void tsr_ckpt_policy_close(tsr_ckpt_policy **p);

/* After step `step`, which took step_s: is a checkpoint due (every_steps, or the 'auto'
 * interval)?  The same answer on every rank. */
int tsr_ckpt_policy_due(tsr_ckpt_policy *p, int64_t step, double step_s);
/* Is `step` checkpointed already (written, or being written in the background)?  When
 * not, it is taken as the step now checkpointed. */
int tsr_ckpt_policy_claim(tsr_ckpt_policy *p, int64_t step);
/* Does the policy write in the background? */
int tsr_ckpt_policy_background(const tsr_ckpt_policy *p);

/* A synchronous write of `step` that took write_s: the metrics event, and with 'auto' the
 * next checkpoint's step. */
void tsr_ckpt_policy_wrote(tsr_ckpt_policy *p, int64_t step, double write_s);
/* A background write of st->step from master, m, v (k = 0, 1, 2) in two parts, op
 * memory lo[k] for the shard's elements [0, split) and host memory hi[k] for the rest
 * (tsr_ckpt_async_start): the write in flight, if any, is waited for and reported first
 * (its failure returned, nothing started); with 'auto' the next checkpoint's step.
 * Collective. */
int tsr_ckpt_policy_start(tsr_ckpt_policy *p, float *const lo[3], float *const hi[3],
                          int64_t split, const tsr_train_state *st, const char *deck_text);
/* At a step boundary, never blocking: the code of a background write that has ended in
 * failure (each once; 0 otherwise).  The ranks may see the end at different boundaries:
 * all-reduce it (MAX) to stop together. */
int tsr_ckpt_policy_poll(tsr_ckpt_policy *p);
/* Waits for the write in flight, if any, and returns its code. */
int tsr_ckpt_policy_wait(tsr_ckpt_policy *p);

#endif
