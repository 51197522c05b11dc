/* attention.cu — causal grouped-query attention, forward and backward: which kernels run
 * a shape (context.h: cuDNN's fused attention, the mma.sync tensor-core kernels, or the
 * fp32-arithmetic kernel), the backward's row statistics D, and the sums of the
 * grouped-query partials of the tensor-core kernels (attn.cuh).  And the block ops of a
 * chunked sequence (attention_block_fwd/bwd: the fp32-arithmetic kernels with the block's
 * diagonal offset, whatever the storage; attention_merge). */
#include <initializer_list>

#include "attn.cuh"

extern "C" {
#include "backend.h"
#ifdef TSR_HAVE_CUDNN
#include "sdpa_graphs.h"
#endif
}

/* D[(b*H + h)*T + t] = sum_i dout[.., i] * out[.., i]: one warp per (row, head). */
template <class T>
__global__ void row_dot_kernel(float *D, const T *dout, const T *out, int B, int T_, int H,
                               int hd) {
  const long w = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= (long)B * T_ * H) return;
  const long row = w / H; /* b*T + t */
  const int h = (int)(w % H);
  const T *go = dout + row * H * hd + (size_t)h * hd, *o = out + row * H * hd + (size_t)h * hd;
  float s = 0.0f;
  for (int i = lane; i < hd; i += 32) s += to_f32(go[i]) * to_f32(o[i]);
  s = warp_sum(s);
  const long b = row / T_, t = row % T_;
  if (lane == 0) D[(b * H + h) * T_ + t] = s;
}

/* dk = scale * (the sum over the group's query heads of their dk sums), dv likewise: one
 * thread per (b, t, kv head, d), heads summed in order, written */
template <class T>
__global__ void group_sum_kernel(T *dk, T *dv, const float *part, size_t part_stride, int B,
                                 int T_, int H, int KV, int hd, int qkv_stride, float scale) {
  GRID_STRIDE_LOOP(idx, (long)B * T_ * KV * hd) {
    const int d = (int)(idx % hd);
    long rest = idx / hd;
    const int g = (int)(rest % KV);
    rest /= KV;
    const int t = (int)(rest % T_), b = (int)(rest / T_), group = H / KV;
    float sk = 0.0f, sv = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++) {
      const size_t o = (((size_t)b * H + h) * T_ + t) * hd + d;
      sk += part[o];
      sv += part[part_stride + o];
    }
    const size_t off = ((size_t)b * T_ + t) * qkv_stride + (size_t)g * hd + d;
    if (dk) dk[off] = from_f32<T>(scale * sk);
    if (dv) dv[off] = from_f32<T>(sv);
  }
}

/* ---------------------------------------------------------------- the choice */

static struct {
  int kind;    /* TSR_ATT_*: what was asked */
  int key[8];  /* dt, B, T, H, KV, hd, qkv_stride the last decision was for (valid) */
  int valid, path;
} choice;

extern "C" void tsr_cuda_attention_use(int kind) {
  choice.kind = kind == TSR_ATT_CUDNN ? TSR_ATT_CUDNN : TSR_ATT_MMA;
  choice.valid = 0;
}

extern "C" size_t tsr_cuda_attention_tc_smem(int hd) { return tsr_attn_mma_smem(hd); }

/* A kernel for hd, and the current GPU gives a block that much shared memory (sm_86 and
 * sm_89 parts give 99 KB: where a head_dim's kernels need more, it falls back to the
 * fp32-arithmetic kernel). */
