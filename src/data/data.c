/* data.c — token shards: open a glob of *.bin files, memory-map them, validate every
 * header and token once, and serve global samples from the concatenated token stream.
 *
 * The sample rule (data.h, docs/formats.md "Token stream and samples") is the whole contract with the
 * trainer: sample k is stream tokens [j*seq_len, j*seq_len + seq_len] with
 * j = k mod n_samples, or j = perm(seed, epoch)(k mod n_samples) when shuffling.
 * The permutation is a keyed Feistel network over the next even power of two with
 * cycle-walking, so it needs no table, costs O(1) per sample and is the same on
 * every rank and under every parallel layout. */
#define _GNU_SOURCE
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

#define HEADER_BYTES 256
#define NAME_BYTES 232
#define FEISTEL_ROUNDS 6

typedef struct {
  char *path;
  const unsigned char *map; /* whole file, read-only */
  size_t map_bytes;
  int token_bytes;          /* 2 or 4 */
  uint32_t vocab_size;      /* from the header */
  int64_t n_tokens;
  int64_t first;            /* stream index of this shard's first token */
} shard;

struct tsr_data {
  int n_files;
  shard *files;
  int64_t n_tokens;
  int64_t seq_len;
  int64_t n_samples;
  int shuffle;
  uint64_t seed;
  char tokenizer[NAME_BYTES + 1];
  /* a mixture (n_sets > 0; the fields above are then its sets' totals): the sets, their
   * normalised weights and names, the blend's origin and its counts there, and a state
   * remembered at `base` (data.h) */
  int n_sets;
  tsr_data **sets;
  double *w;
  char **names;
  int64_t origin, base;
  int64_t *origin_counts, *base_counts;
};

static uint32_t load_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t load_u64(const unsigned char *p) {
  return (uint64_t)load_u32(p) | (uint64_t)load_u32(p + 4) << 32;
}

static char *dup_string(const char *s) {
  size_t n = strlen(s) + 1;
  char *c = tsr_calloc(n, 1);
  if (c) memcpy(c, s, n);
  return c;
}

