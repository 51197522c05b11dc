/* select.h — which GPU a rank drives, the per-device setup the CUDA backend needs, and
 * the backend's MPI opener (tsr_cuda_ops_open of backend.h, defined in select.c).
 *
 * One rank per GPU: the rank's index among the ranks of its node (MPI_COMM_TYPE_SHARED)
 * picks the device among those visible to it (so CUDA_VISIBLE_DEVICES and Slurm's
 * per-task GPU binding are respected).  Two ranks of a node ending up on the same
 * physical GPU (compared by PCI bus id) is an error unless sharing is asked for (tests
 * and the single-GPU development machine run several ranks on one GPU). */
#ifndef TSR_CUDA_SELECT_H
#define TSR_CUDA_SELECT_H

#include <mpi.h>
#include <stddef.h>

/* Number of usable devices; 0 when there is none, with the reason in why[why_len]:
 * no driver (cudaGetDeviceCount's 35 / 34 with the stub library), no device (100), ... */
int tsr_cuda_device_count(char *why, size_t why_len);

/* Make `device` current and let its default memory pool keep freed memory cached, so
 * that stream-ordered allocations by libraries are not returned to the driver at every
 * synchronisation (our kernels allocate nothing: they take a tsr_cuda_scratch). */
int tsr_cuda_device_setup(int device);

/* Pick and set up this rank's device.  comm: the ranks of the job (MPI_COMM_WORLD);
 * collective over it.  Without MPI initialised, SLURM_LOCALID (or Open MPI's
 * OMPI_COMM_WORLD_LOCAL_RANK) gives the local rank and the sharing check is skipped.
 * Returns 0, TSR_ERR (no device, CUDA failure) or TSR_ERR_INPUT (more ranks on a node
 * than GPUs without allow_shared), with a message naming the rank and what to do. */
int tsr_cuda_select_device(MPI_Comm comm, int allow_shared, int *device);

#endif
