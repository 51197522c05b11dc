/* test_ckpt.c — checkpoint save / resolve / load (MPI test: declares 1 rank; also runs the
 * whole-buffer round trip alone under more ranks, where tensor k is written by rank
 * k mod size and every rank reads; tests/mpi/test_sharding.c covers sharded layouts).
 *
 * The file is checked with the plain HDF5 API against docs/model.md's names and shapes
 * and against a checksum computed here from docs/formats.md "Checksums"; damage is done with
 * truncate(2) and byte flips at H5Dget_offset; stderr is captured to check that warnings
 * and errors name the file and the dataset.  Exit 0 pass, 1 fail. */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "model/layout.h"
#include "core/util.h"

static int g_checks = 0, g_failed = 0;

static void check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  g_checks++;
  if (!ok) g_failed++;
}

/* ---- stderr capture ---- */
static char g_capfile[512];
static int g_saved_fd = -1;
static char g_cap[1 << 16];

static void cap_begin(void) {
  fflush(stderr);
  g_saved_fd = dup(2);
  int fd = open(g_capfile, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  dup2(fd, 2);
  close(fd);
}

static const char *cap_end(void) {
  fflush(stderr);
  dup2(g_saved_fd, 2);
  close(g_saved_fd);
  FILE *f = fopen(g_capfile, "r");
  size_t n = f ? fread(g_cap, 1, sizeof g_cap - 1, f) : 0;
  if (f) fclose(f);
  g_cap[n] = '\0';
  for (char *line = g_cap, *nl; *line; line = nl + 1) { /* show what was said */
    nl = strchr(line, '\n');
    printf("    | %.*s\n", nl ? (int)(nl - line) : (int)strlen(line), line);
    if (!nl) break;
  }
  return g_cap;
}

/* ---- fixtures ---- */
static void make_cfg(tsr_config *cfg, const char *arch, int64_t d_model) {
  memset(cfg, 0, sizeof *cfg);
  cfg->model.arch = strcmp(arch, "gpt2") == 0 ? TSR_ARCH_GPT2 : TSR_ARCH_LLAMA;
  cfg->model.n_layer = 2;
  cfg->model.d_model = d_model;
  cfg->model.n_head = 4;
  cfg->model.n_kv_head = strcmp(arch, "gpt2") == 0 ? 4 : 2;
  cfg->model.d_ff = 24;
  cfg->model.vocab_size = 50;
  cfg->model.seq_len = 8;
  cfg->model.tie_embeddings = strcmp(arch, "gpt2") == 0;
  cfg->model.init_std = 0.02;
  cfg->model.norm_eps = 1e-5;
  cfg->parallel.tp = cfg->parallel.pp = 1;
  cfg->checkpoint.keep = 2;
  snprintf(cfg->checkpoint.resume, sizeof cfg->checkpoint.resume, "auto");
}

typedef struct {
  float *master, *m, *v;
  tsr_train_state st;
} bufs;

static void fill(float *x, int64_t n, uint64_t key) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(4.0 * tsr_rand_uniform(key, (uint64_t)i) - 2.0);
}

/* The state of "step" s: different values for every s, so a load shows which file it read. */
static void make_bufs(bufs *b, const tsr_layout *lay, int64_t s) {
  memset(&b->st, 0, sizeof b->st);
  b->master = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  b->m = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  b->v = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  fill(b->master, lay->n_params, 1000 + (uint64_t)s);
  fill(b->m, lay->n_params, 2000 + (uint64_t)s);
  fill(b->v, lay->n_params, 3000 + (uint64_t)s);
  b->st.step = s;
  b->st.tokens = s * 4096 + 7;
  b->st.data_cursor = s * 32 + 1;
  b->st.skipped = s % 5 + 1;
  b->st.loss_scale = 32768.0 + 0.25 * (double)s;
  b->st.seed = 0xF00DCAFEDEADBEEFULL + (uint64_t)s; /* above INT64_MAX: unsigned round trip */
}

static void free_bufs(bufs *b) {
  tsr_free(&b->master);
  tsr_free(&b->m);
  tsr_free(&b->v);
}

