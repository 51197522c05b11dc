/* ckpt_internal.h — what ckpt.c (pieces, save, load) and ckpt_files.c (error reports,
 * files and directories, verification, resolve, publish) share.  Not part of the API. */
#ifndef TSR_CKPT_INTERNAL_H
#define TSR_CKPT_INTERNAL_H

#include <errno.h>
#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define CKPT_GOLDEN 0x9E3779B97F4A7C15ULL
/* The training state at the root of every checkpoint, in this order: read by ckpt.c's
 * read_state, required by the verification of a file (tsr_ckpt_check_header). */
#define TSR_CKPT_STATE_ATTRS {"step", "tokens", "data_cursor", "skipped", "loss_scale", "seed"}
#define CKPT_READ_BLOCK (1 << 22) /* elements per read when verifying a file on one rank */

/* ---- error reports: every HDF5 / MPI call goes through one of the macros below ---- */

/* The HDF5 error stack as "outermost: innermost cause" (the cause is what helps). */
void tsr_ckpt_h5_describe(char *buf, size_t len);
int tsr_ckpt_h5_fail(const char *file, int line, const char *func, const char *expr, int err);
int tsr_ckpt_mpi_fail(const char *file, int line, const char *func, const char *expr, int code);

/* The checkpoint code's members of util.h's check-macro family: they need `int rc` and a
 * `done:` label that releases what the function holds, and jump there on failure. */
#define TSR_H5_GOTO(expr)                                           \
  do {                                                          \
    errno = 0;                                                  \
    if ((expr) < 0) {                                           \
      rc = tsr_ckpt_h5_fail(__FILE__, __LINE__, __func__, #expr, errno); \
      goto done;                                                \
    }                                                           \
  } while (0)

#define TSR_MPI_GOTO(expr)                                             \
  do {                                                             \
    int mpi_rc_ = (expr);                                          \
    if (mpi_rc_ != MPI_SUCCESS) {                                  \
      rc = tsr_ckpt_mpi_fail(__FILE__, __LINE__, __func__, #expr, mpi_rc_); \
      goto done;                                                   \
    }                                                              \
  } while (0)

/* Quiet variant for probing files that may be broken: the reason goes to `why`. */
#define TSR_H5_TRY(expr, ...)                                   \
  do {                                                      \
    if ((expr) < 0) {                                       \
      char h5m_[768], what_[512];                           \
      tsr_ckpt_h5_describe(h5m_, sizeof h5m_);                       \
      snprintf(what_, sizeof what_, __VA_ARGS__);           \
      if (snprintf(why, why_len, "%s (HDF5: %s)", what_, h5m_) >= (int)why_len) \
        why[why_len - 1] = 0; /* truncated diagnostics are fine */ \
      rc = TSR_ERR_INPUT;                                   \
      goto done;                                            \
    }                                                       \
  } while (0)

#define CLOSE(fn, h)     \
  do {                   \
    if ((h) >= 0) fn(h); \
    (h) = -1;            \
  } while (0)

/* We print our own messages; HDF5's automatic stack dumps are off meanwhile. */
typedef struct {
  H5E_auto2_t fn;
  void *data;
} tsr_ckpt_quiet;
void tsr_ckpt_quiet_begin(tsr_ckpt_quiet *q);
void tsr_ckpt_quiet_end(const tsr_ckpt_quiet *q);

/* All ranks leave a phase with the same verdict. */
int tsr_ckpt_agree(int rc, MPI_Comm comm);

/* Checksum of n consecutive elements starting at logical index first_index (ckpt.c). */
uint64_t tsr_ckpt_checksum_run(const float *x, int64_t n, int64_t first_index);

/* Select rows [r, r+nr) x cols [c, c+nc) of a dataspace, replacing the selection when
 * `first`, else adding to it; on a 1-D space only the rows count (c = 0, nc = 1). */
herr_t tsr_ckpt_select_rect(hid_t space, int64_t r, int64_t c, int64_t nr, int64_t nc, int first);

/* Scalar attribute read with conversion to mem_type; 1 = absent, -1 = error. */
int tsr_ckpt_attr_get(hid_t obj, const char *name, hid_t mem_type, void *val);
/* format_version and complete, the two things that make a file usable at all. */
/* A string attribute into buf (truncated to len - 1): 0, 1 when absent, -1 on error. */
int tsr_ckpt_attr_str(hid_t obj, const char *name, char *buf, size_t len);
/* The same into *out, tsr_calloc'ed at the attribute's length (NULL unless 0 is returned). */
int tsr_ckpt_attr_str_alloc(hid_t obj, const char *name, char **out);
/* The checkpoint's groups: /model, /optim/m, /optim/v. */
extern const char *const kCkptGroups[3];
/* Collective-safe (no communication; the same verdict wherever it runs): the first
 * `groups` groups hold every tensor of lay in its logical shape, and nothing else.  loud:
 * name the first problems as errors (and a summary); why (may be NULL): the first problem
 * in a few words. */
int tsr_ckpt_check_structure(hid_t file, const char *path, const tsr_layout *lay, int groups,
                             int loud, char *why, size_t why_len);
int tsr_ckpt_check_header(hid_t file, char *why, size_t why_len);

/* ---- files ---- */
typedef struct {
  int64_t step;
  char name[64];
} tsr_ckpt_step_file;
int tsr_ckpt_mkdir_p(const char *dir);
int tsr_ckpt_fsync_path(const char *path, int is_dir);
/* step_*.h5 files of dir, newest first. */
int tsr_ckpt_list_steps(const char *dir, tsr_ckpt_step_file **out, int *n);
/* Open with the plain driver and check header, shapes and checksums (model_only: /model
 * alone) of the datasets of share `share` of `n_shares` (every n_shares-th, counted over the
 * groups in order).  0, or TSR_ERR_INPUT with the reason in why.  Not collective. */
int tsr_ckpt_verify_file(const char *path, int model_only, int share, int n_shares, char *why,
                         size_t why_len);
/* Ranks that verify a checkpoint (after a save, before a resume) share its datasets. */
#define TSR_CKPT_VERIFIERS 8
/* Longest checkpoint file name (step files; what `latest` names), with its NUL. */
#define TSR_CKPT_NAME 256
/* Collective, after the collective close: verify, make durable, rename, point `latest`. */
int tsr_ckpt_publish(const char *dir, const char *tmp, const char *final, const char *name,
                     MPI_Comm comm);
/* Delete the oldest step files beyond `keep` (0: keep all); never `name`. */
void tsr_ckpt_prune(const char *dir, const char *name, int64_t keep);

#endif
