/* xent_head_ops.c — the LM head and its loss alone, on the CPU: the unfused ops (matmul_fwd
 * into the whole logits, xent with its gradient, matmul_bwd for dx and dw) against the
 * fused xent_head at several chunk sizes, fwd and bwd of one micro-batch, in fp32 and bf16.
 *
 *   bench/xent_head_ops [N C V REPS CHUNK...]     (default 2048 768 50304 5 1024 256)
 *
 * The defaults are gpt2_124m's head (d_model 768, vocabulary 50304) on 2 sequences of 1024
 * tokens.  The configurations take turns in every repetition, so a machine busy with
 * something else slows them alike; the table gives the fastest and the median repetition
 * (the fastest is the one least disturbed) and the logits' bytes each keeps.  The losses
 * are printed as a check that every configuration computed the same thing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "cpu/ops_cpu.h"
#include "core/util.h"

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const int N = argc > 1 ? atoi(argv[1]) : 2048, C = argc > 2 ? atoi(argv[2]) : 768;
  const int V = argc > 3 ? atoi(argv[3]) : 50304, reps = argc > 4 ? atoi(argv[4]) : 5;
  int chunks[16], n_cfg = 1; /* configuration 0: unfused */
  chunks[0] = -1;
  for (int i = 5; i < argc && n_cfg < 16; i++) chunks[n_cfg++] = atoi(argv[i]);
  if (argc <= 5) chunks[n_cfg++] = 1024, chunks[n_cfg++] = 256;
  if (N <= 0 || C <= 0 || V <= 0 || reps <= 0) {
    fprintf(stderr, "error: N C V REPS must be positive\n");
    return 2;
  }
  tsr_cpu_open(0);
  printf("LM head + loss, %d tokens x d_model %d -> vocabulary %d, %d repetitions\n", N, C, V,
         reps);
  printf("%-5s %-10s %10s %10s %12s %8s %18s\n", "prec", "head", "best ms", "median ms",
         "logits MB", "vs unf.", "loss");
  const tsr_dtype dts[2] = {TSR_F32, TSR_BF16};
  for (int d = 0; d < 2; d++) {
    const tsr_dtype dt = dts[d];
    const size_t es = tsr_dtype_size(dt);
    float *xf = tsr_calloc((size_t)N * C, sizeof(float));
    float *wf = tsr_calloc((size_t)V * C, sizeof(float));
    void *x = tsr_calloc((size_t)N * C, es), *w = tsr_calloc((size_t)V * C, es);
    void *dx = tsr_calloc((size_t)N * C, es), *logits = tsr_calloc((size_t)N * V, es);
    float *dw = tsr_calloc((size_t)V * C, sizeof(float));
    int32_t *t = tsr_calloc((size_t)N, sizeof(int32_t));
    double *ms = tsr_calloc((size_t)n_cfg * reps, sizeof(double)), loss[16];
    if (!xf || !wf || !x || !w || !dx || !logits || !dw || !t || !ms) return 1;
    uint64_t k = 12345;
    for (size_t i = 0; i < (size_t)N * C; i++) xf[i] = (float)(tsr_rand_uniform(k, i) - 0.5);
    for (size_t i = 0; i < (size_t)V * C; i++)
      wf[i] = (float)(0.1 * (tsr_rand_uniform(k + 1, i) - 0.5));
    for (int r = 0; r < N; r++) t[r] = (int32_t)(tsr_rand_uniform(k + 2, (uint64_t)r) * V) % V;
    tsr_ops_cast(dt, x, TSR_F32, xf, (long)N * C);
    tsr_ops_cast(dt, w, TSR_F32, wf, (long)V * C);
    for (int rep = 0; rep < reps; rep++)
      for (int c = 0; c < n_cfg; c++) {
        double l = 0;
        const double t0 = tsr_now();
        if (chunks[c] < 0) {
          tsr_ops_matmul_fwd(dt, logits, x, w, NULL, N, C, V);
          tsr_ops_xent(dt, &l, (double)N, logits, t, N, V, 1.0f / N, 1);
          tsr_ops_matmul_bwd(dt, dx, dw, NULL, logits, x, w, NULL, N, C, V);
        } else { /* the whole logits buffer serves as the chunk's scratch */
          tsr_ops_xent_head(dt, &l, (double)N, dx, dw, x, w, t, logits, N, C, V, chunks[c],
                            1.0f / N);
        }
        ms[c * reps + rep] = 1e3 * (tsr_now() - t0);
        loss[c] = l;
      }
    double best0 = 0;
    for (int c = 0; c < n_cfg; c++) {
      double *m = ms + (size_t)c * reps;
      qsort(m, (size_t)reps, sizeof(double), cmp_d);
      if (c == 0) best0 = m[0];
      char name[32];
      const int rows = chunks[c] < 0 || chunks[c] > N || chunks[c] == 0 ? N : chunks[c];
      if (chunks[c] < 0)
        snprintf(name, sizeof name, "unfused");
      else
        snprintf(name, sizeof name, "chunk %d", chunks[c]);
      printf("%-5s %-10s %10.0f %10.0f %12.1f %8.2f %18.12f\n", tsr_dtype_name(dt), name, m[0],
             m[reps / 2], (double)rows * V * es / 1e6, m[0] / best0, loss[c]);
    }
    tsr_free(&xf), tsr_free(&wf), tsr_free(&x), tsr_free(&w), tsr_free(&dx), tsr_free(&logits);
    tsr_free(&dw), tsr_free(&t), tsr_free(&ms);
  }
  return 0;
}
