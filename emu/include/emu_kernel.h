/* Device-side emulation: every CUDA thread is a fiber (emu.cpp); a block runs to
 * completion before the next; __syncthreads and warp shuffles are real barriers (a
 * barrier some threads of the block never reach is reported as a deadlock). */
#ifndef EMU_KERNEL_H
#define EMU_KERNEL_H
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <math.h>
#define TSR_CUDA_EMULATION 1 /* device code that needs a stand-in (inline PTX) tests this */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
extern dim3 threadIdx, blockIdx; /* the running fiber's, set at every switch */
extern dim3 blockDim, gridDim;
extern float *emu_dyn_smem;
void emu_syncthreads();
void emu_warp_exchange(const void *v, void *out, int partner, size_t size);
/* all[l] = lane l's *v (size bytes, at most 32) for the 32 lanes of the caller's warp */
void emu_warp_gather(const void *v, void *all, size_t size);
void emu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body);
#define __syncthreads() emu_syncthreads()
template <class V> V __shfl_xor_sync(unsigned mask, V v, int o) {
  V r;
  emu_warp_exchange(&v, &r, (int)(threadIdx.x ^ (unsigned)o), sizeof(V));
  return r;
}
/* lane src's v, for every lane of the warp */
template <class V> V __shfl_sync(unsigned mask, V v, int src) {
  V all[32];
  emu_warp_gather(&v, all, sizeof(V));
  return all[src & 31];
}
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
using std::max;
using std::min;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <class K> cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int) { return 0; }
#endif
