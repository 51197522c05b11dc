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
 * timeout longer, so the job's last words name the culprit.  A blocked rank that cannot
 * report itself as the culprit names the rank it is waiting for when the heartbeat
 * (heartbeat.h) knows one: the rank heard from least recently, or one outside MPI.
 *
 * The activity and operation recorded here are also what the heartbeat tells the other
 * ranks this rank is doing (tsr_watchdog_state). */
#ifndef TSR_WATCHDOG_H
#define TSR_WATCHDOG_H

#include <stddef.h>
#include <stdint.h>

/* Start the thread (nothing when timeout_s <= 0).  mpi_threads: MPI was initialised
 * with MPI_THREAD_MULTIPLE, so the watchdog thread may call MPI_Abort. */
int tsr_watchdog_start(double timeout_s, int mpi_threads);
void tsr_watchdog_stop(void);
/* A new activity starts now (the clock restarts); `what` must be a string literal. */
void tsr_watchdog_activity(int64_t step, const char *what);
/* Name the last operation started inside the activity (the clock keeps running): comm.c
 * records each collective it starts.  Strings must outlive the call, or be withdrawn with
 * tsr_watchdog_forget_group before they are freed. */
void tsr_watchdog_operation(const char *group, const char *op);
/* The group name `group` is about to be freed: stop pointing at it (comm.c). */
void tsr_watchdog_forget_group(const char *group);
/* 1 while this rank is blocked inside an MPI call (comm.c), 0 after. */
void tsr_watchdog_blocked(int blocked);

/* What this rank is doing now, as recorded above.  Strings are "" when unset. */
typedef struct {
  int64_t step;
  double in_s;   /* seconds since the activity started */
  int active;    /* inside an activity (what is set) */
  int blocked;   /* inside a blocking MPI call */
  char what[24], group[32], op[24];
} tsr_watchdog_state;
void tsr_watchdog_state_now(tsr_watchdog_state *st);
/* One phrase for a state: "at step 3, 2.1 s into a training step, inside all_reduce on
 * group 'dp'". */
void tsr_watchdog_state_text(const tsr_watchdog_state *st, char *buf, size_t len);

/* Who the job is waiting for, from outside this rank (the heartbeat installs it): writes
 * a phrase naming the rank into buf and returns 1, or returns 0 when it knows none.
 * Called from the watchdog thread. */
typedef int (*tsr_watchdog_peers_fn)(char *buf, size_t len);
void tsr_watchdog_set_peers(tsr_watchdog_peers_fn fn);

#endif
