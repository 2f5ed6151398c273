//! `sluice node`: one process per machine (or network namespace) that registers in etcd under
//! a lease it keeps alive, follows the units the controller assigns it (one JSON line on stdout
//! per change), and — given the `sluice run` options of its part with `--run` — hosts them: once
//! the controller's placement has settled, it runs its part of the chain spread over the nodes
//! the placement names (`node_host`).

use crate::cluster::{counter, gauge, metrics_route, seconds, ClusterArgs, ControlArgs, LifeArgs};
use crate::node_host::{Host, HostArgs};
use crate::{exit, fail, Failure};
use clap::Args;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use sluice_cluster::{assignment_at, crash_asked, watch_assignment, ClusterError, Etcd, Membership, NodeInfo, Unit};
use sluice_runtime::live::Live;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

/// `sluice node`.
#[derive(Args)]
pub struct NodeArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    life: LifeArgs,
    #[command(flatten)]
    control: ControlArgs,
    /// This node's id, unique among the cluster's live nodes.
    #[arg(long)]
    id: String,
    /// Where other nodes send this node packets (`HOST:PORT` of its link).
    #[arg(long, default_value = "127.0.0.1:6081")]
    addr: String,
    /// What this node hosts: `root`, `nf` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "root,nf")]
    roles: Vec<String>,
    /// Seconds to keep trying while etcd (or the store, with --store) cannot be reached at
    /// start.
    #[arg(long, default_value_t = 30.0)]
    join_timeout: f64,
    /// The state store this node's NF instances use (`redis://HOST:PORT`,
    /// `redis+cluster://H1:P1,H2:P2,...` or `sluice://HOST:PORT?token=T&space=S`, see `sluice
    /// run --store`). The node registers only
    /// once the store answers, saying which store it waits for and retrying with backoff, so a
    /// node that cannot reach the state is never given units; afterwards it checks the store
    /// every few seconds (`sluice_node_store_up`).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    #[command(flatten)]
    host: HostArgs,
}

/// How often a node checks its store after joining.
const STORE_CHECK_EVERY: Duration = Duration::from_secs(3);

