/* plan.h — the planner behind `tessera plan` and the trainer's memory check.
 *
 * From a deck and a machine (nodes x GPUs per node, the &hardware figures) it works out,
 * without allocating the model: whether the layout divides, per-GPU memory by kind, FLOPs
 * per step, the pipeline bubble, the bytes each process group moves per step (the ring
 * convention of comm.h, counted exactly as comm.c counts them), a predicted step time and
 * MFU, and whether it fits (within --max-mem-frac of the GPU's memory).  `tessera plan
 * --search` ranks the layouts that fit, holding the keys the command line gives, and names
 * the smallest larger node count that fits when none does.  docs/architecture.md "The
 * planner" defines the FLOP count, the fit rule and the search; docs/context_parallel.md
 * "What the planner counts" what parallel.cp changes (a cp rank's tokens, the ring's or
 * the all-to-alls' buffers, traffic and time).
 *
 * Memory is planned buffer by buffer from the same tensor table the trainer uses
 * (layout.c) and the same sizing functions: the model's buffers from tsr_model_sizes_of
 * (model.h), by which model.c allocates them and pp_exec.c its activation messages, the
 * flat padding and unit slots of zero.h; the remaining items of zero.c, pp_exec.c and
 * session.c follow their allocations.  Parameters' compute copy, stored activations and
 * activation gradients take the deck's precision (bf16, fp16: 2 bytes), on the CPU as on a
 * GPU; gradients, Adam m and v and the master weights are fp32.  Two columns:
 *   TSR_PLAN_GPU  the target GPU: an fp32 run keeps one fp32 copy of the weights, which
 *                 is the master (the seeds' 16 bytes per parameter: 7B 112 GB); the
 *                 kernels' scratch beyond hardware.reserved_gb.
 *   TSR_PLAN_CPU  this build: a separate fp32 master always, the host-side tables, the
 *                 pipeline's extra posted-receive slots, and (peak) the setup's full fp32
 *                 initial copy.
 * With parallel.offload = 'optimizer' the GPU column loses the shard's master and Adam
 * moments, and its host items (tsr_plan_memory's host_*) hold them with zero.c's other
 * page-locked buffers; a node's GPUs together must fit hardware.host_memory_gb (the
 * plan's fits_host).  The offloaded update (tsr_plan_offload_of, plan_profile.h) takes
 * the device's AdamW's place in the step: docs/offload.md.
 * tests/unit/plan/test_plan.c holds the CPU figure to what model.c allocates, tests/e2e/plan.sh to the
 * trainer's measured memory under several layouts. */
#ifndef TSR_PLAN_H
#define TSR_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/ckpt_interval.h"
#include "comm/comm.h"
#include "core/config.h"
#include "comm/grid.h"
#include "plan_profile.h" /* tsr_hardware, tsr_plan_hardware, tsr_plan_offload */

/* The process grid of a plan (grid.h's numbers, without communicators).  Ranks: tp
 * fastest, then cp, dp, pp.  dp = world / (tp cp pp) data-parallel ranks; the cp ranks of
 * a sequence hold the same parameters, so the gradient reduction and ZeRO's shards span
 * the dp x cp = dpcp ranks of a (pp, tp) position (grid.h). */
typedef struct {
  int world, tp, pp, dp, v;  /* v: virtual stages (chunks per pipeline stage) */
  int shard, replicate;      /* dpcp = shard x replicate: the ZeRO shard group and its copies */
  int ranks_per_node;
  int micro_batches;         /* per dp rank per step: global_batch / (micro_batch * dp) */
  int cp, dpcp;              /* context-parallel ranks of a sequence (1: none); dp x cp */
} tsr_plan_grid;

/* Checks that the deck's layout divides on `world` ranks, ranks_per_node per node: world
 * by tp x cp x pp, heads, KV heads, d_ff and vocabulary by tp, layers by pp x virtual
 * stages, seq_len by 2 cp (and a2a's heads by cp), the global batch by micro_batch x dp,
 * tp inside a node, the shard scope.  Writes one line per problem into msg, naming the
 * deck keys and their values; returns the number of problems, and fills *g when there
 * are none. */
