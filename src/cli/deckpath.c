/* deckpath.c — the deck argument as a file: a path, or an installed deck found by name
 * (deckpath.h says where it looks, in which order). */
#include "deckpath.h"

#include <dirent.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan/plan.h" /* tsr_plan_valued_options */
#include "core/util.h"

/* Makefile.am passes the configured directories; a build without them looks up deck
 * names in $TESSERA_DATADIR only. */
#ifndef TSR_BINDIR
#define TSR_BINDIR ""
#endif
#ifndef TSR_PKGDATADIR
#define TSR_PKGDATADIR ""
#endif

enum { MAX_PLACES = 4 };
typedef struct {
  char dir[PATH_MAX]; /* .../input */
  const char *why;    /* where the directory comes from, for the error message */
} place;

/* snprintf at the end of BUF, never past CAP; returns the new length. */
static size_t append(char *buf, size_t cap, size_t len, const char *fmt, ...) TSR_PRINTF(4, 5);
static size_t append(char *buf, size_t cap, size_t len, const char *fmt, ...) {
  if (len >= cap) return len;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + len, cap - len, fmt, ap);
  va_end(ap);
  return n < 0 ? len : len + (size_t)n < cap ? len + (size_t)n : cap - 1;
}

/* snprintf's result R fits in CAP bytes */
static int fits(int r, size_t cap) { return r >= 0 && (size_t)r < cap; }

static int exists_not_dir(const char *path) {
  struct stat st;
  return !stat(path, &st) && !S_ISDIR(st.st_mode);
}

static int is_dir(const char *path) {
  struct stat st;
  return !stat(path, &st) && S_ISDIR(st.st_mode);
}

/* The path that leads from directory FROM to directory TO, both absolute and without "."
 * or ".." components: "/usr/local/bin", "/usr/local/share/tessera" -> "../share/tessera". */
static void relative(const char *from, const char *to, char *out, size_t cap) {
  const char *f = from, *t = to;
  for (;;) { /* drop the leading components the two share */
    while (*f == '/') f++;
    while (*t == '/') t++;
    const size_t nf = strcspn(f, "/"), nt = strcspn(t, "/");
    if (!nf || nf != nt || strncmp(f, t, nf)) break;
    f += nf, t += nt;
  }
  size_t len = 0;
  out[0] = '\0';
  while (*f) { /* one ".." for each component of FROM that is left */
    const size_t n = strcspn(f, "/");
    if (n) len = append(out, cap, len, "../");
    f += n;
    while (*f == '/') f++;
  }
  append(out, cap, len, "%s", *t ? t : ".");
}

/* The places to look in, in order, without repeats (the same directory reached twice, as
 * when the binary runs where it was installed); returns how many. */
static int places(place *p) {
  int n = 0;
  const char *env = getenv("TESSERA_DATADIR");
  if (env && env[0]) {
    p[n].why = "$TESSERA_DATADIR";
    n += fits(snprintf(p[n].dir, sizeof p[n].dir, "%s/input", env), sizeof p[n].dir);
  }
  char exe[PATH_MAX]; /* the folder of this binary */
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
  }
  if (TSR_BINDIR[0] == '/' && TSR_PKGDATADIR[0] == '/' && len > 0) {
    char rel[PATH_MAX];
    relative(TSR_BINDIR, TSR_PKGDATADIR, rel, sizeof rel);
    p[n].why = "installed beside this binary";
    char raw[PATH_MAX + 16], real[PATH_MAX];
    snprintf(raw, sizeof raw, "%s/%s/input", exe, rel); /* libexec/tessera/../../share/... */
    n += fits(snprintf(p[n].dir, sizeof p[n].dir, "%s", realpath(raw, real) ? real : raw),
              sizeof p[n].dir);
  }
#ifdef TSR_BUILDDIR
  /* a binary of a build tree (not installed): the decks of the source tree it was built
   * from, so that `tessera plan llm70b` works where the job scripts say it */
  if (len > 0) {
    char here[PATH_MAX], built[PATH_MAX];
    if (realpath(exe, here) && realpath(TSR_BUILDDIR "/src", built) && !strcmp(here, built)) {
      p[n].why = "the source tree of this build";
      n += fits(snprintf(p[n].dir, sizeof p[n].dir, "%s/input", TSR_SRCDIR), sizeof p[n].dir);
    }
  }
#endif
  if (TSR_PKGDATADIR[0]) {
    p[n].why = "the configured install";
    n += fits(snprintf(p[n].dir, sizeof p[n].dir, "%s/input", TSR_PKGDATADIR), sizeof p[n].dir);
  }
  int kept = 0;
  for (int i = 0; i < n; i++) {
    char a[PATH_MAX], b[PATH_MAX];
    int dup = 0;
    for (int j = 0; j < kept && !dup; j++)
      dup = !strcmp(p[i].dir, p[j].dir) ||
            (realpath(p[i].dir, a) && realpath(p[j].dir, b) && !strcmp(a, b));
    if (!dup) p[kept++] = p[i];
  }
  return kept;
}

