/* pipeline.h — pipeline-parallel schedules as data: for one stage, the ordered list of
 * computations and point-to-point transfers an executor runs.  No MPI, no model here.
 *
 * Chunks.  The model's n_layer layers are cut into pp * v chunks of consecutive layers
 * (v = virtual stages: as many as the schedule places on a stage, schedule.h), chunk 0
 * holding the first layers.  How many each holds is parallel.stage_layers
 * (tsr_pp_split_counts): by default pp v equal chunks, else an explicit list or a split
 * balanced by cost ('auto').  Which stage holds a chunk depends on the schedule's
 * placement (schedule.h), and tsr_pp_chunk_owner says: chunk c % pp on the round
 * placement, so stage s holds chunks s, s + pp, s + 2 pp, ... (Megatron's interleaving);
 * the V placement folds the chunks into a V, stage s holding chunks s and 2 pp - 1 - s,
 * so the first and the last chunk are both on stage 0 and chunks pp - 1 and pp both on
 * stage pp - 1.  A stage's own chunks, in
 * ascending order, are its local chunks 0 .. v - 1.  The embedding belongs to chunk 0,
 * the final norm, head and loss to the last chunk pp v - 1.
 *
 * Actions.  `chunk` is always a chunk this stage owns; `peer` the stage at the other end
 * of a transfer.  A message is identified by (direction, micro_batch, chunk) and matches:
 *     SEND_ACT  (mb, c) on owner(c)    <->  RECV_ACT  (mb, c + 1) on owner(c + 1)
 *     SEND_GRAD (mb, c) on owner(c)    <->  RECV_GRAD (mb, c - 1) on owner(c - 1)
 * so a tag built from (direction, mb, receiving chunk) is unique within a step.  When
 * chunks c and c + 1 are on the same stage (the V's bend, chunks pp - 1 and pp) there is
 * no transfer between them: the forward of c + 1 reads the output of the forward of c,
 * and the backward (B) of c reads the input gradient the backward (B) of c + 1 made.
 * FORWARD (mb, c) with c > 0 is preceded by its RECV_ACT and, unless c is the last chunk,
 * followed by its SEND_ACT; BACKWARD (mb, c) is preceded by RECV_GRAD unless c is the
 * last chunk (whose backward starts from the loss computed by its own forward) and
 * followed by SEND_GRAD unless c = 0 (transfers only between different stages).
 *
 * Split backward (a descriptor's split_backward).  These schedules run a chunk's
 * backward as two actions:
 * BACKWARD_B, the gradient w.r.t. the chunk's input (what SEND_GRAD sends; it takes the
 * place of BACKWARD in the rules above), and later BACKWARD_W, the gradients w.r.t. the
 * chunk's weights, on the same stage.  Only B is on the path between stages; W can wait,
 * and filling idle time with delayed W's is what shrinks the bubble.  The other
 * schedules emit BACKWARD (B and W together) and never B or W.
 *
 * Posting order.  Every stage's list is the projection of ONE global sequence of events
 * (see pipeline.c), so the lists are deadlock-free even when executed with synchronous
 * rendezvous semantics (a send waits for its receive to be posted and vice versa).  The
 * intended executor is weaker still: post each RECV where it appears (early) and wait
 * for it just before the computation that consumes it; post each SEND non-blocking
 * where it appears and complete it before its buffer is reused.  Activations of
 * (mb, chunk) live from FORWARD to BACKWARD (or to BACKWARD_W when split) of that pair
 * and are freed right after.
 *
 * Bubble.  A stage's bubble fraction is its idle time over the step time:
 *     bubble = (step time - time in FORWARD/BACKWARD) / step time,
 * measured from the step's start to the moment the LAST stage finishes; "time in
 * FORWARD/BACKWARD" includes BACKWARD_B and BACKWARD_W.  */
#ifndef TSR_PIPELINE_H
#define TSR_PIPELINE_H

#include <stddef.h>

#include "core/config.h" /* tsr_schedule_choice, tsr_model_config */
#include "schedule.h"

typedef enum {
  TSR_PP_RECV_ACT,  /* activation of (mb, chunk - 1) from `peer` */
  TSR_PP_FORWARD,   /* forward of (mb, chunk); the last chunk also computes the loss */
  TSR_PP_SEND_ACT,  /* output activation of (mb, chunk) to `peer` */
  TSR_PP_RECV_GRAD, /* gradient w.r.t. this chunk's output from `peer` */
  TSR_PP_BACKWARD,  /* backward of (mb, chunk); its activations can be freed after */
  TSR_PP_SEND_GRAD, /* gradient w.r.t. this chunk's input to `peer` */
  TSR_PP_BACKWARD_B, /* split backward, part 1: gradient w.r.t. the chunk's input */
  TSR_PP_BACKWARD_W  /* split backward, part 2: weight gradients; activations freed after */
} tsr_pp_op;

typedef struct {
  tsr_pp_op op;
  int micro_batch;
  int chunk; /* global chunk index, 0 .. pp v - 1, owned by this stage */
  int peer;  /* stage sent to / received from; -1 for the computations */
} tsr_pp_action;

