#!/bin/bash
# The example chain placed by the controller on two `sluice node` processes (the root on node
# a, `--roles root`; the four NFs on node b, `--roles nf`), with etcd on loopback, against the
# same chain in one process: throughput over TRACE, then latency at a low load (the demo trace
# paced at PACE, 20,000 packets). One line per repetition; each repetition runs both forms back
# to back. Local state, one worker per process, as scripts/bench-spread.sh.
# Usage: scripts/bench-hosted.sh TRACE [REPEAT]   (after cargo build --release; needs etcd:
# apt-get install etcd-server. SLUICE=path/to/sluice compares another binary; PACE, 0.02 by
# default, sets the low load, LIMIT its packets, 20000 by default.)
set -e
cd "$(dirname "$0")/.."
S=${SLUICE:-target/release/sluice}
T=${1:?a trace, e.g. from sluice gen}; N=${2:-3}; PACE=${PACE:-0.02}; LIMIT=${LIMIT:-20000}
command -v etcd > /dev/null || { echo "etcd is not installed (apt-get install etcd-server)" >&2; exit 2; }
W=$(mktemp -d)
# Ports of their own, so that a test running beside it does not collide.
P=$((20000 + RANDOM % 20000))
E=http://127.0.0.1:$P
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
etcd --name bench --data-dir "$W/etcd" --listen-client-urls $E --advertise-client-urls $E \
  --listen-peer-urls http://127.0.0.1:$((P + 1)) --initial-advertise-peer-urls http://127.0.0.1:$((P + 1)) \
  --initial-cluster bench=http://127.0.0.1:$((P + 1)) > "$W/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  "$S" cluster --etcd $E --cluster probe status > /dev/null 2>&1 && break
  sleep 0.1
done
"$S" cluster --etcd $E --cluster probe status > /dev/null || { echo "etcd did not come up" >&2; exit 1; }

# hosted CLUSTER ROOT_OPTIONS: one run over two placed nodes; node a's report in $W/two.json.
hosted() {
  local c=$1 root_run=$2 common=(--etcd $E --cluster "$1" --ttl 2)
  "$S" controller "${common[@]}" --chain chains/example.yaml > /dev/null 2>&1 &
  local controller=$!
  local engine="-c chains/example.yaml -w 1 --no-pin -q"
  "$S" node --id b --addr 127.0.0.1:$((P + 3)) --roles nf --settle-ms 500 "${common[@]}" \
    --run="$engine" > /dev/null 2> "$W/b.log" &
  local b=$!
  "$S" node --id a --addr 127.0.0.1:$((P + 2)) --roles root --settle-ms 500 "${common[@]}" \
    --run="$engine" --root-run="$root_run --json $W/two.json" > /dev/null 2> "$W/a.log"
  wait $b || { echo "node b failed:" >&2; cat "$W/b.log" >&2; }
  kill $controller 2> /dev/null || true
  wait $controller 2> /dev/null || true
}

for i in $(seq "$N"); do
  "$S" run -c chains/example.yaml -i "$T" -w 1 --no-pin -q --json "$W/one.json" > /dev/null
  hosted "tp$i" "-i $T"
  python3 -c "
import json
o=json.load(open('$W/one.json')); t=json.load(open('$W/two.json'))
print('one %.3f Mpps | two placed nodes %.3f Mpps | ratio %.2f' % (o['mpps'], t['mpps'], t['mpps']/o['mpps']))"
done
for i in $(seq "$N"); do
  "$S" run -c chains/example.yaml -i traces/demo.pcap --limit "$LIMIT" --pace "$PACE" -w 1 --no-pin -q \
    --json "$W/one.json" > /dev/null
  hosted "lat$i" "-i traces/demo.pcap --limit $LIMIT --pace $PACE"
  python3 -c "
import json
o=json.load(open('$W/one.json'))['latency_us']; t=json.load(open('$W/two.json'))['latency_us']
print('low load: one p50 %.1f p99 %.1f us | two placed nodes p50 %.1f p99 %.1f us | added p50 %.1f us (two crossings)' % (o['p50'],o['p99'],t['p50'],t['p99'],t['p50']-o['p50']))"
done
