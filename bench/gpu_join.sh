#!/usr/bin/env bash
# On the device machine, after every part of bench/gpu_prepare.sh is in /root/stash: the real tiny.en pair
# put back together in /tmp/models (whisper-tiny.en, distil-tiny.en-draft), byte for byte the shared one.
#
#   bash bench/gpu_join.sh [STASH] [MODELS]
set -euo pipefail
STASH="${1:-/root/stash}"
MODELS="${2:-/tmp/models}"
# every part the prepare step cut, none missing or cut short (a device call that failed half-way), none extra
(cd "$STASH" && sha256sum --quiet -c pair.sha256) || { echo "the parts in $STASH are not the ones cut" >&2; exit 2; }
[ "$(ls "$STASH"/pair.tar.* | wc -l)" = "$(wc -l < "$STASH/pair.sha256")" ] || { echo "extra parts in $STASH" >&2; exit 2; }
work=$(mktemp -d)
cat "$STASH"/pair.tar.* | tar xf - -C "$work"
# the draft's tokenizer is the target's, byte for byte: it travels once
[ -f "$work/halves/part2/d/tokenizer.json" ] || cp "$work/halves/part2/t/tokenizer.json" "$work/halves/part2/d/"
python3 "$work/halves/part2/pack_tiny_pair.py" join "$work/halves/part1" "$work/halves/part2" "$MODELS"
rm -rf "$work"