typedef struct tsr_pp_schedule {
  int n;            /* number of actions */
  tsr_pp_action *a; /* in execution order */
  int stage, pp, m, v; /* m = micro-batches per step, v = virtual stages (chunks per stage) */
  tsr_schedule_choice kind; /* decides the chunk placement: tsr_pp_chunk_owner */
} tsr_pp_schedule;

/* Stage `stage`'s action list under schedule `kind` (registry.h; its descriptor says
 * everything that differs between schedules, schedule.h) with pp stages, micro_batches
 * per step and virtual_stages chunks per stage, which must be what the schedule places
 * (its `chunks`; any >= 1 when that is 0, and then v > 1 needs pp >= 2, and, for a
 * schedule with chunked_divides, micro_batches % pp == 0, as Megatron does).  Returns
 * TSR_ERR_INPUT with a message naming the offending values. */
int tsr_pp_schedule_create(tsr_pp_schedule **out, tsr_schedule_choice kind, int pp, int stage,
                           int micro_batches, int virtual_stages);
void tsr_pp_schedule_destroy(tsr_pp_schedule **s);
/* 1 for the schedules that split a backward into B and W (the descriptor's split_backward):
 * the model then keeps what B leaves for W, and their layouts need recompute 'none'. */
int tsr_pp_split_backward(tsr_schedule_choice kind);

/* Most chunks a split can have: every chunk holds a layer and model.n_layer <= 1024. */
enum { TSR_PP_MAX_CHUNKS = 1024 };

/* The layers of each of the pp v chunks in chunk order, counts[0 .. pp v), from
 * parallel.stage_layers `spec`:
 *   ''      equal chunks of n_layer / (pp v) layers (n_layer must divide evenly);
 *   'auto'  balanced by cost: a layer costs its forward FLOPs per token (2 per GEMM weight
 *           plus 2 seq_len d_model for the attention core, as tessera plan counts them),
 *           chunk 0 also the embedding (a lookup: 0) and the last chunk the LM head
 *           (2 vocab_size d_model); each chunk gets one layer, then every further layer
 *           goes to the chunk whose cost after taking it is lowest (ties: a chunk with
 *           neither the embedding nor the head, then the lowest index), which minimises
 *           the costliest chunk;
 *   'a,b,..' pp v counts >= 1 summing to n_layer (blanks around the commas allowed).
 * Returns 0, or TSR_ERR_INPUT with the reason in why[cap] (nothing logged). */
int tsr_pp_split_counts(const tsr_model_config *m, int pp, int v, const char *spec, int *counts,
                        char *why, size_t cap);
/* The one answer to "which layers does chunk c hold": layers [*first, *first + *count) of
 * `chunk` under the split `spec` (as above).  TSR_ERR_INPUT, logged, for a bad split. */
int tsr_pp_chunk_layers(const tsr_model_config *m, int pp, int v, const char *spec, int chunk,
                        int *first, int *count);
/* The chunk holding `layer` under the split (tsr_pp_chunk_layers); -1 for a bad split. */
int tsr_pp_layer_chunk(const tsr_model_config *m, int pp, int v, const char *spec, int layer);
/* The split in words for the log: "explicit split of the layers (parallel.stage_layers =
 * '4,3'): stage 0 holds layers 0..3, stage 1 layers 4..6" (a stage with several chunks
 * lists each, in local order); cut with "..." to fit cap.  TSR_ERR_INPUT for a bad split. */
int tsr_pp_split_text(const tsr_model_config *m, tsr_schedule_choice kind, int pp, int v,
                      const char *spec, char *buf, size_t cap);
/* The most layers any chunk of stage `stage` holds; -1 for a bad split. */
int tsr_pp_stage_max_chunk(const tsr_model_config *m, tsr_schedule_choice kind, int pp, int v,
                           const char *spec, int stage);
/* The stage that holds `chunk` under schedule `kind` with pp stages and v chunks per
 * stage (see Chunks above); -1 for arguments out of range.  tsr_pp_stage_chunk is its
 * inverse: the global index of stage `stage`'s local chunk `local` (0 .. v - 1).
 * tsr_pp_head_stage: the stage of the last chunk (final norm, LM head, loss): pp - 1, or
 * 0 on the V placement; the embedding's stage is 0 on every placement. */
int tsr_pp_chunk_owner(tsr_schedule_choice kind, int pp, int v, int chunk);
int tsr_pp_stage_chunk(tsr_schedule_choice kind, int pp, int v, int stage, int local);
int tsr_pp_head_stage(tsr_schedule_choice kind, int pp, int v);

/* Ideal bubble fraction (idle time over step time, as defined above) when forward and
 * backward of a chunk take fixed times (F, B and W equal when split) and transfers are
 * free: the descriptor's bubble, which its file derives.  Negative for an unknown
 * schedule. */
double tsr_pp_ideal_bubble(tsr_schedule_choice kind, int pp, int m, int v);

/* Most (mb, chunk) pairs whose FORWARD has run and BACKWARD (BACKWARD_W when split) has
 * not, i.e. the peak number of activation sets alive on this stage. */
int tsr_pp_peak_in_flight(const tsr_pp_schedule *s);

const char *tsr_pp_op_name(tsr_pp_op op);

#endif
