#!/usr/bin/env bash
# run-tests.sh — install, build and run the whole test suite (make check); ends with
# the line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")"
./build.sh || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }
make -j"$(nproc)" check
rc=$?
pass=0; fail=0
for t in $(find tests -name '*.trs'); do
  r=$(sed -n 's/^:test-result: //p' "$t")
  case "$r" in
    PASS|XFAIL) pass=$((pass+1)) ;;
    FAIL|XPASS|ERROR) fail=$((fail+1)); echo "failed: ${t%.trs} (see ${t%.trs}.log)" ;;
    SKIP) echo "skipped: ${t%.trs} ($(grep -m1 -i skip "${t%.trs}.log" || true))" ;;
  esac
done
# the slowest scripts of this run (tests/timed.sh ends each log with its duration)
echo "slowest tests:"
for l in $(find tests -name '*.log'); do
  d=$(sed -n 's/^duration: \([0-9]*\) s$/\1/p' "$l" | tail -1)
  [ -n "$d" ] && echo "$d ${l%.log}"
done | sort -rn | head -12 | awk '{ printf "  %5d s  %s\n", $1, $2 }'
skip=$(grep -l '^:test-result: SKIP' $(find tests -name '*.trs') 2>/dev/null | wc -l)
[ $rc -ne 0 ] && [ $fail -eq 0 ] && fail=1
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
