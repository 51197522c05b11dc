/* plan_profile.h — the machine `tessera plan` predicts for: a GPU's datasheet figures
 * (peaks, memory, links) and a kernel profile that says what fraction of them each kind
 * of kernel reaches, from which the planner prices one micro-batch's computations and
 * transfers (plan_cost.c) before simulating the schedule (plan_sim.c).
 *
 * The profile's model, per kernel (docs/architecture.md "The planner's time model"):
 *   GEMM [m, k] x [k, n]   2 m n k / (peak x gemm_eff x s(m) s(n) s(k)),  s(x) = x / (x +
 *                          gemm_half_dim), at least its bytes at the memory rate;
 *   causal attention       its counted FLOPs (forward 2 B H T^2 hd, backward 2.5 x that) /
 *                          (peak x eff x T / (T + attention_half_seq) x hd / (hd +
 *                          attention_half_hd)), forward and backward efficiencies apart;
 *   element-wise kernels   their bytes / (hbm_gbps x memory_efficiency), AdamW's and the
 *                          other passes over whole buffers at most hbm_gbps;
 *   every kernel           + kernel_us (launch, or a CPU op's dispatch);
 *   one message on a link  latency + bytes / (link GB/s x link efficiency), NVLink inside
 *                          a node and the network between; a ring collective over t ranks
 *                          is 2 (t - 1) (all-reduce) or t - 1 messages of its ring bytes.
 * Built-in profiles describe either Tessera's kernels as measured (implementation
 * 'tessera') or a well-tuned stack (cuBLAS GEMMs, FlashAttention-class attention,
 * tensor-parallel collectives overlapped with GEMMs: 'reference'); plan_profile.c says
 * where each number comes from.  Any &hardware key set in the deck, or in a profile file
 * (`tessera plan --profile FILE`, what `bench/cuda_kernels --profile` writes), replaces the
 * built-in figure.  hardware.name = 'cpu' is this host, its rates measured at start-up
 * (tsr_plan_cpu_probe), so that a plan of a run on this machine can be checked against
 * the run (bench/plan_local.sh). */
#ifndef TSR_PLAN_PROFILE_H
#define TSR_PLAN_PROFILE_H

#include <stdio.h>

#include "core/config.h"

enum { TSR_LINK_INTRA = 0, TSR_LINK_INTER = 1 };

typedef struct {
  double gemm_eff[2];    /* [0] fp32 storage, [1] 16-bit: of the peak of that precision */
  double gemm_half_dim;  /* s(x) = x / (x + gemm_half_dim) per GEMM dimension */
  double attn_fwd[2], attn_bwd[2]; /* of the precision's peak, at long T and large hd */
  double attn_half_seq, attn_half_hd;
  double mem_eff;        /* of hbm_gbps: element-wise kernels, AdamW */
  double kernel_s;       /* fixed cost of one kernel */
  double link_eff[2], link_latency_s[2]; /* [TSR_LINK_INTRA], [TSR_LINK_INTER] */
  double tp_overlap;     /* fraction of tensor-parallel collective time hidden by compute */
  double gather_overlap; /* fraction of the next step's first forward that ZeRO 1-2's
                            gather of the updated parameters hides behind */
  double slowdown;       /* compute and memory times x this: ranks x threads over the
                            cores (a 'cpu' plan of an oversubscribed node); 1 elsewhere */
  char source[160];      /* where the figures come from, for the output */
} tsr_plan_profile;

