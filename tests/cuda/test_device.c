/* test_device.c — device selection (cuda/select.c) on emulated devices (emu,
 * EMU_DEVICES = visible GPUs), 2 MPI ranks on one node: every rank must get the same
 * verdict, never hang in a collective.  Run by tests/cuda/emulate.sh. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "select.h"
#include "testutil.h"
#include "util.h"

static int verdict(const char *devices, int allow_shared, int *device) {
  setenv("EMU_DEVICES", devices, 1);
  *device = -1;
  return tsr_cuda_select_device(MPI_COMM_WORLD, allow_shared, device);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size, dev, rc;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  tsr_set_rank(rank);
  if (size != 2) {
    if (rank == 0) printf("test_device needs 2 ranks\n");
    MPI_Finalize();
    return 1;
  }
  char why[128] = "";
  setenv("EMU_DEVICES", "0", 1);
  TU_CHECK(tsr_cuda_device_count(why, sizeof why) == 0 && why[0], "rank %d: no device, reason: %s", rank, why);
  rc = verdict("0", 0, &dev);
  TU_CHECK(rc == TSR_ERR, "rank %d: no GPU on the node -> TSR_ERR on every rank (%d)", rank, rc);
  rc = verdict("2", 0, &dev);
  TU_CHECK(rc == 0 && dev == rank, "rank %d: 2 GPUs, 2 ranks -> device %d (rc %d)", rank, dev, rc);
  rc = verdict("1", 0, &dev);
  TU_CHECK(rc == TSR_ERR_INPUT, "rank %d: 2 ranks on 1 GPU without sharing -> TSR_ERR_INPUT (%d)", rank, rc);
  rc = verdict("1", 1, &dev);
  TU_CHECK(rc == 0 && dev == 0, "rank %d: 2 ranks sharing 1 GPU when allowed -> device 0 (rc %d)", rank, rc);
  rc = verdict("4", 0, &dev);
  TU_CHECK(rc == 0 && dev == rank, "rank %d: 4 GPUs, 2 ranks -> device %d (rc %d)", rank, dev, rc);
  int fails = tu_fail, all = 0;
  MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const int mine = tu_summary("test_device");
  MPI_Finalize();
  return all ? 1 : mine;
}
