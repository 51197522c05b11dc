/* heartbeat.h — end the job within seconds when a rank dies or stalls, and name it.
 *
 * A rank that is killed, frozen (SIGSTOP, a node that hangs) or cut off leaves the others
 * waiting in a collective, where they neither fail nor report.  With &run heartbeat_s > 0
 * every rank runs a thread that exchanges small messages with rank 0 on a communicator of
 * its own, outside the data path: each rank sends rank 0 a heartbeat carrying what it is
 * doing (step, activity, the MPI operation it is in: tsr_watchdog_state), and rank 0
 * answers every rank with its own.  When a rank has heard nothing from a peer it watches
 * for heartbeat_s seconds, it prints one line naming that rank, its host and what its
 * last heartbeat said it was doing, and ends the job with MPI_Abort (exit code 4).
 * Rank 0 watches every rank; the others watch rank 0 (rank 1 reports a silent rank 0, the
 * rest wait half a timeout longer, so one line names it).  docs/architecture.md
 * "Heartbeat" gives the design and its costs.
 *
 * Rank 0 also tells every rank which rank the job seems to be waiting for (the one heard
 * from least recently, else one outside MPI); the step watchdog of a rank blocked in a
 * collective names it (watchdog.h).
 *
 * Needs MPI_THREAD_MULTIPLE (the thread calls MPI beside the main thread); without it,
 * or on one rank, there is no heartbeat. */
#ifndef TSR_HEARTBEAT_H
#define TSR_HEARTBEAT_H

#include <mpi.h>

/* Collective over world: every rank calls it with the same timeout_s.  Duplicates world,
 * gathers the host names on rank 0 and starts the thread.  Nothing when timeout_s <= 0 or
 * world has one rank; a warning (rank 0) and nothing when mpi_threads is 0.  Returns
 * TSR_ERR on every rank when some rank could not start its thread. */
int tsr_heartbeat_start(double timeout_s, int mpi_threads, MPI_Comm world);
/* Every rank, once it is past the run's last collective: each says goodbye (so that no
 * rank takes the end of the others for a death), the thread ends, the communicator is
 * freed.  Nothing when not started. */
void tsr_heartbeat_stop(void);

#endif
