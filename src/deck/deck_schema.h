/* deck_schema.h — the deck's schema as the parser (deck.c) and the schema's own code
 * (deck_schema.c) share it.  Internal to the deck: the rest of the code reads the config
 * (config.h) and calls deck.h. */
#ifndef TSR_DECK_SCHEMA_H
#define TSR_DECK_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

enum { GI_run, GI_model, GI_parallel, GI_train, GI_optim, GI_data, GI_checkpoint, GI_hardware,
       N_GROUP };
extern const char *const deck_group_name[N_GROUP];

/* K_CHOICE keys are stored as the index of their word in `choices` (the enums of
 * config.h list them in the same order); K_SCOPE is shard_scope: TSR_SHARD_GLOBAL,
 * TSR_SHARD_NODE or a number of ranks, written 'global', 'node' or '8'; K_INT_AUTO is an
 * integer within the bounds or 'auto', stored as TSR_EVERY_AUTO (checkpoint.every_steps);
 * K_LOGI_AUTO is a logical or 'auto', stored as 1, 0 or TSR_LOGI_AUTO (checkpoint.async).
 * K_STRLIST and K_REALLIST take 1 to TSR_MAX_DATASETS values (`a = 'x', 'y'`): an array
 * of TSR_MAX_DATASETS strings (each size / TSR_MAX_DATASETS bytes) or doubles, and an int
 * at count_off holding how many were given; at_off, where not 0, is an array of
 * TSR_DECK_LOC texts that receives where each value was given. */
typedef enum { K_INT, K_REAL, K_LOGICAL, K_STRING, K_CHOICE, K_SCOPE, K_INT_AUTO,
               K_LOGI_AUTO, K_STRLIST, K_REALLIST } key_type;
enum { LO = 1, HI = 2, LO_OPEN = 4, HI_OPEN = 8 }; /* which bounds apply, and open ends */

typedef struct {
  int group;
  const char *name;
  key_type type;
  size_t offset, size;
  const char *def;     /* default as text: "1234", "3e-4", ".false.", unquoted strings */
  double lo, hi;       /* numeric bounds, see `bounds` */
  int bounds;
  const char *choices; /* "a|b|c": enforced for K_CHOICE, shown for K_STRING and K_SCOPE */
  const char *help;
  size_t count_off, at_off; /* lists only */
} key_def;

extern const key_def deck_schema[];
extern const int deck_n_keys; /* at most DECK_MAX_KEYS (checked where the schema is) */
#define DECK_MAX_KEYS 160

/* Value buffers: always fit a quoted string (2*TSR_STR_PATH + 4), or a list of them. */
#define VALBUF (TSR_MAX_DATASETS * (2 * TSR_STR_PATH + 4) + 8)

int deck_lower(int c);
int deck_ieq(const char *a, const char *p, size_t n); /* a equals p[0..n), ignoring case */
int deck_find_group(const char *p, size_t n);           /* -1: none */
int deck_find_key(int g, const char *p, size_t n);      /* -1: none */
int deck_key_id(int g, const char *name);
/* key k's field in c */
int64_t *deck_ival(tsr_config *c, int k);
double *deck_rval(tsr_config *c, int k);
int *deck_lval(tsr_config *c, int k);
char *deck_sval(tsr_config *c, int k);
/* a list key's count of values, its element i (string, real), its element size */
int *deck_nval(tsr_config *c, int k);
char *deck_sval_at(tsr_config *c, int k, int i);
size_t deck_elem_size(int k);
int deck_is_list(int k);
/* word i of a choice list "a|b|c" into buf (empty when there is none); the index of word
 * v[0..n) in it (case-insensitive), or -1 */
void deck_choice_word(const char *choices, int i, char *buf, size_t cap);
int deck_choice_index(const char *choices, const char *v, size_t n);
/* key k's value in deck syntax; a key's allowed range ("[1, 1024]", ">= 0", "(0, 1]");
 * whether v is in it */
void deck_fmt_value(const tsr_config *c, int k, char *buf, size_t cap);
void deck_fmt_range(char *buf, size_t cap, const key_def *d);
int deck_in_range(const key_def *d, double v);

#endif
