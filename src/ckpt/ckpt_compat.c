/* ckpt_compat.c — a checkpoint against the deck that loads it, key by key (ckpt_compat.h). */
#include "ckpt_compat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "deck/deck.h"
#include "model/optim.h"
#include "core/util.h"

/* Keys that fix the tensors' shapes and meaning: a different value cannot load. */
static const char *const kShape[] = {"model.arch",      "model.n_layer",   "model.d_model",
                                     "model.n_head",    "model.n_kv_head", "model.d_ff",
                                     "model.vocab_size", "model.tie_embeddings"};
/* Keys the weights were trained under: they load, but compute another function. */
static const char *const kFunction[] = {"model.rope_theta", "model.norm_eps",
                                        "model.rope_scaling"};
/* ... and those of RoPE's llama3 rescaling, where either side uses it. */
static const char *const kRopeScaling[] = {"model.rope_factor", "model.rope_low_freq_factor",
                                           "model.rope_high_freq_factor",
                                           "model.rope_original_context"};
/* The learning-rate schedule of a continued run. */
static const char *const kSchedule[] = {"run.max_steps",     "optim.lr",
                                        "optim.min_lr",      "optim.warmup_steps",
                                        "optim.decay",       "optim.decay_steps",
                                        "optim.wsd_decay_frac"};

/* Appends "key: checkpoint A, deck B" for each key of keys[] whose values differ; returns
 * how many did. */
static int differ(const tsr_config *ck, const tsr_config *cfg, const char *const *keys, int n,
                  char *buf, size_t len) {
  int count = 0;
  for (int i = 0; i < n; i++) {
    char a[320], b[320];
    tsr_deck_value_text(ck, keys[i], a, sizeof a);
    tsr_deck_value_text(cfg, keys[i], b, sizeof b);
    if (!strcmp(a, b)) continue;
    const size_t o = strlen(buf);
    snprintf(buf + o, len - o, "%s%s: checkpoint %s, deck %s", o ? "; " : "", keys[i], a, b);
    count++;
  }
  return count;
}

