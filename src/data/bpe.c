/* bpe.c — byte-level BPE from a Hugging Face tokenizer.json (bpe.h).
 *
 * Encoding follows the tokenizers library's pipeline: the text is cut at added tokens
 * (leftmost-longest match), each other part goes through the pre-tokenizer steps (a Split
 * on a known pattern, then ByteLevel: an optional prefix space and, with use_regex, the
 * GPT-2 split), each piece's bytes become the byte-level alphabet's characters, and the
 * merges apply lowest rank first (the leftmost of equal ones).  The two regular
 * expressions are matched by hand (match_gpt2, match_llama3); their \p{L}, \p{N} above
 * ASCII come from unicode_classes.h and \s is Unicode's White_Space. */
#include "bpe.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "unicode_classes.h"

/* The pre-tokenizer patterns this file matches by hand, as tokenizer.json spells them. */
static const char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Llama 3's; with \p{N} in place of \p{N}{1,3}, Qwen2's */
static const char kLlama3Head[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|";
static const char kLlama3Tail[] = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum { STEP_GPT2, STEP_LLAMA3, STEP_BYTELEVEL };

typedef struct {
  int kind;
  int digits;       /* llama3: the longest run of numbers one piece takes */
  int prefix_space; /* bytelevel: add_prefix_space */
  int use_regex;    /* bytelevel: split on the GPT-2 pattern */
} step;

typedef struct {
  uint32_t off, len; /* the token's text in the arena */
  int32_t id;
} entry;

typedef struct {
  uint32_t off, len;
  int32_t id;
  int special;
} added;

struct tsr_bpe {
  char *arena; /* every token's text */
  size_t arena_used, arena_cap;
  entry *tab; /* text -> id, open addressing; len UINT32_MAX: empty */
  size_t tab_cap;
  uint32_t *id_off, *id_len; /* id -> text; id_len UINT32_MAX: no such token */
  uint8_t *id_special;
  int64_t vocab;
  uint64_t *mkey; /* merges: (left, right) -> rank, the merged id; key 0: empty */
  int32_t *mrank, *mid;
  size_t mcap;
  added *added; /* longest first */
  int n_added;
  uint8_t added_first[256]; /* bytes an added token can start with */
  step steps[4];
  int n_steps;
  int ignore_merges;
  int32_t unk;
  uint32_t byte_cp[256];  /* the byte-level alphabet: byte -> code point */
  int16_t cp_byte[512];   /* and back (-1: no byte) */
  int32_t byte_id[256];   /* the id of each byte's one-character token (-1: none) */
};

/* ---------------------------------------------------------------- UTF-8 and classes */

/* The code point at s[i] and its length *n; a byte that starts no valid sequence is
 * itself, length 1, class 'O'. */
static uint32_t cp_at(const char *s, size_t len, size_t i, size_t *n) {
  const unsigned char *u = (const unsigned char *)s + i;
  const size_t left = len - i;
  *n = 1;
  if (u[0] < 0x80) return u[0];
  int k = u[0] >= 0xF0 && u[0] < 0xF5 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC2 && u[0] < 0xE0 ? 2 : 0;
  if (!k || (size_t)k > left) return 0xFFFFFFFFu;
  uint32_t c = u[0] & (0xFF >> (k + 1));
  for (int j = 1; j < k; j++) {
    if ((u[j] & 0xC0) != 0x80) return 0xFFFFFFFFu;
    c = (c << 6) | (u[j] & 0x3F);
  }
  if ((k == 3 && (c < 0x800 || (c >= 0xD800 && c < 0xE000))) || (k == 4 && (c < 0x10000 || c > 0x10FFFF)))
    return 0xFFFFFFFFu;
  *n = (size_t)k;
  return c;
}

static int is_space(uint32_t c) {
  return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/* 'L' letter, 'N' number, 'S' white space, 'O' anything else. */
static char cls(uint32_t c) {
  if (c < 0x80) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 'L';
    if (c >= '0' && c <= '9') return 'N';
    return is_space(c) ? 'S' : 'O';
  }
  if (is_space(c)) return 'S';
  if (c == 0xFFFFFFFFu) return 'O';
  size_t lo = 0, hi = sizeof tsr_unicode_classes / sizeof tsr_unicode_classes[0];
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (c < tsr_unicode_classes[mid].first) hi = mid;
    else if (c > tsr_unicode_classes[mid].last) lo = mid + 1;
    else return tsr_unicode_classes[mid].cls;
  }
  return 'O';
}

