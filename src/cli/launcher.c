/* launcher.c — `tessera`: holds the stop signals from the process's first instruction,
 * then becomes the trainer (tessera-main) with the same arguments.
 *
 * A rank that mpirun or srun has just started spends tens of milliseconds in the dynamic
 * loader mapping its seventy libraries (MPI, HDF5, OpenBLAS, CUDA) before any of its own
 * code runs; a SIGUSR1 or SIGTERM in that window takes its default action and kills the
 * rank instead of stopping the job cleanly (exit 3, requeue).  This program is linked
 * statically, so it runs from its first instruction with no loader; it blocks SIGUSR1,
 * SIGTERM and SIGINT and executes tessera-main: a blocked signal stays blocked across
 * execve and waits, pending, until tessera-main has installed its handlers (main.c, from
 * the executable's .preinit_array) and unblocks it.  It changes nothing else: the
 * environment, the arguments (argv[0] included) and the exit status are tessera-main's.
 *
 * tessera-main is looked for beside this program (the build tree's src/), then where
 * make install puts it relative to this program (bin/../libexec/tessera: an installed
 * prefix moved elsewhere still works), then in the configured TSR_LIBEXECDIR. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/stop_signals.h"

#ifndef TSR_LIBEXECDIR
#define TSR_LIBEXECDIR "/usr/local/libexec/tessera"
#endif
#ifndef TSR_BINDIR
#define TSR_BINDIR "/usr/local/bin"
#endif

static int try_exec(const char *dir, char **argv) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/tessera-main", dir) >= (int)sizeof path) return -1;
  if (access(path, X_OK) != 0) return -1;
  execv(path, argv);
  return -1;
}

/* The path from directory `from` to `to` (both absolute): "../libexec/tessera" for
 * /usr/local/bin and /usr/local/libexec/tessera. */
static void relative(const char *from, const char *to, char *out, size_t len) {
  size_t c = 0, i = 0; /* the longest common prefix that ends at a '/' */
  for (; from[i] && from[i] == to[i]; i++)
    if (from[i] == '/') c = i;
  if (!from[i] && (!to[i] || to[i] == '/')) c = i; /* `from` is a whole prefix of `to` */
  size_t used = 0;
  out[0] = '\0';
  for (const char *p = from + c; *p; p++) /* one "../" per component of `from` left */
    if (*p == '/' && p[1] && used + 4 < len) used += (size_t)snprintf(out + used, len - used, "../");
  const char *rest = to + c + (to[c] == '/');
  snprintf(out + used, len - used, "%s", *rest ? rest : ".");
}

int main(int argc, char **argv) {
  tsr_stop_signals_mask(SIG_BLOCK);
  (void)argc;
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = '\0';
      try_exec(self, argv);
      char rel[PATH_MAX], dir[2 * PATH_MAX + 2];
      relative(TSR_BINDIR, TSR_LIBEXECDIR, rel, sizeof rel);
      snprintf(dir, sizeof dir, "%s/%s", self, rel);
      try_exec(dir, argv);
    }
  }
  try_exec(TSR_LIBEXECDIR, argv);
  const int e = errno;
  tsr_stop_signals_mask(SIG_UNBLOCK);
  fprintf(stderr,
          "tessera: cannot run tessera-main (beside %s, or in %s): %s; reinstall Tessera "
          "(make install)\n",
          n > 0 ? self : "this program", TSR_LIBEXECDIR, strerror(e));
  return 1;
}