int tsr_ckpt_compat_check(const tsr_config *cfg, const char *path, int training,
                          const char *data_tokenizer, MPI_Comm world) {
  char *text = NULL, tokenizer[232];
  int written_world = 0, rank;
  int64_t step = 0;
  MPI_Comm_rank(world, &rank);
  TSR_CALL(tsr_ckpt_read_deck(path, &text, &written_world, &step, tokenizer, world));
  tsr_config *ck = tsr_calloc(1, sizeof *ck);
  char *err = tsr_calloc(8192, 1);
  int rc = ck && err ? 0 : TSR_ERR;
  /* every rank takes the same path from here: the same bytes, the same verdicts */
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, world);
  if (rc) goto done;
  if (data_tokenizer && data_tokenizer[0] && tokenizer[0] && strcmp(tokenizer, data_tokenizer)) {
    if (rank == 0)
      tsr_error("checkpoint %s was trained on tokens of tokenizer '%s', but the deck's data "
                "was made with '%s': the token ids would mean other text", path, tokenizer,
                data_tokenizer);
    rc = TSR_ERR_INPUT;
    goto done;
  }
  if (tsr_deck_parse(ck, text, strlen(text), path, 0, NULL, written_world, err, 8192)) {
    if (rank == 0)
      tsr_warn("checkpoint %s: its stored deck does not parse with this version, so it is "
               "not compared with this deck key by key (tensor shapes are still checked):\n%s",
               path, err);
    goto done;
  }
  char diff[4096] = "";
  int shape = differ(ck, cfg, kShape, (int)(sizeof kShape / sizeof *kShape), diff, sizeof diff);
  /* gpt2's position table has max_positions rows (0: seq_len) */
  const int64_t ck_pos = tsr_max_positions(&ck->model), pos = tsr_max_positions(&cfg->model);
  if (cfg->model.arch == TSR_ARCH_GPT2 && ck->model.arch == TSR_ARCH_GPT2 && ck_pos != pos) {
    const size_t o = strlen(diff);
    snprintf(diff + o, sizeof diff - o, "%smodel.max_positions (the rows of pos_embed): "
             "checkpoint %lld, deck %lld", o ? "; " : "", (long long)ck_pos, (long long)pos);
    shape++;
  }
  if (shape) {
    if (rank == 0)
      tsr_error("checkpoint %s was written for another model: %s.  Use the deck it was written "
              "with%s", path, diff, training ? ", or checkpoint.resume = 'none' to start afresh"
                                            : "");
    rc = TSR_ERR_INPUT;
    goto done;
  }
  diff[0] = 0;
  int changed = differ(ck, cfg, kFunction, (int)(sizeof kFunction / sizeof *kFunction), diff,
                       sizeof diff);
  if (ck->model.rope_scaling != TSR_ROPE_SCALING_NONE ||
      cfg->model.rope_scaling != TSR_ROPE_SCALING_NONE)
    changed += differ(ck, cfg, kRopeScaling, (int)(sizeof kRopeScaling / sizeof *kRopeScaling),
                      diff, sizeof diff);
  if (changed && rank == 0)
    tsr_warn("checkpoint %s: the model computes differently from the one it was trained as: "
             "%s", path, diff);
  if (!training) goto done;
  diff[0] = 0;
  if (differ(ck, cfg, kSchedule, (int)(sizeof kSchedule / sizeof *kSchedule), diff,
             sizeof diff) && step < cfg->run.max_steps && rank == 0) {
    const double was = tsr_optim_lr(&ck->optim, ck->run.max_steps, step + 1);
    const double now = tsr_optim_lr(&cfg->optim, cfg->run.max_steps, step + 1);
    char keep[160] = "";
    if (ck->optim.decay_steps == 0 && cfg->optim.decay_steps == 0 &&
        ck->run.max_steps != cfg->run.max_steps)
      snprintf(keep, sizeof keep, "; optim.decay_steps = 0 follows run.max_steps, so the "
               "decay is stretched: set optim.decay_steps = %lld to keep the checkpoint's decay",
               (long long)ck->run.max_steps);
    tsr_warn("resuming at step %lld with another learning-rate schedule: %s.  Step %lld "
             "gets lr %.4e (the checkpoint's schedule: %.4e)%s", (long long)step, diff,
             (long long)(step + 1), now, was, keep);
  }
done:
  tsr_free(&err);
  tsr_free(&ck);
  tsr_free(&text);
  return rc;
}

int tsr_ckpt_is_checkpoint(const char *path) {
  static const unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  unsigned char head[8];
  FILE *f = fopen(path, "rb");
  const int yes = f && fread(head, 1, sizeof head, f) == sizeof head &&
                  !memcmp(head, kSignature, sizeof head);
  if (f) fclose(f);
  return yes;
}

int tsr_ckpt_deck_load(tsr_config *cfg, const char *path, int n_overrides, char **overrides,
                       int world_size) {
  char *text = NULL, tokenizer[232];
  int written_world = 0;
  int64_t step = 0;
  TSR_CALL(tsr_ckpt_read_deck(path, &text, &written_world, &step, tokenizer, MPI_COMM_SELF));
  const size_t n = strlen(path) + 32;
  char *resume = tsr_calloc(n, 1);
  char **all = tsr_calloc((size_t)n_overrides + 1, sizeof *all);
  char *err = tsr_calloc(16384, 1);
  int rc = resume && all && err ? 0 : TSR_ERR;
  if (!rc) {
    snprintf(resume, n, strchr(path, '\'') ? "checkpoint.resume=\"%s\"" : "checkpoint.resume='%s'",
             path);
    all[0] = resume;
    for (int i = 0; i < n_overrides; i++) all[i + 1] = overrides[i];
    char name[TSR_STR_PATH + 32];
    snprintf(name, sizeof name, "%s (its deck)", path);
    rc = tsr_deck_parse(cfg, text, strlen(text), name, n_overrides + 1, all, world_size, err,
                        16384);
    if (rc) fputs(err, stderr);
  }
  tsr_free(&text);
  tsr_free(&resume);
  tsr_free(&all);
  tsr_free(&err);
  return rc;
}
