/* comm_dev.h — a device transport for comm.h: collectives on device memory that run on
 * the GPU's own streams (NCCL, cuda/comm_nccl.c) instead of through MPI, or through MPI
 * on pinned host copies (cuda/comm_stage.c) when MPI cannot take GPU memory.
 *
 * comm.c stays the one entry point.  A group that has a device communicator attached
 * (tsr_comm_attach_device, comm_mpi.h) sends an operation to the transport when every
 * buffer of it is device memory (on_device); anything else (host scalars, groups
 * without one, send/recv on a transport without them) goes through MPI as before.
 *
 * Ordering: an operation is queued on the group's stream after the device work queued
 * so far (the transport makes its stream wait for the compute stream), and completing
 * it (wait) makes later compute work wait for it.  So a "blocking" device collective may
 * return once queued, and the host may not read its buffers before tsr_ops_sync() —
 * which host code already does before touching op memory.  A non-blocking one returns
 * an event; tsr_comm_test polls it.  NCCL never synchronises with the host; the staged
 * transport waits for its copy to the host before it posts MPI (MPI reads host memory).
 *
 * Every function returns 0 or TSR_ERR after printing what failed. */
#ifndef TSR_COMM_DEV_H
#define TSR_COMM_DEV_H

#include <stddef.h>

typedef struct tsr_comm_dev tsr_comm_dev;             /* one group's device communicator */
typedef struct tsr_comm_dev_event tsr_comm_dev_event; /* operations queued so far on it */

/* Element types: the data types of comm.h (fp32, bf16, fp16) and the scalars'.  16-bit
 * sums add in fp32 and round each partial sum to the type, as comm.h says; max and min
 * are never asked of them. */
typedef enum {
  TSR_CUDA_FLOAT = 0,
  TSR_CUDA_DOUBLE,
  TSR_CUDA_INT,
  TSR_CUDA_BF16,
  TSR_CUDA_F16
} tsr_comm_dev_type;

typedef struct tsr_comm_transport {
  const char *name; /* "nccl", "mpi-staged" */
  /* Collective over mpi_comm (a pointer to the group's MPI_Comm): every rank of the group
   * gets its device communicator, or every rank fails; or every rank gets NULL and 0
   * when the transport cannot serve the group (NCCL: two ranks on one GPU), which then
   * stays on MPI. */
  int (*create)(tsr_comm_dev **d, const void *mpi_comm, const char *name);
  void (*destroy)(tsr_comm_dev **d);
  /* 1 when p (any address inside an allocation) is memory the transport can move */
  int (*on_device)(const void *p);
  /* op: 0 sum, 1 max, 2 min (tsr_comm_op) */
  int (*all_reduce)(tsr_comm_dev *d, void *buf, size_t count, tsr_comm_dev_type type, int op);
  /* counts[r] elements of type per rank r, blocks in rank order (even forms: all counts
   * equal); type is TSR_CUDA_FLOAT, TSR_CUDA_BF16 or TSR_CUDA_F16 */
  int (*reduce_scatter)(tsr_comm_dev *d, const void *send, void *recv, const size_t *counts,
                        tsr_comm_dev_type type);
  int (*all_gather)(tsr_comm_dev *d, const void *send, void *recv, const size_t *counts,
                    tsr_comm_dev_type type);
  int (*broadcast)(tsr_comm_dev *d, void *buf, size_t bytes, int root);
  /* An event after the operation just queued on d (NCCL: and all before it). */
  int (*record)(tsr_comm_dev *d, tsr_comm_dev_event **ev);
  /* Later compute-stream work waits for ev; ev is recycled (*ev = NULL). */
  int (*wait)(tsr_comm_dev_event **ev);
  /* *done = 1 once the work before ev has finished on the device (ev is not recycled). */
  int (*query)(tsr_comm_dev_event *ev, int *done);
  /* Frees what the transport keeps between groups; at the end, after every group. */
  void (*close)(void);
  /* Point-to-point with MPI's tag matching; NULL when the transport has none (then
   * comm.c sends through MPI).  A receive's message must be exactly bytes long (wait
   * fails otherwise). */
  int (*send)(tsr_comm_dev *d, const void *buf, size_t bytes, int peer, int tag);
  int (*recv)(tsr_comm_dev *d, void *buf, size_t bytes, int peer, int tag);
} tsr_comm_transport;

/* The GPU transports of this build (NULL without NCCL / without CUDA); main.c sets them. */
extern const tsr_comm_transport *tsr_comm_gpu_transport;    /* NCCL */
extern const tsr_comm_transport *tsr_comm_staged_transport; /* MPI through pinned memory */

#endif
