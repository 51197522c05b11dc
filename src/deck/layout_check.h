/* layout_check.h — whether a model and a parallel layout divide: the one set of rules the
 * deck's cross-field checks, the planner and the grid all apply.
 *
 * Each problem comes with the keys it involves and a text in which %0 .. %3 stand for
 * those keys; the caller writes a key as it likes (the deck: "model.n_head = 6 (set at
 * t.nml:2:3)", the planner and the grid: "model.n_head = 6", tsr_layout_issue_text's
 * default).  Rules that need the world size or the ranks per node are skipped while those
 * are unknown (0). */
#ifndef TSR_LAYOUT_CHECK_H
#define TSR_LAYOUT_CHECK_H

#include <stddef.h>

#include "core/config.h"

enum { TSR_LAYOUT_MAX_KEYS = 4, TSR_LAYOUT_MAX_ISSUES = 24 };

typedef struct {
  int n_keys;
  const char *keys[TSR_LAYOUT_MAX_KEYS]; /* "group.key" */
  char text[448];                        /* with %0 .. %3 for the keys */
} tsr_layout_issue;

/* The problems of cfg on `world` ranks, `ranks_per_node` to a node (either 0: unknown),
 * in a fixed order: at most max written to out; returns how many there are. */
int tsr_layout_check(const tsr_config *cfg, int world, int ranks_per_node, tsr_layout_issue *out,
                     int max);

/* The issue's text with each %i replaced by key(ctx, cfg, i-th key) — or, with key NULL,
 * by "group.key = value". */
typedef void (*tsr_layout_key_fn)(void *ctx, const tsr_config *cfg, const char *key, char *buf,
                                  size_t len);
void tsr_layout_issue_text(const tsr_layout_issue *is, const tsr_config *cfg,
                           tsr_layout_key_fn key, void *ctx, char *buf, size_t len);

/* The tokens per optimizer step, global_batch x seq_len, far outside the usual range:
 * above TSR_BATCH_TOKENS_MAX (16 M = 2^24, the largest published pre-training batches), or
 * below seq_len x dp (less than one sequence per data-parallel rank; dp 0: unknown).
 * Returns 1 with a message naming the numbers and the global batches in range, else 0. */
enum { TSR_BATCH_TOKENS_MAX = 1 << 24 };
int tsr_batch_tokens_warning(const tsr_config *cfg, long long dp, char *buf, size_t len);

#endif
