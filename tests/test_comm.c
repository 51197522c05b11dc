/* test_comm.c — every comm operation against a closed form (MPI test; grid_comm.sh runs it
 * on 1, 2, 3 and 4 ranks).
 *
 * Data: rank r's element i is value(r, i), a random multiple of 1/128 in (-4, 4) that is
 * never zero.  Any rank can compute any rank's data, so every expected result is a
 * closed form; a sum of up to 8 such values needs fewer than 24 significant bits, so
 * fp32 sums are exact in any order and results are compared with ==.
 *
 * The same checks run on the world group, on pairs (color rank / 2: sizes 2 and, with an
 * odd world, 1), on each rank alone (size 1: the copy-only fast paths), and on 4 ranks
 * also on a group of 3 (+ one of 1).  Byte counters are compared exactly with the ring
 * formulas of comm.h (sizes chosen so that every term is a whole number of bytes).
 * Checks are reduced over all ranks; rank 0 prints PASS/FAIL; exit 1 on any failure.
 * Some checks provoke errors on purpose: their "error:" lines are expected.
 *
 * Buffers are op memory (tsr_ops_alloc) and are read after tsr_ops_sync(), so the same
 * checks run on a GPU: built with -DTEST_COMM_DEVICE (tests/cuda/comm_emu.sh links it with
 * the CUDA backend and NCCL, emulated), every rank drives its own device, the groups of
 * more than one rank get a device transport (comm_dev.h), and their operations on op
 * memory go through it.  TEST_COMM_TRANSPORT=nccl (default): NCCL's collectives, with
 * host scalars and send/recv on MPI; =staged: MPI through pinned host buffers
 * (cuda/comm_stage.c), send/recv included.  Size-1 groups stay on MPI. */
#include <limits.h>
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
#include "comm_nccl.h"
#include "comm_stage.h"
#include "ops_dev.h"
#endif

static float value(uint64_t key, int r, size_t i) {
  int k = (int)(tsr_rand_uniform(key, (uint64_t)r * 1000003u + i) * 1024.0);
  return (float)(k - 512) / 64.0f + 1.0f / 128.0f;
}

static void fill(float *x, size_t n, uint64_t key, int r) {
  for (size_t i = 0; i < n; i++) x[i] = value(key, r, i);
}

/* sum over ranks 0..N-1 of value(key, r, i0 + i) == x[i], for i < n. */
static int is_sum(const float *x, size_t n, uint64_t key, int N, size_t i0) {
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    float s = 0;
    for (int r = 0; r < N; r++) s += value(key, r, i0 + i);
    ok &= x[i] == s;
  }
  return ok;
}

static unsigned char pattern(int root, size_t i) { return (unsigned char)(root * 31 + i * 7 + 1); }

/* All operations on one group c (every rank of the world calls this with its own group,
 * so the sequence of checks is the same everywhere). */
