/* test_comm.c — every comm operation against a closed form, on fp32, bf16 and fp16 data
 * (MPI test; grid_comm.sh runs it on 1, 2, 3 and 4 ranks).
 *
 * Exact data: rank r's element i is value(dt, key, r, i), which any rank can compute, so
 * every expected result is a closed form.  fp32: a random multiple of 1/128 in (-8, 8),
 * never zero; a sum of up to 8 needs fewer than 24 significant bits.  bf16 and fp16: a
 * random nonzero integer in [-31, 31] times 2^(i % 5 - 2); a sum of up to 8 of them is an
 * integer below 256 times the same power of two.  Every partial sum is then exact in the
 * type, in whatever order MPI or NCCL combine, and results are compared with ==.
 *
 * Rounded data (bf16, fp16): values with random mantissas and signs over 2^-6 .. 2^7, so
 * sums round.  Over N ranks every element of a sum must lie within the bound of N - 1
 * roundings of the exact sum (sum |x| * (N-1)u / (1 - (N-1)u), u the type's unit
 * roundoff); over 2 ranks it must be the exactly rounded sum; and an all-reduce's result
 * must be bitwise the same on every rank.  Small and large buffers (MPI picks its
 * algorithm by size), blocking and non-blocking, even and uneven blocks.
 *
 * The same checks run on the world group, on pairs (color rank / 2: sizes 2 and, with an
 * odd world, 1), on each rank alone (size 1: the copy-only fast paths), and on 4 ranks
 * also on a group of 3 (+ one of 1).  Byte counters are compared exactly with the ring
 * formulas of comm.h, with 2 bytes per 16-bit element (sizes chosen so that every term is
 * a whole number of bytes).  Checks are reduced over all ranks; rank 0 prints PASS/FAIL;
 * exit 1 on any failure.  Some checks provoke errors on purpose: their "error:" lines
 * are expected.
 *
 * Buffers are op memory (tsr_ops_alloc) and are read after tsr_ops_sync().  The device
 * build's memory-only device gives managed memory, which the host reads and writes in
 * place (the trainer's backend gives device memory, reached through copies: this test is
 * about the transports, not the memory), so the same
 * checks run on a GPU: built with -DTEST_COMM_DEVICE (tests/cuda/comm_emu.sh, against the
 * CUDA runtime and NCCL, emulated), every rank drives its own device, the groups of more
 * than one rank get a device transport (comm_dev.h), and their operations on op memory
 * go through it.  TEST_COMM_TRANSPORT=nccl (default): NCCL's collectives, with host
 * scalars and send/recv on MPI; =staged: MPI through pinned host buffers
 * (cuda/comm_stage.c), send/recv included.  Size-1 groups stay on MPI. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#if defined(MPI_VERSION) || defined(OMPI_MPI_H)
#error "comm.h must not include mpi.h (model code includes it)"
#endif

#include <mpi.h>

#include "comm_mpi.h"
#include "mpicheck.h"
#include "ops.h"
#include "util.h"
#ifdef TEST_COMM_DEVICE
#include <cuda_runtime_api.h>

#include "comm_nccl.h"
#include "comm_stage.h"
#include "select.h"
#include "ops_backend.h"
#include "backend.h"
#endif

/* ---------------------------------------------------------------- data */

static float value(tsr_dtype dt, uint64_t key, int r, size_t i) {
  const double u = tsr_rand_uniform(key, (uint64_t)r * 1000003u + i);
  if (dt == TSR_F32) return (float)((int)(u * 1024.0) - 512) / 64.0f + 1.0f / 128.0f;
  int k = (int)(u * 62.0) - 31; /* -31 .. 30, then 0 .. 30 moved up to 1 .. 31 */
  if (k >= 0) k++;
  return ldexpf((float)k, (int)(i % 5) - 2);
}

static float get(tsr_dtype dt, const void *x, size_t i) { return tsr_load(dt, x, i); }

static void fill(void *x, tsr_dtype dt, size_t n, uint64_t key, int r) {
  for (size_t i = 0; i < n; i++) tsr_store(dt, x, i, value(dt, key, r, i));
}

/* sum over ranks 0..N-1 of value(dt, key, r, i0 + i) == x[i], for i < n. */
static int is_sum(const void *x, tsr_dtype dt, size_t n, uint64_t key, int N, size_t i0) {
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    float s = 0;
    for (int r = 0; r < N; r++) s += value(dt, key, r, i0 + i);
    ok &= get(dt, x, i) == s;
  }
  return ok;
}

/* x holds rank r's block of `block` elements at r * block, for every rank. */
static int is_gathered(const void *x, tsr_dtype dt, size_t block, uint64_t key, int N) {
  int ok = 1;
  for (int r = 0; r < N; r++)
    for (size_t i = 0; i < block; i++) ok &= get(dt, x, r * block + i) == value(dt, key, r, i);
  return ok;
}

static unsigned char pattern(int root, size_t i) { return (unsigned char)(root * 31 + i * 7 + 1); }

/* ---------------------------------------------------------------- exact data */

/* All operations on one group c with data of type dt (every rank of the world calls this
 * with its own group, so the sequence of checks is the same everywhere). */