int tsr_plan_layout(const tsr_config *cfg, int world, int ranks_per_node, tsr_plan_grid *g,
                    char *msg, size_t len);
/* The grid a running trainer has (its shard size may come from detected nodes). */
tsr_plan_grid tsr_plan_grid_of(const tsr_config *cfg, const tsr_grid *grid);

typedef enum { TSR_PLAN_GPU = 0, TSR_PLAN_CPU = 1, TSR_PLAN_N_BACKENDS } tsr_plan_backend;

/* Bytes on one rank, by kind. */
typedef struct {
  double params, grads, master, optim; /* model state */
  double activations; /* kept for backward: in_flight sets of a chunk's layers, the head */
  double comm;        /* ZeRO shard and unit buffers, pipeline send/receive buffers */
  double workspace;   /* recompute target, gradient scratch, loss statistics, the batch */
  double total;       /* the sum: what a training step holds */
  double peak;        /* total + setup transients (CPU: the full fp32 initial copy) */
  double model;       /* of the total, what tsr_model_create_opt allocates (for the tests) */
  int in_flight;      /* activation sets kept (micro-batch chunks) */
  /* parallel.offload = 'optimizer' (GPU column only): page-locked host memory of this GPU's
   * rank, none of it in the device figures above (zero.c): the offloaded part of the
   * shard's fp32 master and Adam m, v, a host copy of its reduced fp32 gradient, and with
   * 16-bit storage the staging of its new compute copy */
  double host_master, host_optim, host_grads, host_staging;
  /* train.activation_offload (GPU column only): every slot's layer blocks, page-locked
   * (model.c; the device keeps a window of them, in activations above) */
  double host_acts;
  double host;        /* their sum */
} tsr_plan_memory;

/* Model state of `elems` parameters at a ZeRO stage with shard group `shard` (params,
 * grads, master, optim, the host items and total filled): 16 bytes per parameter in fp32,
 * where the weights are the master (zero.c); 2-byte weights and a separate fp32 master in
 * bf16 and fp16.  `offload` (0 to 1) of the rank's shard (own = elems at stage 0, else
 * elems / shard) offloaded (parallel.offload = 'optimizer'): its master (4 bytes a
 * parameter, in fp32 too: the device keeps its weights as the compute copy), m and v (8)
 * leave the device for the host, which also holds the gradient's copy (4) and, in 16-bit
 * storage, the compute copy's staging (2): on the host 18 bytes a parameter in bf16 and
 * fp16, 16 in fp32; on the device 12 and 8 fewer. */
tsr_plan_memory tsr_plan_state(double elems, int zero_stage, int shard, int half, double offload);
/* Memory of pipeline stage `stage` (its tp rank 0; tp ranks hold equal amounts). */
int tsr_plan_stage_memory(const tsr_config *cfg, const tsr_plan_grid *g, int stage,
                          tsr_plan_backend backend, tsr_plan_memory *out);
/* Activation sets a stage keeps in flight on the GPU: the schedule's descriptor says
 * (its in_flight, src/sched/); 1 without a pipeline. */
int tsr_plan_in_flight(tsr_schedule_choice schedule, int pp, int stage, int micro_batches,
                       int v);

/* Traffic of one rank per step in one group, ring convention (comm.h).  TSR_PLAN_DP is
 * the dp x cp group ("dp_cp" when cp > 1, as the trainer names it); TSR_PLAN_CP the cp
 * ranks of a sequence: the ring's K/V blocks (p2p) or the all-to-alls (a2a), formulas in
 * docs/context_parallel.md "What the planner counts". */
enum { TSR_PLAN_DP, TSR_PLAN_DP_SHARD, TSR_PLAN_DP_REPLICATE, TSR_PLAN_TP, TSR_PLAN_CP,
       TSR_PLAN_PP, TSR_PLAN_TIED, TSR_PLAN_N_GROUPS };
