/* cpu_adamw.c — the CPU backend's AdamW (tsr_cpu_adamw, the update of an offloaded ZeRO
 * shard) against a STREAM-style triad on the same threads, over arrays of the same
 * footprint, compiled with the same flags as src/cpu/ (bench/cpu_adamw.sh adds PyTorch).
 *
 *   bench/cpu_adamw [N REPS]          (default 67108864 elements, 10 repetitions)
 *
 * Threads: OpenMP's (OMP_NUM_THREADS), for both.  Each configuration runs once as a
 * warm-up (first touch, page faults), then REPS times, the configurations taking turns in
 * every repetition so that a machine busy with something else slows them alike; the
 * fastest repetition is reported (the least disturbed) with the median, and the least CPU
 * time of the process over the repetitions: on one thread, the time the work ran, which
 * the time slices other processes take from it do not inflate.  (With more threads the
 * kernel accounts the time of a thread running on another core at its ticks, so that a
 * repetition's CPU time can be off by a tick per thread: the script uses one thread's.)
 *
 * Bytes counted (what must cross the memory interface at least, no write-allocate):
 *   adamw        28 N: reads p, m, v, g (fp32) and writes p, m, v;
 *   adamw+bf16   30 N: the same, plus the bf16 compute copy written in the same pass;
 *   triad        STREAM's counting, 12 per element (reads b, c; writes a) over arrays of
 *                N4 = 4N/3 fp32 elements each: a, b, c together hold 16 N bytes, the
 *                footprint of p, m, v, g.  a[i] = b[i] + s * c[i].  Its store also reads
 *                a's line first (write-allocate), which STREAM does not count; AdamW reads
 *                every fp32 array it writes, so its 28 N is its whole traffic (the bf16
 *                copy's store allocates too: 2 N more, not counted).
 *
 * Output: one line per configuration, "name N threads best_s median_s best_cpu_s
 * GB/s(best) Mparam/s(best)" ("-" for the triad), for the script to read, after a comment
 * line. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "cpu/ops_cpu.h"
#include "ops/ops.h"

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
static double omp_get_wtime(void) { return tsr_now(); }
#endif

/* the process's CPU time (its threads') */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* a = b + s c, the loop of STREAM's triad on fp32, split over the threads statically */
static void triad(float *restrict a, const float *restrict b, const float *restrict c, float s,
                  long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

/* first touch by the threads that will use the pages (the same static split) */
static void fill(float *x, long n, uint64_t key, float scale, float offset) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++)
    x[i] = scale * (float)tsr_rand_uniform(key, (uint64_t)i) + offset;
}

int main(int argc, char **argv) {
  const long n = argc > 1 ? atol(argv[1]) : 67108864L;
  const int reps = argc > 2 ? atoi(argv[2]) : 10;
  if (n <= 0 || reps <= 0) {
    fprintf(stderr, "usage: cpu_adamw [N REPS]  (positive)\n");
    return 2;
  }
  tsr_cpu_open(0);
  const int threads = omp_get_max_threads();
  const long n4 = (4 * n + 2) / 3;
  float *p = malloc(sizeof(float) * n), *m = malloc(sizeof(float) * n);
  float *v = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
  uint16_t *out = malloc(sizeof(uint16_t) * n);
  float *a = malloc(sizeof(float) * n4), *b = malloc(sizeof(float) * n4);
  float *c = malloc(sizeof(float) * n4);
  enum { N_CFG = 3 };
  double *t = malloc(sizeof(double) * N_CFG * reps);
  double *cpu = malloc(sizeof(double) * N_CFG * reps);
  if (!p || !m || !v || !g || !out || !a || !b || !c || !t || !cpu) {
    fprintf(stderr, "cpu_adamw: out of memory for N = %ld\n", n);
    return 1;
  }
  fill(p, n, 1, 0.2f, -0.1f), fill(g, n, 2, 1.0f, -0.5f);
  fill(m, n, 3, 0.0f, 0.0f), fill(v, n, 4, 0.0f, 0.0f);
  fill(a, n4, 5, 0.0f, 0.0f), fill(b, n4, 6, 1.0f, 0.0f), fill(c, n4, 7, 1.0f, 0.0f);
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) out[i] = 0;
  const char *names[N_CFG] = {"adamw", "adamw+bf16", "triad"};
  const double bytes[N_CFG] = {28.0 * n, 30.0 * n, 12.0 * n4};
  long step = 1;
  for (int r = -1; r < reps; r++) /* r = -1: the warm-up */
    for (int k = 0; k < N_CFG; k++) {
      const double t0 = omp_get_wtime(), c0 = cpu_seconds();
      if (k == 2)
        triad(a, b, c, 3.0f, n4);
      else /* input/gpt2_124m.nml's AdamW: lr 6e-4, betas 0.9 / 0.95, eps 1e-8, wd 0.1 */
        tsr_cpu_adamw(p, m, v, g, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step++, 1.0f,
                      k == 1 ? out : NULL, TSR_BF16);
      const double dt = omp_get_wtime() - t0, dc = cpu_seconds() - c0;
      if (r >= 0) t[k * reps + r] = dt, cpu[k * reps + r] = dc;
    }
  double check = 0; /* the results, read so that no work can be skipped */
  for (long i = 0; i < n; i += 4099) check += p[i] + m[i] + v[i] + a[i % n4] + out[i];
  printf("# cpu_adamw: N %ld, %d threads, %d repetitions (+1 warm-up), check %.6g\n", n,
         threads, reps, check);
  for (int k = 0; k < N_CFG; k++) {
    qsort(t + k * reps, (size_t)reps, sizeof(double), cmp_d);
    qsort(cpu + k * reps, (size_t)reps, sizeof(double), cmp_d);
    const double best = t[k * reps], med = t[k * reps + reps / 2], best_cpu = cpu[k * reps];
    printf("%s %ld %d %.6f %.6f %.6f %.3f ", names[k], n, threads, best, med, best_cpu,
           bytes[k] / best / 1e9);
    if (k == 2)
      printf("-\n");
    else
      printf("%.2f\n", n / best / 1e6);
  }
  free(p), free(m), free(v), free(g), free(out), free(a), free(b), free(c), free(t), free(cpu);
  return 0;
}
