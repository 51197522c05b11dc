/* ckpt_compat.h — does a checkpoint fit the deck that is about to load it?
 *
 * Every checkpoint stores the effective deck it was written with (docs/formats.md).  Before
 * the tensors are read, that deck is compared with this one key by key, so a mismatch is
 * named by its key ("model.d_ff: checkpoint 352, deck 384") rather than found as a list of
 * tensor shapes:
 *   - keys that fix the tensors (architecture, sizes, heads, vocabulary, tied embeddings,
 *     and gpt2's max_positions, the position table's rows): an error, TSR_ERR_INPUT;
 *   - keys the weights were trained under (rope_theta, norm_eps, the RoPE scaling keys): a
 *     warning;
 *   - for a training run, the learning-rate schedule (run.max_steps, the optim schedule
 *     keys): a warning naming the old and new values and the learning rate of the next
 *     step under each, when the run still has steps to go.
 * The checkpoint's tokenizer must be the data's (data_tokenizer; NULL or "": not
 * checked; a checkpoint that names none passes): TSR_ERR_INPUT otherwise.  Messages come
 * from rank 0.  A stored deck this version cannot parse is reported and skipped (shapes are still checked
 * by the load).  Collective over world. */
#ifndef TSR_CKPT_COMPAT_H
#define TSR_CKPT_COMPAT_H

#include <mpi.h>

#include "core/config.h"

int tsr_ckpt_compat_check(const tsr_config *cfg, const char *path, int training,
                          const char *data_tokenizer, MPI_Comm world);

/* A checkpoint given where a deck is expected (`tessera generate step_00000100.h5`,
 * `tessera eval ...`): 1 when the file at path is an HDF5 file, 0 otherwise. */
int tsr_ckpt_is_checkpoint(const char *path);
/* Load the effective deck the checkpoint at path was written with, as tsr_deck_load loads
 * a deck file (messages on stderr), with checkpoint.resume set to path, then the
 * overrides.  One process (it reads the file on its own). */
int tsr_ckpt_deck_load(tsr_config *cfg, const char *path, int n_overrides, char **overrides,
                       int world_size);

#endif
