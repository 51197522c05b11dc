/* deck.c — the namelist input deck: one typed schema drives parsing, defaults, range and
 * cross-field checks, --help-deck and the effective deck written to logs and checkpoints.
 *
 * The parser is a hand-written lexer plus a flat loop (no recursion) over a byte buffer that
 * need not be NUL-terminated, so it is safe on any input (it is fuzzed).  It never prints and
 * never exits: every problem becomes one `file:line:col: message` line in the caller's buffer. */
#include "deck.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum { GI_run, GI_model, GI_parallel, GI_train, GI_optim, GI_data, GI_checkpoint, GI_hardware,
       N_GROUP };
static const char *const group_name[N_GROUP] = {"run",   "model", "parallel",  "train",
                                                "optim", "data",  "checkpoint", "hardware"};
static const char *const group_help[N_GROUP] = {
    "run identity, length, logging and evaluation",
    "transformer shape",
    "parallel layout: tensor (tp) x data (dp) x pipeline (pp); dp = world size / (tp*pp)",
    "batch, precision and activation recompute",
    "AdamW and the learning-rate schedule",
    "token shards (see tools/tsr-prepare)",
    "restart files",
    "the GPUs `tessera plan` plans for (training ignores it); 0 = the built-in figure of name"};

/* K_CHOICE keys are stored as the index of their word in `choices` (the enums of
 * config.h list them in the same order); K_SCOPE is shard_scope: TSR_SHARD_GLOBAL,
 * TSR_SHARD_NODE or a number of ranks, written 'global', 'node' or '8'. */
typedef enum { K_INT, K_REAL, K_LOGICAL, K_STRING, K_CHOICE, K_SCOPE } key_type;
static const char *const type_name[] = {"integer", "real", "logical", "string", "choice",
                                        "string"};
enum { LO = 1, HI = 2, LO_OPEN = 4, HI_OPEN = 8 }; /* which bounds apply, and open ends */

typedef struct {
  int group;
  const char *name;
  key_type type;
  size_t offset, size;
  const char *def;     /* default as text: "1234", "3e-4", ".false.", unquoted strings */
  double lo, hi;       /* numeric bounds, see `bounds` */
  int bounds;
  const char *choices; /* "a|b|c": enforced for K_CHOICE, shown for K_STRING and K_SCOPE */
  const char *help;
} key_def;

#define FLD(g, f, t) GI_##g, #f, t, offsetof(tsr_config, g.f), sizeof(((tsr_config *)0)->g.f)
#define INT(g, f, def, lo, hi, b, help) {FLD(g, f, K_INT), def, lo, hi, b, NULL, help}
#define REAL(g, f, def, lo, hi, b, help) {FLD(g, f, K_REAL), def, lo, hi, b, NULL, help}
#define LOGI(g, f, def, help) {FLD(g, f, K_LOGICAL), def, 0, 0, 0, NULL, help}
#define STR(g, f, def, shown, help) {FLD(g, f, K_STRING), def, 0, 0, 0, shown, help}
#define CHOICE(g, f, def, ch, help) {FLD(g, f, K_CHOICE), def, 0, 0, 0, ch, help}
#define SCOPE(g, f, def, shown, help) {FLD(g, f, K_SCOPE), def, 0, 0, 0, shown, help}

static const key_def schema[] = {
    STR(run, name, "tessera", NULL, "run name, shown in the log and stored in checkpoints"),
    STR(run, out_dir, "out", NULL, "directory for the log, metrics.jsonl and (by default) ckpt/"),
    INT(run, seed, "1234", 0, 0, LO, "seed of initialisation and data order"),
    INT(run, max_steps, "100", 0, 0, LO, "optimizer steps to train in total (a resumed run continues to it)"),
    INT(run, log_every, "1", 1, 0, LO, "print a step line every N steps"),
    INT(run, eval_every, "0", 0, 0, LO, "validation every N steps (0 = never)"),
    INT(run, eval_steps, "8", 1, 0, LO, "validation batches per evaluation"),
    REAL(run, step_timeout_s, "0", 0, 0, LO, "watchdog: abort if one step takes longer (0 = off)"),
    CHOICE(run, device, "auto", "auto|cpu|cuda",
           "where the ops run: cuda = a GPU per rank, cpu, auto = cuda when built with it and every rank sees a GPU"),
    LOGI(run, gpu_share, ".false.", "allow several ranks of a node on one GPU (tests; not for speed)"),
    CHOICE(model, arch, "llama", "llama|gpt2", "llama: RMSNorm, RoPE, SwiGLU; gpt2: LayerNorm, GELU"),
    INT(model, n_layer, "4", 1, 1024, LO | HI, "transformer blocks"),
    INT(model, d_model, "128", 1, 65536, LO | HI, "hidden size"),
    INT(model, n_head, "4", 1, 4096, LO | HI, "query heads; head_dim = d_model / n_head"),
    INT(model, n_kv_head, "4", 1, 4096, LO | HI, "key/value heads (< n_head: grouped-query)"),
    INT(model, d_ff, "384", 1, 1048576, LO | HI, "MLP hidden size"),
    INT(model, vocab_size, "2048", 1, 16777216, LO | HI, "embedding rows (>= tokenizer vocab)"),
    INT(model, seq_len, "128", 1, 1048576, LO | HI, "tokens per sequence"),
    REAL(model, rope_theta, "10000", 0, 0, LO | LO_OPEN, "RoPE base (llama)"),
    REAL(model, norm_eps, "1e-5", 0, 1, LO | HI | LO_OPEN, "epsilon of RMSNorm / LayerNorm"),
    LOGI(model, tie_embeddings, ".false.", "LM head shares the embedding matrix"),
    REAL(model, init_std, "0.02", 0, 1, LO | HI | LO_OPEN, "std of the normal init of weights"),
    INT(parallel, tp, "1", 1, 65536, LO | HI, "tensor-parallel ranks (inside a node)"),
    INT(parallel, pp, "1", 1, 65536, LO | HI, "pipeline stages"),
    INT(parallel, zero_stage, "0", 0, 3, LO | HI,
        "0 DDP, 1 shard optimizer state, 2 + gradients, 3 + parameters"),
    SCOPE(parallel, shard_scope, "global", "global|node|<N>",
        "ZeRO shard group: all dp ranks, the ranks of a node, or N ranks"),
    INT(parallel, ranks_per_node, "0", 0, 65536, LO | HI, "0 = detect; set to test multi-node"),
    CHOICE(parallel, schedule, "1f1b", "gpipe|1f1b|interleaved", "pipeline schedule"),
    INT(parallel, micro_batches, "0", 0, 0, LO,
        "micro-batches per step (0 = global_batch / (micro_batch*dp))"),
    INT(parallel, virtual_stages, "1", 1, 1024, LO | HI, "model chunks per stage (interleaved)"),
    LOGI(parallel, sequence_parallel, ".false.", "shard norm/dropout activations over tp"),
    CHOICE(parallel, inter_node, "mpi", "mpi|nccl",
           "GPU collectives of groups spanning nodes (those inside a node use NCCL)"),
    CHOICE(parallel, mpi_gpu, "auto", "auto|direct|staged",
           "GPU memory through MPI: direct (CUDA-aware MPI), staged (pinned host copies), auto"),
    INT(train, micro_batch, "8", 1, 0, LO, "sequences per micro-batch per dp rank"),
    INT(train, global_batch, "8", 1, 0, LO, "sequences per optimizer step"),
    CHOICE(train, precision, "fp32", "fp32|bf16|fp16", "storage / compute precision"),
    CHOICE(train, recompute, "none", "none|selective|full", "activation recomputation"),
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
    REAL(optim, lr, "3e-4", 0, 10, LO | HI, "peak learning rate"),
    REAL(optim, min_lr, "3e-5", 0, 10, LO | HI, "learning rate at the end of the decay"),
    INT(optim, warmup_steps, "10", 0, 0, LO, "linear warmup steps"),
    CHOICE(optim, decay, "cosine", "cosine|linear|wsd|constant", "decay after warmup"),
    INT(optim, decay_steps, "0", 0, 0, LO, "length of warmup + decay (0 = run.max_steps)"),
    REAL(optim, wsd_decay_frac, "0.2", 0, 1, LO | HI | LO_OPEN,
         "wsd: fraction of decay_steps spent decaying"),
    REAL(optim, beta1, "0.9", 0, 1, LO | HI | HI_OPEN, "Adam first-moment decay"),
    REAL(optim, beta2, "0.95", 0, 1, LO | HI | HI_OPEN, "Adam second-moment decay"),
    REAL(optim, eps, "1e-8", 0, 1, LO | HI | LO_OPEN, "Adam epsilon"),
    REAL(optim, weight_decay, "0.1", 0, 10, LO | HI, "decoupled weight decay (2-D weights)"),
    STR(data, train, "", NULL, "path or glob of training shards, e.g. 'data/x/train_*.bin'"),
    STR(data, valid, "", NULL, "path or glob of validation shards ('' = no evaluation)"),
    LOGI(data, shuffle, ".false.", "seeded permutation of samples (else in file order)"),
    STR(checkpoint, dir, "", NULL, "checkpoint directory ('' = <out_dir>/ckpt)"),
    INT(checkpoint, every_steps, "0", 0, 0, LO, "save every N steps (0 = only at the end)"),
    REAL(checkpoint, every_minutes, "0", 0, 0, LO, "also save every M minutes (0 = off)"),
    INT(checkpoint, keep, "3", 0, 0, LO, "newest checkpoints kept (0 = keep all)"),
    STR(checkpoint, resume, "auto", "auto|none|<path>",
        "'auto' newest complete checkpoint in dir, 'none', or a file"),
    LOGI(checkpoint, save_initial, ".false.", "write step_00000000.h5 before the first update"),
    STR(checkpoint, mpiio_hints, "", "key=value,...",
        "MPI-IO hints for checkpoint writes, e.g. 'romio_cb_write=enable,cb_buffer_size=16777216'"),
    INT(checkpoint, alignment, "0", 0, 1073741824, LO | HI,
        "align file objects of at least this many bytes to it (H5Pset_alignment; 0 = HDF5 "
        "default)"),
    CHOICE(hardware, name, "h100", "h100|h200|a100|custom",
           "built-in SXM figures, 8 per node: h100 989 TFLOP/s bf16, 67 fp32, 80 GB, 3350 GB/s, "
           "links 450 / 50 GB/s; h200 the same with 141 GB, 4800 GB/s; a100 312 TFLOP/s bf16, "
           "19.5 fp32, 80 GB, 2039 GB/s, 300 / 25 GB/s; 'custom': set every figure below"),
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
    REAL(hardware, compute_efficiency, "0.6", 0, 1, LO | HI | LO_OPEN,
         "fraction of peak the step's FLOPs run at (predicted time)"),
    REAL(hardware, comm_efficiency, "0.8", 0, 1, LO | HI | LO_OPEN,
         "fraction of link bandwidth a collective reaches"),
    REAL(hardware, reserved_gb, "2", 0, 0, LO, "GB per GPU held by the CUDA/NCCL runtime"),
};
#define N_KEY ((int)(sizeof schema / sizeof schema[0]))

