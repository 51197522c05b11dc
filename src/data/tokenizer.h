/* tokenizer.h — text in and out of token ids with the tokenizer that made a run's token
 * shards: tessera generate and the trainer's sample line (generate.h).
 *
 * The shard header names the tokenizer (docs/formats.md "Token shard header"):
 *   "bytes"     a token is one byte of the text; id 0 ends a document;
 *   "spm:NAME"  the SentencePiece model DIR/NAME.model that tools/tsr-prepare wrote beside
 *               the shards (DIR: the first shard's directory); its </s> ends a document;
 *   "hf:FILE"   the Hugging Face tokenizer DIR/FILE (a tokenizer.json; byte-level BPE,
 *               bpe.h), its end of document the eos_token of DIR/tokenizer_config.json.
 * The files a tokenizer reads are its "files": read from DIR, or from a checkpoint, which
 * carries them (ckpt.h), they open the same tokenizer.  Text is encoded as tsr-prepare
 * encodes it: spm line by line, with the model's <0x0A> byte piece between lines; hf as
 * the tokenizers library without special tokens.  spm needs the SentencePiece library
 * (configure finds it); without it an spm tokenizer is an input error that says so. */
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

/* One file of a tokenizer, in memory: its name (no directory) and bytes. */
typedef struct {
  char name[256];
  unsigned char *bytes; /* tsr_calloc'd */
  size_t len;
} tsr_tokenizer_file;

/* The files tokenizer `name` reads from directory dir: none for "bytes", NAME.model for
 * "spm:NAME", FILE and (when there) tokenizer_config.json for "hf:FILE".  *files is
 * tsr_calloc'd (*n of them; NULL when none); free with tsr_tokenizer_files_free.
 * TSR_ERR_INPUT, reported (`whose` says whose tokenizer it is), when one it needs is
 * missing or the name is unknown. */
int tsr_tokenizer_read_files(const char *name, const char *dir, const char *whose,
                             tsr_tokenizer_file **files, int *n);
void tsr_tokenizer_files_free(tsr_tokenizer_file **files, int n);
/* The files of the tokenizer of the shards matching `pattern`: its name into
 * name[0..len) and the files as tsr_tokenizer_read_files reads them. */
int tsr_tokenizer_shard_files(const char *pattern, int64_t model_vocab, char *name, size_t len,
                              tsr_tokenizer_file **files, int *n);
/* Tokenizer `name` from its files (as tsr_tokenizer_read_files gives them); `whose` names
 * where they came from in errors.  TSR_ERR_INPUT, reported, as tsr_tokenizer_open. */
int tsr_tokenizer_open_files(tsr_tokenizer **out, const char *name,
                             const tsr_tokenizer_file *files, int n, int64_t model_vocab,
                             const char *whose);
/* The tokenizer in a file the user names (--tokenizer PATH): "bytes"; a SentencePiece
 * NAME.model (tokenizer "spm:NAME"); or a Hugging Face FILE.json (tokenizer "hf:FILE.json",
 * with tokenizer_config.json beside it when there). */
int tsr_tokenizer_open_path(tsr_tokenizer **out, const char *path, int64_t model_vocab);

const char *tsr_tokenizer_name(const tsr_tokenizer *t); /* "bytes", "spm:NAME", "hf:FILE" */
int64_t tsr_tokenizer_vocab(const tsr_tokenizer *t);    /* its ids are [0, vocab) */
/* The token a context starts with: the end-of-document id, which precedes every document
 * of the training stream (spm without </s>: id 0). */
int32_t tsr_tokenizer_start(const tsr_tokenizer *t);

/* The end-of-document id of the shards matching `pattern`, which document masking
 * (data.document_mask) splits the training sequences at: 0 for 'bytes', the SentencePiece
 * model's </s> for 'spm:NAME' (which needs the model beside the shards and the library),
 * the eos_token of tokenizer_config.json for 'hf:FILE'.  TSR_ERR_INPUT, reported, when it
 * cannot be known (data.eos_id then names it). */
int tsr_tokenizer_eos(const char *pattern, int64_t model_vocab, int32_t *eos);
/* The same of an open tokenizer: -1 when it has none. */
int32_t tsr_tokenizer_eod(const tsr_tokenizer *t);

/* text[0..len) into *ids (tsr_calloc'd, *n of them; free with tsr_free). */
int tsr_tokenizer_encode(const tsr_tokenizer *t, const char *text, size_t len, int32_t **ids,
                         int64_t *n);
/* ids into text (tsr_calloc'd, NUL-terminated, *len bytes; free it with tsr_free, after a
 * failure too): bytes as they are, spm and hf tokens decoded; each end-of-document id
 * becomes a '\n'; ids outside the vocabulary are left out. */
int tsr_tokenizer_decode(const tsr_tokenizer *t, const int32_t *ids, int64_t n, char **text,
                         size_t *len);

#endif
