/* cblas.h — the part of the CBLAS interface the CPU kernels (src/cpu*.c) use, for building
 * the CUDA kernel tests where no BLAS is installed (tools/gpu/device-test.sh on a GPU
 * machine without one).
 * naive_cblas.c implements it with plain loops: slow, but exact fp32 and enough for the
 * test shapes.  Never used by the application build. */
#ifndef TSR_NAIVE_CBLAS_H
#define TSR_NAIVE_CBLAS_H
typedef enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 } CBLAS_ORDER;
typedef CBLAS_ORDER CBLAS_LAYOUT;
typedef enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 } CBLAS_TRANSPOSE;
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m,
                 int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                 float beta, float *c, int ldc);
void openblas_set_num_threads(int n);
#endif
