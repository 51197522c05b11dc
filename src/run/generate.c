/* generate.c — text from the model (generate.h): picking the next token from the logits,
 * the `tessera generate` command and the trainer's sample line. */
#include "generate.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_compat.h"
#include "comm/comm.h"
#include "deck/deck.h"
#include "model/layout.h"
#include "model/model.h"
#include "ops/ops.h"
#include "cpu/ops_cpu.h"
#include "ops/ops_backend.h"
#include "data/tokenizer.h"
#include "run_tokenizer.h"
#include "core/util.h"
#include "core/watchdog.h"
#include "comm/grid.h"
#include "data/data.h"
#include "core/metrics.h"

#define SAMPLE_TOKENS 32 /* the trainer's sample line */

/* ---------------------------------------------------------------- picking a token */

typedef struct {
  double temperature; /* 0: the largest logit */
  int64_t top_k;      /* > 0: draw among the top_k largest only */
  uint64_t key;       /* the RNG's key, from the seed */
} sampling;

typedef struct {
  float v;
  int32_t id;
} scored;

/* Larger logit first; equal ones in id order, so the order is a function of the logits. */
static int by_logit(const void *a, const void *b) {
  const scored *x = a, *y = b;
  if (x->v != y->v) return x->v > y->v ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

/* The id of the largest of row[0..n) (the first of equal ones; non-finite ones never
 * win unless all are), or -1 for n = 0. */
static int32_t argmax(const float *row, int64_t n) {
  int32_t best = n > 0 ? 0 : -1;
  for (int64_t i = 1; i < n; i++)
    if (isfinite(row[i]) && (!isfinite(row[best]) || row[i] > row[best])) best = (int32_t)i;
  return best;
}

/* The next token from the logits row[0..n) of ids 0..n-1; `index` numbers the draw.
 * sc: scratch for n entries. */
static int32_t pick(const float *row, int64_t n, const sampling *sp, uint64_t index, scored *sc) {
  if (sp->temperature <= 0) return argmax(row, n);
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(row[i])) sc[m++] = (scored){row[i], (int32_t)i};
  if (m == 0) return argmax(row, n);
  if (sp->top_k > 0 && sp->top_k < m) {
    qsort(sc, (size_t)m, sizeof *sc, by_logit);
    m = sp->top_k;
  }
  float top = sc[0].v;
  for (int64_t i = 1; i < m; i++) top = sc[i].v > top ? sc[i].v : top;
  double sum = 0;
  for (int64_t i = 0; i < m; i++) sum += exp(((double)sc[i].v - top) / sp->temperature);
  const double u = tsr_rand_uniform(sp->key, index) * sum;
  double acc = 0;
  for (int64_t i = 0; i < m; i++) {
    acc += exp(((double)sc[i].v - top) / sp->temperature);
    if (acc >= u) return sc[i].id;
  }
  return sc[m - 1].id; /* u rounded above the last partial sum */
}

/* The model's input for context ctx[0..n): its last T tokens at the start of the
 * micro-batch (B sequences of T), zeros after them (a causal model never looks right of
 * a position).  Returns the row of the context's last token. */
static int64_t fill_window(const int32_t *ctx, int64_t n, int64_t T, int64_t B, int32_t *inputs,
                           int32_t *targets) {
  const int64_t from = n > T ? n - T : 0;
  memset(inputs, 0, (size_t)(B * T) * sizeof *inputs);
  memset(targets, 0, (size_t)(B * T) * sizeof *targets);
  memcpy(inputs, ctx + from, (size_t)(n - from) * sizeof *ctx);
  return n - from - 1;
}

/* Row `row` of the model's logits as fp32, for this rank's ids that are below limit:
 * out[i] is the logit of id *first + i; returns how many (after tsr_ops_sync), or -1 when
 * the model could not give them (said). */
static int64_t read_logits(tsr_model *m, int64_t row, int64_t limit, float *out, int *first) {
  int count;
  const void *lg = tsr_model_row_logits(m, 0, (int)row, first, &count);
  if (!lg) return -1;
  const int64_t n = limit - *first < count ? limit - *first : count;
  if (n <= 0) return 0;
  const tsr_dtype dt = tsr_model_dtype(m);
  const size_t es = tsr_dtype_size(dt);
  /* the logits are op memory: a host copy, converted in place from the end backwards
   * (out holds n floats, at least n elements of any storage type) */
  tsr_ops_read(out, lg, (size_t)n * es);
  for (int64_t i = n - 1; i >= 0; i--) out[i] = tsr_load(dt, out, (size_t)i);
  return n;
}