static int cmp_strings(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Map one file and check its header against the model; fills everything but `first`. */
static int map_shard(shard *s, int64_t model_vocab) {
  const char *path = s->path;
  struct stat st;
  /* looked at before it is opened: opening a FIFO (or a device) could wait forever */
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    tsr_error("'%s' is not a regular file; &data train/valid take shard files or a glob "
              "such as 'DIR/train_*.bin'", path);
    return TSR_ERR_INPUT;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    tsr_error("cannot open token shard '%s': %s; check the &data path or glob", path,
              strerror(errno));
    return TSR_ERR_INPUT;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    tsr_error("'%s' is not a regular file; &data train/valid take shard files or a glob "
              "such as 'DIR/train_*.bin'", path);
    return TSR_ERR_INPUT;
  }
  if (st.st_size < HEADER_BYTES) {
    close(fd);
    tsr_error("token shard '%s' is truncated: expected at least the %d-byte header, found %lld "
              "bytes; re-create it with tools/tsr-prepare", path, HEADER_BYTES,
              (long long)st.st_size);
    return TSR_ERR_INPUT;
  }
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    tsr_error("cannot memory-map token shard '%s' (%lld bytes): %s", path, (long long)st.st_size,
              strerror(errno));
    return TSR_ERR_INPUT;
  }
  s->map = map;
  s->map_bytes = (size_t)st.st_size;
  const unsigned char *h = s->map;

  if (memcmp(h, "TSRTOK01", 8) != 0) {
    if (memcmp(h, "TSRTOK", 6) == 0)
      tsr_error("token shard '%s' has format version '%.2s' at byte offset 6, this build reads "
                "version '01'; re-create it with this version's tools/tsr-prepare", path,
                (const char *)h + 6);
    else
      tsr_error("'%s' is not a Tessera token shard: magic at byte offset 0 is not 'TSRTOK01'; "
                "create shards with tools/tsr-prepare", path);
    return TSR_ERR_INPUT;
  }
  uint32_t token_bytes = load_u32(h + 8);
  if (token_bytes != 2 && token_bytes != 4) {
    tsr_error("token shard '%s': token_bytes at byte offset 8 is %" PRIu32 ", must be 2 or 4; "
              "the file is corrupt, re-create it with tools/tsr-prepare", path, token_bytes);
    return TSR_ERR_INPUT;
  }
  s->token_bytes = (int)token_bytes;
  s->vocab_size = load_u32(h + 12);
  if (s->vocab_size == 0) {
    tsr_error("token shard '%s': vocab_size at byte offset 12 is 0; the file is corrupt, "
              "re-create it with tools/tsr-prepare", path);
    return TSR_ERR_INPUT;
  }
  if ((int64_t)s->vocab_size > model_vocab) {
    tsr_error("token shard '%s' was made with vocab_size %" PRIu32 " (header byte offset 12) but "
              "the model's vocab_size is %" PRId64 "; set &model vocab_size >= %" PRIu32
              " or use shards made with the model's tokenizer", path, s->vocab_size, model_vocab,
              s->vocab_size);
    return TSR_ERR_INPUT;
  }
  if (memchr(h + 24, 0, NAME_BYTES) == NULL) {
    tsr_error("token shard '%s': tokenizer name at byte offset 24 is not NUL-terminated within "
              "%d bytes; the file is corrupt, re-create it with tools/tsr-prepare", path,
              NAME_BYTES);
    return TSR_ERR_INPUT;
  }
  uint64_t n_tokens = load_u64(h + 16);
  uint64_t payload = (uint64_t)s->map_bytes - HEADER_BYTES;
  if (n_tokens > payload / token_bytes) {
    /* n_tokens from a corrupt header can overflow the byte count: say so instead. */
    int huge = n_tokens > (UINT64_MAX - HEADER_BYTES) / token_bytes;
    uint64_t expected = huge ? 0 : HEADER_BYTES + n_tokens * token_bytes;
    tsr_error("token shard '%s' is truncated: its header (byte offset 16) says %" PRIu64
              " tokens of %" PRIu32 " bytes, so expected %s%" PRIu64 " bytes, found %zu; "
              "re-create it with tools/tsr-prepare or copy it again",
              path, n_tokens, token_bytes, huge ? "more than " : "",
              huge ? UINT64_MAX : expected, s->map_bytes);
    return TSR_ERR_INPUT;
  }
  if (payload != n_tokens * token_bytes) {
    tsr_error("token shard '%s' has %" PRIu64 " bytes after the last token (expected %" PRIu64
              " bytes for %" PRIu64 " tokens of %" PRIu32 " bytes, found %zu); the file is "
              "corrupt or was appended to, re-create it with tools/tsr-prepare", path,
              payload - n_tokens * token_bytes, HEADER_BYTES + n_tokens * token_bytes, n_tokens,
              token_bytes, s->map_bytes);
    return TSR_ERR_INPUT;
  }
  s->n_tokens = (int64_t)n_tokens;
  return 0;
}

/* Every token must be < the header's vocab_size (which is <= the model's).  The common
 * case is a clean file, so scan blocks for their maximum and locate the offender only
 * when a block fails: the loop stays branch-free and memory-bound. */
