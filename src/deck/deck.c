/* deck.c — the namelist input deck's parser: lexer, values, overrides, range and
 * cross-field checks.  The schema that drives it, the defaults, --help-deck and the
 * effective deck are deck_schema.c's.
 *
 * The parser is a hand-written lexer plus a flat loop (no recursion) over a byte buffer that
 * need not be NUL-terminated, so it is safe on any input (it is fuzzed).  It never prints and
 * never exits: every problem becomes one `file:line:col: message` line in the caller's buffer. */
#include "deck.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deck_schema.h"
#include "layout_check.h"
#include "core/util.h"

/* ---------------------------------------------------------------- small helpers */

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_alnum_(int c) { return is_alpha(c) || is_digit(c) || c == '_'; }


/* Printable excerpt of untrusted text for messages: escapes, at most ~40 characters. */
static void show(char *out, size_t cap, const char *p, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 8 < cap; i++) {
    unsigned char c = (unsigned char)p[i];
    if (i == 40) { memcpy(out + o, "...", 3); o += 3; break; }
    if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    else out[o++] = (char)c;
  }
  out[o] = 0;
}

/* Optimal-string-alignment distance (edits + adjacent swaps), case-insensitive, of a and
 * the first nb characters of b. */
static int edit_distance(const char *a, const char *b, size_t nb) {
  size_t na = strlen(a);
  if (na > 63 || nb > 63) return 99;
  int d[64][64];
  for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= na; i++)
    for (size_t j = 1; j <= nb; j++) {
      int ai = deck_lower((unsigned char)a[i - 1]), bj = deck_lower((unsigned char)b[j - 1]);
      int v = d[i - 1][j - 1] + (ai != bj);
      if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ai == deck_lower((unsigned char)b[j - 2]) &&
          deck_lower((unsigned char)a[i - 2]) == bj && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[na][nb];
}
int tsr_deck_word_distance(const char *a, const char *b) { return edit_distance(a, b, strlen(b)); }
static int close_enough(int dist, size_t n) { return dist <= (n <= 3 ? 1 : n <= 6 ? 2 : 3); }



/* ---------------------------------------------------------------- values */

/* Strict integer: [+-]digits.  0 ok, -1 syntax, -2 overflow. */
static int parse_int(const char *p, size_t n, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
  if (i == n) return -1;
  uint64_t v = 0;
  for (; i < n; i++) {
    if (!is_digit((unsigned char)p[i])) return -1;
    if (v > (UINT64_C(1) << 62)) return -2;
    v = v * 10 + (uint64_t)(p[i] - '0');
  }
  if (v > (uint64_t)INT64_MAX) return -2;
  *out = neg ? -(int64_t)v : (int64_t)v;
  return 0;
}

/* Fortran real: [+-](digits[.digits]|.digits)([eEdD][+-]digits).  0 ok, -1 syntax, -2 overflow. */
static int parse_real(const char *p, size_t n, double *out) {
  char buf[80];
  size_t i = 0, nd = 0;
  if (n >= sizeof buf) return -1;
  if (i < n && (p[i] == '+' || p[i] == '-')) i++;
  while (i < n && is_digit((unsigned char)p[i])) i++, nd++;
  if (i < n && p[i] == '.') {
    i++;
    while (i < n && is_digit((unsigned char)p[i])) i++, nd++;
  }
  if (nd == 0) return -1;
  if (i < n && strchr("eEdD", p[i]) && p[i]) {
    i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    size_t ne = 0;
    while (i < n && is_digit((unsigned char)p[i])) i++, ne++;
    if (ne == 0) return -1;
  }
  if (i != n) return -1;
  for (i = 0; i < n; i++) buf[i] = (p[i] == 'd' || p[i] == 'D') ? 'e' : p[i];
  buf[n] = 0;
  double v = strtod(buf, NULL);
  if (!isfinite(v)) return -2;
  *out = v;
  return 0;
}

static int parse_logical(const char *p, size_t n, int *out) {
  static const char *const yes[] = {".true.", ".t.", "t", "true"}, *const no[] = {
      ".false.", ".f.", "f", "false"};
  for (int i = 0; i < 4; i++) {
    if (deck_ieq(yes[i], p, n)) return *out = 1, 0;
    if (deck_ieq(no[i], p, n)) return *out = 0, 0;
  }
  return -1;
}

/* ---------------------------------------------------------------- lexer */

typedef struct {
  const char *s;
  size_t n, i;
  int line, col;
} lexer;

enum { T_EOF, T_GROUP, T_END, T_EQ, T_VALUE, T_BAD };
typedef struct {
  int kind, line, col;
  const char *p; /* group name, bare text, string body (still with doubled quotes), bad char */
  size_t n;
  int quoted, unterminated;
  char quote;
  int64_t count; /* 1, or the repeat count of `N*value` */
  const char *why; /* T_BAD: what is wrong */
} token;