/* ---------------------------------------------------------------- tessera generate */

typedef struct {
  const char *deck, *prompt, *tokenizer; /* tokenizer: --tokenizer PATH, or NULL */
  int64_t tokens, top_k, seed; /* seed < 0: run.seed */
  double temperature;
  int ids; /* print the ids instead of the text */
  int n_over;
  char **over;
} options;

static void usage(FILE *out) {
  fprintf(out,
          "usage: tessera generate DECK|CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T]\n"
          "                        [--top-k K] [--seed S] [--ids] [--tokenizer PATH]\n"
          "                        [group.key=value ...]\n"
          "Continues TEXT (default: a new document) with N tokens (default 64) sampled from the\n"
          "checkpoint that checkpoint.resume names ('auto': the newest complete one), written\n"
          "under any parallel layout, and prints the continuation on stdout; the log goes to\n"
          "stderr.  A checkpoint file in place of DECK is read with the deck it was written\n"
          "with.  The tokenizer is the one the checkpoint carries (older checkpoints: the one\n"
          "the deck's token shards name, &data train, else valid); --tokenizer PATH takes\n"
          "another (a NAME.model, a tokenizer.json, or 'bytes').\n"
          "--temperature 0 takes the most likely token (default 1), --top-k K\n"
          "draws among the K most likely only (default 0: all), --seed S fixes the draws\n"
          "(default run.seed), --ids prints the token ids instead of the text.  Runs on one\n"
          "rank (the deck's parallel layout and batch sizes are ignored); on more, rank 0\n"
          "generates and the others wait.\n");
}

/* The value of option `name` at argv[*i] ("--name VALUE" or "--name=VALUE"), or NULL
 * when argv[*i] is another option; *bad is set when the value is missing. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *bad) {
  const size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != 0) return NULL;
  if (*i + 1 >= argc) {
    *bad = 1;
    return NULL;
  }
  return argv[++*i];
}

static int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  const long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "error: %s '%s': expected a whole number in [%lld, %lld]\n", opt, s,
            (long long)lo, (long long)hi);
    return TSR_ERR_INPUT;
  }
  *out = v;
  return 0;
}

static int parse_options(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->prompt = "";
  o->tokens = 64;
  o->temperature = 1.0;
  o->seed = -1;
  o->over = argv;
  for (int i = 0; i < argc; i++) {
    int bad = 0;
    const char *v;
    if ((v = opt_value(argc, argv, &i, "--prompt", &bad))) {
      o->prompt = v;
    } else if (!bad && (v = opt_value(argc, argv, &i, "--tokenizer", &bad))) {
      o->tokenizer = v;
    } else if (!bad && (v = opt_value(argc, argv, &i, "--tokens", &bad))) {
      TSR_CALL(parse_int("--tokens", v, 1, 1 << 20, &o->tokens));
    } else if (!bad && (v = opt_value(argc, argv, &i, "--top-k", &bad))) {
      TSR_CALL(parse_int("--top-k", v, 0, INT32_MAX, &o->top_k));
    } else if (!bad && (v = opt_value(argc, argv, &i, "--seed", &bad))) {
      TSR_CALL(parse_int("--seed", v, 0, INT64_MAX, &o->seed));
    } else if (!bad && (v = opt_value(argc, argv, &i, "--temperature", &bad))) {
      char *end;
      o->temperature = strtod(v, &end);
      if (end == v || *end || !isfinite(o->temperature) || o->temperature < 0) {
        fprintf(stderr, "error: --temperature '%s': expected a number >= 0 (0: the most "
                        "likely token)\n", v);
        return TSR_ERR_INPUT;
      }
    } else if (bad) {
      fprintf(stderr, "error: %s needs a value\n", argv[i]);
      usage(stderr);
      return TSR_ERR_INPUT;
    } else if (!strcmp(argv[i], "--ids")) {
      o->ids = 1;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return -1;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "error: unknown option '%s' of tessera generate\n", argv[i]);
      usage(stderr);
      return TSR_ERR_INPUT;
    } else if (!strchr(argv[i], '=') && !o->deck) {
      o->deck = argv[i];
    } else if (!strchr(argv[i], '=')) {
      fprintf(stderr, "error: '%s': one deck only (overrides are group.key=value)\n", argv[i]);
      return TSR_ERR_INPUT;
    } else {
      o->over[o->n_over++] = argv[i]; /* argv's overrides, moved to its front */
    }
  }
  if (!o->deck) {
    fprintf(stderr, "error: tessera generate needs a deck\n");
    usage(stderr);
    return TSR_ERR_INPUT;
  }
  return 0;
}