static void test_group(tsr_comm *c, const char *label, uint64_t key, tsr_dtype dt) {
  const int N = tsr_comm_size(c), me = tsr_comm_rank(c);
  const int next = (me + 1) % N, prev = (me + N - 1) % N;
  const size_t es = tsr_dtype_size(dt);
  enum { AR = 37, RS = 29, AG = 23, BC = 51, P2P = 19 };
  void *a = tsr_ops_alloc(AR, es), *rs_in = tsr_ops_alloc((size_t)RS * N, es),
       *rs_out = tsr_ops_alloc(RS, es), *ag_out = tsr_ops_alloc((size_t)AG * N, es),
       *ag_in = tsr_ops_alloc(AG, es), *p_out = tsr_ops_alloc(P2P, es),
       *p_in = tsr_ops_alloc(P2P, es), *p_in2 = tsr_ops_alloc(P2P, es),
       *p_out2 = tsr_ops_alloc(P2P, es);
  unsigned char *bc = tsr_ops_alloc(BC, 1);
  double *dd = tsr_ops_alloc(2, sizeof(double));
  int *dn = tsr_ops_alloc(2, sizeof(int));
  tsr_ops_sync(); /* op memory is written by the host from here on */

  /* ---- blocking ---- */
  fill(a, dt, AR, key, me);
  int rc = tsr_comm_all_reduce(c, a, AR, dt);
  tsr_ops_sync();
  check(rc == 0 && is_sum(a, dt, AR, key, N, 0), "%s: all_reduce of %d elements = closed-form sum",
        label, AR);

  fill(rs_in, dt, (size_t)RS * N, key + 1, me);
  rc = tsr_comm_reduce_scatter(c, rs_in, rs_out, RS, dt);
  tsr_ops_sync();
  check(rc == 0 && is_sum(rs_out, dt, RS, key + 1, N, (size_t)me * RS),
        "%s: reduce_scatter gives this rank's block of the sum", label);

  fill(ag_in, dt, AG, key + 2, me);
  rc = tsr_comm_all_gather(c, ag_in, ag_out, AG, dt);
  tsr_ops_sync();
  check(rc == 0 && is_gathered(ag_out, dt, AG, key + 2, N),
        "%s: all_gather puts rank r's block at r * %d", label, AG);

  memset(ag_out, 0, es * AG * N);
  void *mine = tsr_dtype_at(ag_out, dt, (int64_t)me * AG);
  fill(mine, dt, AG, key + 3, me);
  rc = tsr_comm_all_gather(c, mine, ag_out, AG, dt);
  tsr_ops_sync();
  check(rc == 0 && is_gathered(ag_out, dt, AG, key + 3, N),
        "%s: all_gather in place (send = this rank's block of recv)", label);

  int ok = 1;
  for (int root = 0; root < N; root++) {
    for (size_t i = 0; i < BC; i++) bc[i] = me == root ? pattern(root, i) : 0xEE;
    ok &= tsr_comm_broadcast(c, bc, BC, root) == 0;
    tsr_ops_sync();
    for (size_t i = 0; i < BC; i++) ok &= bc[i] == pattern(root, i);
  }
  check(ok, "%s: broadcast of %d bytes from every root", label, BC);

  ok = 1;
  if (N > 1) { /* a ring; even ranks send first so blocking calls cannot deadlock */
    fill(p_out, dt, P2P, key + 4, me);
    memset(p_in, 0, es * P2P);
    if (me % 2 == 0) {
      ok &= tsr_comm_send(c, p_out, es * P2P, next, 5) == 0;
      ok &= tsr_comm_recv(c, p_in, es * P2P, prev, 5) == 0;
    } else {
      ok &= tsr_comm_recv(c, p_in, es * P2P, prev, 5) == 0;
      ok &= tsr_comm_send(c, p_out, es * P2P, next, 5) == 0;
    }
    tsr_ops_sync();
    for (int i = 0; i < P2P; i++) ok &= get(dt, p_in, i) == value(dt, key + 4, prev, (size_t)i);
  }
  check(ok, "%s: send/recv of %d elements around a ring of %d", label, P2P, N);

  /* ---- non-blocking: everything in flight at once, then waitall ---- */
  tsr_comm_handle h[8];
  int nh = 0;
  ok = 1;
  fill(a, dt, AR, key + 5, me);
  fill(rs_in, dt, (size_t)RS * N, key + 6, me);
  fill(ag_in, dt, AG, key + 7, me);
  const int bc_root = N - 1;
  for (size_t i = 0; i < BC; i++) bc[i] = me == bc_root ? pattern(bc_root, i) : 0xEE;
  ok &= tsr_comm_iall_reduce(c, a, AR, dt, &h[nh++]) == 0;
  ok &= tsr_comm_ireduce_scatter(c, rs_in, rs_out, RS, dt, &h[nh++]) == 0;
  ok &= tsr_comm_iall_gather(c, ag_in, ag_out, AG, dt, &h[nh++]) == 0;
  ok &= tsr_comm_ibroadcast(c, bc, BC, bc_root, &h[nh++]) == 0;
  if (N > 1) { /* two messages on one pair, received in the opposite order: tags matter */
    fill(p_out, dt, P2P, key + 8, me);
    fill(p_out2, dt, P2P, key + 11, me);
    ok &= tsr_comm_irecv(c, p_in2, es * P2P, prev, 2, &h[nh++]) == 0;
    ok &= tsr_comm_irecv(c, p_in, es * P2P, prev, 1, &h[nh++]) == 0;
    ok &= tsr_comm_isend(c, p_out, es * P2P, next, 1, &h[nh++]) == 0;
    ok &= tsr_comm_isend(c, p_out2, es * P2P, next, 2, &h[nh++]) == 0;
  }
  if (N == 1)
    for (int i = 0; i < nh; i++) ok &= h[i] == NULL; /* size 1: done at once */
  ok &= tsr_comm_waitall(nh, h) == 0;
  tsr_ops_sync();
  for (int i = 0; i < nh; i++) ok &= h[i] == NULL;
  ok &= is_sum(a, dt, AR, key + 5, N, 0) && is_sum(rs_out, dt, RS, key + 6, N, (size_t)me * RS);
  ok &= is_gathered(ag_out, dt, AG, key + 7, N);
  for (size_t i = 0; i < BC; i++) ok &= bc[i] == pattern(bc_root, i);
  if (N > 1) {
    for (int i = 0; i < P2P; i++)
      ok &= get(dt, p_in, i) == value(dt, key + 8, prev, (size_t)i) &&
            get(dt, p_in2, i) == value(dt, key + 11, prev, (size_t)i);
  }
  check(ok, "%s: %d non-blocking operations in flight, then waitall", label, nh);

  /* one at a time, waited in reverse order of posting */
  ok = 1;
  fill(a, dt, AR, key + 9, me);
  fill(ag_in, dt, AG, key + 10, me);
  tsr_comm_handle h1 = NULL, h2 = NULL;
  ok &= tsr_comm_iall_reduce(c, a, AR, dt, &h1) == 0;
  ok &= tsr_comm_iall_gather(c, ag_in, ag_out, AG, dt, &h2) == 0;
  ok &= tsr_comm_wait(&h2) == 0 && tsr_comm_wait(&h1) == 0 && !h1 && !h2;
  ok &= tsr_comm_wait(&h1) == 0; /* waiting on a completed (NULL) handle is a no-op */
  tsr_ops_sync();
  ok &= is_sum(a, dt, AR, key + 9, N, 0) && is_gathered(ag_out, dt, AG, key + 10, N);
  check(ok, "%s: tsr_comm_wait on single handles, in reverse order", label);

  if (dt == TSR_F32) { /* the scalar all-reduces have no element type */
    double d[2] = {me + 0.25, 1.5 * me};
    int n[2] = {3 * me, -me};
    ok = tsr_comm_all_reduce_double(c, d, 1, TSR_COMM_SUM) == 0 &&
         tsr_comm_all_reduce_double(c, d + 1, 1, TSR_COMM_MAX) == 0 &&
         tsr_comm_all_reduce_int(c, n, 1, TSR_COMM_MAX) == 0 &&
         tsr_comm_all_reduce_int(c, n + 1, 1, TSR_COMM_MIN) == 0;
    ok &= d[0] == N * (N - 1) / 2.0 + 0.25 * N && d[1] == 1.5 * (N - 1) && n[0] == 3 * (N - 1) &&
          n[1] == -(N - 1);
    check(ok, "%s: scalar all-reduces (double sum, max; int max, min)", label);

    /* the same on op memory (on a GPU: through the device transport) */
    dd[0] = me + 0.25, dd[1] = 1.5 * me, dn[0] = 3 * me, dn[1] = -me;
    ok = tsr_comm_all_reduce_double(c, dd, 1, TSR_COMM_SUM) == 0 &&
         tsr_comm_all_reduce_double(c, dd + 1, 1, TSR_COMM_MAX) == 0 &&
         tsr_comm_all_reduce_int(c, dn, 1, TSR_COMM_MAX) == 0 &&
         tsr_comm_all_reduce_int(c, dn + 1, 1, TSR_COMM_MIN) == 0;
    tsr_ops_sync();
    ok &= dd[0] == N * (N - 1) / 2.0 + 0.25 * N && dd[1] == 1.5 * (N - 1) &&
          dn[0] == 3 * (N - 1) && dn[1] == -(N - 1);
    check(ok, "%s: scalar all-reduces on op memory", label);
  }

  /* polled to completion with tsr_comm_test */
  fill(a, dt, AR, key + 12, me);
  tsr_comm_handle ht = NULL;
  ok = tsr_comm_iall_reduce(c, a, AR, dt, &ht) == 0;
  for (int done = 0, spins = 0; ok && !done && spins < 100000000; spins++)
    ok &= tsr_comm_test(&ht, &done) == 0;
  tsr_ops_sync();
  ok &= ht == NULL && is_sum(a, dt, AR, key + 12, N, 0);
  check(ok, "%s: tsr_comm_test drives an all-reduce to completion", label);

  /* uneven blocks, one of them empty */
  {
    size_t counts[64], total = 0, off = 0;
    for (int r = 0; r < N && r < 64; r++) total += counts[r] = (size_t)((r * 7 + 3) % 11) * (r != 1);
    for (int r = 0; r < me; r++) off += counts[r];
    void *vs = tsr_ops_alloc(total + 1, es), *vr = tsr_ops_alloc(counts[me] + 1, es),
         *vg = tsr_ops_alloc(total + 1, es);
    ok = vs && vr && vg && N <= 64;
    if (ok) {
      tsr_ops_sync();
      fill(vs, dt, total, key + 13, me);
      ok &= tsr_comm_reduce_scatter_v(c, vs, vr, counts, dt) == 0;
      void *vmine = tsr_dtype_at(vg, dt, (int64_t)off);
      fill(vmine, dt, counts[me], key + 14, me);
      ok &= tsr_comm_all_gather_v(c, vmine, vg, counts, dt) == 0; /* in place */
      tsr_ops_sync();
      ok &= is_sum(vr, dt, counts[me], key + 13, N, off);
      for (size_t r = 0, o = 0; r < (size_t)N; o += counts[r], r++)
        for (size_t i = 0; i < counts[r]; i++)
          ok &= get(dt, vg, o + i) == value(dt, key + 14, (int)r, i);
    }
    check(ok, "%s: reduce_scatter_v and all_gather_v (in place) over uneven blocks", label);
    tsr_ops_free(&vs);
    tsr_ops_free(&vr);
    tsr_ops_free(&vg);
  }

  tsr_ops_free(&a);
  tsr_ops_free(&rs_in);
  tsr_ops_free(&rs_out);
  tsr_ops_free(&ag_in);
  tsr_ops_free(&ag_out);
  tsr_ops_free(&p_out);
  tsr_ops_free(&p_in);
  tsr_ops_free(&p_in2);
  tsr_ops_free(&p_out2);
  tsr_ops_free(&bc);
  tsr_ops_free(&dd);
  tsr_ops_free(&dn);
}

