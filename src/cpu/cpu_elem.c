/* cpu_elem.c — the row-wise and element-wise ops: embedding_fwd/bwd, rope_fwd/bwd,
 * swiglu_fwd/bwd, gelu_fwd, residual, add, acc, cast.
 *
 * For 16-bit storage each row (or block of ELEM_BLOCK elements) is widened into the
 * thread's buffer, run through the same fp32 function as fp32 storage, and rounded once
 * on store, so a 16-bit call gives bitwise the fp32 kernel's results on the widened
 * inputs, rounded.  The residual add and the casts need no buffer (add_row, the row
 * conversions), except a cast between the two 16-bit types (widened, then rounded). */
#include "cpu_internal.h"

/* Per thread, for widths up to C: SwiGLU's backward holds 5 F (F <= C / 2, C being its
 * gate_up width), the embedding two rows, RoPE a row's heads, GELU two blocks. */
size_t cpu_elem_buf_floats(int C) {
  const size_t rows = 3 * (size_t)(C > 0 ? C : 1), blocks = 2 * (size_t)ELEM_BLOCK;
  return rows > blocks ? rows : blocks;
}

/* ------------------------------------------------------------ embedding */

/* The position of row r (ops_list.h "Documents"). */
static inline int row_pos(const int32_t *doc, int r, int T) {
  return doc ? r % T - doc[r] : r % T;
}

void tsr_cpu_embedding_fwd(tsr_dtype dt, void *out, const int32_t *tokens, const void *wte,
                           const void *wpe, int n, int T, int C, int vocab_start,
                           int vocab_local, const int32_t *doc) {
  if (n <= 0 || C <= 0) return;
  const size_t es = tsr_dtype_size(dt);
  if (dt != TSR_F32 && wpe) cpu_buf_need(0, 2 * (size_t)C);
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
  for (int r = 0; r < n; r++) {
    const int tok = tokens[r] - vocab_start;
    const int in_range = tok >= 0 && tok < vocab_local;
    void *o = tsr_dtype_at(out, dt, (int64_t)r * C);
    if (!wpe || dt == TSR_F32) { /* the table's row (or zeros) as stored */
      if (in_range)
        memcpy(o, tsr_dtype_at_c(wte, dt, (int64_t)tok * C), (size_t)C * es);
      else
        memset(o, 0, (size_t)C * es);
    }
    if (!wpe) continue;
    float *of = o, *pf = NULL;
    const int pos = row_pos(doc, r, T);
    const float *p = (const float *)wpe + (size_t)pos * C;
    if (dt != TSR_F32) { /* the same sum on widened rows, rounded once */
      of = cpu_buf_thread(), pf = of + C;
      if (in_range)
        widen_row(dt, of, tsr_dtype_at_c(wte, dt, (int64_t)tok * C), C);
      else
        memset(of, 0, (size_t)C * sizeof(float));
      widen_row(dt, pf, tsr_dtype_at_c(wpe, dt, (int64_t)pos * C), C);
      p = pf;
    }
#pragma omp simd
    for (int c = 0; c < C; c++) of[c] += p[c];
    if (dt != TSR_F32) narrow_row(dt, o, of, C);
  }
}

void tsr_cpu_embedding_bwd(tsr_dtype dt, float *dwte, float *dwpe, const void *dout,
                           const int32_t *tokens, int n, int T, int C, int vocab_start,
                           int vocab_local, const int32_t *doc) {
  if (n <= 0 || C <= 0) return;
  if (dwte) {
    /* Rows may share a token, so split over columns and walk rows in order. */
    const int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      const int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
      float tmp[COL_BLOCK];
      for (int r = 0; r < n; r++) {
        const int tok = tokens[r] - vocab_start;
        if (tok < 0 || tok >= vocab_local) continue;
        float *d = dwte + (size_t)tok * C + c0;
        const int64_t at = (int64_t)r * C + c0;
        const float *g = (const float *)dout + at;
        if (dt != TSR_F32) {
          widen_row(dt, tmp, tsr_dtype_at_c(dout, dt, at), nc);
          g = tmp;
        }
#pragma omp simd
        for (int c = 0; c < nc; c++) d[c] += g[c];
      }
    }
  }
  if (dwpe && doc) {
    /* a position's rows are scattered over the documents: split over columns like dwte,
     * every row added to its position's row in increasing row order */
    const int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
      const int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
      float tmp[COL_BLOCK];
      for (int r = 0; r < n; r++) {
        float *d = dwpe + (size_t)row_pos(doc, r, T) * C + c0;
        const int64_t at = (int64_t)r * C + c0;
        const float *g = (const float *)dout + at;
        if (dt != TSR_F32) {
          widen_row(dt, tmp, tsr_dtype_at_c(dout, dt, at), nc);
          g = tmp;
        }
#pragma omp simd
        for (int c = 0; c < nc; c++) d[c] += g[c];
      }
    }
  } else if (dwpe) {
    const int npos = n < T ? n : T;
    if (dt != TSR_F32) cpu_buf_need(0, (size_t)C);
#pragma omp parallel for schedule(static) if ((long)n * C > PAR_MIN)
    for (int t = 0; t < npos; t++) {
      float *d = dwpe + (size_t)t * C;
      for (int r = t; r < n; r += T) {
        const float *g = (const float *)dout + (size_t)r * C;
        if (dt != TSR_F32) {
          float *tmp = cpu_buf_thread();
          widen_row(dt, tmp, tsr_dtype_at_c(dout, dt, (int64_t)r * C), C);
          g = tmp;
        }
#pragma omp simd
        for (int c = 0; c < C; c++) d[c] += g[c];
      }
    }
  }
}

