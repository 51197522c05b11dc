/* generate.h — text from the model: `tessera generate` and the trainer's sample line
 * (docs/architecture.md "Sampling").
 *
 * Both run the model's forward on the context, left-truncated to model.seq_len, for every
 * new token (no key/value cache: each token costs a forward of up to seq_len tokens), take
 * the logits of the context's last position and pick the next token: the largest logit
 * (temperature 0), or a draw from softmax(logits / temperature), optionally over the
 * top_k largest only, with the counter-based RNG (util.h) keyed by the seed and indexed
 * by the token's number, so a seed gives the same text on every run.  A context starts
 * with the tokenizer's end-of-document token (tokenizer.h), as every document of the
 * training stream does; only ids of the tokenizer's vocabulary are picked. */
#ifndef TSR_GENERATE_H
#define TSR_GENERATE_H

#include <mpi.h>
#include <stddef.h>

#include "session.h"

/* The file behind a deck argument (a path, or an installed deck's name): the driver's
 * tsr_deck_path (deckpath.h); 0 or TSR_ERR_INPUT after saying why. */
typedef int (*tsr_deck_finder)(const char *arg, char *path, size_t cap);

/* tessera generate DECK [options] [group.key=value ...] (argv[0] is the first argument
 * after the word "generate"; find_deck may be NULL: DECK is a path).  Rank 0 of world loads
 * checkpoint.resume (any layout) into one rank's model (tp = pp = dp = 1, one sequence)
 * and prints the text; the other ranks wait, sleeping, for its exit code, which every
 * rank returns. */
int tsr_generate_main(int argc, char **argv, MPI_Comm world, tsr_deck_finder find_deck);

/* run.sample_every: 32 greedy tokens continuing run.sample_prompt on the session's model,
 * logged by rank 0 as one line "sample: <text>" (the prompt and the continuation, control
 * characters escaped).  Every rank calls it (the forward is collective over tp and ZeRO's
 * groups); with a pipeline (pp > 1) it is skipped, said once in the log. */
int tsr_generate_train_sample(tsr_session *s);

#endif