static int same_state(const tsr_train_state *a, const tsr_train_state *b) {
  return a->step == b->step && a->tokens == b->tokens && a->data_cursor == b->data_cursor &&
         a->skipped == b->skipped && a->loss_scale == b->loss_scale && a->seed == b->seed;
}

/* Load `path` into fresh buffers and compare bitwise with `want`. */
static int loads_as(const char *path, const tsr_layout *lay, const bufs *want, const char *what) {
  bufs got = {0};
  got.master = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  got.m = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  got.v = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  int rc = tsr_ckpt_load(path, lay, got.master, got.m, got.v, &got.st, MPI_COMM_WORLD);
  size_t bytes = (size_t)lay->n_params * sizeof(float);
  int ok = rc == 0 && memcmp(got.master, want->master, bytes) == 0 &&
           memcmp(got.m, want->m, bytes) == 0 && memcmp(got.v, want->v, bytes) == 0 &&
           same_state(&got.st, &want->st);
  check(ok, "%s: load rc=%d, params/m/v bitwise and every train-state field equal", what, rc);
  free_bufs(&got);
  return ok;
}

/* docs/formats.md "Checksums", written out again here as the reference. */
static uint64_t ref_checksum(const float *x, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], 4);
    s += tsr_mix64((uint64_t)i * 0x9E3779B97F4A7C15ULL ^ bits);
  }
  return s;
}

/* Plain HDF5: dataset `name` has shape `want` (ndim 1 or 2) and holds `x` bitwise. */
static void check_dataset(hid_t file, const char *name, int ndim, hsize_t r, hsize_t c,
                          const float *x) {
  hsize_t dims[2] = {0, 0};
  int got_ndim = -1, same = 0, sum_ok = 0, f32 = 0;
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  if (d >= 0) {
    /* stored as little-endian IEEE binary32, whatever the reader converts to */
    hid_t ty = H5Dget_type(d);
    f32 = ty >= 0 && H5Tequal(ty, H5T_IEEE_F32LE) > 0;
    if (ty >= 0) H5Tclose(ty);
    hid_t s = H5Dget_space(d);
    got_ndim = H5Sget_simple_extent_ndims(s);
    H5Sget_simple_extent_dims(s, dims, NULL);
    H5Sclose(s);
    if (x && got_ndim == ndim) {
      int64_t n = (int64_t)(r * (ndim == 2 ? c : 1));
      float *buf = calloc((size_t)n, sizeof *buf);
      uint64_t stored = 0;
      hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
      if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0)
        same = memcmp(buf, x, (size_t)n * sizeof *buf) == 0;
      if (a >= 0 && H5Aread(a, H5T_NATIVE_UINT64, &stored) >= 0)
        sum_ok = stored == ref_checksum(x, n);
      if (a >= 0) H5Aclose(a);
      free(buf);
    }
    H5Dclose(d);
  }
  int shape_ok = f32 && got_ndim == ndim && dims[0] == r && (ndim == 1 || dims[1] == c);
  if (x)
    check(shape_ok && same && sum_ok,
          "%s: fp32 LE, shape %s, data bitwise, checksum = reference formula",
          name, ndim == 1 ? "[n]" : "[r, c]");
  else if (ndim == 1)
    check(shape_ok, "%s is fp32 LE of shape [%llu]", name, (unsigned long long)r);
  else
    check(shape_ok, "%s is fp32 LE of shape [%llu, %llu]", name, (unsigned long long)r,
          (unsigned long long)c);
}

static const float *tensor_data(const tsr_layout *lay, const float *flat, const char *name) {
  const tsr_tensor *t = tsr_layout_find(lay, name);
  return t ? flat + t->offset : NULL;
}

static int exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

static int file_is(const char *path, const char *text) {
  char buf[256] = "";
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = '\0';
  return strcmp(buf, text) == 0;
}

static int ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && strcmp(s + a - b, tail) == 0;
}

static int count_step_files(const char *dir) {
  int n = 0;
  char path[1200];
  for (int s = 0; s <= 100; s++) {
    snprintf(path, sizeof path, "%s/step_%08d.h5", dir, s);
    n += exists(path);
  }
  return n;
}

static const char *kDeck = "&run\n  name = 'ckpt-test'\n/\n&model\n  arch = 'x'\n/\n";