extern "C" int tsr_cuda_attention_tc_supported(int hd) {
  const size_t need = tsr_cuda_attention_tc_smem(hd);
  int dev = 0, optin = 0, major = 0;
  if (!need || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return need <= (size_t)optin && major >= 8; /* 16-bit tensor-core products: sm_80 on */
}

static const char *path_what(int path, tsr_dtype dt) {
  switch (path) {
    case TSR_ATT_PATH_CUDNN: return "cuDNN fused flash attention on q, k, v in place";
    case TSR_ATT_PATH_MMA:
      return dt == TSR_F16
                 ? "tensor cores, mma.sync kernels (fp16 products; fp32 softmax and sums)"
                 : "tensor cores, mma.sync kernels (bf16 products; fp32 softmax and sums)";
  }
  return dt == TSR_F32 ? "fp32 kernel"
                       : "fp32-arithmetic kernel on the 16-bit storage (no tensor-core kernel "
                         "for this head_dim on this GPU: 32, 64, 96, 128 have one, where its "
                         "shared memory fits)";
}

static int decide(tsr_dtype dt, int B, int T, int H, int KV, int hd, int qkv_stride, int docs,
                  int *path) {
  const int key[8] = {(int)dt, B, T, H, KV, hd, qkv_stride, docs != 0};
  if (choice.valid && !memcmp(key, choice.key, sizeof key)) {
    *path = choice.path;
    return 0;
  }
  int p = TSR_ATT_PATH_F32;
  char why[600] = "";
  if (dt != TSR_F32) {
#ifdef TSR_HAVE_CUDNN
    if (choice.kind == TSR_ATT_CUDNN && docs) {
      snprintf(why, sizeof why, "document masking, which cuDNN's graphs here do not take (their "
               "mask is causal only): our kernels run the masked attention");
    } else if (choice.kind == TSR_ATT_CUDNN) {
      const tsr_cuda_context *c = &tsr_cuda_ctx;
      const int rc = tsr_cuda_cudnn_attention_prepare(
          dt, B, T, H, KV, hd, qkv_stride, c->shapes.deterministic, (long long)c->attn_ws_bytes,
          why, sizeof why);
      if (rc == TSR_ERR) return TSR_ERR;
      if (rc == 0) p = TSR_ATT_PATH_CUDNN;
    }
#endif
    if (p != TSR_ATT_PATH_CUDNN && tsr_cuda_attention_tc_supported(hd)) p = TSR_ATT_PATH_MMA;
  }
  if (tsr_rank() == 0)
    tsr_log("attention: %s%s%s%s [%s B %d T %d H %d KV %d hd %d%s]", path_what(p, dt),
            why[0] ? (p == TSR_ATT_PATH_CUDNN ? " (" : "; not cuDNN: ") : "", why,
            why[0] && p == TSR_ATT_PATH_CUDNN ? ")" : "", tsr_dtype_name(dt), B, T, H, KV, hd,
            docs ? ", document-masked" : "");
  memcpy(choice.key, key, sizeof key);
  choice.valid = 1;
  choice.path = *path = p;
  return 0;
}

extern "C" int tsr_cuda_attention_path(tsr_dtype dt, int B, int T, int H, int KV, int hd,
                                       int qkv_stride, int docs) {
  int p = -1;
  return decide(dt, B, T, H, KV, hd, qkv_stride, docs, &p) ? -1 : p;
}

/* D, then the tensor-core backward's per-query-head dk, dv partials (grouped-query) */
extern "C" int tsr_cuda_scratch_attention(const tsr_ops_shapes *s, size_t *bytes) {
  *bytes = tsr_ops_attention_scratch_bytes(s->attn_bht, s->attn_part);
  return 0;
}

/* (head dimensions over ATT_HD_MAX only cuDNN can run: our kernels refuse them) */
static int check_shape(int B, int T, int H, int KV, int hd, int qkv_stride) {
  TSR_CUDA_ARG(B > 0 && T > 0 && H > 0 && KV > 0 && H % KV == 0);
  TSR_CUDA_ARG(hd > 0);
  TSR_CUDA_ARG(qkv_stride >= H * hd); /* q, k, v may share one fused buffer or not */
  TSR_CUDA_ARG((long)B * H <= 65535); /* gridDim.y of the kernels is B * H (or B * KV) */
  return 0;
}

#ifdef TSR_HAVE_CUDNN
/* cuDNN wants 16-byte aligned tensors; a call whose are not takes our kernels (the same
 * lse: a log-sum-exp of the scaled scores either way), said once */
static int cudnn_fits(std::initializer_list<const void *> ptrs) {
  static int told;
  for (const void *p : ptrs)
    if (p && ((uintptr_t)p & 15)) {
      if (!told++) tsr_warn("attention: a tensor not 16-byte aligned: cuDNN left out for it");
      return 0;
    }
  return 1;
}
#endif

static int forward(tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                   const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                   const int32_t *doc) {
  TSR_CALL(check_shape(B, T, H, KV, hd, qkv_stride));
  int path = 0;
  TSR_CALL(decide(dt, B, T, H, KV, hd, qkv_stride, doc != NULL, &path));
  switch (path) {
#ifdef TSR_HAVE_CUDNN
    case TSR_ATT_PATH_CUDNN: /* never with doc (decide) */
      if (cudnn_fits({out, q, k, v}))
        return tsr_sdpa_graphs_fwd(dt, B, T, H, KV, hd, qkv_stride, q, k, v, out, lse,
                                   tsr_cuda_ctx.attn_ws, tsr_cuda_ctx.stream);
      return tsr_cuda_attention_tc_supported(hd)
                 ? tsr_attn_mma_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc)
                 : tsr_attn_f32_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc);
#endif
    case TSR_ATT_PATH_MMA:
      return tsr_attn_mma_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc);
  }
  return tsr_attn_f32_fwd(dt, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc);
}