/* ---------------------------------------------------------------- small helpers */

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_alnum_(int c) { return is_alpha(c) || is_digit(c) || c == '_'; }

/* a (NUL-terminated) equals p[0..n) ignoring case */
static int ieq(const char *a, const char *p, size_t n) {
  size_t i = 0;
  for (; i < n && a[i]; i++)
    if (lower((unsigned char)a[i]) != lower((unsigned char)p[i])) return 0;
  return i == n && a[i] == 0;
}

/* Printable excerpt of untrusted text for messages: escapes, at most ~40 characters. */
static void show(char *out, size_t cap, const char *p, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 8 < cap; i++) {
    unsigned char c = (unsigned char)p[i];
    if (i == 40) { memcpy(out + o, "...", 3); o += 3; break; }
    if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    else out[o++] = (char)c;
  }
  out[o] = 0;
}

/* Optimal-string-alignment distance (edits + adjacent swaps), case-insensitive. */
static int edit_distance(const char *a, const char *b, size_t nb) {
  size_t na = strlen(a);
  if (na > 63 || nb > 63) return 99;
  int d[64][64];
  for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= na; i++)
    for (size_t j = 1; j <= nb; j++) {
      int ai = lower((unsigned char)a[i - 1]), bj = lower((unsigned char)b[j - 1]);
      int v = d[i - 1][j - 1] + (ai != bj);
      if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ai == lower((unsigned char)b[j - 2]) &&
          lower((unsigned char)a[i - 2]) == bj && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[na][nb];
}
static int close_enough(int dist, size_t n) { return dist <= (n <= 3 ? 1 : n <= 6 ? 2 : 3); }

static int find_group(const char *p, size_t n) {
  for (int g = 0; g < N_GROUP; g++)
    if (ieq(group_name[g], p, n)) return g;
  return -1;
}
static int find_key(int g, const char *p, size_t n) {
  for (int k = 0; k < N_KEY; k++)
    if (schema[k].group == g && ieq(schema[k].name, p, n)) return k;
  return -1;
}
static int key_id(int g, const char *name) { return find_key(g, name, strlen(name)); }

/* ---------------------------------------------------------------- values */

static int64_t *ival(tsr_config *c, int k) { return (int64_t *)((char *)c + schema[k].offset); }
static double *rval(tsr_config *c, int k) { return (double *)((char *)c + schema[k].offset); }
static int *lval(tsr_config *c, int k) { return (int *)((char *)c + schema[k].offset); }
static char *sval(tsr_config *c, int k) { return (char *)c + schema[k].offset; }

/* Word i of a choice list "a|b|c" into buf (empty when there is none). */
static void choice_word(const char *choices, int i, char *buf, size_t cap) {
  const char *c = choices;
  for (; i > 0 && *c; i--) c += strcspn(c, "|") + (c[strcspn(c, "|")] == '|');
  snprintf(buf, cap, "%.*s", (int)strcspn(c, "|"), c);
}
/* The index of word v[0..n) in a choice list (case-insensitive), or -1. */
static int choice_index(const char *choices, const char *v, size_t n) {
  int i = 0;
  for (const char *c = choices; *c; i++) {
    const size_t m = strcspn(c, "|");
    char opt[32];
    snprintf(opt, sizeof opt, "%.*s", (int)m, c);
    if (ieq(opt, v, n)) return i;
    c += m + (c[m] == '|');
  }
  return -1;
}

