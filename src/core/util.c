/* util.c — logging, error traces, checked allocation, counter-based RNG, bf16 rounding. */
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_rank = 0;
static FILE *g_logfile = NULL;
static FILE *g_logstream = NULL; /* tsr_log's stream; NULL: stdout */
static size_t g_mem = 0, g_mem_peak = 0;

void tsr_set_rank(int rank) { g_rank = rank; }
int tsr_rank(void) { return g_rank; }

int tsr_log_open(const char *path) {
  if (g_rank != 0) return 0;
  if (g_logfile) fclose(g_logfile);
  g_logfile = fopen(path, "a");
  if (!g_logfile) {
    tsr_error("cannot open log file '%s' for appending", path);
    return TSR_ERR_INPUT;
  }
  return 0;
}

void tsr_log_to(FILE *stream) { g_logstream = stream; }

void tsr_log_close(void) {
  if (g_logfile) fclose(g_logfile);
  g_logfile = NULL;
}

void tsr_iso_time(char *buf, size_t len) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char sec[32];
  strftime(sec, sizeof sec, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, len, "%s.%03ldZ", sec, ts.tv_nsec / 1000000);
}

/* tsr_error_hold: the first error of the holding thread goes here instead of out; other
 * threads (the heartbeat's last words) are not held. */
static _Thread_local char *g_held;
static _Thread_local size_t g_held_len;

void tsr_error_hold(char *buf, size_t len) {
  g_held = buf;
  g_held_len = len;
  if (len) buf[0] = 0;
}

void tsr_error_release(void) { g_held = NULL; }

static void vlog(FILE *stream, const char *prefix, int all_ranks, const char *fmt, va_list ap) {
  char buf[8192];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (g_held && !strcmp(prefix, "error: ")) {
    if (g_held_len && !g_held[0]) snprintf(g_held, g_held_len, "%s", buf);
    return;
  }
  size_t n = strlen(buf);
  const char *nl = (n > 0 && buf[n - 1] == '\n') ? "" : "\n";
  if (all_ranks && g_rank != 0)
    fprintf(stream, "[rank %d] %s%s%s", g_rank, prefix, buf, nl);
  else
    fprintf(stream, "%s%s%s", prefix, buf, nl);
  fflush(stream);
  if (g_logfile && g_rank == 0) {
    char when[40];
    tsr_iso_time(when, sizeof when);
    fprintf(g_logfile, "%s %s%s%s", when, prefix, buf, nl);
    fflush(g_logfile);
  }
}

void tsr_log(const char *fmt, ...) {
  if (g_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(g_logstream ? g_logstream : stdout, "", 0, fmt, ap);
  va_end(ap);
}

void tsr_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(stderr, "warning: ", 1, fmt, ap);
  va_end(ap);
}

void tsr_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(stderr, "error: ", 1, fmt, ap);
  va_end(ap);
}

void tsr_trace(const char *file, int line, const char *func, const char *what) {
  if (getenv("TSR_TRACE"))
    fprintf(stderr, "[rank %d]   from %s:%d %s: %s\n", g_rank, file, line, func, what);
}

void tsr_errorf_at(const char *file, int line, const char *func, const char *fmt, ...) {
  char buf[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  tsr_error("%s", buf);
  tsr_trace(file, line, func, "check failed");
}

/* A small header before each block remembers its size for the byte counter. */
#define TSR_ALIGN 64
void *tsr_calloc(size_t count, size_t size) {
  if (count != 0 && size > (SIZE_MAX - TSR_ALIGN) / count) return NULL;
  size_t bytes = count * size;
  void *raw = NULL;
  if (posix_memalign(&raw, TSR_ALIGN, bytes + TSR_ALIGN) != 0) {
    tsr_error("out of memory allocating %zu bytes", bytes);
    return NULL;
  }
  memset(raw, 0, bytes + TSR_ALIGN);
  *(size_t *)raw = bytes;
  /* atomic: a background checkpoint write allocates on its own thread (ckpt_async.c) */
  const size_t now = __atomic_add_fetch(&g_mem, bytes, __ATOMIC_RELAXED);
  size_t peak = __atomic_load_n(&g_mem_peak, __ATOMIC_RELAXED);
  while (now > peak && !__atomic_compare_exchange_n(&g_mem_peak, &peak, now, 1, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED)) {
  }
  return (char *)raw + TSR_ALIGN;
}

void tsr_free_(void **p) {
  if (!p || !*p) return;
  char *raw = (char *)*p - TSR_ALIGN;
  __atomic_sub_fetch(&g_mem, *(size_t *)raw, __ATOMIC_RELAXED);
  free(raw);
  *p = NULL;
}

size_t tsr_mem_bytes(void) { return __atomic_load_n(&g_mem, __ATOMIC_RELAXED); }
size_t tsr_mem_peak_bytes(void) { return __atomic_load_n(&g_mem_peak, __ATOMIC_RELAXED); }

uint64_t tsr_hash_str(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

double tsr_rand_uniform(uint64_t key, uint64_t index) {
  uint64_t r = tsr_mix64(key ^ tsr_mix64(index));
  return ((double)(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double tsr_rand_normal(uint64_t key, uint64_t index) { /* Box-Muller on two streams */
  double u1 = tsr_rand_uniform(key, 2 * index);
  double u2 = tsr_rand_uniform(key, 2 * index + 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double tsr_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- host memory */

static double read_number(const char *path) {
  FILE *f = fopen(path, "r");
  double x = -1;
  if (f && fscanf(f, "%lf", &x) != 1) x = -1;
  if (f) fclose(f);
  return x;
}
double tsr_host_available(void) {
  double avail = -1;
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lf kB", &avail) == 1) {
      avail *= 1024;
      break;
    }
  if (f) fclose(f);
  if (avail < 0) avail = (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  const char *const limits[2][2] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                                     {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                      "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (int i = 0; i < 2; i++) {
    const double lim = read_number(limits[i][0]), used = read_number(limits[i][1]);
    if (lim > 0 && lim < 1e18 && used >= 0 && lim - used < avail) avail = lim - used;
  }
  return avail;
}
