#!/usr/bin/env bash
# Random fault runs over the shipped chains and traces: `sluice fuzz` (release build) over
# chains/example.yaml, chains/nat-portscan.yaml and chains/nat-trojan.yaml, and
# traces/demo.pcap plus the larger shared captures (../shared/traces/echo-connections.pcap,
# http_methods.pcap) when present. Every run draws a fault schedule and run options from its
# seed and must be equivalent to the reference (docs/faults.md, "Random runs").
#
# Usage: scripts/fuzz-faults.sh [--n 5000] [--seed 0] [--jobs N] [--store embedded|redis://...]
#                               [--shrink DIR] [--json] [any other `sluice fuzz` option]
# Exit code: 0 every run equivalent, 4 some run failed (its seed and schedule are printed;
# with --shrink DIR the first failure of every symptom class is shrunk into DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

n=5000
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --n) n="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
# One run per core unless told otherwise.
case " ${args[*]-} " in
  *" --jobs "*|*" -j "*) ;;
  *) args+=(--jobs "$(nproc)") ;;
esac

inputs=(--input traces/demo.pcap)
for t in echo-connections.pcap http_methods.pcap; do
  [ -f "../shared/traces/$t" ] && inputs+=(--input "../shared/traces/$t")
done

echo "== cargo build --release -p sluice-cli" >&2
cargo build --release --quiet -p sluice-cli
bin="${CARGO_TARGET_DIR:-target}/release/sluice"

echo "== sluice fuzz --n $n" >&2
exec "$bin" fuzz --n "$n" \
  --chain chains/example.yaml --chain chains/nat-portscan.yaml --chain chains/nat-trojan.yaml \
  "${inputs[@]}" ${args[@]+"${args[@]}"}
