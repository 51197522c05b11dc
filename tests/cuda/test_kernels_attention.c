/* test_kernels_attention.c — the attention group of tests/cuda/test_kernels: the forward
 * and backward of every path (context.h: fp32 kernel, mma.sync tensor cores, the
 * fp32-arithmetic kernel on 16-bit storage, cuDNN where built) against the CPU kernels,
 * in fp32, bf16 and fp16, with the path each shape must take checked too, and which
 * attention the backend takes by default.
 *
 * q, k, v live in one fused [B*T, (H+2KV)*hd] buffer (the model's layout), or in three
 * buffers of row stride H*hd.  The backward runs on the CPU's out and lse, so only the
 * backward is under test; it writes dq, dk, dv (poisoned first) and runs twice, bitwise
 * alike.  Tolerances: kernels_util.h (the lse of the fp32-arithmetic kernels to 1e-5,
 * of the tensor cores and cuDNN to the storage type's).  Document masking (the ops' doc:
 * documents packed in the sequences) runs on our kernels whatever kind is asked, cuDNN's
 * too, and is checked against the CPU's masked attention the same way.
 *
 * The block ops of a chunked sequence (attention_block_fwd, attention_block_bwd,
 * attention_merge) against their CPU kernels: blocks cut by the diagonal (rows that see
 * no key of the block among them), wholly visible (causal 0, and causal left of the
 * queries), fully masked, the diagonal block itself; fp32 results from every storage type,
 * held to 1e-5 (fp32 arithmetic on both sides; an lse of -inf must be -inf on both).  The
 * backward adds into random fp32 gradients, runs twice, bitwise alike. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_util.h"

static const char *const path_name[] = {"fp32 kernel", "mma", "cudnn"};

static tsr_ops_shapes att_shapes(tsr_dtype dt, int B, int T, int H, int KV, int hd) {
  tsr_ops_shapes s;
  memset(&s, 0, sizeof s);
  s.dt = dt, s.deterministic = 1;
  s.rows = (long)B * T, s.cols = (long)(H + 2 * KV) * hd;
  s.attn_bht = (long)B * H * T, s.attn_part = KV < H ? 2L * B * H * T * hd : 0;
  s.attn_io = (long)B * T * (H + KV) * hd, s.attn_t = T, s.attn_hd = hd;
  return s;
}

/* The path a shape must take with attention kind `kind` asked for (cuDNN: where it must
 * run, see below; -1 where it may run or decline); never cuDNN with documents. */
static int expected_path(tsr_dtype dt, int kind, int T, int hd, int docs) {
  if (dt == TSR_F32) return TSR_ATT_PATH_F32;
  if (kind == TSR_ATT_CUDNN && !docs) {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    /* on sm_90 cuDNN accepts all but one-token sequences and head dimensions that are not
     * multiples of 8 (tests/cuda/cudnn_offline.c); elsewhere hd 64 and 128 at least */
    const int must = T > 1 && (major == 9 ? hd % 8 == 0 && hd <= 256
                                           : major >= 8 && (hd == 64 || hd == 128));
    if (must) return TSR_ATT_PATH_CUDNN;
    return -1;
  }
  return tsr_cuda_attention_tc_supported(hd) ? TSR_ATT_PATH_MMA : TSR_ATT_PATH_F32;
}

/* TSR_TEST_HEAD_DIM=N: only the shapes of head_dim N (tests/cuda/emulate.sh's run with
 * less shared memory per block, where head_dim 128 alone changes its path; the paths of
 * every head_dim are checked by check_tc_table either way). */
static int want_hd(int hd) {
  const char *s = getenv("TSR_TEST_HEAD_DIM");
  return !s || !*s || atoi(s) == hd;
}

/* One shape on the attention of `kind` (TSR_ATT_*; ignored for fp32 storage); docs > 0:
 * documents of about that many rows (docs_make). */