/* ----------------------------------------------------------------- RoPE */

/* (a, b) -> (a cos - b sin, a sin + b cos), element-wise over half pairs. */
static inline void rope_pairs(float *restrict a, float *restrict b, const float *restrict cs,
                              const float *restrict sn, int half) {
#pragma omp simd
  for (int i = 0; i < half; i++) {
    const float xa = a[i], xb = b[i];
    a[i] = xa * cs[i] - xb * sn[i];
    b[i] = xa * sn[i] + xb * cs[i];
  }
}

/* The row's heads: in place, or widened, rotated and rounded back. */
static inline void rope_row(tsr_dtype dt, void *x, int r, int stride, int n_heads,
                            int head_dim, const float *cs, const float *sn) {
  const int half = head_dim / 2, width = n_heads * head_dim;
  void *row = tsr_dtype_at(x, dt, (int64_t)r * stride);
  float *xf = row;
  if (dt != TSR_F32) widen_row(dt, xf = cpu_buf_thread(), row, width);
  for (int h = 0; h < n_heads; h++) {
    float *a = xf + (size_t)h * head_dim;
    rope_pairs(a, a + half, cs, sn, half);
  }
  if (dt != TSR_F32) narrow_row(dt, row, xf, width);
}

/* The angles of positions [0, npos): cos, then dir * sin, half values each per position,
 * into tab (2 npos half floats). */
static void rope_table(float *tab, int npos, int half, const double *inv_freq, int dir) {
#pragma omp parallel for schedule(static) if ((long)npos * half > PAR_MIN / 16)
  for (int t = 0; t < npos; t++) {
    float *cs = tab + (size_t)2 * t * half, *sn = cs + half;
    for (int i = 0; i < half; i++) {
      const double ang = (double)t * inv_freq[i];
      cs[i] = (float)cos(ang);
      sn[i] = (float)(dir * sin(ang));
    }
  }
}

/* dir = +1 rotates by +angle (forward), -1 by -angle (backward, the inverse).  Angles
 * are formed in double: pos * inv_freq reaches ~1e4 rad at long context, where
 * fp32 would lose the phase.  Without documents the work is split over positions so each
 * cos/sin pair is computed once per call and applied to every row and head at that
 * position; with them (positions restart at each document) the pairs of positions
 * present (those of [0, T), or beyond T under context parallelism) are tabulated once per
 * call in the shared buffer and the rows split over the
 * threads, each looking up its position's: the same values either way. */