static int scan_tokens(const shard *s) {
  const unsigned char *p = s->map + HEADER_BYTES;
  uint32_t limit = s->vocab_size;
  if (s->token_bytes == 2 && limit > 65535) return 0;
  const int64_t block = 1 << 16;
  for (int64_t b = 0; b < s->n_tokens; b += block) {
    int64_t e = b + block < s->n_tokens ? b + block : s->n_tokens;
    uint32_t max = 0;
    if (s->token_bytes == 2) {
      for (int64_t i = b; i < e; i++) {
        uint32_t v = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
        max = v > max ? v : max;
      }
    } else {
      for (int64_t i = b; i < e; i++) {
        uint32_t v = load_u32(p + 4 * i);
        max = v > max ? v : max;
      }
    }
    if (max < limit) continue;
    for (int64_t i = b; i < e; i++) {
      uint32_t v = s->token_bytes == 2 ? (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8
                                       : load_u32(p + 4 * i);
      if (v >= limit) {
        tsr_error("token id %" PRIu32 " >= vocab_size %" PRIu32 " at byte offset %" PRId64
                  " (token %" PRId64 ") in %s; the shard is corrupt or its header is wrong, "
                  "re-create it with tools/tsr-prepare", v, limit,
                  (int64_t)HEADER_BYTES + i * s->token_bytes, i, s->path);
        return TSR_ERR_INPUT;
      }
    }
  }
  return 0;
}

/* Expand `pattern` into a sorted list of paths (a pattern without glob characters is
 * taken as one path, so a missing file gets its own message from map_shard). */
static int expand_pattern(const char *pattern, char ***paths, int *n_paths) {
  *paths = NULL;
  *n_paths = 0;
  if (strpbrk(pattern, "*?[") == NULL) {
    char **list = tsr_calloc(1, sizeof *list);
    if (!list || !(list[0] = dup_string(pattern))) {
      tsr_free(&list);
      return TSR_ERR;
    }
    *paths = list;
    *n_paths = 1;
    return 0;
  }
  glob_t g;
  memset(&g, 0, sizeof g);
  int rc = glob(pattern, 0, NULL, &g);
  if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
    globfree(&g);
    tsr_error("no files match the data glob '%s'; check &data train/valid, or create shards "
              "with tools/tsr-prepare (e.g. tools/fortunes-corpus.sh data/fortunes)", pattern);
    return TSR_ERR_INPUT;
  }
  if (rc != 0) {
    globfree(&g);
    tsr_error("cannot expand the data glob '%s' (%s); check that its directories are readable",
              pattern, rc == GLOB_NOSPACE ? "out of memory" : "read error");
    return TSR_ERR_INPUT;
  }
  if (g.gl_pathc > (size_t)INT32_MAX) {
    globfree(&g);
    tsr_error("the data glob '%s' matches %zu files, more than this build handles", pattern,
              g.gl_pathc);
    return TSR_ERR_INPUT;
  }
  char **list = tsr_calloc(g.gl_pathc, sizeof *list);
  if (!list) {
    globfree(&g);
    return TSR_ERR;
  }
  for (size_t i = 0; i < g.gl_pathc; i++) {
    if (!(list[i] = dup_string(g.gl_pathv[i]))) {
      for (size_t j = 0; j < i; j++) tsr_free(&list[j]);
      tsr_free(&list);
      globfree(&g);
      return TSR_ERR;
    }
  }
  /* Byte order, not the locale's collation: every rank and machine must agree. */
  qsort(list, g.gl_pathc, sizeof *list, cmp_strings);
  *paths = list;
  *n_paths = (int)g.gl_pathc;
  globfree(&g);
  return 0;
}

int tsr_data_n_matches(const char *pattern) {
  if (strpbrk(pattern, "*?[") == NULL) return 1;
  glob_t g;
  memset(&g, 0, sizeof g);
  const int rc = glob(pattern, 0, NULL, &g);
  const int n = rc == GLOB_NOMATCH ? 0
                : rc == 0            ? (int)(g.gl_pathc < INT32_MAX ? g.gl_pathc : INT32_MAX)
                                     : -1;
  globfree(&g);
  return n;
}

