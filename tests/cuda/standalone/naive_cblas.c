/* naive_cblas.c — row-major sgemm with plain loops (see cblas.h next to it). */
#include <stdio.h>
#include <stdlib.h>

#include "cblas.h"

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m,
                 int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc) {
  if (order != CblasRowMajor) {
    fprintf(stderr, "naive cblas_sgemm: row-major only\n");
    abort();
  }
#pragma omp parallel for schedule(static)
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int p = 0; p < k; p++) {
        const float x = ta == CblasNoTrans ? a[(size_t)i * lda + p] : a[(size_t)p * lda + i];
        const float y = tb == CblasNoTrans ? b[(size_t)p * ldb + j] : b[(size_t)j * ldb + p];
        s += x * y;
      }
      float *cij = c + (size_t)i * ldc + j;
      *cij = alpha * s + (beta == 0.0f ? 0.0f : beta * *cij);
    }
}

void openblas_set_num_threads(int n) { (void)n; }
