/* layout.h — logical tensors of the model and where each lives in a flat buffer.
 *
 * SHARDING.md: every parameter has a logical shape (DESIGN.md's checkpoint table);
 * a (pipeline stage, tp rank) concatenates its local slices in a fixed order into one
 * flat buffer.  This module is that table.  Today it covers one stage and tp = 1
 * (local slice = logical tensor); the tp/pp split rules extend it in place.
 *
 * Order inside a layer keeps fusable weights adjacent so that Q,K,V (and gate,up)
 * form one contiguous [rows, d_model] matrix in memory: one GEMM, no copy. */
#ifndef TSR_LAYOUT_H
#define TSR_LAYOUT_H

#include <stdint.h>

#include "config.h"

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
} tsr_tensor;

typedef struct {
  int n_tensors;
  tsr_tensor *tensors;
  int64_t n_params; /* sum of numel */
  int64_t n_flat;   /* flat buffer length: n_params padded to a multiple of 64 */
} tsr_layout;

int tsr_layout_create(tsr_layout **out, const tsr_model_config *model);
void tsr_layout_destroy(tsr_layout **lay);
/* Tensor by name ("layers.000.attn.wq.weight"), NULL if absent. */
const tsr_tensor *tsr_layout_find(const tsr_layout *lay, const char *name);
/* Tensor of a layer by suffix ("attn.wq.weight"); NULL if absent. */
const tsr_tensor *tsr_layout_layer(const tsr_layout *lay, int layer, const char *suffix);
/* Initialise the flat buffer: element i of logical tensor X gets a value that depends
 * only on (seed, X's name, i), so any layout initialises the same model. */
void tsr_layout_init(const tsr_layout *lay, float *flat, uint64_t seed);

#endif
