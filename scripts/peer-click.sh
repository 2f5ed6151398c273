#!/usr/bin/env bash
# Sluice next to Click (userlevel), same synthetic trace, same run: pass-through and NAT.
#
# Builds Click from source (a pinned commit, `--enable-userlevel --disable-linuxmodule`) into
# target/peers/click-REV unless it is there, generates a seeded trace with `sluice gen` (default
# 10,000 flows x 100 packets = 1 M packets of 64 bytes), then runs, alternating Sluice and Click
# `--repeat` times:
#   pass-through   sluice run --chain chains/passthrough.yaml      vs  FromDump -> Discard
#                  (--mode local: it keeps no state, so no store is started)
#   NAT            sluice run --chain chains/nat.yaml --mode local vs  FromDump -> Strip(14)
#                  (and --mode async, state in the embedded store)     -> CheckIPHeader
#                                                                      -> IPRewriter -> Discard
# each with one worker thread (`--workers 1`) and run to completion on the root thread
# (`--workers 0`, pairs `*-rtc`).
# Each side reads the same pcap file (in the page cache after the first run) and nobody writes
# output. Figures are whole-process times (start-up and pcap reading included, as for Click):
# wall-clock Mpps = packets / wall seconds, per-core Mpps = packets / (user + system seconds).
# Medians over the repetitions, ratios Sluice / Click per pair; JSON in OUT/peer-click.json.
#
# Click's source: no network here but the package registries, so give a git directory that has
# the pinned commit (`--click-git DIR`; the default is where this workspace's `fetch` tool puts
# a snapshot of github.com/kohler/click) or an unpacked copy of it (`--click-src DIR`). The
# pinned commit is Click's master of 2022-07-04 (9197a59): the last release, v2.0.1 (2011),
# does not build with GCC 12 (its C headers are included under keyword-renaming macros).
#
# Usage: scripts/peer-click.sh [--click-git DIR | --click-src DIR] [--rev COMMIT]
#                              [--workload 10000x100] [--size 64] [--repeat 5] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

click_git=/work/.mirror/kohler+click/repo
click_src=
rev=9197a594b1c314264935106297aff08d97cbe7ee
workload=10000x100
size=64
repeat=5
out=target/peers/results
while [ $# -gt 0 ]; do
  case "$1" in
    --click-git) click_git="$2"; shift 2 ;;
    --click-src) click_src="$2"; shift 2 ;;
    --rev) rev="$2"; shift 2 ;;
    --workload) workload="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "peer-click: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$repeat" in ''|*[!0-9]*|0) echo "peer-click: --repeat must be a positive number" >&2; exit 2 ;; esac

prefix="$PWD/target/peers/click-${rev:0:7}"
click="$prefix/bin/click"
if [ ! -x "$click" ]; then
  for tool in g++ make; do
    command -v "$tool" >/dev/null || {
      sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
      $sudo apt-get update -qq && $sudo apt-get install -y -qq g++ make; break; }
  done
  build="$PWD/target/peers/click-build-${rev:0:7}"
  rm -rf "$build" && mkdir -p "$build"
  if [ -n "$click_src" ]; then
    cp -a "$click_src"/. "$build"/
  elif git -C "$click_git" rev-parse -q --verify "$rev^{commit}" >/dev/null 2>&1; then
    git -C "$click_git" archive "$rev" | tar -x -C "$build"
  else
    echo "peer-click: no Click source: give --click-src DIR (an unpacked copy) or --click-git DIR (a clone with commit $rev)" >&2
    exit 2
  fi
  echo "== building Click ${rev:0:7} (userlevel) into $prefix" >&2
  (cd "$build" && ./configure -q --enable-userlevel --disable-linuxmodule --disable-bsdmodule --prefix="$prefix" \
     && make -s -j"$(nproc)" && make -s install) >"$build.log" 2>&1 \
    || { echo "peer-click: building Click failed, see $build.log" >&2; exit 1; }
fi

