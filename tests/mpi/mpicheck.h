/* mpicheck.h — the check of the MPI unit tests (test_comm, test_grid): a check passes only
 * if it holds on every rank, and rank 0 prints it once.  Collective: every rank calls it. */
#ifndef TSR_MPICHECK_H
#define TSR_MPICHECK_H

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>

#include "core/util.h"

static int g_rank, n_pass, n_fail;

static void check(int ok, const char *fmt, ...) TSR_PRINTF(2, 3);
static void check(int ok, const char *fmt, ...) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) n_pass++;
  else n_fail++;
  if (g_rank == 0) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", all ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
  }
}

#endif
