/* test_sharding.c — checkpoints by pieces (docs/sharding.md "Checkpoint pieces"), any layout to any layout.
 * MPI test: runs on 1, 2, 3 or 4 ranks (tests/mpi/sharding.sh runs all four).
 *
 * The model state is a pure function of (tensor name, logical element index), so every
 * rank knows every logical value without communication.  On np ranks every grid
 * world = tp x pp x dp (ranks as src/comm/grid.h: tp fastest, then dp, then pp) with
 * pp x virtual_stages chunks and the dp group cut into shard_size shards x replicas
 * (zero 0: one shard, dp identical copies; zero >= 1: dp shards; hybrid: 2 x 2) is a
 * layout.  For two models (llama with n_kv_head 2, so tp 4 shares KV heads; gpt2 with a
 * tied head, so pp 2 holds a tied copy) and every layout A:
 *   - each rank fills its shard of its (stage, tp) part from the logical values, except
 *     that every copy which must NOT write a tensor (tied copy, non-writing tp / dp
 *     copies) holds wrong values: a write from the wrong copy shows up in the file;
 *   - tsr_ckpt_save_view; the file, read on rank 0 with the plain serial HDF5 API, holds
 *     every logical tensor bitwise, with a checksum equal to docs/formats.md "Checksums"
 *     computed here;
 *   - layouts B (every layout of this rank count, or 7 spread ones when there are more
 *     than 8, and every file an earlier run with another rank count left in the
 *     directory) load it with tsr_ckpt_load_view: every rank's
 *     master / m / v pieces equal the logical values bitwise, train state equal;
 *   - views that cover elements twice are refused on every rank, with no file left;
 *   - the whole-buffer tsr_ckpt_save / tsr_ckpt_load round-trip as before.
 * Usage: test_sharding [DIR]  (DIR keeps the files for later runs; default: a temp dir
 * removed at the end).  Exit 0 pass, 1 fail. */
#include <dirent.h>
#include <errno.h>
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

static int g_rank, g_size, g_checks, g_failed;

/* Collective: every rank's verdict; passes only if it holds on every rank. */
static int check_all(int ok, const char *fmt, ...) {
  int all = ok;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  g_checks++;
  if (!all) g_failed++;
  if (g_rank == 0) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", all ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
  }
  return all;
}

/* ---- the logical state ---- */

static void model_of(tsr_model_config *m, const char *arch) {
  memset(m, 0, sizeof *m);
  m->arch = strcmp(arch, "gpt2") == 0 ? TSR_ARCH_GPT2 : TSR_ARCH_LLAMA;
  const int gpt2 = strcmp(arch, "gpt2") == 0;
  m->n_layer = 4;
  m->d_model = 24; /* rows of 24, 12, 6 floats: shard cuts land mid-row */
  m->n_head = 4;
  m->n_kv_head = gpt2 ? 4 : 2;
  m->d_ff = 40;
  m->vocab_size = 36;
  m->seq_len = 8;
  m->tie_embeddings = gpt2;
  m->init_std = 0.02;
  m->norm_eps = 1e-5;
  m->rope_theta = 10000;
}

/* Value of logical element idx of tensor `name` in master (0), m (1) or v (2). */
static float logical_value(int which, const char *name, int64_t idx) {
  uint64_t key = tsr_hash_str(name) ^ ((uint64_t)(which + 1) * 0x9E3779B97F4A7C15ULL);
  float x = (float)(4.0 * tsr_rand_uniform(key, (uint64_t)idx) - 2.0);
  return which == 2 ? x * x : x; /* v >= 0, as Adam's is */
}

/* Written here again (not the library's): local element j of t -> logical index. */
static int64_t logical_of(const tsr_tensor *t, int64_t j) {
  return (t->row0 + j / t->lshape[1]) * t->shape[1] + t->col0 + j % t->lshape[1];
}

/* ---- layouts ---- */

typedef struct {
  int tp, pp, v, dp, shard_size, replicas, pad;
  char name[64];
} grid_layout;

