/* layout_check.c — the divisibility rules of a model and a parallel layout (layout_check.h):
 * how layout.c splits tensors over tp, model.c the tokens and heads, pipeline.c the layers
 * and micro-batches, grid.c the ranks into groups and nodes, zero.c dp into shards. */
#include "layout_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "deck.h"
#include "sched/pipeline.h"
#include "core/util.h"

typedef struct {
  tsr_layout_issue *out;
  int max, n;
} issues;

/* One problem: `keys` separated by spaces, then the text (printf-formatted; %% stays for
 * the key references %0 .. %3, written "%%0" in fmt). */
static void add(issues *is, const char *keys, const char *fmt, ...) TSR_PRINTF(3, 4);
static void add(issues *is, const char *keys, const char *fmt, ...) {
  if (is->n++ >= is->max) return;
  tsr_layout_issue *x = &is->out[is->n - 1];
  memset(x, 0, sizeof *x);
  static const char *const known[] = {
      "model.d_model",      "model.n_head",           "model.n_kv_head",
      "model.n_layer",      "model.d_ff",             "model.vocab_size",
      "model.seq_len",      "model.arch",             "parallel.tp",
      "parallel.pp",        "parallel.virtual_stages", "parallel.schedule",
      "parallel.shard_scope", "parallel.ranks_per_node", "parallel.micro_batches",
      "parallel.sequence_parallel", "train.micro_batch", "train.global_batch",
      "parallel.stage_layers", "train.recompute", "parallel.cp", "parallel.cp_comm",
      "data.document_mask"};
  while (*keys && x->n_keys < TSR_LAYOUT_MAX_KEYS) { /* keys point at the static names */
    const size_t len = strcspn(keys, " ");
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
      if (strlen(known[k]) == len && !strncmp(known[k], keys, len))
        x->keys[x->n_keys++] = known[k];
    keys += len + (keys[len] == ' ');
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(x->text, sizeof x->text, fmt, ap);
  va_end(ap);
}

/* The model alone: heads, KV heads, the MLP and the vocabulary over tp, layers over pp and
 * its chunks, RoPE's pairs, the schedule of virtual stages, sequence parallelism. */
static void check_model(const tsr_config *c, issues *is) {
  const tsr_model_config *m = &c->model;
  const tsr_parallel_config *pc = &c->parallel;
  const long long tp = pc->tp, pp = pc->pp, v = pc->virtual_stages;
  if (tp < 1 || pp < 1 || v < 1 || m->n_head < 1 || m->n_kv_head < 1) {
    add(is, "parallel.tp parallel.pp parallel.virtual_stages",
        "%%0, %%1 and %%2 must be at least 1");
    return;
  }
  if (m->d_model % m->n_head) add(is, "model.n_head model.d_model", "%%0 does not divide %%1");
  if (m->n_head % m->n_kv_head)
    add(is, "model.n_kv_head model.n_head",
        "%%0 does not divide %%1 (query heads are shared out evenly over KV heads)");
  if (m->n_head % tp)
    add(is, "parallel.tp model.n_head",
        "%%0 does not divide %%1 (attention heads are split over tensor-parallel ranks)");
  if (m->n_kv_head % tp && tp % m->n_kv_head)
    add(is, "parallel.tp model.n_kv_head",
        "%%0 and %%1: one must divide the other (KV heads are split over, or replicated "
        "across, tensor-parallel ranks)");
  if (m->d_ff % tp)
    add(is, "parallel.tp model.d_ff",
        "%%0 does not divide %%1 (MLP columns are split over tensor-parallel ranks)");
  if (m->vocab_size % tp)
    add(is, "parallel.tp model.vocab_size",
        "%%0 does not divide %%1 (the embedding and LM head are split by vocabulary; pad "
        "vocab_size)");
  if (pc->stage_layers[0]) { /* an explicit or balanced split: pipeline.c's rules */
    int counts[TSR_PP_MAX_CHUNKS];
    char why[256];
    if (tsr_pp_split_counts(m, (int)pp, (int)v, pc->stage_layers, counts, why, sizeof why))
      add(is, "parallel.stage_layers parallel.pp parallel.virtual_stages model.n_layer",
          "%%0: %s", why);
  } else if (m->n_layer % pp)
    add(is, "parallel.pp model.n_layer",
        "%%0 does not divide %%1 (every pipeline stage holds the same number of layers; "
        "parallel.stage_layers splits unevenly)");
  else if (v > 1 && m->n_layer % (pp * v))
    add(is, "parallel.pp parallel.virtual_stages model.n_layer",
        "%%0 * %%1 = %lld does not divide %%2 (every chunk holds the same number of layers; "
        "parallel.stage_layers splits unevenly)", pp * v);
  if (m->arch == TSR_ARCH_LLAMA && m->d_model % m->n_head == 0 && (m->d_model / m->n_head) % 2)
    add(is, "model.d_model model.n_head model.arch",
        "head dimension %%0 / %%1 = %lld is odd; RoPE (arch 'llama') needs it even",
        (long long)(m->d_model / m->n_head));
  if (pc->shard_scope < TSR_SHARD_NODE)
    add(is, "parallel.shard_scope", "%%0 is not 'global', 'node' or a positive number of ranks");
  /* the schedule's own constraints, from its descriptor (src/sched/) */
  const tsr_sched_desc *sd = tsr_sched(pc->schedule);
  const unsigned broken =
      sd ? tsr_sched_broken(sd, (int)pp, (int)v, 0, c->train.recompute != TSR_RECOMPUTE_NONE)
         : 0;
  if (broken & 1u << TSR_SCHED_FEW_STAGES)
    add(is, "parallel.schedule parallel.pp", "%%0 needs a pipeline: %%1 must be at least %d",
        sd->min_pp);
  if (broken & 1u << TSR_SCHED_RECOMPUTE)
    add(is, "parallel.schedule train.recompute",
        "%%0 keeps every activation until its W pass: %%1 must be 'none'");
  if (broken & 1u << TSR_SCHED_CHUNK_COUNT)
    add(is, "parallel.schedule parallel.virtual_stages", "%%0 %s: %%1 must be %d",
        sd->chunks_why, sd->chunks);
  else if (broken & 1u << TSR_SCHED_NOT_CHUNKED)
    add(is, "parallel.virtual_stages parallel.schedule", "%%0 needs parallel.schedule = %s, not %%1",
        tsr_sched_chunked_words());
  const long long cp = pc->cp > 1 ? pc->cp : 1; /* 0: a configuration not from the deck */
  if (cp > 1 && m->seq_len % (2 * cp))
    add(is, "model.seq_len parallel.cp",
        "%%0 is not divisible by 2 * %%1 = %lld (context parallelism cuts each sequence into "
        "2 cp chunks of equal length)", 2 * cp);
  else if (pc->sequence_parallel && tp > 1 && cp > 1 && (m->seq_len / cp) % tp)
    add(is, "parallel.tp model.seq_len parallel.cp parallel.sequence_parallel",
        "%%0 does not divide %%1 / %%2 = %lld, a cp rank's tokens (%%3 shards them over "
        "tensor-parallel ranks)", (long long)(m->seq_len / cp));
  else if (pc->sequence_parallel && tp > 1 && m->seq_len % tp)
    add(is, "parallel.tp model.seq_len parallel.sequence_parallel",
        "%%0 does not divide %%1 (sequence_parallel shards the tokens over tensor-parallel "
        "ranks)");
  if (cp > 1 && pc->cp_comm == TSR_CP_A2A && m->n_head % tp == 0) {
    /* Ulysses: each cp rank takes H / cp of the tp rank's query heads and their KV heads */
    const long long H = m->n_head / tp, KV = m->n_kv_head >= tp ? m->n_kv_head / tp : 1;
    if (H % cp)
      add(is, "parallel.cp_comm parallel.cp model.n_head parallel.tp",
          "%%0 needs %%1 to divide the query heads of a tp rank, %%2 / %%3 = %lld (the "
          "all-to-all gives each cp rank whole heads): use parallel.cp_comm = 'p2p'", H);
    else if (KV % cp && cp % KV)
      add(is, "parallel.cp_comm parallel.cp model.n_kv_head parallel.tp",
          "%%0 needs %%1 to divide, or be a multiple of, the KV heads of a tp rank, %lld from "
          "%%2 and %%3 (each cp rank takes whole KV heads, or one replicated): use "
          "parallel.cp_comm = 'p2p'", KV);
  }
}

/* The largest divisor of q (>= 1) below mb, for the message that suggests a micro-batch: q
 * itself when it is below mb, else the best divisor pair d, q/d with d up to 10^6 (exact for
 * q up to 10^12; past that a divisor that works, maybe not the largest), 0 for none.  The
 * bounds have no upper limit, so this never counts down from mb (micro_batch = 10^12 spun
 * for hours after its message). */
static long long divisor_below(long long q, long long mb) {
  if (q < mb) return q;
  long long best = 0;
  for (long long d = 1; d <= 1000000 && d <= q / d; d++)
    if (q % d == 0) {
      if (d < mb && d > best) best = d;
      if (q / d < mb && q / d > best) best = q / d;
    }
  return best;
}

/* On `world` ranks: dp, the batch split into micro-batches, the pipeline's micro-batches,
 * the shard group. */
static void check_world(const tsr_config *c, int world, issues *is) {
  const tsr_parallel_config *pc = &c->parallel;
  const long long tp = pc->tp, pp = pc->pp, cp = pc->cp > 1 ? pc->cp : 1;
  if (cp > 1 && world % (tp * cp * pp)) {
    add(is, "parallel.tp parallel.cp parallel.pp",
        "world size %d is not a multiple of %%0 * %%1 * %%2 = %lld: start a multiple of %lld "
        "ranks, or change tp / cp / pp", world, tp * cp * pp, tp * cp * pp);
    return;
  }
  if (world % (tp * pp)) {
    add(is, "parallel.tp parallel.pp",
        "world size %d is not a multiple of %%0 * %%1 = %lld: start a multiple of %lld ranks, "
        "or change tp / pp", world, tp * pp, tp * pp);
    return;
  }
  /* a layout table may hold several chunks on one stage (layout.c asks without a world);
   * a run cannot: chunks are there to be passed between stages */
  const tsr_sched_desc *sd = tsr_sched(pc->schedule);
  if (sd && tsr_sched_broken(sd, (int)pp, (int)pc->virtual_stages, 0, -1) &
                1u << TSR_SCHED_ONE_STAGE)
    add(is, "parallel.virtual_stages parallel.pp",
        "%%0 needs a pipeline: %%1 must be at least 2 for model chunks to interleave");
  const long long dp = world / (tp * cp * pp), mb = c->train.micro_batch,
                  gb = c->train.global_batch;
  const long long per = mb > INT64_MAX / dp ? INT64_MAX : mb * dp;
  if (gb % per) {
    /* what would work: the nearest multiples of micro_batch * dp, and the largest
     * micro-batch below this one that divides the global batch's share of a dp rank */
    const long long lo = gb / per * per, hi = lo + per;
    const long long mb_ok = gb % dp ? 0 : divisor_below(gb / dp, mb);
    char how[200];
    int n = lo ? snprintf(how, sizeof how, ": train.global_batch = %lld or %lld would do", lo, hi)
               : snprintf(how, sizeof how, ": train.global_batch = %lld would do", hi);
    if (mb_ok && n > 0 && (size_t)n < sizeof how)
      snprintf(how + n, sizeof how - (size_t)n, ", or train.micro_batch = %lld", mb_ok);
    add(is, "train.global_batch train.micro_batch parallel.tp parallel.pp",
        "%%0 is not a multiple of %%1 * dp %lld = %lld (dp = world size %d / (tp %lld%s * pp "
        "%lld))%s", dp, per, world, tp, cp > 1 ? " * cp" : "", pp, how);
  } else {
    const long long m = gb / per;
    if (pc->micro_batches && pc->micro_batches != m)
      add(is, "parallel.micro_batches train.global_batch train.micro_batch",
          "%%0 does not match %%1 / (%%2 * dp %lld) = %lld; set it to 0 to derive it", dp, m);
    if (sd && tsr_sched_broken(sd, (int)pp, (int)pc->virtual_stages, (int)m, -1) &
                  1u << TSR_SCHED_MICRO_BATCHES) {
      /* the nearest global batches whose micro-batch count divides by pp */
      const long long step = per * pp, lo = gb / step * step, hi = lo + step;
      char how[120];
      if (lo)
        snprintf(how, sizeof how, ": train.global_batch = %lld or %lld would do", lo, hi);
      else
        snprintf(how, sizeof how, ": train.global_batch = %lld would do", hi);
      add(is, "parallel.virtual_stages train.global_batch train.micro_batch parallel.pp",
          "%%0 needs the micro-batches per step, %%1 / (%%2 * dp %lld) = %lld, divisible by "
          "%%3%s", dp, m, how);
    }
  }
  if (pc->shard_scope > 0 && (dp * cp) % pc->shard_scope)
    add(is, "parallel.shard_scope parallel.tp parallel.pp",
        cp > 1 ? "%%0 does not divide dp x cp = %lld (world size %d / (tp %lld * pp %lld)): "
                 "ZeRO shards over the data- and context-parallel ranks"
               : "%%0 does not divide dp = %lld (world size %d / (tp %lld * pp %lld))",
        dp * cp, world, tp, pp);
}

/* With nodes of rpn ranks: nodes cut the world evenly, a tp group lives inside one, and a
 * node-wide shard group fits the nodes. */
static void check_nodes(const tsr_config *c, int world, int rpn, issues *is) {
  const tsr_parallel_config *pc = &c->parallel;
  const long long tp = pc->tp, pp = pc->pp;
  if (world > 0 && (rpn > world || world % rpn)) {
    add(is, "parallel.ranks_per_node", "the %d ranks per node do not divide the world size %d",
        rpn, world);
    return;
  }
  if (tp > rpn)
    add(is, "parallel.tp",
        "%%0 is larger than the %d ranks per node: a tensor-parallel group must live inside "
        "one node", rpn);
  else if (rpn % tp)
    add(is, "parallel.tp",
        "%%0 does not divide the %d ranks per node: a tensor-parallel group would span two "
        "nodes", rpn);
  if (world > 0 && pc->shard_scope == TSR_SHARD_NODE && world % (tp * pp) == 0) {
    const long long stage = world / pp; /* dp x tp ranks of a pipeline stage */
    if (rpn % stage && stage % rpn)
      add(is, "parallel.shard_scope parallel.tp",
          "%%0: the dp x tp = %lld ranks of a pipeline stage and the %d ranks of a node must "
          "divide one another", stage, rpn);
  }
}

int tsr_layout_check(const tsr_config *cfg, int world, int ranks_per_node, tsr_layout_issue *out,
                     int max) {
  issues is = {out, max, 0};
  const tsr_parallel_config *pc = &cfg->parallel;
  check_model(cfg, &is);
  if (pc->tp < 1 || pc->pp < 1 || pc->virtual_stages < 1) return is.n; /* nothing divides */
  if (world > 0) check_world(cfg, world, &is);
  if (ranks_per_node > 0) check_nodes(cfg, world, ranks_per_node, &is);
  return is.n;
}

void tsr_layout_issue_text(const tsr_layout_issue *is, const tsr_config *cfg,
                           tsr_layout_key_fn key, void *ctx, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
  for (const char *p = is->text; *p && o + 1 < len; p++) {
    if (p[0] == '%' && p[1] >= '0' && p[1] < '0' + is->n_keys) {
      char k[TSR_STR_PATH + 160];
      if (key)
        key(ctx, cfg, is->keys[p[1] - '0'], k, sizeof k);
      else
        tsr_deck_key_text(cfg, is->keys[p[1] - '0'], k, sizeof k);
      o += (size_t)snprintf(buf + o, len - o, "%s", k);
      p++;
    } else {
      buf[o++] = *p;
      buf[o] = 0;
    }
  }
  if (o >= len) buf[len - 1] = 0;
}

int tsr_batch_tokens_warning(const tsr_config *cfg, long long dp, char *buf, size_t len) {
  const long long gb = cfg->train.global_batch, T = cfg->model.seq_len;
  if (gb < 1 || T < 1) return 0;
  const double tokens = (double)gb * (double)T;
  if (tokens > TSR_BATCH_TOKENS_MAX) {
    const long long most = TSR_BATCH_TOKENS_MAX / T; /* the largest global batch in range */
    snprintf(buf, len,
             "train.global_batch = %lld x model.seq_len = %lld = %.0f tokens per step (%.1f M), "
             "far above the usual range (at most 16.8 M = 2^24, the largest published "
             "pre-training batches): each step averages so many tokens that the run takes few "
             "optimizer steps for its data; %s",
             gb, T, tokens, tokens / 1e6,
             most >= 1 ? "" : "even one sequence is more than that");
    if (most >= 1) {
      const size_t n = strlen(buf);
      snprintf(buf + n, len > n ? len - n : 0, "train.global_batch = %lld or less keeps it in range",
               most);
    }
    return 1;
  }
  if (dp > 0 && gb < dp) {
    snprintf(buf, len,
             "train.global_batch = %lld x model.seq_len = %lld = %.0f tokens per step, below "
             "model.seq_len x dp = %lld x %lld = %lld (less than one sequence per data-parallel "
             "rank): train.global_batch = %lld or more",
             gb, T, tokens, T, dp, T * dp, dp);
    return 1;
  }
  return 0;
}