static char cls_at(const char *s, size_t len, size_t i, size_t *n) {
  return cls(cp_at(s, len, i, n));
}

/* The end of the run of class k from i (at most `most` code points; 0: no limit). */
static size_t run_of(const char *s, size_t len, size_t i, char k, int most) {
  int count = 0;
  while (i < len && (!most || count < most)) {
    size_t n;
    if (cls_at(s, len, i, &n) != k) break;
    i += n;
    count++;
  }
  return i;
}

/* A contraction at s[i] ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d"; fold: any case):
 * its end, or 0. */
static size_t contraction(const char *s, size_t len, size_t i, int fold) {
  static const char *const forms[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  if (s[i] != '\'') return 0;
  for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
    const size_t n = strlen(forms[f]);
    if (len - i - 1 < n) continue;
    size_t j = 0;
    for (; j < n; j++) {
      char c = s[i + 1 + j];
      if (fold && c >= 'A' && c <= 'Z') c = (char)(c + 32);
      if (c != forms[f][j]) break;
    }
    if (j == n) return i + 1 + n;
  }
  return 0;
}

/* \s+(?!\S) then \s+ at i (white space there): the run, less its last code point when
 * something other than white space follows and the run has two or more. */
static size_t space_run(const char *s, size_t len, size_t i) {
  size_t j = i, last = i, n;
  while (j < len && cls_at(s, len, j, &n) == 'S') last = j, j += n;
  return j < len && last > i ? last : j;
}

/* One piece of the GPT-2 pattern at s[i]: its end. */
static size_t match_gpt2(const char *s, size_t len, size_t i) {
  size_t e = contraction(s, len, i, 0), n, n2;
  if (e) return e;
  const char k = cls_at(s, len, i, &n);
  if (s[i] == ' ' && i + 1 < len) { /* " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+" */
    const char k2 = cls_at(s, len, i + 1, &n2);
    if (k2 != 'S') return run_of(s, len, i + 1, k2, 0);
  }
  if (k != 'S') return run_of(s, len, i, k, 0);
  return space_run(s, len, i);
}

/* One piece of the Llama 3 pattern (digits 3; Qwen2's: 1) at s[i]: its end. */
static size_t match_llama3(const char *s, size_t len, size_t i, int digits) {
  size_t e = contraction(s, len, i, 1), n, n2;
  if (e) return e;
  const char k = cls_at(s, len, i, &n);
  if (k == 'L') return run_of(s, len, i, 'L', 0); /* [^\r\n\p{L}\p{N}]?\p{L}+ */
  if (k != 'N' && s[i] != '\r' && s[i] != '\n' && i + n < len &&
      cls_at(s, len, i + n, &n2) == 'L')
    return run_of(s, len, i + n, 'L', 0);
  if (k == 'N') return run_of(s, len, i, 'N', digits); /* \p{N}{1,3} */
  size_t j = i; /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
  if (s[i] == ' ' && i + 1 < len && cls_at(s, len, i + 1, &n2) == 'O') j = i + 1;
  if (cls_at(s, len, j, &n2) == 'O') {
    j = run_of(s, len, j, 'O', 0);
    while (j < len && (s[j] == '\r' || s[j] == '\n')) j++;
    return j;
  }
  /* white space: "\s*[\r\n]+" ends after the run's last line break, if it has one */
  size_t end = i, nl = 0;
  while (end < len && cls_at(s, len, end, &n2) == 'S') {
    if (s[end] == '\r' || s[end] == '\n') nl = end + 1;
    end += n2;
  }
  return nl ? nl : space_run(s, len, i);
}

/* ---------------------------------------------------------------- tables */

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  return h;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

/* The text s[0..n) into the arena: its offset, or UINT32_MAX when out of memory. */
static uint32_t keep(tsr_bpe *p, const char *s, size_t n) {
  if (p->arena_used + n + 1 > p->arena_cap) {
    size_t cap = p->arena_cap ? p->arena_cap : 1 << 16;
    while (cap < p->arena_used + n + 1) cap *= 2;
    if (cap > UINT32_MAX) return UINT32_MAX;
    char *a = realloc(p->arena, cap);
    if (!a) return UINT32_MAX;
    p->arena = a, p->arena_cap = cap;
  }
  memcpy(p->arena + p->arena_used, s, n);
  p->arena[p->arena_used + n] = 0;
  const uint32_t off = (uint32_t)p->arena_used;
  p->arena_used += n + 1;
  return off;
}

