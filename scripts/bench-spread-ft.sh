#!/bin/bash
# The example chain over two node processes with fault tolerance (portscan and LB on node b),
# NF state in an embedded store served by a third process, on loopback. Prints the root node's
# throughput and median latency per run. Usage: scripts/bench-spread-ft.sh TRACE [RUNS]
# (SLUICE=path picks the binary; e.g. alternate two builds to compare them in one sitting).
set -e
cd "$(dirname "$0")/.."
S=${SLUICE:-target/release/sluice}
T=${1:?a trace, e.g. from sluice gen}; N=${2:-3}
SPREAD=$(mktemp --suffix .yaml); OUT=$(mktemp --suffix .json)
trap 'rm -f "$SPREAD" "$OUT"' EXIT
printf 'nodes:\n  a: 127.0.0.1:17101\n  b: 127.0.0.1:17102\nroot: a\nplace:\n  portscan: b\n  lb: b\n' > "$SPREAD"
FT=(--fault-tolerance --mode async --store sluice://127.0.0.1:17600)
for i in $(seq "$N"); do
  $S store serve --listen 127.0.0.1:17600 > /dev/null 2>&1 &
  store=$!
  sleep 0.5
  $S run -c chains/example.yaml --spread "$SPREAD" --node b -w 1 --no-pin -q "${FT[@]}" > /dev/null 2>&1 &
  node_b=$!
  $S run -c chains/example.yaml -i "$T" --spread "$SPREAD" --node a -w 1 --no-pin -q "${FT[@]}" --json "$OUT" > /dev/null
  wait "$node_b" || true
  kill "$store"; wait "$store" 2>/dev/null || true
  python3 -c "
import json
t=json.load(open('$OUT'))
print('two nodes, fault tolerance: %.3f Mpps p50 %.1f us' % (t['mpps'], t['latency_us']['p50']))"
done
