/* gemm.cu — the linear layers' GEMMs through cuBLASLt, in the row-major [out, in] weight
 * convention of ops.h.
 *
 * cuBLASLt is column-major; a row-major [r, c] matrix is a column-major [c, r] one, so
 *   y[n,out]  = x[n,in] w[out,in]^T   is  Y^T(out x n)  = op_T(W^T as in x out) X^T(in x n)
 *   dx[n,in] += dy[n,out] w[out,in]   is  dX^T(in x n) += W^T(in x out) dY^T(out x n)
 *   dw[out,in] += dy^T x              is  dW^T(in x out) += X^T(in x n) op_T(dY^T(out x n))
 * The fp32 path computes in true fp32 (CUBLAS_COMPUTE_32F: no TF32) by default, so it
 * matches the CPU's sgemm to rounding, or on tensor cores with 16-bit inputs when the
 * trainer asks (tsr_cuda_blas_set_inputs: bf16/fp16 training); the bf16 path feeds tensor
 * cores with fp32 accumulation.
 * Bias (and GELU) of the forward ride in the GEMM epilogue; the bias gradient is a
 * deterministic column sum (ops_elem.cu) rather than cuBLASLt's BGRAD epilogue, which
 * overwrites where ops.h accumulates. */
#include <cublasLt.h>

#include "cuda_common.cuh"

