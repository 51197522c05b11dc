/* tokenizer.c — the bytes and SentencePiece tokenizers of tokenizer.h. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/config.h"
#include "data.h"
#include "core/tsr_build.h"
#include "core/util.h"
#ifdef TSR_HAVE_SENTENCEPIECE
#include "spm_shim.h"
#endif

#define NAME_MAX_BYTES 256

struct tsr_tokenizer {
  char name[NAME_MAX_BYTES];
  int bytes;       /* the bytes tokenizer (else spm) */
  int64_t vocab;
  int32_t eod;     /* end of document: bytes 0, spm </s> (-1: none) */
  int32_t newline; /* spm: the <0x0A> piece (-1: none) */
#ifdef TSR_HAVE_SENTENCEPIECE
  tsr_spm *spm;
#endif
};

/* DIR/NAME.model for the shard at `first` and tokenizer "spm:NAME". */
static void model_path(char *out, size_t len, const char *first, const char *name) {
  const char *slash = strrchr(first, '/');
  if (slash)
    snprintf(out, len, "%.*s/%s.model", (int)(slash - first), first, name);
  else
    snprintf(out, len, "%s.model", name);
}

static int open_spm(tsr_tokenizer *t, const char *first, const char *pattern) {
  const char *name = t->name + 4;
  char path[2 * TSR_STR_PATH];
  model_path(path, sizeof path, first, name);
  struct stat sb;
  TSR_CHECK(stat(path, &sb) == 0, TSR_ERR_INPUT,
            "the shards of '%s' were made with tokenizer '%s', whose model %s is missing: "
            "tools/tsr-prepare writes it beside the shards; copy it there", pattern, t->name,
            path);
#ifdef TSR_HAVE_SENTENCEPIECE
  char err[512] = "";
  TSR_CHECK(tsr_spm_load(&t->spm, path, err, sizeof err) == 0, TSR_ERR_INPUT,
            "cannot load the SentencePiece model %s: %s", path, err);
  t->vocab = tsr_spm_pieces(t->spm);
  t->eod = tsr_spm_eos(t->spm);
  t->newline = tsr_spm_piece_id(t->spm, "<0x0A>");
  return 0;
#else
  TSR_CHECK(0, TSR_ERR_INPUT,
            "tokenizer '%s' (%s) needs the SentencePiece library, which this tessera was built "
            "without: install it (Debian: apt-get install libsentencepiece-dev), run "
            "./configure and make again", t->name, path);
#endif
}

int tsr_tokenizer_open(tsr_tokenizer **out, const char *pattern, int64_t model_vocab) {
  *out = NULL;
  char first[TSR_STR_PATH];
  tsr_tokenizer *t = tsr_calloc(1, sizeof *t);
  if (!t) return TSR_ERR;
  int rc = tsr_data_peek(pattern, model_vocab, t->name, sizeof t->name, first, sizeof first);
  t->eod = t->newline = -1;
  if (rc == 0 && strcmp(t->name, "bytes") == 0) {
    t->bytes = 1, t->vocab = 256, t->eod = 0;
  } else if (rc == 0 && strncmp(t->name, "spm:", 4) == 0 && t->name[4]) {
    rc = open_spm(t, first, pattern);
  } else if (rc == 0) {
    tsr_error("token shard '%s' names tokenizer '%s'; this tessera knows 'bytes' and "
              "'spm:NAME' (tools/tsr-prepare)", first, t->name);
    rc = TSR_ERR_INPUT;
  }
  if (rc == 0 && t->vocab > model_vocab) {
    tsr_error("tokenizer '%s' has %lld ids but the model's vocab_size is %lld", t->name,
              (long long)t->vocab, (long long)model_vocab);
    rc = TSR_ERR_INPUT;
  }
  if (rc) {
    tsr_tokenizer_close(&t);
    return rc;
  }
  *out = t;
  return 0;
}

void tsr_tokenizer_close(tsr_tokenizer **t) {
  if (!t || !*t) return;
#ifdef TSR_HAVE_SENTENCEPIECE
  tsr_spm_free(&(*t)->spm);
#endif
  tsr_free(t);
}

const char *tsr_tokenizer_name(const tsr_tokenizer *t) { return t->name; }
int64_t tsr_tokenizer_vocab(const tsr_tokenizer *t) { return t->vocab; }
int32_t tsr_tokenizer_start(const tsr_tokenizer *t) { return t->eod >= 0 ? t->eod : 0; }

