/* plan_sim.h — the planner's step time (docs/architecture.md "The planner's time model"):
 * what one micro-batch costs in each pipeline chunk, priced kernel by kernel from the
 * machine's profile (plan_cost.c), and the step built by replaying the schedule the
 * trainer executes (pipeline.h's action lists, as pp_exec.c runs them) with those costs,
 * the point-to-point transfers on their links, the data-parallel reductions on their own
 * link as zero.c issues them, and the optimizer (plan_sim.c).  plan.c calls it for every
 * plan; the closed form of the pipeline bubble stays beside it as a cross-check. */
#ifndef TSR_PLAN_SIM_H
#define TSR_PLAN_SIM_H

#include "model/model.h"
#include "plan.h"

/* One micro-batch through one chunk on one GPU (a tp rank), seconds. */
typedef struct {
  double f, b, w;          /* forward; backward (its B part when split); W (else 0) */
  double f_tp, b_tp, w_tp; /* of which tensor-parallel collectives left on the critical path */
  double f_cp, b_cp;       /* of which context-parallel transfers left on the critical path
                              (the ring's hops its block attention does not hide, the
                              all-to-alls); both 0 without cp */
  double gemm, attention, memory; /* of f + b + w, by kind of kernel (the rest is tp) */
  double recompute;        /* of b: what recomputation runs again */
  double act_block;        /* train.activation_offload (a GPU): one layer's block, bytes,
                              to the host per layer in the forward, back in the backward */
  double act_exposed;      /* of f + b: the copies' time the layers do not hide */
  double elems;            /* parameters of the chunk's units on this tp rank */
  int layers, units;       /* its layers; its ZeRO units (layers, embedding, head) */
} tsr_plan_chunk;

/* Chunk `chunk` (0 .. pp v - 1) of the deck's layout on grid g, priced on hw: the model's
 * own sizes (tsr_model_sizes_of) give every GEMM's shape, the attention's, the bytes of
 * the element-wise kernels and the collectives model_layer.c issues.  TSR_ERR_INPUT for a
 * bad layer split. */
int tsr_plan_chunk_cost(const tsr_config *cfg, const tsr_hardware *hw, const tsr_plan_grid *g,
                        int chunk, tsr_plan_chunk *out);

/* The model's sizes on one tp rank of a stage (first / last: it holds the embedding / the
 * head; layers_per_chunk: its largest chunk), for the tokens one cp rank holds: every
 * figure the planner takes from the model goes through here (plan.c). */
void tsr_plan_model_sizes(const tsr_config *cfg, int tp, int cp, int first, int last,
                          int layers_per_chunk, tsr_model_sizes *out);
/* What one cp rank sends in the cp group per layer and micro-batch, elements (plan.c,
 * docs/context_parallel.md "What the planner counts"); all 0 without cp. */
typedef struct {
  double fwd, bwd;          /* in the storage type: the forward, the backward */
  double bwd32;             /* in fp32: the backward (the ring's dK, dV sums) */
  double block;             /* p2p: one hop of the ring, the K and V of a rank's tokens */
  int calls_fwd, calls_bwd; /* a2a: the all-to-alls of the forward, of the backward */
} tsr_plan_cp_elems;
void tsr_plan_cp_layer(const tsr_config *cfg, const tsr_plan_grid *g, const tsr_model_sizes *d,
                       tsr_plan_cp_elems *x);
/* TSR_LINK_INTER when a group of `size` ranks spanning `span` consecutive ranks crosses
 * the nodes of rpn ranks, else TSR_LINK_INTRA (a group of one: intra). */
int tsr_plan_group_link(int size, long span, int rpn);

/* ---- the replay ----
 * Each stage walks its own action list (tsr_pp_schedule_create) in order, as pp_exec.c
 * does: a computation starts when the stage is free and its input is there; a send
 * leaves when its computation ends and arrives p2p seconds later, messages from one
 * stage to one neighbour one after another; receives are posted early and cost nothing.
 * Stage s's data-parallel reductions run on its own link, in the order issued: chunk c's
 * after its backward (or W) of the last micro-batch (every micro-batch with
 * reduce_every), in `pieces` equal parts released as the backward proceeds (zero.c
 * reduces a unit as soon as backward is done with it).  With `gather` (ZeRO 3) each F and
 * B first gathers the chunk's parameters on that link, issued when the stage's previous
 * computation starts (zero.c prefetches the next unit): the computation cannot start
 * before the first of its pieces is in, nor end before the last is.  pp = 1 runs
 * F, B (and W) of micro-batch 0, 1, ... as the trainer's gradient accumulation does. */
typedef struct {
  tsr_schedule_choice kind;
  int pp, m, v;
  const double *f, *b, *w; /* [pp v] by global chunk; w may be NULL (fused backward) */
  const double *p2p;       /* [pp]: one message between stage s and s + 1 (mod pp), NULL: 0 */
  const double *reduce;    /* [pp v] or NULL: chunk c's gradient reduction */
  const int *pieces;       /* [pp v] or NULL (1 each) */
  int reduce_every;
  const double *gather;    /* [pp v] or NULL */
} tsr_plan_sim_in;

typedef struct { /* [pp] arrays the caller provides */
  double *end;     /* when the stage's last computation ends (its window in the trainer's
                      bubble line runs from 0 to here) */
  double *busy;    /* its time computing */
  double *reduced; /* when its last reduction ends (its end when it has none) */
} tsr_plan_sim_out;

/* With many micro-batches the replay is extrapolated from two short ones.  Past its
 * warm-up a schedule repeats itself: every micro-batch with one chunk per stage or a V,
 * every pp micro-batches on the round placement with several (a group through all v
 * chunks), so each stage's end,
 * busy time and last reduction grow by the same amount per micro-batch however many more
 * there are.  tsr_plan_sim_window picks the two replays for m: with u = pp v and the window
 * w = u max(4, ceil(TSR_PLAN_SIM_WINDOW / u)) micro-batches, m0 = w + m mod u and
 * m1 = m0 + w, both congruent to m modulo u (so multiples of pp wherever m is one, as
 * several chunks on the round placement need, and in the same phase of the repeating pattern); it returns 1 when
 * m > m1, and then tsr_plan_simulate replays m0 and m1 and extends every output linearly
 * from m1 to m by its increment per micro-batch between the two (an end no earlier than
 * the busy time, a last reduction no earlier than the end).  For m <= m1 it is the full
 * replay, tsr_plan_simulate_full, bit for bit. */
enum { TSR_PLAN_SIM_WINDOW = 256 };
int tsr_plan_sim_window(int pp, int v, int m, int *m0, int *m1);
int tsr_plan_simulate(const tsr_plan_sim_in *in, tsr_plan_sim_out *out);
int tsr_plan_simulate_full(const tsr_plan_sim_in *in, tsr_plan_sim_out *out);

/* The whole plan's step: chunk costs, the replay, the tail (the tied embedding's
 * all-reduce, the gradient norm, AdamW over the shard, ZeRO 1-2's parameter gathers and
 * the hybrid copies' all-reduce after it), into p->sim, and p->t_step, p->tokens_per_s,
 * p->mfu from it (the closed form's kept in p->sim.closed_*). */
int tsr_plan_sim_step(tsr_plan *p, const tsr_config *cfg);

#endif