static entry *slot(const tsr_bpe *p, const char *s, size_t n) {
  size_t i = hash_bytes(s, n) & (p->tab_cap - 1);
  for (;; i = (i + 1) & (p->tab_cap - 1)) {
    entry *e = &p->tab[i];
    if (e->len == UINT32_MAX || (e->len == n && !memcmp(p->arena + e->off, s, n))) return e;
  }
}

int32_t tsr_bpe_token_id(const tsr_bpe *p, const char *token, size_t len) {
  const entry *e = slot(p, token, len);
  return e->len == UINT32_MAX ? -1 : e->id;
}

/* Map text -> id (a later one for the same text replaces the earlier) and id -> text. */
static int add_token(tsr_bpe *p, const char *s, size_t n, int32_t id, int special, char *err,
                     size_t errlen) {
  if (id < 0 || id >= p->vocab) {
    snprintf(err, errlen, "token id %d out of range", (int)id);
    return -1;
  }
  entry *e = slot(p, s, n);
  if (e->len == UINT32_MAX) {
    const uint32_t off = keep(p, s, n);
    if (off == UINT32_MAX) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    e->off = off, e->len = (uint32_t)n;
  }
  e->id = id;
  p->id_off[id] = e->off, p->id_len[id] = e->len;
  p->id_special[id] = (uint8_t)special;
  return 0;
}

static int32_t merge_find(const tsr_bpe *p, int32_t a, int32_t b, int32_t *merged) {
  const uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
  for (size_t i = mix(key) & (p->mcap - 1);; i = (i + 1) & (p->mcap - 1)) {
    if (!p->mkey[i]) return INT32_MAX;
    if (p->mkey[i] == key) {
      *merged = p->mid[i];
      return p->mrank[i];
    }
  }
}

static void merge_put(tsr_bpe *p, int32_t a, int32_t b, int32_t rank, int32_t merged) {
  const uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
  size_t i = mix(key) & (p->mcap - 1);
  while (p->mkey[i] && p->mkey[i] != key) i = (i + 1) & (p->mcap - 1);
  if (p->mkey[i]) return; /* a repeated merge keeps its first rank */
  p->mkey[i] = key, p->mrank[i] = rank, p->mid[i] = merged;
}

static size_t pow2_above(size_t n) {
  size_t c = 16;
  while (c < 2 * n) c *= 2;
  return c;
}

/* ---------------------------------------------------------------- loading */

static void byte_alphabet(tsr_bpe *p) {
  uint32_t next = 256;
  for (int i = 0; i < 512; i++) p->cp_byte[i] = -1;
  for (int b = 0; b < 256; b++) {
    const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    p->byte_cp[b] = printable ? (uint32_t)b : next++;
    p->cp_byte[p->byte_cp[b]] = (int16_t)b;
  }
}

