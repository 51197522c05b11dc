/* run_tokenizer.c — the tokenizer of a checkpoint (run_tokenizer.h). */
#include "run_tokenizer.h"

#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "core/config.h"
#include "core/util.h"

int tsr_run_tokenizer_open(tsr_tokenizer **out, const char *path, const char *ckpt,
                           const char *shards, int64_t model_vocab, const char **from) {
  const char *dummy;
  if (!from) from = &dummy;
  *out = NULL;
  if (path && path[0]) {
    *from = "--tokenizer";
    return tsr_tokenizer_open_path(out, path, model_vocab);
  }
  char name[232], whose[TSR_STR_PATH + 16];
  tsr_tokenizer_file *files = NULL;
  int n = 0;
  TSR_CALL(tsr_ckpt_read_tokenizer(ckpt, name, &files, &n));
  if (name[0] && (n > 0 || !strcmp(name, "bytes"))) {
    *from = "the checkpoint";
    snprintf(whose, sizeof whose, "checkpoint %s", ckpt);
    const int rc = tsr_tokenizer_open_files(out, name, files, n, model_vocab, whose);
    tsr_tokenizer_files_free(&files, n);
    return rc;
  }
  tsr_tokenizer_files_free(&files, n);
  *from = "the shards";
  TSR_CHECK(shards && shards[0], TSR_ERR_INPUT,
            "checkpoint %s carries no tokenizer%s%s%s (it was written before checkpoints "
            "carried theirs): give --tokenizer PATH (its NAME.model or tokenizer.json), or set "
            "&data train (or valid) to the shards it was trained on", ckpt,
            name[0] ? " file of '" : "", name, name[0] ? "'" : "");
  return tsr_tokenizer_open(out, shards, model_vocab);
}
