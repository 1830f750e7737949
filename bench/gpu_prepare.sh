#!/usr/bin/env bash
# Here, before a lent GPU is used: put what the device machine cannot fetch (it reaches nothing outside) into
# .gpu/ (ignored by git): the real tiny.en pair split into two parts that each fit one device call (64 MiB),
# and the wheels its Python lacks. Then prints the device calls that use them (../shared/gpu/README.md).
#
#   bash bench/gpu_prepare.sh            # needs ../shared (or SHARED=DIR) and a package index
set -eu
cd "$(dirname "$0")/.."
SHARED="${SHARED:-../shared}"
PYTHON="${PYTHON:-python3}"
[ -f "$SHARED/gpu/pack_tiny_pair.py" ] || { echo "no $SHARED/gpu/pack_tiny_pair.py: set SHARED=DIR" >&2; exit 2; }
mkdir -p .gpu
"$PYTHON" "$SHARED/gpu/pack_tiny_pair.py" pack .gpu
# part2 (51 MB) plus the repository (15 MB) passed the 64 MiB a call carries (2026-11-26): the draft's
# tokenizer.json, the target's byte for byte, travels with part1 and goes back in place before the join.
mv .gpu/part2/d/tokenizer.json .gpu/part1/d_tokenizer.json
# The device machine: Python 3.12 on x86-64 Linux, without these (seen 2026-11-22).
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/whl soundfile soxr jiwer rapidfuzz cffi pycparser click \
    fastapi starlette pydantic pydantic_core annotated-types typing-inspection typing_extensions uvicorn websockets \
    opentelemetry-api openai jiter distro sniffio httpx2 httpcore2 truststore idna \
    python-multipart  # from fastapi on: the serving bench (gpu_check.sh serve), each name seen missing there
du -sh .gpu/part1 .gpu/part2 .gpu/whl
cat <<'CALLS'

Device calls, each within 30 s of the one before, while the machine is still warm (see `status` first). The
wheels (11 MB) travel alone: with either part and the repository (17 MB) they pass the 64 MiB a call carries.
  1. carry [".gpu/whl"], command:
     python3 -m pip install -q --no-index --no-deps --target /root/site .gpu/whl/*.whl
  2. carry [".gpu/part1"], command:
     cp -r .gpu/part1 /root/stash
  3. carry [".gpu/part2"], command:
     cp /root/stash/d_tokenizer.json .gpu/part2/d/tokenizer.json && python3 .gpu/part2/pack_tiny_pair.py join /root/stash .gpu/part2 /tmp/models && bash bench/gpu_check.sh tests serve
  4. (no carry) bash bench/gpu_check.sh serve_engines
  5. (no carry) bash bench/gpu_check.sh large tiny
  6. (no carry) bash bench/gpu_check.sh batch profile
What comes back: $OUT/gpu_check.tgz (every call's logs and results so far) and summary.txt; here,
tar xzf it and copy its results/* into bench/results/.
CALLS
