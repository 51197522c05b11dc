#!/usr/bin/env bash
# readme_blocks.sh — every ```sh block of README.md says how the test suite runs it: the
# comment "<!-- readme-example: NAME (tests/...sh runs this block as written ...) -->"
# above it, where that script calls `readme_block NAME`, or "readme-example: none (why)"
# (tests/e2e/readme_blocks.py lint).  And the lint can fail: on a copy of README.md with a
# block added without a comment, and with a block's comment naming a script that does not
# run it.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
command -v "$PYTHON_REF" >/dev/null || skip "no $PYTHON_REF"
scratch
lint() { "$PYTHON_REF" "$top_srcdir/tests/e2e/readme_blocks.py" lint "$1" "$top_srcdir" >"$SCRATCH/out.txt" 2>&1; }

lint "$top_srcdir/README.md"
rc=$?
sed 's/^/    /' "$SCRATCH/out.txt"
n=$(grep -c '^ *```sh' "$top_srcdir/README.md")
r=$(grep -c 'readme-example: [a-z0-9-]* (tests/' "$top_srcdir/README.md")
check "each of README.md's $n sh blocks says how it is run ($r by a named test; exit $rc)" test $rc -eq 0

cp "$top_srcdir/README.md" "$SCRATCH/unmarked.md"
printf '\nA new command:\n\n```sh\nsrc/tessera input/tiny.nml\n```\n' >>"$SCRATCH/unmarked.md"
lint "$SCRATCH/unmarked.md"
check "a block added without the comment fails the lint, with its line" \
  sh -c "test $? -eq 1 && grep -q 'unmarked.md:[0-9]*: a \`\`\`sh block without' '$SCRATCH/out.txt'"

sed 's/readme-example: plan (tests\/e2e\/readme_layouts.sh/readme-example: plan (tests\/e2e\/install.sh/' \
  "$top_srcdir/README.md" >"$SCRATCH/misnamed.md"
lint "$SCRATCH/misnamed.md"
check "a comment naming a script that does not run the block fails the lint" \
  sh -c "test $? -eq 1 && grep -q \"block 'plan': tests/e2e/install.sh does not run it\" '$SCRATCH/out.txt'"
finish