static void run_case_docs(tsr_dtype dt, int kind, int B, int T, int H, int KV, int hd,
                          int separate, int deterministic, int docs) {
  if (!want_hd(hd)) return;
  char name[200];
  const int stride = separate ? H * hd : (H + 2 * KV) * hd;
  const long rows = (long)B * T, nqkv = rows * stride, nout = rows * H * hd, nl = (long)B * H * T;
  const long nbuf = separate ? 3 * nqkv : nqkv;
  const long qo = 0, ko = separate ? nqkv : H * hd, vo = separate ? 2 * nqkv : (H + KV) * hd;
  setenv("TSR_CUDA_ATTENTION", kind == TSR_ATT_CUDNN ? "cudnn" : "mma", 1);
  tsr_ops_shapes s = att_shapes(dt, B, T, H, KV, hd);
  s.deterministic = deterministic;
  kreserve(s);
  unsetenv("TSR_CUDA_ATTENTION");
  const int path = tsr_cuda_attention_path(dt, B, T, H, KV, hd, stride, docs > 0);
  const int want = expected_path(dt, kind, T, hd, docs > 0);
  snprintf(name, sizeof name, "attention B=%d T=%d H=%d KV=%d hd=%d%s%s", B, T, H, KV, hd,
           separate ? " (separate q,k,v)" : "", docs > 0 ? " documents" : "");
  if (want >= 0)
    kcheck(path == want, "%s %s takes the %s path (%s)", name, tsr_dtype_name(dt),
           path >= 0 ? path_name[path] : "no", path_name[want]);
  else if (path != TSR_ATT_PATH_CUDNN)
    printf("      %s %s: cuDNN declined, the %s path runs\n", name, tsr_dtype_name(dt),
           path >= 0 ? path_name[path] : "no");
  if (path < 0) return;
  int32_t *d_doc = NULL, *doc = docs > 0 ? docs_make(B * T, T, docs, &d_doc) : NULL;
  const int tc = path != TSR_ATT_PATH_F32;
  const double tol = tol_of(dt), tol_lse = tc ? tol_of(dt) : TOL_F32;

  tbuf buf = tb_rand(dt, nbuf, -2, 2), out = tb_out(dt, nout), lse = tb_out(TSR_F32, nl);
  tsr_cpu_attention_fwd(dt, out.h, lse.h, tb_hat(&buf, qo), tb_hat(&buf, ko), tb_hat(&buf, vo), B,
                        T, H, KV, hd, stride, doc);
  tsr_cuda_attention_fwd(dt, out.d, lse.d, tb_dat(&buf, qo), tb_dat(&buf, ko), tb_dat(&buf, vo), B,
                        T, H, KV, hd, stride, d_doc);
  ksync("attention_fwd");
  char full[240];
  snprintf(full, sizeof full, "%s fwd [%s]", name, path_name[path]);
  check_close(full, &out, tol);
  check_lse("  ... lse (fp32)", &lse, tol_lse);

  /* the backward on the CPU's out and lse */
  tb_upload(&out), tb_upload(&lse);
  tbuf dout = tb_rand(dt, nout, -1, 1), dbuf = tb_out(dt, nbuf), dbuf2 = tb_out(dt, nbuf);
  tsr_cpu_attention_bwd(dt, tb_hat(&dbuf, qo), tb_hat(&dbuf, ko), tb_hat(&dbuf, vo), dout.h,
                        out.h, lse.h, tb_hat(&buf, qo), tb_hat(&buf, ko), tb_hat(&buf, vo), B, T,
                        H, KV, hd, stride, doc);
  for (int run = 0; run < 2; run++) {
    const tbuf *d = run ? &dbuf2 : &dbuf;
    tsr_cuda_attention_bwd(dt, tb_dat(d, qo), tb_dat(d, ko), tb_dat(d, vo), dout.d, out.d, lse.d,
                          tb_dat(&buf, qo), tb_dat(&buf, ko), tb_dat(&buf, vo), B, T, H, KV, hd,
                          stride, d_doc);
  }
  ksync("attention_bwd");
  snprintf(full, sizeof full, "%s bwd dq, dk, dv (written) [%s]", name, path_name[path]);
  check_close(full, &dbuf, tol);
  if (deterministic)
    check_same_runs("  ... attention bwd", &dbuf, &dbuf2);
  else
    printf("      (deterministic off: cuDNN's backward may differ run to run, not compared)\n");

  if (tc && KV < H && path != TSR_ATT_PATH_CUDNN && kind != TSR_ATT_CUDNN && !separate &&
      hd == 64 && !doc) {
    /* grouped: without the partials' scratch the tensor-core backward refuses, launching
     * nothing, and the backend stays failed */
    s.attn_part = 0;
    setenv("TSR_CUDA_ATTENTION", "mma", 1);
    kreserve(s);
    unsetenv("TSR_CUDA_ATTENTION");
    tbuf d3 = tb_out(dt, nbuf);
    printf("      (an error about scratch is expected next)\n");
    fflush(stdout);
    tsr_cuda_attention_bwd(dt, tb_dat(&d3, qo), tb_dat(&d3, ko), tb_dat(&d3, vo), dout.d, out.d,
                          lse.d, tb_dat(&buf, qo), tb_dat(&buf, ko), tb_dat(&buf, vo), B, T, H,
                          KV, hd, stride, NULL);
    kb->sync();
    kcheck(kb->status() != 0, "attention %s bwd (KV < H) refuses a scratch without attn_part",
           path_name[path]);
    tbuf poison = tb_out(dt, nbuf);
    const tbuf same = {dt, nbuf, poison.h, d3.d};
    check_bits("  ... and left its outputs alone", &same);
    tb_free(&d3), tb_free(&poison);
  }
  tb_free(&buf), tb_free(&out), tb_free(&lse), tb_free(&dout), tb_free(&dbuf), tb_free(&dbuf2);
  free(doc);
  if (d_doc) CUDA_CK(cudaFree(d_doc));
}
static void run_case(tsr_dtype dt, int kind, int B, int T, int H, int KV, int hd, int separate,
                     int deterministic) {
  run_case_docs(dt, kind, B, T, H, KV, hd, separate, deterministic, 0);
}