/* ---------------------------------------------------------------- rounded 16-bit sums */

/* A value of type dt with a random mantissa and sign, magnitude in [2^-6, 2^7). */
static float noisy(tsr_dtype dt, uint64_t key, int r, size_t i) {
  const uint64_t j = 3 * ((uint64_t)r * 1000003u + i);
  const double m = 1.0 + tsr_rand_uniform(key, j);
  const int e = (int)(tsr_rand_uniform(key, j + 1) * 13.0) - 6;
  const double s = tsr_rand_uniform(key, j + 2) < 0.5 ? -1.0 : 1.0;
  return tsr_round_to(dt, (float)(s * ldexp(m, e)));
}

/* Elements [0, n) of x are the sums over the group's N ranks of noisy(dt, key, r, i0 + i):
 * within the bound of N - 1 roundings of the exact sum (plus N - 1 half steps of the
 * subnormal grid, which these magnitudes never reach); the exactly rounded sum for N = 2;
 * the rank's own value for N = 1. */
static int is_rounded_sum(const void *x, tsr_dtype dt, size_t n, uint64_t key, int N, size_t i0) {
  const double u = dt == TSR_BF16 ? ldexp(1, -8) : ldexp(1, -11);
  const double tiny = dt == TSR_BF16 ? ldexp(1, -134) : ldexp(1, -25);
  const double gamma = (N - 1) * u / (1 - (N - 1) * u);
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    const float got = get(dt, x, i);
    double s = 0, abs_s = 0;
    for (int r = 0; r < N; r++) {
      const double v = noisy(dt, key, r, i0 + i);
      s += v, abs_s += fabs(v);
    }
    if (N <= 2) /* s is exact in fp32 (the two addends span fewer than 24 bits) */
      ok &= got == tsr_round_to(dt, (float)s);
    else
      ok &= fabs(got - s) <= gamma * abs_s + (N - 1) * tiny;
  }
  return ok;
}