/* Strict integer: [+-]digits.  0 ok, -1 syntax, -2 overflow. */
static int parse_int(const char *p, size_t n, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
  if (i == n) return -1;
  uint64_t v = 0;
  for (; i < n; i++) {
    if (!is_digit((unsigned char)p[i])) return -1;
    if (v > (UINT64_C(1) << 62)) return -2;
    v = v * 10 + (uint64_t)(p[i] - '0');
  }
  if (v > (uint64_t)INT64_MAX) return -2;
  *out = neg ? -(int64_t)v : (int64_t)v;
  return 0;
}

/* Fortran real: [+-](digits[.digits]|.digits)([eEdD][+-]digits).  0 ok, -1 syntax, -2 overflow. */
static int parse_real(const char *p, size_t n, double *out) {
  char buf[80];
  size_t i = 0, nd = 0;
  if (n >= sizeof buf) return -1;
  if (i < n && (p[i] == '+' || p[i] == '-')) i++;
  while (i < n && is_digit((unsigned char)p[i])) i++, nd++;
  if (i < n && p[i] == '.') {
    i++;
    while (i < n && is_digit((unsigned char)p[i])) i++, nd++;
  }
  if (nd == 0) return -1;
  if (i < n && strchr("eEdD", p[i]) && p[i]) {
    i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    size_t ne = 0;
    while (i < n && is_digit((unsigned char)p[i])) i++, ne++;
    if (ne == 0) return -1;
  }
  if (i != n) return -1;
  for (i = 0; i < n; i++) buf[i] = (p[i] == 'd' || p[i] == 'D') ? 'e' : p[i];
  buf[n] = 0;
  double v = strtod(buf, NULL);
  if (!isfinite(v)) return -2;
  *out = v;
  return 0;
}

