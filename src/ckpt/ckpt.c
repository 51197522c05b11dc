/* ckpt.c — checkpoints as one parallel-HDF5 file of logical tensors (docs/formats.md).
 *
 * Every rank takes part in every collective call and writes or reads only its own
 * pieces of each logical tensor (docs/sharding.md "Checkpoint pieces"): its view's (stage, tp) slice of the
 * tensor intersected with its ZeRO shard, as at most three hyperslab rectangles of the
 * logical dataset (tsr_layout_piece).  Of identical copies (replicated tensors over tp,
 * dp replicas of a shard) one writes (tsr_layout_writes); the tied head's copy never.
 * Loads compute the pieces of the *current* view, so any layout reads any file.
 *
 * Checksum of a logical tensor x with n elements (docs/formats.md "Checksums"), stored as the u64
 * attribute `checksum` on its dataset:
 *     sum over i in [0, n) of tsr_mix64(i * 0x9E3779B97F4A7C15 ^ bits(x[i]))   mod 2^64
 * with i the row-major logical index and bits() the IEEE-754 binary32 pattern.  Each
 * rank adds up the elements it holds, so any layout verifies any file. */
#include "ckpt_internal.h"
#include "deck/deck.h"
#include "core/fault.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/util.h"

/* A rank's piece of one logical tensor (docs/sharding.md "Checkpoint pieces"): the local tensor t, its local
 * elements [i0, i1) inside the view's shard, as n rectangles of the logical tensor. */
typedef struct {
  const tsr_tensor *t; /* NULL: this rank holds nothing of the tensor */
  int64_t i0, i1;
  int n;
  tsr_rect rect[3];
} piece;

static piece view_piece(const tsr_ckpt_view *view, const tsr_tensor *t) {
  piece p = {t, 0, 0, 0, {{0, 0, 0, 0}}};
  if (t) p.n = tsr_layout_piece(t, view->shard_begin, view->shard_end, &p.i0, &p.i1, p.rect);
  return p;
}

/* The piece's elements in the view's buffer (which starts at flat offset shard_begin). */
static size_t piece_at(const tsr_ckpt_view *view, const piece *p) {
  return (size_t)(p->t->offset + p->i0 - view->shard_begin);
}

/* x holds local elements [i0, i1) of the piece; sums them at their logical indices. */
static uint64_t piece_checksum(const piece *p, const float *x) {
  uint64_t sum = 0;
  const float *src = x;
  for (int r = 0; r < p->n; r++) {
    const tsr_rect *q = &p->rect[r];
    for (int64_t row = 0; row < q->rows; row++) {
      sum += tsr_ckpt_checksum_run(src, q->cols, (q->row + row) * p->t->shape[1] + q->col);
      src += q->cols;
    }
  }
  return sum;
}

/* The union of the piece's rectangles (row-major order matches the local order), or none. */
static herr_t select_piece(hid_t space, const piece *p) {
  if (p->i1 <= p->i0) return H5Sselect_none(space);
  for (int r = 0; r < p->n; r++)
    if (tsr_ckpt_select_rect(space, p->rect[r].row, p->rect[r].col, p->rect[r].rows, p->rect[r].cols,
                    r == 0) < 0)
      return -1;
  return 0;
}

/* For each logical tensor of the whole model, the view's local tensor holding a slice of
 * it, or NULL.  With `tied` the last stage's copy of embed.weight counts (it is read on
 * load), without it only the tensors this rank may write. */
static int map_local(const tsr_layout *whole, const tsr_ckpt_view *view, int tied,
                     const tsr_tensor **local) {
  const tsr_layout *lay = view->lay;
  for (int i = 0; i < whole->n_tensors; i++) local[i] = NULL;
  for (int j = 0; j < lay->n_tensors; j++) {
    const tsr_tensor *t = &lay->tensors[j];
    const int k = t->logical_index;
    if (t->tied_copy && !tied) continue;
    if (k < 0 || k >= whole->n_tensors || strcmp(whole->tensors[k].name, t->name) != 0 ||
        local[k]) {
      tsr_error("checkpoint: the rank's layout does not match the model's tensor list at %s "
                "(layout built from another model config?)", t->name);
      return TSR_ERR;
    }
    local[k] = t;
  }
  return 0;
}

/* The view must describe a range of its layout's flat buffer and a valid copy number. */
static int check_view(const tsr_ckpt_view *view) {
  if (!view || !view->lay) {
    tsr_error("checkpoint: no layout in the view");
    return TSR_ERR;
  }
  if (view->shard_begin < 0 || view->shard_end < view->shard_begin ||
      view->shard_end > view->lay->n_flat || view->n_copies < 1 || view->copy_index < 0 ||
      view->copy_index >= view->n_copies) {
    tsr_error("checkpoint: bad view: shard [%lld, %lld) of a %lld-element buffer, copy %d of %d",
              (long long)view->shard_begin, (long long)view->shard_end,
              (long long)view->lay->n_flat, view->copy_index, view->n_copies);
    return TSR_ERR;
  }
  return 0;
}

/* After the all-reduce: each logical tensor was covered exactly once by the writers
 * (counted elements = numel).  A miss means the views of the ranks do not add up. */
static int check_coverage(const tsr_layout *whole, const int64_t *counted, const char *what,
                          int loud) {
  int bad = 0;
  for (int i = 0; i < whole->n_tensors; i++) {
    const tsr_tensor *t = &whole->tensors[i];
    if (counted[i] == t->shape[0] * t->shape[1]) continue;
    if (loud && bad < 5)
      tsr_error("checkpoint: %s %lld of the %lld elements of %s: the ranks' views (stage, tp "
                "slice, shard, copies) do not cover each element exactly once",
                what, (long long)counted[i], (long long)(t->shape[0] * t->shape[1]), t->name);
    bad++;
  }
  return bad ? TSR_ERR : 0;
}

/* ---- attributes ---- */

static herr_t attr_put(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                       const void *val) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = space < 0 ? -1 : H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t e = a < 0 ? -1 : H5Awrite(a, mem_type, val);
  if (a >= 0 && H5Aclose(a) < 0) e = -1;
  if (space >= 0) H5Sclose(space);
  return a < 0 ? -1 : e;
}