static int make_layouts(int np, grid_layout *out, int max) {
  int n = 0;
  const int tps[] = {1, 2, 4}, pps[] = {1, 2};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 2; b++) {
      const int tp = tps[a], pp = pps[b];
      if (np % (tp * pp)) continue;
      const int dp = np / (tp * pp);
      for (int v = 1; v <= (pp > 1 ? 2 : 1); v++) {
        int S[3], R[3], k = 0; /* shard_size x replicas = dp */
        S[k] = 1, R[k++] = dp;      /* zero 0: dp identical copies */
        if (dp > 1) S[k] = dp, R[k++] = 1;             /* zero >= 1 over the whole dp */
        if (dp == 4) S[k] = 2, R[k++] = 2;             /* hybrid: 2 shards x 2 replicas */
        for (int z = 0; z < k; z++) /* several shards: padded to 64 S (as ZeRO) and not */
          for (int pad = S[z] > 1 ? 0 : n % 2; pad < 2 && n < max; pad++) {
            grid_layout *g = &out[n++];
            *g = (grid_layout){tp, pp, v, dp, S[z], R[z], pad, ""};
            snprintf(g->name, sizeof g->name, "tp%dpp%dv%ddp%dS%dR%d%s", tp, pp, v, dp, S[z],
                     R[z], pad ? "pad" : "");
            if (S[z] == 1) break;
          }
      }
    }
  return n;
}

/* This rank's part of layout g: its layout, view and buffers. */
typedef struct {
  tsr_layout *lay;
  tsr_ckpt_view view;
  float *buf[3];
  int64_t len;
} rank_part;

static int part_create(rank_part *rp, const tsr_model_config *m, const grid_layout *g) {
  memset(rp, 0, sizeof *rp);
  const int tp_rank = g_rank % g->tp, dp_rank = (g_rank / g->tp) % g->dp,
            pp_rank = g_rank / (g->tp * g->dp);
  const int shard = dp_rank % g->shard_size, replica = dp_rank / g->shard_size;
  if (tsr_layout_create_part(&rp->lay, m, g->tp, tp_rank, g->pp, pp_rank, g->v)) return 1;
  const int64_t q = g->pad ? 64 * (int64_t)g->shard_size : 1; /* unpadded: uneven shards */
  const int64_t n = (rp->lay->n_params + q - 1) / q * q;
  rp->lay->n_flat = n;
  rp->view = (tsr_ckpt_view){rp->lay, shard * n / g->shard_size, (shard + 1) * n / g->shard_size,
                             replica, g->replicas};
  rp->len = rp->view.shard_end - rp->view.shard_begin;
  for (int k = 0; k < 3; k++)
    if (!(rp->buf[k] = tsr_calloc((size_t)(rp->len > 0 ? rp->len : 1), sizeof(float)))) return 1;
  return 0;
}

static void part_destroy(rank_part *rp) {
  for (int k = 0; k < 3; k++) tsr_free(&rp->buf[k]);
  tsr_layout_destroy(&rp->lay);
}

/* Written here again: among the tp_copies x n_copies identical holders the one numbered
 * logical_index mod holders writes (holder number = copy_index x tp_copies + tp_copy). */
static int should_write(const tsr_tensor *t, const tsr_ckpt_view *v) {
  if (t->tied_copy) return 0;
  int holders = t->tp_copies * v->n_copies, me = v->copy_index * t->tp_copies + t->tp_copy;
  return t->logical_index % holders == me;
}

/* Fill the shard with the logical values; with `poison`, copies that must not write
 * hold value + 1 instead. */
static void part_fill(rank_part *rp, int poison) {
  const int64_t s0 = rp->view.shard_begin, s1 = rp->view.shard_end;
  for (int i = 0; i < rp->lay->n_tensors; i++) {
    const tsr_tensor *t = &rp->lay->tensors[i];
    const float bump = poison && !should_write(t, &rp->view) ? 1.0f : 0.0f;
    for (int64_t e = t->offset > s0 ? t->offset : s0; e < t->offset + t->numel && e < s1; e++)
      for (int k = 0; k < 3; k++)
        rp->buf[k][e - s0] = logical_value(k, t->name, logical_of(t, e - t->offset)) + bump;
  }
}

/* Elements of the shard that differ bitwise from the logical values. */
static int64_t part_diff(const rank_part *rp, int groups) {
  const int64_t s0 = rp->view.shard_begin, s1 = rp->view.shard_end;
  int64_t bad = 0;
  for (int i = 0; i < rp->lay->n_tensors; i++) {
    const tsr_tensor *t = &rp->lay->tensors[i];
    for (int64_t e = t->offset > s0 ? t->offset : s0; e < t->offset + t->numel && e < s1; e++)
      for (int k = 0; k < groups; k++) {
        float want = logical_value(k, t->name, logical_of(t, e - t->offset));
        bad += memcmp(&rp->buf[k][e - s0], &want, sizeof want) != 0;
      }
  }
  return bad;
}

