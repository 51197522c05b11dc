/* gemm.cu — the linear layers through cuBLASLt, in ops_list.h's row-major [out, in]
 * weight convention, on fp32, bf16 or fp16 storage.
 *
 * cuBLASLt is column-major; a row-major [r, c] matrix is a column-major [c, r] one, so
 *   y[n,out]  = x[n,in] w[out,in]^T   is  Y^T(out x n)  = op_T(W^T as in x out) X^T(in x n)
 *   dx[n,in]  = dy[n,out] w[out,in]   is  dX^T(in x n)  = W^T(in x out) dY^T(out x n)
 *   dw[out,in] += dy^T x              is  dW^T(in x out) += X^T(in x n) op_T(dY^T(out x n))
 * fp32 storage computes in true fp32 (CUBLAS_COMPUTE_32F: no TF32), so it matches the
 * CPU's sgemm to rounding.  16-bit storage feeds A and B to the tensor cores as they are
 * stored (no copies), accumulates in fp32 and stores y and dx rounded once to the storage
 * type; dw is fp32 (C and D fp32, beta 1: it accumulates).  The bias rides in the forward's
 * epilogue, stored in the storage type as cuBLASLt wants it; the bias gradient is a
 * deterministic fp32 column sum of dy (cuda_common.cuh) rather than cuBLASLt's BGRAD
 * epilogue, which overwrites where ops_list.h accumulates.
 *
 * gelu_pre: dx = (dy w) * gelu'(gelu_pre).  cuBLASLt's DGELU epilogue where it has an
 * algorithm for the shape and types (the GELU input as its aux matrix, same layout as
 * dx); else the product goes to fp32 scratch a block of rows at a time and a kernel
 * multiplies and stores it, so the result is rounded once either way. */
#include "cuda_common.cuh"

extern "C" {
#include "backend.h"
}

static cudaDataType_t cuda_type(tsr_dtype t) {
  return t == TSR_BF16 ? CUDA_R_16BF : t == TSR_F16 ? CUDA_R_16F : CUDA_R_32F;
}

#define NO_ALGO (-1) /* cuBLASLt has no kernel for this combination: the caller falls back */

