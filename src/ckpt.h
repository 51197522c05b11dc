/* ckpt.h — checkpoints: one HDF5 file per checkpoint, written through the MPI-IO driver.
 *
 * File layout (DESIGN.md): /model/<tensor name> fp32 master weights in the logical
 * shape, /optim/m/<name>, /optim/v/<name>; root attributes step, tokens, data cursor,
 * seed, skipped steps, loss scale, effective deck, layout, format version, and one
 * checksum attribute per dataset (SHARDING.md §5).  Written as step_NNNNNNNN.h5.tmp,
 * closed, verified, renamed; `latest` (a text file naming the newest) is replaced
 * atomically; only the newest `keep` are kept. */
#ifndef TSR_CKPT_H
#define TSR_CKPT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "layout.h"

#define TSR_CKPT_FORMAT_VERSION 1

typedef struct {
  int64_t step;        /* optimizer updates done */
  int64_t tokens;      /* training tokens consumed */
  int64_t data_cursor; /* global samples consumed (layout-independent) */
  int64_t skipped;     /* non-finite steps skipped so far */
  double loss_scale;   /* fp16 dynamic loss scale (1 otherwise) */
  uint64_t seed;       /* run.seed: init and shuffle keys */
} tsr_train_state;

/* The directory checkpoints go to: checkpoint.dir, or <out_dir>/ckpt. */
void tsr_ckpt_dir(const tsr_config *cfg, char *dir, size_t len);

/* Write the checkpoint for st->step.  master, m, v are the flat buffers of `lay`
 * (m and v may be NULL for step 0: written as zeros).  deck_text is the effective
 * deck.  Collective over comm.  On failure every earlier checkpoint is untouched. */
int tsr_ckpt_save(const tsr_config *cfg, const tsr_layout *lay, const float *master,
                  const float *m, const float *v, const tsr_train_state *st,
                  const char *deck_text, MPI_Comm comm);

/* Resolve checkpoint.resume: "none" -> path[0] = 0; "auto" -> newest complete and
 * verified checkpoint in the directory (falling back past bad ones with a warning),
 * or "" if there is none; otherwise the given path (must exist).  Collective. */
int tsr_ckpt_resolve(const tsr_config *cfg, char *path, size_t len, MPI_Comm comm);

/* Read the checkpoint into the flat buffers; checks every tensor's shape against
 * `lay` (a mismatch names the tensor and both shapes, TSR_ERR_INPUT) and verifies
 * checksums.  Collective. */
int tsr_ckpt_load(const char *path, const tsr_layout *lay, float *master, float *m, float *v,
                  tsr_train_state *st, MPI_Comm comm);

#endif
