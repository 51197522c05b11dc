/* cpu.c — the CPU backend's setup: the threads, and the reservation of the conversion
 * buffers of 16-bit storage for a run's shapes (each kernel family says what it needs:
 * cpu_internal.h).  The kernels are in the other files of src/cpu/, one family per file, the
 * buffers and row conversions they share in cpu_buf.c; the table of them that ops.c
 * dispatches to (tsr_cpu_open).
 *
 * Threads.  There is one thread pool, OpenMP's.  OpenBLAS is told to use one thread and
 * each GEMM is split into pieces along the rows or columns of its output (never along
 * the summed dimension), one single-threaded sgemm per OpenMP thread.  Letting OpenBLAS's
 * own pthreads and the OpenMP team share the cores makes both spin against each other
 * between every GEMM and the element-wise op after it (measured 1.6x slower per step
 * than either pool alone on 2 cores). */
#include "cpu_internal.h"

#include "ops/ops_backend.h"

void tsr_cpu_init(int n_threads) {
#ifdef _OPENMP
  openblas_set_num_threads(1); /* GEMMs are split over the OpenMP threads (cpu_gemm.c) */
  /* OPENBLAS_NUM_THREADS alone (as some scripts set it) still sets the threads per rank */
  const char *blas = getenv("OPENBLAS_NUM_THREADS");
  if (n_threads <= 0 && !getenv("OMP_NUM_THREADS") && blas && atoi(blas) > 0)
    n_threads = atoi(blas);
  if (n_threads > 0) omp_set_num_threads(n_threads);
#else
  if (n_threads > 0) openblas_set_num_threads(n_threads);
#endif
}

/* The buffers' floats for shapes s: the shared part and one part per thread. */
static void reserve_floats(const tsr_ops_shapes *s, size_t *shared, size_t *per_thread) {
  const long cols = s->cols > 0 ? s->cols : 1;
  size_t each = cpu_gemm_buf_floats();
  size_t n = cpu_norm_buf_floats((int)cols);
  if (n > each) each = n;
  n = cpu_elem_buf_floats((int)cols);
  if (n > each) each = n;
  n = cpu_xent_buf_floats((int)cols);
  if (n > each) each = n;
  /* attention: B*T*H*hd query elements and B*T*(H + KV)*hd in all give the group H / KV */
  const long hd = s->attn_hd, q_elems = s->attn_bht * hd, kv_elems = s->attn_io - q_elems;
  if (s->attn_t > 0 && hd > 0 && kv_elems > 0 && q_elems % kv_elems == 0) {
    n = cpu_attention_buf_floats((int)s->attn_t, (int)(q_elems / kv_elems), (int)hd);
    if (n > each) each = n;
  }
  /* the shared part holds a widened norm weight and bias, or RoPE's table of the angles of
   * positions [0, T) (with documents, cpu_elem.c): T x head_dim floats */
  *shared = 2 * (size_t)cols;
  if (s->attn_t > 0 && hd > 0 && (size_t)s->attn_t * hd > *shared) *shared = (size_t)s->attn_t * hd;
  *per_thread = each;
}

size_t tsr_cpu_reserve_bytes(const tsr_ops_shapes *s, int threads) {
  if (s->dt == TSR_F32) return 0;
  size_t shared, each;
  reserve_floats(s, &shared, &each);
  /* as cpu_buf_need rounds them */
  shared = (shared + 15) / 16 * 16;
  each = (each + 15) / 16 * 16;
  return (shared + (size_t)(threads > 0 ? threads : 1) * each) * sizeof(float);
}

int tsr_cpu_reserve(const tsr_ops_shapes *s) {
  if (s->dt == TSR_F32) return 0; /* fp32 storage converts nothing */
  size_t shared, each;
  reserve_floats(s, &shared, &each);
  cpu_buf_need(shared, each);
  return 0;
}

int tsr_cpu_threads(void) { return omp_get_max_threads(); }


/* The host backend's table: every op of the list on its CPU kernel. */
static const tsr_ops_backend cpu_backend = {
    .name = "cpu",
    .reserve = tsr_cpu_reserve,
#define TSR_OP(name, params, args) .name = tsr_cpu_##name,
#define TSR_OP_RET(type, name, params, args) .name = tsr_cpu_##name,
#include "ops/ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET
};

void tsr_cpu_open(int n_threads) {
  tsr_cpu_init(n_threads);
  tsr_ops_set_host(&cpu_backend);
}