static void set_junk(rank_part *rp) {
  for (int k = 0; k < 3; k++)
    for (int64_t j = 0; j < rp->len; j++) rp->buf[k][j] = -1234.5f;
}

/* ---- the file, read back serially on rank 0 ---- */

static uint64_t ref_checksum(const float *x, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], 4);
    s += tsr_mix64((uint64_t)i * 0x9E3779B97F4A7C15ULL ^ bits);
  }
  return s;
}

/* Rank 0: datasets not equal to the logical tensors (data or checksum), -1 if unreadable. */
static int file_diff(const char *path, const tsr_model_config *m) {
  static const char *const groups[3] = {"/model", "/optim/m", "/optim/v"};
  tsr_layout *whole = NULL;
  if (tsr_layout_create(&whole, m)) return -1;
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    tsr_layout_destroy(&whole);
    return -1;
  }
  int bad = 0;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < whole->n_tensors; i++) {
      const tsr_tensor *t = &whole->tensors[i];
      char name[160];
      snprintf(name, sizeof name, "%s/%s", groups[k], t->name);
      int64_t n = t->shape[0] * t->shape[1];
      float *got = calloc((size_t)n, sizeof *got), *want = calloc((size_t)n, sizeof *want);
      for (int64_t j = 0; j < n; j++) want[j] = logical_value(k, t->name, j);
      hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
      hsize_t dims[2] = {0, 0};
      uint64_t stored = 0;
      int ok = d >= 0;
      if (ok) {
        hid_t sp = H5Dget_space(d);
        ok = H5Sget_simple_extent_ndims(sp) == t->ndim && H5Sget_simple_extent_dims(sp, dims, NULL) >= 0 &&
             dims[0] == (hsize_t)t->shape[0] && (t->ndim == 1 || dims[1] == (hsize_t)t->shape[1]);
        H5Sclose(sp);
        hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
        ok = ok && a >= 0 && H5Aread(a, H5T_NATIVE_UINT64, &stored) >= 0 &&
             H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0;
        if (a >= 0) H5Aclose(a);
        H5Dclose(d);
      }
      ok = ok && memcmp(got, want, (size_t)n * sizeof *got) == 0 && stored == ref_checksum(want, n);
      if (!ok && bad++ < 3) printf("    %s: %s differs from the logical tensor\n", path, name);
      free(got);
      free(want);
    }
  H5Fclose(f);
  tsr_layout_destroy(&whole);
  return bad;
}

/* ---- save and load ---- */

static tsr_train_state state_of(int64_t step) {
  tsr_train_state st;
  memset(&st, 0, sizeof st);
  st.step = step, st.tokens = step * 1000 + 3, st.data_cursor = step * 16 + 1, st.skipped = 2;
  st.loss_scale = 1024.5, st.scale_good_steps = 17, st.seed = 0xABCDEF0123456789ULL;
  return st;
}

static void cfg_of(tsr_config *cfg, const tsr_model_config *m, const grid_layout *g,
                   const char *dir) {
  memset(cfg, 0, sizeof *cfg);
  cfg->model = *m;
  cfg->parallel.tp = g->tp;
  cfg->parallel.pp = g->pp;
  cfg->parallel.virtual_stages = g->v;
  cfg->parallel.zero_stage = g->shard_size > 1;
  snprintf(cfg->checkpoint.dir, sizeof cfg->checkpoint.dir, "%s", dir);
  cfg->checkpoint.keep = 0;
}

static int exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* Load `path` under layout g: pieces and state equal to the logical ones. */
static void load_under(const char *path, const char *what, const tsr_model_config *m,
                       const grid_layout *g, int64_t step) {
  rank_part rp;
  int ok = part_create(&rp, m, g) == 0;
  if (!check_all(ok, "%s: create %s part", what, g->name)) return;
  set_junk(&rp);
  tsr_train_state st = {0};
  double t0 = MPI_Wtime();
  int rc = tsr_ckpt_load_view(path, NULL, &rp.view, rp.buf[0], rp.buf[1], rp.buf[2], &st,
                              MPI_COMM_WORLD);
  double secs = MPI_Wtime() - t0;
  tsr_train_state want = state_of(step);
  int64_t bad = rc == 0 ? part_diff(&rp, 3) : -1;
  int same = memcmp(&st, &want, sizeof st) == 0;
  check_all(rc == 0 && bad == 0 && same,
            "%s -> %s: load rc=%d, master/m/v pieces bitwise logical (%lld differ), state equal "
            "(%.3f s)", what, g->name, rc, (long long)bad, secs);
  part_destroy(&rp);
}

