/* deck.h — the namelist input deck: parse, validate, override, describe, echo.
 *
 * Syntax (Fortran namelist): groups `&run ... /`, `key = value`, `!` comments,
 * logicals .true./.false./T/F, strings in '…' or "…" with a doubled quote as escape,
 * numbers with e/E/d/D exponents (1.0d-4), separators comma / space / newline,
 * arrays `a = 1, 2, 3` and repeats `3*0.5`.
 *
 * One typed schema (in deck_schema.c) is the single source of truth for parsing, validation,
 * --help-deck and the effective deck written to the log and to every checkpoint.
 * Every error reads `file:line:col: message`. */
#ifndef TSR_DECK_H
#define TSR_DECK_H

#include <stddef.h>
#include <stdio.h>

#include "core/config.h"

/* Fill cfg with every key's default. */
void tsr_deck_defaults(tsr_config *cfg);

/* Parse deck text (named `filename` in messages) over the defaults, then apply the
 * overrides ("group.key=value", reported as "<command line>:argN:col"), then run the
 * range and cross-field checks.  world_size is used for the layout checks that need
 * dp (global_batch % (micro_batch * dp)); pass 1 when unknown.  On error returns
 * TSR_ERR_INPUT and writes every message (one per line, at most errlen bytes) into
 * errbuf.  Never prints, never exits: tests and the fuzzer call this directly. */
int tsr_deck_parse(tsr_config *cfg, const char *text, size_t len, const char *filename,
                   int n_overrides, char **overrides, int world_size, char *errbuf,
                   size_t errlen);

/* Read the file and call tsr_deck_parse; prints the messages to stderr on error. */
int tsr_deck_load(tsr_config *cfg, const char *path, int n_overrides, char **overrides,
                  int world_size);

/* Every key: group, name, type, default, range / choices, help. */
void tsr_deck_help(FILE *out);
/* The distance the deck's "did you mean" measures: edits and adjacent swaps,
 * case-insensitive (99 for words over 63 characters). */
int tsr_deck_word_distance(const char *a, const char *b);

/* The deck's word for the value of a choice key of cfg, given the address of its field:
 * tsr_deck_word(cfg, &cfg->train.recompute) is "selective" (for logs; "?" for a field
 * that is not a choice key). */
const char *tsr_deck_word(const tsr_config *cfg, const void *field);
/* The same for a choice key named "group.key" and a value of it (for a module that holds
 * only its group): tsr_deck_choice_word("parallel.mpi_gpu", 2) is "staged". */
const char *tsr_deck_choice_word(const char *key, int value);

/* The value of `key` ("group.key") as the effective deck writes it ("352", "'cosine'");
 * "?" for an unknown key. */
void tsr_deck_value_text(const tsr_config *cfg, const char *key, char *buf, size_t len);
/* "group.key = value" for a key named "group.key", the value in deck syntax ("model.arch
 * = 'gpt2'"); "group.key = ?" for an unknown key. */
void tsr_deck_key_text(const tsr_config *cfg, const char *key, char *buf, size_t len);

/* The effective deck in deck syntax (every group, every key), NUL-terminated.
 * Returns the number of bytes needed (like snprintf). */
size_t tsr_deck_write(const tsr_config *cfg, char *buf, size_t len);

#endif
