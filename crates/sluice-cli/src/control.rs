//! The control endpoint of a running chain (`sluice run --control ADDR`) and its client
//! (`sluice ctl`). HTTP/JSON on a loopback address unless told otherwise; every request carries
//! `Authorization: Bearer TOKEN`. `GET /api/v1/chain`: the chain's vertices and instances with
//! live statistics (`sluice_runtime::live::LiveSnapshot`); `GET /metrics`: the same as
//! Prometheus text; `POST /api/v1/actions` with one fault-schedule action as JSON
//! (`{"slow": {"vertex": "nat", "instance": 0, "delay_us": [3, 10]}}`, `{"crash": {"vertex":
//! "nat", "instance": 0}}`, `{"scale": {"vertex": "lb", "to": 3}}` or `"by": -1`,
//! `{"move": {"vertex": "nat", "from": 0, "to": 1, "flows": 4000}}`, `{"clone": {"vertex":
//! "nat", "instance": 0}}`, `{"crash_root": {}}`, `{"crash_store": {}}`; instances by index,
//! as listed). Anything else gets a JSON error with a 4xx status and changes nothing.

use crate::{exit, fail, Failure};
use anyhow::Context;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::{Args, Subcommand};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use sluice_runtime::live::{Done, Live, LiveError, LiveSnapshot};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;

/// The environment variable that holds the token when `--control-token` is not given.
pub const TOKEN_ENV: &str = "SLUICE_CONTROL_TOKEN";

/// Parses `--control`: `PORT` (on 127.0.0.1) or `HOST:PORT`.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>().map_err(|_| format!("`{s}` is not PORT or HOST:PORT (e.g. 9464 or 127.0.0.1:9464)"))
}

/// The token: the one given, else the environment's, else a fresh random one.
pub fn token(given: Option<&str>) -> String {
    if let Some(t) = given.filter(|t| !t.is_empty()) {
        return t.to_string();
    }
    if let Ok(t) = std::env::var(TOKEN_ENV) {
        if !t.is_empty() {
            return t;
        }
    }
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Clone)]
struct Ctx {
    live: Arc<Live>,
    /// The run's Geneve input and output, if it has them.
    links: Option<Arc<crate::geneve_ports::LinkCounters>>,
}

pub(crate) fn error(status: StatusCode, msg: &str) -> Response {
    (status, Json(serde_json::json!({ "error": msg }))).into_response()
}

async fn authorize(State(token): State<Arc<str>>, headers: HeaderMap, req: Request, next: Next) -> Response {
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match given.and_then(|v| v.strip_prefix("Bearer ")) {
        None => error(StatusCode::UNAUTHORIZED, "missing token: send `Authorization: Bearer TOKEN`"),
        Some(t) if t != &*token => error(StatusCode::UNAUTHORIZED, "wrong token"),
        Some(_) => next.run(req).await,
    }
}

async fn chain(State(cx): State<Ctx>) -> Json<LiveSnapshot> {
    Json(cx.live.snapshot())
}

async fn metrics(State(cx): State<Ctx>) -> Response {
    let mut collectors: Vec<Box<dyn Collector>> = vec![Box::new(LiveCollector(cx.live.clone()))];
    if let Some(l) = &cx.links {
        collectors.push(Box::new(crate::geneve_ports::LinkCollector(l.clone())));
    }
    prometheus_texts(collectors)
}

/// What `collector` says now, as a Prometheus text response.
pub(crate) fn prometheus_text(collector: Box<dyn Collector>) -> Response {
    prometheus_texts(vec![collector])
}

/// What `collectors` say now, as one Prometheus text response.
fn prometheus_texts(collectors: Vec<Box<dyn Collector>>) -> Response {
    let mut registry = Registry::default();
    for c in collectors {
        registry.register_collector(c);
    }
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response(),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed"),
    }
}

