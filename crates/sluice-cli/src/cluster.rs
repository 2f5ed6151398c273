//! `sluice controller` and `sluice node`: a chain's control plane across processes, on etcd.
//!
//! The controller campaigns for leadership of its cluster and, while it leads, keeps the
//! placement of the chain's roots and NF instances in step with the live nodes
//! (`sluice_cluster::Controller`). A node registers under a lease it keeps alive and follows its
//! assignment; it prints every change of it as one JSON line on stdout. Hosting the assigned
//! units on the threaded runtime, and packets between nodes, come next (docs/deploy.md says
//! what runs today).

use crate::{control, exit, fail, Failure};
use anyhow::Context;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use sluice_cluster::{
    assignment_at, watch_assignment, ClusterError, Controller, ControllerStats, Demand, Etcd, Membership, NodeInfo,
    Unit,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Where etcd is and which cluster: shared by every cluster command.
#[derive(Args)]
pub struct ClusterArgs {
    /// etcd's client endpoint (its HTTP/JSON gateway, which every etcd ≥ 3.4 serves).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    etcd: String,
    /// Cluster name: every key lives under `/sluice/CLUSTER/`.
    #[arg(long, default_value = "default")]
    cluster: String,
}

impl ClusterArgs {
    fn connect(&self) -> Result<Etcd, Failure> {
        Etcd::new(&self.etcd, Duration::from_secs(3))
            .with_context(|| format!("etcd endpoint `{}`", self.etcd))
            .map_err(fail(exit::INVALID))
    }
}

/// How long a long-running cluster process lives, and how long its lease outlives it.
#[derive(Args)]
pub struct LifeArgs {
    /// Seconds a registration (node) or leadership (controller) outlives a process that died.
    #[arg(long, default_value_t = 5.0)]
    ttl: f64,
    /// Stop after this many seconds (Ctrl-C and SIGTERM also stop cleanly).
    #[arg(long)]
    duration: Option<f64>,
}

impl LifeArgs {
    fn ttl(&self) -> Result<Duration, Failure> {
        let ttl = seconds("--ttl", self.ttl).map_err(fail(exit::INVALID))?;
        if ttl < Duration::from_secs(1) {
            return Err(fail(exit::INVALID)(anyhow::anyhow!(
                "--ttl must be at least 1 second (etcd's lease granularity)"
            )));
        }
        Ok(ttl)
    }
}

/// A cluster process's control endpoint.
#[derive(Args)]
pub struct ControlArgs {
    /// Serve a control endpoint: PORT (on 127.0.0.1) or HOST:PORT (any other address only when
    /// given). `GET /metrics` is Prometheus text; a controller also answers `GET
    /// /api/v1/cluster` and `POST /api/v1/actions` (see `sluice ctl`).
    #[arg(long, value_name = "ADDR", value_parser = control::parse_addr)]
    control: Option<SocketAddr>,
    /// The endpoint's token (default: $SLUICE_CONTROL_TOKEN, else a random one printed on
    /// stderr). Requests send `Authorization: Bearer TOKEN`.
    #[arg(long, requires = "control")]
    control_token: Option<String>,
}

impl ControlArgs {
    /// Starts the endpoint, if asked for, with `app`'s routes.
    pub(crate) fn start(&self, app: impl FnOnce() -> Router) -> Result<(), Failure> {
        let Some(addr) = self.control else { return Ok(()) };
        control::start(addr, self.control_token.as_deref(), app().fallback(not_found)).map(|_| ())
    }
}

async fn not_found() -> Response {
    control::error(
        StatusCode::NOT_FOUND,
        "no such endpoint (a node: GET /metrics; a controller also GET /api/v1/cluster and POST /api/v1/actions)",
    )
}

/// `GET /metrics` answering what `collector` says at each scrape.
pub(crate) fn metrics_route<C: Collector + Clone>(collector: C) -> Router {
    Router::new()
        .route("/metrics", get(move || std::future::ready(control::prometheus_text(Box::new(collector.clone())))))
}

/// A controller's API: the cluster's status, and drain or undrain a node (`{"drain": {"node":
/// "a"}}`), straight from and to etcd.
fn controller_api(etcd: Etcd, cluster: String) -> Router {
    let (e2, c2) = (etcd.clone(), cluster.clone());
    Router::new()
        .route(
            "/api/v1/cluster",
            get(move || {
                let (etcd, cluster) = (etcd.clone(), cluster.clone());
                async move {
                    match tokio::task::spawn_blocking(move || cluster_status(&etcd, &cluster)).await {
                        Ok(Ok(s)) => Json(s).into_response(),
                        Ok(Err(e)) => control::error(StatusCode::BAD_GATEWAY, &format!("etcd: {e}")),
                        Err(e) => control::error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
                    }
                }
            }),
        )
        .route(
            "/api/v1/actions",
            post(move |body: String| {
                let (etcd, cluster) = (e2.clone(), c2.clone());
                async move { cluster_action(etcd, cluster, &body).await }
            }),
        )
}

/// Applies one action sent to a controller's API.
async fn cluster_action(etcd: Etcd, cluster: String, body: &str) -> Response {
    let v: serde_json::Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return control::error(StatusCode::BAD_REQUEST, &format!("malformed JSON: {e}")),
    };
    let usage = "send one action: {\"drain\": {\"node\": N}} or {\"undrain\": {\"node\": N}}";
    let Some((name, args)) = v.as_object().filter(|o| o.len() == 1).and_then(|o| o.iter().next()) else {
        return control::error(StatusCode::BAD_REQUEST, usage);
    };
    let drain = match name.as_str() {
        "drain" => true,
        "undrain" => false,
        n @ ("scale" | "move" | "crash" | "clone") => {
            return control::error(
                StatusCode::NOT_IMPLEMENTED,
                &format!("nodes do not host units on the runtime yet, so the controller cannot `{n}`"),
            )
        }
        n => return control::error(StatusCode::BAD_REQUEST, &format!("unknown action `{n}` (known: drain, undrain)")),
    };
    let Some(node) = args["node"].as_str().map(str::to_string) else {
        return control::error(StatusCode::BAD_REQUEST, usage);
    };
    let known = {
        let (etcd, cluster, node) = (etcd.clone(), cluster.clone(), node.clone());
        tokio::task::spawn_blocking(move || {
            sluice_cluster::nodes(&etcd, &cluster).map(|(live, _)| live.iter().any(|n| n.id == node))
        })
        .await
    };
    match known {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return control::error(StatusCode::NOT_FOUND, &format!("no live node `{node}`")),
        Ok(Err(e)) => return control::error(StatusCode::BAD_GATEWAY, &format!("etcd: {e}")),
        Err(e) => return control::error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
    let n = node.clone();
    let done = tokio::task::spawn_blocking(move || {
        if drain {
            sluice_cluster::drain(&etcd, &cluster, &n)
        } else {
            sluice_cluster::undrain(&etcd, &cluster, &n)
        }
    })
    .await;
    match done {
        Ok(Ok(())) => Json(serde_json::json!({ "applied": { name.as_str(): { "node": node } } })).into_response(),
        Ok(Err(e @ ClusterError::BadName { .. })) => control::error(StatusCode::BAD_REQUEST, &e.to_string()),
        Ok(Err(e)) => control::error(StatusCode::BAD_GATEWAY, &format!("etcd: {e}")),
        Err(e) => control::error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Encodes one counter.
pub(crate) fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// Encodes one gauge.
pub(crate) fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A controller's metrics, read from its statistics at each scrape.
#[derive(Debug, Clone)]
struct ControllerMetrics {
    stats: Arc<ControllerStats>,
    /// Terms that ended in an error (etcd refused, leadership lost) before campaigning again.
    errors: Arc<AtomicU64>,
}

impl Collector for ControllerMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            &mut enc,
            "sluice_controller_leading",
            "1 while this controller leads.",
            u64::from(s.leading.load(Ordering::Relaxed)),
        )?;
        counter(&mut enc, "sluice_controller_terms", "Terms this controller has led.", get(&s.terms))?;
        counter(
            &mut enc,
            "sluice_controller_placements",
            "Placements published (node assignments changed).",
            get(&s.placements),
        )?;
        counter(
            &mut enc,
            "sluice_controller_unplaceable",
            "Times some unit could not be placed on any node.",
            get(&s.unplaceable),
        )?;
        counter(
            &mut enc,
            "sluice_controller_errors",
            "Terms ended by an error (etcd refused, leadership lost).",
            get(&self.errors),
        )?;
        gauge(
            &mut enc,
            "sluice_controller_units_placed",
            "Units (roots, NF instances) placed now.",
            get(&s.units_placed),
        )?;
        gauge(
            &mut enc,
            "sluice_controller_nodes_live",
            "Registered nodes the controller last saw.",
            get(&s.nodes_live),
        )?;
        gauge(&mut enc, "sluice_controller_nodes_drained", "Drained nodes among them.", get(&s.nodes_drained))
    }
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
        )
    }
}

