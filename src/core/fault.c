/* fault.c — TSR_FAULT, the tests' fault injection (fault.h). */
#include "fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runctl.h"
#include "util.h"

static const char *const known[] = {"nan_grad_step", "hang_step",      "hang_rank",
                                    "ckpt_sleep",    "ckpt_step",      "ckpt_where",
                                    "ckpt_fail_step", "ckpt_fail_rank", "ckpt_host_mb",
                                    "ckpt_cost",     "ckpt_step_time", "ckpt_overlap_s",
                                    "start_sleep",   "start_where",    "host_read_step",
                                    "offload_host_mb", "offload_piece"};
enum { N_KNOWN = sizeof known / sizeof known[0], VALUE_LEN = 64 };

static int parsed, status;
static char value[N_KNOWN][VALUE_LEN];
static int present[N_KNOWN];

static int find(const char *key, size_t n) {
  for (int i = 0; i < N_KNOWN; i++)
    if (strlen(known[i]) == n && !strncmp(known[i], key, n)) return i;
  return -1;
}

int tsr_fault_init(void) {
  if (parsed) return status;
  parsed = 1;
  const char *s = getenv("TSR_FAULT");
  while (s && *s) {
    const size_t len = strcspn(s, ","), eq = strcspn(s, "=");
    const int k = eq < len ? find(s, eq) : -1;
    if (k < 0 || len - eq - 1 >= VALUE_LEN) {
      tsr_error("TSR_FAULT: '%.*s' is not key=value with a key of nan_grad_step, hang_step, "
                "hang_rank, ckpt_sleep, ckpt_step, ckpt_where, ckpt_fail_step, ckpt_fail_rank, "
                "ckpt_host_mb, ckpt_cost, ckpt_step_time, ckpt_overlap_s, start_sleep, start_where, "
                "host_read_step, offload_host_mb, offload_piece", (int)len, s);
      return status = TSR_ERR_INPUT;
    }
    snprintf(value[k], VALUE_LEN, "%.*s", (int)(len - eq - 1), s + eq + 1);
    present[k] = 1;
    s += len + (s[len] == ',');
  }
  return status = 0;
}

const char *tsr_fault_str(const char *key, const char *dflt) {
  if (tsr_fault_init()) return dflt;
  const int k = find(key, strlen(key));
  return k >= 0 && present[k] ? value[k] : dflt;
}

long long tsr_fault_int(const char *key, long long dflt) {
  const char *v = tsr_fault_str(key, NULL);
  return v ? atoll(v) : dflt;
}

void tsr_fault_start_pause(const char *where) {
  const double secs = atof(tsr_fault_str("start_sleep", "0"));
  if (secs <= 0 || strcmp(tsr_fault_str("start_where", "setup"), where) != 0) return;
  fprintf(stderr, "fault injection: process %ld sleeping %g s at start-up (%s)\n", (long)getpid(),
          secs, where);
  fflush(stderr);
  const double end = tsr_now() + secs; /* any thread may take the signal: poll its flag */
  while (tsr_now() < end && !tsr_run_stop_signal()) usleep(10 * 1000);
}

void tsr_fault_hang(int64_t step, int rank) {
  if (tsr_fault_int("hang_step", -1) != step || rank != tsr_fault_int("hang_rank", 0)) return;
  for (;;) sleep(1);
}

void tsr_fault_host_read(int64_t step, int rank, const void *op) {
  if (rank != 0 || tsr_fault_int("host_read_step", -1) != step) return;
  volatile float probe = *(volatile const float *)op;
  (void)probe;
}
