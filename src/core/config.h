/* config.h — the run configuration: one plain struct per deck group.
 *
 * The deck schema in deck_schema.c maps every `&group key` to exactly one field here
 * (same words).  The struct is plain data with fixed-size strings so that rank 0
 * can parse the deck and broadcast the bytes to every other rank. */
#ifndef TSR_CONFIG_H
#define TSR_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtype.h" /* train.precision */
#include "rope.h" /* model.rope_scaling */

/* The choice keys hold the index of their word in the deck's list (deck_schema.c): these enums,
 * in the same order.  tsr_deck_word (deck.h) gives the word back for logs. */
typedef enum { TSR_DEVICE_AUTO, TSR_DEVICE_CPU, TSR_DEVICE_CUDA } tsr_device_choice;
typedef enum { TSR_ARCH_LLAMA, TSR_ARCH_GPT2 } tsr_arch;
/* parallel.schedule: a pipeline schedule of the registry (src/sched/registry.h), by its
 * index there; everything about it is its descriptor's (src/sched/schedule.h) */
typedef int tsr_schedule_choice;
typedef enum { TSR_INTER_NODE_MPI, TSR_INTER_NODE_NCCL } tsr_inter_node;
typedef enum { TSR_MPI_GPU_AUTO, TSR_MPI_GPU_DIRECT, TSR_MPI_GPU_STAGED } tsr_mpi_gpu;
/* parallel.offload: what lives in host memory on a GPU run */
typedef enum { TSR_OFFLOAD_NONE, TSR_OFFLOAD_OPTIMIZER } tsr_offload;
/* parallel.cp_comm: how attention crosses the context-parallel split */
typedef enum { TSR_CP_P2P, TSR_CP_A2A } tsr_cp_comm;
typedef enum { TSR_RECOMPUTE_NONE, TSR_RECOMPUTE_SELECTIVE, TSR_RECOMPUTE_FULL } tsr_recompute;
typedef enum { TSR_DECAY_COSINE, TSR_DECAY_LINEAR, TSR_DECAY_WSD, TSR_DECAY_CONSTANT } tsr_decay;
typedef enum { TSR_HW_H100, TSR_HW_H200, TSR_HW_A100, TSR_HW_CUSTOM, TSR_HW_CPU } tsr_hw_name;
/* hardware.implementation: whose kernels the planner's profile describes */
typedef enum { TSR_IMPL_TESSERA, TSR_IMPL_REFERENCE } tsr_hw_impl;
/* parallel.shard_scope: one of these, or a number of ranks (> 0) */
enum { TSR_SHARD_GLOBAL = 0, TSR_SHARD_NODE = -1 };
/* checkpoint.every_steps = 'auto': the Young-Daly interval (session.c, ckpt_interval.h) */
enum { TSR_EVERY_AUTO = -1 };
enum { TSR_LOGI_AUTO = -1 }; /* a logical key left to the code's rule ('auto') */
/* shard_scope as the deck writes it: "global", "node" or "8" */
static inline const char *tsr_shard_scope_text(int64_t v, char *buf, size_t cap) {
  if (v == TSR_SHARD_GLOBAL || v == TSR_SHARD_NODE)
    snprintf(buf, cap, "%s", v == TSR_SHARD_GLOBAL ? "global" : "node");
  else
    snprintf(buf, cap, "%lld", (long long)v);
  return buf;
}

#define TSR_STR_SHORT 32
#define TSR_STR_PATH 1024

typedef struct {
  char name[TSR_STR_SHORT * 2];
  char out_dir[TSR_STR_PATH];
  int64_t seed;
  int64_t max_steps;
  int64_t log_every;
  int64_t eval_every;  /* 0 = never */
  int64_t eval_steps;  /* validation batches per evaluation */
  double step_timeout_s;
  double heartbeat_s;         /* a rank not heard from this long ends the job; 0 = off */
  tsr_device_choice device;  /* auto | cpu | cuda */
  int gpu_share;              /* logical: several ranks per GPU allowed */
  int64_t sample_every;       /* a greedy sample line every N steps; 0 = never */
  char sample_prompt[256];    /* the text it continues; "" = a new document */
} tsr_run_config;