static herr_t attr_put_i64(hid_t obj, const char *name, int64_t v) {
  return attr_put(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

static herr_t attr_put_str(hid_t obj, const char *name, const char *s) {
  hid_t type = H5Tcopy(H5T_C_S1);
  if (type < 0) return -1;
  herr_t e = H5Tset_size(type, strlen(s) + 1);
  if (e >= 0) e = H5Tset_strpad(type, H5T_STR_NULLTERM);
  if (e >= 0) e = attr_put(obj, name, type, type, s);
  H5Tclose(type);
  return e;
}

/* ---- save ---- */

/* checkpoint.mpiio_hints ("key=value,key=value", checked by the deck) as an MPI_Info;
 * MPI_INFO_NULL when there are none.  -1 if MPI refuses it. */
static int hints_info(const char *hints, MPI_Info *info) {
  char key[MPI_MAX_INFO_KEY + 1], val[TSR_STR_PATH];
  *info = MPI_INFO_NULL;
  for (const char *s = hints; *s;) {
    size_t n = 0;
    while (*s == ' ' || *s == '\t' || *s == ',') s++;
    if (!*s) break;
    for (n = 0; *s && *s != '=' && *s != ' ' && *s != '\t'; s++)
      if (n < sizeof key - 1) key[n++] = *s;
    key[n] = 0;
    while (*s == ' ' || *s == '\t' || *s == '=') s++;
    for (n = 0; *s && *s != ',' && *s != ' ' && *s != '\t'; s++)
      if (n < sizeof val - 1) val[n++] = *s;
    val[n] = 0;
    if ((*info == MPI_INFO_NULL && MPI_Info_create(info) != MPI_SUCCESS) ||
        MPI_Info_set(*info, key, val) != MPI_SUCCESS) {
      tsr_error("checkpoint: MPI refuses the hint '%s=%s' of &checkpoint mpiio_hints", key, val);
      return -1;
    }
  }
  return 0;
}

/* File access with checkpoint.mpiio_hints and .alignment (cc may be NULL: defaults). */
static hid_t open_fapl_hints(MPI_Comm comm, const tsr_checkpoint_config *cc) {
  MPI_Info info = MPI_INFO_NULL;
  if (cc && hints_info(cc->mpiio_hints, &info) != 0) {
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
    return -1;
  }
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  herr_t e = fapl < 0 ? -1 : H5Pset_fapl_mpio(fapl, comm, info); /* HDF5 keeps a copy */
  if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  /* objects of at least one alignment unit start on a multiple of it (file system stripes) */
  if (e >= 0 && cc && cc->alignment > 0)
    e = H5Pset_alignment(fapl, (hsize_t)cc->alignment, (hsize_t)cc->alignment);
  if (fapl < 0) return -1;
  if (e < 0 ||
      H5Pset_all_coll_metadata_ops(fapl, 1) < 0 || H5Pset_coll_metadata_write(fapl, 1) < 0 ||
      /* 1.8 format: attributes over 64 KiB (a long deck) go to dense storage */
      H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0) {
    H5Pclose(fapl);
    return -1;
  }
  return fapl;
}

/* Rank 0, on each save with hints: the hints as the MPI-IO layer reports them on the open
 * file (an implementation may ignore or adjust some), so a user sees what took effect. */
static void log_hints(hid_t file, const char *hints) {
  MPI_File *fh = NULL;
  MPI_Info info = MPI_INFO_NULL;
  if (!hints[0]) return;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, (void **)&fh) < 0 || !fh ||
      MPI_File_get_info(*fh, &info) != MPI_SUCCESS) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
  char line[2048] = "", key[MPI_MAX_INFO_KEY + 1], val[256];
  size_t used = 0;
  for (const char *s = hints; *s;) {
    size_t n = 0;
    int flag = 0;
    while (*s == ' ' || *s == '\t' || *s == ',') s++;
    if (!*s) break;
    for (; *s && *s != '=' && *s != ' ' && *s != '\t'; s++)
      if (n < sizeof key - 1) key[n++] = *s;
    key[n] = 0;
    while (*s && *s != ',') s++;
    MPI_Info_get(info, key, (int)sizeof val - 1, val, &flag);
    int w = snprintf(line + used, sizeof line - used, "%s%s=%s", used ? " " : "", key,
                     flag ? val : "(not reported)");
    if (w > 0 && used + (size_t)w < sizeof line) used += (size_t)w;
  }
  MPI_Info_free(&info);
  tsr_log("checkpoint: MPI-IO hints as the MPI-IO layer reports them: %s", line);
}

/* Test hooks (tests/e2e/ckpt_failures.sh, tests/e2e/ckpt_async.sh; fault.h): with TSR_FAULT
 * ckpt_sleep=<seconds> every rank sleeps while saving the checkpoint of step ckpt_step
 * (default: every step), so a test can act on the ranks at that moment reliably: half-way
 * through writing, with the .tmp file open (default), or with ckpt_where=start before
 * anything is checked.  With ckpt_fail_step=<step> the write of that step fails half-way
 * on rank ckpt_fail_rank (default 0): TSR_ERR, as a failing dataset write (the caller
 * still takes part in the collective write, then fails). */
static int fault_ckpt(int64_t step, const char *where, const char *tmp) {
  const double secs = atof(tsr_fault_str("ckpt_sleep", "0"));
  const long long at = tsr_fault_int("ckpt_step", -1);
  if (secs > 0 && (at < 0 || at == step) && !strcmp(tsr_fault_str("ckpt_where", "half"), where)) {
    tsr_log("fault injection: sleeping %g s %s writing %s", secs,
            strcmp(where, "start") ? "half-way through" : "before", tmp);
    fflush(stdout);
    fflush(stderr);
    usleep((useconds_t)(secs * 1e6));
  }
  if (strcmp(where, "half") || tsr_fault_int("ckpt_fail_step", -1) != step ||
      tsr_rank() != tsr_fault_int("ckpt_fail_rank", 0))
    return 0;
  tsr_error("fault injection: failing the write of %s", tmp);
  return TSR_ERR;
}