/* ---- gpt2: names, shapes, tied head, biases, attributes, step 0 without m and v ---- */
static void test_gpt2(const char *root) {
  tsr_config cfg;
  tsr_layout *lay = NULL;
  make_cfg(&cfg, "gpt2", 16);
  snprintf(cfg.checkpoint.dir, sizeof cfg.checkpoint.dir, "%s/gpt2", root);
  tsr_layout_create(&lay, &cfg.model);
  bufs b;
  make_bufs(&b, lay, 7);
  /* the tokenizer's files ride along, byte for byte (a NUL and a high byte included) */
  tsr_tokenizer_file tok[2] = {{"tokenizer.json", (unsigned char *)"{\"model\": \0\xff}", 13},
                               {"tokenizer_config.json", (unsigned char *)"{}", 2}};
  snprintf(b.st.tokenizer, sizeof b.st.tokenizer, "hf:tokenizer.json");
  b.st.tokenizer_files = tok;
  b.st.n_tokenizer_files = 2;
  int rc = tsr_ckpt_save(&cfg, lay, b.master, b.m, b.v, &b.st, kDeck, MPI_COMM_WORLD);
  check(rc == 0, "gpt2: save step 7 rc=%d", rc);
  char path[1200];
  snprintf(path, sizeof path, "%s/gpt2/step_00000007.h5", root);
  loads_as(path, lay, &b, "gpt2 round trip");
  char tname[232];
  tsr_tokenizer_file *got = NULL;
  int ngot = 0;
  rc = tsr_ckpt_read_tokenizer(path, tname, &got, &ngot);
  check(rc == 0 && !strcmp(tname, "hf:tokenizer.json") && ngot == 2,
        "gpt2: the tokenizer and its 2 files read back (rc=%d, '%s', %d files)", rc, tname, ngot);
  for (int i = 0; i < ngot && ngot == 2; i++) {
    const tsr_tokenizer_file *want = !strcmp(got[i].name, tok[0].name) ? &tok[0] : &tok[1];
    check(!strcmp(got[i].name, want->name) && got[i].len == want->len &&
              !memcmp(got[i].bytes, want->bytes, want->len),
          "gpt2: /tokenizer/%s holds the file's %zu bytes", want->name, want->len);
  }
  tsr_tokenizer_files_free(&got, ngot);

  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  check(f >= 0, "gpt2: file opens with the plain (serial) HDF5 API");
  if (f >= 0) {
    check_dataset(f, "/model/embed.weight", 2, 50, 16, tensor_data(lay, b.master, "embed.weight"));
    check_dataset(f, "/model/pos_embed.weight", 2, 8, 16, NULL);
    check_dataset(f, "/model/layers.000.attn.wq.bias", 1, 16, 0,
                  tensor_data(lay, b.master, "layers.000.attn.wq.bias"));
    check_dataset(f, "/model/layers.001.mlp.w_down.bias", 1, 16, 0, NULL);
    check_dataset(f, "/model/layers.001.mlp.w_up.weight", 2, 24, 16, NULL);
    check_dataset(f, "/model/layers.000.attn_norm.bias", 1, 16, 0, NULL);
    check_dataset(f, "/optim/m/layers.001.attn.wo.weight", 2, 16, 16,
                  tensor_data(lay, b.m, "layers.001.attn.wo.weight"));
    check_dataset(f, "/optim/v/final_norm.bias", 1, 16, 0,
                  tensor_data(lay, b.v, "final_norm.bias"));
    check(H5Lexists(f, "/model/lm_head.weight", H5P_DEFAULT) == 0 &&
              H5Lexists(f, "/optim/m/lm_head.weight", H5P_DEFAULT) == 0,
          "gpt2: /model/lm_head.weight absent (tied head)");
    int64_t version = 0, complete = 0, step = 0;
    char deck[256] = "", arch[32] = "";
    hid_t a;
    if ((a = H5Aopen(f, "format_version", H5P_DEFAULT)) >= 0)
      H5Aread(a, H5T_NATIVE_INT64, &version), H5Aclose(a);
    if ((a = H5Aopen(f, "complete", H5P_DEFAULT)) >= 0)
      H5Aread(a, H5T_NATIVE_INT64, &complete), H5Aclose(a);
    if ((a = H5Aopen(f, "step", H5P_DEFAULT)) >= 0)
      H5Aread(a, H5T_NATIVE_INT64, &step), H5Aclose(a);
    if ((a = H5Aopen(f, "deck", H5P_DEFAULT)) >= 0) {
      hid_t t = H5Aget_type(a);
      if (H5Tget_size(t) <= sizeof deck) H5Aread(a, t, deck);
      H5Tclose(t), H5Aclose(a);
    }
    if ((a = H5Aopen(f, "arch", H5P_DEFAULT)) >= 0) {
      hid_t t = H5Aget_type(a);
      if (H5Tget_size(t) <= sizeof arch) H5Aread(a, t, arch);
      H5Tclose(t), H5Aclose(a);
    }
    check(version == TSR_CKPT_FORMAT_VERSION && complete == 1 && step == 7,
          "gpt2: root attributes format_version=%lld complete=%lld step=%lld", (long long)version,
          (long long)complete, (long long)step);
    check(strcmp(deck, kDeck) == 0 && strcmp(arch, "gpt2") == 0,
          "gpt2: deck text and arch stored verbatim");
    /* the root attributes other tools read by name (docs/formats.md) */
    static const char *const root_attrs[] = {
        "format_version", "step",   "tokens", "data_cursor", "skipped",  "loss_scale",
        "seed",           "deck",   "layout", "arch",        "n_layer",  "d_model",
        "n_head",         "n_kv_head", "d_ff", "vocab_size", "seq_len",  "tie_embeddings",
        "max_positions",  "tokenizer", "complete"};
    int missing = 0;
    for (size_t i = 0; i < sizeof root_attrs / sizeof root_attrs[0]; i++)
      if (H5Aexists(f, root_attrs[i]) <= 0) {
        printf("  root attribute '%s' is missing\n", root_attrs[i]);
        missing++;
      }
    check(missing == 0, "gpt2: every documented root attribute is present (%d missing)", missing);
    H5Fclose(f);
  }
  if (system("command -v h5dump >/dev/null 2>&1") == 0) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "h5dump -H '%s' >/dev/null 2>&1", path);
    check(system(cmd) == 0, "gpt2: h5dump -H reads the file");
  } else {
    printf("skip h5dump not installed\n");
  }

  /* save_initial: step 0 with no optimizer state yet writes m = v = 0. */
  bufs z;
  make_bufs(&z, lay, 0);
  memset(z.m, 0, (size_t)lay->n_flat * sizeof(float));
  memset(z.v, 0, (size_t)lay->n_flat * sizeof(float));
  rc = tsr_ckpt_save(&cfg, lay, z.master, NULL, NULL, &z.st, kDeck, MPI_COMM_WORLD);
  check(rc == 0, "gpt2: save step 0 with m = v = NULL rc=%d", rc);
  snprintf(path, sizeof path, "%s/gpt2/step_00000000.h5", root);
  loads_as(path, lay, &z, "gpt2 step 0 (m, v read back as zeros)");
  free_bufs(&z);
  free_bufs(&b);
  tsr_layout_destroy(&lay);
}

