/* model_internal.h — what the model's files share: its struct, one layer's parameters
 * and activations, and the layer-level math of model_layer.c that model.c drives.
 * Internal to the model: other modules use model.h. */
#ifndef TSR_MODEL_INTERNAL_H
#define TSR_MODEL_INTERNAL_H

#include <stdint.h>

#include "comm/comm.h"
#include "model.h"
#include "ops/ops.h"

typedef struct { /* offsets of one layer's tensors relative to its unit (-1: absent) */
  int64_t norm1_w, norm1_b, wqkv, bqkv, wo, bo, norm2_w, norm2_b, wfc, bfc, wdown, bdown;
} layer_params;

typedef struct { /* one layer's activations (pointers may alias shared scratch) */
  void *norm1;                     /* [N,C] (the run's storage type, as every void * here) */
  float *norm1_mean, *norm1_rstd; /* [N], [N] (fp32, as every float * here) */
  void *qkv;                       /* [N, qkv_dim] (after RoPE) */
  void *atty;                      /* [N, H*hd] attention output */
  float *lse;                      /* [B*H*T] */
  void *h;                         /* [Ns,C] residual after attention */
  void *norm2;
  float *norm2_mean, *norm2_rstd;
  void *fc;  /* [N, fc_dim] */
  void *act; /* [N, F] */
} layer_acts;

typedef struct { /* what one layer's B pass leaves for its W pass (split backward) */
  void *d_down, *d_o;     /* [N,C] the MLP's and attention's output gradients (rows gathered) */
  void *d_fc;             /* [N, fc_dim] the up projection's output gradient */
  void *d_qkv;            /* [N, qkv_dim] the QKV projection's output gradient */
  float *norm_w, *norm_b; /* [2C] each: norm1's then norm2's weight (and bias) gradients */
} layer_wstash;

/* Activation offload: where one layer's stored buffers sit in its block (host and device
 * window alike), in bytes, each at a multiple of 256 (-1: not stored, the recompute mode
 * rebuilds it); x is the layer's input (its row of the residual stream); with a split
 * backward also what its B pass leaves for W (layer_wstash's buffers); bytes the block's
 * size.  model_sizes.c lays it out. */
typedef struct {
  int64_t norm1, norm2, qkv, atty, h, fc, act, lse, norm1_mean, norm1_rstd, norm2_mean,
      norm2_rstd, x, d_down, d_o, d_fc, d_qkv, norm_w, norm_b, bytes;
} offload_layout;
void model_offload_layout(const tsr_model_sizes *s, int64_t esz, offload_layout *o);