#define TSR_CUBLAS_CHECK(expr)                                                                \
  do {                                                                                        \
    cublasStatus_t tsr_s_ = (expr);                                                           \
    if (tsr_s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: %s: cuBLAS error %d: %s", __FILE__, \
                    __LINE__, __func__, #expr, (int)tsr_s_, cublasGetStatusString(tsr_s_));   \
      rc = TSR_ERR;                                                                           \
      goto done;                                                                              \
    }                                                                                         \
  } while (0)

/* from ops_elem.cu */
int tsr_cuda_colsum_(float *dst, const void *src, tsr_cuda_dtype type, int n, int C,
                     const tsr_cuda_scratch *ws, cudaStream_t stream);
int tsr_cuda_gelu_any_(void *out, const void *x, tsr_cuda_dtype type, long n, cudaStream_t stream);

struct tsr_cuda_blas {
  cublasLtHandle_t lt;
  cublasComputeType_t compute; /* of the fp32-storage GEMMs (tsr_cuda_blas_set_inputs) */
  void *workspace;
  size_t workspace_bytes;
};

extern "C" int tsr_cuda_blas_create(tsr_cuda_blas **out, size_t workspace_bytes) {
  int rc = 0;
  *out = NULL;
  tsr_cuda_blas *blas = (tsr_cuda_blas *)tsr_calloc(1, sizeof *blas);
  if (!blas) return TSR_ERR;
  blas->workspace_bytes = workspace_bytes ? workspace_bytes : (size_t)32 << 20;
  blas->compute = CUBLAS_COMPUTE_32F;
  TSR_CUBLAS_CHECK(cublasLtCreate(&blas->lt));
  if (cudaMalloc(&blas->workspace, blas->workspace_bytes) != cudaSuccess) {
    cudaGetLastError();
    tsr_error("%s:%d %s: cannot allocate a %zu-byte cuBLASLt workspace", __FILE__, __LINE__,
              __func__, blas->workspace_bytes);
    rc = TSR_ERR;
    goto done;
  }
  *out = blas;
  return 0;
done:
  tsr_cuda_blas_destroy(&blas);
  return rc;
}

extern "C" void tsr_cuda_blas_destroy(tsr_cuda_blas **blas) {
  if (!blas || !*blas) return;
  if ((*blas)->workspace) cudaFree((*blas)->workspace);
  if ((*blas)->lt) cublasLtDestroy((*blas)->lt);
  tsr_free(blas);
}

extern "C" void tsr_cuda_blas_set_inputs(tsr_cuda_blas *blas, int mode) {
  blas->compute = mode == 1   ? CUBLAS_COMPUTE_32F_FAST_16BF
                  : mode == 2 ? CUBLAS_COMPUTE_32F_FAST_16F
                              : CUBLAS_COMPUTE_32F;
}

static cudaDataType_t cuda_type(tsr_cuda_dtype t) { return t == TSR_CUDA_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

#define NO_ALGO (-1) /* cuBLASLt has no kernel for this combination: the caller may fall back */

/* D = C = alpha op(A) op(B) + beta C, column-major, m x n, inner dimension k.
 * epi: CUBLASLT_EPILOGUE_DEFAULT / BIAS / GELU_AUX / GELU_AUX_BIAS (bias: m entries in
 * C's type; aux: m x n, leading dimension m, C's type).  Returns 0, TSR_ERR, or NO_ALGO
 * (silently) when allow_no_algo is set and no kernel exists. */
static int lt_matmul(tsr_cuda_blas *blas, bool trans_a, bool trans_b, int m, int n, int k,
                     const void *A, cudaDataType_t a_type, int lda, const void *B,
                     cudaDataType_t b_type, int ldb, float beta, void *C, cudaDataType_t c_type,
                     int ldc, cublasLtEpilogue_t epi, const void *bias, void *aux,
                     bool allow_no_algo, cudaStream_t stream) {
  int rc = 0;
  const float alpha = 1.0f;
  cublasLtMatmulDesc_t desc = NULL;
  cublasLtMatrixLayout_t a_layout = NULL, b_layout = NULL, c_layout = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  int n_algo = 0;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t hs;

  /* 16-bit storage always runs on tensor cores; fp32 storage as tsr_cuda_blas_set_inputs says */
  const bool fp32_io = a_type == CUDA_R_32F && b_type == CUDA_R_32F;
  TSR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, fp32_io ? blas->compute : CUBLAS_COMPUTE_32F,
                                            CUDA_R_32F));
  TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) {
      const int32_t bias_type = (int32_t)c_type;
      TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                      sizeof bias_type));
    }
    if (aux) {
      const int64_t aux_ld = m;
      const int32_t aux_type = (int32_t)c_type;
      TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                      sizeof aux));
      TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                      sizeof aux_ld));
      TSR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                      &aux_type, sizeof aux_type));
    }
  }
  TSR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout, a_type, trans_a ? k : m, trans_a ? m : k, lda));
  TSR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout, b_type, trans_b ? n : k, trans_b ? k : n, ldb));
  TSR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_layout, c_type, m, n, ldc));
  TSR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  TSR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &blas->workspace_bytes,
                                                        sizeof blas->workspace_bytes));
  hs = cublasLtMatmulAlgoGetHeuristic(blas->lt, desc, a_layout, b_layout, c_layout, c_layout, pref, 1,
                                      &heur, &n_algo);
  if (allow_no_algo && (hs != CUBLAS_STATUS_SUCCESS || n_algo == 0)) { /* e.g. epilogue refused */
    rc = NO_ALGO;
    goto done;
  }
  if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && n_algo == 0)) {
    tsr_error("%s:%d %s: cuBLASLt has no algorithm for %c%c m=%d n=%d k=%d types %d,%d->%d epilogue %d",
              __FILE__, __LINE__, __func__, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k,
              (int)a_type, (int)b_type, (int)c_type, (int)epi);
    rc = TSR_ERR;
    goto done;
  }
  TSR_CUBLAS_CHECK(hs);
  TSR_CUBLAS_CHECK(cublasLtMatmul(blas->lt, desc, &alpha, A, a_layout, B, b_layout, &beta, C, c_layout, C,
                                  c_layout, &heur.algo, blas->workspace, blas->workspace_bytes, stream));
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (c_layout) cublasLtMatrixLayoutDestroy(c_layout);
  if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
  if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
  if (desc) cublasLtMatmulDescDestroy(desc);
  return rc;
}

/* Row-major y[n,out] (y_type) = x[n,in] w[out,in]^T, with optional bias / GELU epilogue. */
static int linear_fwd(tsr_cuda_blas *blas, void *y, tsr_cuda_dtype y_type, const void *x,
                      const void *w, tsr_cuda_dtype in_type, const void *bias, bool gelu,
                      void *pre_act, int n, int in, int out, cudaStream_t stream) {
  const cudaDataType_t it = cuda_type(in_type), ot = cuda_type(y_type);
  if (!gelu)
    return lt_matmul(blas, true, false, out, n, in, w, it, in, x, it, in, 0.0f, y, ot, out,
                     bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, false,
                     stream);
  if (out % 8 == 0) { /* cuBLASLt's rule for the GELU input's leading dimension */
    const int rc = lt_matmul(blas, true, false, out, n, in, w, it, in, x, it, in, 0.0f, y, ot, out,
                             bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
                             bias, pre_act, true, stream);
    if (rc != NO_ALGO) return rc;
  }
  /* unfused: the GEMM (+ bias) into pre_act, then GELU */
  TSR_CALL(lt_matmul(blas, true, false, out, n, in, w, it, in, x, it, in, 0.0f, pre_act, ot, out,
                     bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, false,
                     stream));
  return tsr_cuda_gelu_any_(y, pre_act, y_type, (long)n * out, stream);
}

