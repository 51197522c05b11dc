/* model_sizes.c — every buffer the model allocates, by size, from the config alone: the
 * model sizes its allocations from it and the planner (plan.c) its memory figures, so the
 * two cannot drift apart; and the largest shapes the model calls the ops with. */
#include "model_internal.h"

#include <string.h>

void tsr_model_sizes_of(tsr_model_sizes *s, const tsr_model_spec *spec, int tp, int first,
                        int last, int layers_per_chunk) {
  const tsr_model_config *mc = &spec->model;
  memset(s, 0, sizeof *s);
  s->gpt2 = mc->arch == TSR_ARCH_GPT2;
  s->recompute = spec->recompute;
  s->first = first;
  s->last = last;
  s->layers_per_chunk = layers_per_chunk;
  s->B = spec->micro_batch;
  s->cp = spec->cp > 1 ? spec->cp : 1;
  s->T = mc->seq_len / s->cp; /* a cp rank's tokens of each sequence */
  s->Tc = s->cp > 1 ? s->T / 2 : s->T;
  s->cp_a2a = s->cp > 1 && spec->cp_comm == TSR_CP_A2A;
  s->C = mc->d_model;
  s->hd = mc->d_model / mc->n_head;
  s->H = mc->n_head / tp;
  s->KV = mc->n_kv_head >= tp ? mc->n_kv_head / tp : 1;
  s->F = mc->d_ff / tp;
  s->V = mc->vocab_size / tp;
  s->N = s->B * s->T;
  s->sp = spec->sequence_parallel && tp > 1;
  s->Ns = s->sp ? s->N / tp : s->N;
  s->qkv_dim = (s->H + 2 * s->KV) * s->hd;
  s->fc_dim = s->gpt2 ? s->F : 2 * s->F;
  s->kv_shared = tp > mc->n_kv_head;
  s->kv_seg = 2 * s->hd * s->C + (s->gpt2 ? 2 * s->hd : 0);
  const int64_t N = s->N, C = s->C, Ns = s->Ns;
  s->layer = (tsr_model_layer_sizes){.norm1 = N * C, .norm2 = N * C, .qkv = N * s->qkv_dim,
                                     .atty = N * s->H * s->hd, .lse = s->B * s->H * s->T,
                                     .h = Ns * C, .fc = N * s->fc_dim, .norm1_mean = N,
                                     .norm1_rstd = N, .norm2_mean = N, .norm2_rstd = N,
                                     .act = N * s->F};
  s->act_offload = spec->activation_offload != 0;
  s->resid = (s->act_offload ? 1 : layers_per_chunk + 1) * Ns * C;
  s->tokens = first ? N : 0;
  /* int32 per row: the document starts, or under cp every row's position offset (ops_list.h
   * "Documents") and, with documents, what the attention takes of them: the whole
   * sequences' starts (a2a), or each query chunk's starts in the rows of each of the 2 cp
   * key chunks (the ring's blocks) */
  s->docs = s->cp > 1 ? N + (spec->document_mask ? (s->cp_a2a ? N * s->cp : 2 * s->cp * N) : 0)
                      : spec->document_mask ? N : 0;
  if (s->cp > 1) {
    const int64_t kvd = s->KV * s->hd, qd = s->H * s->hd;
    if (s->cp_a2a) {
      /* whole sequences of H / cp heads: q|k|v gathered and its gradient, the send and
       * receive blocks, out and dout; fp32 sums of replicated KV heads' gradients */
      const int64_t Hc = s->H / s->cp, KVc = s->KV >= s->cp ? s->KV / s->cp : 1;
      const int64_t W = (Hc + 2 * KVc) * s->hd, Nf = N * s->cp;
      s->cp_dt = 4 * Nf * W + 2 * Nf * Hc * s->hd;
      s->cp_f32 = s->KV < s->cp ? (s->KV + 1) * N * 2 * s->hd : 0;
    } else {
      /* the ring: two K|V blocks in flight and a strided-copy scratch; fp32: the output's
       * (then dq's) sums, one chunk's partial output and lse, two dK|dV blocks in flight */
      s->cp_dt = 2 * N * 2 * kvd + N * (qd > 2 * kvd ? qd : 2 * kvd);
      s->cp_f32 = N * qd + (N / 2) * qd + s->B * s->H * s->Tc + 2 * N * 2 * kvd;
    }
  }
  const int64_t xc = spec->xent_chunk_tokens;
  if (last) {
    s->final_norm = N * C, s->final_mean = N, s->final_rstd = N;
    s->xent_chunk = xc > 0 ? (xc < N ? xc : N) : 0;
    s->logits = s->xent_chunk ? 0 : N * s->V;
    s->head_scratch = s->xent_chunk * s->V;
    s->head_targets = s->xent_chunk ? N : 0;
  }
  s->tmp_nc = s->d_resid = s->d_nc = N * C;
  s->d_atty = N * s->H * s->hd;
  s->d_qkv = N * s->qkv_dim;
  s->d_fc = N * s->fc_dim;
  s->d_act = s->gpt2 ? 0 : N * s->F; /* gpt2: the GELU's backward is fused into a GEMM's */
  if (s->kv_shared) s->kv_keep = s->kv_seg, s->kv_sum = s->kv_seg * mc->n_kv_head;
  if (s->sp) s->d_full = N * C, s->tmp_s = s->d_shard = Ns * C, s->norm_dw = s->norm_db = C;
  s->xent = N;
  s->act_elems = Ns * C;
  s->split = spec->split_backward != 0;
  if (s->split) {
    s->w_dy = 2 * N * C + N * s->fc_dim + N * s->qkv_dim; /* down, o, fc, qkv */
    s->w_norm = 4 * C;                                    /* two norms' w and b */
    s->w_embed = first ? N * C : 0;
    s->w_head = last ? 2 * C : 0;
  }
  if (s->act_offload) {
    offload_layout o;
    model_offload_layout(s, tsr_dtype_size(spec->precision), &o);
    s->offload_set = o.bytes;
    s->offload_window = TSR_MODEL_OFFLOAD_WINDOW;
  }
}

