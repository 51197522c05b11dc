#!/bin/sh
# embed-deck.sh DECK NAME > out.c — a deck file as a C string (the built-in default deck).
set -e
printf '/* generated from %s by tools/embed-deck.sh: do not edit */\n' "$2"
printf 'const char tsr_embedded_deck_name[] = "%s";\n' "$2"
printf 'const char tsr_embedded_deck[] =\n  ""\n'
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/  "/' -e 's/$/\\n"/' "$1"
printf ';\n'
