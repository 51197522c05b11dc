/* tokenizer.h — text in and out of token ids with the tokenizer that made a run's token
 * shards: tessera generate and the trainer's sample line (generate.h).
 *
 * The shard header names the tokenizer (docs/formats.md "Token shard header"):
 *   "bytes"     a token is one byte of the text; id 0 ends a document;
 *   "spm:NAME"  the SentencePiece model DIR/NAME.model that tools/tsr-prepare wrote beside
 *               the shards (DIR: the first shard's directory); its </s> ends a document.
 * Text is encoded as tsr-prepare encodes it: spm line by line, with the model's <0x0A>
 * byte piece between lines.  spm needs the SentencePiece library (configure finds it);
 * without it an spm tokenizer is an input error that says so. */
#ifndef TSR_TOKENIZER_H
#define TSR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tsr_tokenizer tsr_tokenizer;

/* The tokenizer of the shards matching `pattern` (a path or a glob), for a model of
 * model_vocab ids (the header's vocabulary must fit in it).  TSR_ERR_INPUT, reported,
 * when the shards, the model file or the library are missing. */
int tsr_tokenizer_open(tsr_tokenizer **out, const char *pattern, int64_t model_vocab);
void tsr_tokenizer_close(tsr_tokenizer **t);

const char *tsr_tokenizer_name(const tsr_tokenizer *t); /* "bytes", "spm:NAME" */
int64_t tsr_tokenizer_vocab(const tsr_tokenizer *t);    /* its ids are [0, vocab) */
/* The token a context starts with: the end-of-document id, which precedes every document
 * of the training stream (spm without </s>: id 0). */
int32_t tsr_tokenizer_start(const tsr_tokenizer *t);

/* The end-of-document id of the shards matching `pattern`, which document masking
 * (data.document_mask) splits the training sequences at: 0 for 'bytes', the SentencePiece
 * model's </s> for 'spm:NAME' (which needs the model beside the shards and the library).
 * TSR_ERR_INPUT, reported, when it cannot be known (data.eos_id then names it). */
int tsr_tokenizer_eos(const char *pattern, int64_t model_vocab, int32_t *eos);

/* text[0..len) into *ids (tsr_calloc'd, *n of them; free with tsr_free). */
int tsr_tokenizer_encode(const tsr_tokenizer *t, const char *text, size_t len, int32_t **ids,
                         int64_t *n);
/* ids into text (tsr_calloc'd, NUL-terminated, *len bytes; free it with tsr_free, after a
 * failure too): bytes as they are, spm pieces decoded; each end-of-document id becomes a
 * '\n'; ids outside the vocabulary are left out. */
int tsr_tokenizer_decode(const tsr_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                         size_t *len);

#endif
