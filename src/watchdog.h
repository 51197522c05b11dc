/* watchdog.h — abort the whole job when a step stalls.
 *
 * A dead peer leaves every other rank blocked in a collective forever; without this the
 * job burns its wall clock.  With &run step_timeout_s > 0 a thread per rank watches the
 * current activity (a step, an evaluation, a checkpoint, and inside them the collective
 * in flight); when one lasts longer than the timeout it prints which rank, step and
 * operation it is stuck in and aborts the job: MPI_Abort with exit code 4 when MPI runs
 * with thread support, else _exit(4) (the launcher then ends the other ranks).
 * A rank stalled outside MPI (the likely cause: hung, or far slower than its peers)
 * reports at the timeout; ranks blocked inside a collective, waiting for it, wait half a
 * timeout longer, so the job's last words name the culprit. */
#ifndef TSR_WATCHDOG_H
#define TSR_WATCHDOG_H

#include <stdint.h>

/* Start the thread (nothing when timeout_s <= 0).  mpi_threads: MPI was initialised
 * with MPI_THREAD_MULTIPLE, so the watchdog thread may call MPI_Abort. */
int tsr_watchdog_start(double timeout_s, int mpi_threads);
void tsr_watchdog_stop(void);
/* A new activity starts now (the clock restarts); `what` must be a string literal. */
void tsr_watchdog_activity(int64_t step, const char *what);
/* Name the last operation started inside the activity (the clock keeps running): comm.c
 * records each collective it starts.  Strings must outlive the call. */
void tsr_watchdog_operation(const char *group, const char *op);
/* 1 while this rank is blocked inside an MPI call (comm.c), 0 after. */
void tsr_watchdog_blocked(int blocked);

#endif
