#!/usr/bin/env bash
# The Redis server's instructions per lock cycle, counted by callgrind: a
# figure that does not drift with the machine's load, where the server's CPU
# time per cycle does (see lock-bench/README.md, "The server's instructions").
#
#   bash lock-bench/server-instructions.sh IMPL [IMPL...]
#
# IMPL is one of `lock-bench --profile`'s (distlock, rslock, minimal, floor,
# ...). For each, the bench cycles IMPL on one key against its private
# redis-server, run under callgrind; after a warm-up the script resets the
# counts, lets the cycles run, dumps them, and divides by the cycles Redis
# counted in between (`INFO commandstats`, calls of SET). Prints, per cycle,
# the instructions of command processing (`readQueryFromClient`, inclusive:
# parsing, the commands, the scripts, the replies) and of the whole server
# (its timers and event loop included), then the functions whose inclusive
# count per cycle is largest. Valgrind counts user-space instructions only:
# the kernel's share of a round trip is not in it.
#
# Needs valgrind and redis-cli (Debian: `apt-get install valgrind
# redis-tools`); builds lock-bench in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,20p' "$0"; exit 2; }
for tool in valgrind callgrind_control callgrind_annotate redis-cli redis-server; do
  command -v "$tool" > /dev/null || { echo "$tool is missing (apt-get install valgrind redis-tools redis-server)" >&2; exit 2; }
done
cargo build --release -p lock-bench --quiet
bench=$PWD/target/release/lock-bench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
real_server=${REDIS_SERVER_BIN:-$(command -v redis-server)}
cat > "$work/server" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$work/callgrind.%p "$real_server" "\$@"
EOF
chmod +x "$work/server"

set_calls() {
  redis-cli -p "$1" info commandstats | sed -n 's/^cmdstat_set:calls=\([0-9]*\).*/\1/p'
}

for impl in "$@"; do
  rm -f "$work"/callgrind.*
  REDIS_SERVER_BIN=$work/server "$bench" --profile "$impl:1:40" > "$work/out" 2>&1 &
  bench_pid=$!
  # Valgrind slows the server about 50-fold: give it time to start and warm up.
  port=
  for _ in $(seq 1 100); do
    port=$(grep -o '127\.0\.0\.1:[0-9]*' "$work/out" 2> /dev/null | head -1 | cut -d: -f2 || true)
    [ -n "$port" ] && break
    sleep 0.2
  done
  [ -n "$port" ] || { echo "$impl: the bench did not start" >&2; cat "$work/out" >&2; exit 1; }
  sleep 8
  server_pid=$(pgrep -f "callgrind-out-file=$work" | head -1)
  callgrind_control -z "$server_pid" > /dev/null 2>&1
  before=$(set_calls "$port")
  sleep 10
  after=$(set_calls "$port")
  callgrind_control -d "$server_pid" > /dev/null 2>&1
  sleep 1
  kill "$bench_pid" "$server_pid" 2> /dev/null || true
  wait "$bench_pid" 2> /dev/null || true
  dump=$(ls -t "$work"/callgrind.*.* | head -1)
  cycles=$((after - before))
  echo "== $impl: $cycles cycles counted"
  callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2> /dev/null |
    python3 lock-bench/server-instructions.py "$cycles"
done
