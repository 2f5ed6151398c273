//! The controller's placement loop: while it leads, it keeps the assignments in etcd in step
//! with the live nodes — a node that joins can take new units, a node that leaves (or whose
//! lease expires) has its units placed on the others. Nodes watch their own assignment key.
//!
//! Assignments are stored without a lease, one key per node (`/sluice/C/assign/<node>`, a JSON
//! list of units), so they outlive the controller: a new leader reads them back and goes on
//! from there, moving nothing that need not move.

use crate::election::campaign;
use crate::etcd::{Etcd, WatchEvent};
use crate::membership::{nodes, watch_nodes};
use crate::placement::{place, Demand, Placement, Unit};
use crate::{check_name, ClusterError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

fn prefix(cluster: &str) -> String {
    format!("/sluice/{cluster}/assign/")
}

fn drain_prefix(cluster: &str) -> String {
    format!("/sluice/{cluster}/drain/")
}

/// Marks `node` as drained: the controller places nothing on it and moves what it holds to the
/// other nodes, while the node stays registered (to be stopped, or undrained, later).
pub fn drain(etcd: &Etcd, cluster: &str, node: &str) -> Result<(), ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    etcd.put(&format!("{}{node}", drain_prefix(cluster)), b"drained", 0)?;
    Ok(())
}

/// Lifts a drain: the node can host units again (nothing moves back by itself: placement
/// keeps what is placed).
pub fn undrain(etcd: &Etcd, cluster: &str, node: &str) -> Result<(), ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    etcd.delete(&format!("{}{node}", drain_prefix(cluster)))?;
    Ok(())
}

/// The drained nodes of `cluster`.
pub fn drained(etcd: &Etcd, cluster: &str) -> Result<BTreeSet<String>, ClusterError> {
    check_name("cluster name", cluster)?;
    let p = drain_prefix(cluster);
    let (kvs, _) = etcd.get_prefix(&p)?;
    Ok(kvs.into_iter().map(|kv| kv.key.strip_prefix(&p).unwrap_or(&kv.key).to_string()).collect())
}

/// The units assigned to `node` in `cluster`.
pub fn assignment(etcd: &Etcd, cluster: &str, node: &str) -> Result<Vec<Unit>, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let key = format!("{}{node}", prefix(cluster));
    let (kvs, _) = etcd.get_prefix(&key)?;
    match kvs.into_iter().find(|kv| kv.key == key) {
        Some(kv) => {
            serde_json::from_slice(&kv.value).map_err(|e| ClusterError::BadRecord { key, detail: e.to_string() })
        }
        None => Ok(Vec::new()),
    }
}

/// The units assigned to `node` in `cluster`, and the revision they were read at (watch from
/// the next one with [`watch_assignment`] to miss no change).
pub fn assignment_at(etcd: &Etcd, cluster: &str, node: &str) -> Result<(Vec<Unit>, i64), ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let key = format!("{}{node}", prefix(cluster));
    let (kvs, revision) = etcd.get_prefix(&key)?;
    let units = match kvs.into_iter().find(|kv| kv.key == key) {
        Some(kv) => decode_units(&key, &kv.value)?,
        None => Vec::new(),
    };
    Ok((units, revision))
}

fn decode_units(key: &str, value: &[u8]) -> Result<Vec<Unit>, ClusterError> {
    serde_json::from_slice(value).map_err(|e| ClusterError::BadRecord { key: key.to_string(), detail: e.to_string() })
}

/// Watches the assignment of `node` from revision `from`: each change is the node's whole new
/// list of units (empty when the controller took everything away).
pub fn watch_assignment(etcd: &Etcd, cluster: &str, node: &str, from: i64) -> Result<AssignmentWatch, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let key = format!("{}{node}", prefix(cluster));
    Ok(AssignmentWatch { watch: etcd.watch_prefix(&key, from)?, key })
}

