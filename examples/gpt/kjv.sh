#!/usr/bin/env bash
# Writes the King James Bible as plain text to $1, from Debian's bible-kjv (the 1611 translation,
# public domain; the package's text is Chip Chapin's, free to copy): book and chapter headings
# kept, verse numbers dropped, so the model reads prose. About 4.1 MB.
set -euo pipefail
bible "gen1:1-rev22:21" | sed -E 's/^ +[0-9]+ //' > "$1.tmp"
mv "$1.tmp" "$1"