/* The GELU input's gradient factor, tanh form: d/dx 0.5 x (1 + tanh(u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3). */
#define GELU_C 0.7978845608028654f
#define GELU_A 0.044715f
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(GELU_C * (x + GELU_A * x * x * x));
  const float du = GELU_C * (1.0f + 3.0f * GELU_A * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

/* D = alpha op(A) op(B) + beta C, column-major, m x n, inner dimension k, C and D the
 * same matrix.  epi: DEFAULT, BIAS (m entries in C's type) or DGELU (aux: m x n of
 * aux_type, leading dimension m).  Returns 0, TSR_ERR, or NO_ALGO (silently) when
 * allow_no_algo is set and cuBLASLt has no kernel (nothing was written then). */
struct lt_args {
  bool trans_a, trans_b;
  int m, n, k;
  const void *A;
  cudaDataType_t a_type;
  int lda;
  const void *B;
  cudaDataType_t b_type;
  int ldb;
  float beta;
  void *C;
  cudaDataType_t c_type;
  int ldc;
  cublasLtEpilogue_t epi;
  const void *bias;
  const void *aux;
  cudaDataType_t aux_type;
  bool allow_no_algo;
};

static int lt_matmul(const lt_args &g) {
  int rc = 0;
  const float alpha = 1.0f;
  cublasLtMatmulDesc_t desc = NULL;
  cublasLtMatrixLayout_t a_layout = NULL, b_layout = NULL, c_layout = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  int n_algo = 0;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t hs;
  tsr_cuda_context *ctx = &tsr_cuda_ctx;

  TSR_CUBLAS_GOTO(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TSR_CUBLAS_GOTO(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  TSR_CUBLAS_GOTO(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (g.epi != CUBLASLT_EPILOGUE_DEFAULT) {
    TSR_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi,
                                                    sizeof g.epi));
    if (g.bias) {
      const int32_t bias_type = (int32_t)g.c_type;
      TSR_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &g.bias, sizeof g.bias));
      TSR_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &bias_type, sizeof bias_type));
    }
    if (g.aux) {
      const int64_t aux_ld = g.m;
      const int32_t aux_type = (int32_t)g.aux_type;
      TSR_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
      TSR_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                      &aux_ld, sizeof aux_ld));
      TSR_CUBLAS_GOTO(cublasLtMatmulDescSetAttribute(
          desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof aux_type));
    }
  }
  TSR_CUBLAS_GOTO(cublasLtMatrixLayoutCreate(&a_layout, g.a_type, g.trans_a ? g.k : g.m,
                                              g.trans_a ? g.m : g.k, g.lda));
  TSR_CUBLAS_GOTO(cublasLtMatrixLayoutCreate(&b_layout, g.b_type, g.trans_b ? g.n : g.k,
                                              g.trans_b ? g.k : g.n, g.ldb));
  TSR_CUBLAS_GOTO(cublasLtMatrixLayoutCreate(&c_layout, g.c_type, g.m, g.n, g.ldc));
  TSR_CUBLAS_GOTO(cublasLtMatmulPreferenceCreate(&pref));
  TSR_CUBLAS_GOTO(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->lt_ws_bytes, sizeof ctx->lt_ws_bytes));
  hs = cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, a_layout, b_layout, c_layout, c_layout, pref,
                                      1, &heur, &n_algo);
  if (g.allow_no_algo && (hs != CUBLAS_STATUS_SUCCESS || n_algo == 0)) { /* epilogue refused */
    rc = NO_ALGO;
    goto done;
  }
  if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && n_algo == 0)) {
    tsr_error("%s:%d %s: cuBLASLt has no algorithm for %c%c m=%d n=%d k=%d types %d,%d->%d "
              "epilogue %d",
              __FILE__, __LINE__, __func__, g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.m,
              g.n, g.k, (int)g.a_type, (int)g.b_type, (int)g.c_type, (int)g.epi);
    rc = TSR_ERR;
    goto done;
  }
  TSR_CUBLAS_GOTO(hs);
  hs = cublasLtMatmul(ctx->lt, desc, &alpha, g.A, a_layout, g.B, b_layout, &g.beta, g.C,
                      c_layout, g.C, c_layout, &heur.algo, ctx->lt_ws, ctx->lt_ws_bytes,
                      ctx->stream);
  if (g.allow_no_algo && hs == CUBLAS_STATUS_NOT_SUPPORTED) { /* refused only when run */
    rc = NO_ALGO;
    goto done;
  }
  TSR_CUBLAS_GOTO(hs);
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (c_layout) cublasLtMatrixLayoutDestroy(c_layout);
  if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
  if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
  if (desc) cublasLtMatmulDescDestroy(desc);
  return rc;
}

/* dx[r, c] = p[r, c] * gelu'(pre[r, c]) over rows x cols, p fp32 (the product) */
template <class T>
__global__ void dgelu_kernel(T *dx, const float *p, const T *pre, long n) {
  GRID_STRIDE_LOOP(i, n) dx[i] = from_f32<T>(p[i] * gelu_grad(to_f32(pre[i])));
}

/* Rows of dx the fallback of gelu_pre computes per GEMM: an fp32 block of them must fit
 * the scratch, which tsr_cuda_scratch_gemm sizes for this many rows of the widest layer. */
#define DGELU_ROWS 256

/* dx = (dy w) * gelu'(pre) without the epilogue: row blocks through fp32 scratch */
static int dx_dgelu_unfused(tsr_dtype dt, void *dx, const void *dy, const void *w,
                            const void *pre, int n, int in, int out) {
  const size_t es = tsr_dtype_size(dt);
  const cudaDataType_t t = cuda_type(dt);
  const int rows = n < DGELU_ROWS ? n : DGELU_ROWS;
  float *p = NULL;
  TSR_CUDA_SCRATCH(p, (size_t)rows * in * sizeof(float));
  for (int r0 = 0; r0 < n; r0 += rows) {
    const int nr = n - r0 < rows ? n - r0 : rows;
    lt_args g = {false, false, in, nr, out, w, t, in, (const char *)dy + (size_t)r0 * out * es, t,
                 out, 0.0f, p, CUDA_R_32F, in, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL,
                 CUDA_R_32F, false};
    TSR_CALL(lt_matmul(g));
    const long m = (long)nr * in;
    const size_t off = (size_t)r0 * in * es;
    TSR_DTYPE_SWITCH(dt, T,
                     LAUNCH_ELEM(dgelu_kernel<T>, m, tsr_cuda_ctx.stream, (T *)((char *)dx + off),
                                 p, (const T *)((const char *)pre + off), m));
  }
  return 0;
}

