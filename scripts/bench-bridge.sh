#!/usr/bin/env bash
# A live bridge on veth, three ways, in one run: kernel IP forwarding, `sluice run --bridge
# --io afpacket` and `--io xdp` (pass-through chain, one worker). Three throw-away network
# namespaces: gen (sluice send) → mid (the forwarder) → sink; what crossed is the sink's
# interface counter. Per repetition and mode: the peak (the generator as fast as it goes),
# then, for AF_XDP, a run at half its median peak: offered, delivered and lost packets.
# Medians and ratios at the end, and JSON with every row (docs/benchmarks.md).
#
# The generator is `sluice send --io xdp` (the faster of the two: it must outrun every
# forwarder) pinned to core 0, as a generator on its own machine would be; on veth the
# forwarder's receive work runs on the sender's core, so kernel forwarding (all of it in the
# sender's softirq) is generator-bound here.
#
# Usage: scripts/bench-bridge.sh [REPETITIONS] [SECONDS]    (needs root, iproute2, ethtool)
# Env: SLUICE=path/to/sluice (default: a release build made here), JSON=file for the rows,
# PLOT=file.svg for a bar chart of the peaks,
# SEND_IO=afpacket|xdp and SEND_CPU=N for the generator, BRIDGE_OPTS for `sluice run`.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5}
secs=${2:-5}
send_io=${SEND_IO:-xdp}
send_cpu=${SEND_CPU:-0}
if [ -z "${SLUICE:-}" ]; then
  cargo build --release -q -p sluice-cli
  SLUICE=target/release/sluice
fi
S=$(realpath "$SLUICE")
tmp=$(mktemp -d)
G=sbg$$ M=sbm$$ K=sbk$$
cleanup() {
  [ -n "${bridge:-}" ] && kill -INT "$bridge" 2>/dev/null && wait "$bridge" 2>/dev/null || true
  for n in $G $M $K; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
for n in $G $M $K; do
  ip netns add "$n"
  ip -n "$n" link set lo up
  # No IPv6 chatter: the sink's counter is to see only what crossed.
  ip netns exec "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
done
ip link add g0 netns $G type veth peer name m0 netns $M
ip link add m1 netns $M type veth peer name k0 netns $K
ip -n $G addr add 10.91.1.2/24 dev g0
ip -n $M addr add 10.91.1.1/24 dev m0
ip -n $M addr add 10.91.2.1/24 dev m1
ip -n $K addr add 10.91.2.2/24 dev k0
for p in "$G g0" "$M m0" "$M m1" "$K k0"; do
  set -- $p
  ip -n "$1" link set "$2" up
  ip netns exec "$1" ethtool -K "$2" gro off tso off gso off tx off >/dev/null 2>&1 || true
done
# The router: everything to the sink, whatever the generated addresses; no reverse-path check.
ip netns exec $M sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.m0.rp_filter=0
ip -n $M route add default via 10.91.2.2
ip -n $M neigh replace 10.91.2.2 lladdr "$(ip netns exec $K cat /sys/class/net/k0/address)" dev m1 nud permanent
m0_mac=$(ip netns exec $M cat /sys/class/net/m0/address)
rx() { ip netns exec $K cat /sys/class/net/k0/statistics/rx_packets; }

# measure MODE RATE: one run; appends "mode rate offered delivered seconds" to rows.
measure() {
  local mode=$1 rate=$2
  bridge=""
  if [ "$mode" = kernel ]; then
    ip netns exec $M sysctl -qw net.ipv4.ip_forward=1
  else
    ip netns exec $M sysctl -qw net.ipv4.ip_forward=0
    ip netns exec $M "$S" run -c chains/passthrough.yaml --bridge m0,m1 --io "$mode" -w 1 -q ${BRIDGE_OPTS:-} \
      --duration $((secs + 30)) --json "$tmp/bridge.json" >/dev/null 2>"$tmp/bridge.err" &
    bridge=$!
    sleep 1.5
  fi
  local before after
  before=$(rx)
  ip netns exec $G taskset -c "$send_cpu" "$S" send --interface g0 --io "$send_io" --gen long --scale 0.01 --size 64 --dst-mac "$m0_mac" \
    --rate "$rate" --duration "$secs" --json "$tmp/send.json" >/dev/null
  sleep 0.5
  after=$(rx)
  if [ -n "$bridge" ]; then
    kill -INT "$bridge"
    wait "$bridge" || { cat "$tmp/bridge.err" >&2; exit 1; }
    bridge=""
  fi
  ip netns exec $M sysctl -qw net.ipv4.ip_forward=0
  python3 - "$tmp/send.json" "$mode" "$rate" $((after - before)) >>"$tmp/rows" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[2], sys.argv[3], s["sent"], sys.argv[4], f'{s["seconds"]:.3f}')
PY
  tail -1 "$tmp/rows" | awk '{printf "%-9s rate %-9s offered %9d delivered %9d  %.3f Mpps\n", $1, $2, $3, $4, $4/$5/1e6}'
}