/// Waits until the store at `url` answers (connects and loads Sluice's functions), retrying
/// with a pause growing from 100 ms to 5 s, for at most `give_up`. A malformed URL fails at once.
fn wait_for_store(url: &str, give_up: Duration, stats: &NodeStats, stop: &AtomicBool) -> Result<(), Failure> {
    crate::store_cmd::check_store_url(url)?;
    if url == "embedded" {
        // Checking it would start a private store every few seconds that no other node sees.
        return Err(fail(exit::INVALID)(anyhow::anyhow!(
            "--store embedded: a node's state must be reachable from other nodes (redis://, redis+cluster:// or sluice:// from `sluice store serve`)"
        )));
    }
    let deadline = std::time::Instant::now() + give_up;
    let mut wait = Duration::from_millis(100);
    loop {
        match crate::store_cmd::open_store(url, 1).map_err(|f| f.error) {
            Ok(_) => {
                stats.store_up.store(true, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) => {
                stats.store_errors.fetch_add(1, Ordering::Relaxed);
                if stop.load(Ordering::Relaxed) || std::time::Instant::now() + wait > deadline {
                    return Err(fail(exit::FAILED)(anyhow::anyhow!(
                        "cannot reach the store {url} (gave up after {} s): {e}",
                        give_up.as_secs_f64()
                    )));
                }
                tracing::warn!(store = url, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot reach the store; retrying");
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Checks the store every [`STORE_CHECK_EVERY`] on a thread of its own, keeping
/// `sluice_node_store_up` current and logging when it stops or starts answering.
fn watch_store(url: String, stats: Arc<NodeStats>) {
    std::thread::spawn(move || loop {
        std::thread::sleep(STORE_CHECK_EVERY);
        let up = match crate::store_cmd::open_store(&url, 1).map_err(|f| f.error) {
            Ok(_) => true,
            Err(e) => {
                stats.store_errors.fetch_add(1, Ordering::Relaxed);
                if stats.store_up.load(Ordering::Relaxed) {
                    tracing::warn!(store = %url, error = %e, "the store stopped answering");
                }
                false
            }
        };
        if up && !stats.store_up.load(Ordering::Relaxed) {
            tracing::info!(store = %url, "the store answers again");
        }
        stats.store_up.store(up, Ordering::Relaxed);
    });
}

/// What a node has done, read by its metrics.
#[derive(Debug, Default)]
struct NodeStats {
    registered: AtomicBool,
    joins: AtomicU64,
    roots: AtomicU64,
    instances: AtomicU64,
    assignment_changes: AtomicU64,
    etcd_errors: AtomicU64,
    /// With `--store`: the store answered the last check.
    store_up: AtomicBool,
    /// With `--store`: checks the store failed.
    store_errors: AtomicU64,
    /// With `--run`: this node's part of the chain runs.
    running: AtomicBool,
}

impl NodeStats {
    fn assigned(&self, units: &[Unit]) {
        let roots = units.iter().filter(|u| matches!(u, Unit::Root(_))).count() as u64;
        self.roots.store(roots, Ordering::Relaxed);
        self.instances.store(units.len() as u64 - roots, Ordering::Relaxed);
        self.assignment_changes.fetch_add(1, Ordering::Relaxed);
    }
}

/// A node's metrics.
#[derive(Debug, Clone)]
struct NodeMetrics(Arc<NodeStats>);

impl Collector for NodeMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            &mut enc,
            "sluice_node_registered",
            "1 while the node is registered under a live lease.",
            u64::from(s.registered.load(Ordering::Relaxed)),
        )?;
        counter(
            &mut enc,
            "sluice_node_joins",
            "Registrations (more than one: the lease expired and the node joined again).",
            get(&s.joins),
        )?;
        gauge(&mut enc, "sluice_node_roots", "Roots assigned to the node now.", get(&s.roots))?;
        gauge(&mut enc, "sluice_node_instances", "NF instances assigned to the node now.", get(&s.instances))?;
        counter(
            &mut enc,
            "sluice_node_assignment_changes",
            "Changes of the node's assignment it has followed.",
            get(&s.assignment_changes),
        )?;
        counter(
            &mut enc,
            "sluice_node_etcd_errors",
            "Failed reads or watches of its assignment (retried).",
            get(&s.etcd_errors),
        )?;
        gauge(
            &mut enc,
            "sluice_node_store_up",
            "1 while the node's state store (--store) answers its checks.",
            u64::from(s.store_up.load(Ordering::Relaxed)),
        )?;
        counter(
            &mut enc,
            "sluice_node_store_errors",
            "Checks of the node's state store that failed.",
            get(&s.store_errors),
        )?;
        gauge(
            &mut enc,
            "sluice_node_running",
            "1 while the node's part of the chain runs (--run).",
            u64::from(s.running.load(Ordering::Relaxed)),
        )
    }
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
    if let Ok(line) = serde_json::to_value(NodeEvent { event, node, units }) {
        print_line(&line);
    }
}

/// Prints one JSON line on stdout. A reader that went away (`sluice node | head -1`) costs
/// the lines, not the node: `println!` would panic on the broken pipe.
pub(crate) fn print_line(line: &serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Runs a node until stopped (or, hosting its units, until its run ends): registered under a
/// lease, following its assignment.
pub fn cmd_node(a: NodeArgs) -> Result<(), Failure> {
    let (etcd, ttl) = (a.cluster.connect()?, a.life.ttl()?);
    let give_up = seconds("--join-timeout", a.join_timeout).map_err(fail(exit::INVALID))?;
    if let Some(r) = a.roles.iter().find(|r| !matches!(r.as_str(), "root" | "nf")) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--roles: `{r}` is not `root` or `nf`")));
    }
    let cluster = a.cluster.cluster.clone();
    let mut host = Host::new(&a.host, &a.id, &cluster)?;
    let info = NodeInfo { id: a.id.clone(), addr: a.addr.clone(), roles: a.roles.clone() };
    let stop = crate::run_cmd::stop_flag(a.life.duration);
    let stats = Arc::new(NodeStats::default());
    a.control.start(|| metrics_route(NodeMetrics(stats.clone())))?;
    if let Some(url) = &a.store {
        wait_for_store(url, give_up, &stats, &stop)?;
        tracing::info!(node = %a.id, store = %url, "the store answers");
        watch_store(url.clone(), stats.clone());
    }
    let join = || {
        let m = Membership::join_retrying(&etcd, &cluster, &info, ttl, give_up)?;
        stats.registered.store(true, Ordering::Relaxed);
        stats.joins.fetch_add(1, Ordering::Relaxed);
        Ok::<_, ClusterError>(m)
    };
    let mut membership = join().map_err(|e| fail(join_code(&e))(e.into()))?;
    say("joined", &a.id, None);
    watch_for_asks(etcd.clone(), cluster.clone(), a.id.clone(), host.as_ref().map(Host::live));
    let mut units: Option<Vec<Unit>> = None;
    let mut pause = Duration::from_millis(100);
    let mut ended = None;
    'node: while !stop.load(Ordering::Relaxed) {
        // Read the assignment, then follow its changes until the watch ends or the
        // registration is lost (then register again: the controller may have moved
        // everything away meanwhile, and the next read says so). etcd may refuse for a moment
        // (a member failed, a raft election): say so and try again after a growing pause.
        let read = assignment_at(&etcd, &cluster, &a.id)
            .and_then(|(now, revision)| Ok((now, follow(&etcd, &cluster, &a.id, revision + 1)?)));
        let (now, changes) = match read {
            Ok(r) => r,
            Err(e) => {
                stats.etcd_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(node = %a.id, error = %e, retry_in_ms = pause.as_millis() as u64, "cannot read the assignment; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(100);
        if units.as_ref() != Some(&now) {
            say("assignment", &a.id, Some(&now));
            stats.assigned(&now);
            units = Some(now);
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if membership.is_lost() {
                stats.registered.store(false, Ordering::Relaxed);
                tracing::warn!(node = %a.id, "registration lost (lease expired); joining again");
                say("lost", &a.id, None);
                membership = loop {
                    match join() {
                        Ok(m) => break m,
                        Err(e) if join_code(&e) == exit::INVALID => return Err(fail(exit::INVALID)(e.into())),
                        Err(e) => {
                            if stop.load(Ordering::Relaxed) {
                                return Ok(());
                            }
                            tracing::warn!(node = %a.id, error = %e, "cannot register again; retrying");
                            std::thread::sleep(Duration::from_secs(1));
                        }
                    }
                };
                say("joined", &a.id, None);
                break;
            }
            match changes.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(next)) => {
                    if units.as_ref() != Some(&next) {
                        say("assignment", &a.id, Some(&next));
                        stats.assigned(&next);
                        units = Some(next);
                    }
                }
                Ok(Err(e)) => {
                    stats.etcd_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %a.id, error = %e, "assignment watch failed; reading it again");
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if let Some(h) = host.as_mut() {
                let result = h.tick(&etcd, units.as_deref().unwrap_or_default());
                stats.running.store(h.is_running(), Ordering::Relaxed);
                if let Some(result) = result {
                    ended = Some(result);
                    break 'node;
                }
            }
        }
    }
    // A run still going ends with the process's stop flag, which ended the loop.
    let ended = match ended {
        Some(result) => Some(result),
        None => host.and_then(Host::wait),
    };
    membership.leave().map_err(|e| fail(exit::FAILED)(e.into()))?;
    stats.registered.store(false, Ordering::Relaxed);
    say("left", &a.id, None);
    ended.unwrap_or(Ok(()))
}

/// How often a node looks for a crash drill or a request of its run asked of it.
const CRASH_CHECK_EVERY: Duration = Duration::from_millis(200);

/// Looks for what is asked of `node` through etcd, on threads of their own (an etcd that
/// answers slowly or not at all delays only these looks, not the node's other work): a crash
/// drill of the whole node on one; requests of the run it hosts (`live`, once that runs) — a
/// crash drill of one of its units, a live change, its view — each answered with what the
/// run's control endpoint would answer, on the other. Apart, because the run answers a change
/// only once it has made it (up to `live::PATIENCE`): a drill of the whole node asked
/// meanwhile must not wait for that.
fn watch_for_asks(etcd: Etcd, cluster: String, node: String, live: Option<Arc<OnceLock<Arc<Live>>>>) {
    let (drill_etcd, drill_cluster, drill_node) = (etcd.clone(), cluster.clone(), node.clone());
    std::thread::spawn(move || loop {
        std::thread::sleep(CRASH_CHECK_EVERY);
        if crash_asked(&drill_etcd, &drill_cluster, &drill_node).unwrap_or(false) {
            crash_drill(&drill_node);
        }
    });
    std::thread::spawn(move || loop {
        std::thread::sleep(CRASH_CHECK_EVERY);
        let run = live.as_ref().and_then(|l| l.get());
        if let Err(e) = answer_run_requests(&etcd, &cluster, &node, run.map(|r| &**r), live.is_some()) {
            tracing::debug!(node, error = %e, "reading the requests of the run asked");
        }
    });
}

/// Applies the requests asked of this node ([`sluice_cluster::ask_run`]) to its run and
/// answers each: a `{"view": {}}` with the run's live statistics (what its endpoint's `GET
/// /api/v1/chain` gives), any other as its endpoint answers the action; without a run
/// (`hosts`: whether the node was started with `--run`) each is refused, saying why.
fn answer_run_requests(
    etcd: &Etcd,
    cluster: &str,
    node: &str,
    run: Option<&Live>,
    hosts: bool,
) -> Result<(), sluice_cluster::ClusterError> {
    for asked in sluice_cluster::take_run_requests(etcd, cluster, node)? {
        let (status, body) = match run {
            Some(live) if asked.action.get("view").is_some() => match serde_json::to_value(live.snapshot()) {
                Ok(view) => (axum::http::StatusCode::OK, view),
                Err(e) => {
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, serde_json::json!({ "error": e.to_string() }))
                }
            },
            Some(live) => crate::control::apply_action(live, &asked.action),
            None => {
                let why = if hosts {
                    format!("node `{node}` has not started its part of the chain yet (the placement settles first)")
                } else {
                    format!("node `{node}` hosts no run (started without --run)")
                };
                (axum::http::StatusCode::CONFLICT, serde_json::json!({ "error": why }))
            }
        };
        if !status.is_success() {
            tracing::warn!(node, action = %asked.action, answer = %body, "request of the run refused");
        } else if asked.action.get("view").is_none() {
            tracing::warn!(node, action = %asked.action, "request of the run applied");
        }
        let answer = sluice_cluster::RunAnswer { status: status.as_u16(), body };
        sluice_cluster::answer_run_request(etcd, cluster, node, &asked.id, &answer)?;
    }
    Ok(())
}

/// A crash drill was asked (`sluice ctl crash-node`, [`sluice_cluster::ask_crash`]): the process
/// dies at once, as under `kill -9` — no run report, no leaving the cluster, nothing flushed —
/// so that what the chain does next is what it does for a real crash.
fn crash_drill(node: &str) {
    tracing::warn!(node, "crash drill: killing this process (SIGKILL)");
    // SIGKILL cannot be caught: on success the call does not return.
    if let Err(e) = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL) {
        tracing::error!(node, error = %e, "crash drill: could not kill this process");
    }
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
