/* json.h — a small JSON reader (RFC 8259) into a tree, for the files of other tools that
 * tessera reads: a Hugging Face tokenizer.json and its tokenizer_config.json
 * (src/data/bpe.c).
 *
 * The whole text is parsed at once; strings are decoded to UTF-8 (\uXXXX escapes and
 * surrogate pairs included; a lone surrogate becomes U+FFFD), numbers kept as doubles.
 * Objects keep their members in file order; a key given twice is kept twice and
 * tsr_json_get finds the first.  Nesting deeper than TSR_JSON_MAX_DEPTH is refused. */
#ifndef TSR_JSON_H
#define TSR_JSON_H

#include <stddef.h>

#define TSR_JSON_MAX_DEPTH 256

typedef enum {
  TSR_JSON_NULL,
  TSR_JSON_FALSE,
  TSR_JSON_TRUE,
  TSR_JSON_NUMBER,
  TSR_JSON_STRING,
  TSR_JSON_ARRAY,
  TSR_JSON_OBJECT
} tsr_json_type;

typedef struct tsr_json {
  tsr_json_type type;
  size_t n;               /* string: its bytes; array, object: its members */
  double num;             /* number */
  char *str;              /* string: NUL-terminated (it may hold NULs: n counts them) */
  char *key;              /* a member of an object: its key, NUL-terminated */
  size_t key_len;
  struct tsr_json *items; /* array, object: the n members */
} tsr_json;

/* Parse text[0..len) into *out (free it with tsr_json_free).  On failure returns nonzero
 * with the reason and the byte offset in err, and *out is NULL. */
int tsr_json_parse(const char *text, size_t len, tsr_json **out, char *err, size_t errlen);
void tsr_json_free(tsr_json **j);

/* The member `key` of an object, or NULL (j NULL or not an object, or no such member). */
const tsr_json *tsr_json_get(const tsr_json *j, const char *key);
/* j's string, or NULL when j is NULL or not a string. */
const char *tsr_json_str(const tsr_json *j);

#endif
