/* bpe.h — Hugging Face byte-level BPE tokenizers (a tokenizer.json of GPT-2 or Llama 3
 * style) in C, for the "hf:FILE" tokenizer of tokenizer.h; docs/formats.md "Hugging Face
 * tokenizers in C" says what is supported and where it may differ from the tokenizers
 * library.
 *
 * What a file must be: model.type "BPE" with vocab and merges (each merge "a b" or
 * ["a", "b"]), no normalizer, a pre-tokenizer that is ByteLevel or a Sequence of a Split
 * on the GPT-2 or the Llama 3 pattern and a ByteLevel, and a ByteLevel decoder.  Any other
 * is refused with the reason. */
#ifndef TSR_BPE_H
#define TSR_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct tsr_bpe tsr_bpe;

/* The tokenizer in json[0..len) (a tokenizer.json).  On failure returns nonzero with the
 * reason in err. */
int tsr_bpe_load(tsr_bpe **out, const char *json, size_t len, char *err, size_t errlen);
void tsr_bpe_free(tsr_bpe **p);

int64_t tsr_bpe_vocab(const tsr_bpe *p); /* one more than the largest id */
/* The id of a token (vocabulary or added token), or -1. */
int32_t tsr_bpe_token_id(const tsr_bpe *p, const char *token, size_t len);
/* The end-of-document id the tokenizer_config.json in cfg[0..len) names (eos_token), or
 * when cfg is NULL or names none that is a token, the first of <|endoftext|>,
 * <|end_of_text|>, </s>, <eos>, <|eos|> that is one (tools/tsr-prepare's rule); -1. */
int32_t tsr_bpe_eos(const tsr_bpe *p, const char *cfg, size_t len);

/* text[0..len) into ids as the library's encode(text, add_special_tokens=False): added
 * tokens first, then the pre-tokenizer's pieces, each through the merges.  *ids is
 * malloc'd (*n of them; free()). */
int tsr_bpe_encode(const tsr_bpe *p, const char *text, size_t len, int32_t **ids, int64_t *n);
/* ids into text as the library's decode(ids) (special tokens skipped, invalid UTF-8
 * replaced by U+FFFD): a malloc'd NUL-terminated string of *len bytes, or NULL when out
 * of memory.  Ids that are no token are left out. */
char *tsr_bpe_decode(const tsr_bpe *p, const int32_t *ids, int64_t n, size_t *len);

#endif