static void rope_apply(tsr_dtype dt, void *x, int n, int T, int n_heads, int head_dim,
                       int stride, tsr_rope rope, int dir, const int32_t *doc) {
  const int half = head_dim / 2;
  if (n <= 0 || half <= 0) return;
  double inv_freq[half];
  for (int i = 0; i < half; i++) inv_freq[i] = tsr_rope_inv_freq(rope, i, head_dim);
  const int npos = n < T ? n : T, width = n_heads * head_dim; /* a row's heads, contiguous */
  if (doc) {
    /* the positions present (under context parallelism a row's may exceed T) */
    int ntab = 0;
    for (int r = 0; r < n; r++)
      if (r % T - doc[r] + 1 > ntab) ntab = r % T - doc[r] + 1;
    cpu_buf_need((size_t)2 * ntab * half, dt != TSR_F32 ? (size_t)width : 0);
    float *tab = cpu_buf_shared();
    rope_table(tab, ntab, half, inv_freq, dir);
#pragma omp parallel for schedule(static) if ((long)n * n_heads * head_dim > PAR_MIN)
    for (int r = 0; r < n; r++) {
      const float *cs = tab + (size_t)2 * (r % T - doc[r]) * half;
      rope_row(dt, x, r, stride, n_heads, head_dim, cs, cs + half);
    }
    return;
  }
  if (dt != TSR_F32) cpu_buf_need(0, (size_t)width);
#pragma omp parallel for schedule(static) if ((long)n * n_heads * head_dim > PAR_MIN)
  for (int t = 0; t < npos; t++) {
    float cs[half], sn[half];
    for (int i = 0; i < half; i++) {
      const double ang = (double)t * inv_freq[i];
      cs[i] = (float)cos(ang);
      sn[i] = (float)(dir * sin(ang));
    }
    for (int r = t; r < n; r += T) rope_row(dt, x, r, stride, n_heads, head_dim, cs, sn);
  }
}

void tsr_cpu_rope_fwd(tsr_dtype dt, void *x, int n, int T, int n_heads, int head_dim, int stride,
                      tsr_rope rope, const int32_t *doc) {
  rope_apply(dt, x, n, T, n_heads, head_dim, stride, rope, +1, doc);
}

void tsr_cpu_rope_bwd(tsr_dtype dt, void *dx, int n, int T, int n_heads, int head_dim, int stride,
                      tsr_rope rope, const int32_t *doc) {
  rope_apply(dt, dx, n, T, n_heads, head_dim, stride, rope, -1, doc);
}

/* -------------------------------------------------------- SwiGLU, GELU */

TSR_CLONES static void swiglu_fwd_row(float *restrict o, const float *restrict g,
                                      const float *restrict u, int F) {
#pragma omp simd
  for (int j = 0; j < F; j++) o[j] = g[j] / (1.0f + expf_vec(-g[j])) * u[j];
}

void tsr_cpu_swiglu_fwd(tsr_dtype dt, void *out, const void *gate_up, int n, int F) {
  if (n <= 0 || F <= 0) return;
  if (dt != TSR_F32) cpu_buf_need(0, 3 * (size_t)F);
#pragma omp parallel for schedule(static) if ((long)n * F > PAR_MIN)
  for (int r = 0; r < n; r++) {
    if (dt == TSR_F32) {
      const float *g = (const float *)gate_up + (size_t)r * 2 * F;
      swiglu_fwd_row((float *)out + (size_t)r * F, g, g + F, F);
    } else {
      float *g = cpu_buf_thread(), *o = g + 2 * (size_t)F;
      widen_row(dt, g, tsr_dtype_at_c(gate_up, dt, (int64_t)r * 2 * F), 2 * (long)F);
      swiglu_fwd_row(o, g, g + F, F);
      narrow_row(dt, tsr_dtype_at(out, dt, (int64_t)r * F), o, F);
    }
  }
}

/* silu(g) = g s, s = sigmoid(g);  silu'(g) = s (1 + g (1 - s)) */
TSR_CLONES static void swiglu_bwd_row(float *restrict dg, float *restrict du,
                                      const float *restrict d, const float *restrict g,
                                      const float *restrict u, int F) {
#pragma omp simd
  for (int j = 0; j < F; j++) {
    const float s = 1.0f / (1.0f + expf_vec(-g[j]));
    dg[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    du[j] = d[j] * g[j] * s;
  }
}

void tsr_cpu_swiglu_bwd(tsr_dtype dt, void *dgate_up, const void *dout, const void *gate_up,
                        int n, int F) {
  if (n <= 0 || F <= 0) return;
  if (dt != TSR_F32) cpu_buf_need(0, 5 * (size_t)F);
#pragma omp parallel for schedule(static) if ((long)n * F > PAR_MIN)
  for (int r = 0; r < n; r++) {
    if (dt == TSR_F32) {
      const float *g = (const float *)gate_up + (size_t)r * 2 * F;
      float *dg = (float *)dgate_up + (size_t)r * 2 * F;
      swiglu_bwd_row(dg, dg + F, (const float *)dout + (size_t)r * F, g, g + F, F);
    } else {
      float *g = cpu_buf_thread(), *d = g + 2 * (size_t)F, *dg = d + F;
      widen_row(dt, g, tsr_dtype_at_c(gate_up, dt, (int64_t)r * 2 * F), 2 * (long)F);
      widen_row(dt, d, tsr_dtype_at_c(dout, dt, (int64_t)r * F), F);
      swiglu_bwd_row(dg, dg + F, d, g, g + F, F);
      narrow_row(dt, tsr_dtype_at(dgate_up, dt, (int64_t)r * 2 * F), dg, 2 * (long)F);
    }
  }
}

TSR_CLONES static void gelu_fwd_block(float *restrict out, const float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) {
    const float xi = x[i];
    out[i] = 0.5f * xi * (1.0f + tanhf_vec(GELU_C * (xi + GELU_A * xi * xi * xi)));
  }
}

