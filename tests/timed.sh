#!/usr/bin/env bash
# timed.sh SCRIPT [ARGS] — runs a test script and ends its log with how long it took
# ("duration: N s"), so that run-tests.sh can list the slowest tests of a run.
start=$(date +%s)
bash "$@"
rc=$?
echo "duration: $(( $(date +%s) - start )) s"
exit $rc