int tsr_data_open(tsr_data **out, const char *pattern, int64_t seq_len, int64_t vocab_size,
                  int shuffle, uint64_t seed) {
  *out = NULL;
  TSR_CHECK(pattern && pattern[0], TSR_ERR_INPUT,
            "empty data path; set &data train (and valid) to a shard file or glob");
  TSR_CHECK(seq_len > 0, TSR_ERR_INPUT, "data '%s': seq_len must be > 0, got %" PRId64, pattern,
            seq_len);
  TSR_CHECK(vocab_size > 0, TSR_ERR_INPUT, "data '%s': vocab_size must be > 0, got %" PRId64,
            pattern, vocab_size);

  char **paths = NULL;
  int n_paths = 0;
  TSR_CALL(expand_pattern(pattern, &paths, &n_paths));

  tsr_data *d = tsr_calloc(1, sizeof *d);
  shard *files = tsr_calloc((size_t)n_paths, sizeof *files);
  if (!d || !files) {
    for (int i = 0; i < n_paths; i++) tsr_free(&paths[i]);
    tsr_free(&paths);
    tsr_free(&d);
    tsr_free(&files);
    return TSR_ERR;
  }
  for (int i = 0; i < n_paths; i++) files[i].path = paths[i]; /* ownership moves to d */
  tsr_free(&paths);
  d->files = files;
  d->n_files = n_paths;
  d->seq_len = seq_len;
  d->shuffle = shuffle != 0;
  d->seed = seed;

  int rc = 0;
  int64_t total = 0;
  for (int i = 0; i < d->n_files && rc == 0; i++) {
    shard *s = &d->files[i];
    rc = map_shard(s, vocab_size);
    if (rc == 0) rc = scan_tokens(s);
    if (rc != 0) break;
    const char *name = (const char *)s->map + 24;
    if (i == 0) {
      memcpy(d->tokenizer, name, strlen(name) + 1);
    } else if (strcmp(name, d->tokenizer) != 0) {
      tsr_error("token shard '%s' was made with tokenizer '%s' but '%s' with '%s'; the shards "
                "of one glob must share a tokenizer, re-create them with one tools/tsr-prepare run",
                s->path, name, d->files[0].path, d->tokenizer);
      rc = TSR_ERR_INPUT;
      break;
    }
    s->first = total;
    total += s->n_tokens;
  }
  if (rc == 0 && total < seq_len + 1) {
    if (d->n_files == 1)
      tsr_error("token shard '%s' has %" PRId64 " tokens, fewer than the %" PRId64
                " one sample needs (seq_len + 1); use more text or a smaller seq_len",
                d->files[0].path, total, seq_len + 1);
    else
      tsr_error("the %d token shards matching '%s' (first '%s') have %" PRId64 " tokens in all, "
                "fewer than the %" PRId64 " one sample needs (seq_len + 1); use more text or a "
                "smaller seq_len", d->n_files, pattern, d->files[0].path, total, seq_len + 1);
    rc = TSR_ERR_INPUT;
  }
  if (rc != 0) {
    tsr_data_destroy(&d);
    return rc;
  }
  d->n_tokens = total;
  d->n_samples = (total - 1) / seq_len;
  *out = d;
  return 0;
}

int tsr_data_peek(const char *pattern, int64_t vocab_size, char *tokenizer, size_t tlen,
                  char *first_path, size_t plen) {
  TSR_CHECK(pattern && pattern[0], TSR_ERR_INPUT,
            "empty data path; set &data train (or valid) to a shard file or glob");
  char **paths = NULL;
  int n_paths = 0;
  TSR_CALL(expand_pattern(pattern, &paths, &n_paths));
  shard s = {.path = paths[0]};
  int rc = map_shard(&s, vocab_size);
  if (rc == 0) {
    snprintf(tokenizer, tlen, "%s", (const char *)s.map + 24);
    snprintf(first_path, plen, "%s", s.path);
  }
  if (s.map) munmap((void *)s.map, s.map_bytes);
  for (int i = 0; i < n_paths; i++) tsr_free(&paths[i]);
  tsr_free(&paths);
  return rc;
}

void tsr_data_destroy(tsr_data **dp) {
  if (!dp || !*dp) return;
  tsr_data *d = *dp;
  for (int i = 0; i < d->n_sets; i++) {
    tsr_data_destroy(&d->sets[i]);
    if (d->names) tsr_free(&d->names[i]);
  }
  tsr_free(&d->sets);
  tsr_free(&d->names);
  tsr_free(&d->w);
  tsr_free(&d->origin_counts);
  tsr_free(&d->base_counts);
  for (int i = 0; i < d->n_files && d->files; i++) { /* a mixture's are its sets' */
    if (d->files[i].map) munmap((void *)d->files[i].map, d->files[i].map_bytes);
    tsr_free(&d->files[i].path);
  }
  tsr_free(&d->files);
  tsr_free(dp);
}

int64_t tsr_data_n_samples(const tsr_data *d) { return d->n_samples; }
int64_t tsr_data_n_tokens(const tsr_data *d) { return d->n_tokens; }
int tsr_data_n_files(const tsr_data *d) { return d->n_files; }
const char *tsr_data_tokenizer(const tsr_data *d) { return d->tokenizer; }

