#!/bin/bash
# The example chain in one process vs spread over two node processes on loopback (the
# portscan detector and the LB on node b): throughput and latency, one line per repetition,
# then the same at low load (the demo trace paced, 20,000 packets) for the latency a
# crossing adds. Usage: scripts/bench-spread.sh TRACE [REPEAT]  (after cargo build --release;
# SLUICE=path/to/sluice compares another binary; PACE=0.02 sets the low load's pace, 0.2 by
# default — lower it on a slow machine, where 0.2x may not be a low load; LIMIT the low load's
# packets, 20000 by default; PLACE the vertices on node b, "portscan lb" by default;
# THROUGHPUT=0 skips the throughput part)
set -e
cd "$(dirname "$0")/.."
S=${SLUICE:-target/release/sluice}
T=${1:?a trace, e.g. from sluice gen}; N=${2:-3}; PACE=${PACE:-0.2}
[ "${THROUGHPUT:-1}" = 0 ] && M=0 || M=$N
W=$(mktemp -d)
SPREAD=$W/spread.yaml
trap 'rm -rf "$W"' EXIT
LIMIT=${LIMIT:-20000}; PLACE=${PLACE:-portscan lb}
# Ports of their own, so that a test running beside it does not collide.
P=$((20000 + RANDOM % 20000))
{ printf 'nodes:\n  a: 127.0.0.1:%d\n  b: 127.0.0.1:%d\nroot: a\nplace:\n' $P $((P + 1))
  for v in $PLACE; do printf '  %s: b\n' "$v"; done; } > "$SPREAD"
for i in $(seq $M); do
  $S run -c chains/example.yaml -i $T -w 1 --no-pin -q --json $W/one.json > /dev/null
  $S run -c chains/example.yaml --spread "$SPREAD" --node b -w 1 --no-pin -q > /dev/null 2>&1 &
  $S run -c chains/example.yaml -i $T --spread "$SPREAD" --node a -w 1 --no-pin -q --json $W/two.json > /dev/null
  wait
  python3 -c "
import json
o=json.load(open('$W/one.json')); t=json.load(open('$W/two.json'))
print('one %.3f Mpps p50 %.1f us | two %.3f Mpps p50 %.1f us | ratio %.2f' % (o['mpps'], o['latency_us']['p50'], t['mpps'], t['latency_us']['p50'], t['mpps']/o['mpps']))"
done
for i in $(seq "$N"); do
  $S run -c chains/example.yaml -i traces/demo.pcap --limit $LIMIT --pace $PACE -w 1 --no-pin -q --json $W/one.json > /dev/null
  $S run -c chains/example.yaml --spread "$SPREAD" --node b -w 1 --no-pin -q > /dev/null 2>&1 &
  $S run -c chains/example.yaml -i traces/demo.pcap --limit $LIMIT --pace $PACE --spread "$SPREAD" --node a -w 1 --no-pin -q --json $W/two.json > /dev/null
  wait
  python3 -c "
import json
o=json.load(open('$W/one.json'))['latency_us']; t=json.load(open('$W/two.json'))['latency_us']
print('low load: one p50 %.1f p99 %.1f us | two p50 %.1f p99 %.1f us | added p50 %.1f us (two crossings)' % (o['p50'],o['p99'],t['p50'],t['p99'],t['p50']-o['p50']))"
done
