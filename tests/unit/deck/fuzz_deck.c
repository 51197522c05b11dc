/* fuzz_deck.c — libFuzzer entry point for the deck parser (`make fuzz`).
 *
 * Input layout: byte 0 picks the number of command-line overrides (0..2) and the world size;
 * the next NUL-terminated pieces are the overrides, the rest is the deck text (copied into
 * an exact-size buffer with no terminating NUL, so reading past `len` is caught by ASan).
 * A deck that parses must also survive write -> parse unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deck/deck.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  int n_overrides = data[0] % 3;
  int world_size = 1 + (data[0] >> 2) % 16;
  size_t pos = 1;
  char *overrides[2] = {NULL, NULL};
  for (int i = 0; i < n_overrides; i++) {
    const uint8_t *end = pos < size ? memchr(data + pos, 0, size - pos) : NULL;
    size_t n = end ? (size_t)(end - (data + pos)) : size - pos;
    overrides[i] = malloc(n + 1);
    if (n) memcpy(overrides[i], data + pos, n);
    overrides[i][n] = 0;
    pos += n + (end != NULL);
    if (pos > size) pos = size;
  }
  size_t len = size - pos;
  char *text = malloc(len ? len : 1);
  if (len) memcpy(text, data + pos, len);

  static tsr_config cfg, again;
  static char errbuf[4096];
  int rc = tsr_deck_parse(&cfg, text, len, "fuzz.nml", n_overrides, overrides, world_size, errbuf,
                          sizeof errbuf);
  if (rc == 0) {
    size_t need = tsr_deck_write(&cfg, NULL, 0);
    char *out = malloc(need);
    tsr_deck_write(&cfg, out, need);
    memset(&again, 0, sizeof again);
    const int rc2 = tsr_deck_parse(&again, out, strlen(out), "written.nml", 0, NULL,
                                   world_size, errbuf, sizeof errbuf);
    /* where the data globs were given is not a value: the written deck has other places */
    memset(cfg.data.train_at, 0, sizeof cfg.data.train_at);
    memset(cfg.data.valid_at, 0, sizeof cfg.data.valid_at);
    memset(again.data.train_at, 0, sizeof again.data.train_at);
    memset(again.data.valid_at, 0, sizeof again.data.valid_at);
    if (rc2 != 0 || memcmp(&cfg, &again, sizeof cfg) != 0)
      __builtin_trap(); /* the effective deck must read back as the same config */
    free(out);
  }
  free(text);
  free(overrides[0]);
  free(overrides[1]);
  return 0;
}