/* ---- seeded permutation of [0, n) ----
 * A balanced Feistel network on 2*half_bits bits is a bijection of [0, 4^half_bits) for
 * any round function; walking the cycle until the value lands in [0, n) restricts it to a
 * bijection of [0, n).  4^half_bits < 4n, so the expected walk is under four steps. */
static uint64_t feistel(uint64_t x, int half_bits, uint64_t key) {
  uint64_t mask = (UINT64_C(1) << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  for (int r = 0; r < FEISTEL_ROUNDS; r++) {
    uint64_t f = tsr_mix64(right ^ tsr_mix64(key + (uint64_t)r)) & mask;
    uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return left << half_bits | right;
}

static int64_t permute(int64_t j, int64_t n, uint64_t seed, int64_t epoch) {
  if (n <= 1) return 0;
  int bits = 0;
  while ((UINT64_C(1) << bits) < (uint64_t)n) bits++;
  int half_bits = (bits + 1) / 2;
  uint64_t key = tsr_mix64(seed ^ tsr_mix64((uint64_t)epoch ^ UINT64_C(0x5eed5eed5eed5eed)));
  uint64_t x = (uint64_t)j;
  do x = feistel(x, half_bits, key);
  while (x >= (uint64_t)n);
  return (int64_t)x;
}

/* Copy stream tokens [start, start + count) into dst, crossing shard boundaries. */
static void read_tokens(const tsr_data *d, int64_t start, int64_t count, int32_t *dst) {
  /* The last shard whose first token is <= start holds it (empty shards never qualify
   * as "last" because the next shard starts at the same index). */
  int lo = 0, hi = d->n_files - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (d->files[mid].first <= start) lo = mid;
    else hi = mid - 1;
  }
  int f = lo;
  while (count > 0) {
    const shard *s = &d->files[f];
    int64_t offset = start - s->first;
    int64_t n = s->n_tokens - offset;
    if (n > count) n = count;
    const unsigned char *p = s->map + HEADER_BYTES;
    if (s->token_bytes == 2) {
      for (int64_t i = 0; i < n; i++) {
        int64_t q = 2 * (offset + i);
        dst[i] = (int32_t)((uint32_t)p[q] | (uint32_t)p[q + 1] << 8);
      }
    } else {
      for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)load_u32(p + 4 * (offset + i));
    }
    dst += n;
    start += n;
    count -= n;
    f++;
  }
}

/* k >= 0: the trainer counts samples from 0 (step * global_batch + offset). */
static int64_t sample_start(const tsr_data *d, int64_t k) {
  int64_t epoch = k / d->n_samples;
  int64_t j = k % d->n_samples;
  if (d->shuffle) j = permute(j, d->n_samples, d->seed, epoch);
  return j * d->seq_len;
}

/* ---- mixtures ---- */

/* The set global sample i goes to, given the counts c at i (data.h). */
static int pick(const tsr_data *d, int64_t i, const int64_t *c) {
  const double n = (double)(i - d->origin + 1);
  int best = 0;
  double best_err = 0;
  for (int s = 0; s < d->n_sets; s++) {
    const double err = d->w[s] * n - (double)(c[s] - d->origin_counts[s]);
    if (s == 0 || err > best_err) best = s, best_err = err;
  }
  return best;
}

/* c: the counts at global sample k (from the remembered state when it is at or before k,
 * else from the origin). */
static void counts_from_state(const tsr_data *d, int64_t k, int64_t *c) {
  const int from_base = d->base <= k;
  int64_t i = from_base ? d->base : d->origin;
  memcpy(c, from_base ? d->base_counts : d->origin_counts, (size_t)d->n_sets * sizeof *c);
  for (; i < k; i++) c[pick(d, i, c)]++;
}

void tsr_data_mix_counts(const tsr_data *d, int64_t k, int64_t *counts) {
  counts_from_state(d, k, counts);
}

void tsr_data_mix_seek(tsr_data *d, int64_t k) {
  if (d->n_sets == 0 || k == d->base || k < d->origin) return;
  int64_t c[TSR_DATA_MAX_SETS];
  counts_from_state(d, k, c);
  memcpy(d->base_counts, c, (size_t)d->n_sets * sizeof *c);
  d->base = k;
}

/* Samples first .. first+count-1 of a mixture into tokens (seq_len + 1 each, `stride`
 * apart) or into inputs and targets. */
