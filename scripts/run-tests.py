#!/usr/bin/env python3
"""Builds the workspace's tests once, then runs the test binaries in two lanes side by side.

Why: `cargo test` runs one test binary after the other, and most of the suite's time is spent
waiting — for node processes, leases, TCP transfers in network namespaces — so a whole suite
used about one of the machine's two cores (docs/decisions.md, "Tests in two lanes"). The
`sluice-cli` binaries (node processes, namespaces, the live control endpoint: the tests most
sensitive to a busy machine) run in one lane at normal priority; every other binary runs in
the other lane at a lower priority (`nice`), so what waits for time keeps the cores it needs.
Resources the two lanes could share are kept apart by the tests themselves (namespaces and
scratch files are named after the process, fixed Redis ports differ per test file) and by the
environment: a variable `OTHER_LANE_X=v` sets `X=v` in the second lane only — scripts/test-all.sh
gives each lane its own Redis servers that way, since a long script one test runs on a server
makes every other client of that server wait.

The random fault schedules on Redis (`ALONE`) run by themselves after both lanes.

Each binary runs as `cargo test` would run it (in its package's directory, with the package's
`CARGO_*` variables); its output is printed whole when it ends, behind the same `Running` line
cargo prints, so a log reads as cargo's does. Every binary runs even after a failure; the exit
code is 1 if any failed. Arguments are passed to every test binary (a name filter, `--ignored`).

Usage: scripts/run-tests.py [test binary args...]
"""

import json
import os
import subprocess
import sys
import threading
import time

# The lane of normal priority: the package whose tests start processes and namespaces.
TIMED_PACKAGE = "sluice-cli"
# Priority of the other lane (nice(1) increment).
OTHER_LANE_NICE = "10"
# Tests that run alone once both lanes are done (binary → test name; the rest of the binary
# runs in its lane): the random fault schedules on Redis keep both cores and both lanes' Redis
# servers (`SLUICE_REDIS_MORE_URLS`) busy for two minutes and require every store call answered within the Redis backend's 10 s
# timeout, which a Redis server shared out with the first lane once missed (docs/decisions.md,
# "Tests in two lanes"). With arguments (a filter) every binary runs whole in its lane.
ALONE = {"tests/random_faults.rs": "random_runs_redis"}


def build():
    """Builds every test target; returns [(package, label, executable, package dir)]."""
    cmd = ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        pkg_dir = os.path.dirname(msg["manifest_path"])
        src = os.path.relpath(target["src_path"], pkg_dir)
        label = f"unittests {src}" if target["kind"] != ["test"] else src
        binaries.append((package_name(msg["package_id"]), label, msg["executable"], pkg_dir))
    if proc.wait() != 0:
        sys.exit(f"run-tests: `{' '.join(cmd)}` failed")
    binaries.sort(key=lambda b: (b[0], b[1]))
    return binaries


def package_name(package_id):
    """The name in a cargo package id: `path+file:///…/sluice-cli#0.1.0` (workspace members)
    or `sluice-cli 0.1.0 (path+file:///…)` (older cargo)."""
    if "#" in package_id:
        tail = package_id.rsplit("/", 1)[-1].split("#", 1)
        return tail[1].split("@", 1)[0] if "@" in tail[1] else tail[0]
    return package_id.split(" ", 1)[0]


class Results:
    """What every binary did, printed as each ends (one at a time)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.failed = []
        self.times = []

    def report(self, lane, label, exe, code, output, seconds):
        with self.lock:
            print(f"     Running {label} ({os.path.relpath(exe)}) [{lane} lane, {seconds:.1f} s]")
            sys.stdout.write(output)
            sys.stdout.flush()
            self.times.append((seconds, label, exe))
            if code != 0:
                self.failed.append(f"{label} ({os.path.relpath(exe)}): exit {code}")


OTHER_LANE_PREFIX = "OTHER_LANE_"


def lane_env(lane):
    """The environment of a lane's binaries: ours, with `OTHER_LANE_X=v` as `X=v` in the other."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OTHER_LANE_PREFIX)}
    if lane == "other":
        for k, v in os.environ.items():
            if k.startswith(OTHER_LANE_PREFIX):
                env[k[len(OTHER_LANE_PREFIX):]] = v
    return env


def run_lane(lane, runs, prefix, results):
    """Runs each (binary, its arguments) of `runs` in turn."""
    base = lane_env(lane)
    for (pkg, label, exe, pkg_dir), args in runs:
        env = dict(base, CARGO_MANIFEST_DIR=pkg_dir, CARGO_PKG_NAME=pkg, CARGO_CRATE_NAME=pkg.replace("-", "_"))
        t0 = time.monotonic()
        proc = subprocess.run(prefix + [exe] + args, cwd=pkg_dir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace")
        results.report(lane, label, exe, proc.returncode, proc.stdout, time.monotonic() - t0)


def main():
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    t0 = time.monotonic()
    binaries = build()
    timed, other, alone = [], [], []
    for b in binaries:
        lane = timed if b[0] == TIMED_PACKAGE else other
        test = None if args else ALONE.get(b[1])
        if test is None:
            lane.append((b, args))
        else:
            lane.append((b, ["--skip", test]))
            alone.append((b, [test, "--exact"]))
    print(f"== {len(binaries)} test binaries: {len(timed)} of {TIMED_PACKAGE} in one lane, "
          f"{len(other)} others in a second (nice {OTHER_LANE_NICE}), then {len(alone)} test(s) alone", flush=True)
    results = Results()
    lanes = [
        threading.Thread(target=run_lane, args=("timed", timed, [], results)),
        threading.Thread(target=run_lane, args=("other", other, ["nice", "-n", OTHER_LANE_NICE], results)),
    ]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    run_lane("alone", alone, [], results)
    print("== doc tests", flush=True)
    doc = subprocess.run(["cargo", "test", "--workspace", "--doc", "--"] + args)
    if doc.returncode != 0:
        results.failed.append(f"doc tests: exit {doc.returncode}")
    print("== slowest test binaries")
    for seconds, label, exe in sorted(results.times, reverse=True)[:10]:
        print(f"{seconds:8.1f} s  {label} ({os.path.basename(exe)})")
    print(f"== {len(binaries)} test binaries and the doc tests in {time.monotonic() - t0:.0f} s")
    if results.failed:
        print(f"== {len(results.failed)} failed:")
        for f in results.failed:
            print(f"   {f}")
        sys.exit(1)


if __name__ == "__main__":
    main()
