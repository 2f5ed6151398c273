#!/usr/bin/env bash
# The example chain in one process vs split over two processes on loopback (chains/split/:
# NAT + Trojan detector, then port-scan detector + LB, joined by Geneve), over the bundled
# trace at full speed. Prints, per repetition, the packet rates and their ratio, and the
# medians. The split's rate is what its second half took in, over the longer of the first
# half's run and the second half's active input time (docs/benchmarks.md).
#
# Usage: scripts/bench-split.sh [REPETITIONS] [extra `sluice run` options for every process]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-7}
shift || true
S=target/release/sluice
cargo build --release -q -p sluice-cli
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$((20000 + RANDOM % 20000))
for r in $(seq 1 "$reps"); do
  $S run -c chains/example.yaml -i traces/demo.pcap -q --no-pin "$@" --json "$tmp/one.json" >/dev/null
  $S run -c chains/split/example-back.yaml --from-geneve "127.0.0.1:$port" --idle-end 0.3 -q --no-pin "$@" \
    --json "$tmp/back.json" >/dev/null 2>"$tmp/back.err" &
  back=$!
  sleep 0.3
  $S run -c chains/split/example-front.yaml -i traces/demo.pcap --to-geneve "127.0.0.1:$port" -q --no-pin "$@" \
    --json "$tmp/front.json" >/dev/null
  wait "$back"
  python3 - "$tmp" <<'PY' | tee -a "$tmp/rows"
import json, sys
d = sys.argv[1]
one, front, back = (json.load(open(f"{d}/{n}.json")) for n in ("one", "front", "back"))
gi = back["geneve_input"]
one_pps = one["packets_in"] / one["elapsed_s"]
split_pps = gi["accepted"] / max(front["elapsed_s"], gi["active_s"])
print(f"{one_pps:.0f} {split_pps:.0f} {split_pps / one_pps:.3f} lost={gi['lost']}")
PY
done
python3 - "$tmp/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda i: statistics.median(float(r[i]) for r in rows)
print(f"median: one process {med(0):.0f} pkt/s, split {med(1):.0f} pkt/s, ratio {med(2):.3f}")
PY