static int matmul_forward(tsr_dtype dt, void *y, const void *x, const void *w, const void *bias,
                          int n, int in, int out) {
  if (n <= 0 || out <= 0) return 0;
  TSR_CUDA_ARG(x && w && y && in > 0);
  const cudaDataType_t t = cuda_type(dt);
  lt_args g = {true, false, out, n, in, w, t, in, x, t, in, 0.0f, y, t, out,
               bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, t, false};
  return lt_matmul(g);
}

static int matmul_backward(tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                           const void *x, const void *w, const void *gelu_pre, int n, int in,
                           int out) {
  if (n <= 0 || in <= 0) return 0;
  const cudaDataType_t t = cuda_type(dt);
  if (out <= 0) { /* an empty sum: dx = 0 (times gelu', still 0), written */
    if (dx) TSR_CUDA_CALL(cudaMemsetAsync(dx, 0, (size_t)n * in * tsr_dtype_size(dt),
                                           tsr_cuda_ctx.stream));
    return 0;
  }
  TSR_CUDA_ARG(dy && (!dx || w) && (!dw || x));
  if (dx && gelu_pre) {
    int rc = NO_ALGO;
    if (in % 8 == 0) { /* cuBLASLt's rule for an aux matrix's leading dimension */
      lt_args g = {false, false, in, n, out, w, t, in, dy, t, out, 0.0f, dx, t, in,
                   CUBLASLT_EPILOGUE_DGELU, NULL, gelu_pre, t, true};
      rc = lt_matmul(g);
    }
    if (rc == NO_ALGO) rc = dx_dgelu_unfused(dt, dx, dy, w, gelu_pre, n, in, out);
    TSR_CALL(rc);
  } else if (dx) {
    lt_args g = {false, false, in, n, out, w, t, in, dy, t, out, 0.0f, dx, t, in,
                 CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, t, false};
    TSR_CALL(lt_matmul(g));
  }
  if (dw) {
    lt_args g = {false, true, in, out, n, x, t, in, dy, t, out, 1.0f, dw, CUDA_R_32F, in,
                 CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, t, false};
    TSR_CALL(lt_matmul(g));
  }
  if (dbias)
    TSR_DTYPE_SWITCH(dt, T,
                     TSR_CALL(col_reduce(dbias, ColumnOf<T>{(const T *)dy, out}, n, out,
                                         tsr_cuda_ctx.stream)));
  return 0;
}

extern "C" int tsr_cuda_linear_fwd(tsr_dtype dt, void *y, const void *x, const void *w,
                                   const void *bias, int n, int in, int out) {
  return matmul_forward(dt, y, x, w, bias, n, in, out);
}

extern "C" int tsr_cuda_linear_bwd(tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                                   const void *x, const void *w, const void *gelu_pre, int n,
                                   int in, int out) {
  return matmul_backward(dt, dx, dw, dbias, dy, x, w, gelu_pre, n, in, out);
}

extern "C" int tsr_cuda_scratch_gemm(const tsr_ops_shapes *s, size_t *bytes) {
  const long rows = s->rows < DGELU_ROWS ? s->rows : DGELU_ROWS;
  const size_t dgelu = rows > 0 && s->cols > 0 ? (size_t)rows * s->cols * sizeof(float) : 0;
  const size_t cols = col_scratch(s->rows, s->cols);
  *bytes = dgelu > cols ? dgelu : cols;
  return 0;
}

extern "C" void tsr_cuda_matmul_fwd(tsr_dtype dt, void *y, const void *x, const void *w,
                                   const void *bias, int n, int in, int out) {
  TSR_CUDA_SKIP();
  tsr_cuda_prof_note(2.0 * n * in * out, "%s %d x %d -> %d%s", tsr_dtype_name(dt), n, in, out,
                    bias ? " +bias" : "");
  TSR_CUDA_RUN(matmul_forward(dt, y, x, w, bias, n, in, out));
}

extern "C" void tsr_cuda_matmul_bwd(tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                                   const void *x, const void *w, const void *gelu_pre, int n,
                                   int in, int out) {
  TSR_CUDA_SKIP();
  const double flops = ((dx ? 2.0 : 0.0) + (dw ? 2.0 : 0.0)) * n * in * out;
  tsr_cuda_prof_note(flops, "%s %d x %d -> %d%s%s", tsr_dtype_name(dt), n, in, out,
                    dx ? "" : " (no dx)", gelu_pre ? " +dgelu" : "");
  TSR_CUDA_RUN(matmul_backward(dt, dx, dw, dbias, dy, x, w, gelu_pre, n, in, out));
}