/* One offload block: the groups the recompute mode keeps, then the layer's input, each
 * buffer at a multiple of 256 bytes (the alignment of an allocation of its own). */
static int64_t place(int64_t *at, int64_t bytes) {
  const int64_t o = *at;
  *at += (bytes + 255) / 256 * 256;
  return o;
}
void model_offload_layout(const tsr_model_sizes *s, int64_t esz, offload_layout *o) {
  const tsr_model_layer_sizes *n = &s->layer;
  const int own = owned_mask(s->recompute);
  int64_t at = 0;
  memset(o, 0xff, sizeof *o); /* every offset -1 */
  if (own & A_NORMS) o->norm1 = place(&at, n->norm1 * esz), o->norm2 = place(&at, n->norm2 * esz);
  if (own & A_CORE) {
    o->qkv = place(&at, n->qkv * esz);
    o->atty = place(&at, n->atty * esz);
    o->h = place(&at, n->h * esz);
    o->fc = place(&at, n->fc * esz);
    o->lse = place(&at, n->lse * 4);
    o->norm1_mean = place(&at, n->norm1_mean * 4);
    o->norm1_rstd = place(&at, n->norm1_rstd * 4);
    o->norm2_mean = place(&at, n->norm2_mean * 4);
    o->norm2_rstd = place(&at, n->norm2_rstd * 4);
  }
  if (own & A_ACT) o->act = place(&at, n->act * esz);
  o->x = place(&at, s->Ns * s->C * esz);
  if (s->split) { /* B's stash for W goes to the host with the block and comes back for W */
    o->d_down = place(&at, s->N * s->C * esz), o->d_o = place(&at, s->N * s->C * esz);
    o->d_fc = place(&at, s->N * s->fc_dim * esz), o->d_qkv = place(&at, s->N * s->qkv_dim * esz);
    o->norm_w = place(&at, 2 * s->C * 4), o->norm_b = place(&at, 2 * s->C * 4);
  }
  o->bytes = at;
}

double tsr_model_offload_window_bytes(const tsr_model_sizes *s) {
  return (double)s->offload_window * (double)s->offload_set;
}
double tsr_model_offload_host_slot_bytes(const tsr_model_sizes *s) {
  return s->act_offload ? (double)s->layers_per_chunk * (double)s->offload_set : 0.0;
}

/* Bytes of the groups `which` of one layer's activation set: the norm statistics and lse
 * stay fp32. */
