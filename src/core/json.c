/* json.c — the JSON reader of json.h.
 *
 * A recursive descent over the text.  Every string and key is decoded into one arena of
 * the text's size (a decoded string with its NUL never takes more bytes than its quoted
 * source); the members of a container are gathered on one shared stack and copied into an
 * array of their own when the container closes.  malloc, not tsr_calloc: a tokenizer.json
 * has hundreds of thousands of small arrays. */
#include "json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  tsr_json root; /* first: tsr_json_free gets the whole document from it */
  char *arena;
} document;

typedef struct {
  const char *s;
  size_t len, at;
  char *arena;
  size_t used;
  tsr_json *stack; /* members of the open containers */
  size_t depth_n, stack_cap;
  char *err;
  size_t errlen;
  int failed;
} parser;

static int fail(parser *p, const char *what) {
  if (!p->failed) snprintf(p->err, p->errlen, "%s at byte %zu", what, p->at);
  p->failed = 1;
  return -1;
}

static void skip_ws(parser *p) {
  while (p->at < p->len && (p->s[p->at] == ' ' || p->s[p->at] == '\t' ||
                            p->s[p->at] == '\n' || p->s[p->at] == '\r'))
    p->at++;
}

static void put_utf8(parser *p, uint32_t c) {
  char *o = p->arena + p->used;
  if (c < 0x80) {
    o[0] = (char)c;
    p->used += 1;
  } else if (c < 0x800) {
    o[0] = (char)(0xC0 | (c >> 6));
    o[1] = (char)(0x80 | (c & 0x3F));
    p->used += 2;
  } else if (c < 0x10000) {
    o[0] = (char)(0xE0 | (c >> 12));
    o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[2] = (char)(0x80 | (c & 0x3F));
    p->used += 3;
  } else {
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    p->used += 4;
  }
}