typedef struct {
  const char *name;  /* as the trainer's "comm per step" line names the group */
  int size;
  int inter_node;    /* the group spans nodes: its ring runs at the network's speed */
  double bytes[TSR_COMM_N_KINDS];
  double total;      /* all kinds but scalars */
  double seconds;    /* moving `total` over the group's link (set by tsr_plan_make) */
} tsr_plan_traffic;
int tsr_plan_stage_traffic(const tsr_config *cfg, const tsr_plan_grid *g, int stage,
                           tsr_plan_traffic out[TSR_PLAN_N_GROUPS]);

/* Forward FLOPs per token of the whole model: 2 per weight that takes part in a GEMM (every
 * 2-D weight but the lookups: the input embedding, unless it is also the tied LM head, and
 * learned positions) and the causal attention core, 2 seq_len d_model per layer (QK^T and
 * PV against seq_len / 2 keys on average).  Norms, biases, activations, the softmax and the
 * loss are element-wise and left out. */
double tsr_plan_forward_flops_per_token(const tsr_model_config *m);
/* Model FLOPs per token: 3 x forward (the backward twice the forward), whatever
 * train.recompute is. */
double tsr_plan_flops_per_token(const tsr_model_config *m);
/* The share of the causal attention core's (query, key) pairs that document masking
 * (data.document_mask) leaves, for documents of data.mean_doc_tokens = L tokens on average:
 * 1 without masking or without L.  The documents are taken as a memoryless stream: each
 * token ends its document with probability 1/L, whatever came before, and the sequences
 * cut it anywhere; a query at position t then sees (1 - q^(t+1)) / p keys on average
 * (p = 1/L, q = 1 - p), and the share is their sum over t < T against T (T + 1) / 2
 * (about 2 L / T for L << T).  It counts the pairs of one document, not the keys a kernel
 * computes and masks in the tiles crossing a boundary. */
double tsr_plan_doc_attention_share(const tsr_config *cfg);
/* Model FLOPs per token of the run: tsr_plan_flops_per_token less the attention FLOPs
 * document masking saves (tsr_plan_doc_attention_share).  The trainer's GFLOP/s and MFU
 * count with it. */
double tsr_plan_run_flops_per_token(const tsr_config *cfg);

typedef struct {
  tsr_plan_memory mem[TSR_PLAN_N_BACKENDS];
  tsr_plan_traffic comm[TSR_PLAN_N_GROUPS];
  double flops;       /* executed per step on one GPU of the stage (recompute included) */
  double recompute_flops; /* of which recomputation ('full': the layers' forward again) */
  double t_compute, t_tp, t_cp, t_pp, t_dp, t_optimizer; /* seconds; t_cp: context-parallel
                                         transfers left exposed; t_dp: the exposed part */
  tsr_plan_offload offload; /* parallel.offload: the update's copies and CPU time */
  double act_bytes;   /* train.activation_offload (a GPU): layer blocks to the host per step
                         (twice with a split backward: after the forward and after B) */
  double act_back;    /* ... and back (twice with a split backward: for B and for W) */
  double act_exposed; /* of t_compute: their PCIe time the layers do not hide */
  double sim_end, sim_busy, sim_idle; /* the replay (plan_sim.h): end of its schedule, time
                                         computing, waits over its window (as logged) */
  int done;           /* evaluated (a search evaluates stages 0, 1 and pp - 1 only, unless
                         parallel.stage_layers is set) */
  int layers;         /* transformer layers the stage holds */
} tsr_plan_stage;

