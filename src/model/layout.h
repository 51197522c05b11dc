/* layout.h — logical tensors of the model and where each lives in a flat buffer.
 *
 * docs/sharding.md: every parameter has a logical shape (docs/model.md "Tensor names and
 * shapes"); a (pipeline stage, tp rank) concatenates its local slices in a fixed order
 * into one flat buffer.  This module is that table, for any (pipeline stage, tp rank):
 *
 *   stages   the n_layer layers are cut into pp * virtual_stages chunks of consecutive
 *            layers (equal, or as parallel.stage_layers says: tsr_pp_chunk_layers in
 *            pipeline.h); chunk c lives on stage c % pp, or under the V placement on
 *            tsr_pp_chunk_owner's stage (s and 2 pp - 1 - s on stage s); a stage holds
 *            its layers in increasing order.  embed (+ pos_embed) on stage 0, final_norm
 *            and lm_head with the last chunk (stage pp-1; stage 0 under a V); with tied
 *            embeddings on two different stages the head's stage also holds a copy of
 *            embed.weight (tied_copy = 1), never written to a checkpoint.
 *   tp       column-parallel (wq w_gate w_up + biases): rows [r out/T, (r+1) out/T);
 *            wk, wv (+ biases): the same when n_kv_head >= T, else the hd rows of KV
 *            head r / (T / n_kv_head), identical on T / n_kv_head ranks;
 *            row-parallel (wo, w_down): columns [r in/T, (r+1) in/T);
 *            vocab-parallel (embed, lm_head): rows [r V/T, (r+1) V/T);
 *            replicated (norms, wo.bias, w_down.bias, pos_embed): whole on every rank.
 *
 * `shape` is always the LOGICAL shape (the checkpoint's); `lshape`, `row0`, `col0`
 * describe the local slice and `numel` counts local elements.
 *
 * Order inside a layer keeps fusable weights adjacent so that Q,K,V (and gate,up)
 * form one contiguous [rows, d_model] matrix in memory: one GEMM, no copy; under tp
 * the local slices stay adjacent in the same way. */
#ifndef TSR_LAYOUT_H
#define TSR_LAYOUT_H

#include <stdint.h>

#include "core/config.h"

#define TSR_NAME_MAX 64

typedef enum {
  TSR_SPLIT_REPLICATED = 0, /* norms, row-parallel biases, pos_embed */
  TSR_SPLIT_COLUMN,         /* rows of [out, in] split: wq wk wv w_gate w_up (+ biases) */
  TSR_SPLIT_ROW,            /* columns split: wo, w_down */
  TSR_SPLIT_VOCAB           /* rows split over the vocabulary: embed, lm_head */
} tsr_split;

typedef struct {
  char name[TSR_NAME_MAX]; /* "layers.003.attn.wq.weight" (dataset /model/<name>) */
  int ndim;                /* 1 or 2 */
  int64_t shape[2];        /* logical shape; shape[1] = 1 when ndim == 1 */
  int layer;               /* -1 for embed, pos_embed, final_norm, lm_head */
  tsr_split split;
  int decay;               /* AdamW weight decay applies (2-D weight matrices) */
  int64_t offset;          /* first element in the flat buffer */
  int64_t numel;           /* elements held here */
  double init_std;         /* > 0: N(0, init_std); 0: constant init_value */
  float init_value;
  /* The local slice: rows [row0, row0 + lshape[0]) x cols [col0, col0 + lshape[1]) of
   * the logical tensor, row-major in the flat buffer; numel = lshape[0] * lshape[1]. */
  int64_t lshape[2];
  int64_t row0, col0;
  int tp_copies;     /* tp ranks holding this identical slice: 1 split, T replicated,
                        T / n_kv_head for shared KV heads */
  int tp_copy;       /* this rank's index among them, in [0, tp_copies) */
  int tied_copy;     /* 1: the last stage's copy of embed.weight (tied head): never saved */
  int logical_index; /* index of the logical tensor in the whole model's list (the order
                        of tsr_layout_create); a tied copy has embed.weight's */
} tsr_tensor;

/* A rectangle of a logical tensor: rows [row, row + rows) x cols [col, col + cols). */
typedef struct {
  int64_t row, col, rows, cols;
} tsr_rect;