async fn action(State(cx): State<Ctx>, body: String) -> Response {
    let (status, body) = match serde_json::from_str::<serde_json::Value>(&body) {
        // The answer waits for the run's root to act (at most `live::PATIENCE`): off the
        // threads that serve other requests.
        Ok(v) => tokio::task::spawn_blocking(move || apply_action(&cx.live, &v))
            .await
            .unwrap_or_else(|_| refusal(StatusCode::INTERNAL_SERVER_ERROR, "the action failed")),
        Err(e) => refusal(StatusCode::BAD_REQUEST, &format!("malformed JSON: {e}")),
    };
    (status, Json(body)).into_response()
}

/// An action's outcome: the status and the JSON body a run's control endpoint answers.
pub(crate) type Outcome = (StatusCode, serde_json::Value);

fn refusal(status: StatusCode, msg: &str) -> Outcome {
    (status, serde_json::json!({ "error": msg }))
}

fn applied(action: &str, args: serde_json::Value) -> Outcome {
    (StatusCode::OK, serde_json::json!({ "applied": { action: args } }))
}

/// The outcome of an action the root carries out: applied, with where in the run and what it
/// changed (`at_packet`, `change`), or refused.
fn answered(action: &str, args: serde_json::Value, r: Result<Done, LiveError>) -> Outcome {
    match r {
        Ok(done) => {
            let (status, mut body) = applied(action, args);
            if let (Some(map), Ok(serde_json::Value::Object(done))) = (body.as_object_mut(), serde_json::to_value(done))
            {
                map.extend(done.into_iter().filter(|(_, v)| !v.is_null()));
            }
            (status, body)
        }
        Err(e) => live_refusal(&e),
    }
}

/// The status of a run's refusal: 409 for what the run cannot do now, 400 for a change that
/// cannot be made, 404 for what it does not have.
fn live_refusal(e: &LiveError) -> Outcome {
    let status = match e {
        LiveError::NotTaken(_) => StatusCode::SERVICE_UNAVAILABLE,
        LiveError::Refused(_) => StatusCode::CONFLICT,
        LiveError::BadChange(_) | LiveError::BadDelay { .. } => StatusCode::BAD_REQUEST,
        LiveError::NoVertex(_) | LiveError::NoInstance { .. } | LiveError::NoRoot(_) => StatusCode::NOT_FOUND,
    };
    refusal(status, &e.to_string())
}

/// Applies one action (`{"scale": {...}}`, ...) to the run `live` drives: what its control
/// endpoint does with a request, and what a hosting node does with a change the controller
/// asks of its run (`node_cmd.rs`).
pub(crate) fn apply_action(live: &Live, v: &serde_json::Value) -> Outcome {
    let Some((name, args)) = v.as_object().filter(|o| o.len() == 1).and_then(|o| o.iter().next()) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "send one action: {\"slow\": {\"vertex\": V, \"instance\": I, \"delay_us\": [MIN, MAX]}}",
        );
    };
    match name.as_str() {
        "slow" => slow(live, args),
        "crash" => crash(live, args),
        "scale" | "move" | "clone" => change(live, name, args),
        "crash_root" => crash_root(live, args),
        "crash_store" => crash_store(live, args),
        n => refusal(
            StatusCode::BAD_REQUEST,
            &format!("unknown action `{n}` (known: slow, crash, crash_root, crash_store, scale, move, clone)"),
        ),
    }
}

fn slow(live: &Live, args: &serde_json::Value) -> Outcome {
    let vertex = args["vertex"].as_str();
    let instance = args["instance"].as_u64().and_then(|i| u16::try_from(i).ok());
    let delay = args["delay_us"].as_array().and_then(|d| match d.as_slice() {
        [a, b] => a.as_u64().zip(b.as_u64()),
        _ => None,
    });
    let (Some(vertex), Some(instance), Some((min, max))) = (vertex, instance, delay) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "slow needs vertex (a name), instance (a number) and delay_us ([MIN, MAX] µs)",
        );
    };
    match live.set_slow(vertex, instance, min, max) {
        Ok(()) => {
            applied("slow", serde_json::json!({ "vertex": vertex, "instance": instance, "delay_us": [min, max] }))
        }
        Err(e) => live_refusal(&e),
    }
}

