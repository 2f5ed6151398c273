//! What several integration tests share (each test crate uses some of it).
#![allow(dead_code)]

pub mod bridge;
pub mod nodes;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// A path in the repository.
pub fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

/// Runs `sluice ARGS` in the repository and waits for it.
pub fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).current_dir(repo("")).args(args).output().expect("run sluice")
}

/// Runs `sluice ARGS` like [`sluice`], but kills it after `limit` (a hung run fails its test
/// rather than the suite): `None` then.
pub fn sluice_within(args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run sluice");
    // Read both pipes while waiting, each on its own thread: a full pipe would stop the child
    // (read one after the other, a chatty stderr filled while stdout was read to its end).
    let (mut out, mut err) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let err_reader = std::thread::spawn(move || {
        let mut e = Vec::new();
        let _ = err.read_to_end(&mut e);
        e
    });
    let reader = std::thread::spawn(move || {
        let mut o = Vec::new();
        let _ = out.read_to_end(&mut o);
        (o, err_reader.join().unwrap_or_default())
    });
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for sluice") {
            let (stdout, stderr) = reader.join().expect("pipes");
            return Some(Output { status, stdout, stderr });
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            // What it said before it was killed (a stalled run logs what each instance holds)
            // goes with the failing test's output.
            if let Ok((_, stderr)) = reader.join() {
                eprintln!("sluice {args:?} killed after {limit:?}; it said:\n{}", String::from_utf8_lossy(&stderr));
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to end by itself; kills it and fails the test after `limit`.
pub fn ended_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait for sluice") {
            return s;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("sluice did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A command's stdout and stderr, as text.
pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A raw HTTP/1.1 request to `addr` (`HOST:PORT`): the status code and the body; status 0 if
/// nothing listens there (yet).
pub fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let len = body.len();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {len}\r\nConnection: close\r\n\r\n{body}"
    )
    .expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// Reads `child`'s stderr (piped) up to the line announcing its control endpoint; the endpoint's
/// `HOST:PORT` and the whole line. The rest of stderr goes to the test's output on a thread of
/// its own, so the run never blocks on a full pipe.
pub fn control_endpoint(child: &mut Child) -> (String, String) {
    let line = announced(child, "control endpoint: http://");
    let addr = line.trim_start_matches("control endpoint: http://").split_whitespace().next().unwrap_or_default();
    (addr.to_string(), line)
}

/// Reads `child`'s stderr (piped) up to the first line starting with `prefix` and returns it;
/// the rest goes to the test's output on a thread of its own (shown when a test fails: warnings
/// of a run that waits say what for), so the run never blocks on a full pipe.
pub fn announced(child: &mut Child, prefix: &str) -> String {
    let stderr = child.stderr.take().expect("stderr piped");
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines.next().and_then(Result::ok).unwrap_or_else(|| panic!("sluice ended without `{prefix}`"));
        if line.starts_with(prefix) {
            std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("sluice: {l}")));
            return line;
        }
    }
}