static int write_tensor(hid_t group, const tsr_tensor *t, const piece *p, const float *src,
                        uint64_t checksum, hid_t dxpl) {
  int rc = 0;
  hid_t fspace = -1, mspace = -1, dcpl = -1, d = -1;
  hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
  hsize_t n = (hsize_t)(p->i1 - p->i0);
  hsize_t n1 = n ? n : 1;
  TSR_H5_GOTO(fspace = H5Screate_simple(t->ndim, dims, NULL));
  TSR_H5_GOTO(dcpl = H5Pcreate(H5P_DATASET_CREATE));
  TSR_H5_GOTO(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  TSR_H5_GOTO(d = H5Dcreate2(group, t->name, H5T_IEEE_F32LE, fspace, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  TSR_H5_GOTO(select_piece(fspace, p));
  TSR_H5_GOTO(mspace = H5Screate_simple(1, &n1, NULL));
  if (!n) TSR_H5_GOTO(H5Sselect_none(mspace));
  TSR_H5_GOTO(H5Dwrite(d, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, src));
  TSR_H5_GOTO(attr_put(d, "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, &checksum));
done:
  CLOSE(H5Sclose, mspace);
  CLOSE(H5Sclose, fspace);
  CLOSE(H5Pclose, dcpl);
  if (d >= 0 && H5Dclose(d) < 0 && !rc)
    rc = tsr_ckpt_h5_fail(__FILE__, __LINE__, __func__, "H5Dclose", errno);
  return rc;
}

static int write_root_attrs(hid_t file, const tsr_config *cfg, const tsr_train_state *st,
                            const char *deck, int world) {
  int rc = 0;
  const tsr_model_config *mc = &cfg->model;
  int64_t tp = cfg->parallel.tp > 0 ? cfg->parallel.tp : 1;
  int64_t pp = cfg->parallel.pp > 0 ? cfg->parallel.pp : 1;
  char layout[160];
  snprintf(layout, sizeof layout, "world=%d tp=%lld pp=%lld dp=%lld zero=%lld", world,
           (long long)tp, (long long)pp, (long long)(world / (tp * pp)),
           (long long)cfg->parallel.zero_stage);
  TSR_H5_GOTO(attr_put_i64(file, "format_version", TSR_CKPT_FORMAT_VERSION));
  TSR_H5_GOTO(attr_put_i64(file, "step", st->step));
  TSR_H5_GOTO(attr_put_i64(file, "tokens", st->tokens));
  TSR_H5_GOTO(attr_put_i64(file, "data_cursor", st->data_cursor));
  TSR_H5_GOTO(attr_put_i64(file, "skipped", st->skipped));
  TSR_H5_GOTO(attr_put(file, "loss_scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &st->loss_scale));
  TSR_H5_GOTO(attr_put_i64(file, "loss_scale_good_steps", st->scale_good_steps));
  TSR_H5_GOTO(attr_put(file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &st->seed));
  TSR_H5_GOTO(attr_put_str(file, "deck", deck));
  if (st->tokenizer[0]) TSR_H5_GOTO(attr_put_str(file, "tokenizer", st->tokenizer));
  if (st->data_mix[0]) TSR_H5_GOTO(attr_put_str(file, "data_mix", st->data_mix));
  TSR_H5_GOTO(attr_put_str(file, "layout", layout));
  TSR_H5_GOTO(attr_put_str(file, "arch", tsr_deck_word(cfg, &mc->arch)));
  const struct {
    const char *name;
    int64_t value;
  } dims[] = {{"n_layer", mc->n_layer}, {"d_model", mc->d_model},
              {"n_head", mc->n_head},   {"n_kv_head", mc->n_kv_head},
              {"d_ff", mc->d_ff},       {"vocab_size", mc->vocab_size},
              {"seq_len", mc->seq_len}, {"tie_embeddings", mc->tie_embeddings},
              {"max_positions", tsr_max_positions(mc)}};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    TSR_H5_GOTO(attr_put_i64(file, dims[i].name, dims[i].value));
done:
  return rc;
}

/* Collective: /tokenizer/<name> for each of the tokenizer files of st (every rank has
 * them, bcast_tokenizer), the bytes written by rank 0 alone. */
static int write_tokenizer(hid_t file, const tsr_train_state *st, hid_t dxpl, int rank) {
  int rc = 0;
  hid_t g = -1, fspace = -1, mspace = -1, d = -1;
  if (!st->n_tokenizer_files) return 0;
  TSR_H5_GOTO(g = H5Gcreate2(file, "/tokenizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  for (int i = 0; i < st->n_tokenizer_files; i++) {
    const tsr_tokenizer_file *f = &st->tokenizer_files[i];
    hsize_t n = (hsize_t)f->len, one = 1;
    TSR_H5_GOTO(fspace = H5Screate_simple(1, &n, NULL));
    TSR_H5_GOTO(d = H5Dcreate2(g, f->name, H5T_STD_U8LE, fspace, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT));
    TSR_H5_GOTO(mspace = H5Screate_simple(1, rank == 0 && n ? &n : &one, NULL));
    if (rank != 0 || !n) {
      TSR_H5_GOTO(H5Sselect_none(fspace));
      TSR_H5_GOTO(H5Sselect_none(mspace));
    }
    const unsigned char none = 0;
    TSR_H5_GOTO(H5Dwrite(d, H5T_NATIVE_UCHAR, mspace, fspace, dxpl,
                         rank == 0 && n ? f->bytes : &none));
    CLOSE(H5Dclose, d);
    CLOSE(H5Sclose, mspace);
    CLOSE(H5Sclose, fspace);
  }
done:
  CLOSE(H5Dclose, d);
  CLOSE(H5Sclose, mspace);
  CLOSE(H5Sclose, fspace);
  CLOSE(H5Gclose, g);
  return rc;
}

/* Rank 0's tokenizer files (st_in's) to every rank: st->tokenizer_files points at rank
 * 0's own array there and at *copy (the caller frees it) on the others. */
static int bcast_tokenizer(tsr_train_state *st, const tsr_train_state *st_in,
                           tsr_tokenizer_file **copy, MPI_Comm comm) {
  int rank, rc = 0;
  MPI_Comm_rank(comm, &rank);
  *copy = NULL;
  int n = rank == 0 ? st_in->n_tokenizer_files : 0;
  MPI_Bcast(&n, 1, MPI_INT, 0, comm);
  st->n_tokenizer_files = n;
  st->tokenizer_files = rank == 0 ? st_in->tokenizer_files : NULL;
  if (!n) return 0;
  if (rank != 0 && !(*copy = tsr_calloc((size_t)n, sizeof **copy))) rc = TSR_ERR;
  if ((rc = tsr_ckpt_agree(rc, comm))) return rc;
  for (int i = 0; i < n && !rc; i++) {
    /* rank 0 sends from its own file, the others receive into their copy */
    tsr_tokenizer_file *f = rank == 0 ? (tsr_tokenizer_file *)&st_in->tokenizer_files[i]
                                      : &(*copy)[i];
    long long len = (long long)f->len;
    MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, comm);
    MPI_Bcast(f->name, sizeof f->name, MPI_CHAR, 0, comm);
    if (len > INT_MAX) {
      if (rank == 0) tsr_error("checkpoint: the tokenizer file %s (%lld bytes) is too large",
                               f->name, len);
      rc = TSR_ERR;
      break;
    }
    if (rank != 0) {
      f->len = (size_t)len;
      f->bytes = tsr_calloc((size_t)len + 1, 1);
    }
    rc = tsr_ckpt_agree(f->bytes ? 0 : TSR_ERR, comm);
    if (!rc) MPI_Bcast(f->bytes, (int)len, MPI_BYTE, 0, comm);
  }
  if (rank != 0) st->tokenizer_files = *copy;
  return rc;
}

static int create_groups(hid_t file, hid_t groups[3], hid_t *optim, hid_t *dxpl) {
  int rc = 0;
  TSR_H5_GOTO(groups[0] = H5Gcreate2(file, "/model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  TSR_H5_GOTO(*optim = H5Gcreate2(file, "/optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  TSR_H5_GOTO(groups[1] = H5Gcreate2(*optim, "m", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  TSR_H5_GOTO(groups[2] = H5Gcreate2(*optim, "v", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  TSR_H5_GOTO(*dxpl = H5Pcreate(H5P_DATASET_XFER));
  TSR_H5_GOTO(H5Pset_dxpl_mpio(*dxpl, H5FD_MPIO_COLLECTIVE));
done:
  return rc;
}

/* Collective: create `tmp`, write every tensor's pieces and the attributes, close.
 * `whole` is the model's full tensor list (every rank creates every dataset); `local[i]`
 * the view's tensor this rank writes of logical tensor i, or NULL. */
static int write_file(const char *tmp, const tsr_config *cfg, const tsr_layout *whole,
                      const tsr_ckpt_view *view, const tsr_tensor *const *local,
                      const float *const bufs[3], const float *zeros, const tsr_train_state *st,
                      const char *deck, MPI_Comm comm, double phase[3]) {
  int rc = 0, rank, world;
  hid_t fapl = -1, file = -1, dxpl = -1, groups[3] = {-1, -1, -1}, optim = -1;
  const int nt = whole->n_tensors;
  uint64_t *sums = tsr_calloc((size_t)(3 * nt), sizeof *sums);
  int64_t *counted = tsr_calloc((size_t)nt, sizeof *counted);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  if (!sums || !counted) rc = TSR_ERR;
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  /* Checksums and element counts first: one all-reduce each for the whole file. */
  for (int i = 0; i < nt; i++) {
    piece p = view_piece(view, local[i]);
    if (!p.t) continue;
    counted[i] = p.i1 - p.i0;
    for (int k = 0; k < 3; k++)
      sums[k * nt + i] = piece_checksum(&p, bufs[k] ? bufs[k] + piece_at(view, &p) : zeros);
  }
  TSR_MPI_GOTO(MPI_Allreduce(MPI_IN_PLACE, sums, 3 * nt, MPI_UINT64_T, MPI_SUM, comm));
  TSR_MPI_GOTO(MPI_Allreduce(MPI_IN_PLACE, counted, nt, MPI_INT64_T, MPI_SUM, comm));
  if ((rc = check_coverage(whole, counted, "would write", rank == 0))) goto done;
  phase[0] = MPI_Wtime();

  /* Every phase ends in tsr_ckpt_agree(), so no rank enters a collective call the others skip. */
  if ((fapl = open_fapl_hints(comm, &cfg->checkpoint)) < 0)
    rc = tsr_ckpt_h5_fail(__FILE__, __LINE__, __func__, "open_fapl (checkpoint.mpiio_hints, alignment)", 0);
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  errno = 0;
  file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file < 0) rc = tsr_ckpt_h5_fail(__FILE__, __LINE__, __func__, "H5Fcreate", errno);
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  if (rank == 0) log_hints(file, cfg->checkpoint.mpiio_hints);
  if ((rc = tsr_ckpt_agree(write_root_attrs(file, cfg, st, deck, world), comm))) goto done;
  if ((rc = tsr_ckpt_agree(create_groups(file, groups, &optim, &dxpl), comm))) goto done;
  if ((rc = tsr_ckpt_agree(write_tokenizer(file, st, dxpl, rank), comm))) goto done;
  for (int i = 0; i < nt && !rc; i++)
    for (int k = 0; k < 3 && !rc; k++) {
      const tsr_tensor *t = &whole->tensors[i];
      piece p = view_piece(view, local[i]);
      const float *src = !p.t ? zeros : bufs[k] ? bufs[k] + piece_at(view, &p) : zeros;
      const int fault = i == nt / 2 && k == 0 ? fault_ckpt(st->step, "half", tmp) : 0;
      rc = write_tensor(groups[k], t, &p, src, sums[k * nt + i], dxpl); /* collective */
      if (!rc) rc = fault;
      if (rc) tsr_error("cannot write %s/%s to '%s'", kCkptGroups[k], t->name, tmp);
      rc = tsr_ckpt_agree(rc, comm);
    }
  if (!rc) rc = tsr_ckpt_agree(attr_put_i64(file, "complete", 1) < 0 ? TSR_ERR : 0, comm);
  phase[1] = MPI_Wtime();
done:
  tsr_free(&sums);
  tsr_free(&counted);
  for (int k = 0; k < 3; k++) CLOSE(H5Gclose, groups[k]);
  CLOSE(H5Gclose, optim);
  CLOSE(H5Pclose, dxpl);
  CLOSE(H5Pclose, fapl);
  if (file >= 0 && rc) {
    /* A failed write (full file system, quota) left some ranks unable to write while others
     * could; the collective close then flushes metadata and truncates, and a rank that fails
     * there leaves the others waiting in another collective.  The file is being discarded:
     * give its space back first so that the close completes on every rank. */
    if (rank == 0 && truncate(tmp, 0) != 0)
      tsr_warn("cannot truncate the failed checkpoint '%s': %s", tmp, strerror(errno));
    MPI_Barrier(comm);
  }
  if (file >= 0) {
    errno = 0;
    if (H5Fclose(file) < 0 && !rc) rc = tsr_ckpt_h5_fail(__FILE__, __LINE__, __func__, "H5Fclose", errno);
  }
  rc = tsr_ckpt_agree(rc, comm);
  phase[2] = MPI_Wtime();
  return rc;
}

/* The soft file-size limit (ulimit -f) of this process in bytes, or -1 for none. */
static double file_size_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return -1;
  return (double)rl.rlim_cur;
}

/* A checkpoint larger than the file-size limit would fail half-way with EFBIG, and HDF5
 * cannot close such a file cleanly; refuse before creating it.  The size counted is a
 * lower bound: the data (master, m, v in fp32) and the deck, without HDF5's metadata.
 * Collective: limits are per process, so the smallest one on any rank decides, and the
 * message names the rank that has it. */
static int check_file_size_limit(const tsr_layout *whole, int deck_len, const char *dir,
                                 MPI_Comm comm) {
  const double mine = file_size_limit();
  int rc = 0, rank;
  MPI_Comm_rank(comm, &rank);
  struct {
    double limit;
    int rank;
  } low = {mine < 0 ? 1e300 : mine, rank};
  TSR_MPI_GOTO(MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_DOUBLE_INT, MPI_MINLOC, comm));
  const double need = 12.0 * (double)whole->n_params + deck_len;
  if (need <= low.limit) return 0;
  if (rank == 0)
    tsr_error("a checkpoint of this model needs at least %.1f MB but rank %d may not write "
              "files over %.1f MB (its file-size limit, ulimit -f); raise the limit for the "
              "job (nothing was written to '%s')",
              need / 1e6, low.rank, low.limit / 1e6, dir);
  return TSR_ERR;
done:
  return rc;
}

/* Rank 0: nothing but files where the run writes checkpoints, their .tmp and `latest`: a
 * directory (or a socket, ...) at such a name fails every write of it, on every attempt
 * of a requeued job.  TSR_ERR_INPUT naming the first. */
static int names_free(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0; /* the probe above found the directory usable */
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d)) != NULL) {
    const char *nm = e->d_name;
    const size_t n = strlen(nm);
    const int tmp = !strcmp(nm, "latest.tmp") ||
                    (!strncmp(nm, "step_", 5) && n > 7 && !strcmp(nm + n - 7, ".h5.tmp"));
    const int ours = tmp || !strcmp(nm, "latest") ||
                     (!strncmp(nm, "step_", 5) && n > 3 && !strcmp(nm + n - 3, ".h5"));
    char path[TSR_STR_PATH + 300];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, nm);
    /* a final name is renamed over, which replaces a file or a link, not a directory; a
     * .tmp is created through, so it must be a file (a link would be followed) */
    if (ours && lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && (tmp || !S_ISLNK(sb.st_mode))) {
      tsr_error("'%s' is %s, where the run writes %s: every such write would fail; move it "
                "away (found before the first step)",
                path, S_ISDIR(sb.st_mode) ? "a directory" : S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a file",
                !strncmp(nm, "latest", 6) ? "the name of its newest checkpoint" : "a checkpoint");
      rc = TSR_ERR_INPUT;
    }
  }
  closedir(d);
  return rc;
}

int tsr_ckpt_preflight(const tsr_config *cfg, size_t deck_len, MPI_Comm comm) {
  int rc = 0, rank;
  char dir[TSR_STR_PATH], probe[TSR_STR_PATH + 48];
  tsr_layout *whole = NULL;
  MPI_Comm_rank(comm, &rank);
  tsr_ckpt_dir(cfg, dir, sizeof dir);
  if (rank == 0 && tsr_ckpt_mkdir_p(dir)) rc = TSR_ERR_INPUT; /* a deck's path: bad input */
  if ((rc = tsr_ckpt_agree(rc, comm))) return rc;
  /* every rank writes its pieces: every rank must be able to create a file there */
  snprintf(probe, sizeof probe, "%s/.preflight.%d", dir, rank);
  const int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    tsr_error("checkpoint directory '%s' is not writable from this rank: %s (found before "
              "the first step; set &checkpoint dir to a directory every rank can write)",
              dir, strerror(errno));
    rc = TSR_ERR_INPUT;
  } else {
    close(fd);
    unlink(probe);
  }
  if ((rc = tsr_ckpt_agree(rc, comm))) return rc;
  if (rank == 0) rc = names_free(dir);
  if ((rc = tsr_ckpt_agree(rc, comm))) return rc;
  rc = tsr_layout_create(&whole, &cfg->model);
  if (!rc) rc = check_file_size_limit(whole, (int)deck_len, dir, comm);
  if (!rc && rank == 0) {
    /* room for the checkpoints this run will hold at once beyond those already there */
    const double size = 12.0 * (double)whole->n_params + (double)deck_len;
    tsr_ckpt_step_file *files = NULL;
    int have = 0;
    if (tsr_ckpt_list_steps(dir, &files, &have) != 0) have = 0;
    free(files);
    const int64_t keep = cfg->checkpoint.keep;
    const int64_t more = keep > 0 && keep + 1 - have > 1 ? keep + 1 - have : 1;
    struct statvfs fs;
    const double free_b = statvfs(dir, &fs) == 0 ? (double)fs.f_bavail * (double)fs.f_frsize : -1;
    if (free_b >= 0 && free_b < (double)more * size) {
      tsr_error("checkpoint directory '%s' has %.1f MB free, but this run needs %.1f MB: "
                "%lld more checkpoint(s) of %.1f MB (checkpoint.keep = %lld, %d there now, "
                "and one being written); free space, lower checkpoint.keep or set &checkpoint "
                "dir elsewhere",
                dir, free_b / 1e6, (double)more * size / 1e6, (long long)more, size / 1e6,
                (long long)keep, have);
      rc = TSR_ERR_INPUT;
    }
  }
  tsr_layout_destroy(&whole);
  return tsr_ckpt_agree(rc, comm);
}

int tsr_ckpt_save_view(const tsr_config *cfg, const tsr_ckpt_view *view, const float *master,
                       const float *m, const float *v, const tsr_train_state *st_in,
                       const char *deck_text, MPI_Comm comm) {
  int rc = 0, rank;
  tsr_ckpt_quiet q;
  char dir[TSR_STR_PATH], name[64], tmp[TSR_STR_PATH + 88] = "", final[TSR_STR_PATH + 80] = "";
  char *deck = NULL;
  float *zeros = NULL;
  tsr_layout *whole = NULL;
  const tsr_tensor **local = NULL;
  tsr_train_state st = *st_in;
  tsr_tokenizer_file *tok_copy = NULL; /* rank 0's tokenizer files, on the others */
  double t0 = MPI_Wtime();
  tsr_ckpt_quiet_begin(&q);
  MPI_Comm_rank(comm, &rank);
  tsr_ckpt_dir(cfg, dir, sizeof dir);
  /* Attribute writes are collective: every rank must pass rank 0's bytes. */
  TSR_MPI_GOTO(MPI_Bcast(&st, (int)sizeof st, MPI_BYTE, 0, comm));
  if ((rc = bcast_tokenizer(&st, st_in, &tok_copy, comm))) goto done;
  int deck_len = rank == 0 && deck_text ? (int)strlen(deck_text) : 0;
  TSR_MPI_GOTO(MPI_Bcast(&deck_len, 1, MPI_INT, 0, comm));
  /* Every rank creates every dataset: the whole model's list, from the config all share. */
  rc = check_view(view);
  if (!rc) rc = tsr_layout_create(&whole, &view->lay->model);
  if (!rc && !(local = tsr_calloc((size_t)whole->n_tensors, sizeof *local))) rc = TSR_ERR;
  if (!rc) rc = map_local(whole, view, 0, local);
  for (int i = 0; !rc && i < whole->n_tensors; i++) /* one writer among identical copies */
    if (local[i] && !tsr_layout_writes(local[i], view->copy_index, view->n_copies))
      local[i] = NULL;
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  snprintf(name, sizeof name, "step_%08lld.h5", (long long)st.step);
  snprintf(final, sizeof final, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", final);
  fault_ckpt(st.step, "start", final);
  rc = check_file_size_limit(whole, deck_len, dir, comm);
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  int64_t max_piece = 1; /* ranks with nothing, and NULL m / v, write from zeros */
  for (int i = 0; i < whole->n_tensors; i++) {
    piece p = view_piece(view, local[i]);
    if (p.i1 - p.i0 > max_piece) max_piece = p.i1 - p.i0;
  }
  deck = tsr_calloc((size_t)deck_len + 1, 1);
  zeros = tsr_calloc((size_t)max_piece, sizeof *zeros);
  if (!deck || !zeros) rc = TSR_ERR;
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  if (rank == 0 && deck_len) memcpy(deck, deck_text, (size_t)deck_len);
  TSR_MPI_GOTO(MPI_Bcast(deck, deck_len + 1, MPI_CHAR, 0, comm));

  if (rank == 0) rc = tsr_ckpt_mkdir_p(dir);
  TSR_MPI_GOTO(MPI_Bcast(&rc, 1, MPI_INT, 0, comm));
  if (rc) goto done;
  const float *const bufs[3] = {master, m, v};
  double phase[3] = {t0, t0, t0}; /* ends of: checksums, dataset writes, close */
  rc = write_file(tmp, cfg, whole, view, local, bufs, zeros, &st, deck, comm, phase);
  if (!rc) rc = tsr_ckpt_publish(dir, tmp, final, name, comm);
  if (rc) goto done;
  if (rank == 0) {
    tsr_ckpt_prune(dir, name, cfg->checkpoint.keep);
    struct stat sb;
    double mb = stat(final, &sb) == 0 ? (double)sb.st_size / 1e6 : 0.0;
    double secs = MPI_Wtime() - t0;
    tsr_log("checkpoint: wrote %s (%.1f MB) in %.2f s, %.1f MB/s (setup+checksums %.2f s, "
            "writes %.2f s, close %.2f s, verify+fsync+publish %.2f s)",
            final, mb, secs, secs > 0 ? mb / secs : 0.0, phase[0] - t0, phase[1] - phase[0],
            phase[2] - phase[1], MPI_Wtime() - phase[2]);
  }
done:
  if (rc && rank == 0) {
    if (unlink(tmp) != 0 && errno != ENOENT && errno != ENOTDIR)
      tsr_warn("cannot remove unfinished checkpoint '%s': %s", tmp, strerror(errno));
    struct statvfs fs;
    double free_mb = statvfs(dir, &fs) == 0 ? (double)fs.f_bavail * (double)fs.f_frsize / 1e6 : -1;
    char space[128] = "";
    int used = free_mb >= 0 ? snprintf(space, sizeof space, "; %.1f MB free there", free_mb) : 0;
    if (file_size_limit() >= 0 && used >= 0 && (size_t)used < sizeof space)
      snprintf(space + used, sizeof space - (size_t)used, "; file-size limit (ulimit -f) %.1f MB",
               file_size_limit() / 1e6);
    tsr_error(
        "checkpoint for step %lld was not written to '%s'; earlier checkpoints in '%s' are "
        "untouched (check free space and permissions there%s)",
        (long long)st.step, final[0] ? final : dir, dir, space);
  }
  tsr_free(&deck);
  tsr_free(&zeros);
  tsr_free(&local);
  tsr_tokenizer_files_free(&tok_copy, st.n_tokenizer_files);
  tsr_layout_destroy(&whole);
  tsr_ckpt_quiet_end(&q);
  return rc;
}

/* The whole buffer on every rank: identical copies, tensor k written by rank k mod size. */
static tsr_ckpt_view whole_view(const tsr_layout *lay, MPI_Comm comm) {
  tsr_ckpt_view view = {lay, 0, lay->n_flat, 0, 1};
  MPI_Comm_rank(comm, &view.copy_index);
  MPI_Comm_size(comm, &view.n_copies);
  return view;
}

int tsr_ckpt_save(const tsr_config *cfg, const tsr_layout *lay, const float *master, const float *m,
                  const float *v, const tsr_train_state *st, const char *deck_text,
                  MPI_Comm comm) {
  const tsr_ckpt_view view = whole_view(lay, comm);
  return tsr_ckpt_save_view(cfg, &view, master, m, v, st, deck_text, comm);
}

/* ---- load ---- */

/* Collective: this rank's piece of /gname/t->name into dst (the piece's place in the
 * view's buffer; unused when the piece is empty) and the stored checksum. */
static int read_tensor(hid_t file, const char *gname, const tsr_tensor *t, const piece *p,
                       float *dst, uint64_t *stored, hid_t dxpl) {
  int rc = 0;
  hid_t g = -1, d = -1, fspace = -1, mspace = -1;
  hsize_t n = (hsize_t)(p->i1 - p->i0), n1 = n ? n : 1;
  float dummy = 0;
  TSR_H5_GOTO(g = H5Gopen2(file, gname, H5P_DEFAULT));
  TSR_H5_GOTO(d = H5Dopen2(g, t->name, H5P_DEFAULT));
  TSR_H5_GOTO(fspace = H5Dget_space(d));
  TSR_H5_GOTO(select_piece(fspace, p));
  TSR_H5_GOTO(mspace = H5Screate_simple(1, &n1, NULL));
  if (!n) TSR_H5_GOTO(H5Sselect_none(mspace));
  TSR_H5_GOTO(H5Dread(d, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, n ? dst : &dummy));
  int e = tsr_ckpt_attr_get(d, "checksum", H5T_NATIVE_UINT64, stored);
  TSR_H5_GOTO(e);
  if (e) {
    tsr_error("checkpoint: no checksum attribute on %s/%s; the file is damaged: resume from "
              "another checkpoint", gname, t->name);
    rc = TSR_ERR_INPUT;
  }
done:
  CLOSE(H5Sclose, mspace);
  CLOSE(H5Sclose, fspace);
  CLOSE(H5Dclose, d);
  CLOSE(H5Gclose, g);
  return rc;
}

int tsr_ckpt_read_deck(const char *path, char **text, int *world, int64_t *step,
                       char tokenizer[232], MPI_Comm comm) {
  int rank, rc = 0;
  long long len = 0;
  char *deck = NULL, layout[160] = "";
  MPI_Comm_rank(comm, &rank);
  *text = NULL;
  *world = 0;
  *step = 0;
  tokenizer[0] = 0;
  if (rank == 0) {
    tsr_ckpt_quiet q;
    tsr_ckpt_quiet_begin(&q);
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
      tsr_error("checkpoint %s: cannot open it to read its deck", path);
      rc = TSR_ERR_INPUT;
    } else {
      if (tsr_ckpt_attr_str_alloc(file, "deck", &deck) != 0 ||
          tsr_ckpt_attr_str(file, "layout", layout, sizeof layout) != 0 ||
          tsr_ckpt_attr_get(file, "step", H5T_NATIVE_INT64, step) != 0 ||
          tsr_ckpt_attr_str(file, "tokenizer", tokenizer, 232) < 0) {
        tsr_error("checkpoint %s: cannot read the deck it was written with", path);
        rc = TSR_ERR_INPUT;
      }
      H5Fclose(file);
      len = deck ? (long long)strlen(deck) : 0;
      const char *w = strstr(layout, "world=");
      if (w) *world = atoi(w + 6);
    }
    tsr_ckpt_quiet_end(&q);
    if (rc) len = 0;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, comm);
  MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, comm);
  MPI_Bcast(world, 1, MPI_INT, 0, comm);
  MPI_Bcast(step, 1, MPI_INT64_T, 0, comm);
  MPI_Bcast(tokenizer, 232, MPI_CHAR, 0, comm);
  if (rc) {
    tsr_free(&deck);
    return rc;
  }
  if (rank != 0 && !(deck = tsr_calloc((size_t)len + 1, 1))) rc = TSR_ERR;
  if ((rc = tsr_ckpt_agree(rc, comm))) {
    tsr_free(&deck);
    return rc;
  }
  MPI_Bcast(deck, (int)len + 1, MPI_CHAR, 0, comm);
  *text = deck;
  return 0;
}

/* /tokenizer/<name> of an open file into f (name, tsr_calloc'd bytes). */
static int read_tokenizer_file(hid_t g, const char *name, tsr_tokenizer_file *f) {
  int rc = 0;
  hid_t d = -1, space = -1;
  snprintf(f->name, sizeof f->name, "%s", name);
  TSR_H5_GOTO(d = H5Dopen2(g, name, H5P_DEFAULT));
  TSR_H5_GOTO(space = H5Dget_space(d));
  hssize_t n = H5Sget_simple_extent_npoints(space);
  TSR_H5_GOTO(n);
  f->len = (size_t)n;
  if (!(f->bytes = tsr_calloc((size_t)n + 1, 1))) {
    rc = TSR_ERR;
    goto done;
  }
  if (n) TSR_H5_GOTO(H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, f->bytes));
done:
  CLOSE(H5Sclose, space);
  CLOSE(H5Dclose, d);
  return rc;
}

int tsr_ckpt_read_tokenizer(const char *path, char name[232], tsr_tokenizer_file **files,
                            int *n) {
  int rc = 0;
  hid_t file = -1, g = -1;
  tsr_ckpt_quiet q;
  name[0] = 0;
  *files = NULL;
  *n = 0;
  tsr_ckpt_quiet_begin(&q);
  file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0 || tsr_ckpt_attr_str(file, "tokenizer", name, 232) < 0) {
    tsr_error("checkpoint %s: cannot open it to read its tokenizer", path);
    rc = TSR_ERR_INPUT;
    goto done;
  }
  if (H5Lexists(file, "tokenizer", H5P_DEFAULT) <= 0) goto done; /* none carried */
  H5G_info_t info;
  TSR_H5_GOTO(g = H5Gopen2(file, "tokenizer", H5P_DEFAULT));
  TSR_H5_GOTO(H5Gget_info(g, &info));
  if (!info.nlinks) goto done;
  if (!(*files = tsr_calloc((size_t)info.nlinks, sizeof **files))) {
    rc = TSR_ERR;
    goto done;
  }
  for (hsize_t i = 0; i < info.nlinks && !rc; i++) {
    char link[256];
    ssize_t len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, link, sizeof link,
                                     H5P_DEFAULT);
    TSR_H5_GOTO(len);
    if ((size_t)len >= sizeof link) continue; /* not a name tessera writes */
    rc = read_tokenizer_file(g, link, &(*files)[*n]);
    if (!rc) (*n)++;
  }
  if (rc) tsr_error("checkpoint %s: cannot read the tokenizer files it carries", path);
done:
  CLOSE(H5Gclose, g);
  CLOSE(H5Fclose, file);
  if (rc) {
    tsr_tokenizer_files_free(files, *n + 1);
    *n = 0;
  }
  tsr_ckpt_quiet_end(&q);
  return rc;
}

static int read_state(hid_t file, const char *path, tsr_train_state *st) {
  static const char *const name[] = TSR_CKPT_STATE_ATTRS; /* verification requires them */
  const struct {
    hid_t type;
    void *dst;
  } f[] = {{H5T_NATIVE_INT64, &st->step},    {H5T_NATIVE_INT64, &st->tokens},
           {H5T_NATIVE_INT64, &st->data_cursor}, {H5T_NATIVE_INT64, &st->skipped},
           {H5T_NATIVE_DOUBLE, &st->loss_scale}, {H5T_NATIVE_UINT64, &st->seed}};
  _Static_assert(sizeof f / sizeof f[0] == sizeof name / sizeof name[0], "state attributes");
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    int e = tsr_ckpt_attr_get(file, name[i], f[i].type, f[i].dst);
    if (e) {
      tsr_error("checkpoint %s: %s the root attribute '%s'", path, e > 0 ? "lacks" : "cannot read",
                name[i]);
      return TSR_ERR_INPUT;
    }
  }
  /* written since checkpoints name their tokenizer; "" (unknown) before */
  st->tokenizer[0] = 0;
  if (tsr_ckpt_attr_str(file, "tokenizer", st->tokenizer, sizeof st->tokenizer) < 0) {
    tsr_error("checkpoint %s: cannot read the root attribute 'tokenizer'", path);
    return TSR_ERR_INPUT;
  }
  /* written by the runs on a mixture of datasets */
  st->data_mix[0] = 0;
  if (tsr_ckpt_attr_str(file, "data_mix", st->data_mix, sizeof st->data_mix) < 0) {
    tsr_error("checkpoint %s: cannot read the root attribute 'data_mix'", path);
    return TSR_ERR_INPUT;
  }
  /* written since fp16 training; older checkpoints come from fp32 / bf16 runs */
  if (tsr_ckpt_attr_get(file, "loss_scale_good_steps", H5T_NATIVE_INT64, &st->scale_good_steps))
    st->scale_good_steps = -1;
  return 0;
}

