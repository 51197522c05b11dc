/* CUB radix sort (CPU emulation, tests/cuda/emulate.sh): a stable sort of (key, value)
 * pairs on the key bits [begin_bit, end_bit), as CUB's SortPairs. */
#pragma once
#include "cuda_runtime_api.h"
#include <algorithm>
#include <numeric>
#include <vector>
namespace cub {
struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void *tmp, size_t &bytes, const K *kin, K *kout, const V *vin, V *vout, int n,
                               int begin_bit, int end_bit, cudaStream_t) {
    if (!tmp) { bytes = 64; return 0; }
    struct open_device { open_device() { emu_device_enter(); } ~open_device() { emu_device_leave(); } } open_;
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    const K mask = (K)(((long long)1 << end_bit) - 1);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return (kin[a] & mask) < (kin[b] & mask); });
    std::vector<K> k2(n); std::vector<V> v2(n);
    for (int i = 0; i < n; i++) k2[i] = kin[idx[i]], v2[i] = vin[idx[i]];
    std::copy(k2.begin(), k2.end(), kout); std::copy(v2.begin(), v2.end(), vout);
    return 0;
  }
};
}