struct tsr_model {
  tsr_model_spec spec;
  const tsr_layout *lay;
  int gpt2;
  tsr_dtype dt; /* storage of the parameters' compute copy, activations and their gradients */
  size_t esz;   /* its bytes per element */
  tsr_recompute recompute;
  /* H, KV, F, V: this tp rank's query heads, KV heads, MLP width and vocabulary rows */
  int B, T, C, H, KV, hd, F, V, L, N, qkv_dim, fc_dim;
  tsr_model_sizes sz; /* every buffer's size (tsr_model_sizes_of) */
  int vocab, vocab_start; /* full vocabulary; first row held here */
  tsr_comm *tp;           /* NULL or a group of size 1: no tensor parallelism */
  int tp_size, tp_rank;
  /* sequence parallel: the residual stream and norms hold Ns = N / tp tokens (rows
   * [row0, row0 + Ns) of the micro-batch); without it Ns = N, row0 = 0 */
  int sp, Ns, row0;
  void *d_full;       /* [N,C] a gathered residual gradient */
  void *tmp_s;        /* [Ns,C] a reduce-scattered projection */
  void *d_shard;      /* [Ns,C] a reduce-scattered norm-output gradient */
  float *norm_dw, *norm_db; /* [C] one micro-batch's norm gradients before the tp sum */
  double *xent_max, *xent_sum, *xent_target; /* [N] vocab-parallel loss statistics */
  double *loss1; /* one double: tsr_model_forward / fwd_bwd's loss, or a sink for none */
  int32_t *targets; /* [N] last stage: the micro-batch's targets, copied where ops read */
  void *head_buf;   /* [xent_chunk, V] the fused head's logits of one chunk (sz.xent_chunk) */
  /* n_kv_head < tp: KV heads are replicated, each shared by tp / n_kv_head ranks whose
   * query heads all contribute to its gradient; these buffers sum those contributions */
  int kv_shared, kv_head, kv_heads, kv_seg;
  float *kv_keep, *kv_sum;
  float eps;
  tsr_rope rope; /* RoPE's base and scaling (llama) */
  /* document masking (data.document_mask): the end-of-document id (-1: not known yet), the
   * host rows the document starts are formed in, every slot's starts (op memory, n_slots x
   * N: slot_doc) and those of the micro-batch the chunk being run holds: NULL without
   * masking (ops_list.h) */
  int docmask;
  int32_t eos;
  int32_t *doc_host, *docs;
  const int32_t *doc;
  /* context parallelism (model_cp.c): the cp group, this rank in it, the chunk length; the
   * position period of the position ops (Tc under cp, where every slot's doc holds each
   * row's offset, else T); under cp with documents what follows the offsets in the slot's
   * doc (doc_full, op memory): the whole sequences' document starts [B * T * cp] the a2a
   * attention takes, or the ring's block starts (model_cp.c); the rank's rows of the
   * micro-batch's inputs and targets (host); the exchange buffers */
  tsr_comm *cpc;
  int cp, cp_rank, cp_a2a, Tc, Tpos, Tseq;
  const int32_t *doc_full;
  int32_t *cp_in, *cp_tg, *cp_doc_host;
  void *cp_dt;
  float *cp_f32;
  /* offsets relative to their unit: embed, pos_embed in unit 0; final norm in the head
   * unit; lm_head in the head unit, or embed in unit 0 when tied */
  int64_t embed, pos_embed, final_w, final_b, head;
  int head_unit; /* unit holding the LM head weight: L+1, or 0 when tied */
  layer_params *lp;
  int n_units;
  tsr_unit *units;
  tsr_model_hooks hooks;

  void *params;  /* compute copy (dt), n_flat (NULL when a provider owns them) */
  float *grads;  /* fp32, n_flat (NULL when a provider owns them) */

