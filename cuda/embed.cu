/* embed.cu — the token (and learned position) embedding, forward and backward, on fp32,
 * bf16 or fp16 storage of the tables and activations; the table gradients are fp32.
 *
 * The backward sorts the rows by token (CUB radix sort, stable) and sums each token's
 * rows in row order: deterministic, the same additions in the same order as the CPU.
 * The position gradient: one thread per (position, column) walks its rows in order; with
 * documents (ops_list.h: positions restart at each one) the rows are sorted by position
 * the same way and each position's run summed in row order, as the CPU sums it. */
#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

extern "C" {
#include "backend.h"
}

template <class T>
__global__ void embedding_fwd_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe,
                                     int n, int T_, int C, int vocab_start, int vocab_local,
                                     const int32_t *doc) {
  GRID_STRIDE_LOOP(i, (long)n * C) {
    const int r = (int)(i / C), c = (int)(i % C);
    const int tok = tokens[r] - vocab_start;
    float o = (tok >= 0 && tok < vocab_local) ? to_f32(wte[(size_t)tok * C + c]) : 0.0f;
    if (wpe) o += to_f32(wpe[(size_t)(doc ? r % T_ - doc[r] : r % T_) * C + c]);
    out[i] = from_f32<T>(o);
  }
}

/* Sort key of a row: its local token, or vocab_local (sorted last, skipped) when the
 * token belongs to another rank's vocabulary slice. */
__global__ void embedding_keys_kernel(int *keys, int *rows, const int32_t *tokens, int n,
                                      int vocab_start, int vocab_local) {
  GRID_STRIDE_LOOP(r, n) {
    const int tok = tokens[r] - vocab_start;
    keys[r] = (tok >= 0 && tok < vocab_local) ? tok : vocab_local;
    rows[r] = (int)r;
  }
}

/* Sort key of a row for the position gradient with documents: its position. */
__global__ void position_keys_kernel(int *keys, int *rows, const int32_t *doc, int n, int T_) {
  GRID_STRIDE_LOOP(r, n) {
    keys[r] = (int)(r % T_) - doc[r];
    rows[r] = (int)r;
  }
}

/* Block x = a position in the sorted order; only the first position of each token's run
 * works: it walks the run (rows in increasing order, the sort is stable) and sums each
 * row into dwte, in the CPU loop's order.  (With position keys and vocab_local = T, no
 * key is skipped: the position gradient with documents.) */
template <class T>
__global__ void embedding_dwte_kernel(float *dwte, const T *dout, const int *keys,
                                      const int *rows, int n, int C, int vocab_local) {
  const int i = blockIdx.x;
  const int key = keys[i];
  if (key == vocab_local || (i > 0 && keys[i - 1] == key)) return;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = dwte[(size_t)key * C + c];
  for (int j = i; j < n && keys[j] == key; j++) sum += to_f32(dout[(size_t)rows[j] * C + c]);
  dwte[(size_t)key * C + c] = sum;
}

template <class T>
__global__ void embedding_dwpe_kernel(float *dwpe, const T *dout, int n, int T_, int C) {
  const int npos = n < T_ ? n : T_;
  GRID_STRIDE_LOOP(i, (long)npos * C) {
    const int t = (int)(i / C), c = (int)(i % C);
    float sum = dwpe[i];
    for (int r = t; r < n; r += T_) sum += to_f32(dout[(size_t)r * C + c]);
    dwpe[i] = sum;
  }
}

/* Radix-sort key bits for token ids in [0, vocab_local]. */
static int key_bits(long vocab_local) {
  int bits = 1;
  while (bits < 31 && (1L << bits) <= vocab_local) bits++;
  return bits;
}

/* Scratch of the backward: keys and rows, sorted copies, CUB's temporary. */
static int sort_scratch(long n, long vocab_local, size_t *need, size_t *sort_bytes) {
  *need = *sort_bytes = 0;
  if (n <= 0 || vocab_local <= 0) return 0;
  TSR_CUDA_CALL(cub::DeviceRadixSort::SortPairs(NULL, *sort_bytes, (const int *)NULL,
                                                 (int *)NULL, (const int *)NULL, (int *)NULL,
                                                 (int)n, 0, key_bits(vocab_local),
                                                 (cudaStream_t)0));
  *need = 4 * scratch_round((size_t)n * sizeof(int)) + *sort_bytes;
  return 0;
}

/* Keys up to the vocabulary slice's size, or T's (the position sort of documents). */
extern "C" int tsr_cuda_scratch_embedding(const tsr_ops_shapes *s, size_t *bytes) {
  size_t sort_bytes = 0;
  return sort_scratch(s->rows, s->vocab_local > s->attn_t ? s->vocab_local : s->attn_t, bytes,
                      &sort_bytes);
}