static double set_bytes(const tsr_model_sizes *s, int which, double ab) {
  const tsr_model_layer_sizes *n = &s->layer;
  double b = 0;
  if (which & A_NORMS) b += (double)(n->norm1 + n->norm2) * ab;
  if (which & A_CORE)
    b += (double)(n->qkv + n->atty + n->h + n->fc) * ab +
         (double)(n->lse + n->norm1_mean + n->norm1_rstd + n->norm2_mean + n->norm2_rstd) * 4;
  if (which & A_ACT) b += (double)n->act * ab;
  return b;
}

/* The layers of a chunk, its residual stream, the input tokens and the document starts
 * (int32), the final norm and its statistics, the logits (stored: they become their own
 * gradient), or with the fused head the targets (int32) instead.  With the activation
 * offload the layers' sets (and a split backward's stash for W) are the window's and the
 * host's, not the slot's, and the residual stream is the chunk's output only. */
double tsr_model_slot_bytes(const tsr_model_sizes *s, double ab) {
  const double layer = s->act_offload ? 0.0
                                      : set_bytes(s, owned_mask(s->recompute), ab) +
                                            (double)s->w_dy * ab + (double)s->w_norm * 4;
  return s->layers_per_chunk * layer +
         (double)s->w_embed * ab + (double)s->w_head * 4 +
         (double)s->resid * ab + (double)(s->tokens + s->docs + s->head_targets) * 4 +
         (double)(s->final_norm + s->logits) * ab +
         (double)(s->final_mean + s->final_rstd) * 4;
}

/* The recompute target (what the layers do not own), the activation-gradient and
 * projection scratch and the fused head's chunk of logits (stored), the shared-KV
 * parameter-gradient buffers and the sequence-parallel norm gradients (fp32), the loss
 * statistics (double), the one double a forward's loss lands in and, on the last stage,
 * the targets (int32, where the ops can read them). */
double tsr_model_workspace_bytes(const tsr_model_sizes *s, double ab) {
  const double stored = (double)(s->tmp_nc + s->d_resid + s->d_nc + s->d_atty + s->d_qkv +
                                 s->d_fc + s->d_act + s->d_full + s->tmp_s + s->d_shard +
                                 s->head_scratch + s->cp_dt);
  const double fp32 = (double)(s->kv_keep + s->kv_sum + s->norm_dw + s->norm_db + s->cp_f32);
  return set_bytes(s, A_ALL & ~owned_mask(s->recompute), ab) + stored * ab + fp32 * 4 +
         3.0 * (double)s->xent * 8 + 8.0 + (s->last ? (double)s->xent * 4 : 0.0);
}

static int64_t max_of(int64_t a, int64_t b) { return a > b ? a : b; }
void tsr_model_ops_shapes_of(const tsr_model_sizes *z, tsr_ops_shapes *s) {
  /* the widest GEMM input or output: d_model, qkv, the MLP (fc and its input F), and the
   * head's [N, V_local] output (and its gradient) only on the last stage */
  const int64_t cols =
      max_of(max_of(max_of(z->C, z->qkv_dim), max_of(z->fc_dim, z->H * z->hd)),
             max_of(z->F, z->last ? z->V : 0));
  const long bht = (long)z->B * z->H * z->T;
  memset(s, 0, sizeof *s);
  s->rows = (long)z->N;
  s->cols = (long)cols;
  s->vocab_local = (long)z->V;
  s->attn_bht = bht; /* the same under cp: T / cp tokens of H heads, or T of H / cp */
  /* the a2a attention runs whole sequences of H / cp query and KVc KV heads */
  const long H = z->cp_a2a ? (long)(z->H / z->cp) : (long)z->H;
  const long KV = z->cp_a2a ? (long)(z->KV >= z->cp ? z->KV / z->cp : 1) : (long)z->KV;
  const long T = z->cp_a2a ? (long)(z->T * z->cp) : (long)z->T;
  /* the ring's block backward adds into fp32 dk, dv: no per-query-head partials */
  s->attn_part = KV < H && !(z->cp > 1 && !z->cp_a2a) ? 2 * bht * z->hd : 0;
  s->attn_io = (long)z->B * T * (H + KV) * z->hd;
  s->attn_t = T;
  s->attn_hd = (long)z->hd;
}
void tsr_model_ops_shapes(const tsr_model *m, tsr_ops_shapes *s) {
  tsr_model_ops_shapes_of(&m->sz, s);
  s->dt = m->dt;
}
