#!/usr/bin/env bash
# Here, before a lent GPU is used: put what the device machine cannot fetch (it reaches nothing outside) into
# .gpu/ (ignored by git): the wheels its Python lacks, and the real tiny.en pair cut into parts that each fit
# one device call beside the repository. Then prints the device calls that use them (../shared/gpu/README.md).
#
#   bash bench/gpu_prepare.sh            # needs ../shared (or SHARED=DIR) and a package index
#
# A device call carries the working tree plus what it names, 64 MiB in all. The tree grew to 35 MB when the
# base draft was shipped (2026-11-27), so the pair's two halves (43 and 46 MB) no longer fit beside it: the
# halves are packed into one tar and cut into parts of what the tree leaves free (less a margin), each carried
# by its own call into /root/stash, and joined by the last.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${SHARED:-../shared}"
PYTHON="${PYTHON:-python3}"
[ -f "$SHARED/gpu/pack_tiny_pair.py" ] || { echo "no $SHARED/gpu/pack_tiny_pair.py: set SHARED=DIR" >&2; exit 2; }
rm -rf .gpu && mkdir -p .gpu/halves
"$PYTHON" "$SHARED/gpu/pack_tiny_pair.py" pack .gpu/halves
# the draft's tokenizer is the target's, byte for byte: it travels once (bench/gpu_join.sh copies it back)
cmp -s .gpu/halves/part2/t/tokenizer.json .gpu/halves/part2/d/tokenizer.json && rm .gpu/halves/part2/d/tokenizer.json
# The device machine: Python 3.12 on x86-64 Linux, without these (seen 2026-11-22).
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/whl soundfile soxr jiwer rapidfuzz cffi pycparser click \
    fastapi starlette pydantic pydantic_core annotated-types typing-inspection typing_extensions uvicorn websockets \
    opentelemetry-api openai jiter distro sniffio httpx2 httpcore2 truststore idna \
    python-multipart  # from fastapi on: the serving bench (gpu_check.sh serve), each name seen missing there

tree_bytes=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s | awk '{s += $1} END {print s + 0}')
part_bytes=$(( 64 * 1024 * 1024 - tree_bytes - untracked - 3 * 1024 * 1024 ))
[ "$part_bytes" -gt $(( 4 * 1024 * 1024 )) ] || { echo "the tree ($tree_bytes bytes) leaves no room to carry" >&2; exit 2; }
tar cf - -C .gpu halves | split -b "$part_bytes" -d - .gpu/pair.tar.
rm -rf .gpu/halves
(cd .gpu && sha256sum pair.tar.*) > .gpu/pair.sha256   # gpu_join.sh checks every part is there, whole
parts=()
for f in .gpu/pair.tar.*; do
    n=${f##*.}
    mkdir -p ".gpu/p$n" && mv "$f" ".gpu/p$n/"
    parts+=("p$n")
done
mv .gpu/pair.sha256 ".gpu/${parts[0]}/"
du -sh .gpu/whl .gpu/p*
last=${parts[${#parts[@]} - 1]}
echo
echo "Device calls, each within 30 s of the one before, while the machine is still warm (see \`status\` first):"
echo "  1. carry [\".gpu/whl\"], command:"
echo "     python3 -m pip install -q --no-index --no-deps --target /root/site .gpu/whl/*.whl"
i=2
for p in "${parts[@]}"; do
    if [ "$p" = "${parts[0]}" ]; then   # the first part empties the stash: no part of an earlier cut stays
        echo "  $i. carry [\".gpu/$p\"], command:  rm -rf /root/stash && mkdir -p /root/stash && cp .gpu/$p/* /root/stash/"
    elif [ "$p" != "$last" ]; then
        echo "  $i. carry [\".gpu/$p\"], command:  cp .gpu/$p/* /root/stash/"
    else
        echo "  $i. carry [\".gpu/$p\"], command:"
        echo "     cp .gpu/$p/* /root/stash/ && bash bench/gpu_join.sh && bash bench/gpu_check.sh tests host"
    fi
    i=$((i + 1))
done
cat <<CALLS
  then, no carry: bash bench/gpu_check.sh serve | gil | layers | serve_engines | large tiny | batch profile | stream eval
What comes back: \$OUT/gpu_check.tgz (every call's logs and results so far) and summary.txt; here,
tar xzf it and copy its results/* into bench/results/.
CALLS