/* The deck with the user's overrides, then one rank's layout: generation runs one
 * sequence on one rank whatever layout the run had. */
static int load_deck(tsr_config *cfg, const options *o, tsr_deck_finder find_deck) {
  static char *one_rank[] = {"parallel.tp=1", "parallel.pp=1", "parallel.virtual_stages=1",
                             "parallel.stage_layers=''",
                             "parallel.zero_stage=0", "parallel.shard_scope='global'",
                             "parallel.ranks_per_node=0", "parallel.micro_batches=0",
                             "parallel.sequence_parallel=.false.", "train.micro_batch=1",
                             "train.global_batch=1"};
  const int n_fixed = (int)(sizeof one_rank / sizeof one_rank[0]);
  char path[TSR_STR_PATH];
  snprintf(path, sizeof path, "%s", o->deck);
  if (find_deck) TSR_CALL(find_deck(o->deck, path, sizeof path));
  char **all = tsr_calloc((size_t)(o->n_over + n_fixed), sizeof *all);
  if (!all) return TSR_ERR;
  for (int i = 0; i < o->n_over; i++) all[i] = o->over[i];
  for (int i = 0; i < n_fixed; i++) all[o->n_over + i] = one_rank[i];
  const int rc = tsr_ckpt_is_checkpoint(path)
                     ? tsr_ckpt_deck_load(cfg, path, o->n_over + n_fixed, all, 1)
                     : tsr_deck_load(cfg, path, o->n_over + n_fixed, all, 1);
  tsr_free(&all);
  return rc;
}

/* What one generation holds; gen_close releases whatever was made. */
typedef struct {
  const tsr_ops_backend *dev;
  tsr_layout *lay;
  tsr_model *model;
  tsr_tokenizer *tok;
  const char *tok_from; /* where the tokenizer came from (run_tokenizer.h) */
  int32_t *ctx, *inputs, *targets;
  float *row;
  scored *sc;
} gen_state;

static void gen_close(gen_state *g) {
  tsr_model_destroy(&g->model);
  tsr_layout_destroy(&g->lay);
  tsr_tokenizer_close(&g->tok);
  tsr_free(&g->ctx);
  tsr_free(&g->inputs);
  tsr_free(&g->targets);
  tsr_free(&g->row);
  tsr_free(&g->sc);
  if (g->dev) {
    tsr_ops_set_backend(NULL);
    g->dev->close();
    g->dev = NULL;
  }
}

/* The checkpoint to read, or an input error saying why there is none. */
static int find_checkpoint(const tsr_config *cfg, char *path, size_t len) {
  TSR_CALL(tsr_ckpt_resolve(cfg, path, len, MPI_COMM_SELF));
  if (!path[0] && cfg->checkpoint.init_from[0]) /* no checkpoint of the run's own yet */
    snprintf(path, len, "%s", cfg->checkpoint.init_from);
  if (path[0]) return 0;
  char dir[TSR_STR_PATH];
  tsr_ckpt_dir(cfg, dir, sizeof dir);
  if (!strcmp(cfg->checkpoint.resume, "auto"))
    tsr_error("tessera generate: no complete checkpoint in %s (checkpoint.resume = 'auto'); "
              "train first, or set checkpoint.resume to a checkpoint file", dir);
  else
    tsr_error("tessera generate: checkpoint.resume = '%s' names no checkpoint; set it to a "
              "checkpoint file or 'auto' (the newest in %s)", cfg->checkpoint.resume, dir);
  return TSR_ERR_INPUT;
}

/* One rank's whole model with the checkpoint's weights (fp32 master rounded into the
 * compute copy); m and v are not read. */