typedef struct {
  tsr_arch arch; /* llama | gpt2 */
  int64_t n_layer;
  int64_t d_model;
  int64_t n_head;
  int64_t n_kv_head;
  int64_t d_ff;
  int64_t vocab_size;
  int64_t seq_len;
  int64_t max_positions; /* the model's context (gpt2: pos_embed rows); seq_len <= it */
  double rope_theta;
  tsr_rope_scaling rope_scaling; /* none | llama3 (rope.h) */
  double rope_factor;           /* llama3: long wavelengths' frequencies divided by it */
  double rope_low_freq_factor;  /* llama3: wavelengths above original_context / it: scaled */
  double rope_high_freq_factor; /* llama3: wavelengths below original_context / it: kept */
  int64_t rope_original_context; /* llama3: the context the model was first trained at */
  double norm_eps;
  int tie_embeddings; /* logical */
  double init_std;    /* std of the normal init of weight matrices */
} tsr_model_config;

/* model.max_positions, whose 0 (a configuration not made by the deck parser) means seq_len */
static inline int64_t tsr_max_positions(const tsr_model_config *m) {
  return m->max_positions > 0 ? m->max_positions : m->seq_len;
}

typedef struct {
  int64_t tp;
  int64_t pp;
  int64_t cp;                      /* context-parallel ranks: each sequence split over them */
  tsr_cp_comm cp_comm;             /* p2p (ring attention) | a2a (all-to-all over heads) */
  int64_t zero_stage;
  int64_t shard_scope;             /* TSR_SHARD_GLOBAL | TSR_SHARD_NODE | ranks */
  int64_t ranks_per_node;          /* 0 = from MPI_COMM_TYPE_SHARED */
  tsr_schedule_choice schedule;    /* the registry's index (src/sched/registry.h) */
  int64_t micro_batches;           /* 0 = derived */
  int64_t virtual_stages;
  int sequence_parallel;
  tsr_inter_node inter_node;       /* GPU collectives of groups that span nodes: mpi | nccl */
  tsr_mpi_gpu mpi_gpu;             /* GPU memory through MPI: auto | direct | staged */
  tsr_offload offload;             /* none | optimizer: master weights and Adam on the host */
  double offload_fraction;         /* of the rank's shard offloaded (1 when on) */
  char stage_layers[TSR_STR_PATH]; /* layers per chunk: "" equal | "auto" | "4,3,..." */
} tsr_parallel_config;

typedef struct {
  int64_t micro_batch;  /* sequences per micro-batch per dp rank */
  int64_t global_batch; /* sequences per optimizer step, all ranks */
  tsr_dtype precision;           /* fp32 | bf16 | fp16: the storage type (dtype.h) */
  tsr_recompute recompute;       /* none | selective | full */
  int activation_offload;        /* a GPU run keeps stored activations in host memory */
  int deterministic;             /* bitwise reproducible steps (default); 0: a GPU may
                                  * take faster non-deterministic kernels */
  double grad_clip;              /* 0 = off */
  double loss_scale;             /* fp16: initial dynamic loss scale */
  int64_t loss_scale_window;     /* fp16: clean steps before the scale doubles */
  double min_loss_scale;         /* fp16: floor of the scale */
  int64_t xent_chunk_tokens;     /* rows per chunk of the fused LM head and loss; 0 = unfused */
} tsr_train_config;

typedef struct {
  double lr;
  double min_lr;
  int64_t warmup_steps;
  tsr_decay decay;           /* cosine | linear | wsd | constant */
  int64_t decay_steps;       /* 0 = run.max_steps */
  double wsd_decay_frac;     /* fraction of decay_steps spent decaying (wsd) */
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
} tsr_optim_config;

/* &data's lists: at most TSR_MAX_DATASETS training datasets (a weighted mixture) and as
 * many validation sets, each named (TSR_SET_NAME bytes with the NUL). */
#define TSR_MAX_DATASETS 16
#define TSR_SET_NAME 64
#define TSR_DECK_LOC 256 /* "file:line:col" of a value, for messages */

typedef struct {
  /* data.train: n_train globs ('' alone: none); weights (n_weights, each >= 0, a positive
   * sum) and names (n_names) one per glob once the deck is read (the deck fills the
   * defaults: equal weights, each glob's directory name) */
  char train_glob[TSR_MAX_DATASETS][TSR_STR_PATH];
  int n_train;
  double weights[TSR_MAX_DATASETS];
  int n_weights;
  char names[TSR_MAX_DATASETS][TSR_SET_NAME];
  int n_names;
  /* data.valid: the same for the validation sets ('' alone: no evaluation); valid_weights
   * weigh the sets' losses into the total val_loss */
  char valid_glob[TSR_MAX_DATASETS][TSR_STR_PATH];
  int n_valid;
  double valid_weights[TSR_MAX_DATASETS];
  int n_valid_weights;
  char valid_names[TSR_MAX_DATASETS][TSR_SET_NAME];
  int n_valid_names;
  /* where each glob was given ("deck.nml:7:11", "<command line>:arg2:12"; "" = the
   * default), for the messages about the files it matches: not a value (the effective
   * deck does not write it, and a deck read back from that has other places) */
  char train_at[TSR_MAX_DATASETS][TSR_DECK_LOC];
  char valid_at[TSR_MAX_DATASETS][TSR_DECK_LOC];
  int shuffle;
  int document_mask;       /* attention and positions restart at each document (logical) */
  int64_t eos_id;          /* the end-of-document id; -1 = the shards' tokenizer's */
  int64_t mean_doc_tokens; /* tessera plan: the documents' mean length; 0 = not known */
} tsr_data_config;