static int peekc(const lexer *L, size_t k) {
  return L->i + k < L->n ? (unsigned char)L->s[L->i + k] : -1;
}
static void adv(lexer *L) {
  if (L->s[L->i] == '\n') L->line++, L->col = 1;
  else L->col++;
  L->i++;
}
static int is_garbage(int c) {
  return c == 0 || (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') ||
         c == 0x7f || (c > 0 && c < 0x80 && strchr("#;@$^~`{}[]()<>|\\?", c));
}
static int is_space(int c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == ',';
}
static int ends_bare(int c) {
  return c < 0 || is_space(c) || c == '=' || c == '/' || c == '&' || c == '!' || c == '\'' ||
         c == '"' || is_garbage(c);
}

static void lex_string(lexer *L, token *t) {
  t->quoted = 1;
  t->quote = (char)peekc(L, 0);
  adv(L);
  size_t start = L->i;
  for (;;) {
    int c = peekc(L, 0);
    if (c < 0 || c == '\n') { /* strings end on their line: report at the opening quote */
      t->unterminated = 1;
      t->p = L->s + start, t->n = L->i - start;
      return;
    }
    if (c == t->quote) {
      if (peekc(L, 1) == c) { adv(L), adv(L); continue; }
      t->p = L->s + start, t->n = L->i - start;
      adv(L);
      return;
    }
    adv(L);
  }
}

static void next_token(lexer *L, token *t) {
  for (;;) { /* separators and ! comments */
    int c = peekc(L, 0);
    if (c >= 0 && is_space(c)) adv(L);
    else if (c == '!') while (peekc(L, 0) >= 0 && peekc(L, 0) != '\n') adv(L);
    else break;
  }
  memset(t, 0, sizeof *t);
  t->line = L->line, t->col = L->col, t->count = 1;
  int c = peekc(L, 0);
  if (c < 0) { t->kind = T_EOF; return; }
  if (c == '&') {
    adv(L);
    size_t start = L->i;
    while (peekc(L, 0) >= 0 && is_alnum_(peekc(L, 0))) adv(L);
    t->p = L->s + start, t->n = L->i - start;
    t->kind = t->n ? T_GROUP : T_BAD;
    if (!t->n) t->p = L->s + start - 1, t->n = 1, t->why = "expected a group name after '&'";
    return;
  }
  if (c == '/' || c == '=') { t->kind = c == '/' ? T_END : T_EQ; t->p = L->s + L->i; t->n = 1; adv(L); return; }
  t->kind = T_VALUE;
  if (c == '\'' || c == '"') { lex_string(L, t); return; }
  if (is_garbage(c)) {
    t->kind = T_BAD, t->p = L->s + L->i, t->n = 1;
    t->why = c == '#' ? "comments start with '!'" : "not part of the deck syntax";
    adv(L);
    if (c == '#') /* meant as a comment: one message, not one per word of it */
      while (peekc(L, 0) >= 0 && peekc(L, 0) != '\n') adv(L);
    return;
  }
  size_t start = L->i;
  while (!ends_bare(peekc(L, 0))) adv(L);
  t->p = L->s + start, t->n = L->i - start;
  size_t k = 0;
  while (k < t->n && is_digit((unsigned char)t->p[k])) k++;
  if (k > 0 && k < t->n && t->p[k] == '*') { /* N*value */
    int64_t r = 0;
    for (size_t j = 0; j < k; j++) r = r > 1000000000 ? r : r * 10 + (t->p[j] - '0');
    t->count = r;
    t->p += k + 1, t->n -= k + 1;
    if (t->n == 0 && (peekc(L, 0) == '\'' || peekc(L, 0) == '"')) lex_string(L, t);
  }
}

/* ---------------------------------------------------------------- parser state and errors */

#define MAX_ERRORS 20
typedef struct {
  const char *name; /* file name, or NULL for an override */
  int argn, line, col;
} loc_t;

typedef struct {
  tsr_config *cfg;
  char *eb;
  size_t el, used;
  int nerr;
  int argn;          /* 0 while reading the file, N for the N-th override */
  const char *fname;
  loc_t set_at[DECK_MAX_KEYS];
  int set_seq[DECK_MAX_KEYS]; /* 0 = default; larger = set later */
  int failed[DECK_MAX_KEYS];  /* its value was rejected: skip cross checks */
  int seq;
  loc_t group_at[N_GROUP];
  int group_seen[N_GROUP];
  int world_size;
} parser;

static void fmt_loc(char *buf, size_t cap, const loc_t *l) {
  if (l->argn > 0) snprintf(buf, cap, "<command line>:arg%d:%d", l->argn, l->col);
  else if (l->line == 0) snprintf(buf, cap, "<defaults>");
  else snprintf(buf, cap, "%s:%d:%d", l->name, l->line, l->col);
}
static loc_t tok_loc(const parser *P, const token *t) {
  loc_t l = {P->fname, P->argn, t->line, t->col};
  return l;
}

static void errat(parser *P, const loc_t *at, const char *fmt, ...) TSR_PRINTF(3, 4);
static void errat(parser *P, const loc_t *at, const char *fmt, ...) {
  char line[1024], where[TSR_STR_PATH + 64];
  P->nerr++;
  if (P->nerr > MAX_ERRORS + 1 || !P->eb || P->el == 0) return;
  if (P->nerr == MAX_ERRORS + 1) {
    snprintf(line, sizeof line, "too many errors; stopping after %d\n", MAX_ERRORS);
  } else {
    va_list ap;
    va_start(ap, fmt);
    fmt_loc(where, sizeof where, at);
    int n = snprintf(line, sizeof line, "%s: ", where);
    if (n < 0 || (size_t)n >= sizeof line) n = 0;
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 >= sizeof line) len = sizeof line - 2;
    line[len] = '\n', line[len + 1] = 0;
  }
  size_t len = strlen(line);
  if (P->used + 1 >= P->el) return;
  if (len > P->el - P->used - 1) len = P->el - P->used - 1;
  memcpy(P->eb + P->used, line, len);
  P->used += len;
  P->eb[P->used] = 0;
}

/* "&model n_layer" */
static const char *qname(int k, char *buf, size_t cap) {
  snprintf(buf, cap, "&%s %s", deck_group_name[deck_schema[k].group], deck_schema[k].name);
  return buf;
}

static void report_bad(parser *P, const token *t) {
  loc_t l = tok_loc(P, t);
  char s[64];
  show(s, sizeof s, t->p, t->n);
  if (t->kind == T_VALUE && t->unterminated)
    errat(P, &l, "unterminated string: missing closing %c", t->quote);
  else
    errat(P, &l, "unexpected character '%s': %s", s, t->why ? t->why : "not allowed here");
}

static void unknown_key(parser *P, const loc_t *l, int g, const char *p, size_t n) {
  char s[64];
  show(s, sizeof s, p, n);
  int best = -1, bestd = 99, other = -1, otherd = 99;
  for (int k = 0; k < deck_n_keys; k++) {
    int d = edit_distance(deck_schema[k].name, p, n);
    if (deck_schema[k].group == g && d < bestd) best = k, bestd = d;
    if (deck_schema[k].group != g && d < otherd) other = k, otherd = d;
  }
  if (other >= 0 && otherd == 0)
    errat(P, l, "unknown key '%s' in &%s: key '%s' is in group &%s, not &%s", s, deck_group_name[g],
          deck_schema[other].name, deck_group_name[deck_schema[other].group], deck_group_name[g]);
  else if (best >= 0 && close_enough(bestd, n))
    errat(P, l, "unknown key '%s' in &%s; did you mean '%s'?", s, deck_group_name[g], deck_schema[best].name);
  else if (other >= 0 && close_enough(otherd, n))
    errat(P, l, "unknown key '%s' in &%s; did you mean '%s' in &%s?", s, deck_group_name[g],
          deck_schema[other].name, deck_group_name[deck_schema[other].group]);
  else
    errat(P, l, "unknown key '%s' in &%s (tessera --help-deck lists the keys)", s, deck_group_name[g]);
}

static void unknown_group(parser *P, const loc_t *l, const char *p, size_t n) {
  char s[64];
  show(s, sizeof s, p, n);
  int best = -1, bestd = 99;
  for (int g = 0; g < N_GROUP; g++) {
    int d = edit_distance(deck_group_name[g], p, n);
    if (d < bestd) best = g, bestd = d;
  }
  if (close_enough(bestd, n)) {
    errat(P, l, "unknown group '&%s'; did you mean '&%s'?", s, deck_group_name[best]);
    return;
  }
  char all[160] = ""; /* every group, from the schema */
  for (int g = 0; g < N_GROUP; g++)
    snprintf(all + strlen(all), sizeof all - strlen(all), " &%s", deck_group_name[g]);
  errat(P, l, "unknown group '&%s'; the groups are%s", s, all);
}