static size_t put_utf8(char *o, uint32_t c) {
  if (c < 0x80) return o[0] = (char)c, 1;
  if (c < 0x800) return o[0] = (char)(0xC0 | (c >> 6)), o[1] = (char)(0x80 | (c & 0x3F)), 2;
  if (c < 0x10000) {
    o[0] = (char)(0xE0 | (c >> 12));
    o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[2] = (char)(0x80 | (c & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | (c >> 18));
  o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
  o[3] = (char)(0x80 | (c & 0x3F));
  return 4;
}

static int is_true(const tsr_json *j, int dflt) {
  return !j || j->type == TSR_JSON_NULL ? dflt : j->type == TSR_JSON_TRUE;
}

/* One pre-tokenizer (a member of a Sequence, or the whole) into p->steps. */
static int pre_step(tsr_bpe *p, const tsr_json *pt, char *err, size_t errlen) {
  const char *type = tsr_json_str(tsr_json_get(pt, "type"));
  if (p->n_steps == (int)(sizeof p->steps / sizeof p->steps[0])) {
    snprintf(err, errlen, "too many pre-tokenizers");
    return -1;
  }
  step *st = &p->steps[p->n_steps];
  if (type && !strcmp(type, "ByteLevel")) {
    st->kind = STEP_BYTELEVEL;
    st->prefix_space = is_true(tsr_json_get(pt, "add_prefix_space"), 1);
    st->use_regex = is_true(tsr_json_get(pt, "use_regex"), 1);
    p->n_steps++;
    return 0;
  }
  if (type && !strcmp(type, "Split")) {
    const char *re = tsr_json_str(tsr_json_get(tsr_json_get(pt, "pattern"), "Regex"));
    const char *behavior = tsr_json_str(tsr_json_get(pt, "behavior"));
    char want[512];
    if (!re || !behavior || strcmp(behavior, "Isolated") ||
        is_true(tsr_json_get(pt, "invert"), 0)) {
      snprintf(err, errlen, "pre-tokenizer Split: only a Regex pattern with behavior "
                            "'Isolated' (not inverted) is supported");
      return -1;
    }
    if (!strcmp(re, kGpt2Pattern)) {
      st->kind = STEP_GPT2;
      p->n_steps++;
      return 0;
    }
    for (int d = 1; d <= 3; d += 2) {
      snprintf(want, sizeof want, "%s%s%s", kLlama3Head, d == 3 ? "\\p{N}{1,3}" : "\\p{N}",
               kLlama3Tail);
      if (!strcmp(re, want)) {
        st->kind = STEP_LLAMA3, st->digits = d;
        p->n_steps++;
        return 0;
      }
    }
    snprintf(err, errlen, "pre-tokenizer Split: the pattern '%.200s' is not one this reader "
                          "knows (GPT-2's, Llama 3's, Qwen2's)", re);
    return -1;
  }
  snprintf(err, errlen, "pre-tokenizer '%s' is not supported (ByteLevel, or a Sequence of "
                        "a Split and a ByteLevel)", type ? type : "(no type)");
  return -1;
}

static int load_shape(tsr_bpe *p, const tsr_json *root, char *err, size_t errlen) {
  const tsr_json *model = tsr_json_get(root, "model");
  const char *type = tsr_json_str(tsr_json_get(model, "type"));
  if (!model || (type && strcmp(type, "BPE"))) {
    snprintf(err, errlen, "model.type is '%s', not 'BPE'", type ? type : "(none)");
    return -1;
  }
  const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const char *a = tsr_json_str(tsr_json_get(model, affix[i]));
    if (a && a[0]) {
      snprintf(err, errlen, "model.%s '%s' is not supported (byte-level BPE has none)",
               affix[i], a);
      return -1;
    }
  }
  p->ignore_merges = is_true(tsr_json_get(model, "ignore_merges"), 0);
  const tsr_json *norm = tsr_json_get(root, "normalizer");
  if (norm && norm->type != TSR_JSON_NULL) {
    const char *nt = tsr_json_str(tsr_json_get(norm, "type"));
    snprintf(err, errlen, "normalizer '%s' is not supported (byte-level BPE has none)",
             nt ? nt : "?");
    return -1;
  }
  const tsr_json *pre = tsr_json_get(root, "pre_tokenizer");
  const char *pt = tsr_json_str(tsr_json_get(pre, "type"));
  if (pt && !strcmp(pt, "Sequence")) {
    const tsr_json *seq = tsr_json_get(pre, "pretokenizers");
    for (size_t i = 0; seq && seq->type == TSR_JSON_ARRAY && i < seq->n; i++)
      if (pre_step(p, &seq->items[i], err, errlen)) return -1;
  } else if (pre && pre->type != TSR_JSON_NULL) {
    if (pre_step(p, pre, err, errlen)) return -1;
  }
  int bytelevel = 0;
  for (int i = 0; i < p->n_steps; i++) bytelevel |= p->steps[i].kind == STEP_BYTELEVEL;
  const tsr_json *dec = tsr_json_get(root, "decoder");
  const char *dt = tsr_json_str(tsr_json_get(dec, "type"));
  if (!bytelevel || !dt || strcmp(dt, "ByteLevel")) {
    snprintf(err, errlen, "not a byte-level tokenizer: it needs a ByteLevel pre-tokenizer "
                          "and a ByteLevel decoder (decoder: '%s')", dt ? dt : "none");
    return -1;
  }
  return 0;
}

/* The largest id of the vocabulary and the added tokens. */
static int64_t largest_id(const tsr_json *vocab, const tsr_json *adds) {
  double top = -1;
  for (size_t i = 0; i < vocab->n; i++)
    if (vocab->items[i].type == TSR_JSON_NUMBER && vocab->items[i].num > top)
      top = vocab->items[i].num;
  for (size_t i = 0; adds && i < adds->n; i++) {
    const tsr_json *id = tsr_json_get(&adds->items[i], "id");
    if (id && id->type == TSR_JSON_NUMBER && id->num > top) top = id->num;
  }
  return top >= 0 && top < INT32_MAX ? (int64_t)top : -1;
}

/* A whole number in [0, vocab): a token id. */
static int is_id(const tsr_json *j, int64_t vocab) {
  return j && j->type == TSR_JSON_NUMBER && j->num >= 0 && j->num < (double)vocab &&
         j->num == (double)(int64_t)j->num;
}

static int by_length_desc(const void *a, const void *b) {
  const added *x = a, *y = b;
  return (x->len < y->len) - (x->len > y->len);
}

static int load_tokens(tsr_bpe *p, const tsr_json *root, char *err, size_t errlen) {
  const tsr_json *model = tsr_json_get(root, "model");
  const tsr_json *vocab = tsr_json_get(model, "vocab");
  const tsr_json *adds = tsr_json_get(root, "added_tokens");
  if (!vocab || vocab->type != TSR_JSON_OBJECT) {
    snprintf(err, errlen, "model.vocab is missing or not an object");
    return -1;
  }
  if (adds && adds->type != TSR_JSON_ARRAY) adds = NULL;
  const int64_t top = largest_id(vocab, adds);
  if (top < 0) {
    snprintf(err, errlen, "model.vocab has no token ids");
    return -1;
  }
  p->vocab = top + 1;
  p->tab_cap = pow2_above(vocab->n + (adds ? adds->n : 0));
  p->tab = malloc(p->tab_cap * sizeof *p->tab);
  p->id_off = calloc((size_t)p->vocab, sizeof *p->id_off);
  p->id_len = malloc((size_t)p->vocab * sizeof *p->id_len);
  p->id_special = calloc((size_t)p->vocab, 1);
  if (!p->tab || !p->id_off || !p->id_len || !p->id_special) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < p->tab_cap; i++) p->tab[i].len = UINT32_MAX;
  for (int64_t i = 0; i < p->vocab; i++) p->id_len[i] = UINT32_MAX;
  for (size_t i = 0; i < vocab->n; i++) {
    const tsr_json *t = &vocab->items[i];
    if (!is_id(t, p->vocab)) {
      snprintf(err, errlen, "model.vocab['%.100s'] is not a token id", t->key);
      return -1;
    }
    if (add_token(p, t->key, t->key_len, (int32_t)t->num, 0, err, errlen)) return -1;
  }
  p->n_added = 0;
  p->added = calloc(adds && adds->n ? adds->n : 1, sizeof *p->added);
  if (!p->added) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (size_t i = 0; adds && i < adds->n; i++) {
    const tsr_json *a = &adds->items[i], *id = tsr_json_get(a, "id");
    const tsr_json *content = tsr_json_get(a, "content");
    if (!is_id(id, p->vocab) || !content || content->type != TSR_JSON_STRING) {
      snprintf(err, errlen, "added_tokens[%zu] has no id or content", i);
      return -1;
    }
    const int special = is_true(tsr_json_get(a, "special"), 0);
    if (add_token(p, content->str, content->n, (int32_t)id->num, special, err, errlen))
      return -1;
    if (!content->n) continue;
    const entry *e = slot(p, content->str, content->n);
    p->added[p->n_added++] = (added){e->off, e->len, (int32_t)id->num, special};
    p->added_first[(unsigned char)content->str[0]] = 1;
  }
  qsort(p->added, (size_t)p->n_added, sizeof *p->added, by_length_desc);
  const char *unk = tsr_json_str(tsr_json_get(model, "unk_token"));
  p->unk = unk ? tsr_bpe_token_id(p, unk, strlen(unk)) : -1;
  for (int b = 0; b < 256; b++) {
    char c[4];
    p->byte_id[b] = tsr_bpe_token_id(p, c, put_utf8(c, p->byte_cp[b]));
  }
  return 0;
}