typedef struct {
  char dir[TSR_STR_PATH]; /* "" = <out_dir>/ckpt */
  int64_t every_steps;    /* 0 = only at the end; TSR_EVERY_AUTO: Young-Daly */
  double every_minutes;   /* 0 = off */
  int64_t keep;           /* newest kept; 0 = keep all */
  char resume[TSR_STR_PATH]; /* "auto" | "none" | path */
  char init_from[TSR_STR_PATH]; /* "" | a checkpoint whose weights start a new run */
  int save_initial;
  int save_last; /* a checkpoint after the last step (off: benchmark runs) */
  char mpiio_hints[TSR_STR_PATH]; /* "key=value,key=value" MPI_Info for writes; "" = none */
  int64_t alignment;              /* H5Pset_alignment bytes for writes; 0 = HDF5 default */
  int async; /* write from a host snapshot in a background thread; TSR_LOGI_AUTO: by rule */
  double mtbf_hours;              /* the job's mean time between failures; 0 = not given */
} tsr_checkpoint_config;

/* The machine a plan is made for (tessera plan; the trainer ignores it).  Zero figures
 * take the built-in table of `name`; 'custom' needs them all; 'cpu' measures this host. */
typedef struct {
  tsr_hw_name name;           /* h100 | h200 | a100 | custom | cpu */
  double peak_tflops;         /* dense bf16 tensor-core peak per GPU (bf16 runs) */
  double peak_fp32_tflops;    /* dense fp32 peak without tensor cores (fp32 runs: no TF32) */
  double hbm_gb;              /* memory per GPU, 1e9 bytes */
  double hbm_gbps;            /* memory bandwidth per GPU */
  double intra_node_gbps;     /* per GPU, one direction (NVLink) */
  double inter_node_gbps;     /* per GPU, one direction (network) */
  int64_t gpus_per_node;
  double compute_efficiency;  /* > 0: a flat fraction of peak for GEMMs and attention (0:
                                 the profile's curves) */
  double comm_efficiency;     /* > 0: a flat fraction of both links' bandwidth (0: profile) */
  double reserved_gb;         /* per GPU, held by the runtime (CUDA context, NCCL, cuBLAS) */
  double fs_gbps;             /* checkpoint write bandwidth of the file system, GB/s, the job */
  /* The host side of parallel.offload (src/plan/plan_profile.h); 0 = the built-in figure */
  double host_memory_gb;      /* host memory per node, 1e9 bytes */
  double pcie_gbps;           /* host <-> GPU copies per GPU, one direction */
  int64_t cpu_cores;          /* CPU cores per node */
  double cpu_adam_gbps;       /* bytes one core's AdamW moves per second, GB/s */
  double host_mem_gbps;       /* host memory bandwidth of a node the cores reach, GB/s */
  /* The kernel profile (src/plan/plan_profile.h); 0 (tp_overlap: < 0) = the built-in figure of
   * name and implementation */
  tsr_hw_impl implementation;
  double gemm_efficiency, gemm_fp32_efficiency, gemm_half_dim;
  double attention_efficiency, attention_bwd_efficiency;
  double attention_fp32_efficiency, attention_fp32_bwd_efficiency;
  double attention_half_seq, attention_half_hd;
  double memory_efficiency, kernel_us;
  double intra_node_efficiency, inter_node_efficiency;
  double intra_node_latency_us, inter_node_latency_us;
  double tp_overlap, gather_overlap;
} tsr_hardware_config;

typedef struct {
  tsr_run_config run;
  tsr_model_config model;
  tsr_parallel_config parallel;
  tsr_train_config train;
  tsr_optim_config optim;
  tsr_data_config data;
  tsr_checkpoint_config checkpoint;
  tsr_hardware_config hardware;
} tsr_config;

#endif