/* What an error about one value names: where it is, the key ("&model n_layer"), the value
 * as written (s) and the key's bounds as text (r: "[1, 1024]"). */
typedef struct {
  const key_def *d;
  loc_t l;
  char q[96], s[64], r[64];
} value_ctx;

static void value_ctx_init(value_ctx *c, const parser *P, int k, const token *t) {
  c->d = &deck_schema[k];
  c->l = tok_loc(P, t);
  qname(k, c->q, sizeof c->q);
  show(c->s, sizeof c->s, t->p, t->n);
  deck_fmt_range(c->r, sizeof c->r, c->d);
}

/* An integer (unquoted) within the key's bounds, or the word 'auto' (quoted; bare in an
 * override), stored as TSR_EVERY_AUTO. */
static void assign_int_auto(parser *P, int k, const token *t, int bare) {
  value_ctx e;
  value_ctx_init(&e, P, k, t);
  if (deck_ieq("auto", t->p, t->n) && (t->quoted || bare)) {
    *deck_ival(P->cfg, k) = TSR_EVERY_AUTO;
    return;
  }
  if (deck_ieq("auto", t->p, t->n)) {
    errat(P, &e.l, "%s expects an integer or the string 'auto', got %s; write 'auto'", e.q, e.s);
    return;
  }
  int64_t v = 0;
  const int rc = t->quoted ? -1 : parse_int(t->p, t->n, &v);
  if (rc) {
    errat(P, &e.l, rc == -2 ? "%s = %s is too large for an integer"
                            : "%s expects an integer or 'auto', got '%s'", e.q, e.s);
    return;
  }
  if (!deck_in_range(e.d, (double)v)) {
    errat(P, &e.l, "%s = %lld is out of range: must be %s or 'auto'", e.q, (long long)v, e.r);
    return;
  }
  *deck_ival(P->cfg, k) = v;
}

/* The text of a string value, unquoted (a doubled quote is one), into v (TSR_STR_PATH + 1
 * bytes) and its length into *n; `size`, where not 0, the field's bytes with the NUL.
 * Returns -1 (reported) when it is not a string, has a control character or is too long. */
static int string_value(parser *P, const value_ctx *e, const token *t, int bare, size_t size,
                        char *v, size_t *n_out) {
  if (!t->quoted && !bare) {
    errat(P, &e->l, "%s expects a quoted string, got %s; write '%s'", e->q, e->s, e->s);
    return -1;
  }
  size_t n = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (t->quoted && t->p[i] == t->quote && i + 1 < t->n) i++; /* doubled quote */
    if ((unsigned char)t->p[i] < 0x20 || t->p[i] == 0x7f) {
      errat(P, &e->l, "%s contains a control character", e->q);
      return -1;
    }
    if (n < TSR_STR_PATH) v[n] = t->p[i];
    n++;
  }
  if (size && n >= size) {
    errat(P, &e->l, "%s is too long: %zu characters, at most %zu", e->q, n, size - 1);
    return -1;
  }
  v[n < TSR_STR_PATH ? n : TSR_STR_PATH] = 0;
  *n_out = n;
  return 0;
}

/* Value i of the n values of list key k ("&data weights value 2" in messages when n > 1). */
static void assign_elem(parser *P, int k, int i, int n, const token *t, int bare) {
  value_ctx e;
  value_ctx_init(&e, P, k, t);
  if (n > 1) {
    const size_t o = strlen(e.q);
    snprintf(e.q + o, sizeof e.q - o, " value %d", i + 1);
  }
  if (deck_schema[k].at_off) /* where it was given, for the data's messages */
    fmt_loc((char *)P->cfg + deck_schema[k].at_off + (size_t)i * TSR_DECK_LOC, TSR_DECK_LOC,
            &e.l);
  if (deck_schema[k].type == K_REALLIST) {
    double v = 0;
    int rc;
    if (t->quoted) {
      errat(P, &e.l, "%s expects a real number, got the string '%s'", e.q, e.s);
    } else if ((rc = parse_real(t->p, t->n, &v)) != 0) {
      errat(P, &e.l, rc == -2 ? "%s = %s overflows a double" : "%s expects a real number, got '%s'", e.q, e.s);
    } else if (!deck_in_range(e.d, v)) {
      errat(P, &e.l, "%s = %s is out of range: must be %s", e.q, e.s, e.r);
    } else {
      deck_rval(P->cfg, k)[i] = v;
    }
    return;
  }
  char v[TSR_STR_PATH + 1];
  size_t len = 0;
  if (string_value(P, &e, t, bare, deck_elem_size(k), v, &len)) return;
  memset(deck_sval_at(P->cfg, k, i), 0, deck_elem_size(k));
  memcpy(deck_sval_at(P->cfg, k, i), v, len);
}