fn crash(live: &Live, args: &serde_json::Value) -> Outcome {
    let vertex = args["vertex"].as_str();
    let instance = args["instance"].as_u64().and_then(|i| u16::try_from(i).ok());
    let (Some(vertex), Some(instance)) = (vertex, instance) else {
        return refusal(StatusCode::BAD_REQUEST, "crash needs vertex (a name) and instance (a number)");
    };
    let r = live.request_crash(vertex, instance);
    answered("crash", serde_json::json!({ "vertex": vertex, "instance": instance }), r)
}

/// What a `crash_root` action takes.
pub(crate) const CRASH_ROOT_USAGE: &str = "crash_root takes {} or {\"root\": N}";

/// The root a `crash_root` action names: `{}` (root 0) or `{"root": N}`; `None` for anything
/// else (the endpoint of a run and a controller's take the same).
pub(crate) fn root_to_crash(args: &serde_json::Value) -> Option<u8> {
    let only_root = args.is_null() || args.as_object().is_some_and(|o| o.keys().all(|k| k == "root"));
    match &args["root"] {
        _ if !only_root => None,
        serde_json::Value::Null => Some(0),
        r => r.as_u64().and_then(|r| u8::try_from(r).ok()),
    }
}

/// A `crash_root` action: `{}` or `{"root": 0}`.
fn crash_root(live: &Live, args: &serde_json::Value) -> Outcome {
    let Some(root) = root_to_crash(args) else { return refusal(StatusCode::BAD_REQUEST, CRASH_ROOT_USAGE) };
    answered("crash_root", serde_json::json!({ "root": root }), live.request_root_crash(root))
}

/// A `crash_store` action: `{}`.
fn crash_store(live: &Live, args: &serde_json::Value) -> Outcome {
    if !args.as_object().is_some_and(|o| o.is_empty()) && !args.is_null() {
        return refusal(StatusCode::BAD_REQUEST, "crash_store takes {}");
    }
    answered("crash_store", serde_json::json!({}), live.request_store_crash())
}

/// What a `scale`, `move` or `clone` action takes.
pub(crate) const CHANGE_USAGE: &str = "scale needs vertex (a name) and to (a count) or by (a signed count); move needs vertex, from and to (instance indices) and optionally flows; clone needs vertex and instance";

/// The vertex and change of a `scale` (`to` or `by`), `move` (`from`, `to`, optional `flows`)
/// or `clone` (`instance`) action; `None` if its arguments are not those (the endpoint of a
/// run and a controller's take the same).
pub(crate) fn change_of(name: &str, args: &serde_json::Value) -> Option<(String, sluice_runtime::exec::Change)> {
    use sluice_runtime::exec::Change;
    let vertex = args["vertex"].as_str()?;
    let num = |k: &str| args[k].as_u64().and_then(|i| u16::try_from(i).ok());
    let change = match (name, args["to"].as_u64(), args["by"].as_i64()) {
        ("scale", Some(_), None) => num("to").map(Change::ScaleTo),
        ("scale", None, Some(by)) => i32::try_from(by).ok().map(Change::ScaleBy),
        ("move", _, _) => {
            num("from").zip(num("to")).map(|(from, to)| Change::Move { from, to, flows: args["flows"].as_u64() })
        }
        ("clone", _, _) => num("instance").map(|instance| Change::Clone { instance }),
        _ => None,
    }?;
    Some((vertex.to_string(), change))
}

/// A `scale`, `move` or `clone` action.
fn change(live: &Live, name: &str, args: &serde_json::Value) -> Outcome {
    let Some((vertex, change)) = change_of(name, args) else { return refusal(StatusCode::BAD_REQUEST, CHANGE_USAGE) };
    answered(name, args.clone(), live.request_change(&vertex, change))
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint: GET /api/v1/chain, GET /metrics or POST /api/v1/actions")
}