for r in $(seq 1 "$reps"); do
  for mode in kernel afpacket xdp; do measure $mode 0; done
done
half=$(python3 - "$tmp/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("xdp ")]
print(int(statistics.median(float(r[3]) / float(r[4]) for r in rows) / 2))
PY
)
for r in $(seq 1 "$reps"); do measure xdp "$half"; measure afpacket "$half"; done
python3 - "$tmp/rows" "${JSON:-}" "${PLOT:-}" <<'PY'
import json, statistics, sys
rows = [dict(zip(("mode", "rate", "offered", "delivered", "seconds"), l.split())) for l in open(sys.argv[1])]
for r in rows:
    r["rate"], r["offered"], r["delivered"], r["seconds"] = float(r["rate"]), int(r["offered"]), int(r["delivered"]), float(r["seconds"])
    r["pps"] = r["delivered"] / r["seconds"]
peak = {m: statistics.median(r["pps"] for r in rows if r["mode"] == m and r["rate"] == 0) for m in ("kernel", "afpacket", "xdp")}
for m, v in peak.items():
    print(f"median peak {m:9s} {v / 1e6:.3f} Mpps")
print(f"ratio AF_XDP / AF_PACKET {peak['xdp'] / peak['afpacket']:.2f}; AF_XDP / kernel {peak['xdp'] / peak['kernel']:.2f}")
for m in ("xdp", "afpacket"):
    half = [r for r in rows if r["mode"] == m and r["rate"] > 0]
    lost = [r["offered"] - r["delivered"] for r in half]
    print(f"{m} at {half[0]['rate'] / 1e6:.3f} Mpps (half the AF_XDP peak): lost {lost} of ~{half[0]['offered']} offered per run")
if sys.argv[2]:
    json.dump({"rows": rows, "median_peak_pps": peak}, open(sys.argv[2], "w"), indent=1)
if sys.argv[3]:
    # Bars: median peak per forwarder, a line from the slowest to the fastest run.
    names = {"kernel": "kernel forwarding", "afpacket": "--io afpacket", "xdp": "--io xdp"}
    top = max(r["pps"] for r in rows) * 1.15
    w, h, x0, y0, bw = 560, 360, 70, 300, 110
    y = lambda v: y0 - (v / top) * 250
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="13">',
           f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="15">Live bridge on veth, 64-byte frames: peak Mpps</text>',
           f'<line x1="{x0}" y1="{y0}" x2="{w - 20}" y2="{y0}" stroke="black"/>']
    for i in range(0, 11):
        v = top * i / 10
        svg.append(f'<text x="{x0 - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v / 1e6:.2f}</text>')
    for k, m in enumerate(("kernel", "afpacket", "xdp")):
        runs = [r["pps"] for r in rows if r["mode"] == m and r["rate"] == 0]
        x = x0 + 30 + k * (bw + 50)
        color = ("#888888", "#4477aa", "#228833")[k]
        svg.append(f'<rect x="{x}" y="{y(peak[m]):.1f}" width="{bw}" height="{y0 - y(peak[m]):.1f}" fill="{color}"/>')
        svg.append(f'<line x1="{x + bw / 2}" y1="{y(min(runs)):.1f}" x2="{x + bw / 2}" y2="{y(max(runs)):.1f}" stroke="black" stroke-width="2"/>')
        svg.append(f'<text x="{x + bw / 2}" y="{y(peak[m]) - 8:.1f}" text-anchor="middle">{peak[m] / 1e6:.3f}</text>')
        svg.append(f'<text x="{x + bw / 2}" y="{y0 + 20}" text-anchor="middle">{names[m]}</text>')
    ratio = peak["xdp"] / peak["afpacket"]
    svg.append(f'<text x="{w / 2}" y="{y0 + 45}" text-anchor="middle">AF_XDP / AF_PACKET = {ratio:.2f} (medians of {len(runs)} runs; lines: slowest to fastest)</text>')
    svg.append("</svg>")
    open(sys.argv[3], "w").write("\n".join(svg) + "\n")
PY
