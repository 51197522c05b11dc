/* test_data.c — token shards: the sample rule against a concatenated reference stream,
 * the shuffle permutation, batches, u16/u32 shards and every malformed-file error.
 * Writes its own shards into a mkdtemp directory and removes it.  Exit 0 pass, 1 fail. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"
#include "core/util.h"

static int g_failed = 0, g_passed = 0;
static char g_dir[256];

static void report(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s: ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (ok) g_passed++;
  else g_failed++;
}

static uint64_t g_rng = 0x1234567887654321ULL;
static uint32_t rand_below(uint32_t n) {
  g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)((g_rng >> 33) % n);
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Write a shard by hand (independently of any writer in the code under test).
 * n_header goes into the header; n_write tokens are written; extra bytes follow. */
static void write_shard_raw(const char *name, const char *magic, uint32_t token_bytes,
                            uint32_t vocab, uint64_t n_header, const uint32_t *tokens,
                            uint64_t n_write, const char *tokenizer, int extra) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  unsigned char h[256];
  memset(h, 0, sizeof h);
  memcpy(h, magic, 8);
  put_u32(h + 8, token_bytes);
  put_u32(h + 12, vocab);
  put_u32(h + 16, (uint32_t)n_header);
  put_u32(h + 20, (uint32_t)(n_header >> 32));
  snprintf((char *)h + 24, 232, "%s", tokenizer);
  fwrite(h, 1, sizeof h, f);
  uint32_t width = token_bytes == 4 ? 4 : 2;
  for (uint64_t i = 0; i < n_write; i++) {
    unsigned char b[4];
    put_u32(b, tokens[i]);
    fwrite(b, 1, width, f);
  }
  for (int i = 0; i < extra; i++) fputc(0xab, f);
  fclose(f);
}

static void write_shard(const char *name, uint32_t token_bytes, uint32_t vocab,
                        const uint32_t *tokens, uint64_t n) {
  write_shard_raw(name, "TSRTOK01", token_bytes, vocab, n, tokens, n, "bytes", 0);
}

static void path_of(char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", g_dir, name);
}

/* Open with stderr redirected into a file; returns rc and the captured text. */
static int open_capture(tsr_data **d, const char *pattern, int64_t seq_len, int64_t vocab,
                        int shuffle, uint64_t seed, char *msg, size_t msg_size) {
  char cap[512];
  snprintf(cap, sizeof cap, "%s/stderr.txt", g_dir);
  fflush(stderr);
  int saved = dup(2);
  int fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  dup2(fd, 2);
  close(fd);
  int rc = tsr_data_open(d, pattern, seq_len, vocab, shuffle, seed);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  FILE *f = fopen(cap, "r");
  size_t n = f ? fread(msg, 1, msg_size - 1, f) : 0;
  msg[n] = 0;
  if (f) fclose(f);
  unlink(cap);
  return rc;
}