static void save_as(const char *root, const char *arch, const tsr_model_config *m,
                    const grid_layout *g, int64_t step, char *path, size_t len) {
  char dir[900];
  snprintf(dir, sizeof dir, "%s/np%d/%s-%s", root, g_size, arch, g->name);
  snprintf(path, len, "%s/step_%08lld.h5", dir, (long long)step);
  tsr_config cfg;
  cfg_of(&cfg, m, g, dir);
  rank_part rp;
  int ok = part_create(&rp, m, g) == 0;
  if (!check_all(ok, "%s %s: create part", arch, g->name)) return;
  part_fill(&rp, 1);
  tsr_train_state st = state_of(step);
  double t0 = MPI_Wtime();
  int rc = tsr_ckpt_save_view(&cfg, &rp.view, rp.buf[0], rp.buf[1], rp.buf[2], &st, "&run\n/\n",
                              MPI_COMM_WORLD);
  double secs = MPI_Wtime() - t0;
  int diff = 0;
  if (g_rank == 0) diff = rc == 0 ? file_diff(path, m) : -1;
  MPI_Bcast(&diff, 1, MPI_INT, 0, MPI_COMM_WORLD);
  check_all(rc == 0 && diff == 0,
            "%s %s: save rc=%d (%.3f s; non-writing copies held wrong values); serial HDF5 "
            "reads every logical tensor bitwise, checksum = formula (%d datasets differ)",
            arch, g->name, rc, secs, diff);
  part_destroy(&rp);
}

/* A view set that holds every element twice (dp replicas claiming to be the only copy)
 * must be refused on every rank, leaving no file. */
static void save_overlapping(const char *root, const tsr_model_config *m, const grid_layout *g) {
  char dir[900], path[1000];
  snprintf(dir, sizeof dir, "%s/np%d/overlap", root, g_size);
  snprintf(path, sizeof path, "%s/step_00000003.h5", dir);
  tsr_config cfg;
  cfg_of(&cfg, m, g, dir);
  rank_part rp;
  if (part_create(&rp, m, g)) return;
  part_fill(&rp, 0);
  rp.view.copy_index = 0;
  rp.view.n_copies = 1;
  tsr_train_state st = state_of(3);
  fflush(stderr);
  int rc = tsr_ckpt_save_view(&cfg, &rp.view, rp.buf[0], rp.buf[1], rp.buf[2], &st, "", MPI_COMM_WORLD);
  int gone = 0;
  if (g_rank == 0) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    gone = !exists(path) && !exists(tmp);
  }
  MPI_Bcast(&gone, 1, MPI_INT, 0, MPI_COMM_WORLD);
  check_all(rc != 0 && gone, "%s with %d replicas each claiming to be the only copy: refused "
            "on every rank (rc=%d), no file", g->name, g->replicas, rc);
  part_destroy(&rp);
}

/* Whole buffers through the old API: the same values on every rank. */
static void old_api(const char *root, const char *arch, const tsr_model_config *m) {
  tsr_layout *lay = NULL;
  tsr_layout_create(&lay, m);
  grid_layout g = {1, 1, 1, 1, 1, 1, 0, "whole"};
  tsr_config cfg;
  char dir[900], path[1000];
  snprintf(dir, sizeof dir, "%s/np%d/old-%s", root, g_size, arch);
  snprintf(path, sizeof path, "%s/step_00000005.h5", dir);
  cfg_of(&cfg, m, &g, dir);
  rank_part rp = {lay, {lay, 0, lay->n_flat, 0, 1}, {NULL, NULL, NULL}, lay->n_flat};
  for (int k = 0; k < 3; k++) rp.buf[k] = tsr_calloc((size_t)lay->n_flat, sizeof(float));
  part_fill(&rp, 0);
  tsr_train_state st = state_of(5);
  int rc = tsr_ckpt_save(&cfg, lay, rp.buf[0], rp.buf[1], rp.buf[2], &st, "", MPI_COMM_WORLD);
  int diff = 0;
  if (g_rank == 0) diff = rc == 0 ? file_diff(path, m) : -1;
  MPI_Bcast(&diff, 1, MPI_INT, 0, MPI_COMM_WORLD);
  set_junk(&rp);
  tsr_train_state got = {0};
  int rc2 = tsr_ckpt_load(path, lay, rp.buf[0], rp.buf[1], rp.buf[2], &got, MPI_COMM_WORLD);
  int64_t bad = part_diff(&rp, 3);
  check_all(rc == 0 && diff == 0 && rc2 == 0 && bad == 0 && memcmp(&got, &st, sizeof st) == 0,
            "%s: whole-buffer tsr_ckpt_save / tsr_ckpt_load round trip (file logical, %lld differ)",
            arch, (long long)bad);
  for (int k = 0; k < 3; k++) tsr_free(&rp.buf[k]);
  tsr_layout_destroy(&lay);
}