static int load_merges(tsr_bpe *p, const tsr_json *root, char *err, size_t errlen) {
  const tsr_json *merges = tsr_json_get(tsr_json_get(root, "model"), "merges");
  if (!merges || merges->type != TSR_JSON_ARRAY) {
    snprintf(err, errlen, "model.merges is missing or not a list");
    return -1;
  }
  p->mcap = pow2_above(merges->n);
  p->mkey = calloc(p->mcap, sizeof *p->mkey);
  p->mrank = malloc(p->mcap * sizeof *p->mrank);
  p->mid = malloc(p->mcap * sizeof *p->mid);
  char *both = NULL;
  size_t both_cap = 0;
  int rc = p->mkey && p->mrank && p->mid ? 0 : -1;
  if (rc) snprintf(err, errlen, "out of memory");
  for (size_t i = 0; !rc && i < merges->n; i++) {
    const tsr_json *m = &merges->items[i];
    const char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (m->type == TSR_JSON_STRING) { /* "a b" */
      const char *sp = memchr(m->str, ' ', m->n);
      if (sp) a = m->str, na = (size_t)(sp - m->str), b = sp + 1, nb = m->n - na - 1;
    } else if (m->type == TSR_JSON_ARRAY && m->n == 2 && m->items[0].type == TSR_JSON_STRING &&
               m->items[1].type == TSR_JSON_STRING) { /* ["a", "b"] */
      a = m->items[0].str, na = m->items[0].n, b = m->items[1].str, nb = m->items[1].n;
    }
    if (!a) {
      snprintf(err, errlen, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", i);
      rc = -1;
      break;
    }
    if (na + nb + 1 > both_cap) {
      both_cap = 2 * (na + nb + 1);
      char *nbuf = realloc(both, both_cap);
      if (!nbuf) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
        break;
      }
      both = nbuf;
    }
    memcpy(both, a, na);
    memcpy(both + na, b, nb);
    const int32_t ia = tsr_bpe_token_id(p, a, na), ib = tsr_bpe_token_id(p, b, nb);
    const int32_t im = tsr_bpe_token_id(p, both, na + nb);
    if (ia < 0 || ib < 0 || im < 0) {
      snprintf(err, errlen, "model.merges[%zu] ('%.*s' '%.*s'): %s is not in the vocabulary",
               i, (int)(na < 60 ? na : 60), a, (int)(nb < 60 ? nb : 60), b,
               ia < 0 ? "the first" : ib < 0 ? "the second" : "the merged token");
      rc = -1;
      break;
    }
    merge_put(p, ia, ib, (int32_t)i, im);
  }
  free(both);
  return rc;
}

