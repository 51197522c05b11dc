/* eval.c — `tessera eval`: the validation loss of a checkpoint, on a session
 * (session.h), logged and written to <run.out_dir>/eval.jsonl. */
#include <stdio.h>

#include "ckpt/ckpt.h"
#include "core/metrics.h"
#include "core/runctl.h"
#include "session.h"
#include "train.h"
#include "core/util.h"

int tsr_eval(const tsr_config *cfg, const char *tokenizer, MPI_Comm world) {
  tsr_session s;
  int rc = tsr_session_open(&s, cfg, world, 0);
  if (rc == 0 && !s.n_valid) {
    tsr_error("tessera eval needs &data valid (a path or glob of token shards)");
    rc = TSR_ERR_INPUT;
  }
  rc = tsr_run_agree(world, rc); /* from here on the ranks run collectives together */
  char path[TSR_STR_PATH];
  if (rc == 0) rc = tsr_ckpt_resolve(cfg, path, sizeof path, world);
  /* a run that has no checkpoint of its own yet starts from init_from's weights */
  if (rc == 0 && !path[0] && cfg->checkpoint.init_from[0])
    snprintf(path, sizeof path, "%s", cfg->checkpoint.init_from);
  if (rc == 0 && !path[0]) {
    tsr_error("tessera eval: no checkpoint to evaluate (checkpoint.resume = '%s')",
              cfg->checkpoint.resume);
    rc = TSR_ERR_INPUT;
  }
  /* document masking splits at the end-of-document id of the checkpoint's tokenizer */
  if (rc == 0) rc = tsr_session_eval_eos(&s, path, tokenizer);
  /* the weights alone: the optimizer state plays no part (and an import has none) */
  int64_t step = 0;
  if (rc == 0) rc = tsr_session_load_weights(&s, path, &step);
  double vl = 0, set_loss[TSR_MAX_DATASETS];
  int64_t batches[TSR_MAX_DATASETS] = {0};
  if (rc == 0 && (rc = tsr_session_evaluate(&s, &vl, set_loss, batches)) != 0)
    tsr_run_abort(world, rc, "evaluation");
  if (rc == 0) {
    if (s.n_valid == 1)
      tsr_log("eval %s: step %lld | val loss %.6f over %lld batch(es) of %lld", path,
              (long long)step, vl, (long long)batches[0], (long long)cfg->train.micro_batch);
    else
      tsr_log("eval %s: step %lld | val loss %.6f, the weighted total of %d validation sets:",
              path, (long long)step, vl, s.n_valid);
    for (int i = 0; s.n_valid > 1 && i < s.n_valid; i++)
      tsr_log("eval %s: step %lld | %s: val loss %.6f over %lld batch(es) of %lld (%s, weight "
              "%.4f)", path, (long long)step, cfg->data.valid_names[i], set_loss[i],
              (long long)batches[i], (long long)cfg->train.micro_batch, cfg->data.valid_glob[i],
              s.valid_weight[i]);
    /* its own file: the training run's metrics.jsonl holds the training run only */
    char mpath[TSR_STR_PATH + 32];
    const char *names[TSR_MAX_DATASETS];
    for (int i = 0; i < s.n_valid; i++) names[i] = cfg->data.valid_names[i];
    snprintf(mpath, sizeof mpath, "%s/eval.jsonl", cfg->run.out_dir);
    if (s.rank == 0 && tsr_run_make_dirs(cfg->run.out_dir) == 0 &&
        tsr_metrics_open(&s.metrics, mpath) == 0)
      tsr_metrics_eval_sets(s.metrics, step, vl, s.n_valid > 1 ? s.n_valid : 0, names,
                            set_loss);
  }
  tsr_session_close(&s);
  return rc;
}