/* ---- sample rule: stream exactness across shards, empty shard, epoch wrap ---- */
static void test_sample_rule(void) {
  const int sizes[4] = {37, 0, 50, 29}; /* an empty shard must be skipped transparently */
  const char *names[4] = {"s_a.bin", "s_b.bin", "s_c.bin", "s_d.bin"};
  uint32_t ref[116];
  int total = 0;
  for (int f = 0; f < 4; f++) {
    for (int i = 0; i < sizes[f]; i++) ref[total + i] = rand_below(1000);
    write_shard(names[f], 2, 1000, ref + total, (uint64_t)sizes[f]);
    total += sizes[f];
  }
  char pattern[512];
  path_of(pattern, sizeof pattern, "s_*.bin");
  tsr_data *d = NULL;
  int rc = tsr_data_open(&d, pattern, 8, 1024, 0, 0);
  report(rc == 0 && d, "open a 4-shard glob (u16, one empty shard)");
  if (!d) return;
  const int64_t L = 8, n = (total - 1) / 8;
  report(tsr_data_n_files(d) == 4 && tsr_data_n_tokens(d) == total &&
             tsr_data_n_samples(d) == n && strcmp(tsr_data_tokenizer(d), "bytes") == 0,
         "counts: files %d tokens %" PRId64 " samples %" PRId64 " (want 4, %d, %" PRId64 ")",
         tsr_data_n_files(d), tsr_data_n_tokens(d), tsr_data_n_samples(d), total, n);

  int32_t got[9];
  int bad = 0, spanning = 0;
  for (int64_t k = 0; k < 3 * n; k++) {
    tsr_data_sample(d, k, got);
    int64_t start = (k % n) * L;
    for (int t = 0; t <= L; t++)
      if ((uint32_t)got[t] != ref[start + t]) bad++;
    /* boundaries at stream index 37 and 87 */
    if ((start < 37 && start + L >= 37) || (start < 87 && start + L >= 87)) spanning++;
  }
  report(bad == 0, "sample k == stream[(k mod n)*L .. +L] for k < 3n, incl. epoch wrap "
         "(%d mismatches)", bad);
  report(spanning >= 2 * 3, "samples spanning shard boundaries were among those checked (%d)",
         spanning / 3);
  tsr_data_sample(d, 4, got); /* tokens 32..40 cross from s_a into s_c */
  int ok = 1;
  for (int t = 0; t <= L; t++) ok &= (uint32_t)got[t] == ref[32 + t];
  report(ok, "sample 4 = tokens [32, 40], crossing the s_a/s_c boundary at 37");
  tsr_data_sample(d, 2 * n + 5, got);
  ok = 1;
  for (int t = 0; t <= L; t++) ok &= (uint32_t)got[t] == ref[5 * L + t];
  report(ok, "sample 2n+5 (epoch 2) equals sample 5");

  /* batch: inputs are the first L tokens, targets the last L */
  int32_t in[6 * 8], tg[6 * 8];
  tsr_data_batch(d, n - 2, 6, in, tg);
  bad = 0;
  for (int i = 0; i < 6; i++) {
    int64_t start = ((n - 2 + i) % n) * L;
    for (int t = 0; t < L; t++) {
      if ((uint32_t)in[i * L + t] != ref[start + t]) bad++;
      if ((uint32_t)tg[i * L + t] != ref[start + t + 1]) bad++;
      if (t + 1 < L && tg[i * L + t] != in[i * L + t + 1]) bad++;
    }
  }
  report(bad == 0, "tsr_data_batch: targets = inputs shifted by one, across an epoch wrap "
         "(%d mismatches)", bad);
  tsr_data_destroy(&d);
  report(d == NULL, "destroy NULLs the handle");
}

/* ---- u32 shards, and a glob mixing u16 and u32 ---- */
static void test_u32(void) {
  uint32_t a[40], b[33];
  for (int i = 0; i < 40; i++) a[i] = 65536 + rand_below(100000 - 65536);
  a[7] = 99999;
  a[8] = 0;
  for (int i = 0; i < 33; i++) b[i] = rand_below(60000);
  write_shard("w_0.bin", 4, 100000, a, 40);
  write_shard("w_1.bin", 2, 60000, b, 33);
  char path[512];
  path_of(path, sizeof path, "w_0.bin");
  tsr_data *d = NULL;
  int rc = tsr_data_open(&d, path, 5, 100000, 0, 0);
  int bad = 0;
  int32_t got[6];
  if (rc == 0) {
    for (int64_t k = 0; k < tsr_data_n_samples(d); k++) {
      tsr_data_sample(d, k, got);
      for (int t = 0; t <= 5; t++) bad += (uint32_t)got[t] != a[k * 5 + t];
    }
  }
  report(rc == 0 && bad == 0, "u32 shard with ids above 65535 reads back exactly");
  tsr_data_destroy(&d);

  path_of(path, sizeof path, "w_*.bin");
  rc = tsr_data_open(&d, path, 5, 100000, 0, 0);
  bad = 0;
  if (rc == 0) {
    uint32_t ref[73];
    memcpy(ref, a, sizeof a);
    memcpy(ref + 40, b, sizeof b);
    for (int64_t k = 0; k < tsr_data_n_samples(d); k++) {
      tsr_data_sample(d, k, got);
      for (int t = 0; t <= 5; t++) bad += (uint32_t)got[t] != ref[k * 5 + t];
    }
  }
  report(rc == 0 && bad == 0 && d && tsr_data_n_samples(d) == 14,
         "mixed u32 + u16 glob: samples cross from a u32 into a u16 shard");
  tsr_data_destroy(&d);
}