/// A watch on one node's assignment.
pub struct AssignmentWatch {
    watch: crate::etcd::Watch,
    key: String,
}

impl AssignmentWatch {
    /// The node's assignment after the next change to it, waiting as long as it takes. `None`:
    /// the watch ended (etcd went away); read the assignment again and watch anew.
    pub fn next_assignment(&mut self) -> Option<Result<Vec<Unit>, ClusterError>> {
        loop {
            let (events, _) = match self.watch.next_events()? {
                Ok(e) => e,
                Err(e) => return Some(Err(e.into())),
            };
            // The prefix also matches longer node ids (`a` and `ab`): only this key counts;
            // the last change to it in the batch is the one that holds.
            let mut last = None;
            for e in events {
                match e {
                    WatchEvent::Put(kv) if kv.key == self.key => last = Some(decode_units(&self.key, &kv.value)),
                    WatchEvent::Delete { key } if key == self.key => last = Some(Ok(Vec::new())),
                    _ => {}
                }
            }
            if last.is_some() {
                return last;
            }
        }
    }
}

/// The whole placement stored for `cluster`.
pub fn stored_placement(etcd: &Etcd, cluster: &str) -> Result<Placement, ClusterError> {
    check_name("cluster name", cluster)?;
    let p = prefix(cluster);
    let (kvs, _) = etcd.get_prefix(&p)?;
    let mut placement = Placement::new();
    for kv in kvs {
        let node = kv.key.strip_prefix(&p).unwrap_or(&kv.key).to_string();
        let units: Vec<Unit> = serde_json::from_slice(&kv.value)
            .map_err(|e| ClusterError::BadRecord { key: kv.key.clone(), detail: e.to_string() })?;
        placement.extend(units.into_iter().map(|u| (u, node.clone())));
    }
    Ok(placement)
}

/// Writes the per-node assignments of `next` that differ from `previous`.
fn publish(etcd: &Etcd, cluster: &str, previous: &Placement, next: &Placement) -> Result<(), ClusterError> {
    let by_node = |p: &Placement| {
        let mut m: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
        for (u, n) in p {
            m.entry(n.clone()).or_default().push(u.clone());
        }
        m
    };
    let (old, new) = (by_node(previous), by_node(next));
    for (node, units) in &new {
        if old.get(node) != Some(units) {
            let value = serde_json::to_vec(units)
                .map_err(|e| ClusterError::BadRecord { key: node.clone(), detail: e.to_string() })?;
            etcd.put(&format!("{}{node}", prefix(cluster)), &value, 0)?;
        }
    }
    for node in old.keys().filter(|n| !new.contains_key(*n)) {
        etcd.delete(&format!("{}{node}", prefix(cluster)))?;
    }
    Ok(())
}

/// What a controller has done, read while it runs (its Prometheus metrics).
#[derive(Debug, Default)]
pub struct ControllerStats {
    /// Whether it leads now.
    pub leading: AtomicBool,
    /// Terms it has led (campaigns won).
    pub terms: AtomicU64,
    /// Placements it published (each a change of some node's assignment).
    pub placements: AtomicU64,
    /// Times it could not place every unit (no node can host some unit).
    pub unplaceable: AtomicU64,
    /// Units placed by its last placement.
    pub units_placed: AtomicU64,
    /// Live nodes it last saw.
    pub nodes_live: AtomicU64,
    /// Drained nodes among them.
    pub nodes_drained: AtomicU64,
}

/// One controller of a cluster.
#[derive(Debug, Clone)]
pub struct Controller {
    /// The cluster.
    pub cluster: String,
    /// This controller's name (for the election).
    pub name: String,
    /// What the chain needs placed.
    pub demand: Demand,
    /// How long leadership outlives this controller if it dies.
    pub ttl: Duration,
    /// What it has done, updated as it goes.
    pub stats: Arc<ControllerStats>,
}