static void test_group(tsr_comm *c, const char *label, uint64_t key) {
  const int N = tsr_comm_size(c), me = tsr_comm_rank(c);
  const int next = (me + 1) % N, prev = (me + N - 1) % N;
  enum { AR = 37, RS = 29, AG = 23, BC = 51, P2P = 19 };
  float *a = tsr_ops_alloc(AR, sizeof(float)), *rs_in = tsr_ops_alloc((size_t)RS * N, sizeof(float)),
        *rs_out = tsr_ops_alloc(RS, sizeof(float)), *ag_out = tsr_ops_alloc((size_t)AG * N, sizeof(float)),
        *ag_in = tsr_ops_alloc(AG, sizeof(float)), *p_out = tsr_ops_alloc(P2P, sizeof(float)),
        *p_in = tsr_ops_alloc(P2P, sizeof(float)), *p_in2 = tsr_ops_alloc(P2P, sizeof(float)),
        *p_out2 = tsr_ops_alloc(P2P, sizeof(float));
  unsigned char *bc = tsr_ops_alloc(BC, 1);
  double *dd = tsr_ops_alloc(2, sizeof(double));
  int *dn = tsr_ops_alloc(2, sizeof(int));
  tsr_ops_sync(); /* op memory is written by the host from here on */

  /* ---- blocking ---- */
  fill(a, AR, key, me);
  int rc = tsr_comm_all_reduce(c, a, AR);
  tsr_ops_sync();
  check(rc == 0 && is_sum(a, AR, key, N, 0), "%s: all_reduce of %d floats = closed-form sum",
        label, AR);

  fill(rs_in, (size_t)RS * N, key + 1, me);
  rc = tsr_comm_reduce_scatter(c, rs_in, rs_out, RS);
  tsr_ops_sync();
  check(rc == 0 && is_sum(rs_out, RS, key + 1, N, (size_t)me * RS),
        "%s: reduce_scatter gives this rank's block of the sum", label);

  fill(ag_in, AG, key + 2, me);
  rc = tsr_comm_all_gather(c, ag_in, ag_out, AG);
  tsr_ops_sync();
  int ok = rc == 0;
  for (int r = 0; r < N; r++)
    for (int i = 0; i < AG; i++) ok &= ag_out[r * AG + i] == value(key + 2, r, (size_t)i);
  check(ok, "%s: all_gather puts rank r's block at r * %d", label, AG);

  memset(ag_out, 0, sizeof(float) * AG * N);
  fill(ag_out + (size_t)me * AG, AG, key + 3, me);
  rc = tsr_comm_all_gather(c, ag_out + (size_t)me * AG, ag_out, AG);
  tsr_ops_sync();
  ok = rc == 0;
  for (int r = 0; r < N; r++)
    for (int i = 0; i < AG; i++) ok &= ag_out[r * AG + i] == value(key + 3, r, (size_t)i);
  check(ok, "%s: all_gather in place (send = this rank's block of recv)", label);

  ok = 1;
  for (int root = 0; root < N; root++) {
    for (size_t i = 0; i < BC; i++) bc[i] = me == root ? pattern(root, i) : 0xEE;
    ok &= tsr_comm_broadcast(c, bc, BC, root) == 0;
    tsr_ops_sync();
    for (size_t i = 0; i < BC; i++) ok &= bc[i] == pattern(root, i);
  }
  check(ok, "%s: broadcast of %d bytes from every root", label, BC);

  ok = 1;
  if (N > 1) { /* a ring; even ranks send first so blocking calls cannot deadlock */
    fill(p_out, P2P, key + 4, me);
    memset(p_in, 0, sizeof(float) * P2P);
    if (me % 2 == 0) {
      ok &= tsr_comm_send(c, p_out, sizeof(float) * P2P, next, 5) == 0;
      ok &= tsr_comm_recv(c, p_in, sizeof(float) * P2P, prev, 5) == 0;
    } else {
      ok &= tsr_comm_recv(c, p_in, sizeof(float) * P2P, prev, 5) == 0;
      ok &= tsr_comm_send(c, p_out, sizeof(float) * P2P, next, 5) == 0;
    }
    tsr_ops_sync();
    for (int i = 0; i < P2P; i++) ok &= p_in[i] == value(key + 4, prev, (size_t)i);
  }
  check(ok, "%s: send/recv around a ring of %d", label, N);

  /* ---- non-blocking: everything in flight at once, then waitall ---- */
  tsr_comm_handle h[8];
  int nh = 0;
  ok = 1;
  fill(a, AR, key + 5, me);
  fill(rs_in, (size_t)RS * N, key + 6, me);
  fill(ag_in, AG, key + 7, me);
  const int bc_root = N - 1;
  for (size_t i = 0; i < BC; i++) bc[i] = me == bc_root ? pattern(bc_root, i) : 0xEE;
  ok &= tsr_comm_iall_reduce(c, a, AR, &h[nh++]) == 0;
  ok &= tsr_comm_ireduce_scatter(c, rs_in, rs_out, RS, &h[nh++]) == 0;
  ok &= tsr_comm_iall_gather(c, ag_in, ag_out, AG, &h[nh++]) == 0;
  ok &= tsr_comm_ibroadcast(c, bc, BC, bc_root, &h[nh++]) == 0;
  if (N > 1) { /* two messages on one pair, received in the opposite order: tags matter */
    fill(p_out, P2P, key + 8, me);
    fill(p_out2, P2P, key + 11, me);
    ok &= tsr_comm_irecv(c, p_in2, sizeof(float) * P2P, prev, 2, &h[nh++]) == 0;
    ok &= tsr_comm_irecv(c, p_in, sizeof(float) * P2P, prev, 1, &h[nh++]) == 0;
    ok &= tsr_comm_isend(c, p_out, sizeof(float) * P2P, next, 1, &h[nh++]) == 0;
    ok &= tsr_comm_isend(c, p_out2, sizeof(float) * P2P, next, 2, &h[nh++]) == 0;
  }
  if (N == 1)
    for (int i = 0; i < nh; i++) ok &= h[i] == NULL; /* size 1: done at once */
  ok &= tsr_comm_waitall(nh, h) == 0;
  tsr_ops_sync();
  for (int i = 0; i < nh; i++) ok &= h[i] == NULL;
  ok &= is_sum(a, AR, key + 5, N, 0) && is_sum(rs_out, RS, key + 6, N, (size_t)me * RS);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < AG; i++) ok &= ag_out[r * AG + i] == value(key + 7, r, (size_t)i);
  for (size_t i = 0; i < BC; i++) ok &= bc[i] == pattern(bc_root, i);
  if (N > 1) {
    for (int i = 0; i < P2P; i++)
      ok &= p_in[i] == value(key + 8, prev, (size_t)i) &&
            p_in2[i] == value(key + 11, prev, (size_t)i);
  }
  check(ok, "%s: %d non-blocking operations in flight, then waitall", label, nh);

  /* one at a time, waited in reverse order of posting */
  ok = 1;
  fill(a, AR, key + 9, me);
  fill(ag_in, AG, key + 10, me);
  tsr_comm_handle h1 = NULL, h2 = NULL;
  ok &= tsr_comm_iall_reduce(c, a, AR, &h1) == 0;
  ok &= tsr_comm_iall_gather(c, ag_in, ag_out, AG, &h2) == 0;
  ok &= tsr_comm_wait(&h2) == 0 && tsr_comm_wait(&h1) == 0 && !h1 && !h2;
  ok &= tsr_comm_wait(&h1) == 0; /* waiting on a completed (NULL) handle is a no-op */
  tsr_ops_sync();
  ok &= is_sum(a, AR, key + 9, N, 0);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < AG; i++) ok &= ag_out[r * AG + i] == value(key + 10, r, (size_t)i);
  check(ok, "%s: tsr_comm_wait on single handles, in reverse order", label);

  /* ---- scalars ---- */
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

  /* polled to completion with tsr_comm_test */
  fill(a, AR, key + 12, me);
  tsr_comm_handle ht = NULL;
  ok = tsr_comm_iall_reduce(c, a, AR, &ht) == 0;
  for (int done = 0, spins = 0; ok && !done && spins < 100000000; spins++)
    ok &= tsr_comm_test(&ht, &done) == 0;
  tsr_ops_sync();
  ok &= ht == NULL && is_sum(a, AR, key + 12, N, 0);
  check(ok, "%s: tsr_comm_test drives an all-reduce to completion", label);

  /* uneven blocks, one of them empty */
  {
    size_t counts[64], total = 0, off = 0;
    for (int r = 0; r < N && r < 64; r++) total += counts[r] = (size_t)((r * 7 + 3) % 11) * (r != 1);
    for (int r = 0; r < me; r++) off += counts[r];
    float *vs = tsr_ops_alloc(total + 1, sizeof(float)), *vr = tsr_ops_alloc(counts[me] + 1, sizeof(float)),
          *vg = tsr_ops_alloc(total + 1, sizeof(float));
    ok = vs && vr && vg && N <= 64;
    if (ok) {
      tsr_ops_sync();
      fill(vs, total, key + 13, me);
      ok &= tsr_comm_reduce_scatter_v(c, vs, vr, counts) == 0;
      fill(vg + off, counts[me], key + 14, me);
      ok &= tsr_comm_all_gather_v(c, vg + off, vg, counts) == 0; /* in place */
      tsr_ops_sync();
      ok &= is_sum(vr, counts[me], key + 13, N, off);
      for (int r = 0, o = 0; r < N; o += (int)counts[r], r++)
        for (size_t i = 0; i < counts[r]; i++) ok &= vg[o + (int)i] == value(key + 14, r, i);
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

/* Counters after a known sequence, against the ring formulas of comm.h.  Sizes are
 * multiples of 12 bytes per rank so every term is whole for N = 1..4. */
static void test_counters(tsr_comm *c, const char *label) {
  const int N = tsr_comm_size(c), me = tsr_comm_rank(c);
  float buf[96], out[96];
  fill(buf, 96, 77, me);
  tsr_comm_reset_counters(c);
  int ok = tsr_comm_bytes(c) == 0;
  tsr_comm_handle h[4] = {NULL, NULL, NULL, NULL};
  ok &= tsr_comm_all_reduce(c, buf, 12) == 0;                  /* 48 bytes */
  ok &= tsr_comm_iall_reduce(c, buf + 12, 24, &h[0]) == 0;     /* 96 bytes */
  ok &= tsr_comm_waitall(1, h) == 0;
  ok &= tsr_comm_reduce_scatter(c, buf, out, 12) == 0;         /* blocks of 48 bytes */
  ok &= tsr_comm_all_gather(c, buf, out, 5) == 0;              /* 20 bytes a block */
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
  const long want_ar = 2L * (N - 1) * (48 + 96) / N;
  const long want_rs = (long)(N - 1) * 48;       /* full buffer N * 48 bytes */
  const long want_ag = (long)(N - 1) * 20;       /* full buffer N * 20 bytes */
  const long want_bc = me == 0 ? 0 : 24;
  const long want_p2p = N > 1 ? 48 : 0;
  const long want_sc = 2L * (N - 1) * 24 / N + 2L * (N - 1) * 12 / N;
  ok = tsr_comm_bytes_of(c, TSR_COMM_ALL_REDUCE) == (double)want_ar &&
       tsr_comm_ops_of(c, TSR_COMM_ALL_REDUCE) == 2;
  check(ok, "%s: all_reduce bytes = 2(N-1)/N * S = %ld (N = %d)", label, want_ar, N);
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

/* Calls that must fail, and fail cleanly. */
static void test_errors(tsr_comm *world) {
  const int N = tsr_comm_size(world), me = tsr_comm_rank(world);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  if (me == 0) printf("test_comm: the error lines that follow are expected\n");
  fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  int ok = 1;
  if (me == 0) { /* refused before any MPI call, so one rank can try them alone */
    ok &= tsr_comm_send(world, x, 4, me, 0) != 0 && tsr_comm_send(world, x, 4, N, 0) != 0 &&
          tsr_comm_recv(world, x, 4, -1, 0) != 0;
    if (N > 1) ok &= tsr_comm_send(world, x, 4, 1, -3) != 0;
    ok &= tsr_comm_broadcast(world, x, 4, N) != 0;
    ok &= tsr_comm_all_reduce(world, x, (size_t)INT_MAX + 1) != 0;
    ok &= tsr_comm_reduce_scatter(world, x, x + 1, 1) != 0 || N == 1; /* overlap (N > 1) */
    ok &= tsr_comm_bytes(world) == 0; /* refused calls count nothing */
  }
  check(ok, "bad peer, tag, root, count and overlapping buffers are refused");

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
#ifdef TEST_COMM_DEVICE
  const tsr_ops_backend *dev = NULL;
  MPI_Comm wc = MPI_COMM_WORLD;
  ok = tsr_cuda_ops_open(&wc, "cuda", 0, &dev) == 0 && dev;
  check(ok, "a device of its own on every rank");
  if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
  tsr_ops_set_backend(dev);
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

  char label[64];
  snprintf(label, sizeof label, "world (N=%d)", ws);
  test_group(world, label, 1000);
  test_counters(world, label);
  test_group(pairs, "pairs (N=2, or 1 for an odd last rank)", 2000);
  test_counters(pairs, "pairs");
  test_group(self, "self (N=1)", 3000);
  test_counters(self, "self (N=1)");
  if (ws == 4) {
    test_group(three, "ranks 0-2 (N=3) and 3 alone", 4000);
    test_counters(three, "ranks 0-2 (N=3) and 3 alone");
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
  dev->close();
#endif
  if (g_rank == 0) printf("test_comm: %d checks passed, %d failed\n", n_pass, n_fail);
  MPI_Finalize();
  return n_fail ? 1 : 0;
}
