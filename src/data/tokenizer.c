/* tokenizer.c — the bytes, SentencePiece and Hugging Face tokenizers of tokenizer.h. */
#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bpe.h"
#include "core/config.h"
#include "data.h"
#include "core/tsr_build.h"
#include "core/util.h"
#ifdef TSR_HAVE_SENTENCEPIECE
#include "spm_shim.h"
#endif

#define NAME_MAX_BYTES 256
#define HF_CONFIG "tokenizer_config.json" /* beside an hf tokenizer: its eos_token */

struct tsr_tokenizer {
  char name[NAME_MAX_BYTES];
  int bytes;       /* the bytes tokenizer (else spm or hf) */
  int64_t vocab;
  int32_t eod;     /* end of document: bytes 0, spm </s>, hf eos_token (-1: none) */
  int32_t newline; /* spm: the <0x0A> piece (-1: none) */
  tsr_bpe *bpe;    /* hf */
#ifdef TSR_HAVE_SENTENCEPIECE
  tsr_spm *spm;
#endif
};

/* ---------------------------------------------------------------- the files */

/* The file dir/name into f: 0, 1 when it does not exist, TSR_ERR_INPUT (said) when it
 * cannot be read. */
static int read_file(const char *dir, const char *name, tsr_tokenizer_file *f) {
  char path[2 * TSR_STR_PATH];
  snprintf(path, sizeof path, "%s%s%s", dir, dir[0] ? "/" : "", name);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->bytes = NULL, f->len = 0;
  FILE *in = fopen(path, "rb");
  if (!in && errno == ENOENT) return 1;
  struct stat sb;
  int rc = in && fstat(fileno(in), &sb) == 0 && S_ISREG(sb.st_mode) ? 0 : TSR_ERR_INPUT;
  if (!rc && !(f->bytes = tsr_calloc((size_t)sb.st_size + 1, 1))) rc = TSR_ERR;
  if (!rc && fread(f->bytes, 1, (size_t)sb.st_size, in) != (size_t)sb.st_size) rc = TSR_ERR_INPUT;
  if (!rc) f->len = (size_t)sb.st_size;
  if (rc == TSR_ERR_INPUT) tsr_error("cannot read the tokenizer file %s: %s", path,
                                     in ? "not a regular file, or a read failed" : strerror(errno));
  if (rc) tsr_free(&f->bytes);
  if (in) fclose(in);
  return rc;
}

void tsr_tokenizer_files_free(tsr_tokenizer_file **files, int n) {
  if (!files || !*files) return;
  for (int i = 0; i < n; i++) tsr_free(&(*files)[i].bytes);
  tsr_free(files);
}

int tsr_tokenizer_read_files(const char *name, const char *dir, const char *whose,
                             tsr_tokenizer_file **files, int *n) {
  *files = NULL;
  *n = 0;
  if (!strcmp(name, "bytes")) return 0;
  char file[NAME_MAX_BYTES + 8];
  const int spm = !strncmp(name, "spm:", 4) && name[4];
  const int hf = !strncmp(name, "hf:", 3) && name[3] && !strchr(name + 3, '/');
  TSR_CHECK(spm || hf, TSR_ERR_INPUT,
            "%s names tokenizer '%s'; this tessera knows 'bytes', 'spm:NAME' and 'hf:FILE' "
            "(tools/tsr-prepare)", whose, name);
  snprintf(file, sizeof file, spm ? "%s.model" : "%s", name + (spm ? 4 : 3));
  tsr_tokenizer_file *f = tsr_calloc(2, sizeof *f);
  if (!f) return TSR_ERR;
  int rc = read_file(dir, file, &f[0]);
  if (rc == 1) {
    tsr_error("%s was made with tokenizer '%s', whose file %s%s%s is missing: tools/tsr-prepare "
              "writes it beside the shards; copy it there (or give tessera generate "
              "--tokenizer PATH)", whose, name, dir, dir[0] ? "/" : "", file);
    rc = TSR_ERR_INPUT;
  }
  int count = 1;
  if (!rc && hf) { /* the end of document; tools/tsr-prepare writes it, others may not */
    const int c = read_file(dir, HF_CONFIG, &f[1]);
    if (c == 0) count = 2;
    else if (c != 1) rc = c;
  }
  if (rc) {
    tsr_tokenizer_files_free(&f, 2);
    return rc;
  }
  *files = f;
  *n = count;
  return 0;
}