/* ---- llama: keep, latest, resolve and its fallbacks, shape errors, failed saves ---- */
static void test_llama(const char *root) {
  tsr_config cfg;
  tsr_layout *lay = NULL;
  make_cfg(&cfg, "llama", 16);
  snprintf(cfg.run.out_dir, sizeof cfg.run.out_dir, "%s/out", root); /* dir = <out_dir>/ckpt */
  tsr_layout_create(&lay, &cfg.model);
  char dir[900], p10[1000], p20[1000], p30[1000], latest[1000], got[TSR_STR_PATH];
  tsr_ckpt_dir(&cfg, dir, sizeof dir);
  check(ends_with(dir, "/out/ckpt"), "llama: checkpoint dir defaults to <out_dir>/ckpt (%s)", dir);
  snprintf(p10, sizeof p10, "%s/step_00000010.h5", dir);
  snprintf(p20, sizeof p20, "%s/step_00000020.h5", dir);
  snprintf(p30, sizeof p30, "%s/step_00000030.h5", dir);
  snprintf(latest, sizeof latest, "%s/latest", dir);

  got[0] = 'x';
  int rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && got[0] == '\0', "resolve auto with no checkpoint at all: \"\" and rc=0");

  bufs s[4];
  for (int k = 1; k <= 3; k++) {
    make_bufs(&s[k], lay, 10 * k);
    rc = tsr_ckpt_save(&cfg, lay, s[k].master, s[k].m, s[k].v, &s[k].st, kDeck, MPI_COMM_WORLD);
    check(rc == 0, "llama: save step %d rc=%d", 10 * k, rc);
  }
  check(!exists(p10) && exists(p20) && exists(p30), "keep = 2: step 10 deleted, 20 and 30 kept");
  check(file_is(latest, "step_00000030.h5\n"), "latest names step_00000030.h5");
  {
    char tname[232] = "x";
    tsr_tokenizer_file *files = NULL;
    int ngot = -1;
    rc = tsr_ckpt_read_tokenizer(p30, tname, &files, &ngot);
    check(rc == 0 && !tname[0] && !files && ngot == 0,
          "llama: a checkpoint that names no tokenizer carries no files (rc=%d, %d)", rc, ngot);
  }
  hid_t f = H5Fopen(p30, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f >= 0) {
    check_dataset(f, "/model/layers.001.attn.wk.weight", 2, 8, 16,
                  tensor_data(lay, s[3].master, "layers.001.attn.wk.weight"));
    check_dataset(f, "/model/layers.000.attn.wq.weight", 2, 16, 16, NULL);
    check_dataset(f, "/model/layers.000.mlp.w_gate.weight", 2, 24, 16, NULL);
    check_dataset(f, "/model/layers.001.mlp.w_down.weight", 2, 16, 24, NULL);
    check_dataset(f, "/model/lm_head.weight", 2, 50, 16,
                  tensor_data(lay, s[3].master, "lm_head.weight"));
    check_dataset(f, "/optim/v/layers.000.mlp_norm.weight", 1, 16, 0,
                  tensor_data(lay, s[3].v, "layers.000.mlp_norm.weight"));
    check(H5Lexists(f, "/model/final_norm.bias", H5P_DEFAULT) == 0,
          "llama: no norm biases (RMSNorm)");
    H5Fclose(f);
  } else {
    check(0, "llama: %s opens with the plain HDF5 API", p30);
  }

  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && strcmp(got, p30) == 0, "resolve auto picks the newest: %s", got);
  loads_as(got, lay, &s[3], "step 30 round trip");

  tsr_config c2 = cfg;
  snprintf(c2.checkpoint.resume, sizeof c2.checkpoint.resume, "none");
  got[0] = 'x';
  rc = tsr_ckpt_resolve(&c2, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && got[0] == '\0', "resolve 'none' gives \"\"");
  snprintf(c2.checkpoint.resume, sizeof c2.checkpoint.resume, "%s", p20);
  rc = tsr_ckpt_resolve(&c2, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && strcmp(got, p20) == 0, "resolve an explicit path gives that path");
  snprintf(c2.checkpoint.resume, sizeof c2.checkpoint.resume, "%s/nope.h5", dir);
  cap_begin();
  rc = tsr_ckpt_resolve(&c2, got, sizeof got, MPI_COMM_WORLD);
  const char *err = cap_end();
  check(rc == TSR_ERR_INPUT && strstr(err, "nope.h5"),
        "resolve a missing path: TSR_ERR_INPUT naming it");

  /* Truncated newest -> falls back to step 20, saying so. */
  struct stat sb;
  stat(p30, &sb);
  check(truncate(p30, sb.st_size / 2) == 0, "truncate step 30 to half (%lld bytes)",
        (long long)sb.st_size / 2);
  cap_begin();
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  err = cap_end();
  check(rc == 0 && strcmp(got, p20) == 0, "truncated newest: auto falls back to step 20");
  check(strstr(err, "warning") && strstr(err, "step_00000030.h5") && strstr(err, "truncated") &&
            strstr(err, "falling back"),
        "truncated newest: warning names the file, 'truncated' and the fallback");
  loads_as(got, lay, &s[2], "fallback step 20");

  /* Bytes flipped inside /model/embed.weight of the newest -> checksum mismatch. */
  rc = tsr_ckpt_save(&cfg, lay, s[3].master, s[3].m, s[3].v, &s[3].st, kDeck, MPI_COMM_WORLD);
  check(rc == 0 && exists(p20), "save step 30 again (step 20 kept)");
  haddr_t off = HADDR_UNDEF;
  if ((f = H5Fopen(p30, H5F_ACC_RDONLY, H5P_DEFAULT)) >= 0) {
    hid_t d = H5Dopen2(f, "/model/embed.weight", H5P_DEFAULT);
    if (d >= 0) off = H5Dget_offset(d), H5Dclose(d);
    H5Fclose(f);
  }
  int fd = open(p30, O_RDWR);
  unsigned char bytes[4] = {0};
  int flipped = off != HADDR_UNDEF && fd >= 0 && pread(fd, bytes, 4, (off_t)off + 404) == 4;
  for (int i = 0; i < 4; i++) bytes[i] ^= 0x5A;
  flipped = flipped && pwrite(fd, bytes, 4, (off_t)off + 404) == 4;
  if (fd >= 0) close(fd);
  check(flipped, "flip 4 bytes of /model/embed.weight at file offset %llu + 404",
        (unsigned long long)off);
  cap_begin();
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  err = cap_end();
  check(rc == 0 && strcmp(got, p20) == 0, "flipped bytes: auto falls back to step 20");
  check(strstr(err, "checksum mismatch in /model/embed.weight") && strstr(err, "step_00000030.h5"),
        "flipped bytes: warning says 'checksum mismatch in /model/embed.weight'");
  {
    bufs junk;
    make_bufs(&junk, lay, 99);
    cap_begin();
    rc = tsr_ckpt_load(p30, lay, junk.master, junk.m, junk.v, &junk.st, MPI_COMM_WORLD);
    err = cap_end();
    check(rc == TSR_ERR_INPUT && strstr(err, "/model/embed.weight") && strstr(err, "checksum"),
          "loading the damaged file directly: TSR_ERR_INPUT naming /model/embed.weight");
    free_bufs(&junk);
  }

  /* A leftover .tmp newer than everything is never a candidate, even if it is complete. */
  rc = tsr_ckpt_save(&cfg, lay, s[3].master, s[3].m, s[3].v, &s[3].st, kDeck, MPI_COMM_WORLD);
  char cmd[2600], tmp99[1200];
  snprintf(tmp99, sizeof tmp99, "%s/step_00000099.h5.tmp", dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", p30, tmp99);
  check(rc == 0 && system(cmd) == 0, "save step 30 again; plant step_00000099.h5.tmp");
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && strcmp(got, p30) == 0, "leftover .tmp ignored: auto picks step 30");

  /* Loading into another model: errors name the tensor and both shapes. */
  {
    tsr_config cw;
    tsr_layout *wide = NULL;
    make_cfg(&cw, "llama", 32);
    tsr_layout_create(&wide, &cw.model);
    bufs w;
    make_bufs(&w, wide, 1);
    cap_begin();
    rc = tsr_ckpt_load(p30, wide, w.master, w.m, w.v, &w.st, MPI_COMM_WORLD);
    err = cap_end();
    check(rc == TSR_ERR_INPUT, "load into d_model = 32: TSR_ERR_INPUT (rc=%d)", rc);
    check(
        strstr(err, "/model/embed.weight has shape [50, 16] but the deck's model needs [50, 32]") &&
            strstr(err, "step_00000030.h5"),
        "d_model mismatch: message names the file, the dataset and both shapes");
    free_bufs(&w);
    tsr_layout_destroy(&wide);
    make_cfg(&cw, "gpt2", 16);
    tsr_layout_create(&wide, &cw.model);
    make_bufs(&w, wide, 1);
    cap_begin();
    rc = tsr_ckpt_load(p30, wide, w.master, NULL, NULL, NULL, MPI_COMM_WORLD);
    err = cap_end();
    check(rc == TSR_ERR_INPUT && strstr(err, "/model/pos_embed.weight is missing") &&
              strstr(err, "/model/lm_head.weight is not a tensor"),
          "llama file into a gpt2 layout: names a missing and an extra tensor");
    free_bufs(&w);
    tsr_layout_destroy(&wide);
  }

  /* Failed saves: earlier checkpoints and `latest` untouched, no .tmp left. */
  {
    tsr_config cb = cfg;
    char afile[900];
    snprintf(afile, sizeof afile, "%s/afile", root);
    FILE *af = fopen(afile, "w");
    if (af) fputs("not a directory\n", af), fclose(af);
    snprintf(cb.checkpoint.dir, sizeof cb.checkpoint.dir, "%s", afile);
    bufs n;
    make_bufs(&n, lay, 40);
    cap_begin();
    rc = tsr_ckpt_save(&cb, lay, n.master, n.m, n.v, &n.st, kDeck, MPI_COMM_WORLD);
    err = cap_end();
    check(rc != 0 && strstr(err, afile),
          "save into a directory that is a regular file fails (rc=%d) naming it", rc);
    snprintf(cb.checkpoint.dir, sizeof cb.checkpoint.dir, "%s/sub/deeper", afile);
    cap_begin();
    rc = tsr_ckpt_save(&cb, lay, n.master, n.m, n.v, &n.st, kDeck, MPI_COMM_WORLD);
    err = cap_end();
    check(rc != 0 && strstr(err, "Not a directory"),
          "save below a regular file fails with the errno text");

    /* The final name is taken by a directory: written, verified, then rename fails. */
    char p40[1200];
    snprintf(p40, sizeof p40, "%s/step_00000040.h5", dir);
    mkdir(p40, 0755);
    cap_begin();
    rc = tsr_ckpt_save(&cfg, lay, n.master, n.m, n.v, &n.st, kDeck, MPI_COMM_WORLD);
    err = cap_end();
    char t40[1300];
    snprintf(t40, sizeof t40, "%s.tmp", p40);
    check(rc != 0 && !exists(t40) && strstr(err, "step_00000040.h5"),
          "rename onto a directory fails (rc=%d), .tmp removed, message names the file", rc);
    rmdir(p40);
    check(file_is(latest, "step_00000030.h5\n") && exists(p20) && exists(p30),
          "after failed saves: latest still names step 30, steps 20 and 30 still there");
    rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
    check(rc == 0 && strcmp(got, p30) == 0, "after failed saves: auto still picks step 30");
    loads_as(p30, lay, &s[3], "step 30 intact after failed saves");
    free_bufs(&n);
  }

  /* No `latest` at all: the directory listing still finds the newest. */
  unlink(latest);
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && strcmp(got, p30) == 0, "missing latest: auto still picks step 30");

  /* `latest` naming step 20 and written after step 30 (a resume from step 20 that
   * abandoned 30): `latest` wins, 30 is left out */
  FILE *lf = fopen(latest, "w");
  if (lf) fputs("step_00000020.h5\n", lf), fclose(lf);
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && strcmp(got, p20) == 0,
        "latest newer than step 30 and naming step 20 (30 abandoned): auto picks step 20");
  /* the same `latest` older than step 30 (a job killed between publishing step 30 and
   * updating `latest`): the newest complete one is taken */
  struct stat s20;
  if (stat(p20, &s20) == 0) {
    const struct timespec t[2] = {s20.st_mtim, s20.st_mtim};
    utimensat(AT_FDCWD, latest, t, 0);
  }
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && strcmp(got, p30) == 0,
        "latest lagging (older than step 30, naming step 20): auto picks step 30");

  /* keep = 0 keeps everything. */
  cfg.checkpoint.keep = 0;
  for (int k = 4; k <= 5; k++) {
    bufs n;
    make_bufs(&n, lay, 10 * k);
    rc |= tsr_ckpt_save(&cfg, lay, n.master, n.m, n.v, &n.st, kDeck, MPI_COMM_WORLD);
    free_bufs(&n);
  }
  check(rc == 0 && count_step_files(dir) == 4, "keep = 0: steps 20, 30, 40, 50 all kept (%d files)",
        count_step_files(dir));

  /* All candidates broken: an error, not a silent fresh start. */
  for (int k = 2; k <= 5; k++) {
    char p[1200];
    snprintf(p, sizeof p, "%s/step_%08d.h5", dir, 10 * k);
    if (truncate(p, 100) != 0) check(0, "truncate %s", p);
  }
  cap_begin();
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  err = cap_end();
  check(
      rc == TSR_ERR_INPUT && strstr(err, "none of the"),
      "every checkpoint damaged: resolve auto fails with TSR_ERR_INPUT instead of starting afresh");

  for (int k = 1; k <= 3; k++) free_bufs(&s[k]);
  tsr_layout_destroy(&lay);
}