echo "== cargo build --release -p sluice-cli" >&2
cargo build --release --quiet -p sluice-cli
sluice="${CARGO_TARGET_DIR:-target}/release/sluice"

mkdir -p "$out"
trace="$out/trace-$workload-$size.pcap"
[ -f "$trace" ] || "$sluice" gen --workload "$workload" --size "$size" --seed 1 --output "$trace" -q
packets=$("$sluice" inspect "$trace" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["packets"])')

cat >"$out/passthrough.click" <<EOF
FromDump($PWD/$trace, STOP true) -> Discard;
EOF
cat >"$out/nat.click" <<EOF
rw :: IPRewriter(pattern 198.51.100.1 1024-65535 - - 0 0);
FromDump($PWD/$trace, STOP true) -> Strip(14) -> CheckIPHeader -> rw -> Discard;
EOF

# One timed run: prints "wall user sys".
timed() {
  local TIMEFORMAT='%R %U %S' t
  t=$( { time "$@" >/dev/null 2>"$out/last.err"; } 2>&1 ) || { echo "peer-click: failed: $* (see $out/last.err)" >&2; exit 1; }
  echo "$t"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

pairs=(
  "passthrough|$sluice run --chain chains/passthrough.yaml --input $trace -q --workers 1 --mode local|$click $out/passthrough.click"
  "nat-local|$sluice run --chain chains/nat.yaml --input $trace -q --workers 1 --mode local|$click $out/nat.click"
  "nat-async|$sluice run --chain chains/nat.yaml --input $trace -q --workers 1 --mode async|$click $out/nat.click"
  "passthrough-rtc|$sluice run --chain chains/passthrough.yaml --input $trace -q --workers 0 --mode local|$click $out/passthrough.click"
  "nat-local-rtc|$sluice run --chain chains/nat.yaml --input $trace -q --workers 0 --mode local|$click $out/nat.click"
  "nat-async-rtc|$sluice run --chain chains/nat.yaml --input $trace -q --workers 0 --mode async|$click $out/nat.click"
)
json="["
for p in "${pairs[@]}"; do
  IFS='|' read -r name a b <<<"$p"
  : >"$out/$name.a"; : >"$out/$name.b"
  # shellcheck disable=SC2086 # the commands are word lists on purpose
  timed $a >/dev/null; timed $b >/dev/null   # warm-up (page cache, code)
  for _ in $(seq "$repeat"); do
    # shellcheck disable=SC2086
    timed $a >>"$out/$name.a"
    # shellcheck disable=SC2086
    timed $b >>"$out/$name.b"
  done
  stats=$(paste "$out/$name.a" "$out/$name.b" | awk -v n="$packets" '{
    printf "%.6f %.6f %.6f %.6f %.6f %.6f\n", n/$1/1e6, n/($2+$3)/1e6, n/$4/1e6, n/($5+$6)/1e6, $4/$1, ($5+$6)/($2+$3) }')
  col() { echo "$stats" | awk -v c="$1" '{print $c}' | median; }
  sw=$(col 1); sc=$(col 2); cw=$(col 3); cc=$(col 4); rw=$(col 5); rc=$(col 6)
  printf '%-12s sluice %7.3f Mpps wall %7.3f per core | click %7.3f wall %7.3f per core | ratio %.3f wall %.3f per core\n' \
    "$name" "$sw" "$sc" "$cw" "$cc" "$rw" "$rc"
  json+="{\"pair\":\"$name\",\"packets\":$packets,\"repeat\":$repeat,\"sluice_mpps\":$sw,\"sluice_mpps_per_core\":$sc,"
  json+="\"click_mpps\":$cw,\"click_mpps_per_core\":$cc,\"ratio_wall\":$rw,\"ratio_per_core\":$rc},"
done
json="${json%,}]"
echo "$json" | python3 -m json.tool >"$out/peer-click.json"
echo "raw times (wall user sys per run) in $out/*.a (Sluice) and *.b (Click); summary $out/peer-click.json" >&2