/* ---- shuffle: permutation, per-epoch and per-seed, deterministic ---- */
/* Stream token p = p / 2 with seq_len 2, so a sample's first token is its stored index
 * and the whole sample is {m, m, m + 1}. */
static int read_perm(tsr_data *d, int64_t n, int64_t epoch, int64_t *perm) {
  int32_t got[3];
  int bad = 0;
  for (int64_t j = 0; j < n; j++) {
    tsr_data_sample(d, epoch * n + j, got);
    perm[j] = got[0];
    bad += got[1] != got[0] || got[2] != got[0] + 1;
  }
  return bad;
}

static int is_permutation(const int64_t *perm, int64_t n) {
  char *seen = calloc((size_t)n, 1);
  int ok = 1;
  for (int64_t j = 0; j < n && ok; j++) {
    if (perm[j] < 0 || perm[j] >= n || seen[perm[j]]) ok = 0;
    else seen[perm[j]] = 1;
  }
  free(seen);
  return ok;
}

static void test_shuffle(void) {
  const int64_t ns[] = {1, 2, 3, 7, 64, 97, 1000, 1024, 1031, 4099};
  for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
    int64_t n = ns[c];
    uint32_t *tok = malloc((size_t)(2 * n + 1) * sizeof *tok);
    for (int64_t p = 0; p <= 2 * n; p++) tok[p] = (uint32_t)(p / 2);
    char name[64], path[512];
    snprintf(name, sizeof name, "perm_%" PRId64 ".bin", n);
    write_shard(name, 2, (uint32_t)n + 1, tok, (uint64_t)(2 * n + 1));
    free(tok);
    path_of(path, sizeof path, name);
    tsr_data *d = NULL, *d2 = NULL, *d3 = NULL, *plain = NULL;
    int rc = tsr_data_open(&d, path, 2, n + 1, 1, 42);
    rc |= tsr_data_open(&d2, path, 2, n + 1, 1, 42);
    rc |= tsr_data_open(&d3, path, 2, n + 1, 1, 43);
    rc |= tsr_data_open(&plain, path, 2, n + 1, 0, 42);
    if (rc != 0 || tsr_data_n_samples(d) != n) {
      report(0, "shuffle n=%" PRId64 ": open", n);
      continue;
    }
    int64_t *e0 = malloc((size_t)n * sizeof *e0), *e1 = malloc((size_t)n * sizeof *e1);
    int64_t *again = malloc((size_t)n * sizeof *again), *other = malloc((size_t)n * sizeof *other);
    int64_t *ident = malloc((size_t)n * sizeof *ident);
    int bad = read_perm(d, n, 0, e0) + read_perm(d, n, 1, e1) + read_perm(d2, n, 0, again) +
              read_perm(d3, n, 0, other) + read_perm(plain, n, 0, ident);
    int perm_ok = is_permutation(e0, n) && is_permutation(e1, n) && is_permutation(other, n);
    /* a later epoch far out, e.g. at step 10^6 of a long run */
    int64_t *far = malloc((size_t)n * sizeof *far);
    bad += read_perm(d, n, 1000003, far);
    perm_ok &= is_permutation(far, n);
    int same_det = memcmp(e0, again, (size_t)n * sizeof *e0) == 0;
    int diff_epoch = memcmp(e0, e1, (size_t)n * sizeof *e0) != 0;
    int diff_seed = memcmp(e0, other, (size_t)n * sizeof *e0) != 0;
    int identity_plain = 1, fixed = 0;
    for (int64_t j = 0; j < n; j++) {
      identity_plain &= ident[j] == j;
      fixed += e0[j] == j;
    }
    int ok = bad == 0 && perm_ok && same_det && identity_plain;
    if (n >= 7) ok &= diff_epoch && diff_seed && fixed < n / 2 + 1;
    report(ok, "shuffle n=%" PRId64 ": permutation of [0,n) in epochs 0, 1, 1000003%s; "
           "deterministic; %s (fixed points %d)", n,
           n >= 7 ? ", differs across epochs and seeds" : "",
           identity_plain ? "unshuffled = identity" : "unshuffled NOT identity", fixed);
    free(e0), free(e1), free(again), free(other), free(ident), free(far);
    tsr_data_destroy(&d);
    tsr_data_destroy(&d2);
    tsr_data_destroy(&d3);
    tsr_data_destroy(&plain);
  }
}