/* 1 when bytes of x are the same on every rank of c (x NULL: 0).  Collective over c. */
static int same_everywhere(tsr_comm *c, const void *x, size_t bytes) {
  const int N = tsr_comm_size(c);
  unsigned char *mine = calloc(bytes, 1), *all = calloc(bytes, (size_t)N);
  if (!mine || !all || bytes > INT_MAX) {
    tsr_error("same_everywhere: out of memory for %zu bytes", bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (x) memcpy(mine, x, bytes); /* op memory after tsr_ops_sync; MPI gets host memory */
  int ok = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE,
                         tsr_comm_mpi(c)) == MPI_SUCCESS && x;
  for (int r = 0; ok && r < N; r++) ok = memcmp(all + (size_t)r * bytes, mine, bytes) == 0;
  free(mine);
  free(all);
  return ok;
}

static void fill_noisy(void *x, tsr_dtype dt, size_t n, uint64_t key, int r) {
  for (size_t i = 0; i < n; i++) tsr_store(dt, x, i, noisy(dt, key, r, i));
}

/* 16-bit sums that round: all-reduce (small, and large enough for MPI's ring algorithms
 * and for more than one chunk of the emulated NCCL), non-blocking all-reduce,
 * reduce-scatter with even and uneven blocks. */
static void test_rounding(tsr_comm *c, const char *label, uint64_t key, tsr_dtype dt) {
  const int N = tsr_comm_size(c), me = tsr_comm_rank(c);
  const size_t es = tsr_dtype_size(dt), sizes[2] = {37, 600001};
  for (int k = 0; k < 2; k++) {
    const size_t n = sizes[k];
    void *x = tsr_ops_alloc(n, es);
    int ok = x != NULL;
    if (ok) {
      tsr_ops_sync();
      fill_noisy(x, dt, n, key + k, me);
      ok &= tsr_comm_all_reduce(c, x, n, dt) == 0;
      tsr_ops_sync();
      ok &= is_rounded_sum(x, dt, n, key + k, N, 0);
    }
    check(ok, "%s: all_reduce of %zu rounded elements within N - 1 roundings (exact for N = 2)",
          label, n);
    const int same = same_everywhere(c, x, es * n);
    check(same, "%s: ... and bitwise the same on every rank", label);
    tsr_ops_free(&x);
  }

  enum { AR = 301, RS = 131 };
  void *a = tsr_ops_alloc(AR, es), *rs_in = tsr_ops_alloc((size_t)RS * N, es),
       *rs_out = tsr_ops_alloc(RS, es);
  int ok = a && rs_in && rs_out;
  tsr_comm_handle h[2] = {NULL, NULL};
  if (ok) {
    tsr_ops_sync();
    fill_noisy(a, dt, AR, key + 2, me);
    fill_noisy(rs_in, dt, (size_t)RS * N, key + 3, me);
    ok &= tsr_comm_iall_reduce(c, a, AR, dt, &h[0]) == 0;
    ok &= tsr_comm_ireduce_scatter(c, rs_in, rs_out, RS, dt, &h[1]) == 0;
    ok &= tsr_comm_waitall(2, h) == 0;
    tsr_ops_sync();
    ok &= is_rounded_sum(a, dt, AR, key + 2, N, 0) &&
          is_rounded_sum(rs_out, dt, RS, key + 3, N, (size_t)me * RS);
  }
  check(ok, "%s: iall_reduce and ireduce_scatter of rounded elements within the bound", label);
  const int same = same_everywhere(c, a, es * AR);
  check(same, "%s: ... the non-blocking all-reduce bitwise the same on every rank", label);
  tsr_ops_free(&a);
  tsr_ops_free(&rs_in);
  tsr_ops_free(&rs_out);

  size_t counts[64], total = 0, off = 0;
  for (int r = 0; r < N && r < 64; r++) total += counts[r] = (size_t)(40 + 17 * r) * (r != 2);
  for (int r = 0; r < me; r++) off += counts[r];
  void *vs = tsr_ops_alloc(total, es), *vr = tsr_ops_alloc(counts[me] + 1, es);
  ok = vs && vr && N <= 64;
  if (ok) {
    tsr_ops_sync();
    fill_noisy(vs, dt, total, key + 4, me);
    ok &= tsr_comm_reduce_scatter_v(c, vs, vr, counts, dt) == 0;
    tsr_ops_sync();
    ok &= is_rounded_sum(vr, dt, counts[me], key + 4, N, off);
  }
  check(ok, "%s: reduce_scatter_v of rounded elements (uneven, one block empty) within the "
        "bound", label);
  tsr_ops_free(&vs);
  tsr_ops_free(&vr);
}

/* ---------------------------------------------------------------- counters */

/* Counters after a known sequence, against the ring formulas of comm.h, with es bytes per
 * element of dt.  Sizes are multiples of 6 elements per rank so every term is whole for
 * N = 1..4. */
static void test_counters(tsr_comm *c, const char *label, tsr_dtype dt) {
  const int N = tsr_comm_size(c), me = tsr_comm_rank(c);
  const long es = (long)tsr_dtype_size(dt);
  float buf[96], out[96]; /* room for 96 elements of any type */
  fill(buf, dt, 96, 77, me);
  tsr_comm_reset_counters(c);
  int ok = tsr_comm_bytes(c) == 0;
  tsr_comm_handle h[4] = {NULL, NULL, NULL, NULL};
  ok &= tsr_comm_all_reduce(c, buf, 12, dt) == 0;
  ok &= tsr_comm_iall_reduce(c, tsr_dtype_at(buf, dt, 12), 24, dt, &h[0]) == 0;
  ok &= tsr_comm_waitall(1, h) == 0;
  ok &= tsr_comm_reduce_scatter(c, buf, out, 12, dt) == 0;     /* blocks of 12 elements */
  ok &= tsr_comm_all_gather(c, buf, out, 5, dt) == 0;          /* 5 elements a block */
  ok &= tsr_comm_ibroadcast(c, buf + 40, 24, 0, &h[0]) == 0;   /* 24 bytes from rank 0 */
  ok &= tsr_comm_waitall(1, h) == 0;
  if (N > 1) {
    ok &= tsr_comm_isend(c, buf, 48, (me + 1) % N, 9, &h[0]) == 0;
    ok &= tsr_comm_irecv(c, out + 48, 48, (me + N - 1) % N, 9, &h[1]) == 0;
    ok &= tsr_comm_waitall(2, h) == 0;
  }
  double x[3] = {1, 2, 3};
  int k[3] = {1, 2, 3};
  ok &= tsr_comm_all_reduce_double(c, x, 3, TSR_COMM_SUM) == 0; /* 24 bytes */
  ok &= tsr_comm_all_reduce_int(c, k, 3, TSR_COMM_MAX) == 0;    /* 12 bytes */
  check(ok, "%s: the counted sequence ran", label);

  /* Closed forms in integer arithmetic (each division is exact for these sizes). */
  const long want_ar = 2L * (N - 1) * (12 + 24) * es / N;
  const long want_rs = (long)(N - 1) * 12 * es; /* full buffer N * 12 elements */
  const long want_ag = (long)(N - 1) * 5 * es;  /* full buffer N * 5 elements */
  const long want_bc = me == 0 ? 0 : 24;
  const long want_p2p = N > 1 ? 48 : 0;
  const long want_sc = 2L * (N - 1) * 24 / N + 2L * (N - 1) * 12 / N;
  ok = tsr_comm_bytes_of(c, TSR_COMM_ALL_REDUCE) == (double)want_ar &&
       tsr_comm_ops_of(c, TSR_COMM_ALL_REDUCE) == 2;
  check(ok, "%s: all_reduce bytes = 2(N-1)/N * S = %ld (N = %d, %ld bytes an element)", label,
        want_ar, N, es);
  ok = tsr_comm_bytes_of(c, TSR_COMM_REDUCE_SCATTER) == (double)want_rs &&
       tsr_comm_bytes_of(c, TSR_COMM_ALL_GATHER) == (double)want_ag;
  check(ok, "%s: reduce_scatter / all_gather bytes = (N-1)/N * full buffer = %ld / %ld", label,
        want_rs, want_ag);
  ok = tsr_comm_bytes_of(c, TSR_COMM_BROADCAST) == (double)want_bc;
  check(ok, "%s: broadcast bytes = S on non-roots, 0 on the root", label);
  ok = tsr_comm_bytes_of(c, TSR_COMM_SEND) == (double)want_p2p &&
       tsr_comm_bytes_of(c, TSR_COMM_RECV) == (double)want_p2p;
  check(ok, "%s: send / recv bytes = payload (%ld)", label, want_p2p);
  ok = tsr_comm_bytes_of(c, TSR_COMM_SCALAR) == (double)want_sc;
  check(ok, "%s: scalar bytes = 2(N-1)/N * S = %ld", label, want_sc);
  ok = tsr_comm_bytes(c) ==
       (double)(want_ar + want_rs + want_ag + want_bc + 2 * want_p2p + want_sc);
  if (N == 1) ok &= tsr_comm_bytes(c) == 0;
  check(ok, "%s: total = sum of the kinds%s", label, N == 1 ? " (0 for size 1)" : "");
  tsr_comm_reset_counters(c);
  ok = tsr_comm_bytes(c) == 0;
  for (int kind = 0; kind < TSR_COMM_N_KINDS; kind++)
    ok &= tsr_comm_ops_of(c, (tsr_comm_kind)kind) == 0;
  check(ok, "%s: reset_counters zeroes bytes and operation counts", label);
}

/* ---------------------------------------------------------------- errors */

/* Calls that must fail, and fail cleanly. */
static void test_errors(tsr_comm *world) {
  const int N = tsr_comm_size(world), me = tsr_comm_rank(world);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  char *xb = (char *)x;
  if (me == 0) printf("test_comm: the error lines that follow are expected\n");
  fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  int ok = 1;
  if (me == 0) { /* refused before any MPI call, so one rank can try them alone */
    ok &= tsr_comm_send(world, x, 4, me, 0) != 0 && tsr_comm_send(world, x, 4, N, 0) != 0 &&
          tsr_comm_recv(world, x, 4, -1, 0) != 0;
    if (N > 1) ok &= tsr_comm_send(world, x, 4, 1, -3) != 0;
    ok &= tsr_comm_broadcast(world, x, 4, N) != 0;
    ok &= tsr_comm_all_reduce(world, x, (size_t)INT_MAX + 1, TSR_F32) != 0;
    ok &= tsr_comm_reduce_scatter(world, x, x + 1, 1, TSR_F32) != 0 || N == 1; /* overlap */
    /* in bytes: the 2 * N bytes of a 16-bit send run into recv 2 bytes on (N > 1) */
    ok &= tsr_comm_reduce_scatter(world, x, xb + 2, 1, TSR_BF16) != 0 || N == 1;
    /* send 2 bytes into recv, not rank 0's block (N > 1) */
    ok &= tsr_comm_all_gather(world, xb + 2, x, 1, TSR_F16) != 0 || N == 1;
    tsr_comm_handle h = NULL;
    const size_t counts[64] = {0}; /* not read: the type is refused first */
    ok &= tsr_comm_all_reduce(world, x, 1, (tsr_dtype)TSR_N_DTYPES) != 0 &&
          tsr_comm_iall_gather_v(world, x, x, counts, (tsr_dtype)-1, &h) != 0 && h == NULL;
    ok &= tsr_comm_bytes(world) == 0; /* refused calls count nothing */
  }
  check(ok, "bad peer, tag, root, count, element type and overlapping buffers (in bytes, "
        "for 16-bit too) are refused");

  /* An error MPI itself reports comes back through TSR_MPI_CALL: rank 0 sends 32 bytes,
   * rank 1 posts 16 (MPI_ERR_TRUNCATE).  Then a message shorter than expected. */
  ok = 1;
  if (N > 1 && me == 0) {
    ok &= tsr_comm_send(world, x, 32, 1, 7) == 0;
    ok &= tsr_comm_send(world, x, 8, 1, 8) == 0;
  } else if (N > 1 && me == 1) {
    float y[8];
    ok &= tsr_comm_recv(world, y, 16, 0, 7) != 0;
    ok &= tsr_comm_recv(world, y, 16, 0, 8) != 0;
  }
  tsr_comm_barrier(world);
  check(ok, "a truncated message and a short one are reported as errors (rank 1)");

  /* The same on op memory (on a GPU: through the group's transport when it has send/recv),
   * blocking and non-blocking; the group stays usable afterwards. */
  ok = 1;
  float *dx = tsr_ops_alloc(8, sizeof(float)), *dy = tsr_ops_alloc(8, sizeof(float));
  ok &= dx && dy;
  if (ok && N > 1 && me == 0) {
    for (int i = 0; i < 8; i++) dx[i] = (float)i + 0.5f;
    ok &= tsr_comm_send(world, dx, 32, 1, 10) == 0;
    ok &= tsr_comm_send(world, dx, 8, 1, 11) == 0;
    ok &= tsr_comm_send(world, dx, 32, 1, 12) == 0;
  } else if (ok && N > 1 && me == 1) {
    tsr_comm_handle hr = NULL;
    ok &= tsr_comm_recv(world, dy, 16, 0, 10) != 0;
    ok &= tsr_comm_irecv(world, dy, 16, 0, 11, &hr) == 0;
    ok &= tsr_comm_wait(&hr) != 0 && hr == NULL;
    ok &= tsr_comm_recv(world, dy, 32, 0, 12) == 0;
    tsr_ops_sync();
    for (int i = 0; i < 8; i++) ok &= dy[i] == (float)i + 0.5f;
  }
  tsr_comm_barrier(world);
  tsr_ops_free(&dx);
  tsr_ops_free(&dy);
  check(ok, "on op memory too, then a good message arrives whole (rank 1)");
}

/* ---------------------------------------------------------------- the device */

#ifdef TEST_COMM_DEVICE
/* comm needs op memory on the device, the stream the ops run on (its transports order
 * their own streams against it) and a way to tell device memory from host memory; it
 * runs no kernels.  So this test brings a device backend with memory only (managed
 * memory, copies and fills queued on one stream), on the CUDA runtime alone, and links
 * without the kernels and the trainer.  Any failing CUDA call makes status() fail. */
static struct {
  cudaStream_t stream;
  int device, failed;
} dv;

static void dv_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  tsr_error("test device: %s: %s", what, cudaGetErrorString(e));
  dv.failed = 1;
}

