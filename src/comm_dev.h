/* comm_dev.h — a device transport for comm.h: collectives on device memory that run on
 * the GPU's own streams (NCCL, cuda/comm_nccl.c) instead of through MPI.
 *
 * comm.c stays the one entry point.  A group that has a device communicator attached
 * (tsr_comm_attach_device, comm_mpi.h) sends an operation to the transport when every
 * buffer of it is device memory (on_device); anything else (host scalars, groups
 * without one, send/recv) goes through MPI as before.
 *
 * Ordering, with no host synchronisation: an operation is queued on the group's stream
 * after the device work queued so far (the transport makes its stream wait for the
 * compute stream), and completing it (wait) makes later compute work wait for it.  So
 * a "blocking" device collective returns once queued, and the host may not read its
 * buffers before tsr_ops_sync() — which host code already does before touching op
 * memory.  A non-blocking one returns an event; tsr_comm_test polls it.
 *
 * Every function returns 0 or TSR_ERR after printing what failed. */
#ifndef TSR_COMM_DEV_H
#define TSR_COMM_DEV_H

#include <stddef.h>

typedef struct tsr_comm_dev tsr_comm_dev;             /* one group's device communicator */
typedef struct tsr_comm_dev_event tsr_comm_dev_event; /* operations queued so far on it */

typedef enum { TSR_DEV_FLOAT = 0, TSR_DEV_DOUBLE, TSR_DEV_INT } tsr_comm_dev_type;

typedef struct tsr_comm_transport {
  const char *name; /* "nccl" */
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
  /* counts[r] floats per rank r, blocks in rank order (even forms: all counts equal) */
  int (*reduce_scatter)(tsr_comm_dev *d, const float *send, float *recv, const size_t *counts);
  int (*all_gather)(tsr_comm_dev *d, const float *send, float *recv, const size_t *counts);
  int (*broadcast)(tsr_comm_dev *d, void *buf, size_t bytes, int root);
  /* An event after everything queued on d so far. */
  int (*record)(tsr_comm_dev *d, tsr_comm_dev_event **ev);
  /* Later compute-stream work waits for ev; ev is recycled (*ev = NULL). */
  int (*wait)(tsr_comm_dev_event **ev);
  /* *done = 1 once the work before ev has finished on the device (ev is not recycled). */
  int (*query)(tsr_comm_dev_event *ev, int *done);
  /* Frees what the transport keeps between groups; at the end, after every group. */
  void (*close)(void);
} tsr_comm_transport;

/* The GPU transport of this build (NULL without NCCL); main.c sets it. */
extern const tsr_comm_transport *tsr_comm_gpu_transport;

#endif
