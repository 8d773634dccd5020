#!/usr/bin/env bash
# fuzz/run.sh [SECONDS]: build the libFuzzer targets with clang and run each
# for a bounded time (default 60 s). New crashers land in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
out=build-fuzz
mkdir -p "$out/corpus-yaml"
cp -n fuzz/corpus/yaml/* "$out/corpus-yaml/" 2>/dev/null || true
clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  $(pkg-config --cflags lua5.4 yaml-0.1) fuzz/yaml_fuzz.c src/lyaml.c \
  $(pkg-config --libs lua5.4 yaml-0.1) -o "$out/yaml_fuzz"
echo "fuzz: yaml for ${secs} s"
"$out/yaml_fuzz" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=1024 \
  -artifact_prefix="$out/" "$out/corpus-yaml" fuzz/corpus/yaml 2>&1 | tail -n 5
