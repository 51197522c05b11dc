/* select.c — device selection and per-device setup (see select.h), and the MPI side of
 * opening the CUDA backend (backend.h's tsr_cuda_ops_open): every rank picks its GPU and
 * opens the backend on it (backend.c), and all ranks agree on the outcome. */
#include "select.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "backend.h"

int tsr_cuda_device_count(char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) snprintf(why, why_len, "cudaGetDeviceCount: %s (%d): %s", cudaGetErrorName(e), (int)e,
                      cudaGetErrorString(e));
    cudaGetLastError(); /* not sticky: clear it */
    return 0;
  }
  if (n == 0 && why) snprintf(why, why_len, "cudaGetDeviceCount: no device");
  return n;
}

int tsr_cuda_device_setup(int device) {
  TSR_CUDA_CALL(cudaSetDevice(device));
  cudaMemPool_t pool;
  TSR_CUDA_CALL(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  TSR_CUDA_CALL(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  return 0;
}

static int env_int(const char *name, int fallback) {
  const char *s = getenv(name);
  return (s && *s) ? atoi(s) : fallback;
}

int tsr_cuda_select_device(MPI_Comm comm, int allow_shared, int *device) {
  char why[256] = "";
  int rank = tsr_rank(), inited = 0;
  MPI_Initialized(&inited);
  const int n = tsr_cuda_device_count(why, sizeof why);
  int local_rank = env_int("SLURM_LOCALID", env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0));
  int local_size = 1;
  MPI_Comm node = MPI_COMM_NULL;
  if (inited) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
  }
  /* Every rank learns whether any rank lacks a device, so all fail together. */
  int ok = n > 0, all_ok = ok;
  if (inited) MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!ok) tsr_error("rank %d: no usable CUDA device (%s)", rank, why);
  if (!all_ok) {
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    return TSR_ERR;
  }
  *device = local_rank % n;
  int rc = tsr_cuda_device_setup(*device);

  /* Two ranks of a node on one physical GPU?  Compare PCI bus ids over the node. */
  int clash = 0;
  if (inited && local_size > 1) { /* collective over the node: every rank enters */
    char bus[32] = "", all[local_size][32]; /* a few hundred ranks per node at most */
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, *device) != cudaSuccess) {
      cudaGetLastError();
      snprintf(bus, sizeof bus, "device %d", *device);
    }
    MPI_Allgather(bus, sizeof bus, MPI_CHAR, all, sizeof bus, MPI_CHAR, node);
    for (int r = 0; r < local_size; r++)
      if (r != local_rank && strcmp(all[r], bus) == 0) clash = 1;
    if (clash && !allow_shared)
      tsr_error("rank %d (local rank %d of %d on its node) shares GPU %d (%s) with another rank: "
                "the node shows this rank %d GPU(s). Start at most one rank per GPU (srun "
                "--ntasks-per-node=<GPUs per node>, mpirun --map-by ppr:<GPUs>:node), or allow "
                "sharing for tests",
                rank, local_rank, local_size, *device, bus, n);
  }
  int bad = rc != 0 ? TSR_ERR : (clash && !allow_shared) ? TSR_ERR_INPUT : 0, worst = bad;
  if (inited) MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, comm);
  if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
  return worst;
}

int tsr_cuda_ops_open(const void *comm_p, const char *mode, int share,
                      const tsr_ops_backend **b) {
  const MPI_Comm comm = *(const MPI_Comm *)comm_p;
  *b = NULL;
  if (!strcmp(mode, "auto")) { /* a GPU on every rank, or the CPU everywhere */
    const int here = tsr_cuda_device_count(NULL, 0) > 0;
    int all = here;
    MPI_Allreduce(&here, &all, 1, MPI_INT, MPI_MIN, comm);
    if (!all) return 0;
  }
  int device = 0;
  TSR_CALL(tsr_cuda_select_device(comm, share, &device));
  const tsr_ops_backend *opened = NULL;
  int rc = tsr_cuda_ops_open_device(device, &opened), worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, comm);
  if (worst) { /* a rank that opened closes again: every rank stays on the CPU */
    if (opened) opened->close();
    return worst;
  }
  struct cudaDeviceProp prop;
  if (tsr_rank() == 0 && cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    tsr_log("device: cuda, rank 0 on GPU %d (%s, sm_%d%d, %d SMs)%s", device, prop.name,
            prop.major, prop.minor, prop.multiProcessorCount,
            share ? "; ranks may share a GPU (run.gpu_share)" : "");
  *b = opened;
  return 0;
}