/* dx (dx_type) = dy w;  dw (fp32) += dy^T x;  dbias (fp32) += colsum(dy). */
static int linear_bwd(tsr_cuda_blas *blas, void *dx, tsr_cuda_dtype dx_type, float *dw,
                      float *dbias, const void *dy, const void *x, const void *w,
                      tsr_cuda_dtype in_type, int n, int in, int out,
                      const tsr_cuda_scratch *ws, cudaStream_t stream) {
  const cudaDataType_t it = cuda_type(in_type);
  if (dx)
    TSR_CALL(lt_matmul(blas, false, false, in, n, out, w, it, in, dy, it, out, 0.0f, dx,
                       cuda_type(dx_type), in, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, false, stream));
  if (dw)
    TSR_CALL(lt_matmul(blas, false, true, in, out, n, x, it, in, dy, it, out, 1.0f, dw, CUDA_R_32F, in,
                       CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, false, stream));
  if (dbias) TSR_CALL(tsr_cuda_colsum_(dbias, dy, in_type, n, out, ws, stream));
  return 0;
}

/* dx = dy w over an empty sum (out = 0): zeros, written as any dx is. */
static int dx_empty_sum(void *dx, tsr_cuda_dtype dx_type, int n, int in, cudaStream_t stream) {
  if (!dx) return 0;
  const size_t elem = dx_type == TSR_CUDA_BF16 ? 2 : 4;
  TSR_CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)n * in * elem, stream));
  return 0;
}

extern "C" int tsr_cuda_matmul_fwd(tsr_cuda_blas *blas, float *y, const float *x, const float *w,
                                   const float *bias, int n, int in, int out,
                                   cudaStream_t stream) {
  if (n <= 0 || out <= 0) return 0;
  TSR_CUDA_ARG(blas && in > 0);
  return linear_fwd(blas, y, TSR_CUDA_F32, x, w, TSR_CUDA_F32, bias, false, NULL, n, in, out, stream);
}

extern "C" int tsr_cuda_matmul_bwd(tsr_cuda_blas *blas, float *dx, float *dw, float *dbias,
                                   const float *dy, const float *x, const float *w, int n, int in,
                                   int out, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (n <= 0 || in <= 0) return 0;
  TSR_CUDA_ARG(blas);
  if (out <= 0) return dx_empty_sum(dx, TSR_CUDA_F32, n, in, stream);
  return linear_bwd(blas, dx, TSR_CUDA_F32, dw, dbias, dy, x, w, TSR_CUDA_F32, n, in, out, ws,
                    stream);
}

extern "C" int tsr_cuda_matmul_fwd_bf16(tsr_cuda_blas *blas, void *y, tsr_cuda_dtype y_type,
                                        const tsr_bf16 *x, const tsr_bf16 *w, const void *bias,
                                        tsr_cuda_act act, void *pre_act, int n, int in, int out,
                                        cudaStream_t stream) {
  if (n <= 0 || out <= 0) return 0;
  TSR_CUDA_ARG(blas && in > 0);
  TSR_CUDA_ARG(act == TSR_CUDA_ACT_NONE || pre_act);
  return linear_fwd(blas, y, y_type, x, w, TSR_CUDA_BF16, bias, act == TSR_CUDA_ACT_GELU, pre_act,
                    n, in, out, stream);
}

extern "C" int tsr_cuda_matmul_bwd_bf16(tsr_cuda_blas *blas, void *dx, tsr_cuda_dtype dx_type,
                                        float *dw, float *dbias, const tsr_bf16 *dy,
                                        const tsr_bf16 *x, const tsr_bf16 *w, int n, int in,
                                        int out, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (n <= 0 || in <= 0) return 0;
  TSR_CUDA_ARG(blas);
  if (out <= 0) return dx_empty_sum(dx, dx_type, n, in, stream);
  return linear_bwd(blas, dx, dx_type, dw, dbias, dy, x, w, TSR_CUDA_BF16, n, in, out, ws, stream);
}