/// Binds `addr` and serves a run's control endpoint on a thread of its own for as long as the
/// process lives (see [`start`] for the token). Returns the address bound (a port of 0 picks
/// one).
pub fn serve(
    addr: SocketAddr,
    given_token: Option<&str>,
    live: Arc<Live>,
    links: Option<Arc<crate::geneve_ports::LinkCounters>>,
) -> Result<SocketAddr, Failure> {
    let app = Router::new()
        .route("/api/v1/chain", get(chain))
        .route("/metrics", get(metrics))
        .route("/api/v1/actions", post(action))
        .fallback(not_found)
        .with_state(Ctx { live, links });
    start(addr, given_token, app)
}

/// Serves `app` as a control endpoint on `addr` behind a token: the one given, else
/// `$SLUICE_CONTROL_TOKEN`, else a random one, printed on stderr with the address (a token
/// given is not printed).
pub(crate) fn start(addr: SocketAddr, given_token: Option<&str>, app: Router) -> Result<SocketAddr, Failure> {
    let token = token(given_token);
    let bound = serve_app(addr, token.clone(), app, "control endpoint")?;
    let given = given_token.is_some_and(|t| !t.is_empty()) || std::env::var(TOKEN_ENV).is_ok_and(|t| !t.is_empty());
    if given {
        eprintln!("control endpoint: http://{bound}");
    } else {
        eprintln!("control endpoint: http://{bound} (token {token})");
    }
    Ok(bound)
}

/// Serves `app`, every request needing `Authorization: Bearer TOKEN`, on `addr` (`what` names
/// it in errors), from a thread of its own.
fn serve_app(addr: SocketAddr, token: String, app: Router, what: &str) -> Result<SocketAddr, Failure> {
    let listener = TcpListener::bind(addr)
        .with_context(|| format!("binding the {what} to {addr}"))
        .map_err(fail(exit::INVALID))?;
    let bound = listener.local_addr().with_context(|| format!("{what} address"))?;
    listener.set_nonblocking(true).with_context(|| format!("{what} socket"))?;
    let token: Arc<str> = token.into();
    let app = app.layer(middleware::from_fn_with_state(token, authorize));
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_io().build().with_context(|| format!("{what} runtime"))?;
    let name = what.to_string();
    std::thread::Builder::new()
        .name("sluice-http".into())
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => {
                        if let Err(e) = axum::serve(l, app).await {
                            tracing::error!(error = %e, endpoint = %name, "endpoint stopped");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, endpoint = %name, "endpoint socket"),
                }
            })
        })
        .with_context(|| format!("starting the {what}"))?;
    Ok(bound)
}

/// The labels of an instance's metrics.
fn labels(v: &sluice_runtime::live::LiveVertex, i: &sluice_runtime::live::LiveInstance) -> Vec<(&'static str, String)> {
    vec![("vertex", v.name.clone()), ("instance", i.index.to_string())]
}

/// The live statistics as Prometheus metrics, read on every scrape.
#[derive(Debug)]
struct LiveCollector(Arc<Live>);