/* One GPU's figures: the built-in table of &hardware name with the deck's figures on top. */
typedef struct {
  char name[TSR_STR_SHORT];
  double peak_tflops;      /* dense bf16 tensor cores: bf16 runs */
  double peak_fp32_tflops; /* dense fp32 without tensor cores: fp32 runs (the CUDA GEMMs
                              compute in CUBLAS_COMPUTE_32F, TF32 off) */
  double hbm_gb, hbm_gbps;
  double intra_node_gbps; /* per GPU, one direction */
  double inter_node_gbps;
  int gpus_per_node;
  double compute_efficiency, comm_efficiency, reserved_gb; /* the deck's (0: the profile) */
  double max_mem_frac; /* headroom: a plan fits when the GPU's peak plus reserved_gb is at
                          most this fraction of hbm_gb (1; `tessera plan --max-mem-frac`) */
  /* The host side of parallel.offload = 'optimizer' (plan.c): a node's memory, cores and
   * their memory bandwidth, each GPU's copies to and from it, one core's AdamW rate */
  double host_memory_gb, host_mem_gbps; /* per node */
  int cpu_cores;                        /* per node */
  double pcie_gbps;                     /* per GPU, one direction */
  double cpu_adam_gbps;                 /* per core: bytes AdamW reads and writes */
  tsr_hw_impl impl;    /* hardware.implementation */
  tsr_plan_profile prof;
} tsr_hardware;

/* TSR_ERR_INPUT with a message naming the hardware.* key for an unknown name or a
 * 'custom' figure left at 0.  'cpu' measures this host (tsr_plan_cpu_probe) unless the
 * deck gives its figures, with gpus_per_node (1 if unset) ranks per node. */
int tsr_plan_hardware(const tsr_hardware_config *deck, tsr_hardware *out);

/* 'cpu': measures, with the threads a trainer rank would use (OMP_NUM_THREADS, else this
 * host's cores over `ranks` ranks), the GEMM rate of the trainer's probe (the peak, as its
 * MFU line counts); forward and backward of that GEMM and of a small one with their
 * operands in rotation through 16 copies, as a step's layers meet them, not in the cache
 * (gemm_efficiency, gemm_half_dim); fp32 and bf16 attention at two sequence lengths and
 * two head sizes; a residual add and a norm streaming 8 MiB arrays (hbm_gbps), a layer's
 * element-wise kernels on a cache-sized activation (memory_efficiency, their rate over
 * it) and on 16 values (kernel_us); about a second in all.  The link is the one
 * tsr_plan_set_cpu_link recorded, else this machine's Open MPI shared memory as measured
 * by hand (plan_profile.c).  Figures the deck sets are kept. */
void tsr_plan_cpu_probe(const tsr_hardware_config *deck, tsr_hardware *hw, int ranks);
/* The shared-memory link between two ranks, measured by `mpirun -np 2 tessera plan`
 * (main.c: a ping-pong of 8 bytes and of 64 KiB before rank 0 plans). */
void tsr_plan_set_cpu_link(double latency_s, double bytes_per_s);

/* Seconds of one kernel, as the model above prices it (half: 16-bit storage). */
double tsr_plan_gemm_s(const tsr_hardware *hw, int half, double m, double n, double k);
double tsr_plan_attention_s(const tsr_hardware *hw, int half, int backward, double B, double H,
                            double T, double hd);
/* `kernels` element-wise kernels moving `bytes` in all */
double tsr_plan_memory_s(const tsr_hardware *hw, double bytes, double kernels);
/* AdamW and the other passes over whole buffers, larger than any cache: hbm_gbps x
 * min(1, memory_efficiency) */
double tsr_plan_stream_s(const tsr_hardware *hw, double bytes);
/* The CPU's AdamW for one GPU moving `bytes`: the cores of its node's share (cpu_cores /
 * gpus_per_node) at cpu_adam_gbps each, at most its share of host_mem_gbps */
double tsr_plan_cpu_adam_s(const tsr_hardware *hw, double bytes);
/* `bytes` copied between one GPU and the host, one direction, at pcie_gbps */
double tsr_plan_pcie_s(const tsr_hardware *hw, double bytes);
/* `messages` messages carrying `bytes` in all over the link */
double tsr_plan_link_s(const tsr_hardware *hw, int link, double bytes, double messages);
/* Ring collectives over t ranks (comm.h's convention), `bytes` the whole buffer.  A ring
 * across nodes moves at one network port per GPU: every rank sends its ring bytes at the
 * network's rate (bench/RESULTS.md "The planner against published runs" shows why not
 * more). */