  /* pipeline: this stage's layers (L of them, global ids layer_ids), in v chunks; chunk j
   * holds local layers [chunk_q0[j], chunk_q0[j + 1]) (tsr_pp_chunk_layers), at most Lc;
   * first: holds the embedding (global chunk 0); last: the head (the last chunk) */
  int *layer_ids, *chunk_q0;
  int v, Lc, first, last;
  /* Activations of a micro-batch in flight through one chunk live in a slot; a stage
   * keeps as many slots as its schedule has micro-batch-chunks in flight. */
  int n_slots;
  struct act_slot {
    layer_acts *acts; /* [Lc]: a chunk of n layers uses the last n */
    void *resid;      /* [(Lc+1) * Ns*C]: a chunk of n layers reads its input at Lc - n,
                       * each layer writes the next, the output is always at Lc */
    void *final_norm; /* last stage: the head */
    float *final_mean, *final_rstd;
    void *logits; /* [N, V]: the logits, then their gradient (unfused head only) */
    /* the fused head: the targets of the slot's micro-batch; after a forward with grad,
     * where its backward adds the loss (NULL: nowhere) and the loss's dloss / N */
    int32_t *targets;
    double *loss_acc;
    float dloss;
    int32_t *tokens;  /* first stage: the inputs (for the embedding backward) */
    layer_wstash *w;  /* [Lc], split backward only */
    void *w_embed;    /* [N,C] split backward, first chunk: the embedding's output gradient */
    float *w_head;    /* [2C] split backward, last chunk: the final norm's w (and b) gradient */
    void *host;       /* activation offload: [Lc] blocks of ol.bytes, page-locked */
  } *slots;
  /* activation offload (sz.act_offload): the window of device blocks shared by all
   * slots, each with its set's pointers into it (what the recompute mode does not keep
   * aliasing the scratch) and the event of the last copy to or from it; the set the next
   * layer takes; each slot's host blocks are in its host; the event a layer's forward
   * waits for before it writes its output (the next set's previous copy), or NULL */
  int aoff, win_next;
  offload_layout ol;
  struct offload_win {
    void *block, *x, *ev;
    layer_acts acts;
    layer_wstash ws; /* split backward: B's stash for W, in the block too */
  } win[TSR_MODEL_OFFLOAD_WINDOW];
  void *out_ev;
  size_t host_bytes;   /* page-locked bytes of the slots' host blocks */
  size_t stored_bytes; /* device bytes of the stored sets and residual streams */
  layer_acts scratch; /* recompute target */
  void *tmp_nc;       /* [N,C] projection outputs */
  void *d_resid;      /* [Ns,C] gradient of the residual stream */
  void *d_nc;         /* [N,C] gradient of a norm output */
  void *d_atty, *d_qkv, *d_fc, *d_act;
  size_t act_bytes;
};

/* The groups of one layer's activation set: the norm outputs, the core (GEMM and
 * attention outputs and the statistics), the MLP activation. */
enum { A_NORMS = 1, A_CORE = 2, A_ACT = 4, A_ALL = 7 };
/* Which buffers each layer owns and which live in the shared scratch set. */
static inline int owned_mask(tsr_recompute r) {
  return r == TSR_RECOMPUTE_NONE ? A_ALL : r == TSR_RECOMPUTE_SELECTIVE ? A_CORE : 0;
}

/* Tensor o (an offset in its unit; -1: absent) of a unit's fp32 gradient / compute-copy
 * parameters. */
static inline float *P(float *base, int64_t o) { return o < 0 ? NULL : base + o; }
static inline const void *PC(const tsr_model *m, const void *base, int64_t o) {
  return o < 0 ? NULL : tsr_dtype_at_c(base, m->dt, o);
}
/* Document masking: the document starts of the micro-batch in slot sl (NULL: no masking);
 * under cp the rows' position offsets, then with documents the whole sequences' starts. */
static inline int32_t *slot_doc(const tsr_model *m, const struct act_slot *sl) {
  return m->docs ? m->docs + (size_t)(sl - m->slots) * m->sz.docs : NULL;
}
/* Element i of a stored (dt) activation buffer. */
static inline void *A(const tsr_model *m, void *base, int64_t i) { return tsr_dtype_at(base, m->dt, i); }

/* ---- model_layer.c ---- */

/* Norm of this rank's rows into the full-size output (fused residual add with y). */
int model_norm_fwd(tsr_model *m, const void *pr, void *out, float *mean, float *rstd, void *h,
                   const void *x, const void *y, int64_t w, int64_t b);
/* Its backward: dx gets (acc: += ) the gradient of x; the weight (and bias) gradients are
 * added into gr, or with sw != NULL written to sw (and sb) instead (split backward). */
int model_norm_bwd(tsr_model *m, const void *pr, float *gr, void *dx, const void *dout,
                   const void *x, const float *mean, const float *rstd, int64_t w, int64_t b,
                   int acc, float *sw, float *sb);
/* The tensor-parallel sums of model_layer.c (see there). */
void *model_tp_rows(tsr_model *m, void *partial);
const void *model_tp_gather_rows(tsr_model *m, const void *D);
void *model_tp_grad_rows(tsr_model *m, void *partial);
const void *model_tp_bias(const tsr_model *m, const void *b);
/* One layer: forward x -> out (activations into a), what the recompute mode did not keep,
 * and the backward (m->d_resid: d(out) in, d(x) out). */
