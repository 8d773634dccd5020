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

# The other parsers of untrusted bytes: archives from the engine, and its
# multiplexed stream (a third and a sixth of the time, at least 10 s each).
run_target() {  # name secs sources...
  local name=$1 t=$2; shift 2
  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -D_GNU_SOURCE $(pkg-config --cflags lua5.4 libarchive) -Isrc "$@" \
    $(pkg-config --libs lua5.4 libarchive) -o "$out/${name}_fuzz"
  mkdir -p "$out/corpus-$name"
  echo "fuzz: $name for ${t} s"
  "$out/${name}_fuzz" -max_total_time="$t" -max_len=16384 -timeout=10 -rss_limit_mb=1024 \
    -artifact_prefix="$out/" "$out/corpus-$name" "fuzz/corpus/$name" 2>&1 | tail -n 2
}
third=$(( secs / 3 > 10 ? secs / 3 : 10 ))
sixth=$(( secs / 6 > 10 ? secs / 6 : 10 ))
run_target tar "$third" fuzz/tar_fuzz.c src/ltar.c src/loop.c src/spawn.c src/fail.c
run_target demux "$sixth" fuzz/demux_fuzz.c src/ldemux.c src/loop.c src/spawn.c src/fail.c
# the dashboard's HTTP request heads (any local client can send them)
run_target httpreq "$sixth" fuzz/httpreq_fuzz.c src/lhttpreq.c src/loop.c src/spawn.c src/fail.c
# sbx-agent's frame decoder: every byte a host sends to `sbx-agent serve`.
run_target agent "$sixth" fuzz/agent_fuzz.c src/agent/frame.c
# Lua modules that read untrusted input, loaded from lua/ (line coverage
# through fuzz/luacov.h): sandbox paths against openat2, engine JSON through
# cjson and the docker backend, and the host's agent frame decoder.
small=$(( secs / 10 > 5 ? secs / 10 : 5 ))
lua_dir="-DSBX_LUA_DIR=\"$PWD/lua\""
run_target paths "$small" "$lua_dir" -Ifuzz fuzz/paths_fuzz.c
SBX_FUZZ_STRICT=1 run_target json "$small" "$lua_dir" -Ifuzz fuzz/json_fuzz.c -l:liblua5.4-cjson.so.0
run_target wire "$small" "$lua_dir" -Ifuzz fuzz/wire_fuzz.c
# The bounded pattern matcher scripts get (src/patmatch.c), the stock string
# library as the oracle.
run_target patmatch "$small" fuzz/patmatch_fuzz.c src/patmatch.c