int tsr_tokenizer_eos(const char *pattern, int64_t model_vocab, int32_t *eos) {
  *eos = -1;
  tsr_tokenizer *t = NULL;
  int rc = tsr_tokenizer_open(&t, pattern, model_vocab);
  if (rc == 0 && t->eod < 0) {
    tsr_error("data.document_mask: the tokenizer '%s' of '%s' has no end-of-document token "
              "(</s>); set data.eos_id to the id that ends the documents of the shards",
              t->name, pattern);
    rc = TSR_ERR_INPUT;
  } else if (rc) {
    tsr_error("data.document_mask needs the end-of-document id of the shards' tokenizer; "
              "set data.eos_id to it when the tokenizer cannot be opened here");
  }
  if (rc == 0) *eos = t->eod;
  tsr_tokenizer_close(&t);
  return rc;
}

int tsr_tokenizer_encode(const tsr_tokenizer *t, const char *text, size_t len, int32_t **ids,
                         int64_t *n) {
  *n = 0;
  /* bytes: one id per byte; spm: usually fewer, but a dummy-prefix piece, byte fallback
   * or a normalisation can make more: the buffer grows as pieces arrive */
  int64_t cap = (int64_t)len + 1;
  *ids = tsr_calloc((size_t)cap, sizeof(int32_t));
  if (!*ids) return TSR_ERR;
  if (t->bytes) {
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = (int64_t)len;
    return 0;
  }
#ifdef TSR_HAVE_SENTENCEPIECE
  for (size_t at = 0; at <= len;) {
    const char *nl = memchr(text + at, '\n', len - at);
    const size_t end = nl ? (size_t)(nl - text) : len;
    int64_t k = 0;
    int32_t *line = end > at ? tsr_spm_encode(t->spm, text + at, end - at, &k) : NULL;
    if (end > at && !line) {
      tsr_free(ids);
      TSR_CHECK(0, TSR_ERR, "SentencePiece could not encode the text '%.*s'", (int)(end - at),
                text + at);
    }
    if (*n + k + 1 > cap) {
      const int64_t want = 2 * (*n + k + 1);
      int32_t *more = tsr_calloc((size_t)want, sizeof(int32_t));
      if (!more) {
        free(line);
        tsr_free(ids);
        return TSR_ERR;
      }
      memcpy(more, *ids, (size_t)*n * sizeof(int32_t));
      tsr_free(ids);
      *ids = more;
      cap = want;
    }
    for (int64_t i = 0; i < k; i++) (*ids)[(*n)++] = line[i];
    free(line);
    if (nl && t->newline >= 0) (*ids)[(*n)++] = t->newline;
    if (!nl) break;
    at = end + 1;
  }
  return 0;
#else
  tsr_free(ids);
  return TSR_ERR; /* not reached: open_spm refused the tokenizer */
#endif
}

/* Append text[0..len) to the growing buffer *buf (capacity *cap, *used bytes). */
static int append(char **buf, size_t *cap, size_t *used, const char *text, size_t len) {
  if (*used + len + 1 > *cap) {
    size_t c = *cap ? *cap : 64;
    while (c < *used + len + 1) c *= 2;
    char *b = tsr_calloc(c, 1);
    if (!b) return TSR_ERR;
    if (*buf) memcpy(b, *buf, *used);
    tsr_free(buf);
    *buf = b, *cap = c;
  }
  memcpy(*buf + *used, text, len);
  *used += len;
  (*buf)[*used] = 0;
  return 0;
}

int tsr_tokenizer_decode(const tsr_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                         size_t *len) {
  size_t cap = 0;
  *text = NULL;
  *len = 0;
  TSR_CALL(append(text, &cap, len, "", 0));
  for (int64_t i = 0; i < n;) {
    if (ids[i] == t->eod) { /* a document ends */
      TSR_CALL(append(text, &cap, len, "\n", 1));
      i++;
      continue;
    }
    int64_t j = i; /* a run of ids up to the next end of document */
    while (j < n && ids[j] != t->eod) j++;
    if (t->bytes) {
      for (int64_t k = i; k < j; k++) {
        const char c = (char)ids[k];
        if (ids[k] > 0 && ids[k] < 256) TSR_CALL(append(text, &cap, len, &c, 1));
      }
    } else {
#ifdef TSR_HAVE_SENTENCEPIECE
      int32_t *run = tsr_calloc((size_t)(j - i), sizeof(int32_t));
      int64_t m = 0;
      if (!run) return TSR_ERR;
      for (int64_t k = i; k < j; k++)
        if (ids[k] >= 0 && ids[k] < t->vocab) run[m++] = ids[k];
      size_t got = 0;
      char *piece = tsr_spm_decode(t->spm, run, m, &got);
      tsr_free(&run);
      TSR_CHECK(piece, TSR_ERR, "SentencePiece could not decode %lld ids", (long long)m);
      const int rc = append(text, &cap, len, piece, got);
      free(piece);
      TSR_CALL(rc);
#endif
    }
    i = j;
  }
  return 0;
}