typedef struct {
  tsr_plan_grid grid;
  tsr_hardware hw;
  int64_t n_params;
  int64_t n_gemm;         /* of which weights in GEMMs (tsr_plan_forward_flops_per_token) */
  double model_flops;     /* per step, whole job: flops_per_token x tokens = 3 x forward */
  double forward_flops;   /* the forward of one step */
  double attention_flops; /* of model_flops, the causal attention core's (what document
                             masking leaves of it) */
  double attention_saved_flops; /* what document masking saves of the core, not counted in
                                   model_flops (tsr_plan_doc_attention_share) */
  double recompute_flops; /* summed over GPUs: what recomputation runs again */
  double executed_flops;  /* summed over GPUs: model FLOPs (a KV head replicated over tp
                             ranks counted on each), plus recompute_flops */
  double bubble;          /* ideal idle fraction of the step (pipeline.h) */
  tsr_plan_stage *stages; /* [pp] */
  int worst[TSR_PLAN_N_BACKENDS]; /* the stage with the most memory */
  int critical;           /* the stage with the most compute and transfer time */
  double t_pipeline, t_step, tokens_per_s, mfu; /* the simulated step (plan_sim.h) */
  int fits;               /* fits_gpu and fits_host */
  int fits_gpu;           /* worst GPU peak + reserved_gb <= max_mem_frac x hbm_gb */
  int fits_host;          /* host_node <= hardware.host_memory_gb (1 without offload) */
  double host_node;       /* parallel.offload: page-locked bytes of a node, the GPUs of
                             the stage holding the most (its host x GPUs per node) */
  int host_stage;         /* that stage */
  struct {
    double pipeline;      /* the last stage's end of the schedule */
    double reduced;       /* the last data-parallel reduction's end */
    double tail;          /* after both: tied embedding, gradient norm, AdamW, gathers */
    double idle_mean, idle_max; /* waits over each stage's own window: the trainer's line */
    double bubble;        /* 1 - mean busy / pipeline: the closed form's definition */
    double closed_pipeline, closed_step; /* the closed form: busy / (1 - bubble) + tail */
    double tflops_per_gpu;/* model FLOPs per step / step / GPUs */
    double offload;       /* of the tail, what the step pays for the offloaded update
                             (tsr_plan_offload's tail_s, the stage with the most) */
    double offload_overlapped; /* the step if that update were also hidden behind the last
                             micro-batch's backward (not implemented: it needs the gradient
                             norm first) */
    double f, b, w;       /* one micro-batch through the critical stage's chunks */
    double gemm, attention, memory, tp, cp; /* of f + b + w, by kind (cp: the exposed
                                               part of the context-parallel transfers) */
    int critical;         /* the stage that ends last */
  } sim;
} tsr_plan;

/* Everything for one layout.  all_stages = 0 evaluates stages 0, 1, pp - 1 and the GPU
 * figure only (the others equal stage 1 but keep fewer micro-batches in flight).  Call
 * tsr_plan_destroy afterwards, also on failure. */
int tsr_plan_make(tsr_plan *p, const tsr_config *cfg, const tsr_hardware *hw,
                  const tsr_plan_grid *g, int all_stages);
void tsr_plan_destroy(tsr_plan *p);

/* plan_search.c: the layout search.  The keys it varies, in this order: */
enum { TSR_PLAN_FIX_TP, TSR_PLAN_FIX_CP, TSR_PLAN_FIX_CP_COMM, TSR_PLAN_FIX_PP,
       TSR_PLAN_FIX_VIRTUAL_STAGES, TSR_PLAN_FIX_SCHEDULE,
       TSR_PLAN_FIX_SEQUENCE_PARALLEL, TSR_PLAN_FIX_ZERO, TSR_PLAN_FIX_SHARD_SCOPE,
       TSR_PLAN_FIX_MICRO_BATCH, TSR_PLAN_FIX_MICRO_BATCHES, TSR_PLAN_FIX_RECOMPUTE,
       TSR_PLAN_FIX_OFFLOAD, TSR_PLAN_FIX_ACT_OFFLOAD, TSR_PLAN_N_SEARCHED };
/* The searched keys that `group.key=value` overrides name (bit k: key k), matched as the
 * deck matches keys, whatever their case; the search holds those at the deck's value. */
unsigned tsr_plan_search_fixed(int n, char *const *overrides);