impl Collector for LiveCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut s = self.0.snapshot();
        // A chain spread over nodes: an instance on another node is counted by that node's
        // endpoint; here it would be a series of zeros beside the real one.
        for v in &mut s.vertices {
            v.instances.retain(|i| !i.elsewhere);
        }
        for (name, help, v) in [
            ("sluice_root_packets_in", "Packets the root read.", s.packets_in),
            ("sluice_packets_out", "Packets that left the chain.", s.packets_out),
            ("sluice_root_dropped", "Packets the root dropped (malformed, window full, no route).", s.root_dropped),
        ] {
            let c = ConstCounter::new(v);
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let mut gauges = vec![("sluice_in_flight", "Packets in the chain now.", s.in_flight)];
        if let Some(l) = &s.root_log {
            gauges.push(("sluice_root_log_entries", "Packets in the root's log now.", l.left_in_log));
            gauges.push(("sluice_root_log_peak", "Most packets in the root's log at once.", l.log_peak));
            for (name, help, v) in [
                ("sluice_root_log_deleted", "Log entries deleted (copies done, updates committed).", l.deleted),
                ("sluice_root_log_commits", "Store acknowledgements folded into the log's XOR vectors.", l.commits),
                (
                    "sluice_duplicates_suppressed",
                    "Copies dropped at the egress as duplicates of a clock that left.",
                    l.duplicates_suppressed,
                ),
            ] {
                let c = ConstCounter::new(v);
                c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
            }
        }
        for (name, help, v) in gauges {
            let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        type Field = fn(&sluice_runtime::live::LiveInstance) -> u64;
        let counters: [(&str, &str, Field); 4] = [
            ("sluice_instance_packets_in", "Packets an instance took in.", |i| i.packets_in),
            ("sluice_instance_forwarded", "Packets an instance passed on.", |i| i.forwarded),
            ("sluice_instance_consumed", "Packets an off-path instance consumed.", |i| i.consumed),
            ("sluice_instance_dropped", "Packets an instance dropped.", |i| i.dropped),
        ];
        for (name, help, field) in counters {
            let mut fam = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for v in &s.vertices {
                for i in &v.instances {
                    ConstCounter::new(field(i)).encode(fam.encode_family(&labels(v, i))?)?;
                }
            }
        }
        type Keyed = fn(&sluice_runtime::live::LiveInstance) -> &std::collections::BTreeMap<String, u64>;
        let keyed: [(&str, &str, &str, Keyed); 2] = [
            ("sluice_instance_dropped_by_reason", "Packets an instance dropped, by reason.", "reason", |i| {
                &i.dropped_by_reason
            }),
            (
                "sluice_instance_state",
                "How an instance's state backend served it, by counter: requests, round_trips (to the store), cache_hits, retransmits, duplicates, ... (external state only).",
                "counter",
                |i| &i.state,
            ),
        ];
        for (name, help, label, field) in keyed {
            let mut fam = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for v in &s.vertices {
                for i in &v.instances {
                    for (key, n) in field(i) {
                        let mut with_key = labels(v, i);
                        with_key.push((label, key.clone()));
                        ConstCounter::new(*n).encode(fam.encode_family(&with_key)?)?;
                    }
                }
            }
        }
        let mut fam = enc.encode_descriptor(
            "sluice_instance_queued_batches",
            "Batches waiting in an instance's queue.",
            None,
            MetricType::Gauge,
        )?;
        for v in &s.vertices {
            for i in &v.instances {
                ConstGauge::new(i64::try_from(i.queued_batches).unwrap_or(i64::MAX))
                    .encode(fam.encode_family(&labels(v, i))?)?;
            }
        }
        Ok(())
    }
}

/// `sluice ctl`.
#[derive(Args)]
#[command(
    after_help = "The token comes from --token or SLUICE_CONTROL_TOKEN (the one `sluice run --control` or `sluice controller --control` printed or was given).\nAn action is answered once the run has carried it out: the JSON answer holds `applied`, `at_packet` (packets the root had admitted when it acted) and, for scale, move and clone, `change` (its entry of the run's report); a refusal says why (409 the run cannot do it now, 503 the run did not take it within 5 s and nothing was done).\nExit codes: 0 success; 1 the endpoint could not be reached or refused the request; 2 bad command line."
)]
pub struct CtlArgs {
    /// The control endpoint: PORT (on 127.0.0.1) or HOST:PORT.
    #[arg(long, short, value_parser = parse_addr)]
    control: SocketAddr,
    /// The endpoint's token (default: $SLUICE_CONTROL_TOKEN).
    #[arg(long)]
    token: Option<String>,
    #[command(subcommand)]
    what: CtlCommand,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// The chain's vertices and instances with live statistics. Against a controller: the
    /// hosted run's, as the root's node has them (other nodes' instances "on another node").
    List {
        /// Print the JSON as the endpoint returns it.
        #[arg(long)]
        json: bool,
    },
    /// The Prometheus metrics.
    Metrics,
    /// Make an instance slower per packet (a straggler): `V:I=MIN-MAX` µs, `V:I=0` for normal.
    Slow {
        /// `VERTEX:INSTANCE=MIN-MAX` (µs per packet), or `VERTEX:INSTANCE=0`.
        spec: String,
    },
    /// Crash an instance: it loses its queue and cache, a replacement takes over from the store
    /// and the root replays to it (the run needs --fault-tolerance and a store). Against a
    /// controller: the node hosting the instance crashes it alone (a drill).
    Crash {
        /// `VERTEX:INSTANCE`.
        spec: String,
    },
    /// Crash the root: a new one takes over and resumes the clock; with `--log store` it reads
    /// the log back, else the log is lost (the run needs --fault-tolerance; a chain spread over
    /// nodes: ask the root's node). Against a controller: the node hosting the root crashes it
    /// (a drill).
    CrashRoot,
    /// Crash the state store: it loses everything and is rebuilt from its last checkpoint and
    /// the instances' write-ahead logs while the chain holds still (the run needs
    /// --fault-tolerance, a store and checkpoints).
    CrashStore,
    #[command(flatten)]
    Change(RunChange),
    /// (A controller's endpoint) the leading controller, the nodes, the units placed on each and,
    /// where it differs, what the run a node hosts serves now.
    Nodes {
        /// Print the JSON as the endpoint returns it.
        #[arg(long)]
        json: bool,
    },
    /// (A controller's endpoint.)
    #[command(flatten)]
    Node(crate::cluster::NodeCommand),
}

