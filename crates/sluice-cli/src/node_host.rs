//! A node hosting its units: from the controller's placement in etcd to the node's part of the
//! chain spread over the cluster's nodes (`sluice run --spread FILE --node ID`, in this
//! process).
//!
//! The spread is a function of what etcd holds — every node's assignment and every node's
//! registered address — so every node computes the same one. A node starts its part once the
//! placement gives it units and has not changed for `--settle-ms` (the controller writes one
//! node's assignment at a time; the nodes must not start on half of a change). The run then
//! keeps that spread: a node that dies during it is failed over by the run itself (its
//! instances replaced on the root's node from the store, the root's log replayed to them),
//! whatever the controller places afterwards (docs/decisions.md, "Nodes hosting their units").

use crate::node_cmd::print_line;
use crate::run_cmd::{cmd_run, parse_run_args};
use crate::{exit, fail, Failure};
use clap::Args;
use sluice_cluster::{nodes, stored_placement, Etcd, NodeInfo, Placement, Unit};
use sluice_runtime::live::Live;
use sluice_runtime::Spread;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `sluice node` options for hosting the node's units.
#[derive(Args)]
pub(crate) struct HostArgs {
    /// Host this node's units: the `sluice run` options of its part of the chain, split at
    /// spaces (e.g. `--run="-c chains/example.yaml --fault-tolerance --store URL -w 1"`; give
    /// every node the same chain and engine options). Once the controller's placement gives
    /// this node units and has settled, the node runs its part of the chain spread over the
    /// nodes the placement names (each reached at its --addr), prints `run` and `run-ended`
    /// lines, and leaves the cluster when the run ends, with the run's exit code.
    #[arg(long, value_name = "OPTIONS", allow_hyphen_values = true)]
    run: Option<String>,
    /// With --run: the options this node adds when it gets the root: the chain's input and
    /// output (e.g. `-i traces/demo.pcap -o out.pcap`). A node that gets the root without them
    /// ends with an error.
    #[arg(long, value_name = "OPTIONS", allow_hyphen_values = true, requires = "run")]
    root_run: Option<String>,
    /// With --run: a node of the run not heard from for this many milliseconds has failed
    /// (the spread's `silence_ms`; every node must be given the same).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    silence_ms: u64,
    /// With --run: the run can scale, move flows and clone instances of the vertices whole on
    /// the root's node while it runs (`sluice ctl scale|move|clone` against the controller or
    /// the root's node's --control): the spread's `scalable: true`. Every node must be given
    /// the same (it changes the plan each node compiles; a node given another is refused).
    #[arg(long, requires = "run")]
    scalable: bool,
    /// With --run: milliseconds the placement must stay unchanged before the run starts.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    settle_ms: u64,
}

/// What the hosting of a node's units is doing.
enum State {
    /// Waiting for a placement that gives this node units and stays unchanged for the
    /// settle time: the last spread seen (with this node's units in it), and since when.
    Waiting { seen: Option<(Spread, Vec<Unit>)>, since: Instant },
    /// The node's part runs on its own thread, with the units it started with; `filed`: what
    /// it serves now as last filed in etcd.
    Running {
        thread: JoinHandle<Result<(), Failure>>,
        units: Vec<Unit>,
        file: PathBuf,
        changed: bool,
        filed: Option<Vec<Unit>>,
    },
}

/// The hosting of a node's units (see the module's documentation).
pub(crate) struct Host {
    id: String,
    cluster: String,
    run: Vec<String>,
    root_run: Vec<String>,
    silence_ms: u64,
    scalable: bool,
    settle: Duration,
    state: State,
    /// The run's live handle once it runs (crash drills of one instance reach it so).
    live: Arc<OnceLock<Arc<Live>>>,
}