static int backward(tsr_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                    const void *out, const float *lse, const void *q, const void *k,
                    const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                    const int32_t *doc) {
  TSR_CALL(check_shape(B, T, H, KV, hd, qkv_stride));
  if (!dq && !dk && !dv) return 0;
  int path = 0;
  TSR_CALL(decide(dt, B, T, H, KV, hd, qkv_stride, doc != NULL, &path));
  const cudaStream_t stream = tsr_cuda_ctx.stream;
#ifdef TSR_HAVE_CUDNN
  if (path == TSR_ATT_PATH_CUDNN) {
    if (dq && dk && dv && cudnn_fits({dq, dk, dv, dout, out, q, k, v}))
      return tsr_sdpa_graphs_bwd(dt, B, T, H, KV, hd, qkv_stride, q, k, v, out, dout, lse, dq,
                                 dk, dv, tsr_cuda_ctx.attn_ws, stream);
    path = tsr_cuda_attention_tc_supported(hd) ? TSR_ATT_PATH_MMA : TSR_ATT_PATH_F32;
  }
#endif
  const size_t bht = (size_t)B * H * T, part_stride = bht * hd;
  const int tc = path == TSR_ATT_PATH_MMA;
  const int grouped = tc && KV < H && (dk || dv);
  float *D = NULL, *part = NULL;
  TSR_CUDA_SCRATCH(D, tsr_ops_attention_scratch_bytes((long)bht, grouped ? 2 * (long)part_stride
                                                                         : 0));
  if (grouped) part = (float *)((char *)D + scratch_round(bht * sizeof(float)));
  const long warps = (long)bht;
  TSR_DTYPE_SWITCH(dt, S,
                   row_dot_kernel<S><<<(unsigned)((warps * 32 + 255) / 256), 256, 0, stream>>>(
                       D, (const S *)dout, (const S *)out, B, T, H, hd);
                   TSR_CUDA_LAUNCHED());
  if (path == TSR_ATT_PATH_F32)
    return tsr_attn_f32_bwd(dt, dq, dk, dv, dout, lse, D, q, k, v, B, T, H, KV, hd, qkv_stride,
                            doc);
  TSR_CALL(tsr_attn_mma_bwd(dt, dq, dk, dv, part, dout, lse, D, q, k, v, B, T, H, KV, hd,
                            qkv_stride, doc));
  if (grouped) {
    const float scale = (float)(1.0 / sqrt((double)hd));
    TSR_DTYPE_SWITCH(dt, S,
                     LAUNCH_ELEM(group_sum_kernel<S>, (long)B * T * KV * hd, stream, (S *)dk,
                                 (S *)dv, part, part_stride, B, T, H, KV, hd, qkv_stride, scale));
  }
  return 0;
}

