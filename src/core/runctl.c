/* runctl.c — signals, output directories, agreement on failures (runctl.h). */
#include "runctl.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "util.h"

static volatile sig_atomic_t stop_signal = 0;

/* A second SIGINT (Ctrl-C while the checkpoint of the first is being written, or the
 * step before it) means "now": the default action, which ends the process at once. */
static void on_signal(int sig) {
  if (sig == SIGINT && stop_signal == SIGINT) {
    static const char msg[] = "second interrupt: stopping now, without a checkpoint\n";
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing more to do */
    }
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
    return;
  }
  stop_signal = sig;
}

/* SA_RESTART: a stop signal that lands inside MPI_Init, or any other library call that
 * waits, must not make the call fail with EINTR; the flag is looked at later. */
void tsr_run_install_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGXFSZ, SIG_IGN);
}

static char command[2048];

void tsr_run_set_command(int argc, char **argv) {
  size_t o = 0;
  command[0] = 0;
  for (int i = 0; i < argc && o + 1 < sizeof command; i++) {
    const char *a = argv[i];
    const int quote = !*a || strpbrk(a, " \t'\"$*?;&|<>()[]{}~\\") != NULL;
    o += (size_t)snprintf(command + o, sizeof command - o, "%s%s", i ? " " : "", quote ? "'" : "");
    for (; *a && o + 5 < sizeof command; a++) { /* a ' inside the quotes: '\'' */
      if (*a == '\'' && quote) {
        memcpy(command + o, "'\\''", 4);
        o += 4;
      } else {
        command[o++] = *a;
      }
    }
    if (quote && o + 1 < sizeof command) command[o++] = '\'';
    command[o < sizeof command ? o : sizeof command - 1] = 0;
  }
  if (o >= sizeof command) snprintf(command + sizeof command - 5, 5, "...");
}

const char *tsr_run_command(void) { return command; }

int tsr_run_stop_signal(void) { return (int)stop_signal; }

const char *tsr_run_signal_name(int sig) {
  switch (sig) {
  case SIGUSR1: return "SIGUSR1";
  case SIGTERM: return "SIGTERM";
  case SIGINT: return "SIGINT";
  default: return "a signal";
  }
}

void tsr_run_log_early_stop(int sig, const char *when) {
  tsr_log("signal %d (%s) received %s: stopped before the first step of this run, without "
          "writing a checkpoint (the state is the one it started from): exit 3", sig,
          tsr_run_signal_name(sig), when);
}

int tsr_run_agree_start(MPI_Comm world, int rc, const char *when) {
  int v[2] = {rc, tsr_run_stop_signal()};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MAX, world);
  if (v[0] || !v[1]) return v[0];
  tsr_run_log_early_stop(v[1], when);
  return TSR_ERR_SIGNAL;
}

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

int tsr_run_agree_report(MPI_Comm world, int rc, const char *why) {
  int rank, size;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  int v[3] = {rc, rc ? 1 : 0, rc ? -rank : -size}; /* worst code, failing ranks, -(first) */
  MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT, MPI_MAX, world);
  MPI_Allreduce(MPI_IN_PLACE, v + 1, 1, MPI_INT, MPI_SUM, world);
  MPI_Allreduce(MPI_IN_PLACE, v + 2, 1, MPI_INT, MPI_MAX, world);
  if (!v[0]) return 0;
  const int first = -v[2];
  struct {
    char why[1024], host[64];
  } msg = {"", "?"};
  if (rank == first) {
    snprintf(msg.why, sizeof msg.why, "%s", why && why[0] ? why : "failed (no message)");
    gethostname(msg.host, sizeof msg.host - 1);
  }
  MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, first, world);
  if (rank != 0) return v[0];
  if (v[1] == size)
    tsr_error("%s", msg.why);
  else
    tsr_error("%s [on %d of %d ranks; the first is rank %d on host %s]", msg.why, v[1], size, first,
              msg.host);
  return v[0];
}

void tsr_run_abort(MPI_Comm world, int rc, const char *what) {
  tsr_error("%s failed on this rank (code %d); aborting every rank", what, rc);
  MPI_Abort(world, rc);
  exit(rc); /* MPI_Abort does not return */
}
