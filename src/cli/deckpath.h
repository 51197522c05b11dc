/* deckpath.h — the file behind the deck argument of `tessera`, `tessera eval` and
 * `tessera plan`: a path as given, or an installed deck found by name (`tessera llama1b`).
 *
 * A deck name NAME (or NAME.nml) is looked for as NAME.nml in, in this order:
 *   1. $TESSERA_DATADIR/input, when TESSERA_DATADIR is set and not empty;
 *   2. the input/ directory of the data installed beside the binary: the configured
 *      relation of bindir to pkgdatadir applied to the directory the running binary is
 *      in (/p/bin/tessera -> /p/share/tessera/input), so a prefix that was moved, or
 *      installed with `make install prefix=...`, still finds its decks;
 *   3. the configured $(pkgdatadir)/input (TSR_PKGDATADIR, set by Makefile.am).
 * Only the deck itself is looked up: the relative paths inside it (data.train,
 * run.out_dir, checkpoint.dir) stay relative to the current directory.  Rank 0 only. */
#ifndef TSR_DECKPATH_H
#define TSR_DECKPATH_H

#include <stddef.h>
#include <stdio.h>

/* The file to read for the deck argument ARG, written to OUT (CAP bytes):
 *   - ARG names something that exists and is not a directory: ARG itself;
 *   - ARG holds a '/': ARG itself, even when missing (the deck reader then says so);
 *   - otherwise ARG is a deck name, looked up as above.
 * Returns 0, or TSR_ERR_INPUT after printing "error: ..." with every place it looked and
 * the decks found there. */
int tsr_deck_path(const char *arg, char *out, size_t cap);

/* `tessera plan ARGS`: the deck among ARGV[0..ARGC) is the first argument that does not
 * start with '-', holds no '=' and is not the value of one of plan's options, and that
 * tsr_deck_path resolves without a message; it is replaced in ARGV by its path, kept in
 * OUT.  The first such argument is the one reported when none resolves.  No candidate
 * (`tessera plan --help`): ARGV is left alone.  Returns 0 or TSR_ERR_INPUT. */
int tsr_deck_path_args(int argc, char **argv, char *out, size_t cap);

/* One line for --help: where deck names are looked up. */
void tsr_deck_path_usage(FILE *out);

#endif