extern "C" void tsr_cuda_attention_fwd(tsr_dtype dt, void *out, float *lse, const void *q,
                                      const void *k, const void *v, int B, int T, int H, int KV,
                                      int hd, int qkv_stride, const int32_t *doc) {
  TSR_CUDA_SKIP();
  tsr_cuda_prof_note(2.0 * B * H * (double)T * T * hd, "%s T %d hd %d%s", tsr_dtype_name(dt), T,
                    hd, doc ? " documents" : "");
  TSR_CUDA_RUN(forward(dt, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc));
}

extern "C" void tsr_cuda_attention_bwd(tsr_dtype dt, void *dq, void *dk, void *dv,
                                      const void *dout, const void *out, const float *lse,
                                      const void *q, const void *k, const void *v, int B, int T,
                                      int H, int KV, int hd, int qkv_stride, const int32_t *doc) {
  TSR_CUDA_SKIP();
  tsr_cuda_prof_note(5.0 * B * H * (double)T * T * hd, "%s T %d hd %d%s", tsr_dtype_name(dt), T,
                    hd, doc ? " documents" : "");
  TSR_CUDA_RUN(backward(dt, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc));
}

/* ------------------------------------------------------- blocks of a chunked sequence */

/* the block's diagonal as a row offset (query row i sees key row j when j <= i + off), as
 * the CPU kernel forms it */
static int block_off(int Tq, int Tk, long q0, long k0, int causal) {
  if (!causal) return Tk;
  const long d = q0 - k0;
  return d > Tk ? Tk : d < -(long)Tq ? -Tq : (int)d;
}

static int block_fwd(tsr_dtype dt, float *out, float *lse, const void *q, const void *k,
                     const void *v, int B, int Tq, int Tk, int H, int KV, int hd, int q_stride,
                     int kv_stride, long q0, long k0, int causal, const int32_t *doc) {
  if (B <= 0 || Tq <= 0 || H <= 0) return 0;
  TSR_CUDA_ARG(Tk >= 0 && KV > 0 && H % KV == 0 && hd > 0);
  TSR_CUDA_ARG(q_stride >= H * hd && kv_stride >= KV * hd);
  TSR_CUDA_ARG((long)B * H <= 65535);
  return tsr_attn_f32_block_fwd(dt, out, lse, q, k, v, B, Tq, Tk, H, KV, hd, q_stride, kv_stride,
                                block_off(Tq, Tk, q0, k0, causal), doc);
}

static int block_bwd(tsr_dtype dt, float *dq, float *dk, float *dv, const void *dout,
                     const void *out, const float *lse, const void *q, const void *k,
                     const void *v, int B, int Tq, int Tk, int H, int KV, int hd, int q_stride,
                     int kv_stride, long q0, long k0, int causal, const int32_t *doc) {
  if (B <= 0 || Tq <= 0 || Tk <= 0 || H <= 0 || (!dq && !dk && !dv)) return 0;
  TSR_CUDA_ARG(KV > 0 && H % KV == 0 && hd > 0);
  TSR_CUDA_ARG(q_stride >= H * hd && kv_stride >= KV * hd);
  TSR_CUDA_ARG((long)B * H <= 65535);
  const int off = block_off(Tq, Tk, q0, k0, causal);
  if (off <= -Tq) return 0; /* fully masked: nothing to add */
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  const size_t bht = (size_t)B * H * Tq;
  float *D = NULL;
  TSR_CUDA_SCRATCH(D, tsr_ops_attention_scratch_bytes((long)bht, 0));
  TSR_DTYPE_SWITCH(dt, S,
                   row_dot_kernel<S><<<(unsigned)(((long)bht * 32 + 255) / 256), 256, 0, stream>>>(
                       D, (const S *)dout, (const S *)out, B, Tq, H, hd);
                   TSR_CUDA_LAUNCHED());
  return tsr_attn_f32_block_bwd(dt, dq, dk, dv, dout, lse, D, q, k, v, B, Tq, Tk, H, KV, hd,
                                q_stride, kv_stride, off, doc);
}

