/* testutil.h — tiny check helpers shared by the C tests: one line per check, a final
 * summary, exit status 0 only when every check passed. */
#ifndef TSR_TESTUTIL_H
#define TSR_TESTUTIL_H

#include <stdio.h>
#include <string.h>

static int tu_pass = 0, tu_fail = 0;

#define TU_CHECK(cond, ...)                    \
  do {                                         \
    if (cond) {                                \
      tu_pass++;                               \
      printf("PASS: ");                        \
    } else {                                   \
      tu_fail++;                               \
      printf("FAIL: %s:%d: ", __FILE__, __LINE__); \
    }                                          \
    printf(__VA_ARGS__);                       \
    printf("\n");                              \
    fflush(stdout);                            \
  } while (0)

/* The index of word w in a list "a|b|c" (-1: not there): a choice key's value from the word
 * the deck would take, e.g. tu_word("none|selective|full", "full") is TSR_RECOMPUTE_FULL. */
static inline int tu_word(const char *list, const char *w) {
  const size_t n = strlen(w);
  for (int i = 0; *list; i++) {
    const size_t m = strcspn(list, "|");
    if (m == n && !strncmp(list, w, n)) return i;
    list += m + (list[m] == '|');
  }
  return -1;
}

/* The sum of squares of x[0..n) in double, through the op that the gradient norm uses. */
#define TU_SUMSQ(x, n) tsr_ops_sumsq_ranges((x), (const int64_t[]){0, (int64_t)(n)}, 1)

static int tu_summary(const char *name) {
  printf("%s: %d checks passed, %d failed\n", name, tu_pass, tu_fail);
  return tu_fail ? 1 : 0;
}

#endif