impl Controller {
    /// Campaigns for leadership, then keeps the placement in step with the nodes until `stop`
    /// is set (it then resigns) or leadership is lost (an error).
    pub fn run(&self, etcd: &Etcd, stop: &AtomicBool) -> Result<(), ClusterError> {
        // A membership watch that ends makes this controller step down and campaign again.
        loop {
            let term = self.lead(etcd, stop);
            self.stats.leading.store(false, Ordering::Release);
            if term? {
                return Ok(());
            }
        }
    }

    /// One term: campaigns, then places until told to stop (`true`) or until the membership
    /// watch ends (`false`, after resigning).
    fn lead(&self, etcd: &Etcd, stop: &AtomicBool) -> Result<bool, ClusterError> {
        let leadership = campaign(etcd, &self.cluster, "controller", &self.name, self.ttl)?;
        self.stats.leading.store(true, Ordering::Release);
        self.stats.terms.fetch_add(1, Ordering::Relaxed);
        let mut current = stored_placement(etcd, &self.cluster)?;
        let (mut live, revision) = nodes(etcd, &self.cluster)?;
        let mut drained_nodes = drained(etcd, &self.cluster)?;
        let (tx, changes) = mpsc::channel();
        let mut watch = watch_nodes(etcd, &self.cluster, revision + 1)?;
        let mut drains = etcd.watch_prefix(&drain_prefix(&self.cluster), revision + 1)?;
        // The watches block; threads turn them into a channel the loop can wait on with a
        // limit. (They end when etcd ends the stream; a controller that stops leaves them
        // blocked until then, idle connections.) Either ending makes the channel disconnect
        // once both are gone; the membership watch ending alone is noticed below.
        let drain_tx = tx.clone();
        std::thread::spawn(move || {
            while let Some(Ok(_)) = drains.next_events() {
                if drain_tx.send(false).is_err() {
                    return;
                }
            }
            let _ = drain_tx.send(true);
        });
        std::thread::spawn(move || {
            while let Some(Ok(_)) = watch.next_changes() {
                if tx.send(false).is_err() {
                    return;
                }
            }
            let _ = tx.send(true);
        });
        loop {
            let hosts: Vec<_> = live.iter().filter(|n| !drained_nodes.contains(&n.id)).cloned().collect();
            self.stats.nodes_live.store(live.len() as u64, Ordering::Relaxed);
            self.stats.nodes_drained.store((live.len() - hosts.len()) as u64, Ordering::Relaxed);
            match place(&self.demand, &hosts, &current) {
                Ok(next) => {
                    if next != current {
                        publish(etcd, &self.cluster, &current, &next)?;
                        tracing::info!(controller = %self.name, units = next.len(), nodes = live.len(), "placement updated");
                        self.stats.placements.fetch_add(1, Ordering::Relaxed);
                        current = next;
                    }
                }
                // Nothing can host some unit now: keep what is placed until a node comes.
                Err(e) => {
                    self.stats.unplaceable.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(controller = %self.name, error = %e, "cannot place everything");
                }
            }
            self.stats.units_placed.store(current.len() as u64, Ordering::Relaxed);
            loop {
                if stop.load(Ordering::Acquire) {
                    return leadership.resign().map(|()| true);
                }
                if leadership.is_lost() {
                    return Err(ClusterError::LeadershipLost(self.name.clone()));
                }
                match changes.recv_timeout(Duration::from_millis(100)) {
                    Ok(false) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    // A watch ended: read everything again and watch anew.
                    Ok(true) | Err(mpsc::RecvTimeoutError::Disconnected) => return leadership.resign().map(|()| false),
                }
            }
            // Coalesce a burst of changes, then read membership and drains as they are.
            let mut ended = false;
            while let Ok(e) = changes.try_recv() {
                ended |= e;
            }
            if ended {
                return leadership.resign().map(|()| false);
            }
            live = nodes(etcd, &self.cluster)?.0;
            drained_nodes = drained(etcd, &self.cluster)?;
        }
    }
}