static int load_model(gen_state *g, const tsr_config *cfg, const char *path, int64_t *step) {
  /* a deck whose model or tokenizer differs is named before any tensor is read (a
   * tokenizer the user gave is taken as it is) */
  const int given = !strcmp(g->tok_from, "--tokenizer");
  TSR_CALL(tsr_ckpt_compat_check(cfg, path, 0, given ? NULL : tsr_tokenizer_name(g->tok),
                                 MPI_COMM_SELF));
  TSR_CALL(tsr_layout_create_part(&g->lay, &cfg->model, 1, 0, 1, 0, 1));
  const tsr_model_options mo = {1, 0, NULL, 1, NULL};
  tsr_model_spec spec;
  tsr_model_spec_of(&spec, cfg);
  spec.cp = 1; /* one rank holds the whole model and sequence */
  TSR_CALL(tsr_model_create_opt(&g->model, &spec, g->lay, &mo));
  /* a model trained with document masking reads its context the same way: the start token
   * ends a document, so the prompt opens a new one at position 0 */
  if (cfg->data.document_mask)
    tsr_model_set_eos(g->model, cfg->data.eos_id >= 0 ? (int32_t)cfg->data.eos_id
                                                      : tsr_tokenizer_start(g->tok));
  tsr_ops_shapes shapes;
  tsr_model_ops_shapes(g->model, &shapes);
  shapes.deterministic = cfg->train.deterministic;
  TSR_CALL(tsr_ops_reserve(&shapes));
  /* read on the host, then copied to op memory for the model's compute copy */
  const size_t n = (size_t)g->lay->n_flat;
  float *host = tsr_calloc(n, sizeof(float));
  float *master = host ? tsr_ops_alloc(n, sizeof(float)) : NULL;
  int rc = TSR_ERR;
  if (!master) {
    tsr_error("out of memory for %zu parameters", n);
    if (tsr_ops_status() == TSR_ERR_INPUT) rc = TSR_ERR_INPUT; /* the device's: said above */
  } else {
    tsr_train_state st;
    rc = tsr_ckpt_load(path, g->lay, host, NULL, NULL, &st, MPI_COMM_SELF);
    if (rc == 0) {
      tsr_ops_copy(master, host, n * sizeof(float));
      tsr_model_set_params(g->model, master);
      tsr_ops_sync();
      *step = st.step;
    }
  }
  tsr_ops_free(&master);
  tsr_free(&host);
  return rc;
}

static int generate(const tsr_config *cfg, const options *o, gen_state *g) {
  const double t0 = tsr_now();
  char path[TSR_STR_PATH];
  TSR_CALL(find_checkpoint(cfg, path, sizeof path));
  const char *shards = cfg->data.train_glob[0][0] ? cfg->data.train_glob[0] : cfg->data.valid_glob[0];
  TSR_CALL(tsr_run_tokenizer_open(&g->tok, o->tokenizer, path, shards, cfg->model.vocab_size,
                                  &g->tok_from));
  int32_t *prompt = NULL;
  int64_t n_prompt = 0;
  TSR_CALL(tsr_tokenizer_encode(g->tok, o->prompt, strlen(o->prompt), &prompt, &n_prompt));
  g->ctx = tsr_calloc((size_t)(1 + n_prompt + o->tokens), sizeof(int32_t));
  if (g->ctx) memcpy(g->ctx + 1, prompt, (size_t)n_prompt * sizeof(int32_t));
  tsr_free(&prompt);
  TSR_CHECK(g->ctx, TSR_ERR, "out of memory");
  g->ctx[0] = tsr_tokenizer_start(g->tok);
  int64_t n = 1 + n_prompt;

  TSR_CALL(tsr_session_open_device(cfg, MPI_COMM_SELF, &g->dev));
  int64_t step = 0;
  TSR_CALL(load_model(g, cfg, path, &step));
  const int64_t T = cfg->model.seq_len, V = tsr_tokenizer_vocab(g->tok);
  g->inputs = tsr_calloc((size_t)T, sizeof(int32_t));
  g->targets = tsr_calloc((size_t)T, sizeof(int32_t));
  g->row = tsr_calloc((size_t)V, sizeof(float));
  g->sc = tsr_calloc((size_t)V, sizeof(scored));
  TSR_CHECK(g->inputs && g->targets && g->row && g->sc, TSR_ERR, "out of memory");
  const uint64_t seed = (uint64_t)(o->seed >= 0 ? o->seed : cfg->run.seed);
  const sampling sp = {o->temperature, o->top_k, tsr_mix64(seed ^ tsr_hash_str("generate"))};
  tsr_log("generate: %s (step %lld), %s on %s, tokenizer %s (%s); context %lld token(s) (with "
          "the start token), %lld to generate; temperature %g, top-k %lld, seed %llu", path,
          (long long)step, tsr_deck_word(cfg, &cfg->train.precision),
          g->dev ? "a GPU" : "the CPU", tsr_tokenizer_name(g->tok), g->tok_from, (long long)n,
          (long long)o->tokens, o->temperature, (long long)o->top_k, (unsigned long long)seed);

  const int64_t n0 = n;
  const double t_gen = tsr_now();
  double t_said = t_gen;
  for (int64_t i = 0; i < o->tokens; i++) {
    const int64_t row = fill_window(g->ctx, n, T, 1, g->inputs, g->targets);
    TSR_CALL(tsr_model_forward(g->model, g->inputs, g->targets, NULL));
    TSR_CALL(tsr_ops_status());
    int first;
    const int64_t k = read_logits(g->model, row, V, g->row, &first);
    if (k < 0) return TSR_ERR;
    g->ctx[n++] = pick(g->row, k, &sp, (uint64_t)i, g->sc);
    if (tsr_now() - t_said >= 10.0 && i + 1 < o->tokens) {
      t_said = tsr_now();
      tsr_log("generate: %lld of %lld tokens, %.1f s", (long long)(i + 1), (long long)o->tokens,
              t_said - t_gen);
    }
  }
  const double dt = tsr_now() - t_gen;
  if (o->ids) {
    for (int64_t i = n0; i < n; i++) printf("%s%d", i > n0 ? " " : "", g->ctx[i]);
    printf("\n");
  } else {
    char *text = NULL;
    size_t len = 0;
    const int rc = tsr_tokenizer_decode(g->tok, g->ctx + n0, n - n0, &text, &len);
    if (rc == 0) {
      fwrite(text, 1, len, stdout);
      fputc('\n', stdout);
    }
    tsr_free(&text);
    TSR_CALL(rc);
  }
  fflush(stdout);
  tsr_log("generate: %lld tokens in %.2f s (%.1f tokens/s, a forward of up to %lld tokens "
          "each); %.2f s in all", (long long)o->tokens, dt, (double)o->tokens / dt,
          (long long)T, tsr_now() - t0);
  return 0;
}

