/* cuda_runtime_api.h (CPU emulation, tests/cuda/emulate.sh): the runtime calls the
 * kernels and tests/cuda/test_kernels.c make, on host memory; one "device". */
#ifndef EMU_CUDA_RUNTIME_API_H
#define EMU_CUDA_RUNTIME_API_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef int cudaError_t;
#define cudaSuccess 0
#define cudaErrorMemoryAllocation 2
typedef struct emu_stream *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
struct cudaDeviceProp { char name[256]; int major, minor, multiProcessorCount; };
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaGetLastError(void);
#define CUDART_VERSION 13000
/* managed memory: host memory the emulated device also takes, outside the device
 * guard; only tests/mpi/test_comm.c's memory-only device uses it (the trainer's backend
 * allocates device memory, cudaMalloc) */
#define cudaMemAttachGlobal 1u
cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags);
/* device memory: its bytes free and in all (EMU_DEVICE_MEM, default 16 GiB) */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
/* Emulation only: device work (a launch, a copy, a library call) runs between these two;
 * outside them device memory is inaccessible to the host (emu.cpp, EMU_DEVICE_GUARD). */
void emu_device_enter(void);
void emu_device_leave(void);
/* devices: EMU_DEVICES=N (default 1; 0 = the "insufficient driver" error, 35) */
typedef struct emu_pool *cudaMemPool_t;
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int dev);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value);
/* streams and events: the emulation runs everything at once, in call order, so an event
 * has always happened; the calls check their arguments */
#define cudaErrorNotReady 600
#define cudaStreamNonBlocking 1u
#define cudaEventDisableTiming 2u
typedef struct emu_event *cudaEvent_t;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
/* pinned host memory: tracked, so cudaPointerGetAttributes says cudaMemoryTypeHost */
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
/* what memory a pointer is: the emulation tracks cudaMalloc and cudaMallocHost ranges */
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1,
                      cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
struct cudaPointerAttributes { enum cudaMemoryType type; int device; void *devicePointer; void *hostPointer; };
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaGetDevice(int *dev);
/* EMU_SMEM_OPTIN (bytes, default an H100's 232448) stands in for the device's limit */
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
#ifdef __cplusplus
}
#endif
#endif