/* Which head dimensions the tensor-core kernels take on this GPU, and why. */
static void check_tc_table(void) {
  int dev = 0, optin = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  for (int hd = 16; hd <= 144; hd += 16) {
    const size_t need = tsr_cuda_attention_tc_smem(hd);
    const int ok = tsr_cuda_attention_tc_supported(hd);
    kcheck(ok == (need > 0 && need <= (size_t)optin) &&
               (need > 0) == (hd == 32 || hd == 64 || hd == 96 || hd == 128),
           "attention tc (mma): head_dim %d %s (needs %zu bytes of shared memory, the GPU "
           "gives %d)",
           hd, ok ? "offered" : "not offered", need, optin);
  }
}

/* TSR_CUDA_ATTENTION unset: cuDNN's attention where the build has it, else the mma.sync
 * kernels; 'mma' forces ours; 'wmma' (removed) is refused when the backend opens. */
static void check_default_kind(void) {
  unsetenv("TSR_CUDA_ATTENTION");
  kreserve(att_shapes(TSR_BF16, 1, 64, 2, 1, 64));
#ifdef TSR_HAVE_CUDNN
  kcheck(tsr_cuda_ctx.attention == TSR_ATT_CUDNN,
         "attention: cuDNN's is the default of a build with cuDNN");
  kcheck(tsr_cuda_ctx.attn_ws_bytes > 0, "  ... its workspace reserved for 16-bit storage");
#else
  kcheck(tsr_cuda_ctx.attention == TSR_ATT_MMA,
         "attention: the mma.sync kernels are the default of a build without cuDNN");
#endif
  setenv("TSR_CUDA_ATTENTION", "mma", 1);
  kreserve(att_shapes(TSR_BF16, 1, 64, 2, 1, 64));
  kcheck(tsr_cuda_ctx.attention == TSR_ATT_MMA && tsr_cuda_ctx.attn_ws_bytes == 0,
         "attention: TSR_CUDA_ATTENTION=mma takes the mma.sync kernels (no cuDNN workspace)");
  const int path = tsr_cuda_attention_path(TSR_BF16, 1, 64, 2, 1, 64, 4 * 64, 0);
  kcheck(path == (tsr_cuda_attention_tc_supported(64) ? TSR_ATT_PATH_MMA : TSR_ATT_PATH_F32),
         "  ... bf16 hd 64 takes the %s path", path >= 0 ? path_name[path] : "no");
  setenv("TSR_CUDA_ATTENTION", "wmma", 1);
  kb->close();
  kb = NULL;
  const tsr_ops_backend *b2 = NULL;
  printf("      (an error about TSR_CUDA_ATTENTION=wmma is expected next)\n");
  fflush(stdout);
  const int rc = tsr_cuda_ops_open_device(0, &b2);
  kcheck(rc != 0 && !b2, "TSR_CUDA_ATTENTION=wmma (removed) is refused when the backend opens");
  unsetenv("TSR_CUDA_ATTENTION");
}