int tsr_bpe_load(tsr_bpe **out, const char *json, size_t len, char *err, size_t errlen) {
  *out = NULL;
  tsr_json *root = NULL;
  char why[256];
  if (tsr_json_parse(json, len, &root, why, sizeof why)) {
    snprintf(err, errlen, "not JSON: %s", why);
    return -1;
  }
  tsr_bpe *p = calloc(1, sizeof *p);
  int rc = p ? 0 : -1;
  if (!p) snprintf(err, errlen, "out of memory");
  if (!rc) {
    byte_alphabet(p);
    rc = load_shape(p, root, err, errlen);
  }
  if (!rc) rc = load_tokens(p, root, err, errlen);
  if (!rc) rc = load_merges(p, root, err, errlen);
  tsr_json_free(&root);
  if (rc) {
    tsr_bpe_free(&p);
    return -1;
  }
  *out = p;
  return 0;
}

void tsr_bpe_free(tsr_bpe **pp) {
  if (!pp || !*pp) return;
  tsr_bpe *p = *pp;
  free(p->arena);
  free(p->tab);
  free(p->id_off);
  free(p->id_len);
  free(p->id_special);
  free(p->mkey);
  free(p->mrank);
  free(p->mid);
  free(p->added);
  free(p);
  *pp = NULL;
}

int64_t tsr_bpe_vocab(const tsr_bpe *p) { return p->vocab; }