/* Four hex digits at p->at; -1 if they are not. */
static int32_t hex4(parser *p) {
  if (p->len - p->at < 4) return -1;
  int32_t v = 0;
  for (int i = 0; i < 4; i++) {
    const char c = p->s[p->at + (size_t)i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  p->at += 4;
  return v;
}

/* The string at p->at (its opening quote) into the arena: *out, *n bytes. */
static int string(parser *p, char **out, size_t *n) {
  p->at++; /* the quote */
  char *start = p->arena + p->used;
  for (;;) {
    if (p->at >= p->len) return fail(p, "unterminated string");
    const unsigned char c = (unsigned char)p->s[p->at];
    if (c == '"') {
      p->at++;
      break;
    }
    if (c < 0x20) return fail(p, "control character in a string");
    if (c != '\\') {
      p->arena[p->used++] = (char)c;
      p->at++;
      continue;
    }
    if (++p->at >= p->len) return fail(p, "unterminated string");
    const char e = p->s[p->at++];
    switch (e) {
    case '"': case '\\': case '/': p->arena[p->used++] = e; break;
    case 'b': p->arena[p->used++] = '\b'; break;
    case 'f': p->arena[p->used++] = '\f'; break;
    case 'n': p->arena[p->used++] = '\n'; break;
    case 'r': p->arena[p->used++] = '\r'; break;
    case 't': p->arena[p->used++] = '\t'; break;
    case 'u': {
      int32_t u = hex4(p);
      if (u < 0) return fail(p, "bad \\u escape");
      uint32_t c32 = (uint32_t)u;
      if (u >= 0xD800 && u < 0xDC00) { /* a high surrogate: its low one should follow */
        const size_t back = p->at;
        int32_t lo = -1;
        if (p->len - p->at >= 6 && p->s[p->at] == '\\' && p->s[p->at + 1] == 'u') {
          p->at += 2;
          lo = hex4(p);
        }
        if (lo >= 0xDC00 && lo < 0xE000) {
          c32 = 0x10000 + (((uint32_t)u - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
        } else {
          p->at = back;
          c32 = 0xFFFD;
        }
      } else if (u >= 0xDC00 && u < 0xE000) {
        c32 = 0xFFFD;
      }
      put_utf8(p, c32);
      break;
    }
    default: return fail(p, "bad escape in a string");
    }
  }
  *n = (size_t)(p->arena + p->used - start);
  p->arena[p->used++] = 0;
  *out = start;
  return 0;
}

static int push(parser *p, const tsr_json *v) {
  if (p->depth_n == p->stack_cap) {
    const size_t cap = p->stack_cap ? 2 * p->stack_cap : 256;
    tsr_json *s = realloc(p->stack, cap * sizeof *s);
    if (!s) return fail(p, "out of memory");
    p->stack = s, p->stack_cap = cap;
  }
  p->stack[p->depth_n++] = *v;
  return 0;
}

static void free_items(tsr_json *j) {
  if (j->type != TSR_JSON_ARRAY && j->type != TSR_JSON_OBJECT) return;
  for (size_t i = 0; i < j->n; i++) free_items(&j->items[i]);
  free(j->items);
  j->items = NULL;
  j->n = 0;
}

static int value(parser *p, tsr_json *v, int depth);

/* An array or object at p->at: its members onto the stack, then into v->items. */
static int container(parser *p, tsr_json *v, int depth) {
  const int object = p->s[p->at] == '{';
  const char close = object ? '}' : ']';
  const size_t base = p->depth_n;
  if (depth >= TSR_JSON_MAX_DEPTH) return fail(p, "nesting too deep");
  v->type = object ? TSR_JSON_OBJECT : TSR_JSON_ARRAY;
  p->at++;
  skip_ws(p);
  int rc = 0;
  if (p->at < p->len && p->s[p->at] == close) {
    p->at++;
  } else {
    for (;;) {
      tsr_json m;
      memset(&m, 0, sizeof m);
      skip_ws(p);
      if (object) {
        if (p->at >= p->len || p->s[p->at] != '"') {
          rc = fail(p, "expected a key");
          break;
        }
        if ((rc = string(p, &m.key, &m.key_len))) break;
        skip_ws(p);
        if (p->at >= p->len || p->s[p->at] != ':') {
          rc = fail(p, "expected ':'");
          break;
        }
        p->at++;
      }
      if ((rc = value(p, &m, depth + 1))) break;
      if ((rc = push(p, &m))) {
        free_items(&m);
        break;
      }
      skip_ws(p);
      if (p->at < p->len && p->s[p->at] == ',') {
        p->at++;
        continue;
      }
      if (p->at < p->len && p->s[p->at] == close) {
        p->at++;
        break;
      }
      rc = fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
      break;
    }
  }
  const size_t n = p->depth_n - base;
  if (!rc && n) {
    v->items = malloc(n * sizeof *v->items);
    if (!v->items) rc = fail(p, "out of memory");
    else memcpy(v->items, p->stack + base, n * sizeof *v->items), v->n = n;
  }
  if (rc)
    for (size_t i = base; i < p->depth_n; i++) free_items(&p->stack[i]);
  p->depth_n = base;
  return rc;
}

static int number(parser *p, tsr_json *v) {
  const size_t start = p->at;
  if (p->at < p->len && p->s[p->at] == '-') p->at++;
  const size_t digits = p->at;
  while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9') p->at++;
  if (p->at == digits) return fail(p, "bad number");
  if (p->at < p->len && p->s[p->at] == '.') {
    const size_t frac = ++p->at;
    while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9') p->at++;
    if (p->at == frac) return fail(p, "bad number");
  }
  if (p->at < p->len && (p->s[p->at] == 'e' || p->s[p->at] == 'E')) {
    p->at++;
    if (p->at < p->len && (p->s[p->at] == '+' || p->s[p->at] == '-')) p->at++;
    const size_t ex = p->at;
    while (p->at < p->len && p->s[p->at] >= '0' && p->s[p->at] <= '9') p->at++;
    if (p->at == ex) return fail(p, "bad number");
  }
  char buf[64];
  const size_t n = p->at - start;
  if (n >= sizeof buf) { /* a long literal: strtod on a copy */
    char *copy = malloc(n + 1);
    if (!copy) return fail(p, "out of memory");
    memcpy(copy, p->s + start, n);
    copy[n] = 0;
    v->num = strtod(copy, NULL);
    free(copy);
  } else {
    memcpy(buf, p->s + start, n);
    buf[n] = 0;
    v->num = strtod(buf, NULL);
  }
  v->type = TSR_JSON_NUMBER;
  return 0;
}

static int literal(parser *p, const char *word, tsr_json_type type, tsr_json *v) {
  const size_t n = strlen(word);
  if (p->len - p->at < n || memcmp(p->s + p->at, word, n)) return fail(p, "unexpected text");
  p->at += n;
  v->type = type;
  return 0;
}

static int value(parser *p, tsr_json *v, int depth) {
  skip_ws(p);
  if (p->at >= p->len) return fail(p, "unexpected end");
  switch (p->s[p->at]) {
  case '{': case '[': return container(p, v, depth);
  case '"':
    v->type = TSR_JSON_STRING;
    return string(p, &v->str, &v->n);
  case 't': return literal(p, "true", TSR_JSON_TRUE, v);
  case 'f': return literal(p, "false", TSR_JSON_FALSE, v);
  case 'n': return literal(p, "null", TSR_JSON_NULL, v);
  default: return number(p, v);
  }
}

int tsr_json_parse(const char *text, size_t len, tsr_json **out, char *err, size_t errlen) {
  *out = NULL;
  if (errlen) err[0] = 0;
  document *d = calloc(1, sizeof *d);
  char *arena = malloc(len + 1);
  if (!d || !arena) {
    free(d);
    free(arena);
    snprintf(err, errlen, "out of memory for %zu bytes of JSON", len);
    return -1;
  }
  parser p = {.s = text, .len = len, .arena = arena, .err = err, .errlen = errlen};
  int rc = value(&p, &d->root, 0);
  if (!rc) {
    skip_ws(&p);
    if (p.at != p.len) rc = fail(&p, "text after the value");
  }
  free(p.stack);
  d->arena = arena;
  if (rc) {
    tsr_json *r = &d->root;
    tsr_json_free(&r);
    return -1;
  }
  *out = &d->root;
  return 0;
}

void tsr_json_free(tsr_json **j) {
  if (!j || !*j) return;
  document *d = (document *)*j;
  free_items(&d->root);
  free(d->arena);
  free(d);
  *j = NULL;
}

const tsr_json *tsr_json_get(const tsr_json *j, const char *key) {
  if (!j || j->type != TSR_JSON_OBJECT) return NULL;
  const size_t n = strlen(key);
  for (size_t i = 0; i < j->n; i++)
    if (j->items[i].key_len == n && !memcmp(j->items[i].key, key, n)) return &j->items[i];
  return NULL;
}

const char *tsr_json_str(const tsr_json *j) {
  return j && j->type == TSR_JSON_STRING ? j->str : NULL;
}