static int parse_logical(const char *p, size_t n, int *out) {
  static const char *const yes[] = {".true.", ".t.", "t", "true"}, *const no[] = {
      ".false.", ".f.", "f", "false"};
  for (int i = 0; i < 4; i++) {
    if (ieq(yes[i], p, n)) return *out = 1, 0;
    if (ieq(no[i], p, n)) return *out = 0, 0;
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

/* Value of key k in deck syntax.  cap >= 2*TSR_STR_PATH + 4 always fits a quoted string. */
#define VALBUF (2 * TSR_STR_PATH + 8)
static void fmt_value(const tsr_config *c, int k, char *buf, size_t cap) {
  tsr_config *cc = (tsr_config *)c;
  switch (schema[k].type) {
  case K_INT: snprintf(buf, cap, "%lld", (long long)*ival(cc, k)); break;
  case K_REAL: fmt_real(buf, cap, *rval(cc, k)); break;
  case K_LOGICAL: snprintf(buf, cap, "%s", *lval(cc, k) ? ".true." : ".false."); break;
  case K_CHOICE: {
    char w[32];
    choice_word(schema[k].choices, *lval(cc, k), w, sizeof w);
    snprintf(buf, cap, "'%s'", w);
    break;
  }
  case K_SCOPE: {
    char w[32];
    snprintf(buf, cap, "'%s'", tsr_shard_scope_text(*ival(cc, k), w, sizeof w));
    break;
  }
  default: {
    const char *s = sval(cc, k);
    size_t o = 0;
    buf[o++] = '\'';
    for (size_t i = 0; i < schema[k].size && s[i] && o + 3 < cap; i++) {
      if (s[i] == '\'') buf[o++] = '\'';
      buf[o++] = s[i];
    }
    buf[o++] = '\'';
    buf[o] = 0;
  }
  }
}

static void fmt_bound(char *buf, size_t cap, const key_def *d, double v) {
  if (d->type == K_INT) snprintf(buf, cap, "%lld", (long long)v);
  else snprintf(buf, cap, "%g", v);
}
/* "[1, 1024]", ">= 0", "(0, 1]", "> 0" */
static void fmt_range(char *buf, size_t cap, const key_def *d) {
  char lo[32], hi[32];
  fmt_bound(lo, sizeof lo, d, d->lo);
  fmt_bound(hi, sizeof hi, d, d->hi);
  if ((d->bounds & (LO | HI)) == (LO | HI))
    snprintf(buf, cap, "%c%s, %s%c", d->bounds & LO_OPEN ? '(' : '[', lo, hi,
             d->bounds & HI_OPEN ? ')' : ']');
  else if (d->bounds & LO) snprintf(buf, cap, "%s %s", d->bounds & LO_OPEN ? ">" : ">=", lo);
  else snprintf(buf, cap, "%s %s", d->bounds & HI_OPEN ? "<" : "<=", hi);
}
static int in_range(const key_def *d, double v) {
  if ((d->bounds & LO) && (d->bounds & LO_OPEN ? v <= d->lo : v < d->lo)) return 0;
  if ((d->bounds & HI) && (d->bounds & HI_OPEN ? v >= d->hi : v > d->hi)) return 0;
  return 1;
}

/* ---------------------------------------------------------------- lexer */

typedef struct {
  const char *s;
  size_t n, i;
  int line, col;
} lexer;

enum { T_EOF, T_GROUP, T_END, T_EQ, T_VALUE, T_BAD };
typedef struct {
  int kind, line, col;
  const char *p; /* group name, bare text, string body (still with doubled quotes), bad char */
  size_t n;
  int quoted, unterminated;
  char quote;
  int64_t count; /* 1, or the repeat count of `N*value` */
  const char *why; /* T_BAD: what is wrong */
} token;

static int peekc(const lexer *L, size_t k) {
  return L->i + k < L->n ? (unsigned char)L->s[L->i + k] : -1;
}
static void adv(lexer *L) {
  if (L->s[L->i] == '\n') L->line++, L->col = 1;
  else L->col++;
  L->i++;
}
static int is_garbage(int c) {
  return c == 0 || (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') ||
         c == 0x7f || (c > 0 && c < 0x80 && strchr("#;@$^~`{}[]()<>|\\?", c));
}
static int is_space(int c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == ',';
}
static int ends_bare(int c) {
  return c < 0 || is_space(c) || c == '=' || c == '/' || c == '&' || c == '!' || c == '\'' ||
         c == '"' || is_garbage(c);
}

static void lex_string(lexer *L, token *t) {
  t->quoted = 1;
  t->quote = (char)peekc(L, 0);
  adv(L);
  size_t start = L->i;
  for (;;) {
    int c = peekc(L, 0);
    if (c < 0 || c == '\n') { /* strings end on their line: report at the opening quote */
      t->unterminated = 1;
      t->p = L->s + start, t->n = L->i - start;
      return;
    }
    if (c == t->quote) {
      if (peekc(L, 1) == c) { adv(L), adv(L); continue; }
      t->p = L->s + start, t->n = L->i - start;
      adv(L);
      return;
    }
    adv(L);
  }
}

static void next_token(lexer *L, token *t) {
  for (;;) { /* separators and ! comments */
    int c = peekc(L, 0);
    if (c >= 0 && is_space(c)) adv(L);
    else if (c == '!') while (peekc(L, 0) >= 0 && peekc(L, 0) != '\n') adv(L);
    else break;
  }
  memset(t, 0, sizeof *t);
  t->line = L->line, t->col = L->col, t->count = 1;
  int c = peekc(L, 0);
  if (c < 0) { t->kind = T_EOF; return; }
  if (c == '&') {
    adv(L);
    size_t start = L->i;
    while (peekc(L, 0) >= 0 && is_alnum_(peekc(L, 0))) adv(L);
    t->p = L->s + start, t->n = L->i - start;
    t->kind = t->n ? T_GROUP : T_BAD;
    if (!t->n) t->p = L->s + start - 1, t->n = 1, t->why = "expected a group name after '&'";
    return;
  }
  if (c == '/' || c == '=') { t->kind = c == '/' ? T_END : T_EQ; t->p = L->s + L->i; t->n = 1; adv(L); return; }
  t->kind = T_VALUE;
  if (c == '\'' || c == '"') { lex_string(L, t); return; }
  if (is_garbage(c)) {
    t->kind = T_BAD, t->p = L->s + L->i, t->n = 1;
    t->why = c == '#' ? "comments start with '!'" : "not part of the deck syntax";
    adv(L);
    if (c == '#') /* meant as a comment: one message, not one per word of it */
      while (peekc(L, 0) >= 0 && peekc(L, 0) != '\n') adv(L);
    return;
  }
  size_t start = L->i;
  while (!ends_bare(peekc(L, 0))) adv(L);
  t->p = L->s + start, t->n = L->i - start;
  size_t k = 0;
  while (k < t->n && is_digit((unsigned char)t->p[k])) k++;
  if (k > 0 && k < t->n && t->p[k] == '*') { /* N*value */
    int64_t r = 0;
    for (size_t j = 0; j < k; j++) r = r > 1000000000 ? r : r * 10 + (t->p[j] - '0');
    t->count = r;
    t->p += k + 1, t->n -= k + 1;
    if (t->n == 0 && (peekc(L, 0) == '\'' || peekc(L, 0) == '"')) lex_string(L, t);
  }
}

/* ---------------------------------------------------------------- parser state and errors */

#define MAX_ERRORS 20
typedef struct {
  const char *name; /* file name, or NULL for an override */
  int argn, line, col;
} loc_t;

typedef struct {
  tsr_config *cfg;
  char *eb;
  size_t el, used;
  int nerr;
  int argn;          /* 0 while reading the file, N for the N-th override */
  const char *fname;
  loc_t set_at[sizeof schema / sizeof schema[0]];
  int set_seq[sizeof schema / sizeof schema[0]]; /* 0 = default; larger = set later */
  int failed[sizeof schema / sizeof schema[0]];  /* its value was rejected: skip cross checks */
  int seq;
  loc_t group_at[N_GROUP];
  int group_seen[N_GROUP];
  int world_size;
} parser;

static void fmt_loc(char *buf, size_t cap, const loc_t *l) {
  if (l->argn > 0) snprintf(buf, cap, "<command line>:arg%d:%d", l->argn, l->col);
  else if (l->line == 0) snprintf(buf, cap, "<defaults>");
  else snprintf(buf, cap, "%s:%d:%d", l->name, l->line, l->col);
}
static loc_t tok_loc(const parser *P, const token *t) {
  loc_t l = {P->fname, P->argn, t->line, t->col};
  return l;
}

static void errat(parser *P, const loc_t *at, const char *fmt, ...) TSR_PRINTF(3, 4);
static void errat(parser *P, const loc_t *at, const char *fmt, ...) {
  char line[1024], where[TSR_STR_PATH + 64];
  P->nerr++;
  if (P->nerr > MAX_ERRORS + 1 || !P->eb || P->el == 0) return;
  if (P->nerr == MAX_ERRORS + 1) {
    snprintf(line, sizeof line, "too many errors; stopping after %d\n", MAX_ERRORS);
  } else {
    va_list ap;
    va_start(ap, fmt);
    fmt_loc(where, sizeof where, at);
    int n = snprintf(line, sizeof line, "%s: ", where);
    if (n < 0 || (size_t)n >= sizeof line) n = 0;
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 >= sizeof line) len = sizeof line - 2;
    line[len] = '\n', line[len + 1] = 0;
  }
  size_t len = strlen(line);
  if (P->used + 1 >= P->el) return;
  if (len > P->el - P->used - 1) len = P->el - P->used - 1;
  memcpy(P->eb + P->used, line, len);
  P->used += len;
  P->eb[P->used] = 0;
}

/* "&model n_layer" */
static const char *qname(int k, char *buf, size_t cap) {
  snprintf(buf, cap, "&%s %s", group_name[schema[k].group], schema[k].name);
  return buf;
}

static void report_bad(parser *P, const token *t) {
  loc_t l = tok_loc(P, t);
  char s[64];
  show(s, sizeof s, t->p, t->n);
  if (t->kind == T_VALUE && t->unterminated)
    errat(P, &l, "unterminated string: missing closing %c", t->quote);
  else
    errat(P, &l, "unexpected character '%s': %s", s, t->why ? t->why : "not allowed here");
}

static void unknown_key(parser *P, const loc_t *l, int g, const char *p, size_t n) {
  char s[64];
  show(s, sizeof s, p, n);
  int best = -1, bestd = 99, other = -1, otherd = 99;
  for (int k = 0; k < N_KEY; k++) {
    int d = edit_distance(schema[k].name, p, n);
    if (schema[k].group == g && d < bestd) best = k, bestd = d;
    if (schema[k].group != g && d < otherd) other = k, otherd = d;
  }
  if (other >= 0 && otherd == 0)
    errat(P, l, "unknown key '%s' in &%s: key '%s' is in group &%s, not &%s", s, group_name[g],
          schema[other].name, group_name[schema[other].group], group_name[g]);
  else if (best >= 0 && close_enough(bestd, n))
    errat(P, l, "unknown key '%s' in &%s; did you mean '%s'?", s, group_name[g], schema[best].name);
  else if (other >= 0 && close_enough(otherd, n))
    errat(P, l, "unknown key '%s' in &%s; did you mean '%s' in &%s?", s, group_name[g],
          schema[other].name, group_name[schema[other].group]);
  else
    errat(P, l, "unknown key '%s' in &%s (tessera --help-deck lists the keys)", s, group_name[g]);
}

static void unknown_group(parser *P, const loc_t *l, const char *p, size_t n) {
  char s[64];
  show(s, sizeof s, p, n);
  int best = -1, bestd = 99;
  for (int g = 0; g < N_GROUP; g++) {
    int d = edit_distance(group_name[g], p, n);
    if (d < bestd) best = g, bestd = d;
  }
  if (close_enough(bestd, n))
    errat(P, l, "unknown group '&%s'; did you mean '&%s'?", s, group_name[best]);
  else
    errat(P, l, "unknown group '&%s'; the groups are &run &model &parallel &train &optim &data "
          "&checkpoint", s);
}

/* Check and store one value for key k.  `bare`: an unquoted word is a string (overrides). */
static void assign_value(parser *P, int k, const token *t, int bare) {
  const key_def *d = &schema[k];
  loc_t l = tok_loc(P, t);
  char q[96], s[64], r[64];
  qname(k, q, sizeof q);
  show(s, sizeof s, t->p, t->n);
  int rc;
  if (d->type != K_STRING && d->type != K_CHOICE && d->type != K_SCOPE && t->quoted) {
    errat(P, &l, "%s expects %s, got the string '%s'", q,
          d->type == K_INT ? "an integer" : d->type == K_REAL ? "a real number" : "a logical", s);
    return;
  }
  switch (d->type) {
  case K_INT: {
    int64_t v = 0;
    if ((rc = parse_int(t->p, t->n, &v)) != 0) {
      errat(P, &l, rc == -2 ? "%s = %s is too large for an integer" : "%s expects an integer, got '%s'", q, s);
      return;
    }
    if (!in_range(d, (double)v)) {
      fmt_range(r, sizeof r, d);
      errat(P, &l, "%s = %lld is out of range: must be %s%s", q, (long long)v,
            (d->bounds & (LO | HI)) == (LO | HI) ? "in " : "", r);
      return;
    }
    *ival(P->cfg, k) = v;
    return;
  }
  case K_REAL: {
    double v = 0;
    if ((rc = parse_real(t->p, t->n, &v)) != 0) {
      errat(P, &l, rc == -2 ? "%s = %s overflows a double" : "%s expects a real number, got '%s'", q, s);
      return;
    }
    if (!in_range(d, v)) {
      fmt_range(r, sizeof r, d);
      errat(P, &l, "%s = %s is out of range: must be %s%s", q, s,
            (d->bounds & (LO | HI)) == (LO | HI) ? "in " : "", r);
      return;
    }
    *rval(P->cfg, k) = v;
    return;
  }
  case K_LOGICAL:
    if (parse_logical(t->p, t->n, lval(P->cfg, k)) != 0)
      errat(P, &l, "%s expects a logical (.true. or .false., T or F), got '%s'", q, s);
    return;
  default: break;
  }
  if (!t->quoted && !bare) {
    errat(P, &l, "%s expects a quoted string, got %s; write '%s'", q, s, s);
    return;
  }
  char v[TSR_STR_PATH + 1];
  size_t n = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (t->quoted && t->p[i] == t->quote && i + 1 < t->n) i++; /* doubled quote */
    if ((unsigned char)t->p[i] < 0x20 || t->p[i] == 0x7f) {
      errat(P, &l, "%s contains a control character", q);
      return;
    }
    if (n < sizeof v - 1) v[n] = t->p[i];
    n++;
  }
  if (d->type == K_STRING && n >= d->size) {
    errat(P, &l, "%s is too long: %zu characters, at most %zu", q, n, d->size - 1);
    return;
  }
  v[n] = 0;
  if (d->type == K_CHOICE) {
    const int i = choice_index(d->choices, v, n);
    if (i >= 0) {
      *lval(P->cfg, k) = i;
      return;
    }
    const char *c = d->choices, *best = NULL;
    int bestd = 99;
    char list[160] = "";
    while (*c) {
      size_t m = strcspn(c, "|");
      char opt[32];
      snprintf(opt, sizeof opt, "%.*s", (int)m, c);
      int dd = edit_distance(opt, v, n);
      if (dd < bestd) bestd = dd, best = c;
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", list[0] ? ", " : "", opt);
      c += m + (c[m] == '|');
    }
    char hint[64] = "";
    if (best && close_enough(bestd, n))
      snprintf(hint, sizeof hint, "; did you mean '%.*s'?", (int)strcspn(best, "|"), best);
    show(s, sizeof s, v, n);
    errat(P, &l, "%s = '%s' is not allowed: choose one of %s%s", q, s, list, hint);
    return;
  }
  if (d->type == K_SCOPE) {
    int64_t ranks = 0;
    if (ieq("global", v, n) || ieq("node", v, n)) {
      *ival(P->cfg, k) = ieq("global", v, n) ? TSR_SHARD_GLOBAL : TSR_SHARD_NODE;
    } else if (parse_int(v, n, &ranks) != 0 || v[0] == '+' || v[0] == '-' || ranks < 1 ||
               ranks > 1073741824) {
      show(s, sizeof s, v, n);
      errat(P, &l, "%s = '%s' is not allowed: use 'global', 'node' or a positive number of ranks "
            "such as '8'", q, s);
    } else {
      *ival(P->cfg, k) = ranks;
    }
    return;
  }
  memset(sval(P->cfg, k), 0, d->size);
  memcpy(sval(P->cfg, k), v, n);
}
static void assign(parser *P, int k, const token *t, int bare) {
  int nerr = P->nerr;
  assign_value(P, k, t, bare);
  if (P->nerr != nerr) P->failed[k] = 1; /* no cross-field checks on a rejected value */
}

static int is_ident(const token *t) {
  if (t->kind != T_VALUE || t->quoted || t->count != 1 || t->n == 0 || !is_alpha((unsigned char)t->p[0]))
    return 0;
  for (size_t i = 1; i < t->n; i++)
    if (!is_alnum_((unsigned char)t->p[i])) return 0;
  return 1;
}

/* Does the next token start a new key: an identifier followed by '=', or a key name (whose
 * '=' was forgotten, which the group loop then reports)? */
static int key_ahead(const lexer *L) {
  lexer a = *L;
  token t;
  next_token(&a, &t);
  if (!is_ident(&t)) return 0;
  for (int g = 0; g < N_GROUP; g++)
    if (find_key(g, t.p, t.n) >= 0) return 1;
  next_token(&a, &t);
  return t.kind == T_EQ;
}

/* The values after `key =`: up to the next key, '/', '&' or the end.  k < 0 skips them.
 * Overrides (P->argn > 0) take every token to the end of the argument. */
static void read_values(parser *P, lexer *L, int k, const token *keytok) {
  token first, extra, t;
  int64_t count = 0;
  int have_extra = 0, bad = 0;
  for (;;) {
    if (P->argn == 0 && key_ahead(L)) break;
    lexer save = *L;
    next_token(L, &t);
    if (t.kind == T_EOF) break;
    if (t.kind != T_VALUE) {
      if (P->argn == 0) { *L = save; break; }
      if (k >= 0 && !bad) {
        loc_t l = tok_loc(P, &t);
        char s[64];
        show(s, sizeof s, t.p, t.n);
        if (t.kind == T_BAD) report_bad(P, &t);
        else errat(P, &l, "unexpected '%s' in the value of %s.%s", s, group_name[schema[k].group], schema[k].name);
      }
      bad = 1;
      continue;
    }
    if (t.unterminated) report_bad(P, &t), bad = 1;
    if (count == 0) first = t;
    else if (!have_extra) extra = t, have_extra = 1;
    count += t.count;
    if (count > 1000000000) count = 1000000000;
  }
  if (k >= 0 && bad) P->failed[k] = 1;
  if (k < 0 || bad) return;
  char q[96];
  qname(k, q, sizeof q);
  if (count == 0) {
    loc_t l = tok_loc(P, keytok);
    errat(P, &l, "%s has no value after '='", q);
    P->failed[k] = 1;
  } else if (count != 1) {
    loc_t l = first.count != 1 ? tok_loc(P, &first) : tok_loc(P, &extra);
    errat(P, &l, "%s expects one value, got %lld", q, (long long)count);
    P->failed[k] = 1;
  } else {
    assign(P, k, &first, 0);
  }
}

static void mark_set(parser *P, int k, const loc_t *l) {
  P->set_at[k] = *l;
  P->set_seq[k] = ++P->seq;
}

/* Body of one group, after its `&name`; g < 0 skips it quietly (already reported). */
static void parse_group(parser *P, lexer *L, const token *gt, int g) {
  loc_t gl = tok_loc(P, gt);
  char gs[64];
  show(gs, sizeof gs, gt->p, gt->n);
  for (;;) {
    lexer save = *L;
    token t;
    next_token(L, &t);
    loc_t l = tok_loc(P, &t);
    char s[64];
    show(s, sizeof s, t.p, t.n);
    switch (t.kind) {
    case T_EOF:
      errat(P, &gl, "group &%s is not closed: missing '/' at its end", gs);
      return;
    case T_END: return;
    case T_GROUP:
      if (ieq("end", t.p, t.n)) return;
      errat(P, &gl, "group &%s is not closed: missing '/' before &%s on line %d", gs, s, t.line);
      *L = save;
      return;
    case T_EQ:
      if (g >= 0) errat(P, &l, "unexpected '=' without a key name in &%s", gs);
      continue;
    case T_BAD:
      if (g >= 0) report_bad(P, &t);
      continue;
    default: break;
    }
    if (t.unterminated) {
      if (g >= 0) report_bad(P, &t);
      continue;
    }
    lexer after = *L;
    token eq;
    next_token(&after, &eq);
    if (eq.kind != T_EQ) {
      if (g >= 0 && is_ident(&t))
        errat(P, &l, "missing '=' after '%s' in &%s", s, gs);
      else if (g >= 0)
        errat(P, &l, "expected 'key = value' in &%s, got '%s'", gs, s);
      read_values(P, L, -1, &t);
      continue;
    }
    *L = after;
    if (g < 0) { read_values(P, L, -1, &t); continue; }
    int k = find_key(g, t.p, t.n);
    if (k < 0) {
      unknown_key(P, &l, g, t.p, t.n);
      read_values(P, L, -1, &t);
    } else if (P->set_seq[k]) {
      char w[TSR_STR_PATH + 64];
      fmt_loc(w, sizeof w, &P->set_at[k]);
      errat(P, &l, "duplicate key '%s' in &%s (first set at %s)", schema[k].name, gs, w);
      read_values(P, L, -1, &t);
    } else {
      mark_set(P, k, &l);
      read_values(P, L, k, &t);
    }
  }
}

static void parse_file(parser *P, const char *text, size_t len) {
  lexer L = {text ? text : "", text ? len : 0, 0, 1, 1};
  for (;;) {
    token t;
    next_token(&L, &t);
    if (t.kind == T_EOF) return;
    loc_t l = tok_loc(P, &t);
    char s[64];
    show(s, sizeof s, t.p, t.n);
    if (t.kind == T_GROUP) {
      int g = find_group(t.p, t.n);
      if (ieq("end", t.p, t.n)) {
        errat(P, &l, "'&end' without an open group");
      } else if (g < 0) {
        unknown_group(P, &l, t.p, t.n);
        parse_group(P, &L, &t, -1);
      } else if (P->group_seen[g]) {
        char w[TSR_STR_PATH + 64];
        fmt_loc(w, sizeof w, &P->group_at[g]);
        errat(P, &l, "duplicate group &%s (first opened at %s); put all its keys in one group", group_name[g], w);
        parse_group(P, &L, &t, -1);
      } else {
        P->group_seen[g] = 1, P->group_at[g] = l;
        parse_group(P, &L, &t, g);
      }
      continue;
    }
    if (t.kind == T_BAD || t.unterminated) report_bad(P, &t);
    else errat(P, &l, "unexpected '%s' outside a group; a group starts with '&name' and ends with '/'", s);
    for (;;) { /* one message per stretch of junk: skip to the next group */
      lexer save = L;
      next_token(&L, &t);
      if (t.kind == T_EOF) return;
      if (t.kind == T_GROUP) { L = save; break; }
    }
  }
}

/* `group.key=value` from the command line, deck syntax for the value; a string key also
 * takes a bare word as it is. */
static void parse_override(parser *P, int argn, const char *arg) {
  P->argn = argn;
  loc_t l = {NULL, argn, 1, 1};
  char s[64];
  size_t len = strlen(arg);
  show(s, sizeof s, arg, len);
  const char *eq = strchr(arg, '=');
  size_t a = 0;
  while (arg[a] == ' ') a++;
  size_t b = eq ? (size_t)(eq - arg) : len;
  while (b > a && arg[b - 1] == ' ') b--;
  const char *dot = memchr(arg + a, '.', b - a);
  if (!eq || !dot) {
    int k = -1;
    for (int j = 0; j < N_KEY && !dot; j++)
      if (ieq(schema[j].name, arg + a, b - a)) k = j;
    if (k >= 0)
      errat(P, &l, "'%s' needs its group: write %s.%s=...", schema[k].name, group_name[schema[k].group], schema[k].name);
    else
      errat(P, &l, "expected group.key=value, got '%s'", s);
    return;
  }
  l.col = (int)a + 1;
  int g = find_group(arg + a, (size_t)(dot - arg) - a);
  if (g < 0) { unknown_group(P, &l, arg + a, (size_t)(dot - arg) - a); return; }
  l.col = (int)(dot - arg) + 2;
  int k = find_key(g, dot + 1, b - (size_t)(dot - arg) - 1);
  if (k < 0) { unknown_key(P, &l, g, dot + 1, b - (size_t)(dot - arg) - 1); return; }
  l.col = (int)a + 1;
  mark_set(P, k, &l);
  lexer L = {eq + 1, strlen(eq + 1), 0, 1, (int)(eq - arg) + 2};
  token key = {0};
  key.line = 1, key.col = l.col;
  if (schema[k].type == K_STRING || schema[k].type == K_CHOICE || schema[k].type == K_SCOPE) {
    while (peekc(&L, 0) == ' ') adv(&L);
    if (peekc(&L, 0) != '\'' && peekc(&L, 0) != '"') {
      token t = {0};
      t.kind = T_VALUE, t.line = 1, t.col = L.col, t.count = 1;
      t.p = L.s + L.i, t.n = L.n - L.i;
      while (t.n > 0 && t.p[t.n - 1] == ' ') t.n--;
      assign(P, k, &t, 1);
      return;
    }
  }
  read_values(P, &L, k, &key);
}

/* ---------------------------------------------------------------- cross-field checks */

/* The key set last among ids[] (-1 when all are defaults): where a cross-field error goes. */
static int latest(const parser *P, const int *ids, int n) {
  int best = -1;
  for (int i = 0; i < n; i++)
    if (P->set_seq[ids[i]] && (best < 0 || P->set_seq[ids[i]] > P->set_seq[best])) best = ids[i];
  return best;
}
static int any_failed(const parser *P, const int *ids, int n) {
  for (int i = 0; i < n; i++)
    if (P->failed[ids[i]]) return 1;
  return 0;
}
/* "model.n_head = 6", plus " (set at file:5:3)" when it is not the key reported at. */
static const char *ref(const parser *P, int k, int rep, char *buf, size_t cap) {
  char v[VALBUF], w[TSR_STR_PATH + 64];
  fmt_value(P->cfg, k, v, sizeof v);
  int n = snprintf(buf, cap, "%s.%s = %.100s", group_name[schema[k].group], schema[k].name, v);
  if (k != rep && P->set_seq[k] && n > 0 && (size_t)n < cap) {
    fmt_loc(w, sizeof w, &P->set_at[k]);
    snprintf(buf + n, cap - (size_t)n, " (set at %s)", w);
  }
  return buf;
}

#define REF(i, k) ref(P, k, rep, r[i], sizeof r[i])
#define XERR(ids, ...)                                            \
  do {                                                            \
    int rep = latest(P, ids, (int)(sizeof ids / sizeof ids[0]));  \
    loc_t at = {0};                                               \
    if (any_failed(P, ids, (int)(sizeof ids / sizeof ids[0])))    \
      break;                                                      \
    if (rep >= 0) at = P->set_at[rep];                            \
    errat(P, &at, __VA_ARGS__);                                   \
  } while (0)

/* checkpoint.mpiio_hints is "key=value" items separated by commas (blanks around them
 * allowed): keys are letters, digits and '_', values are non-empty and blank-free.  Returns
 * 1 and why in buf when s is not of that form; "" is fine (no hints).  ckpt.c splits the
 * same way to build the MPI_Info. */
static int hints_bad(const char *s, char *buf, size_t cap) {
  for (int item = 1; *s; item++) {
    while (*s == ' ' || *s == '\t') s++;
    const char *key = s;
    while (is_alnum_((unsigned char)*s)) s++;
    size_t klen = (size_t)(s - key);
    while (*s == ' ' || *s == '\t') s++;
    if (!klen && *s == ',') {
      snprintf(buf, cap, "item %d is empty (two ',' in a row)", item);
      return 1;
    }
    if (!klen || *s != '=') {
      snprintf(buf, cap, "item %d ('%.40s') is not key=value with a key of letters, digits "
               "and '_'", item, key);
      return 1;
    }
    s++;
    while (*s == ' ' || *s == '\t') s++;
    const char *val = s;
    while (*s && *s != ',' && *s != ' ' && *s != '\t') s++;
    if (s == val) {
      snprintf(buf, cap, "item %d ('%.*s') has no value", item, (int)klen, key);
      return 1;
    }
    while (*s == ' ' || *s == '\t') s++;
    if (*s && *s != ',') {
      snprintf(buf, cap, "item %d ('%.*s') has a blank inside its value", item, (int)klen, key);
      return 1;
    }
    if (*s == ',' && !*++s) {
      snprintf(buf, cap, "a trailing ',' after item %d", item);
      return 1;
    }
  }
  return 0;
}

static void cross_checks(parser *P) {
  tsr_config *c = P->cfg;
  char r[3][TSR_STR_PATH + 200];
  int d_model = key_id(GI_model, "d_model"), n_head = key_id(GI_model, "n_head"),
      n_kv = key_id(GI_model, "n_kv_head"), n_layer = key_id(GI_model, "n_layer"),
      arch = key_id(GI_model, "arch"),
      seq_len = key_id(GI_model, "seq_len"), tp = key_id(GI_parallel, "tp"),
      pp = key_id(GI_parallel, "pp"), vs = key_id(GI_parallel, "virtual_stages"),
      sched = key_id(GI_parallel, "schedule"), mbs = key_id(GI_parallel, "micro_batches"),
      scope = key_id(GI_parallel, "shard_scope"), sp = key_id(GI_parallel, "sequence_parallel"),
      mb = key_id(GI_train, "micro_batch"), gb = key_id(GI_train, "global_batch"),
      lr = key_id(GI_optim, "lr"), min_lr = key_id(GI_optim, "min_lr"),
      warm = key_id(GI_optim, "warmup_steps"), dsteps = key_id(GI_optim, "decay_steps");
  const tsr_model_config *m = &c->model;
  const tsr_parallel_config *pc = &c->parallel;
  int ws = P->world_size;

  /* divisor must divide dividend; checked in this order, the first failure per pair only */
  static const struct { int g1; const char *k1; int g2; const char *k2, *why; } divides[] = {
      {GI_model, "n_head", GI_model, "d_model", ""},
      {GI_model, "n_kv_head", GI_model, "n_head", " (query heads are shared out evenly over KV heads)"},
      {GI_parallel, "tp", GI_model, "n_head", " (attention heads are split over tensor-parallel ranks)"},
      {GI_parallel, "pp", GI_model, "n_layer", " (every pipeline stage holds the same number of layers)"},
      {GI_parallel, "tp", GI_model, "vocab_size",
       " (the embedding and LM head are split by vocabulary; pad vocab_size)"}};
  for (size_t i = 0; i < sizeof divides / sizeof divides[0]; i++) {
    int a = key_id(divides[i].g1, divides[i].k1), b = key_id(divides[i].g2, divides[i].k2);
    if (*ival(c, b) % *ival(c, a)) {
      int ids[] = {a, b};
      XERR(ids, "%s does not divide %s%s", REF(0, a), REF(1, b), divides[i].why);
    }
  }
  if (m->d_model % m->n_head == 0 && m->arch == TSR_ARCH_LLAMA && (m->d_model / m->n_head) % 2) {
    int ids[] = {n_head, d_model, arch};
    XERR(ids, "head dimension %s / %s = %lld is odd; RoPE (arch 'llama') needs it even",
         REF(0, d_model), REF(1, n_head), (long long)(m->d_model / m->n_head));
  }
  if (m->n_kv_head % pc->tp && pc->tp % m->n_kv_head) {
    int ids[] = {tp, n_kv};
    XERR(ids, "%s and %s: one must divide the other (KV heads are split over, or replicated "
         "across, tensor-parallel ranks)", REF(0, tp), REF(1, n_kv));
  }
  if (m->n_layer % pc->pp == 0 && pc->virtual_stages > 1 &&
      m->n_layer % (pc->pp * pc->virtual_stages)) {
    int ids[] = {pp, vs, n_layer};
    XERR(ids, "%s * %s = %lld does not divide %s", REF(0, pp), REF(1, vs),
         (long long)(pc->pp * pc->virtual_stages), REF(2, n_layer));
  }
  if (pc->virtual_stages > 1 && pc->schedule != TSR_SCHEDULE_INTERLEAVED) {
    int ids[] = {vs, sched};
    XERR(ids, "%s needs parallel.schedule = 'interleaved', not %s", REF(0, vs), REF(1, sched));
  }
  if (pc->sequence_parallel && m->seq_len % pc->tp) {
    int ids[] = {tp, seq_len, sp};
    XERR(ids, "%s does not divide %s (needed by sequence_parallel)", REF(0, tp), REF(1, seq_len));
  }
  if (ws % (pc->tp * pc->pp)) {
    int ids[] = {tp, pp};
    XERR(ids, "world size %d is not a multiple of %s * %s = %lld", ws, REF(0, tp), REF(1, pp),
         (long long)(pc->tp * pc->pp));
  } else {
    int64_t dp = ws / (pc->tp * pc->pp);
    int64_t per = c->train.micro_batch > INT64_MAX / dp ? INT64_MAX : c->train.micro_batch * dp;
    if (c->train.global_batch % per) {
      int ids[] = {gb, mb, tp, pp};
      XERR(ids, "%s is not a multiple of %s * dp %lld = %lld (dp = world size %d / (tp %lld * pp "
           "%lld))", REF(0, gb), REF(1, mb), (long long)dp, (long long)per, ws,
           (long long)pc->tp, (long long)pc->pp);
    } else if (pc->micro_batches && pc->micro_batches != c->train.global_batch / per) {
      int ids[] = {mbs, gb, mb};
      XERR(ids, "%s does not match %s / (%s * dp %lld) = %lld; set it to 0 to derive it",
           REF(0, mbs), REF(1, gb), REF(2, mb), (long long)dp,
           (long long)(c->train.global_batch / per));
    }
    const int64_t n = pc->shard_scope;
    if (n > 0 && dp % n) {
      int ids[] = {scope, tp, pp};
      XERR(ids, "%s does not divide dp = %lld (world size %d / (tp %lld * pp %lld))",
           REF(0, scope), (long long)dp, ws, (long long)pc->tp, (long long)pc->pp);
    }
  }
  if (hints_bad(c->checkpoint.mpiio_hints, r[0], sizeof r[0])) {
    int ids[] = {key_id(GI_checkpoint, "mpiio_hints")};
    XERR(ids, "checkpoint.mpiio_hints: %s; write 'key=value,key=value' (e.g. "
         "'romio_cb_write=enable,cb_buffer_size=16777216')", r[0]);
  }
  for (int k = 0; k < 2; k++) { /* exact scaling: the gradients are divided by it */
    const double x = k ? c->train.min_loss_scale : c->train.loss_scale;
    int e;
    if (frexp(x, &e) != 0.5) {
      int ids[] = {key_id(GI_train, k ? "min_loss_scale" : "loss_scale")};
      XERR(ids, "train.%s = %g is not a power of two (e.g. %g); the gradients are divided by "
           "the loss scale, which is exact only for powers of two",
           k ? "min_loss_scale" : "loss_scale", x, ldexp(1.0, e - 1));
    }
  }
  if (c->optim.min_lr > c->optim.lr) {
    int ids[] = {min_lr, lr};
    XERR(ids, "%s is larger than %s", REF(0, min_lr), REF(1, lr));
  }
  if (c->optim.decay_steps > 0 && c->optim.warmup_steps > c->optim.decay_steps) {
    int ids[] = {warm, dsteps};
    XERR(ids, "%s is larger than %s", REF(0, warm), REF(1, dsteps));
  }
}

/* ---------------------------------------------------------------- public API */

void tsr_deck_defaults(tsr_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  for (int k = 0; k < N_KEY; k++) {
    const char *d = schema[k].def;
    switch (schema[k].type) {
    case K_INT: *ival(cfg, k) = strtoll(d, NULL, 10); break;
    case K_REAL: *rval(cfg, k) = strtod(d, NULL); break;
    case K_LOGICAL: *lval(cfg, k) = d[1] == 't'; break;
    case K_CHOICE: *lval(cfg, k) = choice_index(schema[k].choices, d, strlen(d)); break;
    case K_SCOPE: *ival(cfg, k) = TSR_SHARD_GLOBAL; break; /* every default is 'global' */
    default: snprintf(sval(cfg, k), schema[k].size, "%s", d);
    }
  }
}

int tsr_deck_parse(tsr_config *cfg, const char *text, size_t len, const char *filename,
                   int n_overrides, char **overrides, int world_size, char *errbuf,
                   size_t errlen) {
  parser P;
  memset(&P, 0, sizeof P);
  tsr_deck_defaults(cfg);
  P.cfg = cfg, P.eb = errbuf, P.el = errlen;
  P.fname = filename ? filename : "<deck>";
  P.world_size = world_size > 0 ? world_size : 1;
  if (errbuf && errlen) errbuf[0] = 0;
  parse_file(&P, text, len);
  for (int i = 0; i < n_overrides && overrides; i++)
    if (overrides[i]) parse_override(&P, i + 1, overrides[i]);
  P.argn = 0;
  cross_checks(&P);
  return P.nerr ? TSR_ERR_INPUT : TSR_OK;
}

int tsr_deck_load(tsr_config *cfg, const char *path, int n_overrides, char **overrides,
                  int world_size) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot open: %s\n", path, strerror(errno));
    return TSR_ERR_INPUT;
  }
  size_t cap = 1 << 16, len = 0, got;
  char *text = malloc(cap);
  while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap && cap < ((size_t)64 << 20)) {
      char *grown = realloc(text, cap * 2);
      if (!grown) free(text);
      text = grown, cap *= 2;
    } else if (len == cap) {
      break;
    }
  }
  int rerr = ferror(f);
  fclose(f);
  if (!text || rerr || len == cap) {
    fprintf(stderr, "%s: cannot read: %s\n", path, !text ? "out of memory" : rerr ? "read error" : "file too large (64 MiB at most)");
    free(text);
    return TSR_ERR_INPUT;
  }
  size_t errlen = 16384;
  char *errbuf = malloc(errlen);
  int rc = tsr_deck_parse(cfg, text, len, path, n_overrides, overrides, world_size, errbuf,
                          errbuf ? errlen : 0);
  if (rc && errbuf) fputs(errbuf, stderr);
  free(errbuf);
  free(text);
  return rc;
}