static void mix_read(const tsr_data *d, int64_t first, int64_t count, int32_t *tokens,
                     int32_t *inputs, int32_t *targets) {
  int64_t c[TSR_DATA_MAX_SETS];
  const int64_t L = d->seq_len;
  counts_from_state(d, first, c);
  for (int64_t i = 0; i < count; i++) {
    const int s = pick(d, first + i, c);
    const tsr_data *set = d->sets[s];
    const int64_t start = sample_start(set, c[s]++);
    if (tokens) {
      read_tokens(set, start, L + 1, tokens + i * (L + 1));
    } else {
      read_tokens(set, start, L, inputs + i * L);
      read_tokens(set, start + 1, L, targets + i * L);
    }
  }
}

uint64_t tsr_data_set_seed(uint64_t seed, const char *name) {
  uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a of the name */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * UINT64_C(0x100000001b3);
  return tsr_mix64(seed ^ tsr_mix64(h));
}

int tsr_data_mix(tsr_data **out, tsr_data **sets, const double *weights,
                 const char *const *names, int n) {
  *out = NULL;
  double sum = 0;
  for (int i = 0; i < n; i++) sum += weights[i] >= 0 ? weights[i] : -1e300;
  int rc = n >= 1 && n <= TSR_DATA_MAX_SETS && sum > 0 ? 0 : TSR_ERR_INPUT;
  if (rc) tsr_error("a mixture needs 1 to %d datasets with weights >= 0 of a positive sum",
                    TSR_DATA_MAX_SETS);
  for (int i = 1; i < n && !rc; i++)
    if (strcmp(sets[i]->tokenizer, sets[0]->tokenizer)) {
      tsr_error("dataset '%s' (%s ...) was made with tokenizer '%s' but dataset '%s' (%s ...) "
                "with '%s': the datasets of a mixture must share a tokenizer (tools/tsr-prepare "
                "--spm-model or --tokenizer-file of the first)", names[i], sets[i]->files[0].path,
                sets[i]->tokenizer, names[0], sets[0]->files[0].path, sets[0]->tokenizer);
      rc = TSR_ERR_INPUT;
    }
  tsr_data *d = rc ? NULL : tsr_calloc(1, sizeof *d);
  if (d) {
    d->sets = tsr_calloc((size_t)n, sizeof *d->sets);
    d->names = tsr_calloc((size_t)n, sizeof *d->names);
    d->w = tsr_calloc((size_t)n, sizeof *d->w);
    d->origin_counts = tsr_calloc((size_t)n, sizeof *d->origin_counts);
    d->base_counts = tsr_calloc((size_t)n, sizeof *d->base_counts);
  }
  if (!rc && (!d || !d->sets || !d->names || !d->w || !d->origin_counts || !d->base_counts))
    rc = TSR_ERR;
  if (rc) {
    tsr_data_destroy(&d);
    for (int i = 0; i < n; i++) tsr_data_destroy(&sets[i]);
    return rc;
  }
  d->n_sets = n;
  for (int i = 0; i < n; i++) {
    d->sets[i] = sets[i];
    sets[i] = NULL;
    d->w[i] = weights[i] / sum;
    d->names[i] = dup_string(names[i]);
    if (!d->names[i]) rc = TSR_ERR;
    d->n_files += d->sets[i]->n_files;
    d->n_tokens += d->sets[i]->n_tokens;
    d->n_samples += d->sets[i]->n_samples;
  }
  d->seq_len = d->sets[0]->seq_len;
  memcpy(d->tokenizer, d->sets[0]->tokenizer, sizeof d->tokenizer);
  if (rc) {
    tsr_data_destroy(&d);
    return rc;
  }
  *out = d;
  return 0;
}

int tsr_data_n_sets(const tsr_data *d) { return d->n_sets; }
const tsr_data *tsr_data_set(const tsr_data *d, int i) { return d->sets[i]; }
const char *tsr_data_set_name(const tsr_data *d, int i) { return d->names[i]; }
double tsr_data_set_weight(const tsr_data *d, int i) { return d->w[i]; }