double tsr_plan_all_reduce_s(const tsr_hardware *hw, int link, int t, double bytes);
double tsr_plan_gather_s(const tsr_hardware *hw, int link, int t,
                         double bytes); /* or a reduce-scatter */
/* An all-reduce of `bytes` of host memory over t ranks through MPI (the offloaded
 * gradient's part with hybrid replicas, zero.c): the ring's bytes at the slowest of the
 * network (across nodes; within one, shared memory needs none), the GPU's share of the
 * node's host_mem_gbps (3.5 passes over memory a byte on the wire across nodes, 4.5
 * through shared memory) and one core adding the reduce-scatter half at cpu_adam_gbps;
 * plus the latency of its rounds. */
double tsr_plan_host_all_reduce_s(const tsr_hardware *hw, int link, int t, double bytes);

/* The fraction of the shard a GPU run offloads: parallel.offload_fraction with
 * parallel.offload = 'optimizer', else 0 (a CPU run offloads nothing: its column never). */
double tsr_plan_offload_fraction(const tsr_config *cfg);
/* The elements of a shard of `own` that fraction f offloads, as zero.c rounds them
 * (tsr_zero_offloaded_length): f own rounded up to a multiple of 64, at most own. */
double tsr_plan_offloaded(double own, double f);

/* The optimizer offload's update of one GPU's shard (parallel.offload = 'optimizer', a
 * fraction f of its `own` elements, x of them offloaded), as zero.c runs it: the gradient
 * to the host (4 x bytes), the CPU's AdamW (reading master, m, v and the gradient, writing
 * master, m, v: 28 bytes a parameter, and the 16-bit compute copy: 30), the compute copy
 * back (2 or 4 x bytes), in pieces of TSR_PLAN_OFFLOAD_PIECE elements: a piece's copy to
 * the host queued ahead, its AdamW on the host once it is there, its copy back queued at
 * once, so that the three overlap each other and the update takes the slowest of them plus
 * one piece of each of the other two (filling and draining the pipe).  The device's AdamW
 * on the rest runs meanwhile.  All 0 without offload. */
enum { TSR_PLAN_OFFLOAD_PIECE = 1 << 21 };
/* Where the update sits in the step (tsr_plan_offload_place).  Either way the CPU's AdamW
 * of unit u's part and its copy back run when the next step's forward first asks for unit
 * u, behind the units before it: the step pays what the stage's first forward does not
 * hide.
 *  DEVICE_GRADS  ZeRO 0-1: the reduced gradient is on the device after the backward; its
 *                units' copies to the host are queued at the update, so all three
 *                pipelined;
 *  HOST_GRADS    ZeRO 2-3: each unit's reduced gradient piece went to the host during the
 *                backward (zero.c's host_grads); the last unit's copy is left, then the
 *                CPU's AdamW and the copies back pipelined. */