/// `sluice controller`.
#[derive(Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    life: LifeArgs,
    #[command(flatten)]
    control: ControlArgs,
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

fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s >= 0.0) {
        anyhow::bail!("{flag} must be a non-negative number of seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

/// Runs the controller until stopped.
pub fn cmd_controller(a: ControllerArgs) -> Result<(), Failure> {
    let (etcd, ttl) = (a.cluster.connect()?, a.life.ttl()?);
    let chain = sluice_runtime::spec::Chain::load(&a.chain).map_err(|e| fail(exit::INVALID)(e.into()))?;
    if a.roots == 0 {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--roots must be at least 1")));
    }
    let demand = Demand {
        roots: a.roots,
        vertices: chain.vertices.iter().map(|(name, v)| (name.clone(), v.instances.max(1))).collect(),
    };
    let name = a.name.unwrap_or_else(|| format!("controller-{}", std::process::id()));
    let controller =
        Controller { cluster: a.cluster.cluster.clone(), name: name.clone(), demand, ttl, stats: Arc::default() };
    let errors = Arc::new(AtomicU64::new(0));
    let collector = ControllerMetrics { stats: controller.stats.clone(), errors: errors.clone() };
    let api = (etcd.clone(), a.cluster.cluster.clone());
    a.control.start(|| metrics_route(collector).merge(controller_api(api.0, api.1)))?;
    let stop = crate::run_cmd::stop_flag(a.life.duration);
    eprintln!(
        "sluice controller `{name}`: cluster `{}` on {}, chain `{}` ({} root(s), {} vertices)",
        a.cluster.cluster,
        a.cluster.etcd,
        chain.name,
        a.roots,
        chain.vertices.len()
    );
    // etcd can refuse for a moment (a member failed, a new raft leader is being elected) or a
    // term can end: campaign again after a pause that grows while it keeps failing.
    let mut pause = Duration::from_millis(100);
    while !stop.load(Ordering::Relaxed) {
        match controller.run(&etcd, &stop) {
            Ok(()) => break,
            Err(e) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(controller = %name, error = %e, retry_in_ms = pause.as_millis() as u64, "controller stopped leading; campaigning again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
    Ok(())
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
    let (etcd, ttl) = (a.cluster.connect()?, a.life.ttl()?);
    let give_up = seconds("--join-timeout", a.join_timeout).map_err(fail(exit::INVALID))?;
    if let Some(r) = a.roles.iter().find(|r| !matches!(r.as_str(), "root" | "nf")) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--roles: `{r}` is not `root` or `nf`")));
    }
    let cluster = a.cluster.cluster.clone();
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
    let mut units: Option<Vec<Unit>> = None;
    let mut pause = Duration::from_millis(100);
    while !stop.load(Ordering::Relaxed) {
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
        }
    }
    membership.leave().map_err(|e| fail(exit::FAILED)(e.into()))?;
    stats.registered.store(false, Ordering::Relaxed);
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

/// `sluice cluster`.
#[derive(Args)]
pub struct ClusterCmdArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(subcommand)]
    what: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// The leading controller, the nodes (drained or not) and the units each holds.
    Status {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    #[command(flatten)]
    Drain(DrainCommand),
}

/// Draining a node, from `sluice cluster` (through etcd) or `sluice ctl` (through a
/// controller's endpoint).
#[derive(clap::Subcommand)]
pub(crate) enum DrainCommand {
    /// Move every unit off a node and place nothing on it (it stays registered).
    Drain {
        /// The node's id.
        node: String,
    },
    /// Let a drained node host units again (nothing moves back by itself).
    Undrain {
        /// The node's id.
        node: String,
    },
}

impl DrainCommand {
    /// The action as a controller's endpoint takes it.
    pub(crate) fn action(&self) -> serde_json::Value {
        match self {
            DrainCommand::Drain { node } => serde_json::json!({ "drain": { "node": node } }),
            DrainCommand::Undrain { node } => serde_json::json!({ "undrain": { "node": node } }),
        }
    }
}

/// What `sluice cluster status` reports about one node.
#[derive(serde::Serialize, serde::Deserialize)]
struct NodeStatus {
    id: String,
    addr: String,
    roles: Vec<String>,
    drained: bool,
    units: Vec<Unit>,
}

/// A unit still assigned to a node that is gone (the controller has not re-placed it yet).
#[derive(serde::Serialize, serde::Deserialize)]
struct Stranded {
    unit: Unit,
    node: String,
}

/// The cluster as etcd holds it: `sluice cluster status`, a controller's `GET /api/v1/cluster`
/// and `sluice ctl nodes`.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct ClusterStatus {
    cluster: String,
    leader: Option<String>,
    nodes: Vec<NodeStatus>,
    stranded: Vec<Stranded>,
}

/// Reads the cluster's status from etcd.
fn cluster_status(etcd: &Etcd, cluster: &str) -> Result<ClusterStatus, ClusterError> {
    let leader = sluice_cluster::leader(etcd, cluster, "controller")?;
    let (live, _) = sluice_cluster::nodes(etcd, cluster)?;
    let drained_nodes = sluice_cluster::drained(etcd, cluster)?;
    let placement = sluice_cluster::stored_placement(etcd, cluster)?;
    let units_of = |id: &str| placement.iter().filter(|(_, n)| *n == id).map(|(u, _)| u.clone()).collect();
    let mut nodes: Vec<NodeStatus> = live
        .into_iter()
        .map(|n| NodeStatus {
            drained: drained_nodes.contains(&n.id),
            units: units_of(&n.id),
            id: n.id,
            addr: n.addr,
            roles: n.roles,
        })
        .collect();
    nodes.sort_by(|x, y| x.id.cmp(&y.id));
    let known: std::collections::BTreeSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    let stranded = placement
        .iter()
        .filter(|(_, n)| !known.contains(n.as_str()))
        .map(|(u, n)| Stranded { unit: u.clone(), node: n.clone() })
        .collect();
    Ok(ClusterStatus { cluster: cluster.to_string(), leader, nodes, stranded })
}

/// The status as text, a line per node.
pub(crate) fn status_text(s: &ClusterStatus) -> String {
    let mut out = format!(
        "cluster `{}`: controller {}\n",
        s.cluster,
        s.leader.as_deref().map_or("(none leading)".to_string(), |l| format!("`{l}` leads"))
    );
    for n in &s.nodes {
        let units: Vec<String> = n.units.iter().map(unit_text).collect();
        out.push_str(&format!(
            "  {:<12} {:<21} {:<8}{} {}\n",
            n.id,
            n.addr,
            n.roles.join(","),
            if n.drained { " drained" } else { "" },
            if units.is_empty() { "-".to_string() } else { units.join(" ") }
        ));
    }
    for x in &s.stranded {
        out.push_str(&format!("  {} still assigned to `{}`, which is gone\n", unit_text(&x.unit), x.node));
    }
    out
}

/// Status, drain and undrain, straight from etcd (where the controller keeps its state).
pub fn cmd_cluster(a: ClusterCmdArgs) -> Result<(), Failure> {
    let etcd = a.cluster.connect()?;
    let cluster = &a.cluster.cluster;
    let io = |e: ClusterError| match e {
        ClusterError::BadName { .. } => fail(exit::INVALID)(e.into()),
        e => fail(exit::FAILED)(e.into()),
    };
    match a.what {
        ClusterCommand::Drain(DrainCommand::Drain { node }) => {
            sluice_cluster::drain(&etcd, cluster, &node).map_err(io)?;
            eprintln!("node `{node}` drained: the controller moves its units to the other nodes");
        }
        ClusterCommand::Drain(DrainCommand::Undrain { node }) => {
            sluice_cluster::undrain(&etcd, cluster, &node).map_err(io)?;
            eprintln!("node `{node}` can host units again");
        }
        ClusterCommand::Status { json } => {
            let status = cluster_status(&etcd, cluster).map_err(io)?;
            if json {
                println!("{:#}", serde_json::to_value(&status).context("serialising the status")?);
            } else {
                print!("{}", status_text(&status));
            }
        }
    }
    Ok(())
}

fn unit_text(u: &Unit) -> String {
    match u {
        Unit::Root(r) => format!("root{r}"),
        Unit::Instance { vertex, index } => format!("{vertex}:{index}"),
    }
}