/* Check and store one value for key k.  `bare`: an unquoted word is a string (overrides). */
static void assign_value(parser *P, int k, const token *t, int bare) {
  if (deck_is_list(k)) { /* one value */
    *deck_nval(P->cfg, k) = 1;
    assign_elem(P, k, 0, 1, t, bare);
    return;
  }
  if (deck_schema[k].type == K_INT_AUTO) {
    assign_int_auto(P, k, t, bare);
    return;
  }
  value_ctx e;
  value_ctx_init(&e, P, k, t);
  const key_def *d = e.d;
  int rc;
  if (d->type == K_LOGI_AUTO && deck_ieq("auto", t->p, t->n)) { /* 'auto' or auto */
    *deck_lval(P->cfg, k) = TSR_LOGI_AUTO;
    return;
  }
  if (d->type != K_STRING && d->type != K_CHOICE && d->type != K_SCOPE && t->quoted) {
    errat(P, &e.l, "%s expects %s, got the string '%s'", e.q,
          d->type == K_INT           ? "an integer"
          : d->type == K_REAL        ? "a real number"
          : d->type == K_LOGI_AUTO   ? "a logical or 'auto'"
                                     : "a logical",
          e.s);
    return;
  }
  switch (d->type) {
  case K_INT: {
    int64_t v = 0;
    if ((rc = parse_int(t->p, t->n, &v)) != 0) {
      errat(P, &e.l, rc == -2 ? "%s = %s is too large for an integer" : "%s expects an integer, got '%s'", e.q, e.s);
      return;
    }
    if (!deck_in_range(d, (double)v)) {
      errat(P, &e.l, "%s = %lld is out of range: must be %s%s", e.q, (long long)v,
            (d->bounds & (LO | HI)) == (LO | HI) ? "in " : "", e.r);
      return;
    }
    *deck_ival(P->cfg, k) = v;
    return;
  }
  case K_REAL: {
    double v = 0;
    if ((rc = parse_real(t->p, t->n, &v)) != 0) {
      errat(P, &e.l, rc == -2 ? "%s = %s overflows a double" : "%s expects a real number, got '%s'", e.q, e.s);
      return;
    }
    if (!deck_in_range(d, v)) {
      errat(P, &e.l, "%s = %s is out of range: must be %s%s", e.q, e.s,
            (d->bounds & (LO | HI)) == (LO | HI) ? "in " : "", e.r);
      return;
    }
    *deck_rval(P->cfg, k) = v;
    return;
  }
  case K_LOGICAL:
  case K_LOGI_AUTO:
    if (parse_logical(t->p, t->n, deck_lval(P->cfg, k)) != 0)
      errat(P, &e.l, "%s expects a logical (.true. or .false., T or F)%s, got '%s'", e.q,
            d->type == K_LOGI_AUTO ? " or 'auto'" : "", e.s);
    return;
  default: break;
  }
  char v[TSR_STR_PATH + 1];
  size_t n = 0;
  if (string_value(P, &e, t, bare, d->type == K_STRING ? d->size : 0, v, &n)) return;
  if (d->type == K_CHOICE) {
    const int i = deck_choice_index(d->choices, v, n);
    if (i >= 0) {
      *deck_lval(P->cfg, k) = i;
      return;
    }
    const char *c = d->choices, *best = NULL;
    int bestd = 99;
    char list[160] = "";
    while (*c) {
      size_t m = strcspn(c, "|");
      char opt[32];
      snprintf(opt, sizeof opt, "%.*s", (int)m, c);
      int dd = edit_distance(opt, v, n);
      if (dd < bestd) bestd = dd, best = c;
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", list[0] ? ", " : "", opt);
      c += m + (c[m] == '|');
    }
    char hint[64] = "";
    if (best && close_enough(bestd, n))
      snprintf(hint, sizeof hint, "; did you mean '%.*s'?", (int)strcspn(best, "|"), best);
    show(e.s, sizeof e.s, v, n);
    errat(P, &e.l, "%s = '%s' is not allowed: choose one of %s%s", e.q, e.s, list, hint);
    return;
  }
  if (d->type == K_SCOPE) {
    int64_t ranks = 0;
    if (deck_ieq("global", v, n) || deck_ieq("node", v, n)) {
      *deck_ival(P->cfg, k) = deck_ieq("global", v, n) ? TSR_SHARD_GLOBAL : TSR_SHARD_NODE;
    } else if (parse_int(v, n, &ranks) != 0 || v[0] == '+' || v[0] == '-' || ranks < 1 ||
               ranks > 1073741824) {
      show(e.s, sizeof e.s, v, n);
      errat(P, &e.l, "%s = '%s' is not allowed: use 'global', 'node' or a positive number of ranks "
            "such as '8'", e.q, e.s);
    } else {
      *deck_ival(P->cfg, k) = ranks;
    }
    return;
  }
  memset(deck_sval(P->cfg, k), 0, d->size);
  memcpy(deck_sval(P->cfg, k), v, n);
}
static void assign(parser *P, int k, const token *t, int bare) {
  int nerr = P->nerr;
  assign_value(P, k, t, bare);
  if (P->nerr != nerr) P->failed[k] = 1; /* no cross-field checks on a rejected value */
}

static int is_ident(const token *t) {
  if (t->kind != T_VALUE || t->quoted || t->count != 1 || t->n == 0 || !is_alpha((unsigned char)t->p[0]))
    return 0;
  for (size_t i = 1; i < t->n; i++)
    if (!is_alnum_((unsigned char)t->p[i])) return 0;
  return 1;
}

/* A bare word that would be a key but for a character keys cannot have (a non-ASCII
 * letter, a '-' or '.'): where that is, or -1 when it is a plain identifier or no key at
 * all. */
static long bad_key_char(const token *t) {
  if (t->kind != T_VALUE || t->quoted || t->count != 1 || t->n == 0 || is_ident(t)) return -1;
  const unsigned char c0 = (unsigned char)t->p[0];
  if (!is_alpha(c0) && c0 < 0x80) return -1;
  for (size_t i = 0; i < t->n; i++)
    if (!is_alnum_((unsigned char)t->p[i])) return (long)i;
  return -1;
}

/* Does the next token start a new key: an identifier followed by '=', a word with a
 * character keys cannot have followed by '=' (reported by the group loop), or a key name
 * (whose '=' was forgotten, which the group loop then reports)? */
static int key_ahead(const lexer *L) {
  lexer a = *L;
  token t;
  next_token(&a, &t);
  if (bad_key_char(&t) >= 0) {
    next_token(&a, &t);
    return t.kind == T_EQ;
  }
  if (!is_ident(&t)) return 0;
  for (int g = 0; g < N_GROUP; g++)
    if (deck_find_key(g, t.p, t.n) >= 0) return 1;
  next_token(&a, &t);
  return t.kind == T_EQ;
}

/* The values after `key =`: up to the next key, '/', '&' or the end.  k < 0 skips them.
 * Overrides (P->argn > 0) take every token to the end of the argument. */
static void read_values(parser *P, lexer *L, int k, const token *keytok) {
  token first = {0}, extra = {0}, t;
  token list[TSR_MAX_DATASETS + 1]; /* a list key's values, repeats expanded */
  int n_list = 0;
  int64_t count = 0;
  int have_extra = 0, bad = 0;
  for (;;) {
    if (P->argn == 0 && key_ahead(L)) break;
    lexer save = *L;
    next_token(L, &t);
    if (t.kind == T_EOF) break;
    if (t.kind != T_VALUE) {
      if (P->argn == 0) { *L = save; break; }
      if (k >= 0 && !bad) {
        loc_t l = tok_loc(P, &t);
        char s[64];
        show(s, sizeof s, t.p, t.n);
        if (t.kind == T_BAD) report_bad(P, &t);
        else errat(P, &l, "unexpected '%s' in the value of %s.%s", s, deck_group_name[deck_schema[k].group], deck_schema[k].name);
      }
      bad = 1;
      continue;
    }
    if (t.unterminated) report_bad(P, &t), bad = 1;
    if (count == 0) first = t;
    else if (!have_extra) extra = t, have_extra = 1;
    for (int64_t r = 0; r < t.count && n_list <= TSR_MAX_DATASETS; r++) list[n_list++] = t;
    count += t.count;
    if (count > 1000000000) count = 1000000000;
  }
  if (k >= 0 && bad) P->failed[k] = 1;
  if (k < 0 || bad) return;
  char q[96];
  qname(k, q, sizeof q);
  if (count == 0) {
    loc_t l = tok_loc(P, keytok);
    errat(P, &l, "%s has no value after '='", q);
    P->failed[k] = 1;
  } else if (deck_is_list(k) && count > TSR_MAX_DATASETS) {
    loc_t l = tok_loc(P, &list[TSR_MAX_DATASETS]);
    errat(P, &l, "%s takes at most %d values, got %lld", q, TSR_MAX_DATASETS, (long long)count);
    P->failed[k] = 1;
  } else if (deck_is_list(k)) {
    const int nerr = P->nerr;
    *deck_nval(P->cfg, k) = n_list;
    for (int i = 0; i < n_list; i++) assign_elem(P, k, i, n_list, &list[i], 0);
    if (P->nerr != nerr) P->failed[k] = 1;
  } else if (count != 1) {
    loc_t l = first.count != 1 ? tok_loc(P, &first) : tok_loc(P, &extra);
    errat(P, &l, "%s expects one value, got %lld", q, (long long)count);
    P->failed[k] = 1;
  } else {
    assign(P, k, &first, 0);
  }
}