/* Rank 0's whole command: options, deck, generation; the log on stderr. */
static int generate_command(int argc, char **argv, int world_size, tsr_deck_finder find_deck) {
  options o;
  int rc = parse_options(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  tsr_config cfg;
  TSR_CALL(load_deck(&cfg, &o, find_deck));
  tsr_log_to(stderr);
  tsr_cpu_open(0); /* every core: the other ranks, if any, only wait */
  if (world_size > 1)
    tsr_log("generate: runs on rank 0 alone; the other %d rank(s) wait", world_size - 1);
  gen_state g = {0};
  rc = generate(&cfg, &o, &g);
  gen_close(&g);
  tsr_log_to(NULL);
  return rc;
}

int tsr_generate_main(int argc, char **argv, MPI_Comm world, tsr_deck_finder find_deck) {
  int rank, size, rc = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  if (rank == 0) rc = generate_command(argc, argv, size, find_deck);
  /* the others sleep rather than spin in a blocking broadcast while rank 0 computes */
  MPI_Request req;
  MPI_Ibcast(&rc, 1, MPI_INT, 0, world, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
  return rc;
}

/* ---------------------------------------------------------------- the trainer's sample */

/* "\n" as \n, other control bytes as \xHH, a backslash doubled: the text on one line. */
static void escape(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 5 < cap; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c == '\n') o += (size_t)snprintf(out + o, cap - o, "\\n");
    else if (c == '\t') o += (size_t)snprintf(out + o, cap - o, "\\t");
    else if (c == '\\') o += (size_t)snprintf(out + o, cap - o, "\\\\");
    else if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    else out[o++] = (char)c;
  }
  out[o] = 0;
}

/* Rank 0: the context (start token and the encoded prompt) into ctx (capacity cap) and
 * the tokenizer's vocabulary; *n = -1 when the sample cannot be made (said once). */
static void sample_context(const tsr_config *cfg, tsr_tokenizer **tok, int32_t *ctx,
                           int64_t cap, int64_t *n, int64_t *vocab) {
  static int unusable;
  *n = -1;
  const char *p = cfg->run.sample_prompt;
  int32_t *ids = NULL;
  int64_t k = 0;
  if (unusable || tsr_tokenizer_open(tok, cfg->data.train_glob[0], cfg->model.vocab_size) != 0 ||
      tsr_tokenizer_encode(*tok, p, strlen(p), &ids, &k) != 0) {
    if (!unusable++)
      tsr_log("sample: none in this run: the tokenizer cannot be used (said above)");
    return;
  }
  ctx[0] = tsr_tokenizer_start(*tok);
  k = k < cap - 1 ? k : cap - 1;
  memcpy(ctx + 1, ids, (size_t)k * sizeof *ids);
  tsr_free(&ids);
  *n = 1 + k;
  *vocab = tsr_tokenizer_vocab(*tok);
}