/// Runs `chain` over the first `limit` packets of `trace` with the fault schedule `faults`
/// (`sluice run --faults`), recording it, and checks what every such run must give: success,
/// every input packet out or dropped once, nothing left in the root's log, and a record
/// equivalent to the logical chain (`sluice verify --recorded`). The run's JSON report.
pub fn recorded_run(
    name: &str,
    (chain, trace, limit): (&str, &str, &str),
    faults: &str,
    extra: &[&str],
) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("sluice-recorded-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let mut args = vec!["run", "-c", chain, "-i", trace, "-q", "--no-pin", "--faults", faults, "--record", &d];
    // A window of 4,096 packets bounds what a replay redoes (the log holds at most a window).
    args.extend_from_slice(&["--json", "-", "--window", "4096", "--limit", limit]);
    args.extend_from_slice(extra);
    let o = sluice(&args);
    assert!(o.status.success(), "{name}: {}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ft = &report["fault_tolerance"];
    assert_eq!(ft["left_in_log"], 0, "{name}: {ft}");
    // Every input packet is out or dropped once: nothing lost, nothing duplicated.
    let n = |k: &str| report[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(n("packets_in"), n("packets_out") + n("dropped_total"), "{name}: {report}");
    let v = sluice(&["verify", "--recorded", &d]);
    assert_eq!(v.status.code(), Some(0), "{name}: {}", text(&v));
    assert!(text(&v).contains("EQUIVALENT"), "{name}: {}", text(&v));
    let _ = std::fs::remove_dir_all(dir);
    report
}

/// The token the tests' control endpoints take.
pub const CONTROL_TOKEN: &str = "s3cret";

/// Starts `sluice run` on 20,000 packets of the demo trace through `chains/example.yaml`,
/// paced to last a few seconds, fault-tolerant, recorded into `record`, its JSON report on
/// stdout, with a control endpoint (token [`CONTROL_TOKEN`]) and `extra` options: the child and
/// the endpoint's `HOST:PORT`.
pub fn paced_live_run(record: &str, extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .args(["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--limit", "20000", "--pace", "0.01"])
        .args(["-q", "--no-pin", "--window", "4096", "--fault-tolerance", "--record", record, "--json", "-"])
        .args(["--control", "0", "--control-token", CONTROL_TOKEN])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice run");
    let (addr, _) = control_endpoint(&mut child);
    (child, addr)
}

/// `sluice ctl ARGS` against the endpoint at `addr` (token [`CONTROL_TOKEN`]), which must
/// succeed: what it printed.
pub fn ctl(addr: &str, args: &[&str]) -> String {
    let port = addr.rsplit(':').next().unwrap_or_default();
    let o = sluice(&[&["ctl", "--control", port, "--token", CONTROL_TOKEN][..], args].concat());
    assert!(o.status.success(), "sluice ctl {args:?}: {}", text(&o));
    text(&o)
}

/// Writes the fault schedule `body` as `name` in `dir`; its path.
pub fn schedule(dir: &std::path::Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write schedule");
    p.to_string_lossy().into_owned()
}

/// Runs the example chain over the bundled trace with each case's fault schedule and options,
/// and checks that the run is refused as bad input (exit code 2) with a message that contains
/// the case's text.
pub fn refused_schedules(cases: &[(&str, &[&str], &str)]) {
    for (faults, extra, says) in cases {
        let mut args = vec!["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "-q", "--limit", "3000"];
        args.extend_from_slice(&["--faults", faults]);
        args.extend_from_slice(extra);
        let o = sluice(&args);
        assert_eq!(o.status.code(), Some(2), "{faults}: {}", text(&o));
        assert!(text(&o).contains(says), "{faults}: {}", text(&o));
    }
}

/// Posts each case's action to the control endpoint at `addr` and checks that it is refused
/// with the case's status and an answer that contains its text.
pub fn refused_actions(addr: &str, cases: &[(&str, u16, &str)]) {
    for (body, code, says) in cases {
        let (c, answer) = http(addr, "POST", "/api/v1/actions", Some(CONTROL_TOKEN), body);
        assert_eq!(c, *code, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
}

/// The Redis store a test uses, its keys under `prefix` and this process's id (each run its
/// own keys: a run starts from an empty store). Fails the test when the suite's Redis is not
/// there.
pub fn redis_store(prefix: &str) -> String {
    let Ok(url) = std::env::var("SLUICE_REDIS_URL") else {
        panic!("SLUICE_REDIS_URL is not set: run the suite through scripts/test-all.sh, which starts Redis");
    };
    format!("{url}?prefix={prefix}{}", std::process::id())
}

/// The Redis Cluster store a test uses, its keys under `prefix` and this process's id. Fails
/// the test when the suite's Redis Cluster is not there.
pub fn redis_cluster_store(prefix: &str) -> String {
    let Ok(url) = std::env::var("SLUICE_REDIS_CLUSTER_URL") else {
        panic!("SLUICE_REDIS_CLUSTER_URL is not set: run the suite through scripts/test-all.sh, which starts Redis");
    };
    format!("{url}?prefix={prefix}{}", std::process::id())
}

/// The YAML files of the repository's directory `dir`, sorted.
pub fn schedules(dir: &str) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(repo(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// A `sluice store serve` on a free loopback port, killed when dropped; `url` is its
/// `sluice://HOST:PORT`.
pub struct ServedStore {
    child: Child,
    /// The URL runs give as `--store`.
    pub url: String,
}

impl Drop for ServedStore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a [`ServedStore`] and waits for the address it prints.
pub fn served_store() -> ServedStore {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["store", "serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sluice store serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read the address");
    let url = line.split_whitespace().find(|w| w.starts_with("sluice://127.0.0.1:")).unwrap_or_default().to_string();
    assert!(!url.is_empty(), "{line}");
    ServedStore { child, url }
}

/// The seeds of a random test: `runs` from `base`, or `{var}_RUNS` from `{var}_SEED`.
pub fn seeds_from_env(var: &str, base: u64, runs: u64) -> std::ops::Range<u64> {
    let env = |k: &str| std::env::var(format!("{var}_{k}")).ok().and_then(|s| s.parse::<u64>().ok());
    let base = env("SEED").unwrap_or(base);
    base..base + env("RUNS").unwrap_or(runs)
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child's stdout read as JSON lines on a thread, each sent as it comes (a line that is not
/// JSON fails the test).
pub fn json_lines(out: std::process::ChildStdout) -> std::sync::mpsc::Receiver<serde_json::Value> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let v: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line: {line}: {e}"));
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    rx
}

/// The frames of a pcap file, sorted (outputs compared whatever order the paths interleaved).
pub fn sorted_frames(path: &Path) -> Vec<Vec<u8>> {
    let mut reader = sluice_io::TraceReader::open(path).expect("pcap");
    let mut out = Vec::new();
    while let Some(r) = reader.next_record().expect("record") {
        out.push(r.data.to_vec());
    }
    out.sort();
    out
}

/// Fails a test whose output `got` (sorted frames) differs from the one-process output `one`
/// (`want`, its sorted frames): says how many packets are missing (by position in `one`) or
/// extra, and keeps the run's directory `dir` (outputs, reports, records, the nodes' logs) out
/// of the scratch space first. `failovers` is the run's report of them.
pub fn differing_output(dir: &Path, one: &Path, got: &[Vec<u8>], want: &[Vec<u8>], failovers: &serde_json::Value) -> ! {
    let kept = keep(dir);
    panic!(
        "the output differs from the one-process output: {} packets out of {}, missing (position in the \
         one-process output) {:?}, extra {}; run kept in {kept}\nfailovers {failovers}",
        got.len(),
        want.len(),
        missing_positions(one, got),
        got.iter().filter(|f| want.binary_search(f).is_err()).count(),
    )
}

/// Copies a failed run's files (outputs, reports, records) out of its temporary directory, which
/// goes with the test, into the build's `target/` (`scripts/test-all.sh` removes its scratch
/// directory, TMPDIR, when it ends); where to.
pub fn keep(dir: &Path) -> String {
    let to = repo(&format!("target/sluice-kept-{}", std::process::id()));
    let _ = Command::new("cp").arg("-r").arg(dir).arg(&to).status();
    to.to_string_lossy().into_owned()
}

/// Positions, in the output `want` (in its order), of the frames `got` (sorted) lacks.
fn missing_positions(want: &Path, got: &[Vec<u8>]) -> Vec<usize> {
    let mut reader = sluice_io::TraceReader::open(want).expect("pcap");
    let mut left: std::collections::HashMap<Vec<u8>, usize> = std::collections::HashMap::new();
    for f in got {
        *left.entry(f.clone()).or_default() += 1;
    }
    let mut missing = Vec::new();
    let mut i = 0;
    while let Some(r) = reader.next_record().expect("record") {
        match left.get_mut(r.data) {
            Some(n) if *n > 0 => *n -= 1,
            _ => missing.push(i),
        }
        i += 1;
    }
    missing
}

/// The one-process run of the example chain over the demo trace, one worker: its output.
pub fn one_process(out: &Path, extra: &[&str]) -> Vec<u8> {
    let mut args =
        vec!["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "-w", "1", "-q", "--no-pin", "-o"];
    let out_s = out.to_string_lossy().into_owned();
    args.push(&out_s);
    args.extend_from_slice(extra);
    let o = sluice(&args);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::read(out).expect("output")
}

/// A spread file over `nodes` fresh loopback ports (names `a`, `b`, ...), root on `a`, with
/// `place` lines; its path.
pub fn spread_file(dir: &Path, nodes: usize, place: &[(&str, &str)]) -> PathBuf {
    spread_file_with(dir, nodes, place, "")
}

/// [`spread_file`] with `extra` lines.
pub fn spread_file_with(dir: &Path, nodes: usize, place: &[(&str, &str)], extra: &str) -> PathBuf {
    // Ports the system hands out now; freed again before the nodes bind them.
    let sockets: Vec<std::net::UdpSocket> =
        (0..nodes).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port")).collect();
    let mut yaml = String::from("nodes:\n");
    for (i, s) in sockets.iter().enumerate() {
        yaml += &format!("  {}: {}\n", (b'a' + i as u8) as char, s.local_addr().expect("addr"));
    }
    yaml += extra;
    yaml += "root: a\nplace:\n";
    for (what, node) in place {
        yaml += &format!("  {what}: {node}\n");
    }
    let path = dir.join(format!("spread-{nodes}.yaml"));
    std::fs::write(&path, yaml).expect("spread file");
    path
}

/// Per instance of `vertex` in a run's JSON report, in index order: (packets in, retired).
pub fn instances(report: &serde_json::Value, vertex: &str) -> Vec<(u64, bool)> {
    let vertices = report["vertices"].as_array().cloned().unwrap_or_default();
    let v = vertices.iter().find(|v| v["name"] == vertex).cloned().unwrap_or_default();
    let all = v["instances"].as_array().cloned().unwrap_or_default();
    all.iter().map(|i| (i["packets_in"].as_u64().unwrap_or(0), i["retired"].as_bool().unwrap_or(false))).collect()
}

/// The changes (scaling, moves, clones) a run's JSON report lists, as (kind, vertex,
/// instances after, flows).
pub fn reconfigurations(report: &serde_json::Value) -> Vec<(String, String, u64, u64)> {
    let all = report["reconfigurations"].as_array().cloned().unwrap_or_default();
    all.iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("kind"), s("vertex"), r["instances"][1].as_u64().unwrap_or(0), r["flows"].as_u64().unwrap_or(0))
        })
        .collect()
}
