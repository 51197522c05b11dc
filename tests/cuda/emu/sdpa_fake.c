/* sdpa_fake.c — a stand-in for cuDNN's attention graphs (cuda/sdpa_graphs.h) in the CPU
 * emulation, where there is no cuDNN: the same results, computed on the host in fp32 from
 * the bf16 copies (emulated device memory is host memory), so that tests/cuda_train_emu.sh
 * runs the trainer through cuda/sdpa_stage.c and cuda/ops_dev.c's cuDNN path (the staging,
 * the casts and their strides, lse passed through, gradients added back, the fallback).
 * It declines what cuDNN 9.19 declines (one-token sequences; head dimensions that are not
 * a multiple of 8, or over 256) and asks for a workspace of an fp32 dq accumulator, which
 * its backward overwrites whole, so that a copy overlapping it shows in the results.
 * What it cannot show is anything of cuDNN itself: tests/cuda_cudnn_offline.sh checks the
 * graphs against cuDNN, tests/cuda/test_kernels their numbers on a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cuda.h"
#include "sdpa_graphs.h"
#include "util.h"

static float from_bf(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t to_bf(float x) {
  const float r = tsr_round_bf16(x);
  uint32_t u;
  memcpy(&u, &r, 4);
  return (uint16_t)(u >> 16);
}

long tsr_sdpa_graphs_version(void) { return 0; }

static long long ws_bytes(int B, int T, int H, int hd) { return 4LL * B * T * H * hd; }

int tsr_sdpa_graphs_prepare(int B, int T, int H, int KV, int hd, long long ws_limit,
                            tsr_sdpa_info *info, char *why, size_t why_len) {
  if (T == 1 || hd % 8 || hd > 256) {
    snprintf(why, why_len, "emulated cuDNN cannot run it: %s",
             T == 1 ? "s_q = s_kv = 1 is not supported"
                    : "hidden_dim should be a multiple of 8, at most 256");
    return TSR_CUDA_CUDNN_CANNOT;
  }
  const long long ws = ws_bytes(B, T, H, hd);
  if (ws > ws_limit) {
    snprintf(why, why_len, "its workspace needs %lld bytes, the staging has %lld beside the copies",
             ws, ws_limit);
    return TSR_CUDA_CUDNN_CANNOT;
  }
  *info = (tsr_sdpa_info){0, ws, 1};
  snprintf(why, why_len, "emulated cuDNN (tests/cuda/emu/sdpa_fake.c), deterministic backward, "
           "workspace 0 + %lld bytes", ws);
  return 0;
}

/* element (b, t, head, i) of a compact [B, T, heads, hd] bf16 tensor */
#define AT(x, heads, b, t, h, i) from_bf((x)[(((size_t)(b) * T + (t)) * (heads) + (h)) * hd + (i)])

int tsr_sdpa_graphs_fwd(int B, int T, int H, int KV, int hd, const void *Q, const void *K,
                        const void *V, void *O, float *stats, void *ws, cudaStream_t stream) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) return TSR_ERR;
  const uint16_t *q = Q, *k = K, *v = V;
  uint16_t *o = O;
  const float scale = (float)(1.0 / sqrt((double)hd));
  float *s = malloc((size_t)T * sizeof(float)), *acc = malloc((size_t)hd * sizeof(float));
  TSR_CHECK(s && acc, TSR_ERR, "out of memory");
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const int g = h / (H / KV);
      for (int t = 0; t < T; t++) {
        float mx = -INFINITY;
        for (int j = 0; j <= t; j++) {
          float d = 0;
          for (int i = 0; i < hd; i++) d += AT(q, H, b, t, h, i) * AT(k, KV, b, j, g, i);
          s[j] = d * scale;
          mx = fmaxf(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; j++) sum += exp((double)(s[j] - mx));
        for (int i = 0; i < hd; i++) acc[i] = 0;
        for (int j = 0; j <= t; j++) {
          const float p = (float)(exp((double)(s[j] - mx)) / sum);
          for (int i = 0; i < hd; i++) acc[i] += p * AT(v, KV, b, j, g, i);
        }
        for (int i = 0; i < hd; i++)
          o[(((size_t)b * T + t) * H + h) * hd + i] = to_bf(acc[i]);
        stats[((size_t)b * H + h) * T + t] = mx + (float)log(sum);
      }
    }
  free(s), free(acc);
  (void)ws;
  return 0;
}

int tsr_sdpa_graphs_bwd(int B, int T, int H, int KV, int hd, const void *Q, const void *K,
                        const void *V, const void *O, const void *dO, const float *stats,
                        void *dQ, void *dK, void *dV, void *ws, cudaStream_t stream) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) return TSR_ERR;
  const uint16_t *q = Q, *k = K, *v = V, *o = O, *dout = dO;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
  /* the workspace: the fp32 dq accumulator, overwritten whole */
  float *dqa = ws;
  float *dka = calloc(nk, sizeof(float)), *dva = calloc(nk, sizeof(float));
  float *p = malloc((size_t)T * sizeof(float)), *dp = malloc((size_t)T * sizeof(float));
  TSR_CHECK(dka && dva && p && dp, TSR_ERR, "out of memory");
  memset(dqa, 0, nq * sizeof(float));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      const int g = h / (H / KV);
      for (int t = 0; t < T; t++) {
        const float L = stats[((size_t)b * H + h) * T + t];
        float D = 0;
        for (int i = 0; i < hd; i++) D += AT(dout, H, b, t, h, i) * AT(o, H, b, t, h, i);
        for (int j = 0; j <= t; j++) {
          float d = 0, e = 0;
          for (int i = 0; i < hd; i++) {
            d += AT(q, H, b, t, h, i) * AT(k, KV, b, j, g, i);
            e += AT(dout, H, b, t, h, i) * AT(v, KV, b, j, g, i);
          }
          p[j] = expf(d * scale - L);
          dp[j] = p[j] * (e - D) * scale; /* dS */
        }
        for (int j = 0; j <= t; j++)
          for (int i = 0; i < hd; i++) {
            const size_t kj = (((size_t)b * T + j) * KV + g) * hd + i;
            dqa[(((size_t)b * T + t) * H + h) * hd + i] += dp[j] * AT(k, KV, b, j, g, i);
            dka[kj] += dp[j] * AT(q, H, b, t, h, i);
            dva[kj] += p[j] * AT(dout, H, b, t, h, i);
          }
      }
    }
  uint16_t *dq = dQ, *dk = dK, *dv = dV;
  for (size_t i = 0; i < nq; i++) dq[i] = to_bf(dqa[i]);
  for (size_t i = 0; i < nk; i++) dk[i] = to_bf(dka[i]), dv[i] = to_bf(dva[i]);
  free(dka), free(dva), free(p), free(dp);
  return 0;
}

void tsr_sdpa_graphs_close(void) {}