void *tsr_cuda_ops_stream(void) { return dv.stream; }
int tsr_cuda_ops_device(void) { return dv.device; }
int tsr_cuda_is_device_memory(const void *p) {
  struct cudaPointerAttributes a;
  if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static void *dv_alloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMallocManaged(&p, bytes ? bytes : 1, cudaMemAttachGlobal);
  dv_ok(e, "cudaMallocManaged");
  if (e != cudaSuccess) return NULL;
  dv_ok(cudaMemset(p, 0, bytes), "cudaMemset");
  return p;
}
static void dv_free(void *p) {
  dv_ok(cudaStreamSynchronize(dv.stream), "cudaStreamSynchronize");
  dv_ok(cudaFree(p), "cudaFree");
}
static void dv_copy(void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return;
  dv_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, dv.stream), "cudaMemcpyAsync");
  if (!tsr_cuda_is_device_memory(src)) /* host source: done before returning (ops.h) */
    dv_ok(cudaStreamSynchronize(dv.stream), "cudaStreamSynchronize");
}
static void dv_zero(void *dst, size_t bytes) {
  if (bytes) dv_ok(cudaMemsetAsync(dst, 0, bytes, dv.stream), "cudaMemsetAsync");
}
static void dv_sync(void) { dv_ok(cudaStreamSynchronize(dv.stream), "cudaStreamSynchronize"); }
static int dv_status(void) { return dv.failed ? TSR_ERR : 0; }
static void dv_close(void) {
  if (dv.stream) cudaStreamDestroy(dv.stream);
  dv.stream = NULL;
}

