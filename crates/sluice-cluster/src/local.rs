//! A single-member etcd on loopback, started from the `etcd` binary and stopped when dropped:
//! what the tests and a one-machine try-out (docs/deploy.md) run the cluster on.

use crate::etcd::Etcd;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a local etcd did not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalEtcdError {
    /// No `etcd` binary where Debian's `etcd-server` package puts it.
    #[error("etcd is not installed (looked for {0}); `apt-get install etcd-server` provides it")]
    NotInstalled(String),
    /// Spawning it, or finding free ports, failed.
    #[error("cannot start etcd: {0}")]
    Io(#[from] std::io::Error),
    /// It did not answer in time.
    #[error("etcd did not answer at {endpoint} within {waited:?}; it said: {said}")]
    NoAnswer {
        /// Its client endpoint.
        endpoint: String,
        /// How long we waited.
        waited: Duration,
        /// The end of what it wrote to its log.
        said: String,
    },
    /// It stopped before it answered (a port taken, a bad data directory).
    #[error("etcd for {endpoint} exited ({status}) before it answered; it said: {said}")]
    Exited {
        /// Its client endpoint.
        endpoint: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// The end of what it wrote to its log.
        said: String,
    },
}

/// Where the `etcd` binary is looked for.
const CANDIDATES: [&str; 2] = ["/usr/bin/etcd", "/usr/local/bin/etcd"];

/// One etcd member on loopback ports of its own, killed when dropped.
#[derive(Debug)]
pub struct LocalEtcd {
    child: Child,
    endpoint: String,
    /// Where its stderr goes (beside its data directory).
    log: PathBuf,
}

fn free_port() -> std::io::Result<u16> {
    TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port())
}

/// `n` distinct free loopback ports: all held at once while they are chosen, so none repeats.
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    held.iter().map(|l| l.local_addr().map(|a| a.port())).collect()
}

impl LocalEtcd {
    /// Starts etcd with its data under `data_dir` on free loopback ports, and waits (up to 20 s)
    /// until it grants a lease.
    /// A port another process takes between being chosen and etcd binding it (tests run side
    /// by side) makes etcd exit: it is started again, once, on fresh ports.
    pub fn start(data_dir: &Path) -> Result<LocalEtcd, LocalEtcdError> {
        match LocalEtcd::start_on(&data_dir.join("try1"), free_port()?) {
            Err(LocalEtcdError::Exited { .. }) => LocalEtcd::start_on(&data_dir.join("try2"), free_port()?),
            started => started,
        }
    }

    /// [`LocalEtcd::start`] with the client endpoint on `client_port` (e.g. one a client has
    /// been told to use before etcd was there).
    pub fn start_on(data_dir: &Path, client_port: u16) -> Result<LocalEtcd, LocalEtcdError> {
        // Chosen while the other is held: two free ports asked one after the other can be
        // the same one.
        let peer = free_ports(2)?.into_iter().find(|p| *p != client_port).unwrap_or(0);
        let peer = format!("http://127.0.0.1:{peer}");
        let mut member = LocalEtcd::spawn(data_dir, "local", client_port, &peer, &format!("local={peer}"))?;
        member.wait_ready()?;
        Ok(member)
    }

    /// A cluster of `members` etcd members on loopback (data under `data_dir/m<i>`), started
    /// together and each answering before this returns. Three members survive the loss of one.
    /// A port another process takes between being chosen and etcd binding it (tests run side
    /// by side) makes a member fail to start: the cluster is started again, once, on fresh ports.
    pub fn start_cluster(data_dir: &Path, members: usize) -> Result<Vec<LocalEtcd>, LocalEtcdError> {
        match LocalEtcd::try_start_cluster(&data_dir.join("try1"), members) {
            Ok(started) => Ok(started),
            Err(_) => LocalEtcd::try_start_cluster(&data_dir.join("try2"), members),
        }
    }

    fn try_start_cluster(data_dir: &Path, members: usize) -> Result<Vec<LocalEtcd>, LocalEtcdError> {
        std::fs::create_dir_all(data_dir)?;
        let free = free_ports(2 * members)?;
        let ports: Vec<(u16, String)> = free
            .chunks(2)
            .map(|p| (p.first().copied().unwrap_or(0), format!("http://127.0.0.1:{}", p.get(1).copied().unwrap_or(0))))
            .collect();
        let initial: Vec<String> = ports.iter().enumerate().map(|(i, (_, peer))| format!("m{i}={peer}")).collect();
        let initial = initial.join(",");
        let mut started = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            started.push(LocalEtcd::spawn(&data_dir.join(format!("m{i}")), &format!("m{i}"), *client, peer, &initial)?);
        }
        for m in &mut started {
            m.wait_ready()?;
        }
        Ok(started)
    }

    /// The client endpoints of `members`, comma-separated (what `Etcd::new` and `--etcd` take).
    pub fn endpoints(members: &[LocalEtcd]) -> String {
        members.iter().map(LocalEtcd::endpoint).collect::<Vec<_>>().join(",")
    }

    fn spawn(
        data_dir: &Path,
        name: &str,
        client_port: u16,
        peer_url: &str,
        initial: &str,
    ) -> Result<LocalEtcd, LocalEtcdError> {
        let bin = CANDIDATES
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| LocalEtcdError::NotInstalled(CANDIDATES.join(", ")))?;
        let endpoint = format!("http://127.0.0.1:{client_port}");
        let mut log = data_dir.as_os_str().to_owned();
        log.push(".log");
        let log = PathBuf::from(log);
        if let Some(parent) = log.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let stderr = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(["--name", name, "--data-dir"])
            .arg(data_dir)
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url])
            .args(["--initial-cluster", initial])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        Ok(LocalEtcd { child, endpoint, log })
    }

    /// Waits (up to 20 s) until this member grants a lease (it has a quorum); says at once if
    /// it exited instead.
    fn wait_ready(&mut self) -> Result<(), LocalEtcdError> {
        let waited = Duration::from_secs(20);
        let deadline = Instant::now() + waited;
        let etcd = self.client();
        while !etcd.as_ref().is_ok_and(|e| e.grant(Duration::from_secs(1)).is_ok()) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(LocalEtcdError::Exited { endpoint: self.endpoint.clone(), status, said: self.said() });
            }
            if Instant::now() > deadline {
                return Err(LocalEtcdError::NoAnswer { endpoint: self.endpoint.clone(), waited, said: self.said() });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The last lines of its log, where etcd says why it stopped.
    fn said(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        match lines.get(lines.len().saturating_sub(3)..) {
            Some(last) if !last.is_empty() => last.join(" | "),
            _ => format!("nothing (log {})", self.log.display()),
        }
    }

    /// Kills this member (SIGKILL), as a machine failure would; dropping it does the same.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its client endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A client of it (3 s timeout per request).
    pub fn client(&self) -> Result<Etcd, crate::EtcdError> {
        Etcd::new(&self.endpoint, Duration::from_secs(3))
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}