int32_t tsr_bpe_eos(const tsr_bpe *p, const char *cfg, size_t len) {
  static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>",
                                      "<|eos|>"};
  tsr_json *root = NULL;
  char why[128];
  int32_t id = -1;
  if (cfg && tsr_json_parse(cfg, len, &root, why, sizeof why) == 0) {
    const tsr_json *eos = tsr_json_get(root, "eos_token");
    if (eos && eos->type == TSR_JSON_OBJECT) eos = tsr_json_get(eos, "content");
    if (eos && eos->type == TSR_JSON_STRING) id = tsr_bpe_token_id(p, eos->str, eos->n);
    tsr_json_free(&root);
  }
  for (size_t i = 0; id < 0 && i < sizeof names / sizeof names[0]; i++)
    id = tsr_bpe_token_id(p, names[i], strlen(names[i]));
  return id;
}

/* ---------------------------------------------------------------- encoding */

typedef struct {
  int32_t *ids;
  int64_t n, cap;
  int32_t *sym; /* a word's symbols */
  size_t sym_cap;
  char *buf; /* scratch: a piece with its prefix space, a word in the byte alphabet */
  size_t buf_cap;
  int failed;
} out_ids;

static void emit(out_ids *o, int32_t id) {
  if (o->failed) return;
  if (o->n == o->cap) {
    const int64_t cap = o->cap ? 2 * o->cap : 64;
    int32_t *ids = realloc(o->ids, (size_t)cap * sizeof *ids);
    if (!ids) {
      o->failed = 1;
      return;
    }
    o->ids = ids, o->cap = cap;
  }
  o->ids[o->n++] = id;
}

static char *scratch(out_ids *o, size_t n) {
  if (n > o->buf_cap) {
    char *b = realloc(o->buf, n);
    if (!b) {
      o->failed = 1;
      return NULL;
    }
    o->buf = b, o->buf_cap = n;
  }
  return o->buf;
}

/* One pre-tokenized piece through the byte-level alphabet and the merges. */
static void bpe_word(const tsr_bpe *p, const char *w, size_t n, out_ids *o) {
  if (!n || o->failed) return;
  if (p->ignore_merges) { /* a piece that is a token is that token */
    char *b = scratch(o, 2 * n + 1);
    if (!b) return;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) m += put_utf8(b + m, p->byte_cp[(unsigned char)w[i]]);
    const int32_t id = tsr_bpe_token_id(p, b, m);
    if (id >= 0) {
      emit(o, id);
      return;
    }
  }
  if (n > o->sym_cap) {
    int32_t *s = realloc(o->sym, n * sizeof *s);
    if (!s) {
      o->failed = 1;
      return;
    }
    o->sym = s, o->sym_cap = n;
  }
  int32_t *s = o->sym;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t id = p->byte_id[(unsigned char)w[i]];
    if (id >= 0) s[m++] = id;
    else if (p->unk >= 0) s[m++] = p->unk;
  }
  for (;;) {
    int32_t best = INT32_MAX, merged = -1, mj;
    size_t at = 0;
    for (size_t j = 0; j + 1 < m; j++) {
      const int32_t r = merge_find(p, s[j], s[j + 1], &mj);
      if (r < best) best = r, at = j, merged = mj;
    }
    if (best == INT32_MAX) break;
    s[at] = merged;
    memmove(s + at + 1, s + at + 2, (m - at - 2) * sizeof *s);
    m--;
  }
  for (size_t i = 0; i < m; i++) emit(o, s[i]);
}

/* Pre-tokenizer step k onward on the piece s[0..n). */
static void pre_tokenize(const tsr_bpe *p, int k, const char *s, size_t n, out_ids *o) {
  if (!n || o->failed) return;
  if (k == p->n_steps) {
    bpe_word(p, s, n, o);
    return;
  }
  const step *st = &p->steps[k];
  if (st->kind == STEP_BYTELEVEL) {
    char *copy = NULL;
    if (st->prefix_space && s[0] != ' ') {
      copy = malloc(n + 1);
      if (!copy) {
        o->failed = 1;
        return;
      }
      copy[0] = ' ';
      memcpy(copy + 1, s, n);
      s = copy, n++;
    }
    if (st->use_regex)
      for (size_t i = 0; i < n && !o->failed;) {
        const size_t e = match_gpt2(s, n, i);
        pre_tokenize(p, k + 1, s + i, e - i, o);
        i = e;
      }
    else
      pre_tokenize(p, k + 1, s, n, o);
    free(copy);
    return;
  }
  for (size_t i = 0; i < n && !o->failed;) {
    const size_t e = st->kind == STEP_GPT2 ? match_gpt2(s, n, i) : match_llama3(s, n, i, st->digits);
    pre_tokenize(p, k + 1, s + i, e - i, o);
    i = e;
  }
}

