/* ckpt.h — checkpoints: one HDF5 file per checkpoint, written through the MPI-IO driver.
 *
 * File layout (docs/formats.md "Checkpoint files"): /model/<tensor name> fp32 master weights in the logical
 * shape, /optim/m/<name>, /optim/v/<name>, /tokenizer/<file> the tokenizer's files (bytes);
 * root attributes step, tokens, data cursor, seed, skipped steps, loss scale, a mixture's
 * blend state, effective deck, tokenizer, layout, format version, and one checksum
 * attribute per dataset (docs/formats.md "Checksums").  Written as step_NNNNNNNN.h5.tmp,
 * closed, verified, renamed; `latest` (a text file naming the newest) is replaced
 * atomically; only the newest `keep` are kept.
 *
 * Every rank writes and reads only its own pieces (docs/sharding.md "Checkpoint pieces"), described by a
 * tsr_ckpt_view: its (stage, tp rank) layout and the ZeRO shard of that layout's flat
 * buffer it holds.  A file written under one layout loads under any other. */
#ifndef TSR_CKPT_H
#define TSR_CKPT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "data/tokenizer.h"
#include "model/layout.h"

#define TSR_CKPT_FORMAT_VERSION 1

typedef struct {
  int64_t step;        /* optimizer updates done */
  int64_t tokens;      /* training tokens consumed */
  int64_t data_cursor; /* global samples consumed (layout-independent) */
  int64_t skipped;     /* non-finite steps skipped so far */
  double loss_scale;   /* fp16 dynamic loss scale (1 otherwise) */
  int64_t scale_good_steps; /* fp16: steps since the scale last changed; -1: not an fp16 run */
  uint64_t seed;       /* run.seed: init and shuffle keys */
  char tokenizer[232]; /* the training data's tokenizer ("bytes", "spm:NAME", "hf:FILE"); "":
                       * unknown */
  /* Saving: rank 0's files of that tokenizer, which the checkpoint carries in /tokenizer
   * (NULL, 0: none); they must stay valid until the write ends.  A load leaves them. */
  const tsr_tokenizer_file *tokenizer_files;
  int n_tokenizer_files;
  /* a mixture of datasets: its blend's state at data_cursor (tsr_data_mix_state's text,
   * root attribute data_mix); "": one dataset */
  char data_mix[8192];
} tsr_train_state;

/* What one rank holds.  master, m, v passed with a view hold exactly the flat range
 * [shard_begin, shard_end) of lay's buffer (the ZeRO shard; [0, n_flat) unsharded).
 * n_copies ranks hold identical copies of this shard (dp replicas at zero 0, hybrid
 * replicas), this one is copy_index.  Among all identical holders of a tensor (these
 * copies times the tensor's tp_copies) one writes it: see tsr_layout_writes. */
typedef struct {
  const tsr_layout *lay;          /* this rank's (stage, tp) layout */
  int64_t shard_begin, shard_end; /* part of lay's flat buffer held in master / m / v */
  int copy_index, n_copies;       /* identical copies of this shard among the ranks */
} tsr_ckpt_view;

/* The directory checkpoints go to: checkpoint.dir, or <out_dir>/ckpt. */
void tsr_ckpt_dir(const tsr_config *cfg, char *dir, size_t len);

/* Before the first step: the checkpoint directory exists and every rank can create a file
 * in it, no rank's file-size limit is below a checkpoint, and there is free space for the
 * checkpoints the run will hold at once (checkpoint.keep + 1 less those there now, at
 * least one; 12 bytes per parameter plus the deck).  TSR_ERR_INPUT naming the problem.
 * Collective. */
int tsr_ckpt_preflight(const tsr_config *cfg, size_t deck_len, MPI_Comm comm);

/* Write the checkpoint for st->step (rank 0's st and deck_text are stored), each rank
 * writing its view's pieces; m and v may be NULL for step 0 (written as zeros).  The
 * views of all ranks of comm must cover every logical element exactly once (checked:
 * failure otherwise).  Collective over comm.  On failure every earlier checkpoint is
 * untouched. */
int tsr_ckpt_save_view(const tsr_config *cfg, const tsr_ckpt_view *view, const float *master,
                       const float *m, const float *v, const tsr_train_state *st,
                       const char *deck_text, MPI_Comm comm);

/* Read this rank's pieces under its view (any layout, whatever wrote the file): shapes
 * checked against the model of view->lay (a mismatch names the tensor and both shapes,
 * TSR_ERR_INPUT), checksums verified with each element counted by one reader.  m and v
 * may be NULL (not read).  cc (may be NULL) gives the MPI-IO hints for the read
 * (checkpoint.mpiio_hints).  Collective over comm. */
int tsr_ckpt_load_view(const char *path, const tsr_checkpoint_config *cc,
                       const tsr_ckpt_view *view, float *master, float *m, float *v,
                       tsr_train_state *st, MPI_Comm comm);

/* The same for whole buffers: master, m, v are full flat buffers of `lay` holding the
 * same values on every rank (identical copies; tensor k is written by rank k mod size).
 * deck_text is the effective deck. */
int tsr_ckpt_save(const tsr_config *cfg, const tsr_layout *lay, const float *master,
                  const float *m, const float *v, const tsr_train_state *st,
                  const char *deck_text, MPI_Comm comm);

/* Resolve checkpoint.resume: "none" -> path[0] = 0; "auto" -> newest complete and
 * verified checkpoint in the directory (falling back past bad ones with a warning),
 * or "" if there is none; otherwise the given path (must exist).  Collective. */
int tsr_ckpt_resolve(const tsr_config *cfg, char *path, size_t len, MPI_Comm comm);

/* The effective deck the checkpoint at path was written with, the world size of the job
 * that wrote it, its step and its tokenizer ("" when it names none), read on rank 0 and
 * broadcast (*text: tsr_calloc'ed, the
 * caller frees it).  TSR_ERR_INPUT when the file cannot be read.  Collective. */
int tsr_ckpt_read_deck(const char *path, char **text, int *world, int64_t *step,
                       char tokenizer[232], MPI_Comm comm);

/* The tokenizer a checkpoint names (root attribute `tokenizer`; "" when none) and the files
 * of it that it carries (/tokenizer/<file>; *files NULL and *n 0 when none: written before
 * checkpoints carried them, or "bytes", which needs none).  Free them with
 * tsr_tokenizer_files_free.  Not collective: one rank reads (the plain HDF5 driver).
 * TSR_ERR_INPUT, reported, when the file cannot be read. */
int tsr_ckpt_read_tokenizer(const char *path, char name[232], tsr_tokenizer_file **files,
                            int *n);

/* Read the checkpoint into whole flat buffers of `lay` on every rank (tsr_ckpt_load_view
 * with the whole buffer).  Collective. */
int tsr_ckpt_load(const char *path, const tsr_layout *lay, float *master, float *m, float *v,
                  tsr_train_state *st, MPI_Comm comm);

#endif