/* Files that runs on other rank counts left under root/np<k>/<arch>-<layout>/. */
static void load_earlier_runs(const char *root, const grid_layout *mine, int n_mine) {
  int turn = 0;
  for (int np = 1; np <= 8; np++) {
    if (np == g_size) continue;
    char sub[900];
    snprintf(sub, sizeof sub, "%s/np%d", root, np);
    DIR *d = opendir(sub);
    int count = 0;
    char names[64][128];
    if (d) { /* every rank lists the same directory; sorted so all agree on the order */
      struct dirent *e;
      while ((e = readdir(d)) && count < 64)
        if ((!strncmp(e->d_name, "llama-", 6) || !strncmp(e->d_name, "gpt2-", 5)) &&
            strlen(e->d_name) < 128)
          snprintf(names[count++], 128, "%s", e->d_name);
      closedir(d);
    }
    qsort(names, (size_t)count, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    MPI_Bcast(&count, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(names, (int)sizeof names, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int i = 0; i < count; i++) {
      char path[1200], what[200];
      snprintf(path, sizeof path, "%s/%.127s/step_00000007.h5", sub, names[i]);
      snprintf(what, sizeof what, "np%d %.127s", np, names[i]);
      tsr_model_config m;
      model_of(&m, strncmp(names[i], "gpt2-", 5) == 0 ? "gpt2" : "llama");
      load_under(path, what, &m, &mine[turn++ % n_mine], 7);
    }
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  tsr_set_rank(g_rank);
  char root[800] = "/tmp/tsr_sharding_XXXXXX";
  const int keep = argc > 1;
  if (keep) snprintf(root, sizeof root, "%s", argv[1]);
  else if (g_rank == 0 && !mkdtemp(root)) {
    fprintf(stderr, "test_sharding: mkdtemp: %s\n", strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  grid_layout layouts[32];
  const int n = make_layouts(g_size, layouts, 32);
  if (g_rank == 0) {
    printf("test_sharding: %d ranks, %d layouts, files under %s\n", g_size, n, root);
    fflush(stdout);
  }
  const char *archs[2] = {"llama", "gpt2"};
  const double t0 = MPI_Wtime();
  for (int a = 0; a < 2; a++) {
    tsr_model_config m;
    model_of(&m, archs[a]);
    char paths[32][1000];
    for (int i = 0; i < n; i++) save_as(root, archs[a], &m, &layouts[i], 7, paths[i], sizeof paths[i]);
    /* each file under every layout of this rank count; with many layouts (np 4: 17) under
     * itself and 6 others at spread offsets, which keeps the test to seconds */
    static const int offsets[] = {0, 1, 2, 3, 5, 8, 13};
    const int n_loads = n <= 8 ? n : (int)(sizeof offsets / sizeof offsets[0]);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n_loads; j++) {
        char what[200];
        snprintf(what, sizeof what, "%s %s", archs[a], layouts[i].name);
        load_under(paths[i], what, &m, &layouts[(i + (n <= 8 ? j : offsets[j])) % n], 7);
      }
    old_api(root, archs[a], &m);
  }
  for (int i = 0; i < n; i++)
    if (layouts[i].replicas > 1) {
      tsr_model_config m;
      model_of(&m, "llama");
      save_overlapping(root, &m, &layouts[i]);
      break;
    }
  load_earlier_runs(root, layouts, n);
  const double secs = MPI_Wtime() - t0;
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    if (!g_failed && !keep) {
      char cmd[900];
      snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
      if (system(cmd) != 0) fprintf(stderr, "test_sharding: could not remove %s\n", root);
    }
    printf("test_sharding: %d ranks: %d checks passed, %d failed (%.2f s)\n", g_size,
           g_checks - g_failed, g_failed, secs);
  }
  MPI_Finalize();
  return g_failed ? 1 : 0;
}