/* The longest added token at text[i]: its index, or -1. */
static int added_at(const tsr_bpe *p, const char *text, size_t len, size_t i) {
  if (!p->added_first[(unsigned char)text[i]]) return -1;
  for (int a = 0; a < p->n_added; a++) /* longest first */
    if (p->added[a].len <= len - i && !memcmp(text + i, p->arena + p->added[a].off, p->added[a].len))
      return a;
  return -1;
}

int tsr_bpe_encode(const tsr_bpe *p, const char *text, size_t len, int32_t **ids, int64_t *n) {
  out_ids o = {0};
  *ids = NULL;
  *n = 0;
  size_t from = 0;
  for (size_t i = 0; i < len && !o.failed;) {
    const int a = p->n_added ? added_at(p, text, len, i) : -1;
    if (a < 0) {
      i++;
      continue;
    }
    pre_tokenize(p, 0, text + from, i - from, &o);
    emit(&o, p->added[a].id);
    i += p->added[a].len;
    from = i;
  }
  pre_tokenize(p, 0, text + from, len - from, &o);
  emit(&o, 0); /* room for none: *ids is never NULL on success */
  free(o.sym);
  free(o.buf);
  if (o.failed) {
    free(o.ids);
    return -1;
  }
  *ids = o.ids;
  *n = o.n - 1;
  return 0;
}

/* ---------------------------------------------------------------- decoding */

/* The length of the valid UTF-8 sequence at s[i], or 0 with *bad the bytes of the
 * maximal invalid part to replace (Unicode's "maximal subpart" rule, as Rust's
 * from_utf8_lossy). */
static size_t valid_at(const unsigned char *s, size_t len, size_t i, size_t *bad) {
  const unsigned char c = s[i];
  *bad = 1;
  if (c < 0x80) return 1;
  int k;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) k = 2;
  else if (c >= 0xE0 && c <= 0xEF) k = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) k = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  for (int j = 1; j < k; j++) {
    if (i + (size_t)j >= len) return *bad = (size_t)j, 0;
    const unsigned char d = s[i + (size_t)j];
    if (d < (j == 1 ? lo : 0x80) || d > (j == 1 ? hi : 0xBF)) return *bad = (size_t)j, 0;
  }
  return (size_t)k;
}

char *tsr_bpe_decode(const tsr_bpe *p, const int32_t *ids, int64_t n, size_t *len) {
  *len = 0;
  size_t cap = 1;
  for (int64_t i = 0; i < n; i++)
    if (ids[i] >= 0 && ids[i] < p->vocab && p->id_len[ids[i]] != UINT32_MAX) cap += p->id_len[ids[i]];
  unsigned char *raw = malloc(cap);
  if (!raw) return NULL;
  size_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= p->vocab || p->id_len[ids[i]] == UINT32_MAX ||
        p->id_special[ids[i]])
      continue;
    const char *t = p->arena + p->id_off[ids[i]];
    const size_t tl = p->id_len[ids[i]], at = m;
    int all = 1; /* every character in the byte alphabet: its bytes; else the text */
    for (size_t j = 0, k; j < tl && all; j += k) {
      const uint32_t c = cp_at(t, tl, j, &k);
      if (c < 512 && p->cp_byte[c] >= 0) raw[m++] = (unsigned char)p->cp_byte[c];
      else all = 0;
    }
    if (!all) {
      memcpy(raw + at, t, tl);
      m = at + tl;
    }
  }
  /* invalid UTF-8 -> U+FFFD (3 bytes for at least 1): at most 3 times as long */
  char *text = malloc(3 * m + 1);
  size_t o = 0;
  for (size_t i = 0; text && i < m;) {
    size_t bad;
    const size_t k = valid_at(raw, m, i, &bad);
    if (k) {
      memcpy(text + o, raw + i, k);
      o += k, i += k;
    } else {
      memcpy(text + o, "\xEF\xBF\xBD", 3);
      o += 3, i += bad;
    }
  }
  free(raw);
  if (!text) return NULL;
  text[o] = 0;
  *len = o;
  return text;
}