/* The greedy next token over the tp group: each rank's best among its vocabulary ids,
 * then the largest logit of all (the smallest id of equal ones). */
static int next_greedy(tsr_session *s, int64_t row, int64_t vocab, float *buf, int32_t *next) {
  int first;
  const int64_t k = read_logits(s->model, row, vocab, buf, &first);
  if (k < 0) return TSR_ERR;
  const int32_t i = argmax(buf, k);
  double best[2] = {i >= 0 && isfinite(buf[i]) ? buf[i] : -INFINITY, 0};
  if (s->grid->tp > 1)
    TSR_CALL(tsr_comm_all_reduce_double(s->grid->tp_comm, best, 1, TSR_COMM_MAX));
  best[1] = i >= 0 && isfinite(buf[i]) && buf[i] == best[0] ? -(double)(first + i) : -INFINITY;
  if (s->grid->tp > 1)
    TSR_CALL(tsr_comm_all_reduce_double(s->grid->tp_comm, best + 1, 1, TSR_COMM_MAX));
  *next = isfinite(best[1]) ? (int32_t)-best[1] : 0;
  return 0;
}

int tsr_generate_train_sample(tsr_session *s) {
  static int said_pp;
  const tsr_config *cfg = s->cfg;
  if (s->exec || s->grid->cp > 1) { /* the logits are on the last stage, the inputs on the
                                     * first; under cp each rank holds part of a sequence */
    if (!said_pp++)
      tsr_log("sample: none in this run: run.sample_every needs the whole model and sequence "
              "on each rank (pp = 1, cp = 1); use tessera generate on a checkpoint");
    return 0;
  }
  tsr_watchdog_activity(s->st.step, "a sample");
  const int64_t T = cfg->model.seq_len, B = cfg->train.micro_batch;
  const int64_t cap = (int64_t)sizeof cfg->run.sample_prompt + 1 + SAMPLE_TOKENS;
  int32_t *ctx = tsr_calloc((size_t)cap, sizeof(int32_t));
  float *buf = tsr_calloc((size_t)cfg->model.vocab_size, sizeof(float));
  tsr_tokenizer *tok = NULL;
  int64_t head[2] = {-1, 0}; /* context length (-1: no sample), the tokenizer's vocabulary */
  int rc = ctx && buf ? 0 : TSR_ERR;
  if (rc == 0 && s->rank == 0) sample_context(cfg, &tok, ctx, cap - SAMPLE_TOKENS, head, head + 1);
  if (rc == 0) MPI_Bcast(head, 2, MPI_INT64_T, 0, s->world);
  if (rc == 0 && head[0] > 0) MPI_Bcast(ctx, (int)head[0], MPI_INT32_T, 0, s->world);
  int64_t n = head[0];
  for (int i = 0; rc == 0 && n > 0 && i < SAMPLE_TOKENS; i++) {
    const int64_t row = fill_window(ctx, n, T, B, s->inputs, s->targets);
    rc = tsr_model_forward(s->model, s->inputs, s->targets, NULL);
    if (rc == 0) rc = tsr_ops_status();
    if (rc == 0) rc = next_greedy(s, row, head[1], buf, &ctx[n]);
    /* every rank continues with rank 0's token: the next inputs are the same everywhere */
    if (rc == 0) MPI_Bcast(&ctx[n], 1, MPI_INT32_T, 0, s->world);
    n++;
  }
  if (rc == 0 && n > 0 && s->rank == 0) {
    /* rank 0 alone: a line that cannot be decoded or formatted costs the line, never the
     * run (a failure here would abort every rank) */
    char *text = NULL, *line = NULL;
    size_t len = 0;
    if (tsr_tokenizer_decode(tok, ctx + 1, n - 1, &text, &len) == 0 &&
        (line = tsr_calloc(4 * len + 8, 1)) != NULL) {
      escape(text, len, line, 4 * len + 8);
      tsr_log("sample: %s", line);
    } else {
      tsr_warn("sample at step %lld: the tokens could not be turned into text; training goes on",
               (long long)s->st.step);
    }
    tsr_free(&text);
    tsr_free(&line);
  }
  tsr_tokenizer_close(&tok);
  tsr_free(&ctx);
  tsr_free(&buf);
  return rc;
}
