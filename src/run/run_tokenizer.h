/* run_tokenizer.h — the tokenizer of a checkpoint, for tessera generate and tessera eval.
 *
 * In this order: the file the user names (--tokenizer PATH: tsr_tokenizer_open_path);
 * the tokenizer the checkpoint carries (/tokenizer, docs/formats.md "Checkpoint
 * datasets"), so a checkpoint copied alone anywhere is enough; for a checkpoint that
 * carries none (written before checkpoints carried theirs, or by a run whose tokenizer
 * file was missing), the one the deck's token shards name, with its file beside them. */
#ifndef TSR_RUN_TOKENIZER_H
#define TSR_RUN_TOKENIZER_H

#include <stdint.h>

#include "data/tokenizer.h"

/* path: --tokenizer's (NULL or "": none); ckpt: the checkpoint file; shards: the deck's
 * shards (a path or glob; "" when the deck has none).  *from (may be NULL) says which was
 * used: "--tokenizer", "the checkpoint" or "the shards".  One process; TSR_ERR_INPUT,
 * reported, when none can be opened. */
int tsr_run_tokenizer_open(tsr_tokenizer **out, const char *path, const char *ckpt,
                           const char *shards, int64_t model_vocab, const char **from);

#endif
