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

#endif
