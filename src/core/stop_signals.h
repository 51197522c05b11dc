/* stop_signals.h — the signals that stop a training run cleanly (exit 3 after a
 * checkpoint): SIGUSR1 (Slurm's warning), SIGTERM, SIGINT.  Header-only, so that the
 * static launcher (launcher.c), which blocks them, and the trainer (main.c, runctl.c),
 * which handles them, name the same set without linking anything. */
#ifndef TSR_STOP_SIGNALS_H
#define TSR_STOP_SIGNALS_H

#include <signal.h>

/* how = SIG_BLOCK or SIG_UNBLOCK on the calling thread */
static inline void tsr_stop_signals_mask(int how) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGUSR1);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigprocmask(how, &stop, NULL);
}

#endif