typedef enum {
  TSR_PLAN_UPDATE_DEVICE_GRADS = 0,
  TSR_PLAN_UPDATE_HOST_GRADS = 1
} tsr_plan_update_case;
typedef struct {
  double fraction;          /* f */
  double elements;          /* x: the offloaded elements */
  double piece;             /* elements of a piece: min(TSR_PLAN_OFFLOAD_PIECE, x) */
  double d2h_bytes, h2d_bytes, cpu_bytes;
  double d2h_s, cpu_s, h2d_s; /* at hardware.pcie_gbps and the CPU AdamW rate */
  double serial_s;          /* d2h + cpu + h2d: the three one after the other (reference) */
  double pipelined_s;       /* the three pipelined in pieces: the slowest plus one piece of
                               each of the other two (DEVICE_GRADS' update_s) */
  /* tsr_plan_offload_place: */
  tsr_plan_update_case where;
  int units;                /* the stage's ZeRO units (layers, embedding, head) */
  double last_d2h_s;        /* HOST_GRADS: the last unit's copy to the host,
                               d2h / units, left after the backward */
  double update_s;          /* what runs after the backward (and the last copy): the three
                               pipelined (DEVICE_GRADS), else the CPU's AdamW and the copy back
                               pipelined (the slower plus one piece of the other) */
  double first_forward_s;   /* the next step's first forward on the stage,
                               which hides as much of update_s */
  double tail_s;            /* what the step pays: last_d2h + max(0, update_s -
                               first_forward) */
  /* HOST_GRADS: the host's own work on the gradient, outside the update: each micro-batch's
   * unit pieces added into the host's gradient as they land (12 bytes an element: read
   * both, write one) during that micro-batch, of which what its forward and backward
   * (micro_s) do not hide is exposed, accum_exposed_s over the step's micro_batches; and
   * the gradient norm's pass over it after the backward (4 bytes an element), host_norm_s;
   * both at the CPU AdamW's rate in bytes a second.  0 at ZeRO 0-1. */
  double accum_s, micro_s, accum_exposed_s, host_norm_s;
  int micro_batches;
  /* HOST_GRADS with hybrid replicas (plan.c): the ring bytes of the offloaded part's
   * all-reduce over host memory and its time (tsr_plan_host_all_reduce_s), after the
   * device part's; 0 otherwise */
  double replica_host_bytes, replica_host_s;
} tsr_plan_offload;
/* That for `own` elements of a shard (the rank's optimizer state); nothing on hardware
 * 'cpu', where the run is on the host already.  Placed as DEVICE_GRADS with units 1 and
 * no forward to hide it. */
tsr_plan_offload tsr_plan_offload_of(const tsr_config *cfg, const tsr_hardware *hw, double own);
/* Places the update of o in the step of a stage at ZeRO stage `zero_stage` (host_grads at
 * 2-3 whenever something is offloaded, with or without hybrid replicas), with `units` ZeRO
 * units, a first forward of `first_forward` seconds (one micro-batch through its chunks)
 * and `micro_batches` micro-batches of `micro` seconds each (forward and backward): sets
 * where, units, last_d2h_s, update_s, first_forward_s, tail_s and the host's gradient
 * work. */
void tsr_plan_offload_place(tsr_plan_offload *o, int zero_stage, int units, double first_forward,
                            double micro, int micro_batches);
/* What a stage's optimizer takes in the step with o placed: the device's AdamW over the
 * `own - elements` elements it keeps (28 + e bytes an element, e the storage type's) beside
 * the offloaded update, the longer of the two, the device's after the last unit's copy to
 * the host (the gradient norm needs it); *unhidden (when not NULL): that device part,
 * which nothing hides.  Without the offload, the device's AdamW over all of own. */
double tsr_plan_update_s(const tsr_hardware *hw, const tsr_plan_offload *o, double own, double e,
                         double *unhidden);
/* Of a stage's gradient shard of `own` elements, those whose hybrid replicas' all-reduce
 * runs over host memory: the offloaded ones when o is placed as HOST_GRADS, else 0 (o may
 * be NULL). */
double tsr_plan_replica_host_elems(const tsr_plan_offload *o, double own);
/* The hybrid replicas' all-reduce of a stage's fp32 gradient shard of `own` elements over
 * t copies, as zero.c runs it: the device's part on the link, then, with the gradient on
 * the host (o placed as HOST_GRADS), the offloaded part over host memory
 * (tsr_plan_host_all_reduce_s), one after the other.  o may be NULL (nothing offloaded). */
double tsr_plan_replica_all_reduce_s(const tsr_hardware *hw, int link, int t, double own,
                                     const tsr_plan_offload *o);

/* train.activation_offload: a chunk's time for one micro-batch, `t` seconds of compute
 * through its `layers` layers (forward or backward), when each layer's block of `block`
 * bytes crosses PCIe (hardware.pcie_gbps) behind the next layer's compute: t + layers x
 * max(0, block / pcie - t / layers).  t without blocks or layers. */
double tsr_plan_act_offload_s(const tsr_hardware *hw, double t, int layers, double block);

/* The profile in deck syntax: the &hardware group with every figure, as a profile file
 * holds it (`tessera plan --print-profile`). */
void tsr_plan_profile_print(FILE *out, const tsr_hardware *hw);

#endif
