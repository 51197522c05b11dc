/* test_bpe.c — the byte-level BPE of src/data/bpe.c on the command line, for
 * tests/tools/hf_tokenizer.sh, which compares it with the tokenizers library.
 *
 *   test_bpe TOKENIZER.json [tokenizer_config.json] < REQUESTS
 *
 * Each line of REQUESTS is one request, answered by one line on stdout:
 *   e "TEXT"     (TEXT a JSON string) -> the ids of TEXT, space-separated
 *   d ID ID ...  -> the hex of the bytes the ids decode to
 *   v            -> "VOCAB EOS"
 * A tokenizer that does not load prints "error: ..." and exits 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "data/bpe.h"

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  const long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) b[n] = 0, *len = (size_t)n;
  return b;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_bpe TOKENIZER.json [tokenizer_config.json] < requests\n");
    return 2;
  }
  size_t len = 0, clen = 0;
  char *json = slurp(argv[1], &len), *cfg = argc > 2 ? slurp(argv[2], &clen) : NULL;
  if (!json) {
    fprintf(stderr, "error: cannot read %s\n", argv[1]);
    return 2;
  }
  tsr_bpe *p = NULL;
  char err[512];
  if (tsr_bpe_load(&p, json, len, err, sizeof err)) {
    printf("error: %s\n", err);
    return 2;
  }
  free(json);
  size_t cap = 1 << 16;
  char *line = malloc(cap);
  ssize_t got;
  while ((got = getline(&line, &cap, stdin)) > 0) {
    if (line[got - 1] == '\n') line[--got] = 0;
    if (line[0] == 'e') {
      tsr_json *s = NULL;
      int32_t *ids = NULL;
      int64_t n = 0;
      if (tsr_json_parse(line + 1, (size_t)got - 1, &s, err, sizeof err) ||
          s->type != TSR_JSON_STRING || tsr_bpe_encode(p, s->str, s->n, &ids, &n)) {
        printf("error: bad request\n");
      } else {
        for (int64_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
      }
      free(ids);
      tsr_json_free(&s);
    } else if (line[0] == 'd') {
      int32_t *ids = malloc(((size_t)got + 1) * sizeof *ids);
      int64_t n = 0;
      for (char *t = strtok(line + 1, " "); t; t = strtok(NULL, " ")) ids[n++] = atoi(t);
      size_t tl = 0;
      char *text = tsr_bpe_decode(p, ids, n, &tl);
      for (size_t i = 0; text && i < tl; i++) printf("%02x", (unsigned char)text[i]);
      printf("\n");
      free(text);
      free(ids);
    } else if (line[0] == 'v') {
      printf("%lld %d\n", (long long)tsr_bpe_vocab(p), (int)tsr_bpe_eos(p, cfg, clen));
    }
    fflush(stdout);
  }
  free(line);
  free(cfg);
  tsr_bpe_free(&p);
  return 0;
}
