/* runctl.c — signals, output directories, agreement on failures (runctl.h). */
#include "runctl.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "util.h"

static volatile sig_atomic_t stop_signal = 0;

static void on_signal(int sig) { stop_signal = sig; }

void tsr_run_install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGXFSZ, SIG_IGN);
}

int tsr_run_stop_signal(void) { return (int)stop_signal; }

int tsr_run_make_dirs(const char *path) {
  char buf[TSR_STR_PATH];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) break;
    *p = '/';
  }
  if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
    tsr_error("cannot create directory '%s': %s", path, strerror(errno));
    return TSR_ERR_INPUT;
  }
  return 0;
}

int tsr_run_agree(MPI_Comm world, int rc) {
  int any = rc;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, world);
  return any;
}

void tsr_run_abort(MPI_Comm world, int rc, const char *what) {
  tsr_error("%s failed on this rank (code %d); aborting every rank", what, rc);
  MPI_Abort(world, rc);
  exit(rc); /* MPI_Abort does not return */
}