/* The directory of path ("" for none). */
static void dir_of(const char *path, char *dir, size_t len) {
  const char *slash = strrchr(path, '/');
  if (slash)
    snprintf(dir, len, "%.*s", (int)(slash - path), path);
  else
    snprintf(dir, len, "%s", "");
  if (slash == path) snprintf(dir, len, "/");
}

int tsr_tokenizer_shard_files(const char *pattern, int64_t model_vocab, char *name, size_t len,
                              tsr_tokenizer_file **files, int *n) {
  char first[TSR_STR_PATH], dir[TSR_STR_PATH], whose[TSR_STR_PATH + 32];
  *files = NULL;
  *n = 0;
  TSR_CALL(tsr_data_peek(pattern, model_vocab, name, len, first, sizeof first));
  dir_of(first, dir, sizeof dir);
  snprintf(whose, sizeof whose, "the token shard %s", first);
  return tsr_tokenizer_read_files(name, dir, whose, files, n);
}

/* ---------------------------------------------------------------- opening */

static const tsr_tokenizer_file *find_file(const tsr_tokenizer_file *files, int n,
                                           const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(files[i].name, name)) return &files[i];
  return NULL;
}

static int open_spm(tsr_tokenizer *t, const tsr_tokenizer_file *model, const char *whose) {
#ifdef TSR_HAVE_SENTENCEPIECE
  char err[512] = "";
  TSR_CHECK(tsr_spm_load_bytes(&t->spm, model->bytes, model->len, err, sizeof err) == 0,
            TSR_ERR_INPUT, "cannot load the SentencePiece model %s of %s: %s", model->name,
            whose, err);
  t->vocab = tsr_spm_pieces(t->spm);
  t->eod = tsr_spm_eos(t->spm);
  t->newline = tsr_spm_piece_id(t->spm, "<0x0A>");
  return 0;
#else
  TSR_CHECK(0, TSR_ERR_INPUT,
            "tokenizer '%s' (%s of %s) needs the SentencePiece library, which this tessera was "
            "built without: install it (Debian: apt-get install libsentencepiece-dev), run "
            "./configure and make again", t->name, model->name, whose);
#endif
}

static int open_hf(tsr_tokenizer *t, const tsr_tokenizer_file *json,
                   const tsr_tokenizer_file *config, const char *whose) {
  char err[512] = "";
  TSR_CHECK(tsr_bpe_load(&t->bpe, (const char *)json->bytes, json->len, err, sizeof err) == 0,
            TSR_ERR_INPUT, "tokenizer '%s' (%s of %s): %s", t->name, json->name, whose, err);
  t->vocab = tsr_bpe_vocab(t->bpe);
  t->eod = tsr_bpe_eos(t->bpe, config ? (const char *)config->bytes : NULL,
                       config ? config->len : 0);
  return 0;
}