/* ---- malformed inputs: TSR_ERR_INPUT, NULL handle, the file named, no leak ---- */
static void expect_error(const char *what, const char *pattern, int64_t seq_len, int64_t vocab,
                         const char *must1, const char *must2) {
  size_t mem0 = tsr_mem_bytes();
  tsr_data *d = (tsr_data *)&g_rng; /* must be reset to NULL */
  char msg[4096];
  int rc = open_capture(&d, pattern, seq_len, vocab, 0, 0, msg, sizeof msg);
  int ok = rc == TSR_ERR_INPUT && d == NULL && strstr(msg, must1) != NULL &&
           (!must2 || strstr(msg, must2) != NULL) && tsr_mem_bytes() == mem0;
  char *nl = strchr(msg, '\n');
  if (nl) *nl = 0;
  report(ok, "%s -> rc %d: %s", what, rc, msg);
}

static void test_errors(void) {
  uint32_t tok[100];
  for (int i = 0; i < 100; i++) tok[i] = rand_below(2048);
  char path[512], pattern[512];

  write_shard_raw("bad_magic.bin", "GPT2TOK!", 2, 2048, 100, tok, 100, "bytes", 0);
  path_of(path, sizeof path, "bad_magic.bin");
  expect_error("wrong magic", path, 8, 2048, path, "magic");

  write_shard_raw("bad_version.bin", "TSRTOK02", 2, 2048, 100, tok, 100, "bytes", 0);
  path_of(path, sizeof path, "bad_version.bin");
  expect_error("newer format version", path, 8, 2048, path, "version");

  write_shard_raw("bad_width.bin", "TSRTOK01", 3, 2048, 100, tok, 100, "bytes", 0);
  path_of(path, sizeof path, "bad_width.bin");
  expect_error("token_bytes 3", path, 8, 2048, path, "token_bytes");

  write_shard_raw("truncated.bin", "TSRTOK01", 2, 2048, 100, tok, 60, "bytes", 0);
  path_of(path, sizeof path, "truncated.bin");
  expect_error("truncated (100 tokens promised, 60 present)", path, 8, 2048, path,
               "expected 456 bytes, found 376");

  write_shard_raw("header_only.bin", "TSRTOK01", 2, 2048, 0, tok, 0, "bytes", 0);
  path_of(path, sizeof path, "header_only.bin");
  expect_error("header only, 0 tokens", path, 8, 2048, path, "has 0 tokens");
  FILE *f;
  path_of(path, sizeof path, "stub.bin");
  f = fopen(path, "wb");
  fwrite("TSRTOK01", 1, 8, f);
  fclose(f);
  expect_error("file shorter than the header", path, 8, 2048, path, "truncated");

  write_shard_raw("trailing.bin", "TSRTOK01", 2, 2048, 100, tok, 100, "bytes", 3);
  path_of(path, sizeof path, "trailing.bin");
  expect_error("bytes after the last token", path, 8, 2048, path, "after the last token");

  tok[37] = 3000;
  write_shard("bad_id16.bin", 2, 2048, tok, 100);
  path_of(path, sizeof path, "bad_id16.bin");
  expect_error("u16 token id >= vocab", path, 8, 2048, path,
               "token id 3000 >= vocab_size 2048 at byte offset 330");
  tok[37] = 5;
  tok[5] = 70000;
  write_shard("bad_id32.bin", 4, 2048, tok, 100);
  path_of(path, sizeof path, "bad_id32.bin");
  expect_error("u32 token id >= vocab", path, 8, 2048, path,
               "token id 70000 >= vocab_size 2048 at byte offset 276");
  tok[5] = 5;

  write_shard("short.bin", 2, 2048, tok, 8);
  path_of(path, sizeof path, "short.bin");
  expect_error("8 tokens, one sample needs seq_len+1 = 9", path, 8, 2048, path, "8 tokens");
  write_shard("short.bin", 2, 2048, tok, 9);
  tsr_data *d = NULL;
  int rc = tsr_data_open(&d, path, 8, 2048, 1, 3);
  int32_t got[9];
  int ok = rc == 0 && tsr_data_n_samples(d) == 1;
  if (ok) {
    tsr_data_sample(d, 5, got);
    for (int t = 0; t < 9; t++) ok &= (uint32_t)got[t] == tok[t];
  }
  report(ok, "exactly seq_len+1 tokens gives one sample, repeated every epoch");
  tsr_data_destroy(&d);

  write_shard("big_vocab.bin", 2, 4096, tok, 100);
  path_of(path, sizeof path, "big_vocab.bin");
  expect_error("header vocab 4096 > model vocab 2048", path, 8, 2048, path, "4096");

  path_of(pattern, sizeof pattern, "nothing_here_*.bin");
  expect_error("glob matching nothing", pattern, 8, 2048, pattern, "no files match");

  path_of(path, sizeof path, "missing.bin");
  expect_error("missing file", path, 8, 2048, path, "cannot open");

  expect_error("a directory", g_dir, 8, 2048, g_dir, "not a regular file");

  write_shard_raw("mix_0.bin", "TSRTOK01", 2, 2048, 100, tok, 100, "bytes", 0);
  write_shard_raw("mix_1.bin", "TSRTOK01", 2, 2048, 100, tok, 100, "spm:other", 0);
  path_of(pattern, sizeof pattern, "mix_*.bin");
  path_of(path, sizeof path, "mix_1.bin");
  expect_error("shards with different tokenizers", pattern, 8, 2048, path, "spm:other");

  /* a bad shard later in a glob is reported by its own name */
  write_shard("late_0.bin", 2, 2048, tok, 100);
  write_shard_raw("late_1.bin", "TSRTOK01", 2, 2048, 100, tok, 99, "bytes", 0);
  path_of(pattern, sizeof pattern, "late_*.bin");
  path_of(path, sizeof path, "late_1.bin");
  expect_error("second shard of a glob truncated", pattern, 8, 2048, path, "truncated");
}

