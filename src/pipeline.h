/* pipeline.h — pipeline-parallel schedules as data: for one stage, the ordered list of
 * computations and point-to-point transfers an executor runs.  No MPI, no model here.
 *
 * Chunks.  The model's n_layer layers are cut into pp * v equal chunks (v = virtual
 * stages, 1 except for 'interleaved').  Chunk c holds layers [c L/(pp v), (c+1) L/(pp v))
 * and lives on stage c % pp, so stage s holds chunks s, s + pp, s + 2 pp, ... (Megatron's
 * interleaving).  The embedding belongs to chunk 0, the final norm, head and loss to the
 * last chunk pp v - 1.  Uneven (explicit) splits are not supported yet.
 *
 * Actions.  `chunk` is always a chunk this stage owns; `peer` the stage at the other end
 * of a transfer.  A message is identified by (direction, micro_batch, chunk) and matches:
 *     SEND_ACT  (mb, c) on stage(c)    <->  RECV_ACT  (mb, c + 1) on stage(c + 1)
 *     SEND_GRAD (mb, c) on stage(c)    <->  RECV_GRAD (mb, c - 1) on stage(c - 1)
 * so a tag built from (direction, mb, receiving chunk) is unique within a step.
 * FORWARD (mb, c) with c > 0 is preceded by its RECV_ACT and, unless c is the last chunk,
 * followed by its SEND_ACT; BACKWARD (mb, c) is preceded by RECV_GRAD unless c is the
 * last chunk (whose backward starts from the loss computed by its own forward) and
 * followed by SEND_GRAD unless c = 0.
 *
 * Posting order.  Every stage's list is the projection of ONE global sequence of events
 * (see pipeline.c), so the lists are deadlock-free even when executed with synchronous
 * rendezvous semantics (a send waits for its receive to be posted and vice versa).  The
 * intended executor is weaker still: post each RECV where it appears (early) and wait
 * for it just before the computation that consumes it; post each SEND non-blocking
 * where it appears and complete it before its buffer is reused.  Activations of
 * (mb, chunk) live from FORWARD to BACKWARD of that pair and are freed right after.
 *
 * Bubble.  A stage's bubble fraction is its idle time over the step time:
 *     bubble = (step time - time in FORWARD/BACKWARD) / step time,
 * measured from the step's start to the moment the LAST stage finishes.  */
#ifndef TSR_PIPELINE_H
#define TSR_PIPELINE_H

#include "config.h" /* tsr_schedule_choice */

typedef enum {
  TSR_PP_RECV_ACT,  /* activation of (mb, chunk - 1) from `peer` */
  TSR_PP_FORWARD,   /* forward of (mb, chunk); the last chunk also computes the loss */
  TSR_PP_SEND_ACT,  /* output activation of (mb, chunk) to `peer` */
  TSR_PP_RECV_GRAD, /* gradient w.r.t. this chunk's output from `peer` */
  TSR_PP_BACKWARD,  /* backward of (mb, chunk); its activations can be freed after */
  TSR_PP_SEND_GRAD  /* gradient w.r.t. this chunk's input to `peer` */
} tsr_pp_op;

typedef struct {
  tsr_pp_op op;
  int micro_batch;
  int chunk; /* global chunk index, 0 .. pp v - 1, owned by this stage */
  int peer;  /* stage sent to / received from; -1 for FORWARD and BACKWARD */
} tsr_pp_action;

typedef struct tsr_pp_schedule {
  int n;            /* number of actions */
  tsr_pp_action *a; /* in execution order */
  int stage, pp, m, v; /* m = micro-batches per step, v = virtual stages (chunks per stage) */
} tsr_pp_schedule;

/* kind: gpipe, 1f1b or interleaved (config.h).  virtual_stages must be 1 unless kind is
 * interleaved; interleaved with virtual_stages = 1 is 1F1B.  Interleaved with
 * virtual_stages > 1 needs pp >= 2 and micro_batches % pp == 0 (as Megatron does).
 * Returns TSR_ERR_INPUT with a message naming the offending values. */
int tsr_pp_schedule_create(tsr_pp_schedule **out, tsr_schedule_choice kind, int pp, int stage,
                           int micro_batches, int virtual_stages);
void tsr_pp_schedule_destroy(tsr_pp_schedule **s);

/* Layers [*first, *first + *count) of `chunk`; TSR_ERR_INPUT unless n_layer % (pp v) == 0. */
int tsr_pp_chunk_layers(int n_layer, int pp, int v, int chunk, int *first, int *count);
int tsr_pp_chunk_stage(int pp, int chunk);

/* Ideal bubble fraction (idle time over step time, as defined above) when forward and
 * backward of a chunk take fixed times and transfers are free:
 *     gpipe, 1f1b:  (p - 1) / (m + p - 1)
 *     interleaved:  (p - 1) / (v m + p - 1)
 * Negative for an unknown kind.  See pipeline.c for the derivation. */
double tsr_pp_ideal_bubble(tsr_schedule_choice kind, int pp, int m, int v);

/* Most (mb, chunk) pairs whose FORWARD has run and BACKWARD has not, i.e. the peak
 * number of activation sets alive on this stage. */
int tsr_pp_peak_in_flight(const tsr_pp_schedule *s);

const char *tsr_pp_op_name(tsr_pp_op op);

#endif
