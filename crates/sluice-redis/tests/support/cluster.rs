//! A Redis Cluster of three primaries with one replica each, started by a test on loopback
//! ports of its own, so that killing one of its nodes disturbs no other test. Shared by the
//! tests that kill a primary (`crates/sluice-redis/tests/failover.rs`,
//! `crates/sluice-cli/tests/correlated.rs`, which include this file by path; `busy.rs` takes
//! its `cli` and `wait_until`). It needs
//! `redis-server` and `redis-cli` (scripts/test-all.sh installs them).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster's server processes, killed when the test ends however it ends.
pub struct Cluster {
    dir: PathBuf,
    nodes: Vec<(u16, Child)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `redis-cli -p PORT ARGS`'s output.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (install redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits, checking every 100 ms, until `ok`; fails the test after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The process id the server on `port` reports.
pub fn pid_of(port: u16) -> Option<u32> {
    let info = cli(port, &["info", "server"]);
    info.lines().find_map(|l| l.strip_prefix("process_id:")).and_then(|v| v.trim().parse().ok())
}

/// Whether the server on `port` is a primary.
pub fn is_primary(port: u16) -> bool {
    cli(port, &["info", "replication"]).contains("role:master")
}

impl Cluster {
    /// Starts six nodes on `ports` in `dir` (a node timeout of one second, so a replica takes
    /// over within a few), creates the cluster and waits until every primary's replica is in
    /// sync.
    pub fn start(dir: &Path, ports: [u16; 6]) -> Cluster {
        let mut cluster = Cluster { dir: dir.to_path_buf(), nodes: Vec::new() };
        for p in ports {
            let child = cluster.spawn_node(p);
            cluster.nodes.push((p, child));
        }
        for p in ports {
            wait_until(&format!("node {p} to answer"), Duration::from_secs(10), || cli(p, &["ping"]).contains("PONG"));
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(out.status.success(), "cluster create: {}", String::from_utf8_lossy(&out.stdout));
        for p in ports {
            wait_until(&format!("node {p} to see the cluster ok"), Duration::from_secs(20), || {
                cli(p, &["cluster", "info"]).contains("cluster_state:ok")
            });
        }
        for p in ports {
            if is_primary(p) {
                wait_until(&format!("primary {p}'s replica to be in sync"), Duration::from_secs(20), || {
                    let r = cli(p, &["info", "replication"]);
                    r.contains("connected_slaves:1") && r.contains("state=online")
                });
            }
        }
        cluster
    }

    /// Starts (or restarts, with its cluster configuration) the node on `port`.
    fn spawn_node(&self, port: u16) -> Child {
        let d = self.dir.join(port.to_string());
        std::fs::create_dir_all(&d).expect("node dir");
        Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            .arg("--cluster-config-file")
            .arg(d.join("nodes.conf"))
            .arg("--dir")
            .arg(&d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (install redis-server)")
    }

    /// The seed list of a `redis+cluster://` URL: every node.
    pub fn seeds(&self) -> String {
        self.nodes.iter().map(|(p, _)| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// The port of a node that is a primary now.
    pub fn a_primary(&self) -> u16 {
        self.nodes.iter().map(|(p, _)| *p).find(|p| is_primary(*p)).expect("a primary")
    }

    /// Kills the node on `port` with SIGKILL, as a machine dies, after checking that the
    /// process answering there is the one this cluster started.
    pub fn kill(&mut self, port: u16) {
        let pid = pid_of(port).expect("the node's pid");
        let node = self.nodes.iter_mut().find(|(p, _)| *p == port).expect("its process");
        assert_eq!(node.1.id(), pid, "the process answering on {port} is the one started");
        node.1.kill().expect("SIGKILL the node");
        let _ = node.1.wait();
    }

    /// Waits until a surviving node other than `victim` is a primary without a replica: the
    /// failed primary's replica has taken over. Returns its port.
    pub fn wait_promoted(&self, victim: u16, limit: Duration) -> u16 {
        let survivors: Vec<u16> = self.nodes.iter().map(|(p, _)| *p).filter(|p| *p != victim).collect();
        let promoted = || {
            survivors.iter().copied().find(|p| {
                let r = cli(*p, &["info", "replication"]);
                r.contains("role:master") && r.contains("connected_slaves:0")
            })
        };
        wait_until("a replica to be promoted", limit, || promoted().is_some());
        promoted().expect("promoted")
    }

    /// Starts the node on `port` again (after [`Cluster::kill`]): it rejoins as a replica.
    pub fn restart(&mut self, port: u16) {
        let child = self.spawn_node(port);
        match self.nodes.iter_mut().find(|(p, _)| *p == port) {
            Some(node) => node.1 = child,
            None => self.nodes.push((port, child)),
        }
    }
}
