//! `sluice controller` and `sluice node`: a chain's control plane across processes, on etcd.
//!
//! The controller campaigns for leadership of its cluster and, while it leads, keeps the
//! placement of the chain's roots and NF instances in step with the live nodes
//! (`sluice_cluster::Controller`). A node registers under a lease it keeps alive and follows its
//! assignment (`node_cmd`, which also hosts the assigned units with `--run`). `sluice cluster`
//! reads and changes that state in etcd directly.

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
use sluice_cluster::{ClusterError, Controller, ControllerStats, Demand, Etcd, Unit};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where etcd is and which cluster: shared by every cluster command.
#[derive(Args)]
pub struct ClusterArgs {
    /// etcd's client endpoint (its HTTP/JSON gateway, which every etcd ≥ 3.4 serves).
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    pub(crate) etcd: String,
    /// Cluster name: every key lives under `/sluice/CLUSTER/`.
    #[arg(long, default_value = "default")]
    pub(crate) cluster: String,
}

impl ClusterArgs {
    pub(crate) fn connect(&self) -> Result<Etcd, Failure> {
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
    pub(crate) duration: Option<f64>,
}

impl LifeArgs {
    pub(crate) fn ttl(&self) -> Result<Duration, Failure> {
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
    /// /api/v1/cluster`, `GET /api/v1/chain` (the hosted run's live view, from the root's
    /// node) and `POST /api/v1/actions` (see `sluice ctl`).
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

/// A controller's API: the cluster's status, drain or undrain a node (`{"drain": {"node":
/// "a"}}`), crash drills of a node, an instance or the root, straight from and to etcd; and
/// `scale`, `move` and `clone` and the run's live view (`GET /api/v1/chain`), asked of the
/// root's node's run and answered with its answer.
fn controller_api(etcd: Etcd, cluster: String) -> Router {
    let (e2, c2) = (etcd.clone(), cluster.clone());
    let (e3, c3) = (etcd.clone(), cluster.clone());
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
            "/api/v1/chain",
            get(move || {
                let (etcd, cluster) = (e3.clone(), c3.clone());
                async move { node_answer(etcd, cluster, Unit::Root(0), serde_json::json!({ "view": {} })).await }
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
    let usage = "send one action: {\"drain\": {\"node\": N}}, {\"undrain\": {\"node\": N}}, {\"crash_node\": {\"node\": N}}, {\"crash\": {\"vertex\": V, \"instance\": I}}, {\"crash_root\": {}}, {\"scale\": {\"vertex\": V, \"to\": N}}, {\"move\": {\"vertex\": V, \"from\": I, \"to\": J}} or {\"clone\": {\"vertex\": V, \"instance\": I}}";
    let Some((name, args)) = v.as_object().filter(|o| o.len() == 1).and_then(|o| o.iter().next()) else {
        return control::error(StatusCode::BAD_REQUEST, usage);
    };
    let action = match name.as_str() {
        "drain" => NodeAction::Drain,
        "undrain" => NodeAction::Undrain,
        "crash_node" => NodeAction::Crash,
        "crash" => {
            let (Some(vertex), Some(index)) =
                (args["vertex"].as_str(), args["instance"].as_u64().and_then(|i| u16::try_from(i).ok()))
            else {
                return control::error(StatusCode::BAD_REQUEST, usage);
            };
            let unit = Unit::Instance { vertex: vertex.to_string(), index };
            return node_answer(etcd, cluster, unit, v.clone()).await;
        }
        "crash_root" => {
            let Some(root) = control::root_to_crash(args) else {
                return control::error(StatusCode::BAD_REQUEST, control::CRASH_ROOT_USAGE);
            };
            return node_answer(etcd, cluster, Unit::Root(root.into()), v.clone()).await;
        }
        "scale" | "move" | "clone" => {
            if control::change_of(name, args).is_none() {
                return control::error(StatusCode::BAD_REQUEST, control::CHANGE_USAGE);
            }
            return node_answer(etcd, cluster, Unit::Root(0), v.clone()).await;
        }
        n => {
            return control::error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "unknown action `{n}` (known: drain, undrain, crash_node, crash, crash_root, scale, move, clone)"
                ),
            )
        }
    };
    let Some(node) = args["node"].as_str().map(str::to_string) else {
        return control::error(StatusCode::BAD_REQUEST, usage);
    };
    let n = node.clone();
    let done = tokio::task::spawn_blocking(move || {
        let live = || sluice_cluster::nodes(&etcd, &cluster).map(|(live, _)| live.iter().any(|x| x.id == n));
        match action {
            // Asked of the node's registration, which says whether it is live.
            NodeAction::Crash => sluice_cluster::ask_crash(&etcd, &cluster, &n),
            _ if !live()? => Ok(false),
            NodeAction::Drain => sluice_cluster::drain(&etcd, &cluster, &n).map(|()| true),
            NodeAction::Undrain => sluice_cluster::undrain(&etcd, &cluster, &n).map(|()| true),
        }
    })
    .await;
    match done {
        Ok(Ok(true)) => Json(serde_json::json!({ "applied": { name.as_str(): { "node": node } } })).into_response(),
        Ok(Ok(false)) => control::error(StatusCode::NOT_FOUND, &format!("no live node `{node}`")),
        Ok(Err(e @ ClusterError::BadName { .. })) => control::error(StatusCode::BAD_REQUEST, &e.to_string()),
        Ok(Err(e)) => control::error(StatusCode::BAD_GATEWAY, &format!("etcd: {e}")),
        Err(e) => control::error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// How long the controller's API waits for the root's node to answer a request (the node
/// looks every 200 ms; etcd may be slow for a moment).
const ANSWER_PATIENCE: Duration = Duration::from_secs(10);

/// Why no node answered a live change, as the API's status and the reason.
type NoAnswer = (StatusCode, String);

/// A request of the hosted run (a crash drill of `unit`; with root 0, a live change or the
/// live view), asked of the node the placement gives `unit` ([`sluice_cluster::ask_unit`]):
/// that node's answer, `Err` with the reason when none came (the unit placed on no live node,
/// the node gone or silent). Blocks for up to [`ANSWER_PATIENCE`]: the controller's API and
/// `sluice cluster` both call it.
fn ask_node_of(
    etcd: &Etcd,
    cluster: &str,
    unit: &Unit,
    action: &serde_json::Value,
) -> Result<Result<(String, sluice_cluster::RunAnswer), NoAnswer>, ClusterError> {
    let Some((node, id)) = sluice_cluster::ask_unit(etcd, cluster, unit, action)? else {
        let what = match unit {
            Unit::Root(n) => format!("root {n}"),
            Unit::Instance { vertex, index } => format!("{vertex}:{index}"),
        };
        return Ok(Err((StatusCode::NOT_FOUND, format!("no live node hosts {what}"))));
    };
    match sluice_cluster::wait_for_answer(etcd, cluster, &node, &id, ANSWER_PATIENCE)? {
        Some(answer) => Ok(Ok((node, answer))),
        None if !sluice_cluster::node_is_live(etcd, cluster, &node)? => {
            Ok(Err((StatusCode::NOT_FOUND, format!("node `{node}` left (its run ended) before it answered"))))
        }
        None => Ok(Err((
            StatusCode::GATEWAY_TIMEOUT,
            format!("node `{node}` did not answer within {} s", ANSWER_PATIENCE.as_secs()),
        ))),
    }
}

/// The controller's API for a request of the hosted run: what the run of the node the
/// placement gives `unit` answered ([`ask_node_of`]) — applied, or refused with the reason (a
/// vertex not whole on the root's node, a run started without `--scalable` or without fault
/// tolerance) — with the node named.
async fn node_answer(etcd: Etcd, cluster: String, unit: Unit, action: serde_json::Value) -> Response {
    let done = tokio::task::spawn_blocking(move || ask_node_of(&etcd, &cluster, &unit, &action)).await;
    match done {
        Ok(Ok(Ok((node, answer)))) => {
            let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut body = answer.body;
            if let Some(o) = body.as_object_mut() {
                o.insert("node".into(), node.into());
            }
            (status, Json(body)).into_response()
        }
        Ok(Ok(Err((status, why)))) => control::error(status, &why),
        Ok(Err(e @ ClusterError::BadName { .. })) => control::error(StatusCode::BAD_REQUEST, &e.to_string()),
        Ok(Err(e)) => control::error(StatusCode::BAD_GATEWAY, &format!("etcd: {e}")),
        Err(e) => control::error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// What an action does to its node.
#[derive(Clone, Copy)]
enum NodeAction {
    Drain,
    Undrain,
    Crash,
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

pub(crate) fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
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
    /// The leading controller, the nodes (drained or not), the units placed on each and, where
    /// it differs, what the run a node hosts serves now (a live scale-out adds instances).
    Status {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    #[command(flatten)]
    Node(NodeCommand),
    /// A drill: one instance crashes alone (`V:I`), on the node the placement gives it; the
    /// chain replaces it on the root's node and replays what it held (the run needs
    /// --fault-tolerance and a store).
    Crash {
        /// The instance, `VERTEX:INDEX`.
        instance: String,
    },
    /// A drill: the root crashes, on the node the placement gives it; a new root takes over
    /// there and resumes the clock, reading the log back with `--log store` (the run needs
    /// --fault-tolerance).
    CrashRoot,
    #[command(flatten)]
    Change(control::RunChange),
}

/// Acting on one node: from `sluice cluster` (through etcd) or `sluice ctl` (through a
/// controller's endpoint).
#[derive(clap::Subcommand)]
pub(crate) enum NodeCommand {
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
    /// A drill: the node kills its own process at once, as `kill -9` would (within 200 ms),
    /// and the chain fails its instances over as for any crash.
    CrashNode {
        /// The node's id.
        node: String,
    },
}

impl NodeCommand {
    /// The action as a controller's endpoint takes it.
    pub(crate) fn action(&self) -> serde_json::Value {
        match self {
            NodeCommand::Drain { node } => serde_json::json!({ "drain": { "node": node } }),
            NodeCommand::Undrain { node } => serde_json::json!({ "undrain": { "node": node } }),
            NodeCommand::CrashNode { node } => serde_json::json!({ "crash_node": { "node": node } }),
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
    /// What the controller placed on it.
    units: Vec<Unit>,
    /// What its hosted run serves now (scaling and failovers change it); absent for a node
    /// hosting no run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    running: Option<Vec<Unit>>,
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
    let mut running = sluice_cluster::running(etcd, cluster)?;
    let units_of = |id: &str| placement.iter().filter(|(_, n)| *n == id).map(|(u, _)| u.clone()).collect();
    let mut nodes: Vec<NodeStatus> = live
        .into_iter()
        .map(|n| NodeStatus {
            drained: drained_nodes.contains(&n.id),
            units: units_of(&n.id),
            running: running.remove(&n.id),
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
        let list = |units: &[Unit]| {
            let texts: Vec<String> = units.iter().map(unit_text).collect();
            if texts.is_empty() {
                "-".to_string()
            } else {
                texts.join(" ")
            }
        };
        // What the run serves now, where it differs from what was placed.
        let now = n.running.as_deref().filter(|r| *r != n.units.as_slice());
        out.push_str(&format!(
            "  {:<12} {:<21} {:<8}{} {}{}\n",
            n.id,
            n.addr,
            n.roles.join(","),
            if n.drained { " drained" } else { "" },
            list(&n.units),
            now.map_or(String::new(), |r| format!(" (its run serves now: {})", list(r)))
        ));
    }
    for x in &s.stranded {
        out.push_str(&format!("  {} still assigned to `{}`, which is gone\n", unit_text(&x.unit), x.node));
    }
    out
}

/// Status, drain, undrain and crash drills, straight from etcd (where the controller keeps its state).
pub fn cmd_cluster(a: ClusterCmdArgs) -> Result<(), Failure> {
    let etcd = a.cluster.connect()?;
    let cluster = &a.cluster.cluster;
    let io = |e: ClusterError| match e {
        ClusterError::BadName { .. } => fail(exit::INVALID)(e.into()),
        e => fail(exit::FAILED)(e.into()),
    };
    match a.what {
        ClusterCommand::Node(NodeCommand::Drain { node }) => {
            sluice_cluster::drain(&etcd, cluster, &node).map_err(io)?;
            eprintln!("node `{node}` drained: the controller moves its units to the other nodes");
        }
        ClusterCommand::Node(NodeCommand::Undrain { node }) => {
            sluice_cluster::undrain(&etcd, cluster, &node).map_err(io)?;
            eprintln!("node `{node}` can host units again");
        }
        ClusterCommand::Node(NodeCommand::CrashNode { node }) => {
            if !sluice_cluster::ask_crash(&etcd, cluster, &node).map_err(io)? {
                return Err(fail(exit::INVALID)(anyhow::anyhow!("no live node `{node}`")));
            }
            eprintln!("node `{node}` asked to crash: it kills its process within 200 ms");
        }
        ClusterCommand::Crash { instance } => {
            let bad = || fail(exit::INVALID)(anyhow::anyhow!("`{instance}` is not VERTEX:INDEX"));
            let (vertex, index) = instance.split_once(':').ok_or_else(bad)?;
            let index: u16 = index.parse().map_err(|_| bad())?;
            let unit = Unit::Instance { vertex: vertex.to_string(), index };
            let action = serde_json::json!({ "crash": { "vertex": vertex, "instance": index } });
            let node = ask_and_report(&etcd, cluster, &unit, Ok(action))?;
            eprintln!("node `{node}` crashed {vertex}:{index}: its run fails it over");
        }
        ClusterCommand::CrashRoot => {
            let action = serde_json::json!({ "crash_root": {} });
            let node = ask_and_report(&etcd, cluster, &Unit::Root(0), Ok(action))?;
            eprintln!("node `{node}` crashed the root: a new root took over");
        }
        ClusterCommand::Change(c) => {
            let node = ask_and_report(&etcd, cluster, &Unit::Root(0), c.action())?;
            eprintln!("node `{node}` made the change");
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

/// `sluice cluster crash|crash-root|scale|move|clone`: `action` asked of the run of the node
/// the placement gives `unit` ([`ask_node_of`]), its answer printed (JSON on stdout when
/// applied; a refusal is an error with the node's reason). The node that applied it.
fn ask_and_report(
    etcd: &Etcd,
    cluster: &str,
    unit: &Unit,
    action: Result<serde_json::Value, String>,
) -> Result<String, Failure> {
    let action = action.map_err(|e| fail(exit::INVALID)(anyhow::anyhow!(e)))?;
    let asked = ask_node_of(etcd, cluster, unit, &action).map_err(|e| match e {
        ClusterError::BadName { .. } => fail(exit::INVALID)(e.into()),
        e => fail(exit::FAILED)(e.into()),
    })?;
    match asked {
        Ok((node, answer)) if (200..300).contains(&answer.status) => {
            println!("{}", answer.body);
            Ok(node)
        }
        Ok((node, answer)) => {
            let why = answer.body["error"].as_str().map_or_else(|| answer.body.to_string(), str::to_string);
            let code = if answer.status == 400 { exit::INVALID } else { exit::FAILED };
            Err(fail(code)(anyhow::anyhow!("node `{node}` refused it ({}): {why}", answer.status)))
        }
        Err((status, why)) => {
            let code = if status == StatusCode::NOT_FOUND { exit::INVALID } else { exit::FAILED };
            Err(fail(code)(anyhow::anyhow!(why)))
        }
    }
}

fn unit_text(u: &Unit) -> String {
    match u {
        Unit::Root(r) => format!("root{r}"),
        Unit::Instance { vertex, index } => format!("{vertex}:{index}"),
    }
}