int tsr_ckpt_load_view(const char *path, const tsr_checkpoint_config *cc,
                       const tsr_ckpt_view *view, float *master, float *m, float *v,
                       tsr_train_state *st, MPI_Comm comm) {
  int rc = 0, rank;
  tsr_ckpt_quiet q;
  hid_t fapl = -1, file = -1, dxpl = -1;
  float *bufs[3] = {master, m, v};
  char why[1024];
  tsr_layout *whole = NULL;
  const tsr_tensor **local = NULL;
  uint64_t *sums = NULL, *stored = NULL;
  int64_t *counted = NULL;
  double t0 = MPI_Wtime();
  tsr_ckpt_quiet_begin(&q);
  MPI_Comm_rank(comm, &rank);
  /* Every phase ends in tsr_ckpt_agree(), so no rank enters a collective call the others skip. */
  rc = check_view(view);
  if (!rc) rc = tsr_layout_create(&whole, &view->lay->model);
  const int nt = whole ? whole->n_tensors : 0;
  if (!rc && (!(local = tsr_calloc((size_t)nt, sizeof *local)) ||
              !(sums = tsr_calloc((size_t)(3 * nt), sizeof *sums)) ||
              !(stored = tsr_calloc((size_t)(3 * nt), sizeof *stored)) ||
              !(counted = tsr_calloc((size_t)nt, sizeof *counted))))
    rc = TSR_ERR;
  if (!rc) rc = map_local(whole, view, 1, local); /* tied copies are read too */
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  fapl = open_fapl_hints(comm, cc); /* the hints apply to reads too */
  dxpl = H5Pcreate(H5P_DATASET_XFER);
  if (fapl < 0 || dxpl < 0 || H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0)
    rc = tsr_ckpt_h5_fail(__FILE__, __LINE__, __func__, "creating property lists", 0);
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (file < 0) {
    char h5m[768];
    tsr_ckpt_h5_describe(h5m, sizeof h5m);
    if (rank == 0) tsr_error("cannot open checkpoint %s: %s; check &checkpoint resume", path, h5m);
    rc = TSR_ERR_INPUT;
  }
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  if (rank == 0 && cc) log_hints(file, cc->mpiio_hints);
  rc = tsr_ckpt_check_header(file, why, sizeof why);
  if (rc && rank == 0) tsr_error("checkpoint %s: %s", path, why);
  if (!rc) rc = tsr_ckpt_check_structure(file, path, whole, (m || v) ? 3 : 1, rank == 0, NULL, 0);
  if ((rc = tsr_ckpt_agree(rc, comm))) goto done;
  /* Each rank reads what it holds; each element is counted for the checksum by one reader,
   * the one that would write it under this view. */
  for (int i = 0; i < nt && !rc; i++) {
    piece p = view_piece(view, local[i]);
    const int counts = p.t && tsr_layout_writes(p.t, view->copy_index, view->n_copies);
    if (counts) counted[i] = p.i1 - p.i0;
    for (int k = 0; k < 3 && !rc; k++) {
      if (!bufs[k]) continue;
      float *dst = p.t ? bufs[k] + piece_at(view, &p) : NULL;
      rc = read_tensor(file, kCkptGroups[k], &whole->tensors[i], &p, dst, &stored[k * nt + i], dxpl);
      if (rc) tsr_error("checkpoint %s: cannot read %s/%s", path, kCkptGroups[k], whole->tensors[i].name);
      if (!rc && counts) sums[k * nt + i] = piece_checksum(&p, dst);
      rc = tsr_ckpt_agree(rc, comm);
    }
  }
  if (rc) goto done;
  TSR_MPI_GOTO(MPI_Allreduce(MPI_IN_PLACE, sums, 3 * nt, MPI_UINT64_T, MPI_SUM, comm));
  TSR_MPI_GOTO(MPI_Allreduce(MPI_IN_PLACE, counted, nt, MPI_INT64_T, MPI_SUM, comm));
  rc = check_coverage(whole, counted, "would check", rank == 0);
  for (int k = 0, bad = 0; k < 3 && !rc; k++)
    for (int i = 0; i < nt && bufs[k]; i++) {
      if (sums[k * nt + i] == stored[k * nt + i]) continue;
      if (rank == 0 && bad++ < 5)
        tsr_error("checkpoint %s: checksum mismatch in %s/%s; the file is damaged: resume from "
                  "another checkpoint", path, kCkptGroups[k], whole->tensors[i].name);
      rc = TSR_ERR_INPUT;
    }
  if (!rc && st) rc = tsr_ckpt_agree(read_state(file, path, st), comm);
  if (!rc) tsr_log("checkpoint: loaded %s in %.2f s", path, MPI_Wtime() - t0);
done:
  CLOSE(H5Pclose, dxpl);
  CLOSE(H5Pclose, fapl);
  if (file >= 0 && H5Fclose(file) < 0 && !rc) rc = TSR_ERR;
  tsr_free(&local);
  tsr_free(&sums);
  tsr_free(&stored);
  tsr_free(&counted);
  tsr_layout_destroy(&whole);
  tsr_ckpt_quiet_end(&q);
  return tsr_ckpt_agree(rc, comm);
}

int tsr_ckpt_load(const char *path, const tsr_layout *lay, float *master, float *m, float *v,
                  tsr_train_state *st, MPI_Comm comm) {
  const tsr_ckpt_view view = whole_view(lay, comm);
  return tsr_ckpt_load_view(path, NULL, &view, master, m, v, st, comm);
}
