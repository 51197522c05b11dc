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
 * fail with EFBIG instead of killing the process. */
void tsr_run_install_signals(void);
int tsr_run_stop_signal(void); /* the signal received, 0 when none */

/* The command line, kept for the log (arguments with spaces or shell characters quoted). */
void tsr_run_set_command(int argc, char **argv);
const char *tsr_run_command(void);

/* mkdir -p; TSR_ERR_INPUT with the reason on failure. */
int tsr_run_make_dirs(const char *path);

/* The worst return code over the ranks of world (a collective every rank must reach). */
int tsr_run_agree(MPI_Comm world, int rc);
/* This rank failed where the others may be waiting in a collective: say so, abort all. */
void tsr_run_abort(MPI_Comm world, int rc, const char *what) __attribute__((noreturn));

#endif
