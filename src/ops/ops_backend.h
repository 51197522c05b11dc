/* ops_backend.h — a device backend of ops.h, as a table of functions.
 *
 * The CPU kernels (src/cpu/) implement ops.h on the host, as the host backend's table
 * (tsr_cpu_open installs it).  A device backend
 * (cuda/backend.c) fills one of these tables; once it is installed with
 * tsr_ops_set_backend, every tsr_ops_X call goes to its X member instead, with the same
 * arguments and the same semantics (ops_list.h), on memory from its alloc.  The members
 * for the ops are generated from ops_list.h, so a backend cannot miss one.
 *
 * A member may report a failure by returning nonzero from status() afterwards; the ops
 * keep their void / value signatures, and the trainer checks tsr_ops_status() once per
 * step (a failed device call is reported where it happens). */
#ifndef TSR_OPS_BACKEND_H
#define TSR_OPS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

typedef struct tsr_ops_backend {
  const char *name;
  /* memory */
  void *(*alloc)(size_t bytes); /* zeroed */
  void (*free)(void *p);
  void (*copy)(void *dst, const void *src, size_t bytes);
  void (*zero)(void *dst, size_t bytes);
  void (*sync)(void);
  int (*status)(void);
  int (*reserve)(const tsr_ops_shapes *s);
  void (*close)(void); /* at the end of the run, with no memory of it left */
  /* bytes allocated through alloc: 0 now, 1 the high-water mark; 2 restarts the
   * high-water mark from now (and returns it) */
  size_t (*mem_bytes)(int what);
  /* host memory for copies of device memory (page-locked), zeroed; may be NULL: plain
   * host memory then */
  void *(*host_alloc)(size_t bytes);
  void (*host_free)(void *p);
  /* the copy queue and its events (ops.h tsr_ops_copy_async); NULL: none (the host
   * backend's copies are done when they return) */
  void *(*event_create)(void);
  void (*event_destroy)(void *ev);
  void (*copy_async)(void *dst, const void *src, size_t bytes, void *ev);
  void (*event_wait)(void *ev);
  void (*event_sync)(void *ev); /* the host waits for the event */
  /* the ops, as in ops_list.h */
#define TSR_OP(name, params, args) void(*name) params;
#define TSR_OP_RET(type, name, params, args) type(*name) params;
#include "ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET
} tsr_ops_backend;

/* Install the host backend: the table the ops run on when no device backend is installed
 * (the CPU kernels' table, by tsr_cpu_open; its memory members are not used: op memory on
 * the host is tsr_calloc's). */
void tsr_ops_set_host(const tsr_ops_backend *b);

/* Install a device backend (NULL: back to the host backend).  Memory allocated under one backend
 * must be freed under the same one. */
void tsr_ops_set_backend(const tsr_ops_backend *b);

/* How a build that has a device backend opens it: set by the driver (main.c) in builds
 * linked with one, NULL otherwise.  Collective over comm (the job's MPI communicator,
 * an MPI_Comm passed by address so this header needs no mpi.h).  mode "cuda": a device
 * per rank or an error; "auto": the same when every rank sees a device, otherwise
 * returns 0 with *b = NULL on every rank (run on the CPU).  share: several ranks of a
 * node may drive one device.  Returns 0 (with *b set unless "auto" found no device) or
 * an error code (util.h) after reporting why. */
typedef int (*tsr_ops_device_opener)(const void *comm, const char *mode, int share,
                                     const tsr_ops_backend **b);
extern tsr_ops_device_opener tsr_ops_cuda_open;

#endif