int tsr_tokenizer_open_files(tsr_tokenizer **out, const char *name,
                             const tsr_tokenizer_file *files, int n, int64_t model_vocab,
                             const char *whose) {
  *out = NULL;
  tsr_tokenizer *t = tsr_calloc(1, sizeof *t);
  if (!t) return TSR_ERR;
  snprintf(t->name, sizeof t->name, "%s", name);
  t->eod = t->newline = -1;
  int rc = 0;
  char file[NAME_MAX_BYTES + 8] = "";
  const tsr_tokenizer_file *f = NULL;
  const int spm = !strncmp(name, "spm:", 4) && name[4], hf = !strncmp(name, "hf:", 3) && name[3];
  if (spm || hf) {
    snprintf(file, sizeof file, spm ? "%s.model" : "%s", name + (spm ? 4 : 3));
    f = find_file(files, n, file);
  }
  if (!strcmp(name, "bytes")) {
    t->bytes = 1, t->vocab = 256, t->eod = 0;
  } else if ((spm || hf) && !f) {
    tsr_error("%s: tokenizer '%s' without its file %s", whose, name, file);
    rc = TSR_ERR_INPUT;
  } else if (spm) {
    rc = open_spm(t, f, whose);
  } else if (hf) {
    rc = open_hf(t, f, find_file(files, n, HF_CONFIG), whose);
  } else {
    tsr_error("%s names tokenizer '%s'; this tessera knows 'bytes', 'spm:NAME' and 'hf:FILE' "
              "(tools/tsr-prepare)", whose, name);
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

int tsr_tokenizer_open(tsr_tokenizer **out, const char *pattern, int64_t model_vocab) {
  *out = NULL;
  char name[NAME_MAX_BYTES], whose[TSR_STR_PATH + 40];
  tsr_tokenizer_file *files = NULL;
  int n = 0;
  TSR_CALL(tsr_tokenizer_shard_files(pattern, model_vocab, name, sizeof name, &files, &n));
  snprintf(whose, sizeof whose, "the shards of '%s'", pattern);
  const int rc = tsr_tokenizer_open_files(out, name, files, n, model_vocab, whose);
  tsr_tokenizer_files_free(&files, n);
  return rc;
}

int tsr_tokenizer_open_path(tsr_tokenizer **out, const char *path, int64_t model_vocab) {
  *out = NULL;
  struct stat sb;
  if (!strcmp(path, "bytes") && stat(path, &sb) != 0)
    return tsr_tokenizer_open_files(out, "bytes", NULL, 0, model_vocab, "--tokenizer bytes");
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  const size_t n = strlen(base);
  char name[NAME_MAX_BYTES], dir[TSR_STR_PATH], whose[TSR_STR_PATH + 16];
  if (n > 6 && !strcmp(base + n - 6, ".model"))
    snprintf(name, sizeof name, "spm:%.*s", (int)(n - 6), base);
  else if (n > 5 && !strcmp(base + n - 5, ".json"))
    snprintf(name, sizeof name, "hf:%s", base);
  else
    TSR_CHECK(0, TSR_ERR_INPUT,
              "--tokenizer '%s': give a SentencePiece model (NAME.model), a Hugging Face "
              "tokenizer (tokenizer.json) or 'bytes'", path);
  dir_of(path, dir, sizeof dir);
  snprintf(whose, sizeof whose, "--tokenizer %s", path);
  tsr_tokenizer_file *files = NULL;
  int count = 0;
  TSR_CALL(tsr_tokenizer_read_files(name, dir, whose, &files, &count));
  const int rc = tsr_tokenizer_open_files(out, name, files, count, model_vocab, whose);
  tsr_tokenizer_files_free(&files, count);
  return rc;
}

void tsr_tokenizer_close(tsr_tokenizer **t) {
  if (!t || !*t) return;
  tsr_bpe_free(&(*t)->bpe);
#ifdef TSR_HAVE_SENTENCEPIECE
  tsr_spm_free(&(*t)->spm);
#endif
  tsr_free(t);
}

const char *tsr_tokenizer_name(const tsr_tokenizer *t) { return t->name; }
int64_t tsr_tokenizer_vocab(const tsr_tokenizer *t) { return t->vocab; }
int32_t tsr_tokenizer_start(const tsr_tokenizer *t) { return t->eod >= 0 ? t->eod : 0; }
int32_t tsr_tokenizer_eod(const tsr_tokenizer *t) { return t->eod; }

int tsr_tokenizer_eos(const char *pattern, int64_t model_vocab, int32_t *eos) {
  *eos = -1;
  tsr_tokenizer *t = NULL;
  int rc = tsr_tokenizer_open(&t, pattern, model_vocab);
  if (rc == 0 && t->eod < 0) {
    tsr_error("data.document_mask: the tokenizer '%s' of '%s' has no end-of-document token "
              "(</s>, eos_token); set data.eos_id to the id that ends the documents of the shards",
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
  if (t->bpe) {
    int32_t *got = NULL;
    int64_t k = 0;
    tsr_free(ids);
    TSR_CHECK(tsr_bpe_encode(t->bpe, text, len, &got, &k) == 0, TSR_ERR,
              "out of memory encoding %zu bytes of text", len);
    *ids = tsr_calloc((size_t)k + 1, sizeof(int32_t));
    if (*ids) memcpy(*ids, got, (size_t)k * sizeof(int32_t));
    free(got);
    if (!*ids) return TSR_ERR;
    *n = k;
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
    } else if (t->bpe) {
      size_t got = 0;
      char *piece = tsr_bpe_decode(t->bpe, ids + i, j - i, &got);
      TSR_CHECK(piece, TSR_ERR, "out of memory decoding %lld ids", (long long)(j - i));
      const int rc = append(text, &cap, len, piece, got);
      free(piece);
      TSR_CALL(rc);
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