static int by_name(const void *a, const void *b) { return strcmp(a, b); }

/* NAME.nml for a deck name; NAME as is when it already ends in ".nml".  0 if too long. */
static int file_name(const char *name, char *out, size_t cap) {
  const size_t n = strlen(name);
  return fits(snprintf(out, cap, n > 4 && !strcmp(name + n - 4, ".nml") ? "%s" : "%s.nml", name),
              cap);
}

/* Looks ARG up; 0 when found (OUT set), 1 when not.  NOT_FOUND, when given, receives the
 * error message listing the places and the decks in them. */
static int lookup(const char *arg, char *out, size_t cap, char *not_found, size_t nf_cap) {
  char file[NAME_MAX + 1], path[PATH_MAX];
  if (exists_not_dir(arg) || strchr(arg, '/') || !file_name(arg, file, sizeof file)) {
    if (fits(snprintf(out, cap, "%s", arg), cap)) return 0; /* a path: the reader reports */
    if (not_found) snprintf(not_found, nf_cap, "deck path too long: %.80s...\n", arg);
    return 1;
  }
  place p[MAX_PLACES];
  const int n = places(p);
  for (int i = 0; i < n; i++) {
    if (fits(snprintf(path, sizeof path, "%s/%s", p[i].dir, file), sizeof path) &&
        exists_not_dir(path) && fits(snprintf(out, cap, "%s", path), cap))
      return 0;
  }
  if (!not_found) return 1;
  char cwd[PATH_MAX];
  size_t len = append(not_found, nf_cap, 0, "no deck '%s': not a file in %s, and no %s in\n", arg,
                      getcwd(cwd, sizeof cwd) ? cwd : "the current directory", file);
  if (!n) len = append(not_found, nf_cap, len, "  (nowhere: set TESSERA_DATADIR)\n");
  for (int i = 0; i < n; i++) {
    len = append(not_found, nf_cap, len, "  %s (%s%s)\n", p[i].dir, p[i].why,
                 is_dir(p[i].dir) ? "" : "; no such directory");
  }
  char names[64][NAME_MAX + 1]; /* the decks that are there, by name, sorted, once each */
  int k = 0;
  for (int i = 0; i < n; i++) {
    DIR *d = opendir(p[i].dir);
    for (struct dirent *e; d && k < 64 && (e = readdir(d)) != NULL;) {
      const size_t m = strlen(e->d_name);
      if (m > 4 && !strcmp(e->d_name + m - 4, ".nml"))
        snprintf(names[k++], sizeof names[0], "%.*s", (int)(m - 4), e->d_name);
    }
    if (d) closedir(d);
  }
  qsort(names, (size_t)k, sizeof names[0], by_name);
  len = append(not_found, nf_cap, len, k ? "decks there:" : "no decks there\n");
  for (int i = 0; i < k; i++)
    if (!i || strcmp(names[i], names[i - 1]))
      len = append(not_found, nf_cap, len, " %s", names[i]);
  if (k) append(not_found, nf_cap, len, "\n");
  return 1;
}

int tsr_deck_path(const char *arg, char *out, size_t cap) {
  char msg[4096];
  if (!lookup(arg, out, cap, msg, sizeof msg)) return 0;
  tsr_error("%s", msg);
  return TSR_ERR_INPUT;
}

int tsr_deck_path_args(int argc, char **argv, char *out, size_t cap) {
  int first = -1;
  for (int i = 0; i < argc; i++) {
    if (argv[i][0] == '-') { /* plan's options: "--nodes 4" skips the 4 */
      for (const char *const *o = tsr_plan_valued_options; *o; o++)
        if (!strcmp(argv[i], *o)) i++;
      continue;
    }
    if (strchr(argv[i], '=')) continue;
    if (first < 0) first = i;
    if (!lookup(argv[i], out, cap, NULL, 0)) {
      argv[i] = out;
      return 0;
    }
  }
  return first < 0 ? 0 : tsr_deck_path(argv[first], out, cap);
}

void tsr_deck_path_usage(FILE *out) {
  fprintf(out,
          "DECK is a deck file, or the name of an installed deck (llama1b or llama1b.nml), looked\n"
          "  up in $TESSERA_DATADIR/input, in the share/tessera/input installed with this binary,\n"
          "  then in %s/input.  The paths inside a deck (data, out_dir, checkpoints)\n"
          "  are relative to the current directory.\n",
          TSR_PKGDATADIR[0] ? TSR_PKGDATADIR : "(none configured)");
}