static void allowed(const key_def *d, char *buf, size_t cap) {
  if (d->type == K_INT || d->type == K_REAL) {
    fmt_range(buf, cap, d);
  } else if (d->choices) {
    size_t o = 0;
    for (const char *c = d->choices; *c && o + 4 < cap;) {
      size_t m = strcspn(c, "|");
      int quote = c[0] != '<';
      o += (size_t)snprintf(buf + o, cap - o, "%s%s%.*s%s", o ? "|" : "", quote ? "'" : "", (int)m, c, quote ? "'" : "");
      c += m + (c[m] == '|');
    }
  } else {
    snprintf(buf, cap, "%s", d->type == K_LOGICAL ? ".true.|.false." : "any text");
  }
}

void tsr_deck_help(FILE *out) {
  tsr_config def;
  tsr_deck_defaults(&def);
  fprintf(out, "Tessera deck keys.  A deck is a Fortran namelist: groups &name ... /, key = value,\n"
               "! comments, strings in quotes, logicals .true./.false.  Override any key on the\n"
               "command line as group.key=value.\n");
  for (int g = 0; g < N_GROUP; g++) {
    fprintf(out, "\n&%s  (%s)\n  %-18s %-8s %-12s %-34s %s\n", group_name[g], group_help[g], "key", "type",
            "default", "allowed", "meaning");
    for (int k = 0; k < N_KEY; k++) {
      if (schema[k].group != g) continue;
      char v[VALBUF], a[128];
      fmt_value(&def, k, v, sizeof v);
      allowed(&schema[k], a, sizeof a);
      fprintf(out, "  %-18s %-8s %-12s %-34s %s\n", schema[k].name, type_name[schema[k].type], v, a,
              schema[k].help);
    }
  }
}