/* The sort of the backward: rows[] by keys[] (n of them, below key_limit), stably, into
 * *keys_sorted and *rows_sorted, in the scratch; make_keys fills keys and rows first. */
template <class MakeKeys>
static int sort_rows(int n, long key_limit, int **keys_sorted, int **rows_sorted,
                     MakeKeys make_keys) {
  size_t sort_bytes = 0, need = 0;
  TSR_CALL(sort_scratch(n, key_limit, &need, &sort_bytes));
  const size_t idx_bytes = scratch_round((size_t)n * sizeof(int));
  char *scratch = NULL;
  TSR_CUDA_SCRATCH(scratch, need);
  int *keys = (int *)scratch, *rows = (int *)(scratch + idx_bytes);
  *keys_sorted = (int *)(scratch + 2 * idx_bytes);
  *rows_sorted = (int *)(scratch + 3 * idx_bytes);
  TSR_CALL(make_keys(keys, rows));
  TSR_CUDA_CALL(cub::DeviceRadixSort::SortPairs(scratch + 4 * idx_bytes, sort_bytes, keys,
                                                 *keys_sorted, rows, *rows_sorted, n, 0,
                                                 key_bits(key_limit), tsr_cuda_ctx.stream));
  return 0;
}

template <class T>
static int embedding_forward(T *out, const int32_t *tokens, const T *wte, const T *wpe, int n,
                             int T_, int C, int vocab_start, int vocab_local, const int32_t *doc) {
  if (n <= 0 || C <= 0) return 0;
  TSR_CUDA_ARG(T_ > 0 || !wpe);
  LAUNCH_ELEM(embedding_fwd_kernel<T>, (long)n * C, tsr_cuda_ctx.stream, out, tokens, wte, wpe, n,
              T_, C, vocab_start, vocab_local, doc);
  return 0;
}

template <class T>
static int embedding_backward(float *dwte, float *dwpe, const T *dout, const int32_t *tokens,
                              int n, int T_, int C, int vocab_start, int vocab_local,
                              const int32_t *doc) {
  if (n <= 0 || C <= 0) return 0;
  TSR_CUDA_ARG(C <= 65535 * 256 && (T_ > 0 || !dwpe));
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  if (dwte && vocab_local > 0) {
    int *keys_sorted = NULL, *rows_sorted = NULL;
    TSR_CALL(sort_rows(n, vocab_local, &keys_sorted, &rows_sorted,
                       [&](int *keys, int *rows) -> int {
      LAUNCH_ELEM(embedding_keys_kernel, n, stream, keys, rows, tokens, n, vocab_start,
                  vocab_local);
      return 0;
    }));
    embedding_dwte_kernel<T><<<dim3(n, (C + 255) / 256), 256, 0, stream>>>(
        dwte, dout, keys_sorted, rows_sorted, n, C, vocab_local);
    TSR_CUDA_LAUNCHED();
  }
  if (dwpe && doc) { /* the rows of a position sorted together (after dwte's: one stream) */
    int *keys_sorted = NULL, *rows_sorted = NULL;
    TSR_CALL(sort_rows(n, T_, &keys_sorted, &rows_sorted, [&](int *keys, int *rows) -> int {
      LAUNCH_ELEM(position_keys_kernel, n, stream, keys, rows, doc, n, T_);
      return 0;
    }));
    embedding_dwte_kernel<T><<<dim3(n, (C + 255) / 256), 256, 0, stream>>>(
        dwpe, dout, keys_sorted, rows_sorted, n, C, T_);
    TSR_CUDA_LAUNCHED();
  } else if (dwpe) {
    const long npos = n < T_ ? n : T_;
    LAUNCH_ELEM(embedding_dwpe_kernel<T>, npos * C, stream, dwpe, dout, n, T_, C);
  }
  return 0;
}

extern "C" void tsr_cuda_embedding_fwd(tsr_dtype dt, void *out, const int32_t *tokens,
                                      const void *wte, const void *wpe, int n, int T, int C,
                                      int vocab_start, int vocab_local, const int32_t *doc) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S,
                embedding_forward<S>((S *)out, tokens, (const S *)wte, (const S *)wpe, n, T, C,
                                     vocab_start, vocab_local, doc));
}

extern "C" void tsr_cuda_embedding_bwd(tsr_dtype dt, float *dwte, float *dwpe, const void *dout,
                                      const int32_t *tokens, int n, int T, int C,
                                      int vocab_start, int vocab_local, const int32_t *doc) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S,
                embedding_backward<S>(dwte, dwpe, (const S *)dout, tokens, n, T, C, vocab_start,
                                      vocab_local, doc));
}