int model_layer_fwd(tsr_model *m, int l, const void *pr, const void *x, layer_acts *a, void *out);
int model_layer_recompute(tsr_model *m, int l, const void *pr, const void *x, layer_acts *a);
/* ws == NULL: the whole backward of layer l.  ws != NULL: its B pass, input gradients only,
 * leaving in ws what model_layer_bwd_w needs for the weight gradients (no gr is touched). */
int model_layer_bwd(tsr_model *m, int l, const void *pr, float *gr, const void *x, layer_acts *a,
                    layer_wstash *ws);
/* The W pass of layer l: its weight and bias gradients into gr from ws and a. */
int model_layer_bwd_w(tsr_model *m, int l, float *gr, layer_acts *a, const layer_wstash *ws);
/* The last chunk's head: final norm and LM head, forward from x and backward (see there). */
int model_head_fwd(tsr_model *m, struct act_slot *sl, const void *ph, const void *pw,
                   const void *x);
int model_head_bwd(tsr_model *m, struct act_slot *sl, const void *ph, const void *pw, float *gh,
                   float *gw, const void *x);
/* Split backward: the head's B pass (input gradient into m->d_resid, the final norm's
 * weight gradients into sl->w_head) and its W pass (the LM head's weight gradient into gw
 * from the logits' gradient, or from the logits computed again by the fused head, whose
 * weight pw is then needed; the final norm's into gh). */
int model_head_bwd_b(tsr_model *m, struct act_slot *sl, const void *ph, const void *pw,
                     const void *x);
int model_head_bwd_w(tsr_model *m, struct act_slot *sl, const void *pw, float *gh, float *gw);
/* The fused head (m->sz.xent_chunk > 0) from the slot's final norm output and targets, a
 * chunk of rows at a time: *acc += the mean row loss (acc NULL: not wanted); with dx
 * and/or dw (NULL: not wanted) the gradient of dloss * the loss sum: dx [N, C] gets the
 * norm output's (this rank's vocabulary's part, before the tp sum), dw [V, C] += the head
 * weight's. */
int model_head_xent(tsr_model *m, struct act_slot *sl, const void *pw, void *dx, float *dw,
                    double *acc, float dloss);
/* The fused head's logits of one row (this rank's V) into m->head_buf. */
void model_head_row_logits(tsr_model *m, struct act_slot *sl, const void *pw, int row);
/* *acc += the mean row loss of the (vocab-parallel) logits; with grad the logits become
 * dloss * d(loss sum)/d(logits). */
int model_loss_and_grad(tsr_model *m, void *logits, const int32_t *targets, float dloss, int grad,
                        double *acc);

/* Context parallelism (model_cp.c, docs/context_parallel.md).  model_cp_init: the cp
 * group, the exchange buffers and, without documents, every slot's position offsets.
 * model_cp_rows: this rank's rows (chunks cp_rank and 2 cp - 1 - cp_rank, chunk-major) of
 * a micro-batch's [B, T cp] int32 host array.  model_cp_docs: the slot's position offsets
 * and whole-sequence document starts from the micro-batch's [B, T cp] starts (host).
 * model_cp_attention_fwd / _bwd: attention_fwd / attention_bwd for a rank's rows, by the
 * ring (p2p) or the all-to-alls (a2a); collective over the cp group. */
int model_cp_init(tsr_model *m, tsr_comm *cp);
void model_cp_rows(const tsr_model *m, int32_t *dst, const int32_t *src);
void model_cp_docs(tsr_model *m, struct act_slot *sl, const int32_t *starts);
int model_cp_attention_fwd(tsr_model *m, layer_acts *a);
int model_cp_attention_bwd(tsr_model *m, void *d_qkv, const layer_acts *a);

#endif