/// Parses `V:I=MIN-MAX` (or `V:I=0`) into the action's JSON.
fn slow_request(spec: &str) -> Result<serde_json::Value, String> {
    let bad = || format!("`{spec}` is not VERTEX:INSTANCE=MIN-MAX (µs) or VERTEX:INSTANCE=0");
    let (target, delay) = spec.split_once('=').ok_or_else(bad)?;
    let (vertex, instance) = target.split_once(':').ok_or_else(bad)?;
    let instance: u16 = instance.parse().map_err(|_| bad())?;
    let (min, max): (u64, u64) = match delay.split_once('-') {
        Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
        None => {
            let d = delay.parse().map_err(|_| bad())?;
            (d, d)
        }
    };
    Ok(serde_json::json!({ "slow": { "vertex": vertex, "instance": instance, "delay_us": [min, max] } }))
}

/// A live change of a run: from `sluice ctl` (a run's endpoint, or a controller's) or `sluice
/// cluster` (through etcd); the last two ask the root's node of a hosted run.
#[derive(clap::Subcommand)]
pub(crate) enum RunChange {
    /// Clone a straggler: a new instance takes its flows on trial and the faster of the two
    /// keeps them (the run needs a store). Through a controller or `sluice cluster`: as
    /// `scale`.
    Clone {
        /// `VERTEX:INSTANCE`.
        spec: String,
    },
    /// Scale a vertex: `VERTEX=N` instances, or `VERTEX+N` / `VERTEX-N` (the run needs a
    /// store; new flows spread over the instances, a removed instance's flows move). Through a
    /// controller or `sluice cluster`: the root's node's run applies it, to a vertex whose
    /// instances and feeders all run on that node (nodes started with `--scalable`), and
    /// answers what it did (waited for up to 10 s).
    Scale {
        /// `VERTEX=N`, `VERTEX+N` or `VERTEX-N`.
        spec: String,
    },
    /// Move flows between two instances of a vertex: `VERTEX:FROM>TO`, at most `--flows`
    /// (default all of FROM's); loss-free and in order. Through a controller or `sluice
    /// cluster`: as `scale`.
    Move {
        /// `VERTEX:FROM>TO` (instance indices, as `list` shows them).
        spec: String,
        /// Move at most this many flows.
        #[arg(long)]
        flows: Option<u64>,
    },
}

impl RunChange {
    /// The action as a run's (or a controller's) endpoint takes it, or why the spec is bad.
    pub(crate) fn action(&self) -> Result<serde_json::Value, String> {
        match self {
            RunChange::Clone { spec } => instance_request("clone", spec),
            RunChange::Scale { spec } => scale_request(spec),
            RunChange::Move { spec, flows } => move_request(spec, *flows),
        }
    }
}