void tsr_cpu_gelu_fwd(tsr_dtype dt, void *out, const void *x, long n_elem) {
  if (n_elem <= 0) return;
  const long nblk = (n_elem + ELEM_BLOCK - 1) / ELEM_BLOCK;
  if (dt != TSR_F32) cpu_buf_need(0, 2 * (size_t)ELEM_BLOCK);
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (long blk = 0; blk < nblk; blk++) {
    const long i0 = blk * ELEM_BLOCK;
    const int len = n_elem - i0 < ELEM_BLOCK ? (int)(n_elem - i0) : ELEM_BLOCK;
    if (dt == TSR_F32) {
      gelu_fwd_block((float *)out + i0, (const float *)x + i0, len);
    } else {
      float *xb = cpu_buf_thread(), *ob = xb + ELEM_BLOCK;
      widen_row(dt, xb, tsr_dtype_at_c(x, dt, i0), len);
      gelu_fwd_block(ob, xb, len);
      narrow_row(dt, tsr_dtype_at(out, dt, i0), ob, len);
    }
  }
}

/* ----------------------------------------------------------- element-wise */

void tsr_cpu_add(float *out, const float *a, const float *b, long n_elem) {
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) out[i] = a[i] + b[i];
}

void tsr_cpu_acc(float *out, const float *a, long n_elem) {
#pragma omp parallel for simd schedule(static) if (n_elem > PAR_MIN)
  for (long i = 0; i < n_elem; i++) out[i] += a[i];
}

void tsr_cpu_residual(tsr_dtype dt, void *out, const void *x, const void *y, long n_elem) {
  if (dt == TSR_F32) {
    tsr_cpu_add(out, x, y, n_elem);
    return;
  }
  const long nblk = (n_elem + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (long blk = 0; blk < nblk; blk++) {
    const long i0 = blk * ELEM_BLOCK;
    add_row(dt, tsr_dtype_at(out, dt, i0), tsr_dtype_at_c(x, dt, i0), tsr_dtype_at_c(y, dt, i0),
            n_elem - i0 < ELEM_BLOCK ? n_elem - i0 : ELEM_BLOCK);
  }
}

void tsr_cpu_copy_2d(void *dst, long dst_pitch, const void *src, long src_pitch, long width,
                     long rows) {
  for (long r = 0; r < rows; r++)
    memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, (size_t)width);
}

void tsr_cpu_cast(tsr_dtype dst_dt, void *dst, tsr_dtype src_dt, const void *src, long n_elem) {
  if (n_elem <= 0) return;
  if (dst_dt == src_dt) {
    if (dst != src) memmove(dst, src, (size_t)n_elem * tsr_dtype_size(dst_dt));
    return;
  }
  const long nblk = (n_elem + ELEM_BLOCK - 1) / ELEM_BLOCK;
  const int between16 = src_dt != TSR_F32 && dst_dt != TSR_F32;
  if (between16) cpu_buf_need(0, ELEM_BLOCK);
#pragma omp parallel for schedule(static) if (n_elem > PAR_MIN)
  for (long blk = 0; blk < nblk; blk++) {
    const long i0 = blk * ELEM_BLOCK;
    const int len = n_elem - i0 < ELEM_BLOCK ? (int)(n_elem - i0) : ELEM_BLOCK;
    void *d = tsr_dtype_at(dst, dst_dt, i0);
    const void *s = tsr_dtype_at_c(src, src_dt, i0);
    if (src_dt == TSR_F32) {
      narrow_row(dst_dt, d, s, len);
    } else if (dst_dt == TSR_F32) {
      widen_row(src_dt, d, s, len);
    } else { /* bf16 <-> fp16: widened exactly, rounded once */
      float *t = cpu_buf_thread();
      widen_row(src_dt, t, s, len);
      narrow_row(dst_dt, d, t, len);
    }
  }
}