/* Returns the buffer size the whole deck needs, terminating NUL included, so
 * `n = tsr_deck_write(cfg, NULL, 0); buf = malloc(n); tsr_deck_write(cfg, buf, n);` works. */
size_t tsr_deck_write(const tsr_config *cfg, char *buf, size_t len) {
  size_t pos = 0;
  char v[VALBUF], line[VALBUF + 64];
  for (int g = 0; g < N_GROUP; g++) {
    for (int k = -1; k <= N_KEY; k++) {
      if (k == -1) snprintf(line, sizeof line, "&%s\n", group_name[g]);
      else if (k == N_KEY) snprintf(line, sizeof line, "/\n%s", g + 1 < N_GROUP ? "\n" : "");
      else if (schema[k].group != g) continue;
      else {
        fmt_value(cfg, k, v, sizeof v);
        snprintf(line, sizeof line, "  %-18s = %s\n", schema[k].name, v);
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

const char *tsr_deck_word(const tsr_config *cfg, const void *field) {
  static char words[N_KEY][8][24]; /* each choice key's words, split once */
  const size_t off = (size_t)((const char *)field - (const char *)cfg);
  for (int k = 0; k < N_KEY; k++) {
    if (schema[k].type != K_CHOICE || schema[k].offset != off) continue;
    const int i = *(const int *)field;
    if (i < 0 || i >= 8) return "?";
    if (!words[k][i][0]) choice_word(schema[k].choices, i, words[k][i], sizeof words[k][i]);
    return words[k][i][0] ? words[k][i] : "?";
  }
  return "?";
}