/// Parses `V:I` into the JSON of action `kind` (`crash`, `clone`) on that instance.
fn instance_request(kind: &str, spec: &str) -> Result<serde_json::Value, String> {
    let bad = || format!("`{spec}` is not VERTEX:INSTANCE");
    let (vertex, instance) = spec.split_once(':').ok_or_else(bad)?;
    let instance: u16 = instance.parse().map_err(|_| bad())?;
    Ok(serde_json::json!({ kind: { "vertex": vertex, "instance": instance } }))
}

/// Parses `V=N`, `V+N` or `V-N` into a scale action's JSON.
fn scale_request(spec: &str) -> Result<serde_json::Value, String> {
    let bad = || format!("`{spec}` is not VERTEX=N, VERTEX+N or VERTEX-N");
    let at = spec.find(['=', '+', '-']).ok_or_else(bad)?;
    let (vertex, rest) = spec.split_at(at);
    let n: i64 = rest.get(1..).ok_or_else(bad)?.parse().map_err(|_| bad())?;
    if vertex.is_empty() || n < 0 {
        return Err(bad());
    }
    Ok(match rest.chars().next() {
        Some('=') => serde_json::json!({ "scale": { "vertex": vertex, "to": n } }),
        Some('+') => serde_json::json!({ "scale": { "vertex": vertex, "by": n } }),
        _ => serde_json::json!({ "scale": { "vertex": vertex, "by": -n } }),
    })
}

/// Parses `V:FROM>TO` into a move action's JSON.
fn move_request(spec: &str, flows: Option<u64>) -> Result<serde_json::Value, String> {
    let bad = || format!("`{spec}` is not VERTEX:FROM>TO");
    let (vertex, pair) = spec.split_once(':').ok_or_else(bad)?;
    let (from, to) = pair.split_once('>').ok_or_else(bad)?;
    let (from, to): (u16, u16) = (from.parse().map_err(|_| bad())?, to.parse().map_err(|_| bad())?);
    let mut m = serde_json::json!({ "vertex": vertex, "from": from, "to": to });
    if let Some(f) = flows {
        m["flows"] = f.into();
    }
    Ok(serde_json::json!({ "move": m }))
}

/// `sluice ctl`.
pub fn cmd_ctl(a: CtlArgs) -> Result<(), Failure> {
    let Some(token) = a.token.or_else(|| std::env::var(TOKEN_ENV).ok()) else {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("give --token or set {TOKEN_ENV}")));
    };
    let path = match a.what {
        CtlCommand::List { .. } => "/api/v1/chain",
        CtlCommand::Nodes { .. } => "/api/v1/cluster",
        CtlCommand::Metrics => "/metrics",
        CtlCommand::Slow { .. }
        | CtlCommand::Crash { .. }
        | CtlCommand::CrashRoot
        | CtlCommand::CrashStore
        | CtlCommand::Change(_)
        | CtlCommand::Node(_) => "/api/v1/actions",
    };
    let url = format!("http://{}{path}", a.control);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let auth = format!("Bearer {token}");
    let action = match &a.what {
        CtlCommand::Slow { spec } => Some(slow_request(spec).map_err(|e| fail(exit::INVALID)(anyhow::anyhow!(e)))?),
        CtlCommand::Crash { spec } => {
            Some(instance_request("crash", spec).map_err(|e| fail(exit::INVALID)(anyhow::anyhow!(e)))?)
        }
        CtlCommand::Change(c) => Some(c.action().map_err(|e| fail(exit::INVALID)(anyhow::anyhow!(e)))?),
        CtlCommand::CrashRoot => Some(serde_json::json!({ "crash_root": {} })),
        CtlCommand::CrashStore => Some(serde_json::json!({ "crash_store": {} })),
        CtlCommand::Node(d) => Some(d.action()),
        _ => None,
    };
    let sent = match action {
        Some(body) => agent
            .post(&url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json")
            .send(body.to_string()),
        None => agent.get(&url).header("Authorization", &auth).call(),
    };
    let mut resp = sent.with_context(|| format!("reaching {url}")).map_err(fail(exit::FAILED))?;
    let status = resp.status();
    let body = resp.body_mut().read_to_string().with_context(|| format!("reading the answer of {url}"))?;
    if !status.is_success() {
        return Err(fail(exit::FAILED)(anyhow::anyhow!("{url}: {status}: {}", body.trim())));
    }
    match a.what {
        CtlCommand::List { json: false } => {
            let snap: serde_json::Value = serde_json::from_str(&body).context("the endpoint's answer")?;
            print!("{}", render_list(&snap));
        }
        CtlCommand::Nodes { json: false } => {
            let status: crate::cluster::ClusterStatus = serde_json::from_str(&body).context("the endpoint's answer")?;
            print!("{}", crate::cluster::status_text(&status));
        }
        _ => print!("{body}"),
    }
    Ok(())
}