static void mark_set(parser *P, int k, const loc_t *l) {
  P->set_at[k] = *l;
  P->set_seq[k] = ++P->seq;
}

/* Body of one group, after its `&name`; g < 0 skips it quietly (already reported). */
static void parse_group(parser *P, lexer *L, const token *gt, int g) {
  loc_t gl = tok_loc(P, gt);
  char gs[64];
  show(gs, sizeof gs, gt->p, gt->n);
  for (;;) {
    lexer save = *L;
    token t;
    next_token(L, &t);
    loc_t l = tok_loc(P, &t);
    char s[64];
    show(s, sizeof s, t.p, t.n);
    switch (t.kind) {
    case T_EOF:
      errat(P, &gl, "group &%s is not closed: missing '/' at its end", gs);
      return;
    case T_END: return;
    case T_GROUP:
      if (deck_ieq("end", t.p, t.n)) return;
      errat(P, &gl, "group &%s is not closed: missing '/' before &%s on line %d", gs, s, t.line);
      *L = save;
      return;
    case T_EQ:
      if (g >= 0) errat(P, &l, "unexpected '=' without a key name in &%s", gs);
      continue;
    case T_BAD:
      if (g >= 0) report_bad(P, &t);
      continue;
    default: break;
    }
    if (t.unterminated) {
      if (g >= 0) report_bad(P, &t);
      continue;
    }
    lexer after = *L;
    token eq;
    next_token(&after, &eq);
    if (eq.kind != T_EQ) {
      if (g >= 0 && is_ident(&t))
        errat(P, &l, "missing '=' after '%s' in &%s", s, gs);
      else if (g >= 0)
        errat(P, &l, "expected 'key = value' in &%s, got '%s'", gs, s);
      read_values(P, L, -1, &t);
      continue;
    }
    *L = after;
    if (g < 0) { read_values(P, L, -1, &t); continue; }
    const long bad = bad_key_char(&t);
    if (bad >= 0) { /* the character, whole where it is a UTF-8 sequence */
      size_t e = (size_t)bad + 1;
      while (e < t.n && ((unsigned char)t.p[e] & 0xC0) == 0x80) e++;
      loc_t bl = l;
      bl.col += (int)bad;
      errat(P, &bl, "key '%s' in &%s has '%.*s', which keys cannot have: a key is ASCII "
            "letters, digits and '_'", s, gs, (int)(e - (size_t)bad), t.p + bad);
      read_values(P, L, -1, &t);
      continue;
    }
    int k = deck_find_key(g, t.p, t.n);
    if (k < 0) {
      unknown_key(P, &l, g, t.p, t.n);
      read_values(P, L, -1, &t);
    } else if (P->set_seq[k]) {
      char w[TSR_STR_PATH + 64];
      fmt_loc(w, sizeof w, &P->set_at[k]);
      errat(P, &l, "duplicate key '%s' in &%s (first set at %s)", deck_schema[k].name, gs, w);
      read_values(P, L, -1, &t);
    } else {
      mark_set(P, k, &l);
      read_values(P, L, k, &t);
    }
  }
}

static void parse_file(parser *P, const char *text, size_t len) {
  lexer L = {text ? text : "", text ? len : 0, 0, 1, 1};
  for (;;) {
    token t;
    next_token(&L, &t);
    if (t.kind == T_EOF) return;
    loc_t l = tok_loc(P, &t);
    char s[64];
    show(s, sizeof s, t.p, t.n);
    if (t.kind == T_GROUP) {
      int g = deck_find_group(t.p, t.n);
      if (deck_ieq("end", t.p, t.n)) {
        errat(P, &l, "'&end' without an open group");
      } else if (g < 0) {
        unknown_group(P, &l, t.p, t.n);
        parse_group(P, &L, &t, -1);
      } else if (P->group_seen[g]) {
        char w[TSR_STR_PATH + 64];
        fmt_loc(w, sizeof w, &P->group_at[g]);
        errat(P, &l, "duplicate group &%s (first opened at %s); put all its keys in one group", deck_group_name[g], w);
        parse_group(P, &L, &t, -1);
      } else {
        P->group_seen[g] = 1, P->group_at[g] = l;
        parse_group(P, &L, &t, g);
      }
      continue;
    }
    if (t.kind == T_BAD || t.unterminated) report_bad(P, &t);
    else errat(P, &l, "unexpected '%s' outside a group; a group starts with '&name' and ends with '/'", s);
    for (;;) { /* one message per stretch of junk: skip to the next group */
      lexer save = L;
      next_token(&L, &t);
      if (t.kind == T_EOF) return;
      if (t.kind == T_GROUP) { L = save; break; }
    }
  }
}

/* `group.key=value` from the command line, deck syntax for the value; a string key also
 * takes a bare word as it is. */
static void parse_override(parser *P, int argn, const char *arg) {
  P->argn = argn;
  loc_t l = {NULL, argn, 1, 1};
  char s[64];
  size_t len = strlen(arg);
  show(s, sizeof s, arg, len);
  const char *eq = strchr(arg, '=');
  size_t a = 0;
  while (arg[a] == ' ') a++;
  size_t b = eq ? (size_t)(eq - arg) : len;
  while (b > a && arg[b - 1] == ' ') b--;
  const char *dot = memchr(arg + a, '.', b - a);
  if (!eq || !dot) {
    int k = -1;
    for (int j = 0; j < deck_n_keys && !dot; j++)
      if (deck_ieq(deck_schema[j].name, arg + a, b - a)) k = j;
    if (k >= 0)
      errat(P, &l, "'%s' needs its group: write %s.%s=...", deck_schema[k].name, deck_group_name[deck_schema[k].group], deck_schema[k].name);
    else
      errat(P, &l, "expected group.key=value, got '%s'", s);
    return;
  }
  l.col = (int)a + 1;
  int g = deck_find_group(arg + a, (size_t)(dot - arg) - a);
  if (g < 0) { unknown_group(P, &l, arg + a, (size_t)(dot - arg) - a); return; }
  l.col = (int)(dot - arg) + 2;
  int k = deck_find_key(g, dot + 1, b - (size_t)(dot - arg) - 1);
  if (k < 0) { unknown_key(P, &l, g, dot + 1, b - (size_t)(dot - arg) - 1); return; }
  l.col = (int)a + 1;
  mark_set(P, k, &l);
  lexer L = {eq + 1, strlen(eq + 1), 0, 1, (int)(eq - arg) + 2};
  token key = {0};
  key.line = 1, key.col = l.col;
  const key_type kt = deck_schema[k].type;
  if (kt == K_STRING || kt == K_CHOICE || kt == K_SCOPE || kt == K_INT_AUTO || kt == K_STRLIST) {
    while (peekc(&L, 0) == ' ') adv(&L);
    if (peekc(&L, 0) != '\'' && peekc(&L, 0) != '"') {
      token t = {0};
      t.kind = T_VALUE, t.line = 1, t.col = L.col, t.count = 1;
      t.p = L.s + L.i, t.n = L.n - L.i;
      while (t.n > 0 && t.p[t.n - 1] == ' ') t.n--;
      assign(P, k, &t, 1);
      return;
    }
  }
  read_values(P, &L, k, &key);
}

