//! `sluice controller` and `sluice node`: a chain's control plane across processes, on etcd.
//!
//! The controller campaigns for leadership of its cluster and, while it leads, keeps the
//! placement of the chain's roots and NF instances in step with the live nodes
//! (`sluice_cluster::Controller`). A node registers under a lease it keeps alive and follows its
//! assignment; it prints every change of it as one JSON line on stdout. Hosting the assigned
//! units on the threaded runtime, and packets between nodes, come next (docs/deploy.md says
//! what runs today).

use crate::{exit, fail, Failure};
use anyhow::Context;
use clap::Args;
use sluice_cluster::{
    assignment_at, watch_assignment, ClusterError, Controller, Demand, Etcd, Membership, NodeInfo, Unit,
};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

/// Where etcd is and which cluster: shared by both commands.
#[derive(Args)]
pub struct ClusterArgs {
    /// etcd's client endpoint (its HTTP/JSON gateway, which every etcd ≥ 3.4 serves).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    etcd: String,
    /// Cluster name: every key lives under `/sluice/CLUSTER/`.
    #[arg(long, default_value = "default")]
    cluster: String,
    /// Seconds a registration (node) or leadership (controller) outlives a process that died.
    #[arg(long, default_value_t = 5.0)]
    ttl: f64,
    /// Stop after this many seconds (Ctrl-C and SIGTERM also stop cleanly).
    #[arg(long)]
    duration: Option<f64>,
}

impl ClusterArgs {
    fn connect(&self) -> Result<(Etcd, Duration), Failure> {
        let ttl = seconds("--ttl", self.ttl).map_err(fail(exit::INVALID))?;
        if ttl < Duration::from_secs(1) {
            return Err(fail(exit::INVALID)(anyhow::anyhow!(
                "--ttl must be at least 1 second (etcd's lease granularity)"
            )));
        }
        let etcd = Etcd::new(&self.etcd, Duration::from_secs(3))
            .with_context(|| format!("etcd endpoint `{}`", self.etcd))
            .map_err(fail(exit::INVALID))?;
        Ok((etcd, ttl))
    }
}

/// `sluice controller`.
#[derive(Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Chain file (YAML) whose roots and instances are placed (each vertex's `instances`).
    #[arg(long, short)]
    chain: PathBuf,
    /// Number of roots.
    #[arg(long, default_value_t = 1)]
    roots: u16,
    /// This controller's name in the election (default: `controller-PID`).
    #[arg(long)]
    name: Option<String>,
}

/// `sluice node`.
#[derive(Args)]
pub struct NodeArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// This node's id, unique among the cluster's live nodes.
    #[arg(long)]
    id: String,
    /// Where other nodes send this node packets (`HOST:PORT` of its link).
    #[arg(long, default_value = "127.0.0.1:6081")]
    addr: String,
    /// What this node hosts: `root`, `nf` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "root,nf")]
    roles: Vec<String>,
    /// Seconds to keep trying while etcd cannot be reached at start.
    #[arg(long, default_value_t = 30.0)]
    join_timeout: f64,
}

fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s >= 0.0) {
        anyhow::bail!("{flag} must be a non-negative number of seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

/// Runs the controller until stopped.
pub fn cmd_controller(a: ControllerArgs) -> Result<(), Failure> {
    let (etcd, ttl) = a.cluster.connect()?;
    let chain = sluice_runtime::spec::Chain::load(&a.chain).map_err(|e| fail(exit::INVALID)(e.into()))?;
    if a.roots == 0 {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--roots must be at least 1")));
    }
    let demand = Demand {
        roots: a.roots,
        vertices: chain.vertices.iter().map(|(name, v)| (name.clone(), v.instances.max(1))).collect(),
    };
    let name = a.name.unwrap_or_else(|| format!("controller-{}", std::process::id()));
    let controller = Controller { cluster: a.cluster.cluster.clone(), name: name.clone(), demand, ttl };
    let stop = crate::stop_flag(a.cluster.duration);
    eprintln!(
        "sluice controller `{name}`: cluster `{}` on {}, chain `{}` ({} root(s), {} vertices)",
        a.cluster.cluster,
        a.cluster.etcd,
        chain.name,
        a.roots,
        chain.vertices.len()
    );
    controller.run(&etcd, &stop).context("controller").map_err(fail(exit::FAILED))
}

/// One line of a node's stdout.
#[derive(serde::Serialize)]
struct NodeEvent<'a> {
    event: &'a str,
    node: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    units: Option<&'a [Unit]>,
}

fn say(event: &str, node: &str, units: Option<&[Unit]>) {
    if let Ok(line) = serde_json::to_string(&NodeEvent { event, node, units }) {
        println!("{line}");
    }
}

/// Runs a node until stopped: registered under a lease, following its assignment.
pub fn cmd_node(a: NodeArgs) -> Result<(), Failure> {
    let (etcd, ttl) = a.cluster.connect()?;
    let give_up = seconds("--join-timeout", a.join_timeout).map_err(fail(exit::INVALID))?;
    if let Some(r) = a.roles.iter().find(|r| !matches!(r.as_str(), "root" | "nf")) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--roles: `{r}` is not `root` or `nf`")));
    }
    let cluster = a.cluster.cluster.clone();
    let info = NodeInfo { id: a.id.clone(), addr: a.addr.clone(), roles: a.roles.clone() };
    let stop = crate::stop_flag(a.cluster.duration);
    let join = || Membership::join_retrying(&etcd, &cluster, &info, ttl, give_up);
    let mut membership = join().map_err(|e| fail(join_code(&e))(e.into()))?;
    say("joined", &a.id, None);
    let mut units: Option<Vec<Unit>> = None;
    while !stop.load(Ordering::Relaxed) {
        // Read the assignment, then follow its changes until the watch ends or the
        // registration is lost (then register again: the controller may have moved
        // everything away meanwhile, and the next read says so).
        let (now, revision) = assignment_at(&etcd, &cluster, &a.id).map_err(|e| fail(exit::FAILED)(e.into()))?;
        if units.as_ref() != Some(&now) {
            say("assignment", &a.id, Some(&now));
            units = Some(now);
        }
        let changes = follow(&etcd, &cluster, &a.id, revision + 1).map_err(|e| fail(exit::FAILED)(e.into()))?;
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if membership.is_lost() {
                tracing::warn!(node = %a.id, "registration lost (lease expired); joining again");
                say("lost", &a.id, None);
                membership = join().map_err(|e| fail(join_code(&e))(e.into()))?;
                say("joined", &a.id, None);
                break;
            }
            match changes.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(next)) => {
                    if units.as_ref() != Some(&next) {
                        say("assignment", &a.id, Some(&next));
                        units = Some(next);
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(node = %a.id, error = %e, "assignment watch failed; reading it again");
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    membership.leave().map_err(|e| fail(exit::FAILED)(e.into()))?;
    say("left", &a.id, None);
    Ok(())
}

fn join_code(e: &ClusterError) -> u8 {
    match e {
        ClusterError::BadName { .. } | ClusterError::NodeIdTaken(_) => exit::INVALID,
        _ => exit::FAILED,
    }
}

/// The node's assignment changes, from a thread blocked on the etcd watch (which ends when
/// etcd ends the stream; a node that stops leaves it blocked until then).
type Changes = mpsc::Receiver<Result<Vec<Unit>, ClusterError>>;

fn follow(etcd: &Etcd, cluster: &str, node: &str, from: i64) -> Result<Changes, ClusterError> {
    let mut watch = watch_assignment(etcd, cluster, node, from)?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Some(change) = watch.next_assignment() {
            let failed = change.is_err();
            if tx.send(change).is_err() || failed {
                return;
            }
        }
    });
    Ok(rx)
}