/// What a node's run serves now: the roots it started with (a run's roots stay where they
/// started) and the instances serving flows here, in the placement's order.
fn serving_now(live: &Live, started: &[Unit]) -> Vec<Unit> {
    let roots = started.iter().filter(|u| matches!(u, Unit::Root(_))).cloned();
    let instances = live.serving_here().into_iter().map(|(v, index)| Unit::Instance { vertex: v.to_string(), index });
    let mut units: Vec<Unit> = roots.chain(instances).collect();
    units.sort();
    units
}

/// Options given as one string, split at spaces.
fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

impl Host {
    /// The hosting `a` asks for (none without `--run`), its options checked now rather than
    /// when the placement settles.
    pub(crate) fn new(a: &HostArgs, id: &str, cluster: &str) -> Result<Option<Host>, Failure> {
        let Some(run) = a.run.as_deref() else { return Ok(None) };
        let (run, root_run) = (words(run), a.root_run.as_deref().map(words).unwrap_or_default());
        let placed = ["--spread", "x", "--node", id].map(str::to_string);
        for (flag, words) in [("--run", &run), ("--root-run", &root_run)] {
            if let Some(w) = words.iter().find(|w| matches!(w.as_str(), "--spread" | "--node")) {
                return Err(fail(exit::INVALID)(anyhow::anyhow!("{flag}: {w} comes from the placement; leave it out")));
            }
        }
        let all: Vec<String> = run.iter().chain(&root_run).chain(&placed).cloned().collect();
        parse_run_args(&all).map_err(|e| fail(exit::INVALID)(anyhow::anyhow!("--run/--root-run: {e}")))?;
        if !(100..=600_000).contains(&a.silence_ms) {
            return Err(fail(exit::INVALID)(anyhow::anyhow!("--silence-ms: give 100 to 600000")));
        }
        Ok(Some(Host {
            id: id.to_string(),
            cluster: cluster.to_string(),
            run,
            root_run,
            silence_ms: a.silence_ms,
            scalable: a.scalable,
            settle: Duration::from_millis(a.settle_ms),
            state: State::Waiting { seen: None, since: Instant::now() },
            live: Arc::default(),
        }))
    }

    /// Moves the hosting on (called every 100 ms or so with the node's assignment): starts the
    /// run once the placement settles; the run's result once it ended.
    pub(crate) fn tick(&mut self, etcd: &Etcd, units: &[Unit]) -> Option<Result<(), Failure>> {
        let waiting = matches!(self.state, State::Waiting { .. });
        let placed = if waiting { self.placed(etcd) } else { Ok(None) };
        match &mut self.state {
            State::Waiting { seen, since } => {
                let now = match placed {
                    Ok(s) => s.filter(|(s, _)| s.nodes.contains_key(&self.id)),
                    Err(e) => return Some(Err(e)),
                };
                if now != *seen {
                    (*seen, *since) = (now, Instant::now());
                } else if since.elapsed() >= self.settle {
                    if let Some((spread, units)) = seen.take() {
                        return self.start(spread, units).err().map(Err);
                    }
                }
                None
            }
            State::Running { thread, units: started, changed, filed, .. } => {
                if !*changed && started.as_slice() != units {
                    *changed = true;
                    tracing::warn!(node = %self.id, "the placement changed during the run; the run keeps the spread it started with (it fails a dead node over to the root's node itself)");
                }
                if let Some(live) = self.live.get() {
                    let now = serving_now(live, started);
                    if filed.as_ref() != Some(&now) {
                        match sluice_cluster::publish_running(etcd, &self.cluster, &self.id, &now) {
                            Ok(_) => *filed = Some(now),
                            // Filed again on the next tick.
                            Err(e) => tracing::debug!(node = %self.id, error = %e, "cannot file what the run serves"),
                        }
                    }
                }
                thread.is_finished().then(|| self.end())
            }
        }
    }

    /// Where the run's live handle appears once it runs.
    pub(crate) fn live(&self) -> Arc<OnceLock<Arc<Live>>> {
        self.live.clone()
    }