/* ---------------------------------------------------------------- cross-field checks */

/* The key set last among ids[] (-1 when all are defaults): where a cross-field error goes. */
static int latest(const parser *P, const int *ids, int n) {
  int best = -1;
  for (int i = 0; i < n; i++)
    if (P->set_seq[ids[i]] && (best < 0 || P->set_seq[ids[i]] > P->set_seq[best])) best = ids[i];
  return best;
}
static int any_failed(const parser *P, const int *ids, int n) {
  for (int i = 0; i < n; i++)
    if (P->failed[ids[i]]) return 1;
  return 0;
}
/* "model.n_head = 6", plus " (set at file:5:3)" when it is not the key reported at. */
static const char *ref(const parser *P, int k, int rep, char *buf, size_t cap) {
  char v[VALBUF], w[TSR_STR_PATH + 64];
  deck_fmt_value(P->cfg, k, v, sizeof v);
  int n = snprintf(buf, cap, "%s.%s = %.100s", deck_group_name[deck_schema[k].group], deck_schema[k].name, v);
  if (k != rep && P->set_seq[k] && n > 0 && (size_t)n < cap) {
    fmt_loc(w, sizeof w, &P->set_at[k]);
    snprintf(buf + n, cap - (size_t)n, " (set at %s)", w);
  }
  return buf;
}

#define REF(i, k) ref(P, k, rep, r[i], sizeof r[i])
#define XERR(ids, ...)                                            \
  do {                                                            \
    int rep = latest(P, ids, (int)(sizeof ids / sizeof ids[0]));  \
    loc_t at = {0};                                               \
    if (any_failed(P, ids, (int)(sizeof ids / sizeof ids[0])))    \
      break;                                                      \
    if (rep >= 0) at = P->set_at[rep];                            \
    errat(P, &at, __VA_ARGS__);                                   \
  } while (0)

/* checkpoint.mpiio_hints is "key=value" items separated by commas (blanks around them
 * allowed): keys are letters, digits and '_', values are non-empty and blank-free.  Returns
 * 1 and why in buf when s is not of that form; "" is fine (no hints).  ckpt.c splits the
 * same way to build the MPI_Info. */
static int hints_bad(const char *s, char *buf, size_t cap) {
  for (int item = 1; *s; item++) {
    while (*s == ' ' || *s == '\t') s++;
    const char *key = s;
    while (is_alnum_((unsigned char)*s)) s++;
    size_t klen = (size_t)(s - key);
    while (*s == ' ' || *s == '\t') s++;
    if (!klen && *s == ',') {
      snprintf(buf, cap, "item %d is empty (two ',' in a row)", item);
      return 1;
    }
    if (!klen || *s != '=') {
      snprintf(buf, cap, "item %d ('%.40s') is not key=value with a key of letters, digits "
               "and '_'", item, key);
      return 1;
    }
    s++;
    while (*s == ' ' || *s == '\t') s++;
    const char *val = s;
    while (*s && *s != ',' && *s != ' ' && *s != '\t') s++;
    if (s == val) {
      snprintf(buf, cap, "item %d ('%.*s') has no value", item, (int)klen, key);
      return 1;
    }
    while (*s == ' ' || *s == '\t') s++;
    if (*s && *s != ',') {
      snprintf(buf, cap, "item %d ('%.*s') has a blank inside its value", item, (int)klen, key);
      return 1;
    }
    if (*s == ',' && !*++s) {
      snprintf(buf, cap, "a trailing ',' after item %d", item);
      return 1;
    }
  }
  return 0;
}

/* The layout rules (layout_check.c), each reported at the key of it set last, with the
 * others' places named. */
typedef struct {
  const parser *P;
  int rep; /* the key reported at */
} key_ctx;
static void key_ref(void *ctx, const tsr_config *cfg, const char *key, char *buf, size_t len) {
  const key_ctx *kc = ctx;
  const char *dot = strchr(key, '.');
  const int k = deck_find_key(deck_find_group(key, (size_t)(dot - key)), dot + 1, strlen(dot + 1));
  ref(kc->P, k, kc->rep, buf, len);
}
static void layout_checks(parser *P) {
  tsr_layout_issue is[TSR_LAYOUT_MAX_ISSUES];
  const int rpn = (int)P->cfg->parallel.ranks_per_node; /* 0: detected at run time */
  const int n = tsr_layout_check(P->cfg, P->world_size, rpn, is, TSR_LAYOUT_MAX_ISSUES);
  for (int i = 0; i < n && i < TSR_LAYOUT_MAX_ISSUES; i++) {
    int ids[TSR_LAYOUT_MAX_KEYS];
    for (int j = 0; j < is[i].n_keys; j++) {
      const char *key = is[i].keys[j], *dot = strchr(key, '.');
      ids[j] = deck_find_key(deck_find_group(key, (size_t)(dot - key)), dot + 1, strlen(dot + 1));
    }
    if (any_failed(P, ids, is[i].n_keys)) continue;
    key_ctx kc = {P, latest(P, ids, is[i].n_keys)};
    char text[4 * (TSR_STR_PATH + 200)];
    tsr_layout_issue_text(&is[i], P->cfg, key_ref, &kc, text, sizeof text);
    loc_t at = {0};
    if (kc.rep >= 0) at = P->set_at[kc.rep];
    errat(P, &at, "%s", text);
  }
}

/* A dataset's name: letters, digits, '_', '-', '.', not empty (metrics.jsonl's keys, the
 * log's words). */
static int name_ok(const char *s) {
  if (!s[0]) return 0;
  for (; *s; s++)
    if (!is_alnum_((unsigned char)*s) && *s != '-' && *s != '.') return 0;
  return 1;
}

/* The default name of a dataset: the last directory of its glob ('data/web/train_*.bin':
 * 'web'), else `fallback` (numbered when there are several). */
