/* deck_schema.c — the deck's schema: every key of every group with its type, default,
 * range or choices and help, the single source of truth for parsing (deck.c), the
 * defaults, --help-deck, the effective deck written to logs and checkpoints, and the
 * words of the choice keys. */
#include "deck_schema.h"

#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "sched/registry.h"

const char *const deck_group_name[N_GROUP] = {"run",   "model", "parallel",  "train",
                                                "optim", "data",  "checkpoint", "hardware"};
static const char *const group_help[N_GROUP] = {
    "run identity, length, logging and evaluation",
    "transformer shape",
    "parallel layout: tensor (tp) x context (cp) x data (dp) x pipeline (pp); dp = world size / (tp*cp*pp)",
    "batch, precision and activation recompute",
    "AdamW and the learning-rate schedule",
    "token shards (see tools/tsr-prepare)",
    "restart files",
    "the GPUs `tessera plan` plans for (training ignores it); 0 = the built-in figure of name"};

static const char *const type_name[] = {"integer", "real", "logical", "string", "choice",
                                        "string", "int|auto", "log|auto", "strings", "reals"};

#define FLD(g, f, t) GI_##g, #f, t, offsetof(tsr_config, g.f), sizeof(((tsr_config *)0)->g.f)
#define INT(g, f, def, lo, hi, b, help) {FLD(g, f, K_INT), def, lo, hi, b, NULL, help, 0, 0}
#define REAL(g, f, def, lo, hi, b, help) {FLD(g, f, K_REAL), def, lo, hi, b, NULL, help, 0, 0}
#define LOGI(g, f, def, help) {FLD(g, f, K_LOGICAL), def, 0, 0, 0, NULL, help, 0, 0}
#define STR(g, f, def, shown, help) {FLD(g, f, K_STRING), def, 0, 0, 0, shown, help, 0, 0}
#define CHOICE(g, f, def, ch, help) {FLD(g, f, K_CHOICE), def, 0, 0, 0, ch, help, 0, 0}
#define SCOPE(g, f, def, shown, help) {FLD(g, f, K_SCOPE), def, 0, 0, 0, shown, help, 0, 0}
#define INT_AUTO(g, f, def, lo, help) {FLD(g, f, K_INT_AUTO), def, lo, 0, LO, NULL, help, 0, 0}
#define LOGI_AUTO(g, f, def, help) {FLD(g, f, K_LOGI_AUTO), def, 0, 0, 0, NULL, help, 0, 0}
/* lists: key `k` stored in field f, its count in n_k */
#define FLDN(g, k, f, t) GI_##g, #k, t, offsetof(tsr_config, g.f), sizeof(((tsr_config *)0)->g.f)
#define STRLIST(g, k, f, def, at, help)                                                       \
  {FLDN(g, k, f, K_STRLIST), def, 0, 0, 0, NULL, help, offsetof(tsr_config, g.n_##k), at}
#define REALLIST(g, k, def, lo, hi, b, help)                                                  \
  {FLDN(g, k, k, K_REALLIST), def, lo, hi, b, NULL, help, offsetof(tsr_config, g.n_##k), 0}

const key_def deck_schema[] = {
    STR(run, name, "tessera", NULL, "run name, shown in the log and stored in checkpoints"),
    STR(run, out_dir, "out", NULL, "directory for the log, metrics.jsonl and (by default) ckpt/"),
    INT(run, seed, "1234", 0, 0, LO, "seed of initialisation and data order"),
    INT(run, max_steps, "100", 0, 0, LO, "optimizer steps to train in total (a resumed run continues to it)"),
    INT(run, log_every, "1", 1, 0, LO, "print a step line every N steps"),
    INT(run, eval_every, "0", 0, 0, LO, "validation every N steps (0 = never)"),
    INT(run, eval_steps, "8", 1, 0, LO, "validation batches per evaluation"),
    REAL(run, step_timeout_s, "0", 0, 0, LO, "watchdog: abort if one step takes longer (0 = off)"),
    REAL(run, heartbeat_s, "10", 0, 0, LO,
         "heartbeat: abort, naming it, when a rank has not been heard from for this long (0 = off)"),
    CHOICE(run, device, "auto", "auto|cpu|cuda",
           "where the ops run: cuda = a GPU per rank, cpu, auto = cuda when built with it and every rank sees a GPU"),
    LOGI(run, gpu_share, ".false.", "allow several ranks of a node on one GPU (tests; not for speed)"),
    INT(run, sample_every, "0", 0, 0, LO,
        "log 'sample: <text>', 32 greedy tokens continuing sample_prompt, every N steps (0 = "
        "never; skipped with pp > 1)"),
    STR(run, sample_prompt, "", NULL, "text the sample line continues ('' = a new document)"),
    CHOICE(model, arch, "llama", "llama|gpt2", "llama: RMSNorm, RoPE, SwiGLU; gpt2: LayerNorm, GELU"),
    INT(model, n_layer, "4", 1, 1024, LO | HI, "transformer blocks"),
    INT(model, d_model, "128", 1, 65536, LO | HI, "hidden size"),
    INT(model, n_head, "4", 1, 4096, LO | HI, "query heads; head_dim = d_model / n_head"),
    INT(model, n_kv_head, "4", 1, 4096, LO | HI, "key/value heads (< n_head: grouped-query)"),
    INT(model, d_ff, "384", 1, 1048576, LO | HI, "MLP hidden size"),
    INT(model, vocab_size, "2048", 1, 16777216, LO | HI, "embedding rows (>= tokenizer vocab)"),
    INT(model, seq_len, "128", 1, 1048576, LO | HI, "tokens per sequence"),
    INT(model, max_positions, "0", 0, 1048576, LO | HI,
        "the model's context: the most tokens a sequence may have (seq_len <= it); gpt2's "
        "pos_embed has this many rows (0 = seq_len)"),
    REAL(model, rope_theta, "10000", 0, 0, LO | LO_OPEN, "RoPE base (llama)"),
    CHOICE(model, rope_scaling, "none", "none|llama3",
           "RoPE frequencies as they are, or rescaled as Llama 3.1's (the rope_ keys below)"),
    REAL(model, rope_factor, "8", 0, 0, LO | LO_OPEN,
         "llama3: the long wavelengths' frequencies are divided by it"),
    REAL(model, rope_low_freq_factor, "1", 0, 0, LO | LO_OPEN,
         "llama3: wavelengths above rope_original_context / this are scaled by 1/rope_factor"),
    REAL(model, rope_high_freq_factor, "4", 0, 0, LO | LO_OPEN,
         "llama3: wavelengths below rope_original_context / this are kept; in between, "
         "interpolated"),
    INT(model, rope_original_context, "8192", 1, 1048576, LO | HI,
        "llama3: the context length the model was pre-trained at"),
    REAL(model, norm_eps, "1e-5", 0, 1, LO | HI | LO_OPEN, "epsilon of RMSNorm / LayerNorm"),
    LOGI(model, tie_embeddings, ".false.",
         "LM head shares the embedding matrix; when not given, .true. for gpt2 and .false. "
         "for llama"),
    REAL(model, init_std, "0.02", 0, 1, LO | HI | LO_OPEN, "std of the normal init of weights"),
    INT(parallel, tp, "1", 1, 65536, LO | HI, "tensor-parallel ranks (inside a node)"),
    INT(parallel, pp, "1", 1, 65536, LO | HI, "pipeline stages"),
    INT(parallel, cp, "1", 1, 65536, LO | HI,
        "context-parallel ranks: each sequence is cut into 2 cp chunks, rank r holding chunks "
        "r and 2 cp - 1 - r (model.seq_len divisible by 2 cp); parameters are replicated over "
        "cp and ZeRO shards over dp x cp"),
    CHOICE(parallel, cp_comm, "p2p", "p2p|a2a",
           "attention across the cp split: p2p, a ring passing each rank's keys and values "
           "(any head count); a2a, all-to-alls trading the sequence split for a head split "
           "(cp must divide the tp-local query heads, and divide or be a multiple of the KV "
           "heads)"),
    INT(parallel, zero_stage, "0", 0, 3, LO | HI,
        "0 DDP, 1 shard optimizer state, 2 + gradients, 3 + parameters"),
    SCOPE(parallel, shard_scope, "global", "global|node|<N>",
        "ZeRO shard group: all dp ranks, the ranks of a node, or N ranks"),
    INT(parallel, ranks_per_node, "0", 0, 65536, LO | HI, "0 = detect; set to test multi-node"),
    CHOICE(parallel, schedule, "1f1b", TSR_SCHED_WORDS,
           "pipeline schedule; zb_h1: 1F1B with the backward split into B (input gradients) "
           "and W (weight gradients), W delayed into the bubble; zb_v: the split backward on "
           "two chunks per stage placed in a V (chunks s and 2 pp - 1 - s on stage s, so "
           "stage 0 holds the embedding and the head; virtual_stages = 2).  Both need pp >= 2 "
           "and recompute 'none'"),
    INT(parallel, micro_batches, "0", 0, 0, LO,
        "micro-batches per step (0 = global_batch / (micro_batch*dp))"),
    INT(parallel, virtual_stages, "1", 1, 1024, LO | HI, "model chunks per stage (interleaved)"),
    STR(parallel, stage_layers, "", "auto|<n,n,...>",
        "layers of each of the pp*virtual_stages chunks in chunk order (chunk c on stage c % "
        "pp; zb_v: chunks s and 2 pp - 1 - s on stage s): '' equal chunks, 'auto' balanced by FLOPs with the embedding on the first and "
        "the LM head on the last chunk, or a list such as '4,3' (each >= 1, summing to "
        "model.n_layer)"),
    LOGI(parallel, sequence_parallel, ".false.", "shard norm/dropout activations over tp"),
    CHOICE(parallel, inter_node, "mpi", "mpi|nccl",
           "GPU collectives of groups spanning nodes (those inside a node use NCCL)"),
    CHOICE(parallel, offload, "none", "none|optimizer",
           "optimizer: a GPU run keeps its shard's fp32 master weights and Adam moments in "
           "page-locked host memory and updates them with the CPU's AdamW (12 bytes a "
           "parameter off the device); a CPU run has nothing to offload"),
    REAL(parallel, offload_fraction, "1", 0, 1, LO | HI,
         "the fraction of the shard parallel.offload = 'optimizer' moves to the host"),
    CHOICE(parallel, mpi_gpu, "auto", "auto|direct|staged",
           "GPU memory through MPI: direct (CUDA-aware MPI), staged (pinned host copies), auto"),
    INT(train, micro_batch, "8", 1, 0, LO, "sequences per micro-batch per dp rank"),
    INT(train, global_batch, "8", 1, 0, LO, "sequences per optimizer step"),
    CHOICE(train, precision, "fp32", "fp32|bf16|fp16", "storage / compute precision"),
    CHOICE(train, recompute, "none", "none|selective|full", "activation recomputation"),
    LOGI(train, activation_offload, ".false.",
         "a GPU run copies each layer's stored activations to host memory in the forward and "
         "back before its backward; a CPU run has nothing to offload"),
    LOGI(train, deterministic, ".true.",
         "bitwise reproducible steps (a restart repeats the run exactly); .false. lets a GPU "
         "take faster non-deterministic kernels (cuDNN's attention backward)"),
    REAL(train, grad_clip, "1.0", 0, 0, LO, "clip the global gradient norm (0 = off)"),
    REAL(train, loss_scale, "65536", 0, 0, LO | LO_OPEN,
         "fp16: initial dynamic loss scale; halved on a step whose gradients overflow (the "
         "update is skipped)"),
    INT(train, loss_scale_window, "1000", 1, 0, LO,
        "fp16: the loss scale doubles after this many steps without overflow"),
    REAL(train, min_loss_scale, "1", 0, 0, LO | LO_OPEN, "fp16: the loss scale's floor"),
    INT(train, xent_chunk_tokens, "1024", 0, 0, LO,
        "tokens per chunk of the fused LM head and cross-entropy: only one chunk's logits "
        "exist at a time (0 = unfused: a micro-batch's whole logits are stored)"),
    REAL(optim, lr, "3e-4", 0, 10, LO | HI, "peak learning rate"),
    REAL(optim, min_lr, "3e-5", 0, 10, LO | HI, "learning rate at the end of the decay"),
    INT(optim, warmup_steps, "10", 0, 0, LO, "linear warmup steps"),
    CHOICE(optim, decay, "cosine", "cosine|linear|wsd|constant", "decay after warmup"),
    INT(optim, decay_steps, "0", 0, 0, LO, "length of warmup + decay (0 = run.max_steps)"),
    REAL(optim, wsd_decay_frac, "0.2", 0, 1, LO | HI | LO_OPEN,
         "wsd: fraction of the steps after warmup (decay_steps - warmup_steps) spent decaying"),
    REAL(optim, beta1, "0.9", 0, 1, LO | HI | HI_OPEN, "Adam first-moment decay"),
    REAL(optim, beta2, "0.95", 0, 1, LO | HI | HI_OPEN, "Adam second-moment decay"),
    REAL(optim, eps, "1e-8", 0, 1, LO | HI | LO_OPEN, "Adam epsilon"),
    REAL(optim, weight_decay, "0.1", 0, 10, LO | HI, "decoupled weight decay (2-D weights)"),
    STRLIST(data, train, train_glob, "", offsetof(tsr_config, data.train_at),
            "path or glob of training shards, e.g. 'data/x/train_*.bin'; several make a "
            "weighted mixture of datasets: 'web/train_*.bin', 'code/train_*.bin'"),
    REALLIST(data, weights, "1.0", 0, 0, LO,
             "each training dataset's share of the samples, normalised by their sum (one "
             "per train glob; default: equal)"),
    STRLIST(data, names, names, "train", 0,
            "each training dataset's name in the log and metrics.jsonl (letters, digits, "
            "'_', '-', '.'; default: the directory of its glob)"),
    STRLIST(data, valid, valid_glob, "", offsetof(tsr_config, data.valid_at),
            "path or glob of validation shards ('' = no evaluation); several are validation "
            "sets, each reported on its own"),
    REALLIST(data, valid_weights, "1.0", 0, 0, LO,
             "the validation sets' weights in the total val_loss (default: data.weights "
             "when there are as many sets as training datasets, else equal)"),
    STRLIST(data, valid_names, valid_names, "valid", 0,
            "each validation set's name (default: the directory of its glob)"),
    LOGI(data, shuffle, ".true.", "a seeded permutation of the samples, new each epoch; .false.: in file order"),
    LOGI(data, document_mask, ".false.",
         "document masking: a token attends only to the earlier tokens of its own document "
         "(a document ends with its end-of-document token), and positions (RoPE, learned) "
         "count from 0 at each document's first token; every target stays in the loss"),
    INT(data, eos_id, "-1", -1, 16777215, LO | HI,
        "document_mask: the end-of-document token id (-1 = the shards' tokenizer's: 0 for "
        "'bytes', the SentencePiece model's </s> for 'spm:NAME', the eos_token of "
        "tokenizer_config.json for 'hf:FILE'); below model.vocab_size"),
    INT(data, mean_doc_tokens, "0", 0, 0, LO,
        "document_mask: the documents' mean length in tokens, from which tessera plan counts "
        "the attention FLOPs masking saves (0 = not known: none counted); training ignores it"),
    STR(checkpoint, dir, "", NULL, "checkpoint directory ('' = <out_dir>/ckpt)"),
    INT_AUTO(checkpoint, every_steps, "0", 0,
             "save every N steps (0 = only at the end); 'auto': the Young-Daly interval "
             "sqrt(2 C MTBF) / step time, C the measured time a checkpoint holds training up, "
             "re-estimated at every checkpoint (needs mtbf_hours)"),
    REAL(checkpoint, every_minutes, "0", 0, 0, LO, "also save every M minutes (0 = off)"),
    INT(checkpoint, keep, "3", 0, 0, LO, "newest checkpoints kept (0 = keep all)"),
    STR(checkpoint, resume, "auto", "auto|none|<path>",
        "'auto' newest complete checkpoint in dir, 'none', or a file"),
    STR(checkpoint, init_from, "", NULL,
        "a checkpoint (ours, or tools/tsr-import's) whose weights alone start this run: step "
        "0, a fresh optimizer, this deck's schedule and data.  With resume = 'auto' a "
        "checkpoint of this run's own directory wins (a requeued job resumes); with resume = "
        "<file> it is an error"),
    LOGI(checkpoint, save_initial, ".false.", "write step_00000000.h5 before the first update"),
    LOGI(checkpoint, save_last, ".true.",
         "write a checkpoint after the last step (run.max_steps); .false. for runs that only "
         "measure"),
    STR(checkpoint, mpiio_hints, "", "key=value,...",
        "MPI-IO hints for checkpoint writes, e.g. 'romio_cb_write=enable,cb_buffer_size=16777216'"),
    INT(checkpoint, alignment, "0", 0, 1073741824, LO | HI,
        "align file objects of at least this many bytes to it (H5Pset_alignment; 0 = HDF5 "
        "default)"),
    LOGI_AUTO(checkpoint, async, "auto",
         "copy the state to a host snapshot and write it in a background thread while training "
         "goes on (used when the snapshot fits in half the node's available memory; "
         ".false. writes synchronously); 'auto': on with a GPU, or where the node's ranks and "
         "their threads leave a core free for the writer, off otherwise"),
    REAL(checkpoint, mtbf_hours, "0", 0, 0, LO,
         "mean time between failures of the job, hours: every_steps = 'auto' needs it > 0; "
         "tessera plan gives the expected goodput with it (0 = not given)"),
        CHOICE(hardware, name, "h100", "h100|h200|a100|custom|cpu",
           "built-in SXM figures, 8 per node: h100 989 TFLOP/s bf16, 67 fp32, 80 GB, 3350 GB/s, "
           "links 450 / 50 GB/s; h200 the same with 141 GB, 4800 GB/s; a100 312 TFLOP/s bf16, "
           "19.5 fp32, 80 GB, 2039 GB/s, 300 / 25 GB/s; 'custom': set every figure below; "
           "'cpu': this host, its kernel rates measured when tessera plan starts"),
    REAL(hardware, peak_tflops, "0", 0, 0, LO,
         "dense bf16 tensor-core TFLOP/s per GPU (bf16 runs)"),
    REAL(hardware, peak_fp32_tflops, "0", 0, 0, LO,
         "dense fp32 TFLOP/s per GPU without tensor cores (fp32 runs: cuBLAS fp32 compute, no "
         "TF32)"),
    REAL(hardware, hbm_gb, "0", 0, 0, LO, "memory per GPU in GB (1e9 bytes)"),
    REAL(hardware, hbm_gbps, "0", 0, 0, LO, "memory bandwidth per GPU, GB/s"),
    REAL(hardware, intra_node_gbps, "0", 0, 0, LO, "NVLink GB/s per GPU, one direction"),
    REAL(hardware, inter_node_gbps, "0", 0, 0, LO, "network GB/s per GPU, one direction"),
    INT(hardware, gpus_per_node, "0", 0, 65536, LO | HI, "GPUs per node (plan --gpus-per-node wins)"),
    REAL(hardware, compute_efficiency, "0", 0, 1, LO | HI,
         "> 0: GEMMs and attention at this flat fraction of peak instead of the profile's "
         "curves (predicted time)"),
    REAL(hardware, comm_efficiency, "0", 0, 1, LO | HI,
         "> 0: collectives at this flat fraction of link bandwidth instead of the profile's"),
    REAL(hardware, reserved_gb, "2", 0, 0, LO, "GB per GPU held by the CUDA/NCCL runtime"),
    REAL(hardware, fs_gbps, "5", 0, 0, LO | LO_OPEN,
         "GB/s the job's checkpoint writes reach on its file system (an assumption: the "
         "plan's write time and Young-Daly interval)"),
    REAL(hardware, host_memory_gb, "0", 0, 0, LO,
         "host memory per node in GB, what parallel.offload's page-locked state must fit in "
         "(0: the built-in node's: 2048 for h100, h200 and a100, as their DGX nodes)"),
    REAL(hardware, pcie_gbps, "0", 0, 0, LO,
         "host <-> GPU copy GB/s per GPU, one direction (0: built-in, PCIe Gen5 x16 50 for "
         "h100 and h200, Gen4 x16 25 for a100)"),
    INT(hardware, cpu_cores, "0", 0, 1048576, LO | HI,
        "CPU cores per node that run parallel.offload's AdamW (0: built-in, 112 for h100 and "
        "h200, 128 for a100, as their DGX nodes)"),
    REAL(hardware, cpu_adam_gbps, "0", 0, 0, LO,
         "GB/s one CPU core's AdamW moves (30 bytes a parameter in 16-bit storage, 28 in fp32; "
         "0: the built-in figure)"),
    REAL(hardware, host_mem_gbps, "0", 0, 0, LO,
         "host memory GB/s a node's cores reach together, the CPU AdamW's ceiling (0: "
         "built-in, 394 for h100 and h200, 287 for a100: 0.7 of their DDR peaks)"),
    CHOICE(hardware, implementation, "tessera", "tessera|reference",
           "whose kernels the profile describes: Tessera's as measured, or a well-tuned stack "
           "(cuBLAS GEMMs, FlashAttention-class attention, overlapped tp collectives); plan "
           "--implementation sets it"),
    REAL(hardware, gemm_efficiency, "0", 0, 0, LO,
         "profile: fraction of the bf16 peak a large 16-bit GEMM reaches (a measured 'cpu' profile, whose peak is its own probe, may exceed 1)"),
    REAL(hardware, gemm_fp32_efficiency, "0", 0, 0, LO,
         "profile: fraction of the fp32 peak a large fp32 GEMM reaches"),
    REAL(hardware, gemm_half_dim, "0", 0, 0, LO,
         "profile: a GEMM dimension x scales the efficiency by x / (x + gemm_half_dim)"),
    REAL(hardware, attention_efficiency, "0", 0, 0, LO,
         "profile: fraction of the bf16 peak causal attention's forward reaches at long "
         "sequences (counted FLOPs: the causal half)"),
    REAL(hardware, attention_bwd_efficiency, "0", 0, 0, LO,
         "profile: the same for attention's backward (counted as 2.5 x the forward)"),
    REAL(hardware, attention_fp32_efficiency, "0", 0, 0, LO,
         "profile: fraction of the fp32 peak fp32 attention's forward reaches"),
    REAL(hardware, attention_fp32_bwd_efficiency, "0", 0, 0, LO,
         "profile: the same for fp32 attention's backward"),
    REAL(hardware, attention_half_seq, "0", 0, 0, LO,
         "profile: sequence length T scales attention's efficiency by T / (T + this)"),
    REAL(hardware, attention_half_hd, "0", 0, 0, LO,
         "profile: head_dim hd scales attention's efficiency by hd / (hd + this)"),
    REAL(hardware, memory_efficiency, "0", 0, 0, LO,
         "profile: fraction of hbm_gbps element-wise kernels and AdamW reach"),
    REAL(hardware, kernel_us, "0", 0, 0, LO, "profile: fixed cost of one kernel, microseconds"),
    REAL(hardware, intra_node_efficiency, "0", 0, 1, LO | HI,
         "profile: fraction of intra_node_gbps a collective's or a transfer's bytes reach"),
    REAL(hardware, inter_node_efficiency, "0", 0, 1, LO | HI,
         "profile: fraction of inter_node_gbps a collective's or a transfer's bytes reach"),
    REAL(hardware, intra_node_latency_us, "0", 0, 0, LO,
         "profile: latency of one message (one ring step) inside a node, microseconds"),
    REAL(hardware, inter_node_latency_us, "0", 0, 0, LO,
         "profile: latency of one message (one ring step) between nodes, microseconds"),
    REAL(hardware, tp_overlap, "-1", -1, 1, LO | HI,
         "profile: fraction of tensor-parallel collective time hidden behind compute (< 0: "
         "the built-in figure)"),
    REAL(hardware, gather_overlap, "-1", -1, 1, LO | HI,
         "profile: fraction of the next step's first forward that ZeRO 1-2's gather of the "
         "updated parameters hides behind (< 0: the built-in figure)"),
};
const int deck_n_keys = (int)(sizeof deck_schema / sizeof deck_schema[0]);
_Static_assert(sizeof deck_schema / sizeof deck_schema[0] <= DECK_MAX_KEYS,
               "more deck keys than DECK_MAX_KEYS");

/* ---------------------------------------------------------------- keys and values */

int deck_lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* a (NUL-terminated) equals p[0..n) ignoring case */
int deck_ieq(const char *a, const char *p, size_t n) {
  size_t i = 0;
  for (; i < n && a[i]; i++)
    if (deck_lower((unsigned char)a[i]) != deck_lower((unsigned char)p[i])) return 0;
  return i == n && a[i] == 0;
}

int deck_find_group(const char *p, size_t n) {
  for (int g = 0; g < N_GROUP; g++)
    if (deck_ieq(deck_group_name[g], p, n)) return g;
  return -1;
}
int deck_find_key(int g, const char *p, size_t n) {
  for (int k = 0; k < deck_n_keys; k++)
    if (deck_schema[k].group == g && deck_ieq(deck_schema[k].name, p, n)) return k;
  return -1;
}
int deck_key_id(int g, const char *name) { return deck_find_key(g, name, strlen(name)); }

int64_t *deck_ival(tsr_config *c, int k) { return (int64_t *)((char *)c + deck_schema[k].offset); }
double *deck_rval(tsr_config *c, int k) { return (double *)((char *)c + deck_schema[k].offset); }
int *deck_lval(tsr_config *c, int k) { return (int *)((char *)c + deck_schema[k].offset); }
char *deck_sval(tsr_config *c, int k) { return (char *)c + deck_schema[k].offset; }
int deck_is_list(int k) {
  return deck_schema[k].type == K_STRLIST || deck_schema[k].type == K_REALLIST;
}
int *deck_nval(tsr_config *c, int k) { return (int *)((char *)c + deck_schema[k].count_off); }
size_t deck_elem_size(int k) { return deck_schema[k].size / TSR_MAX_DATASETS; }
char *deck_sval_at(tsr_config *c, int k, int i) {
  return (char *)c + deck_schema[k].offset + (size_t)i * deck_elem_size(k);
}

/* Word i of a choice list "a|b|c" into buf (empty when there is none). */
void deck_choice_word(const char *choices, int i, char *buf, size_t cap) {
  const char *c = choices;
  for (; i > 0 && *c; i--) c += strcspn(c, "|") + (c[strcspn(c, "|")] == '|');
  snprintf(buf, cap, "%.*s", (int)strcspn(c, "|"), c);
}
/* The index of word v[0..n) in a choice list (case-insensitive), or -1. */
int deck_choice_index(const char *choices, const char *v, size_t n) {
  int i = 0;
  for (const char *c = choices; *c; i++) {
    const size_t m = strcspn(c, "|");
    char opt[32];
    snprintf(opt, sizeof opt, "%.*s", (int)m, c);
    if (deck_ieq(opt, v, n)) return i;
    c += m + (c[m] == '|');
  }
  return -1;
}

/* Shortest of %.15g..%.17g that reads back exactly; always looks like a real. */
static void fmt_real(char *buf, size_t cap, double v) {
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) break;
  }
  if (!strpbrk(buf, ".eni")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* A string in deck syntax: quoted, a quote doubled; at most n bytes of s. */
static void fmt_string(char *buf, size_t cap, const char *s, size_t n) {
  size_t o = 0;
  buf[o++] = '\'';
  for (size_t i = 0; i < n && s[i] && o + 3 < cap; i++) {
    if (s[i] == '\'') buf[o++] = '\'';
    buf[o++] = s[i];
  }
  buf[o++] = '\'';
  buf[o] = 0;
}

/* Value of key k in deck syntax (a list: its values separated by ", ").  cap >= VALBUF
 * always fits it. */
void deck_fmt_value(const tsr_config *c, int k, char *buf, size_t cap) {
  tsr_config *cc = (tsr_config *)c;
  if (deck_is_list(k)) {
    size_t o = 0;
    const int n = *deck_nval(cc, k);
    buf[0] = 0;
    for (int i = 0; i < n && o + 8 < cap; i++) {
      if (i) o += (size_t)snprintf(buf + o, cap - o, ", ");
      if (deck_schema[k].type == K_REALLIST)
        fmt_real(buf + o, cap - o, deck_rval(cc, k)[i]);
      else
        fmt_string(buf + o, cap - o, deck_sval_at(cc, k, i), deck_elem_size(k));
      o += strlen(buf + o);
    }
    return;
  }
  switch (deck_schema[k].type) {
  case K_INT: snprintf(buf, cap, "%lld", (long long)*deck_ival(cc, k)); break;
  case K_INT_AUTO:
    if (*deck_ival(cc, k) == TSR_EVERY_AUTO) snprintf(buf, cap, "'auto'");
    else snprintf(buf, cap, "%lld", (long long)*deck_ival(cc, k));
    break;
  case K_REAL: fmt_real(buf, cap, *deck_rval(cc, k)); break;
  case K_LOGICAL: snprintf(buf, cap, "%s", *deck_lval(cc, k) ? ".true." : ".false."); break;
  case K_LOGI_AUTO:
    snprintf(buf, cap, "%s", *deck_lval(cc, k) == TSR_LOGI_AUTO ? "'auto'"
                             : *deck_lval(cc, k)                ? ".true."
                                                                : ".false.");
    break;
  case K_CHOICE: {
    char w[32];
    deck_choice_word(deck_schema[k].choices, *deck_lval(cc, k), w, sizeof w);
    snprintf(buf, cap, "'%s'", w);
    break;
  }
  case K_SCOPE: {
    char w[32];
    snprintf(buf, cap, "'%s'", tsr_shard_scope_text(*deck_ival(cc, k), w, sizeof w));
    break;
  }
  default: fmt_string(buf, cap, deck_sval(cc, k), deck_schema[k].size);
  }
}

static void fmt_bound(char *buf, size_t cap, const key_def *d, double v) {
  if (d->type == K_INT || d->type == K_INT_AUTO) snprintf(buf, cap, "%lld", (long long)v);
  else snprintf(buf, cap, "%g", v);
}
/* "[1, 1024]", ">= 0", "(0, 1]", "> 0" */
void deck_fmt_range(char *buf, size_t cap, const key_def *d) {
  char lo[32], hi[32];
  fmt_bound(lo, sizeof lo, d, d->lo);
  fmt_bound(hi, sizeof hi, d, d->hi);
  if ((d->bounds & (LO | HI)) == (LO | HI))
    snprintf(buf, cap, "%c%s, %s%c", d->bounds & LO_OPEN ? '(' : '[', lo, hi,
             d->bounds & HI_OPEN ? ')' : ']');
  else if (d->bounds & LO) snprintf(buf, cap, "%s %s", d->bounds & LO_OPEN ? ">" : ">=", lo);
  else snprintf(buf, cap, "%s %s", d->bounds & HI_OPEN ? "<" : "<=", hi);
}
int deck_in_range(const key_def *d, double v) {
  if ((d->bounds & LO) && (d->bounds & LO_OPEN ? v <= d->lo : v < d->lo)) return 0;
  if ((d->bounds & HI) && (d->bounds & HI_OPEN ? v >= d->hi : v > d->hi)) return 0;
  return 1;
}


/* ---------------------------------------------------------------- defaults, help, writing */

void tsr_deck_defaults(tsr_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  for (int k = 0; k < deck_n_keys; k++) {
    const char *d = deck_schema[k].def;
    switch (deck_schema[k].type) {
    case K_INT: *deck_ival(cfg, k) = strtoll(d, NULL, 10); break;
    case K_INT_AUTO:
      *deck_ival(cfg, k) = strcmp(d, "auto") ? strtoll(d, NULL, 10) : TSR_EVERY_AUTO;
      break;
    case K_REAL: *deck_rval(cfg, k) = strtod(d, NULL); break;
    case K_LOGICAL: *deck_lval(cfg, k) = d[1] == 't'; break;
    case K_LOGI_AUTO: *deck_lval(cfg, k) = !strcmp(d, "auto") ? TSR_LOGI_AUTO : d[1] == 't'; break;
    case K_CHOICE: *deck_lval(cfg, k) = deck_choice_index(deck_schema[k].choices, d, strlen(d)); break;
    case K_SCOPE: *deck_ival(cfg, k) = TSR_SHARD_GLOBAL; break; /* every default is 'global' */
    case K_REALLIST:
      *deck_rval(cfg, k) = strtod(d, NULL);
      *deck_nval(cfg, k) = 1;
      break;
    case K_STRLIST:
      snprintf(deck_sval(cfg, k), deck_elem_size(k), "%s", d);
      *deck_nval(cfg, k) = 1;
      break;
    default: snprintf(deck_sval(cfg, k), deck_schema[k].size, "%s", d);
    }
  }
}

static void allowed(const key_def *d, char *buf, size_t cap) {
  if (d->type == K_INT || d->type == K_REAL || d->type == K_INT_AUTO || d->type == K_REALLIST) {
    deck_fmt_range(buf, cap, d);
    if (d->type == K_INT_AUTO) strncat(buf, " or 'auto'", cap - strlen(buf) - 1);
    if (d->type == K_REALLIST)
      snprintf(buf + strlen(buf), cap - strlen(buf), ", 1 to %d values", TSR_MAX_DATASETS);
  } else if (d->type == K_STRLIST) {
    snprintf(buf, cap, "1 to %d strings", TSR_MAX_DATASETS);
  } else if (d->choices) {
    size_t o = 0;
    for (const char *c = d->choices; *c && o + 4 < cap;) {
      size_t m = strcspn(c, "|");
      int quote = c[0] != '<';
      o += (size_t)snprintf(buf + o, cap - o, "%s%s%.*s%s", o ? "|" : "", quote ? "'" : "", (int)m, c, quote ? "'" : "");
      c += m + (c[m] == '|');
    }
  } else {
    snprintf(buf, cap, "%s", d->type == K_LOGICAL     ? ".true.|.false."
                             : d->type == K_LOGI_AUTO ? ".true.|.false.|'auto'"
                                                      : "any text");
  }
}

void tsr_deck_help(FILE *out) {
  tsr_config def;
  tsr_deck_defaults(&def);
  fprintf(out, "Tessera deck keys.  A deck is a Fortran namelist: groups &name ... /, key = value,\n"
               "! comments, strings in quotes, logicals .true./.false.  Override any key on the\n"
               "command line as group.key=value.\n");
  for (int g = 0; g < N_GROUP; g++) {
    int w = 18; /* the key column: as wide as the group's longest key */
    for (int k = 0; k < deck_n_keys; k++)
      if (deck_schema[k].group == g && (int)strlen(deck_schema[k].name) > w)
        w = (int)strlen(deck_schema[k].name);
    fprintf(out, "\n&%s  (%s)\n  %-*s %-8s %-12s %-34s %s\n", deck_group_name[g], group_help[g], w,
            "key", "type", "default", "allowed", "meaning");
    for (int k = 0; k < deck_n_keys; k++) {
      if (deck_schema[k].group != g) continue;
      char v[VALBUF], a[128];
      deck_fmt_value(&def, k, v, sizeof v);
      allowed(&deck_schema[k], a, sizeof a);
      fprintf(out, "  %-*s %-8s %-12s %-34s %s\n", w, deck_schema[k].name,
              type_name[deck_schema[k].type], v, a, deck_schema[k].help);
    }
  }
}

/* Returns the buffer size the whole deck needs, terminating NUL included, so
 * `n = tsr_deck_write(cfg, NULL, 0); buf = malloc(n); tsr_deck_write(cfg, buf, n);` works. */
size_t tsr_deck_write(const tsr_config *cfg, char *buf, size_t len) {
  size_t pos = 0;
  char v[VALBUF], line[VALBUF + 64];
  for (int g = 0; g < N_GROUP; g++) {
    for (int k = -1; k <= deck_n_keys; k++) {
      if (k == -1) snprintf(line, sizeof line, "&%s\n", deck_group_name[g]);
      else if (k == deck_n_keys) snprintf(line, sizeof line, "/\n%s", g + 1 < N_GROUP ? "\n" : "");
      else if (deck_schema[k].group != g) continue;
      else {
        deck_fmt_value(cfg, k, v, sizeof v);
        snprintf(line, sizeof line, "  %-18s = %s\n", deck_schema[k].name, v);
      }
      size_t n = strlen(line);
      if (buf && pos < len) {
        size_t room = len - pos - 1;
        memcpy(buf + pos, line, n < room ? n : room);
        buf[pos + (n < room ? n : room)] = 0;
      }
      pos += n;
    }
  }
  if (buf && len && pos == 0) buf[0] = 0;
  return pos + 1;
}

/* Key k's word for value v (each choice key's words split once); "?" when not a choice. */
static const char *choice_word(int k, int v) {
  static char words[DECK_MAX_KEYS][8][24];
  if (k < 0 || deck_schema[k].type != K_CHOICE || v < 0 || v >= 8) return "?";
  if (!words[k][v][0]) deck_choice_word(deck_schema[k].choices, v, words[k][v], sizeof words[k][v]);
  return words[k][v][0] ? words[k][v] : "?";
}

const char *tsr_deck_word(const tsr_config *cfg, const void *field) {
  const size_t off = (size_t)((const char *)field - (const char *)cfg);
  for (int k = 0; k < deck_n_keys; k++)
    if (deck_schema[k].type == K_CHOICE && deck_schema[k].offset == off)
      return choice_word(k, *(const int *)field);
  return "?";
}

const char *tsr_deck_choice_word(const char *key, int value) {
  const char *dot = strchr(key, '.');
  const int g = dot ? deck_find_group(key, (size_t)(dot - key)) : -1;
  return choice_word(g >= 0 ? deck_find_key(g, dot + 1, strlen(dot + 1)) : -1, value);
}

void tsr_deck_value_text(const tsr_config *cfg, const char *key, char *buf, size_t len) {
  const char *dot = strchr(key, '.');
  const int g = dot ? deck_find_group(key, (size_t)(dot - key)) : -1;
  const int k = g >= 0 ? deck_find_key(g, dot + 1, strlen(dot + 1)) : -1;
  char v[VALBUF] = "?";
  if (k >= 0) deck_fmt_value(cfg, k, v, sizeof v);
  snprintf(buf, len, "%s", v);
}

void tsr_deck_key_text(const tsr_config *cfg, const char *key, char *buf, size_t len) {
  char v[VALBUF];
  tsr_deck_value_text(cfg, key, v, sizeof v);
  snprintf(buf, len, "%s = %.100s", key, v);
}
