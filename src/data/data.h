/* data.h — token shards: memory-mapped reading of a glob of *.bin files.
 *
 * Shard format (docs/formats.md "Token shard header", little-endian): 256-byte header
 *   0 magic "TSRTOK01" | 8 u32 token_bytes (2|4) | 12 u32 vocab_size | 16 u64 n_tokens |
 *   24 tokenizer name (232 bytes, NUL-terminated)
 * then n_tokens tokens.  The files of a glob are taken in sorted name order and
 * concatenated into one token stream.
 *
 * Sample rule: global sample k is tokens [k*seq_len, k*seq_len + seq_len] (seq_len+1
 * tokens: inputs are the first seq_len, targets the last seq_len) of the concatenated
 * stream; n_samples = (total_tokens - 1) / seq_len per epoch.  Sample k >= n_samples
 * wraps into epoch k / n_samples.  With shuffle, sample k reads stored sample
 * perm(seed, epoch)[k % n_samples], a seeded bijection computed without tables. */
#ifndef TSR_DATA_H
#define TSR_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct tsr_data tsr_data;

/* Open every file matching `pattern` (a path or a glob).  Validates every header and
 * every token (id < vocab_size, and vocab_size in the header <= the model's); a path that
 * is not a regular file (a directory, a named pipe) is refused before it is opened.
 * Errors name the file and byte offset and return TSR_ERR_INPUT. */
int tsr_data_open(tsr_data **out, const char *pattern, int64_t seq_len, int64_t vocab_size,
                  int shuffle, uint64_t seed);
void tsr_data_destroy(tsr_data **d);
/* How many files `pattern` matches (a path without glob characters: 1, whether or not it
 * exists; -1 when the glob cannot be expanded: tsr_data_open says what is wrong). */
int tsr_data_n_matches(const char *pattern);

/* The tokenizer name in the header of the first file of `pattern` (sorted order) and that
 * file's path, from its header alone (no token is read): how tessera generate and the
 * trainer's sample line find the tokenizer.  Errors as tsr_data_open's. */
int tsr_data_peek(const char *pattern, int64_t vocab_size, char *tokenizer, size_t tlen,
                  char *first_path, size_t plen);

int64_t tsr_data_n_samples(const tsr_data *d);  /* per epoch */
int64_t tsr_data_n_tokens(const tsr_data *d);
int tsr_data_n_files(const tsr_data *d);
const char *tsr_data_tokenizer(const tsr_data *d); /* from the first shard's header */

/* Tokens of global sample k: seq_len + 1 values into tokens[]. */
void tsr_data_sample(const tsr_data *d, int64_t k, int32_t *tokens);
/* Samples first .. first+count-1: inputs[i*seq_len + t], targets[i*seq_len + t]. */
void tsr_data_batch(const tsr_data *d, int64_t first, int64_t count, int32_t *inputs,
                    int32_t *targets);

/* ---- mixtures (docs/formats.md "Mixtures of datasets") ----
 * A mixture blends n opened datasets ("sets") into one stream of global samples.  With
 * the weights normalised to w_d (sum 1), global sample i >= origin goes to the set d
 * that maximises w_d * (i - origin + 1) - (c_d(i) - c_d(origin)), the lowest d on a tie,
 * where c_d(i) counts the samples of set d among global samples [0, i): the counts track
 * the weights at every prefix (each within one sample of w_d * samples).  Set d's j-th
 * sample is its own sample j (its own shuffle seed and epochs).  The blend is a pure
 * function of the state at `origin` (origin 0 and zero counts for a new run; a restart
 * whose mixture changed starts a new one there), so any rank computes any sample. */
#define TSR_DATA_MAX_SETS 64

/* Takes ownership of sets[0..n) (destroyed on failure too); weights >= 0 with a positive
 * sum; names copied.  The sets must share a tokenizer (TSR_ERR_INPUT naming them). */
int tsr_data_mix(tsr_data **out, tsr_data **sets, const double *weights,
                 const char *const *names, int n);
/* The shuffle seed of a mixture's set: run.seed mixed with its name, so that reordering
 * the list keeps every set's order. */
uint64_t tsr_data_set_seed(uint64_t seed, const char *name);

int tsr_data_n_sets(const tsr_data *d);                 /* 0 for a plain dataset */
const tsr_data *tsr_data_set(const tsr_data *d, int i); /* set i of a mixture */
const char *tsr_data_set_name(const tsr_data *d, int i);
double tsr_data_set_weight(const tsr_data *d, int i);   /* normalised */
/* counts[d]: the samples of set d among global samples [0, k), k >= the blend's origin */
void tsr_data_mix_counts(const tsr_data *d, int64_t k, int64_t *counts);
/* Remember the state at global sample k (the next step's first), so that reading samples
 * from there replays at most a step's worth of the blend.  No-op on a plain dataset. */
void tsr_data_mix_seek(tsr_data *d, int64_t k);

/* The blend's state at global sample `cursor` as text, for a checkpoint ("" for a plain
 * dataset): a line "origin K" and a line "NAME WEIGHT ORIGIN_COUNT COUNT" per set. */
void tsr_data_mix_state(const tsr_data *d, int64_t cursor, char *buf, size_t len);
/* Continue from a checkpoint's state text at `cursor` (the samples it consumed).  Returns
 * 0 when the mixture is the one the state describes (the same names, in order, and
 * weights): the exact sample sequence goes on; 1 when it is not (or state is "": a
 * checkpoint without a mixture): a new blend starts at cursor, each set at the count the
 * state gives its name (0 for a new one), and `why` says what changed; TSR_ERR_INPUT
 * (reported) when the text is damaged. */
int tsr_data_mix_resume(tsr_data *d, int64_t cursor, const char *state, char *why,
                        size_t len);

#endif
