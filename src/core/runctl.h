/* runctl.h — run control shared by the training and evaluation drivers: stop signals,
 * the output directory, and how ranks agree on a failure.
 *
 * Up to the first step every rank reaches the same agreement points (after setup, after
 * resume) and an error anywhere makes all of them return it together: a bad deck, data
 * file or checkpoint ends the job with its exit code and one message.  Inside the loop a
 * failure on one rank would leave the others waiting in a collective, so the failing rank
 * aborts the whole job (docs/conventions.md "Failing together"). */
#ifndef TSR_RUNCTL_H
#define TSR_RUNCTL_H

#include <mpi.h>

/* SIGUSR1, SIGTERM and SIGINT only record the signal (the loop checkpoints at the next
 * step boundary and exits with TSR_ERR_SIGNAL); a second SIGINT ends the process at once,
 * without a checkpoint.  SIGXFSZ is ignored, so a file-size limit makes a checkpoint write
 * fail with EFBIG instead of killing the process.  main installs them before MPI_Init,
 * so that no moment of a training run's start-up is left to the default action. */
void tsr_run_install_signals(void);
int tsr_run_stop_signal(void); /* the signal received, 0 when none */
const char *tsr_run_signal_name(int sig); /* "SIGUSR1", "SIGTERM", "SIGINT" */

/* An agreement point of the start-up (a collective): the worst return code over the ranks,
 * or, when every rank succeeded but one of them has received a stop signal, TSR_ERR_SIGNAL
 * after rank 0 logged the stop (tsr_run_log_early_stop).  `when` says where the start-up
 * is ("while setting up"). */
int tsr_run_agree_start(MPI_Comm world, int rc, const char *when);
/* The line of a stop before the first step: "signal 15 (SIGTERM) received WHEN: stopped
 * before the first step of this run, without writing a checkpoint ...: exit 3" (rank 0). */
void tsr_run_log_early_stop(int sig, const char *when);

/* The command line, kept for the log (arguments with spaces or shell characters quoted). */
void tsr_run_set_command(int argc, char **argv);
const char *tsr_run_command(void);

/* mkdir -p; TSR_ERR_INPUT with the reason on failure. */
int tsr_run_make_dirs(const char *path);

/* The worst return code over the ranks of world (a collective every rank must reach). */
int tsr_run_agree(MPI_Comm world, int rc);
/* As tsr_run_agree, for a check every rank makes on its own and whose message (`why`,
 * held back with tsr_error_hold) rank 0 alone prints, once: the message of the lowest
 * failing rank, and when not every rank failed, how many did and the first one's rank
 * and host (a file missing on one node).  A collective. */
int tsr_run_agree_report(MPI_Comm world, int rc, const char *why);
/* This rank failed where the others may be waiting in a collective: say so, abort all. */
void tsr_run_abort(MPI_Comm world, int rc, const char *what) __attribute__((noreturn));

#endif