/* lse-like fp32: -inf where the CPU has -inf, else within tol x max(1, |lse|) */
static void check_lse_inf(const char *name, const tbuf *t, double tol) {
  float *got = hmalloc(sizeof(float) * t->n);
  tb_download(t, got);
  double e = 0.0;
  long ninf = 0;
  for (long i = 0; i < t->n; i++) {
    const float r = ((const float *)t->h)[i];
    if (r == -INFINITY) {
      ninf++;
      if (got[i] != -INFINITY) e = INFINITY;
      continue;
    }
    const double d = fabs((double)got[i] - (double)r) / fmax(1.0, fabs((double)r));
    e = isnan(d) ? INFINITY : fmax(e, d);
  }
  kcheck(e <= tol, "%-58s err %.2e (tol %.0e; %ld rows -inf)", name, e, tol, ninf);
  free(got);
}

/* One block: Tq queries at q0 against Tk keys at k0, q, k, v in one fused buffer of B
 * sequences each (their rows: q of Tq, k and v of Tk rows; the buffer is as long as the
 * longer). */
static void run_block_docs(tsr_dtype dt, int B, int Tq, int Tk, int H, int KV, int hd, long q0,
                           long k0, int causal, int docs) {
  if (!want_hd(hd)) return;
  char name[240];
  const int T = Tq > Tk ? Tq : Tk, stride = (H + 2 * KV) * hd;
  kreserve(att_shapes(dt, B, T, H, KV, hd));
  snprintf(name, sizeof name, "attention block B=%d Tq=%d@%ld Tk=%d@%ld H=%d KV=%d hd=%d%s%s", B,
           Tq, q0, Tk, k0, H, KV, hd, causal ? "" : " whole", docs > 0 ? " documents" : "");
  /* documents: each query row's start (docs_make's, moved to the query's position q0 and
   * back earlier by up to 40 rows, so some start in the key block) in the key rows,
   * clamped to [0, Tk] as the caller of the block ops gives them */
  int32_t *doc = NULL, *d_doc = NULL;
  if (docs > 0) {
    doc = docs_make(B * Tq, Tq, docs, NULL);
    for (long i = 0; i < (long)B * Tq; i++) {
      const long j = q0 + doc[i] - 40 - k0;
      doc[i] = (int32_t)(j < 0 ? 0 : j > Tk ? Tk : j);
    }
    for (long i = 1; i < (long)B * Tq; i++) /* not decreasing along a sequence */
      if (i % Tq && doc[i] < doc[i - 1]) doc[i] = doc[i - 1];
    d_doc = dmalloc((size_t)B * Tq * sizeof(int32_t));
    CUDA_CK(cudaMemcpy(d_doc, doc, (size_t)B * Tq * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  const long nbuf = (long)B * T * stride, nout = (long)B * Tq * H * hd, nl = (long)B * H * Tq;
  const long nkv = (long)B * Tk * KV * hd;
  tbuf buf = tb_rand(dt, nbuf, -2, 2), out = tb_out(TSR_F32, nout), lse = tb_out(TSR_F32, nl);
  const long qo = 0, ko = H * hd, vo = (H + KV) * hd;
  tsr_cpu_attention_block_fwd(dt, out.h, lse.h, tb_hat(&buf, qo), tb_hat(&buf, ko),
                              tb_hat(&buf, vo), B, Tq, Tk, H, KV, hd, stride, stride, q0, k0,
                              causal, doc);
  tsr_cuda_attention_block_fwd(dt, out.d, lse.d, tb_dat(&buf, qo), tb_dat(&buf, ko),
                              tb_dat(&buf, vo), B, Tq, Tk, H, KV, hd, stride, stride, q0, k0,
                              causal, d_doc);
  ksync("attention_block_fwd");
  char full[300];
  snprintf(full, sizeof full, "%s fwd out (fp32)", name);
  check_close(full, &out, TOL_F32);
  check_lse_inf("  ... lse (fp32)", &lse, TOL_F32);

  /* the backward, given this block's out (stored as dt) and lse as if it were the only
   * block (a row with no key: lse 0, its terms are masked anyway), into random sums */
  tbuf o16 = tb_alloc(dt, nout), l2 = tb_alloc(TSR_F32, nl);
  tsr_cpu_cast(dt, o16.h, TSR_F32, out.h, nout);
  for (long i = 0; i < nl; i++) {
    const float x = ((float *)lse.h)[i];
    ((float *)l2.h)[i] = x == -INFINITY ? 0.0f : x;
  }
  tb_upload(&o16), tb_upload(&l2);
  tbuf dout = tb_rand(dt, nout, -1, 1);
  tbuf dq = tb_rand(TSR_F32, nout, -1, 1), dk = tb_rand(TSR_F32, nkv, -1, 1);
  tbuf dv = tb_rand(TSR_F32, nkv, -1, 1);
  tbuf dq2 = tb_dup(&dq), dk2 = tb_dup(&dk), dv2 = tb_dup(&dv);
  tsr_cpu_attention_block_bwd(dt, dq.h, dk.h, dv.h, dout.h, o16.h, l2.h, tb_hat(&buf, qo),
                              tb_hat(&buf, ko), tb_hat(&buf, vo), B, Tq, Tk, H, KV, hd, stride,
                              stride, q0, k0, causal, doc);
  for (int run = 0; run < 2; run++)
    tsr_cuda_attention_block_bwd(dt, run ? dq2.d : dq.d, run ? dk2.d : dk.d, run ? dv2.d : dv.d,
                                dout.d, o16.d, l2.d, tb_dat(&buf, qo), tb_dat(&buf, ko),
                                tb_dat(&buf, vo), B, Tq, Tk, H, KV, hd, stride, stride, q0, k0,
                                causal, d_doc);
  ksync("attention_block_bwd");
  snprintf(full, sizeof full, "%s bwd dq (added, fp32)", name);
  check_close(full, &dq, TOL_F32);
  check_close("  ... dk (added, fp32)", &dk, TOL_F32);
  check_close("  ... dv (added, fp32)", &dv, TOL_F32);
  check_same_runs("  ... attention block bwd dq", &dq, &dq2);
  check_same_runs("  ... attention block bwd dk", &dk, &dk2);
  tb_free(&buf), tb_free(&out), tb_free(&lse), tb_free(&o16), tb_free(&l2), tb_free(&dout);
  tb_free(&dq), tb_free(&dk), tb_free(&dv), tb_free(&dq2), tb_free(&dk2), tb_free(&dv2);
  free(doc);
  if (d_doc) CUDA_CK(cudaFree(d_doc));
}
static void run_block(tsr_dtype dt, int B, int Tq, int Tk, int H, int KV, int hd, long q0,
                      long k0, int causal) {
  run_block_docs(dt, B, Tq, Tk, H, KV, hd, q0, k0, causal, 0);
}

/* attention_merge: random partial results, some rows -inf on one side or both, out of
 * place and in place (out = o1, lse = lse1) */
static void run_merge(int B, int T, int H, int hd) {
  if (!want_hd(hd)) return;
  const long n = (long)B * T * H * hd, nl = (long)B * H * T;
  tbuf o1 = tb_rand(TSR_F32, n, -1, 1), o2 = tb_rand(TSR_F32, n, -1, 1);
  tbuf l1 = tb_rand(TSR_F32, nl, -4, 4), l2 = tb_rand(TSR_F32, nl, -4, 4);
  for (long i = 0; i < nl; i += 7) ((float *)l1.h)[i] = -INFINITY;
  for (long i = 0; i < nl; i += 5) ((float *)l2.h)[i] = -INFINITY;
  tb_upload(&l1), tb_upload(&l2);
  tbuf out = tb_out(TSR_F32, n), lse = tb_out(TSR_F32, nl);
  tsr_cpu_attention_merge(out.h, lse.h, o1.h, l1.h, o2.h, l2.h, B, T, H, hd);
  tsr_cuda_attention_merge(out.d, lse.d, o1.d, l1.d, o2.d, l2.d, B, T, H, hd);
  tsr_cuda_attention_merge(o1.d, l1.d, o1.d, l1.d, o2.d, l2.d, B, T, H, hd); /* in place */
  ksync("attention_merge");
  char name[120];
  snprintf(name, sizeof name, "attention merge B=%d T=%d H=%d hd=%d out", B, T, H, hd);
  check_close(name, &out, TOL_F32);
  check_lse_inf("  ... lse", &lse, TOL_F32);
  const tbuf in_o = {TSR_F32, n, out.h, o1.d}, in_l = {TSR_F32, nl, lse.h, l1.d};
  check_close("  ... in place (out = o1, lse = lse1): out", &in_o, TOL_F32);
  check_lse_inf("  ... in place: lse", &in_l, TOL_F32);
  tb_free(&o1), tb_free(&o2), tb_free(&l1), tb_free(&l2), tb_free(&out), tb_free(&lse);
}

void test_attention_group(void) {
  static const tsr_dtype dts[3] = {TSR_F32, TSR_BF16, TSR_F16};
  const int att[][5] = {{1, 1, 1, 1, 8},    {2, 33, 4, 2, 16},  {1, 100, 6, 3, 20},
                        {1, 70, 2, 1, 128}, {2, 130, 4, 4, 64}, {1, 257, 8, 2, 72},
                        {1, 64, 3, 1, 96},  {1, 31, 2, 2, 32},  {2, 65, 4, 1, 64}};
  const int n_att = (int)(sizeof att / sizeof att[0]);
  kreserve(att_shapes(TSR_BF16, 1, 1, 1, 1, 8));
  check_tc_table();
  check_default_kind();
  /* our kernels (fp32 storage: the one kernel) */
  for (int d = 0; d < 3; d++) {
    for (int i = 0; i < n_att; i++)
      run_case(dts[d], TSR_ATT_MMA, att[i][0], att[i][1], att[i][2], att[i][3], att[i][4], 0, 1);
    run_case(dts[d], TSR_ATT_MMA, 2, 45, 4, 2, 64, 1, 1);
    /* document masking: documents of ~7 to ~90 rows, tiles skipped before a query tile's
     * first document and masked where they cross one; every head dimension of the mma
     * kernels, GQA, and a last sequence of one document */
    run_case_docs(dts[d], TSR_ATT_MMA, 2, 33, 4, 2, 16, 0, 1, 7);
    run_case_docs(dts[d], TSR_ATT_MMA, 2, 130, 4, 4, 64, 0, 1, 40);
    run_case_docs(dts[d], TSR_ATT_MMA, 1, 257, 8, 2, 32, 0, 1, 90);
    run_case_docs(dts[d], TSR_ATT_MMA, 1, 200, 2, 1, 128, 0, 1, 60);
    run_case_docs(dts[d], TSR_ATT_MMA, 2, 150, 3, 1, 96, 1, 1, 50);
  }
  /* the block ops: cut by the diagonal (the first 20 queries see no key), causal left of
   * the queries, whole, fully masked, the diagonal block; GQA; head_dim over 64 */
  for (int d = 0; d < 3; d++) {
    run_block(dts[d], 2, 45, 70, 4, 2, 16, 40, 60, 1);
    run_block(dts[d], 1, 33, 50, 4, 1, 72, 200, 100, 1);
    run_block(dts[d], 2, 40, 30, 2, 2, 32, 0, 100, 0);
    run_block(dts[d], 1, 32, 32, 4, 2, 16, 0, 64, 1);
    run_block(dts[d], 2, 65, 65, 6, 3, 20, 130, 130, 1);
    /* with documents (the ring's blocks under data.document_mask) */
    run_block_docs(dts[d], 2, 45, 70, 4, 2, 16, 40, 60, 1, 12);
    run_block_docs(dts[d], 2, 40, 64, 2, 1, 32, 100, 36, 0, 20);
  }
  run_merge(2, 37, 3, 20);
  run_merge(1, 5, 2, 128);
#ifdef TSR_HAVE_CUDNN
  if (!getenv("TSR_TEST_NO_CUDNN")) { /* device-test.sh sanitize: our kernels, not cuDNN's */
    for (int d = 1; d < 3; d++) {
      for (int i = 0; i < n_att; i++)
        run_case(dts[d], TSR_ATT_CUDNN, att[i][0], att[i][1], att[i][2], att[i][3], att[i][4], 0,
                 1);
      run_case(dts[d], TSR_ATT_CUDNN, 2, 45, 4, 2, 64, 1, 1);
      run_case(dts[d], TSR_ATT_CUDNN, 2, 130, 4, 2, 64, 0, 0); /* deterministic off */
      /* cuDNN asked for, document masking: our kernels run it */
      run_case_docs(dts[d], TSR_ATT_CUDNN, 2, 130, 4, 2, 64, 0, 1, 40);
    }
    /* a workspace reserved too small (none at all here): cuDNN declines, saying so, and
     * the shape runs on our kernels */
    if (!want_hd(64)) return;
    setenv("TSR_CUDA_ATTENTION", "cudnn", 1);
    tsr_ops_shapes s = att_shapes(TSR_BF16, 1, 64, 2, 1, 64);
    s.attn_t = 0;
    kreserve(s);
    unsetenv("TSR_CUDA_ATTENTION");
    char why[600];
    const int rc = tsr_cuda_cudnn_attention_prepare(TSR_BF16, 1, 64, 2, 1, 64, 4 * 64, 1, 0, why,
                                                    sizeof why);
    kcheck(rc == TSR_CUDA_CUDNN_CANNOT && strstr(why, "workspace"),
           "cuDNN attention declines a workspace of 0 bytes (%s)", why);
    const int path = tsr_cuda_attention_path(TSR_BF16, 1, 64, 2, 1, 64, 4 * 64, 0);
    kcheck(path == (tsr_cuda_attention_tc_supported(64) ? TSR_ATT_PATH_MMA : TSR_ATT_PATH_F32),
           "  ... and the shape runs on our kernels (%s)", path >= 0 ? path_name[path] : "none");
  }
#endif
}