static const tsr_ops_backend dv_table = {.name = "comm-test device",
                                         .alloc = dv_alloc,
                                         .free = dv_free,
                                         .copy = dv_copy,
                                         .zero = dv_zero,
                                         .sync = dv_sync,
                                         .status = dv_status,
                                         .close = dv_close};

/* This rank's own device (cuda/select.c picks it among the node's) and its stream. */
static int dv_open(void) {
  TSR_CALL(tsr_cuda_select_device(MPI_COMM_WORLD, 0, &dv.device));
  dv_ok(cudaStreamCreate(&dv.stream), "cudaStreamCreate");
  return dv.failed ? TSR_ERR : 0;
}
#endif

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int ws;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  tsr_set_rank(g_rank);
  if (g_rank == 0) printf("test_comm: %d ranks\n", ws);

  tsr_comm *world = NULL, *pairs = NULL, *self = NULL, *three = NULL;
  MPI_Comm sub;
  int ok = tsr_comm_create(&world, MPI_COMM_WORLD, "world") == 0;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank / 2, g_rank, &sub);
  ok &= tsr_comm_create(&pairs, sub, "pairs") == 0;
  MPI_Comm_free(&sub);
  MPI_Comm_split(MPI_COMM_WORLD, g_rank, 0, &sub);
  ok &= tsr_comm_create(&self, sub, "self") == 0;
  MPI_Comm_free(&sub);
  MPI_Comm_split(MPI_COMM_WORLD, g_rank < 3, g_rank, &sub);
  ok &= tsr_comm_create(&three, sub, "three") == 0;
  MPI_Comm_free(&sub);
  check(ok, "groups created");
  if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
  check(tsr_comm_mpi_sum(TSR_F32) == MPI_SUM && tsr_comm_mpi_sum(TSR_BF16) != MPI_OP_NULL &&
            tsr_comm_mpi_sum(TSR_F16) != MPI_OP_NULL &&
            tsr_comm_mpi_sum(TSR_BF16) != tsr_comm_mpi_sum(TSR_F16) &&
            tsr_comm_mpi_type(TSR_BF16) == MPI_UINT16_T,
        "MPI's 16-bit sums exist once a group does (MPI_UINT16_T, one per type)");