static void derived_name(const char *glob, const char *fallback, int i, int n, char *out,
                         size_t cap) {
  const char *end = strrchr(glob, '/');
  while (end && end > glob && end[-1] == '/') end--;
  const char *b = end;
  while (b && b > glob && b[-1] != '/') b--;
  const size_t len = end ? (size_t)(end - b) : 0;
  if (len && !(len == 1 && b[0] == '.') && !(len == 2 && b[0] == '.' && b[1] == '.'))
    snprintf(out, cap, "%.*s", (int)len, b);
  else if (n > 1)
    snprintf(out, cap, "%s%d", fallback, i + 1);
  else
    snprintf(out, cap, "%s", fallback);
}

/* &data's lists, for the training datasets (v = 0) and then the validation sets: no empty
 * glob among several, one weight and one name per glob (the defaults filled in: equal
 * weights, or the training weights for as many validation sets; each glob's directory),
 * weights of a positive sum, names that are names and differ. */
static void data_checks(parser *P) {
  tsr_data_config *d = &P->cfg->data;
  char r[2][TSR_STR_PATH + 200];
  for (int v = 0; v < 2; v++) {
    const int kg = deck_key_id(GI_data, v ? "valid" : "train"),
              kw = deck_key_id(GI_data, v ? "valid_weights" : "weights"),
              kn = deck_key_id(GI_data, v ? "valid_names" : "names");
    if (P->failed[kg]) continue;
    const int n = *deck_nval(P->cfg, kg);
    char(*glob)[TSR_STR_PATH] = v ? d->valid_glob : d->train_glob;
    char(*names)[TSR_SET_NAME] = v ? d->valid_names : d->names;
    double *w = v ? d->valid_weights : d->weights;
    int *nw = deck_nval(P->cfg, kw), *nn = deck_nval(P->cfg, kn);
    for (int i = 0; i < n && n > 1; i++)
      if (!glob[i][0]) {
        int ids[] = {kg};
        XERR(ids, "data.%s value %d is empty: each dataset of a list needs a path or glob",
             deck_schema[kg].name, i + 1);
      }
    if (!P->set_seq[kw]) {
      const int as_train = v && n == d->n_train && !P->failed[deck_key_id(GI_data, "weights")];
      for (int i = 0; i < n; i++) w[i] = as_train ? d->weights[i] : 1.0;
      *nw = n;
    } else if (!P->failed[kw] && *nw != n) {
      int ids[] = {kg, kw};
      XERR(ids, "data.%s has %d value%s but data.%s has %d: give one weight per dataset (%s)",
           deck_schema[kg].name, n, n > 1 ? "s" : "", deck_schema[kw].name, *nw,
           REF(0, kg));
    } else if (!P->failed[kw]) {
      double sum = 0;
      for (int i = 0; i < n; i++) sum += w[i];
      if (!(sum > 0)) {
        int ids[] = {kw};
        XERR(ids, "data.%s sum to 0: give at least one dataset a weight > 0 (the weights are "
             "shares of the samples, normalised by their sum)", deck_schema[kw].name);
      }
    }
    if (!P->set_seq[kn]) {
      for (int i = 0; i < n; i++)
        derived_name(glob[i], v ? "valid" : "train", i, n, names[i], TSR_SET_NAME);
      *nn = n;
      for (int i = 0; i < n; i++) {
        if (!name_ok(names[i])) {
          int ids[] = {kg};
          XERR(ids, "the name '%.*s' taken from the directory of data.%s value %d is not a "
               "name (letters, digits, '_', '-', '.'): set data.%s", TSR_SET_NAME - 1, names[i],
               deck_schema[kg].name, i + 1, deck_schema[kn].name);
          break;
        }
        for (int j = 0; j < i; j++)
          if (!strcmp(names[i], names[j])) {
            int ids[] = {kg};
            XERR(ids, "data.%s values %d and %d are both in a directory named '%s': set "
                 "data.%s to tell them apart (%s)", deck_schema[kg].name, j + 1, i + 1,
                 names[i], deck_schema[kn].name, REF(0, kg));
            i = n;
            break;
          }
      }
    } else if (!P->failed[kn] && *nn != n) {
      int ids[] = {kg, kn};
      XERR(ids, "data.%s has %d value%s but data.%s has %d: give one name per dataset (%s)",
           deck_schema[kg].name, n, n > 1 ? "s" : "", deck_schema[kn].name, *nn, REF(0, kg));
    } else if (!P->failed[kn]) {
      for (int i = 0; i < n; i++) {
        int bad = !name_ok(names[i]);
        for (int j = 0; j < i && !bad; j++) bad = !strcmp(names[i], names[j]) ? 2 : 0;
        if (bad) {
          int ids[] = {kn};
          XERR(ids, "data.%s value %d '%s' %s", deck_schema[kn].name, i + 1, names[i],
               bad == 2 ? "is given twice: each dataset needs its own name"
                        : "is not a name: use letters, digits, '_', '-', '.'");
          break;
        }
      }
    }
  }
}