typedef struct {
  int nodes, top, json;
  unsigned fixed;   /* tsr_plan_search_fixed */
  int deck_invalid; /* the deck's own layout is not valid with the overrides: no row for it */
} tsr_plan_search_opts;
/* Plans every layout on o->nodes nodes (hw's GPUs per node and headroom) and prints the
 * o->top fastest that fit, then the deck's own layout; when none fits, the smallest larger
 * node count (up to 65536) with a layout that fits, and its fastest.  cp > 1 is tried for
 * seq_len >= 16384, and for shorter sequences when nothing fits without it; then, when
 * still nothing fits, the optimizer offload (parallel.offload = 'optimizer' at every ZeRO stage;
 * not on hardware 'cpu', where it moves nothing); then, when nothing fits even so, the
 * activation offload as well (train.activation_offload, never with a split backward: the
 * trainer refuses the zero-bubble schedules with it).  A key the command line holds is not
 * searched.  *any_fit: some layout fits on o->nodes. */
int tsr_plan_search(const tsr_config *cfg, const tsr_hardware *hw, const tsr_plan_search_opts *o,
                    int *any_fit);

/* plan_ckpt.c: the checkpoint of a plan.  The file holds 12 bytes per parameter (the
 * deck's few kB and HDF5's metadata left out), written in bytes / hardware.fs_gbps; the
 * host snapshot of checkpoint.async holds 12 bytes per element of a rank's shard; with
 * checkpoint.mtbf_hours the Young-Daly interval at C = the write time and the predicted
 * step time (ckpt_interval.h). */
typedef struct {
  double bytes, write_s;
  double snapshot_bytes; /* host memory per GPU, of the stage holding the most */
  int snapshot_stage;
  double mtbf_s, step_s; /* mtbf_s 0: not given, nothing below is set */
  tsr_ckpt_interval young_daly;
  int64_t floor_steps;   /* ceil(write_s / step_s): the shortest interval of background writes */
  double deck_goodput;   /* the goodput at checkpoint.every_steps, when that is a number */
} tsr_plan_ckpt;
tsr_plan_ckpt tsr_plan_checkpoint(const tsr_plan *p, const tsr_config *cfg);
/* The checkpoint section of the tables, and the "checkpoint" member of the JSON (a line
 * ending in ",\n"). */
void tsr_plan_print_checkpoint(FILE *out, const tsr_plan *p, const tsr_config *cfg);
void tsr_plan_json_checkpoint(FILE *out, const tsr_plan *p, const tsr_config *cfg);

/* plan_cli.c: the command.  Readable tables or JSON of a plan; */
void tsr_plan_print(FILE *out, const tsr_plan *p, const tsr_config *cfg, int nodes);
void tsr_plan_print_json(FILE *out, const tsr_plan *p, const tsr_config *cfg, int nodes);
/* Exit code of `tessera plan --require-fit` when the plan, or with --search every layout,
 * does not fit. */
enum { TSR_PLAN_NO_FIT = 3 };
/* `tessera plan DECK [--nodes N] [--gpus-per-node G] [--hardware NAME] [--max-mem-frac F]
 * [--require-fit] [--json] [--search [--top K]] [group.key=value ...]`; returns the exit
 * code. */
int tsr_plan_main(int argc, char **argv);
/* The options of `tessera plan` that take a value ("--nodes 4"), NULL-terminated: how the
 * command line is read here, and how main finds the deck among the arguments. */
extern const char *const tsr_plan_valued_options[];

/* The trainer, after the first step of a run (`step`: 1, or the step after the one it
 * resumed from): logs the measured memory (max over ranks) next to the planned figures
 * of the backend that ran (`ran`: a GPU's device memory, or this build's host memory with
 * the GPU's figure beside it); with the optimizer offload on a GPU also the page-locked
 * host memory ZeRO allocated (`host`, max over ranks: tsr_zero_memory's host) next to the
 * planned host column. */
void tsr_plan_log_memory(const tsr_config *cfg, const tsr_grid *grid, tsr_plan_backend ran,
                         int64_t step, double in_use, double peak, double host);

#endif