    /// Whether this node's part of the chain runs now.
    pub(crate) fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    /// Waits for a run that is going (the process's stop flag, which ends the node, ends it
    /// too); `None` if none started.
    pub(crate) fn wait(mut self) -> Option<Result<(), Failure>> {
        matches!(self.state, State::Running { .. }).then(|| self.end())
    }

    /// The spread the placement in etcd describes, if it is complete (a root placed, every
    /// node with units registered), and this node's units in it.
    fn placed(&self, etcd: &Etcd) -> Result<Option<(Spread, Vec<Unit>)>, Failure> {
        let read = stored_placement(etcd, &self.cluster).and_then(|p| Ok((p, nodes(etcd, &self.cluster)?.0)));
        match read {
            Ok((placement, registered)) => {
                let spread = spread_of(&placement, &registered, self.silence_ms, self.scalable)
                    .map_err(|e| fail(exit::INVALID)(anyhow::anyhow!(e)))?;
                // In the controller's order (units sorted), as the node's assignment lists them.
                let mine = placement.iter().filter(|(_, n)| **n == self.id).map(|(u, _)| u.clone()).collect();
                Ok(spread.map(|s| (s, mine)))
            }
            Err(e) => {
                // etcd may refuse for a moment; the placement is read again on the next tick.
                tracing::warn!(node = %self.id, error = %e, "cannot read the placement; retrying");
                Ok(None)
            }
        }
    }

    fn start(&mut self, spread: Spread, units: Vec<Unit>) -> Result<(), Failure> {
        let root = spread.root == self.id;
        let file = std::env::temp_dir().join(format!(
            "sluice-{}-{}-{}.spread.yaml",
            self.cluster,
            self.id,
            std::process::id()
        ));
        let yaml = serde_yaml::to_string(&spread).map_err(|e| fail(exit::FAILED)(e.into()))?;
        std::fs::write(&file, yaml)
            .map_err(|e| fail(exit::FAILED)(anyhow::anyhow!("writing the spread to {}: {e}", file.display())))?;
        let mut words = self.run.clone();
        if root {
            words.extend(self.root_run.iter().cloned());
        }
        words.extend(["--spread".to_string(), file.to_string_lossy().into_owned(), "--node".into(), self.id.clone()]);
        let mut args = parse_run_args(&words).map_err(|e| fail(exit::INVALID)(anyhow::anyhow!("--run: {e}")))?;
        args.hosted = true;
        args.live_to = Some(self.live.clone());
        let line = serde_json::json!({"event": "run", "node": self.id, "root": root, "spread": spread});
        print_line(&line);
        tracing::info!(node = %self.id, root, "the placement settled; running this node's part");
        let thread = std::thread::Builder::new()
            .name(format!("node-{}", self.id))
            .spawn(move || cmd_run(args))
            .map_err(|e| fail(exit::FAILED)(e.into()))?;
        self.state = State::Running { thread, units, file, changed: false, filed: None };
        Ok(())
    }

    /// Joins the run's thread and says how it ended.
    fn end(&mut self) -> Result<(), Failure> {
        let State::Running { thread, file, .. } =
            std::mem::replace(&mut self.state, State::Waiting { seen: None, since: Instant::now() })
        else {
            return Ok(());
        };
        let result = thread
            .join()
            .unwrap_or_else(|_| Err(fail(exit::FAILED)(anyhow::anyhow!("the node's run stopped with a panic"))));
        let _ = std::fs::remove_file(file);
        let mut line = serde_json::json!({"event": "run-ended", "node": self.id, "ok": result.is_ok()});
        if let (Err(f), Some(map)) = (&result, line.as_object_mut()) {
            map.insert("error".into(), format!("{:#}", f.error).into());
        }
        print_line(&line);
        result
    }
}