#ifdef TEST_COMM_DEVICE
  ok = dv_open() == 0;
  check(ok, "a device of its own on every rank");
  if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
  tsr_ops_set_backend(&dv_table);
  tsr_comm *groups[] = {world, pairs, self, three}; /* "three" is tested on 4 ranks only */
  const int n_groups = ws == 4 ? 4 : 3;
  const char *want = getenv("TEST_COMM_TRANSPORT");
  const tsr_comm_transport *tr =
      want && !strcmp(want, "staged") ? &tsr_cuda_staged_transport : &tsr_cuda_nccl_transport;
  for (int i = 0; i < n_groups; i++) ok &= tsr_comm_attach_device(groups[i], tr) == 0;
  for (int i = 0; i < n_groups; i++)
    ok &= !strcmp(tsr_comm_backend(groups[i]), tsr_comm_size(groups[i]) > 1 ? tr->name : "mpi");
  check(ok, "%s attached to every tested group of more than one rank", tr->name);
#endif
  check(tsr_comm_size(world) == ws && tsr_comm_rank(world) == g_rank &&
            !strcmp(tsr_comm_name(world), "world") && tsr_comm_size(self) == 1 &&
            tsr_comm_rank(self) == 0 && tsr_comm_size(pairs) == (g_rank / 2 * 2 + 1 < ws ? 2 : 1),
        "size, rank and name");

  static const tsr_dtype types[] = {TSR_F32, TSR_BF16, TSR_F16};
  for (int t = 0; t < 3; t++) {
    const tsr_dtype dt = types[t];
    const char *tn = tsr_dtype_name(dt);
    const uint64_t key = 10000 * (uint64_t)(t + 1);
    struct { tsr_comm *c; char label[64]; } g[4];
    int n = 0;
    g[n].c = world, snprintf(g[n++].label, sizeof g[0].label, "world (N=%d) %s", ws, tn);
    g[n].c = pairs, snprintf(g[n++].label, sizeof g[0].label, "pairs (N=2, or 1 for an odd "
                             "last rank) %s", tn);
    g[n].c = self, snprintf(g[n++].label, sizeof g[0].label, "self (N=1) %s", tn);
    if (ws == 4) g[n].c = three, snprintf(g[n++].label, sizeof g[0].label, "ranks 0-2 (N=3) and "
                                          "3 alone %s", tn);
    for (int i = 0; i < n; i++) {
      test_group(g[i].c, g[i].label, key + 1000 * (uint64_t)i, dt);
      if (dt != TSR_F32) test_rounding(g[i].c, g[i].label, key + 1000 * (uint64_t)i + 500, dt);
      test_counters(g[i].c, g[i].label, dt);
    }
  }
  tsr_comm_reset_counters(world);
  test_errors(world);

  tsr_comm_destroy(&three);
  tsr_comm_destroy(&self);
  tsr_comm_destroy(&pairs);
  tsr_comm_destroy(&world);
  check(world == NULL, "tsr_comm_destroy NULLs the handle");
#ifdef TEST_COMM_DEVICE
  tr->close();
  tsr_ops_set_backend(NULL);
  dv_close();
  check(dv_status() == 0, "no CUDA call of the test device failed");
#endif
  if (g_rank == 0) printf("test_comm: %d checks passed, %d failed\n", n_pass, n_fail);
  MPI_Finalize();
  return n_fail ? 1 : 0;
}