/* One warp per (row, head): lane 0 reads both lse (which lse may overwrite), the warp
 * shares them, and every lane forms the weights and its head dims. */
__global__ void merge_kernel(float *out, float *lse, const float *o1, const float *lse1,
                             const float *o2, const float *lse2, int B, int T_, int H, int hd) {
  const long w = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= (long)B * T_ * H) return; /* whole warps leave together (blocks of 256) */
  const long row = w / H, b = row / T_, t = row % T_;
  const int h = (int)(w % H);
  const size_t st = ((size_t)b * H + h) * T_ + t, o = (size_t)w * hd;
  float l1 = 0.0f, l2 = 0.0f;
  if (lane == 0) l1 = lse1[st], l2 = lse2[st];
  l1 = __shfl_sync(0xffffffffu, l1, 0);
  l2 = __shfl_sync(0xffffffffu, l2, 0);
  float w1, w2, l;
  tsr_ops_attn_merge_weights(l1, l2, &w1, &w2, &l);
  for (int d = lane; d < hd; d += 32) out[o + d] = w1 * o1[o + d] + w2 * o2[o + d];
  if (lane == 0) lse[st] = l;
}

extern "C" void tsr_cuda_attention_block_fwd(tsr_dtype dt, float *out, float *lse, const void *q,
                                            const void *k, const void *v, int B, int Tq, int Tk,
                                            int H, int KV, int hd, int q_stride, int kv_stride,
                                            long q0, long k0, int causal, const int32_t *doc) {
  TSR_CUDA_SKIP();
  tsr_cuda_prof_note(4.0 * B * H * (double)Tq * Tk * hd, "%s Tq %d Tk %d hd %d",
                    tsr_dtype_name(dt), Tq, Tk, hd);
  TSR_CUDA_RUN(block_fwd(dt, out, lse, q, k, v, B, Tq, Tk, H, KV, hd, q_stride, kv_stride, q0,
                         k0, causal, doc));
}

extern "C" void tsr_cuda_attention_block_bwd(tsr_dtype dt, float *dq, float *dk, float *dv,
                                            const void *dout, const void *out, const float *lse,
                                            const void *q, const void *k, const void *v, int B,
                                            int Tq, int Tk, int H, int KV, int hd, int q_stride,
                                            int kv_stride, long q0, long k0, int causal,
                                            const int32_t *doc) {
  TSR_CUDA_SKIP();
  tsr_cuda_prof_note(10.0 * B * H * (double)Tq * Tk * hd, "%s Tq %d Tk %d hd %d",
                    tsr_dtype_name(dt), Tq, Tk, hd);
  TSR_CUDA_RUN(block_bwd(dt, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H, KV, hd, q_stride,
                         kv_stride, q0, k0, causal, doc));
}

static int merge(float *out, float *lse, const float *o1, const float *lse1, const float *o2,
                 const float *lse2, int B, int T, int H, int hd) {
  if (B <= 0 || T <= 0 || H <= 0) return 0;
  const long warps = (long)B * T * H;
  merge_kernel<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, tsr_cuda_ctx.stream>>>(
      out, lse, o1, lse1, o2, lse2, B, T, H, hd);
  TSR_CUDA_LAUNCHED();
  return 0;
}

extern "C" void tsr_cuda_attention_merge(float *out, float *lse, const float *o1,
                                        const float *lse1, const float *o2, const float *lse2,
                                        int B, int T, int H, int hd) {
  TSR_CUDA_SKIP();
  TSR_CUDA_RUN(merge(out, lse, o1, lse1, o2, lse2, B, T, H, hd));
}