typedef struct {
  int n_tensors;
  tsr_tensor *tensors;
  int64_t n_params; /* sum of numel */
  int64_t n_flat;   /* flat buffer length: n_params padded to a multiple of 64 */
  tsr_model_config model; /* the model it describes (the whole tensor list derives from it) */
  int tp, tp_rank, pp, pp_rank, virtual_stages;
  tsr_schedule_choice placement; /* the schedule whose chunk placement this is (schedule.h) */
  int embeds, heads; /* this stage holds the embedding (chunk 0) / the final norm and head
                        (the last chunk): stage 0 / pp - 1, both stage 0 under a V */
  char stage_layers[TSR_STR_PATH]; /* the layer split (parallel.stage_layers; "" equal) */
  int n_logical;          /* tensors of the whole model (tsr_layout_create's n_tensors) */
} tsr_layout;

/* The whole model on one rank: tsr_layout_create_part(out, model, 1, 0, 1, 0, 1). */
int tsr_layout_create(tsr_layout **out, const tsr_model_config *model);
/* What pipeline stage pp_rank of pp (virtual_stages chunks per stage) and tp rank tp_rank
 * of tp hold.  Checks n_head, vocab_size, d_ff divisible by tp, n_kv_head and tp dividing
 * one another, n_layer divisible by pp * virtual_stages: TSR_ERR_INPUT with a message. */
int tsr_layout_create_part(tsr_layout **out, const tsr_model_config *model, int tp, int tp_rank,
                           int pp, int pp_rank, int virtual_stages);
/* The same with the layers split over the chunks as parallel.stage_layers `split` says
 * ("" = equal chunks: tsr_layout_create_part) and the chunks placed on the stages as
 * schedule `placement` places them (tsr_pp_chunk_owner: c % pp, or the V placement). */
int tsr_layout_create_split(tsr_layout **out, const tsr_model_config *model, int tp,
                            int tp_rank, int pp, int pp_rank, int virtual_stages,
                            const char *split, tsr_schedule_choice placement);
void tsr_layout_destroy(tsr_layout **lay);
/* Tensor by name ("layers.000.attn.wq.weight"), NULL if absent. */
const tsr_tensor *tsr_layout_find(const tsr_layout *lay, const char *name);
/* Tensor of a layer by suffix ("attn.wq.weight"); NULL if absent. */
const tsr_tensor *tsr_layout_layer(const tsr_layout *lay, int layer, const char *suffix);
/* Initialise the flat buffer: element i of logical tensor X gets a value that depends
 * only on (seed, X's name, i), so any layout initialises the same model. */
void tsr_layout_init(const tsr_layout *lay, float *flat, uint64_t seed);

/* The pipeline stage holding `layer`: its chunk's (tsr_pp_layer_chunk under `split`)
 * owner under `placement` (tsr_pp_chunk_owner); -1 for a bad split. */
int tsr_layout_stage_of_layer(const tsr_model_config *model, int pp, int virtual_stages,
                              const char *split, tsr_schedule_choice placement, int layer);
/* Row-major logical index of local element i (0 <= i < numel) of t. */
int64_t tsr_layout_logical_index(const tsr_tensor *t, int64_t i);
/* The piece of t inside flat range [s0, s1) (docs/sharding.md "Checkpoint pieces"): local elements [*i0, *i1)
 * (empty: *i0 == *i1), as at most three rectangles of the logical tensor in row-major
 * order (partial first row, full rows, partial last row).  Returns the count. */
int tsr_layout_piece(const tsr_tensor *t, int64_t s0, int64_t s1, int64_t *i0, int64_t *i1,
                     tsr_rect rect[3]);
/* Whether this holder of t writes it to a checkpoint.  n_copies ranks hold identical
 * copies of the shard (dp replicas), this one is copy_index; with t's tp_copies there are
 * tp_copies * n_copies identical holders, numbered copy_index * tp_copies + tp_copy, and
 * the one numbered logical_index mod (tp_copies * n_copies) writes.  Tied copies never. */
int tsr_layout_writes(const tsr_tensor *t, int copy_index, int n_copies);

#endif