/* ---- mixtures: the blend's prefix counts, random access, its state and a resume ---- */

/* Three sets of 10 samples of 4 tokens each; set s's tokens are s*100 + their position, so a
 * sample's first token names its set and its place in it. */
static int open_mix(tsr_data **mix, const double *w, const char *tokenizer_of_2) {
  const char *const names[3] = {"web", "code", "books"};
  tsr_data *sets[3] = {0};
  int rc = 0;
  for (int s = 0; s < 3 && !rc; s++) {
    uint32_t tok[41];
    for (int i = 0; i < 41; i++) tok[i] = (uint32_t)(s * 100 + i);
    char name[32], path[512];
    snprintf(name, sizeof name, "mix_%d.bin", s);
    write_shard_raw(name, "TSRTOK01", 2, 1000, 41, tok, 41,
                    s == 2 && tokenizer_of_2 ? tokenizer_of_2 : "bytes", 0);
    path_of(path, sizeof path, name);
    rc = tsr_data_open(&sets[s], path, 4, 1000, 0, 1);
  }
  if (rc) {
    for (int s = 0; s < 3; s++) tsr_data_destroy(&sets[s]);
    return rc;
  }
  return tsr_data_mix(mix, sets, w, names, 3);
}

static void sample_of(const tsr_data *d, int64_t k, int *set, int *j) {
  int32_t t[5];
  tsr_data_sample(d, k, t);
  *set = t[0] / 100;
  *j = (t[0] % 100) / 4;
}

