/* cudnn_offline.c — cuDNN attention's graphs (cuda/sdpa_cudnn.cpp) checked without a GPU:
 * for an H100 described by cuDNN's device-property JSON (argv[1], tests/cuda/cudnn_h100.json:
 * sm_90, 132 SMs, 227 KiB of shared memory per block), cuDNN validates the forward and
 * backward graphs, its heuristics pick fused-attention engines and its support checks pass,
 * for the shapes the trainer and the kernel tests use, in bf16 and fp16, on q, k, v read in
 * place from the fused qkv buffer (rows of (H + 2 KV) hd) and from separate ones (rows of
 * H hd); the backward is the deterministic one where asked, cuDNN's other where not; shapes
 * cuDNN has no engine for (a head dimension that is not a multiple of 8, or over 256;
 * sequences of one token) are declined with the reason.
 * Only the kernels' compilation, which needs the CUDA driver, is left for the GPU
 * (tests/cuda/test_kernels).  cuDNN loads the driver library before it will pick
 * runtime-compiled engines, so tests/cuda_cudnn_offline.sh puts the toolkit's stub
 * libcuda.so first on the library path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "testutil.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 16);
  const size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
  fclose(f);
  if (buf && n == 0) free(buf), buf = NULL;
  return buf;
}

int main(int argc, char **argv) {
  char *json = argc > 1 ? slurp(argv[1]) : NULL;
  if (!json) {
    fprintf(stderr, "usage: cudnn_offline DEVICE.json (cuDNN's device-property JSON)\n");
    return 2;
  }
  printf("cuDNN %ld\n", tsr_cuda_cudnn_version());
  char why[800];
  static const tsr_dtype dts[2] = {TSR_BF16, TSR_F16};
  /* B, T, H, KV, hd: llama1b (micro-batch 1, seq 2048), the tiny deck, llama 7B/70B heads
   * (70B's 8 query heads per tp-8 rank over 1 KV head), and test_kernels' shapes */
  const int ok[][5] = {{1, 2048, 32, 8, 64}, {16, 128, 4, 2, 32}, {1, 4096, 32, 32, 128},
                       {1, 4096, 8, 1, 128},  {2, 33, 4, 2, 16},  {1, 257, 8, 2, 72},
                       {1, 70, 2, 1, 128},    {1, 64, 3, 1, 96},  {2, 65, 4, 1, 64}};
  for (int d = 0; d < 2; d++)
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
      const int *s = ok[i], fused = (s[2] + 2 * s[3]) * s[4];
      for (int sep = 0; sep < 2; sep++) {
        const int stride = sep ? s[2] * s[4] : fused;
        const int rc = tsr_cuda_cudnn_attention_check_offline(
            json, 90, 132, dts[d], s[0], s[1], s[2], s[3], s[4], stride, 1, why, sizeof why);
        TU_CHECK(rc == 0 && strstr(why, "deterministic backward") && !strstr(why, "NON-"),
                 "cuDNN accepts %s B %d T %d H %d KV %d hd %d, rows of %d, on sm_90, "
                 "deterministic backward (%s)",
                 tsr_dtype_name(dts[d]), s[0], s[1], s[2], s[3], s[4], stride, why);
      }
    }
  /* train.deterministic off: cuDNN's other backward where it has one, said so */
  const int rc0 = tsr_cuda_cudnn_attention_check_offline(json, 90, 132, TSR_BF16, 1, 2048, 32, 8,
                                                         64, 48 * 64, 0, why, sizeof why);
  TU_CHECK(rc0 == 0 && strstr(why, "backward"),
           "cuDNN accepts llama1b's shape with the deterministic backward not required (%s)", why);
  /* and what it says: one token per sequence (cuDNN 9.19's backward has no engine for
   * it; test_kernels' B 1 T 1 shape runs on our kernels) */
  const struct {
    int s[5];
    const char *says;
  } no[] = {{{1, 100, 6, 3, 20}, "hidden_dim should be multiple of 8"},
            {{1, 128, 4, 2, 512}, "less than or equal to 256"},
            {{1, 1, 1, 1, 8}, "s_q = s_kv = 1 is not supported"}};
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
    const int *s = no[i].s;
    const int rc = tsr_cuda_cudnn_attention_check_offline(
        json, 90, 132, TSR_BF16, s[0], s[1], s[2], s[3], s[4], (s[2] + 2 * s[3]) * s[4], 1, why,
        sizeof why);
    TU_CHECK(rc == TSR_CUDA_CUDNN_CANNOT && strstr(why, no[i].says),
             "cuDNN declines B %d T %d H %d KV %d hd %d, saying why (%s)", s[0], s[1], s[2],
             s[3], s[4], why);
  }
  const int rc = tsr_cuda_cudnn_attention_check_offline("{}", 90, 132, TSR_BF16, 1, 64, 2, 1, 64,
                                                        256, 1, why, sizeof why);
  TU_CHECK(rc != 0 && strstr(why, "device properties"),
           "device properties without their fields are refused (%s)", why);
  free(json);
  return tu_summary("cudnn_offline");
}
