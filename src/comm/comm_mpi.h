/* comm_mpi.h — the MPI side of comm: make a group from an MPI communicator, get it back,
 * and the checking macro every MPI call goes through.  Only grid.c, comm.c and the
 * driver include this; model code includes comm.h alone. */
#ifndef TSR_COMM_MPI_H
#define TSR_COMM_MPI_H

#include <mpi.h>

#include "comm.h"
#include "core/util.h"

/* Duplicates `comm` (collective over it), names the copy (also for MPI tools) and sets
 * MPI_ERRORS_RETURN on it so failures come back to TSR_MPI_CALL instead of aborting. */
int tsr_comm_create(tsr_comm **out, MPI_Comm comm, const char *name);

/* The group's own (duplicated) communicator; it stays owned by the group. */
MPI_Comm tsr_comm_mpi(const tsr_comm *c);

/* Give the group a device transport (comm_dev.h; collective over the group): from then
 * on its operations on device memory go through it.  A group of one rank, or one that
 * already has a transport, is left as it is; a transport may decline a group (NCCL: two
 * ranks on one GPU), which then can be given another. */
struct tsr_comm_transport;
int tsr_comm_attach_device(tsr_comm *c, const struct tsr_comm_transport *t);

/* How MPI sees elements of t: MPI_FLOAT and MPI_SUM for fp32; for bf16 and fp16,
 * MPI_UINT16_T and a user-defined commutative sum that widens both sides to fp32, adds,
 * and rounds to t (one rounding per combining step).  The two user operations are
 * created with the first group (tsr_comm_create, so after MPI_Init) and freed by
 * MPI_Finalize (through an attribute of MPI_COMM_SELF, whose deletion MPI_Finalize runs
 * first); MPI_OP_NULL before any group exists. */
MPI_Datatype tsr_comm_mpi_type(tsr_dtype t);
MPI_Op tsr_comm_mpi_sum(tsr_dtype t);

/* Whether MPI moves GPU memory itself: 1 (Open MPI's MPIX_Query_cuda_support() says
 * so), 0 (it says not, or the library was built without it), -1 (no way to ask). */
int tsr_comm_mpi_cuda_aware(void);

/* Prints "file:line func: CALL failed: <MPI error class and string>". */
void tsr_mpi_error(const char *file, int line, const char *func, const char *call, int rc);

/* Check an MPI call; on failure report it and return TSR_ERR from the calling function.
 * (Prefixed: the MPI_ namespace belongs to the MPI standard.) */
#define TSR_MPI_CALL(call)                                         \
  do {                                                             \
    int tsr_mpi_rc_ = (call);                                      \
    if (tsr_mpi_rc_ != MPI_SUCCESS) {                              \
      tsr_mpi_error(__FILE__, __LINE__, __func__, #call, tsr_mpi_rc_); \
      return TSR_ERR;                                              \
    }                                                              \
  } while (0)

#endif
