#!/usr/bin/env bash
# fuzz_deck.sh — libFuzzer + AddressSanitizer + UBSan on the deck parser for a bounded
# time (FUZZ_SECONDS, default 30), seeded with the shipped decks.  Any crash, leak,
# out-of-bounds access or undefined behaviour fails the test.  Skips (77) without clang's
# libFuzzer runtime.  `make fuzz FUZZ_SECONDS=600` runs a longer campaign.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
command -v clang >/dev/null || skip "clang not installed"
scratch
# the runtime first: without it the test skips; with it, a failing build of the parser fails
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' >"$SCRATCH/probe.c"
clang -fsanitize=fuzzer,address,undefined -o "$SCRATCH/probe" "$SCRATCH/probe.c" \
  >"$SCRATCH/probe.log" 2>&1 || { cat "$SCRATCH/probe.log"; skip "libFuzzer runtime not available"; }
# the deck parser and what it links: its schema, the layout rules it checks (with the
# layer split of pipeline.c and the schedules of src/sched/), util
clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$top_srcdir/src" -I"$top_builddir/src" -o "$SCRATCH/fuzz_deck" \
  "$top_srcdir/tests/unit/deck/fuzz_deck.c" "$top_srcdir/src/deck/deck.c" "$top_srcdir/src/deck/deck_schema.c" \
  "$top_srcdir/src/deck/layout_check.c" "$top_srcdir"/src/sched/*.c "$top_srcdir/src/core/util.c" -lm \
  >"$SCRATCH/build.log" 2>&1
rc=$?
[ $rc -eq 0 ] || cat "$SCRATCH/build.log"
check "the deck parser builds with libFuzzer, ASan and UBSan" test $rc -eq 0
[ $rc -eq 0 ] || finish
mkdir -p "$SCRATCH/corpus"
cp "$top_srcdir"/input/*.nml "$SCRATCH/corpus/"
(cd "$SCRATCH" && ./fuzz_deck -max_total_time="${FUZZ_SECONDS:-30}" -max_len=4096 \
  -print_final_stats=1 corpus) >"$SCRATCH/fuzz.log" 2>&1
rc=$?
grep -E "stat::number_of_executed_units|stat::peak_rss_mb|ERROR|SUMMARY" "$SCRATCH/fuzz.log"
check "deck parser survives ${FUZZ_SECONDS:-30} s of libFuzzer with ASan+UBSan" test $rc -eq 0
[ $rc -eq 0 ] || tail -40 "$SCRATCH/fuzz.log"
finish