/// The spread of `placement` over the registered `nodes`: `None` while it is incomplete (no
/// root placed yet, or a node with units no longer registered: the controller will place its
/// units again), an error when it cannot be run. `silence_ms` and `scalable` are the spread's.
pub(crate) fn spread_of(
    placement: &Placement,
    nodes: &[NodeInfo],
    silence_ms: u64,
    scalable: bool,
) -> Result<Option<Spread>, String> {
    if let Some(Unit::Root(n)) = placement.keys().find(|u| matches!(u, Unit::Root(n) if *n > 0)) {
        return Err(format!(
            "the controller places root {n}: a chain spread over nodes has one root (run the controller with --roots 1)"
        ));
    }
    let Some(root) = placement.get(&Unit::Root(0)) else { return Ok(None) };
    let mut addrs = BTreeMap::new();
    for id in placement.values() {
        let Some(info) = nodes.iter().find(|n| n.id == *id) else { return Ok(None) };
        let addr: SocketAddr = info
            .addr
            .parse()
            .map_err(|_| format!("node `{id}` registered the address `{}`: give --addr as IP:PORT", info.addr))?;
        addrs.insert(id.clone(), addr);
    }
    let place = placement
        .iter()
        .filter_map(|(unit, node)| match unit {
            Unit::Instance { vertex, index } if node != root => Some((format!("{vertex}/{index}"), node.clone())),
            _ => None,
        })
        .collect();
    Ok(Some(Spread { nodes: addrs, root: root.clone(), place, vni: 1, silence_ms, scalable }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, addr: &str) -> NodeInfo {
        NodeInfo { id: id.into(), addr: addr.into(), roles: vec!["root".into(), "nf".into()] }
    }

    fn instance(vertex: &str, index: u16) -> Unit {
        Unit::Instance { vertex: vertex.into(), index }
    }

    #[test]
    fn a_placement_becomes_the_spread_every_node_computes() {
        let nodes = [node("a", "127.0.0.1:7001"), node("b", "127.0.0.1:7002"), node("c", "127.0.0.1:7003")];
        let mut p = Placement::new();
        p.insert(Unit::Root(0), "a".into());
        p.insert(instance("nat", 0), "b".into());
        p.insert(instance("nat", 1), "a".into());
        p.insert(instance("lb", 0), "b".into());
        let s = spread_of(&p, &nodes, 300, false).expect("runnable").expect("complete");
        // Node c hosts nothing: it is not part of the run.
        assert_eq!(s.nodes.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(s.root, "a");
        let place: Vec<(&str, &str)> = s.place.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(place, [("lb/0", "b"), ("nat/0", "b")], "instances on the root's node are not named");
        assert_eq!((s.silence_ms, s.scalable), (300, false));
        assert!(spread_of(&p, &nodes, 300, true).expect("runnable").expect("complete").scalable);
        // The file a node writes reads back as the same spread.
        let yaml = serde_yaml::to_string(&s).expect("yaml");
        assert_eq!(Spread::from_yaml(&yaml).expect("valid"), s);
    }

    #[test]
    fn an_incomplete_placement_waits_and_a_bad_one_is_an_error() {
        let nodes = [node("a", "127.0.0.1:7001")];
        let mut p = Placement::new();
        p.insert(instance("nat", 0), "a".into());
        assert_eq!(spread_of(&p, &nodes, 1000, false), Ok(None), "no root placed yet");
        p.insert(Unit::Root(0), "a".into());
        p.insert(instance("lb", 0), "gone".into());
        assert_eq!(spread_of(&p, &nodes, 1000, false), Ok(None), "a node with units is no longer registered");
        p.remove(&instance("lb", 0));
        assert!(spread_of(&p, &nodes, 1000, false).expect("runnable").is_some());
        let bad = [node("a", "localhost:7001")];
        let e = spread_of(&p, &bad, 1000, false).expect_err("not an IP address");
        assert!(e.contains("--addr"), "{e}");
        p.insert(Unit::Root(1), "a".into());
        let e = spread_of(&p, &nodes, 1000, false).expect_err("two roots");
        assert!(e.contains("--roots 1"), "{e}");
    }
}
