/* spm_shim.h — the few SentencePiece calls the tokenizer needs, as plain C.
 *
 * SentencePiece is a C++ library; src/data/spm_shim.cc wraps one processor behind these
 * functions.  It is built only when configure finds the library (TSR_HAVE_SENTENCEPIECE in
 * tsr_build.h); tokenizer.c is the one caller and says what to do without it. */
#ifndef TSR_SPM_SHIM_H
#define TSR_SPM_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_spm tsr_spm;

/* Load a model from the bytes of its file (NAME.model) in memory.  On failure returns
 * nonzero with the library's reason in err. */
int tsr_spm_load_bytes(tsr_spm **out, const void *bytes, size_t len, char *err, size_t errlen);
void tsr_spm_free(tsr_spm **p);

int tsr_spm_pieces(const tsr_spm *p);                    /* vocabulary size */
int tsr_spm_eos(const tsr_spm *p);                       /* </s>, or -1 when absent */
int tsr_spm_piece_id(const tsr_spm *p, const char *piece); /* -1 when absent */

/* One line of text (no '\n') into ids: a malloc'd array of *n ids, or NULL on failure. */
int32_t *tsr_spm_encode(const tsr_spm *p, const char *text, size_t len, int64_t *n);
/* ids into text: a malloc'd NUL-terminated string (*len bytes) or NULL on failure. */
char *tsr_spm_decode(const tsr_spm *p, const int32_t *ids, int64_t n, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