void tsr_data_mix_state(const tsr_data *d, int64_t cursor, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
  if (d->n_sets == 0) return;
  int64_t c[TSR_DATA_MAX_SETS];
  counts_from_state(d, cursor, c);
  o += (size_t)snprintf(buf, len, "origin %" PRId64 "\n", d->origin);
  for (int s = 0; s < d->n_sets && o < len; s++)
    o += (size_t)snprintf(buf + o, len - o, "%s %.17g %" PRId64 " %" PRId64 "\n", d->names[s],
                          d->w[s], d->origin_counts[s], c[s]);
}

int tsr_data_mix_resume(tsr_data *d, int64_t cursor, const char *state, char *why,
                        size_t len) {
  why[0] = 0;
  if (d->n_sets == 0) return 0;
  /* the state's sets */
  char name[TSR_DATA_MAX_SETS][128];
  double w[TSR_DATA_MAX_SETS];
  int64_t oc[TSR_DATA_MAX_SETS], c[TSR_DATA_MAX_SETS], origin = 0, total = 0;
  int n = 0, consumed = 0;
  const char *p = state;
  if (state[0]) {
    if (sscanf(p, "origin %" SCNd64 "\n%n", &origin, &consumed) != 1) goto damaged;
    for (p += consumed; *p; p += consumed) {
      if (n == TSR_DATA_MAX_SETS ||
          sscanf(p, "%127s %lg %" SCNd64 " %" SCNd64 "\n%n", name[n], &w[n], &oc[n], &c[n],
                 &consumed) != 4 || c[n] < 0 || oc[n] < 0 || oc[n] > c[n])
        goto damaged;
      total += c[n++];
    }
    if (total != cursor || origin < 0 || origin > cursor) goto damaged;
  }
  int same = n == d->n_sets;
  for (int s = 0; s < n && same; s++) same = !strcmp(name[s], d->names[s]) && w[s] == d->w[s];
  if (same) {
    d->origin = origin;
    for (int s = 0; s < n; s++) d->origin_counts[s] = oc[s], d->base_counts[s] = c[s];
    d->base = cursor;
    return 0;
  }
  /* a new blend from here, each set where the checkpoint left its name */
  size_t o = 0;
  if (!state[0])
    o += (size_t)snprintf(why, len, "the checkpoint was written without a mixture");
  for (int s = 0; s < d->n_sets; s++) {
    int64_t at = 0;
    int found = -1;
    for (int t = 0; t < n; t++)
      if (!strcmp(name[t], d->names[s])) found = t;
    if (found >= 0) at = c[found];
    d->origin_counts[s] = d->base_counts[s] = at;
    if (o < len && state[0])
      o += (size_t)snprintf(why + o, len - o, "%s%s: weight %.4g%s%.4g, at sample %" PRId64,
                            o ? "; " : "", d->names[s], found >= 0 ? w[found] : 0.0,
                            " -> ", d->w[s], at);
  }
  for (int t = 0; t < n && o < len; t++) {
    int found = 0;
    for (int s = 0; s < d->n_sets; s++) found |= !strcmp(name[t], d->names[s]);
    if (!found)
      o += (size_t)snprintf(why + o, len - o, "; %s (%" PRId64 " samples) is no longer in it",
                            name[t], c[t]);
  }
  d->origin = d->base = cursor;
  return 1;
damaged:
  tsr_error("the checkpoint's mixture state (root attribute 'data_mix') is damaged: '%.200s'; "
            "resume from another checkpoint", state);
  return TSR_ERR_INPUT;
}

void tsr_data_sample(const tsr_data *d, int64_t k, int32_t *tokens) {
  if (d->n_sets) {
    mix_read(d, k, 1, tokens, NULL, NULL);
    return;
  }
  read_tokens(d, sample_start(d, k), d->seq_len + 1, tokens);
}

void tsr_data_batch(const tsr_data *d, int64_t first, int64_t count, int32_t *inputs,
                    int32_t *targets) {
  if (d->n_sets) {
    mix_read(d, first, count, NULL, inputs, targets);
    return;
  }
  int64_t L = d->seq_len;
  for (int64_t i = 0; i < count; i++) {
    int64_t start = sample_start(d, first + i);
    read_tokens(d, start, L, inputs + i * L);
    read_tokens(d, start + 1, L, targets + i * L);
  }
}