static void test_mixture(void) {
  const double w[3] = {5, 3, 2}, share[3] = {0.5, 0.3, 0.2};
  tsr_data *d = NULL;
  report(open_mix(&d, w, NULL) == 0 && tsr_data_n_sets(d) == 3 &&
             tsr_data_set_weight(d, 1) == 0.3 && !strcmp(tsr_data_set_name(d, 2), "books"),
         "a mixture of three sets opens, weights normalised (5 : 3 : 2)");
  if (!d) return;
  enum { N = 600 };
  static int set[N], j[N];
  int64_t c[3] = {0, 0, 0};
  int prefix_ok = 1, order_ok = 1;
  for (int64_t k = 0; k < N; k++) {
    if (k % 8 == 0) tsr_data_mix_seek(d, k); /* as the trainer does each step */
    sample_of(d, k, &set[k], &j[k]);
    order_ok &= j[k] == (int)(c[set[k]] % 10); /* each set in its own order, wrapping */
    c[set[k]]++;
    for (int s = 0; s < 3; s++) prefix_ok &= fabs((double)c[s] - share[s] * (double)(k + 1)) <= 1.0;
  }
  report(prefix_ok, "every prefix of %d samples holds each set within one sample of its share "
         "(%lld, %lld, %lld)", N, (long long)c[0], (long long)c[1], (long long)c[2]);
  report(order_ok, "each set's samples come in its own order and wrap into its epochs");
  int same = 1;
  for (int64_t k = N - 1; k >= 0; k -= 37) { /* backwards: replayed from the origin */
    int a, b;
    sample_of(d, k, &a, &b);
    same &= a == set[k] && b == j[k];
  }
  int64_t at[3];
  tsr_data_mix_counts(d, 300, at);
  report(same && at[0] + at[1] + at[2] == 300, "any sample again, in any order; counts at 300 "
         "sum to 300");

  /* the state at 300, resumed by another object of the same mixture: the same samples */
  char state[512], why[512];
  tsr_data_mix_state(d, 300, state, sizeof state);
  tsr_data *e = NULL;
  open_mix(&e, w, NULL);
  int rc = e ? tsr_data_mix_resume(e, 300, state, why, sizeof why) : -9;
  same = rc == 0;
  for (int64_t k = 300; k < N && same; k++) {
    int a, b;
    sample_of(e, k, &a, &b);
    same = a == set[k] && b == j[k];
  }
  report(same, "resumed from its state at sample 300, the same samples follow (state '%s')",
         state);
  tsr_data_destroy(&e);

  /* other weights: a new blend at 300, each set going on from its count there */
  const double w2[3] = {1, 1, 1};
  open_mix(&e, w2, NULL);
  rc = e ? tsr_data_mix_resume(e, 300, state, why, sizeof why) : -9;
  int64_t c2[3] = {at[0], at[1], at[2]};
  int ok = rc == 1 && strstr(why, "web: weight 0.5 -> 0.3333, at sample") != NULL;
  for (int64_t k = 300; k < 330 && ok; k++) {
    int a, b;
    sample_of(e, k, &a, &b);
    ok = b == (int)(c2[a] % 10);
    c2[a]++;
  }
  report(ok && c2[0] - at[0] == 10 && c2[1] - at[1] == 10 && c2[2] - at[2] == 10,
         "another mixture's state: a new blend from 300, each set where it was (%s)", why);
  tsr_data_destroy(&e);

  open_mix(&e, w, NULL);
  rc = e ? tsr_data_mix_resume(e, 40, "", why, sizeof why) : -9;
  int a = -1, b = -1;
  if (e) sample_of(e, 40, &a, &b);
  report(rc == 1 && a == 0 && b == 0, "a state of no mixture: each set from its first sample");
  rc = e ? tsr_data_mix_resume(e, 300, "origin 0\nweb 0.5 0 10\n", why, sizeof why) : -9;
  report(rc == TSR_ERR_INPUT, "a damaged state (counts that do not add up to the cursor) is "
         "refused");
  tsr_data_destroy(&e);
  tsr_data_destroy(&d);

  rc = open_mix(&d, w, "spm:other");
  report(rc == TSR_ERR_INPUT && d == NULL, "sets of different tokenizers are refused");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a crash still shows the cases that ran */
  snprintf(g_dir, sizeof g_dir, "%s/tsr_test_data_XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_sample_rule();
  test_u32();
  test_shuffle();
  test_errors();
  test_mixture();
  report(tsr_mem_bytes() == 0, "all tsr_calloc memory released (%zu bytes live)",
         tsr_mem_bytes());

  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
  printf("test_data: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed ? 1 : 0;
}