static void cross_checks(parser *P) {
  tsr_config *c = P->cfg;
  char r[3][TSR_STR_PATH + 200];
  const int lr = deck_key_id(GI_optim, "lr"), min_lr = deck_key_id(GI_optim, "min_lr"),
            warm = deck_key_id(GI_optim, "warmup_steps"),
            dsteps = deck_key_id(GI_optim, "decay_steps");
  /* gpt2's head is the embedding unless the deck unties it; llama's is its own unless tied */
  if (!P->set_seq[deck_key_id(GI_model, "tie_embeddings")] && c->model.arch == TSR_ARCH_GPT2)
    c->model.tie_embeddings = 1;
  layout_checks(P);
  data_checks(P);
  if (!c->run.out_dir[0]) { /* the log, metrics.jsonl and ckpt/ go there */
    int ids[] = {deck_key_id(GI_run, "out_dir")};
    XERR(ids, "run.out_dir is empty: name the directory for the log, metrics.jsonl and ckpt/ "
         "(e.g. 'out/%s'; '.' for the current one)", c->run.name[0] ? c->run.name : "run");
  }
  if (hints_bad(c->checkpoint.mpiio_hints, r[0], sizeof r[0])) {
    int ids[] = {deck_key_id(GI_checkpoint, "mpiio_hints")};
    XERR(ids, "checkpoint.mpiio_hints: %s; write 'key=value,key=value' (e.g. "
         "'romio_cb_write=enable,cb_buffer_size=16777216')", r[0]);
  }
  for (int k = 0; k < 2; k++) { /* exact scaling: the gradients are divided by it */
    const double x = k ? c->train.min_loss_scale : c->train.loss_scale;
    int e;
    if (frexp(x, &e) != 0.5) {
      int ids[] = {deck_key_id(GI_train, k ? "min_loss_scale" : "loss_scale")};
      XERR(ids, "train.%s = %g is not a power of two (e.g. %g); the gradients are divided by "
           "the loss scale, which is exact only for powers of two",
           k ? "min_loss_scale" : "loss_scale", x, ldexp(1.0, e - 1));
    }
  }
  if (c->checkpoint.every_steps == TSR_EVERY_AUTO && !(c->checkpoint.mtbf_hours > 0)) {
    int ids[] = {deck_key_id(GI_checkpoint, "every_steps"),
                 deck_key_id(GI_checkpoint, "mtbf_hours")};
    XERR(ids, "checkpoint.every_steps = 'auto' needs checkpoint.mtbf_hours > 0, the job's "
         "mean time between failures in hours, from which the interval sqrt(2 x checkpoint "
         "cost x MTBF) is found (now %s)", REF(0, ids[1]));
  }
  const int seq = deck_key_id(GI_model, "seq_len"), maxpos = deck_key_id(GI_model, "max_positions");
  if (c->model.max_positions > 0 && c->model.seq_len > c->model.max_positions) {
    int ids[] = {seq, maxpos};
    XERR(ids, "%s is larger than %s, the model's context%s", REF(0, seq), REF(1, maxpos),
         c->model.arch == TSR_ARCH_GPT2 ? " (the rows of gpt2's pos_embed)" : "");
  }
  if (c->model.rope_scaling == TSR_ROPE_SCALING_LLAMA3) {
    const int sc = deck_key_id(GI_model, "rope_scaling"), arch = deck_key_id(GI_model, "arch"),
              lo = deck_key_id(GI_model, "rope_low_freq_factor"),
              hi = deck_key_id(GI_model, "rope_high_freq_factor");
    if (c->model.arch != TSR_ARCH_LLAMA) {
      int ids[] = {sc, arch};
      XERR(ids, "%s needs RoPE, which %s has not (learned positions)", REF(0, sc), REF(1, arch));
    }
    if (!(c->model.rope_low_freq_factor < c->model.rope_high_freq_factor)) {
      int ids[] = {lo, hi};
      XERR(ids, "%s must be smaller than %s (Llama 3.1: 1 and 4): the band between "
           "rope_original_context / high and / low is interpolated", REF(0, lo), REF(1, hi));
    }
  }
  if (c->checkpoint.init_from[0] && c->checkpoint.resume[0] &&
      strcmp(c->checkpoint.resume, "auto") && strcmp(c->checkpoint.resume, "none")) {
    int ids[] = {deck_key_id(GI_checkpoint, "init_from"), deck_key_id(GI_checkpoint, "resume")};
    XERR(ids, "%s and %s both name weights to start from: init_from starts a new run from a "
         "checkpoint's weights, resume continues a run; keep one (resume = 'auto' with "
         "init_from resumes this run's own checkpoint when there is one, else starts from "
         "init_from)", REF(0, ids[0]), REF(1, ids[1]));
  }
  if (c->data.eos_id >= c->model.vocab_size) {
    int ids[] = {deck_key_id(GI_data, "eos_id"), deck_key_id(GI_model, "vocab_size")};
    XERR(ids, "%s is not a token of the model's vocabulary (%s): set it to the end-of-document "
         "id of the shards' tokenizer, or -1 to take the tokenizer's", REF(0, ids[0]),
         REF(1, ids[1]));
  }
  if (c->optim.min_lr > c->optim.lr) {
    int ids[] = {min_lr, lr};
    XERR(ids, "%s is larger than %s", REF(0, min_lr), REF(1, lr));
  }
  if (c->optim.decay_steps > 0 && c->optim.warmup_steps > c->optim.decay_steps) {
    int ids[] = {warm, dsteps};
    XERR(ids, "%s is larger than %s", REF(0, warm), REF(1, dsteps));
  }
}

/* ---------------------------------------------------------------- public API */

int tsr_deck_parse(tsr_config *cfg, const char *text, size_t len, const char *filename,
                   int n_overrides, char **overrides, int world_size, char *errbuf,
                   size_t errlen) {
  parser P;
  memset(&P, 0, sizeof P);
  tsr_deck_defaults(cfg);
  P.cfg = cfg, P.eb = errbuf, P.el = errlen;
  P.fname = filename ? filename : "<deck>";
  P.world_size = world_size > 0 ? world_size : 1;
  if (errbuf && errlen) errbuf[0] = 0;
  parse_file(&P, text, len);
  for (int i = 0; i < n_overrides && overrides; i++)
    if (overrides[i]) parse_override(&P, i + 1, overrides[i]);
  P.argn = 0;
  cross_checks(&P);
  return P.nerr ? TSR_ERR_INPUT : TSR_OK;
}

/* Does the text open any group (&name)? */
static int has_group(const char *text, size_t len) {
  lexer L = {text, len, 0, 1, 1};
  for (token t;;) {
    next_token(&L, &t);
    if (t.kind == T_EOF) return 0;
    if (t.kind == T_GROUP) return 1;
  }
}

int tsr_deck_load(tsr_config *cfg, const char *path, int n_overrides, char **overrides,
                  int world_size) {
  struct stat st;
  const int have_st = stat(path, &st) == 0;
  if (have_st && S_ISDIR(st.st_mode)) {
    fprintf(stderr, "%s: is a directory, not a deck (a namelist file such as input/tiny.nml)\n",
            path);
    return TSR_ERR_INPUT;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot open: %s\n", path, strerror(errno));
    return TSR_ERR_INPUT;
  }
  size_t cap = 1 << 16, len = 0, got;
  char *text = malloc(cap);
  while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap && cap < ((size_t)64 << 20)) {
      char *grown = realloc(text, cap * 2);
      if (!grown) free(text);
      text = grown, cap *= 2;
    } else if (len == cap) {
      break;
    }
  }
  int rerr = ferror(f);
  fclose(f);
  if (!text || rerr || len == cap) {
    fprintf(stderr, "%s: cannot read: %s\n", path, !text ? "out of memory" : rerr ? "read error" : "file too large (64 MiB at most)");
    free(text);
    return TSR_ERR_INPUT;
  }
  /* a regular file with no group in it is a mistake (an empty or truncated deck, another
   * file); /dev/null is the way to train on the defaults and the overrides alone */
  if (have_st && S_ISREG(st.st_mode) && !has_group(text, len)) {
    fprintf(stderr, "%s:1:1: %s: a deck needs at least one group (&run ... /, &model ... /); "
            "to train on the built-in defaults and the command line's overrides alone, give "
            "/dev/null as the deck\n", path, len ? "no group in this deck" : "the deck is empty");
    free(text);
    return TSR_ERR_INPUT;
  }
  size_t errlen = 16384;
  char *errbuf = malloc(errlen);
  int rc = tsr_deck_parse(cfg, text, len, path, n_overrides, overrides, world_size, errbuf,
                          errbuf ? errlen : 0);
  if (rc && errbuf) fputs(errbuf, stderr);
  free(errbuf);
  free(text);
  return rc;
}