/* ---- more than one rank: whole buffers as identical copies, the writes spread ---- */
static void test_multi_rank(const char *root, int rank, int size) {
  tsr_config cfg;
  tsr_layout *lay = NULL;
  make_cfg(&cfg, "llama", 16);
  snprintf(cfg.checkpoint.dir, sizeof cfg.checkpoint.dir, "%s/multi", root);
  tsr_layout_create(&lay, &cfg.model);
  /* Each rank passes different values and state, so the file shows who wrote what: the
   * contract is that tensor k comes from rank k mod size, the state from rank 0. */
  bufs mine, b;
  make_bufs(&mine, lay, 5 + rank);
  make_bufs(&b, lay, 5);
  for (int k = 0; k < lay->n_tensors; k++) {
    const tsr_tensor *t = &lay->tensors[k];
    bufs src;
    make_bufs(&src, lay, 5 + k % size);
    size_t at = (size_t)t->offset, bytes = (size_t)t->numel * sizeof(float);
    memcpy(b.master + at, src.master + at, bytes);
    memcpy(b.m + at, src.m + at, bytes);
    memcpy(b.v + at, src.v + at, bytes);
    free_bufs(&src);
  }
  int rc =
      tsr_ckpt_save(&cfg, lay, mine.master, mine.m, mine.v, &mine.st, kDeck, MPI_COMM_WORLD);
  free_bufs(&mine);
  check(rc == 0, "rank %d of %d: collective save rc=%d", rank, size, rc);
  char got[TSR_STR_PATH];
  rc = tsr_ckpt_resolve(&cfg, got, sizeof got, MPI_COMM_WORLD);
  check(rc == 0 && ends_with(got, "/multi/step_00000005.h5"), "rank %d: resolve agrees: %s", rank,
        got);
  loads_as(got, lay, &b,
           "multi-rank round trip: tensor k as rank k mod size passed it, rank 0's state");
  snprintf(cfg.checkpoint.dir, sizeof cfg.checkpoint.dir, "%s/afile2", root);
  if (rank == 0) {
    FILE *af = fopen(cfg.checkpoint.dir, "w");
    if (af) fclose(af);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  rc = tsr_ckpt_save(&cfg, lay, b.master, b.m, b.v, &b.st, kDeck, MPI_COMM_WORLD);
  check(rc != 0, "rank %d: a failed save returns nonzero on every rank", rank);
  free_bufs(&b);
  tsr_layout_destroy(&lay);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  tsr_set_rank(rank);
  char root[256] = "/tmp/tsr_ckpt_XXXXXX";
  if (rank == 0 && !mkdtemp(root)) {
    fprintf(stderr, "test_ckpt: mkdtemp: %s\n", strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  snprintf(g_capfile, sizeof g_capfile, "%s/stderr.%d", root, rank);
  if (size == 1) {
    printf("test_ckpt: 1 rank, files under %s\n", root);
    test_gpt2(root);
    test_llama(root);
  } else {
    printf("test_ckpt: %d ranks (declared 1): multi-rank round trip only\n", size);
    test_multi_rank(root, rank, size);
  }
  int failed = g_failed;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    if (!failed) {
      char cmd[400];
      snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
      if (system(cmd) != 0) fprintf(stderr, "test_ckpt: could not remove %s\n", root);
    }
    printf("test_ckpt: %d checks on rank 0, %d failed (all ranks)%s\n", g_checks, failed,
           failed ? "; files kept for inspection" : "");
  }
  MPI_Finalize();
  return failed ? 1 : 0;
}