/// A table of the vertices and instances of a snapshot (as JSON).
fn render_list(s: &serde_json::Value) -> String {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let mut out = format!(
        "chain {}: up {:.1} s, {} in, {} out, {} dropped at the root, {} in flight\n",
        s["chain"].as_str().unwrap_or("?"),
        s["uptime_s"].as_f64().unwrap_or(0.0),
        n(&s["packets_in"]),
        n(&s["packets_out"]),
        n(&s["root_dropped"]),
        n(&s["in_flight"])
    );
    out.push_str(&format!(
        "{:<14} {:>4} {:>12} {:>12} {:>10} {:>8} {:>8}\n",
        "vertex", "inst", "in", "forwarded", "dropped", "queued", "busy s"
    ));
    for v in s["vertices"].as_array().into_iter().flatten() {
        for i in v["instances"].as_array().into_iter().flatten() {
            if i["elsewhere"].as_bool() == Some(true) {
                // A chain spread over nodes: its figures are on its node's endpoint.
                out.push_str(&format!(
                    "{:<14} {:>4} on another node\n",
                    v["name"].as_str().unwrap_or("?"),
                    n(&i["index"])
                ));
                continue;
            }
            out.push_str(&format!(
                "{:<14} {:>4} {:>12} {:>12} {:>10} {:>8} {:>8.2}\n",
                v["name"].as_str().unwrap_or("?"),
                n(&i["index"]),
                n(&i["packets_in"]),
                n(&i["forwarded"]),
                n(&i["dropped"]),
                n(&i["queued_batches"]),
                i["busy_s"].as_f64().unwrap_or(0.0)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_is_loopback_and_addresses_are_explicit() {
        assert_eq!(parse_addr("9464"), Ok("127.0.0.1:9464".parse().unwrap_or_else(|_| unreachable!())));
        assert_eq!(parse_addr("0.0.0.0:80").map(|a| a.ip().is_unspecified()), Ok(true));
        assert!(parse_addr("[::1]:1").is_ok());
        assert!(parse_addr("localhost").is_err());
        assert!(parse_addr("70000").is_err());
    }

    #[test]
    fn slow_specs() {
        let j = slow_request("nat:1=3-10").unwrap_or_default();
        assert_eq!(j["slow"]["vertex"], "nat");
        assert_eq!(j["slow"]["instance"], 1);
        assert_eq!(j["slow"]["delay_us"], serde_json::json!([3, 10]));
        assert_eq!(slow_request("nat:0=0").unwrap_or_default()["slow"]["delay_us"], serde_json::json!([0, 0]));
        for bad in ["nat", "nat:0", "nat=3", "nat:x=3", "nat:0=a-b", "nat:0=3-"] {
            assert!(slow_request(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_are_given_or_random() {
        assert_eq!(token(Some("abc")), "abc");
        let (a, b) = (token(Some("")), token(None));
        if std::env::var(TOKEN_ENV).is_err() {
            assert_eq!(a.len(), 32);
            assert_ne!(a, b, "fresh tokens differ");
        }
    }
}
