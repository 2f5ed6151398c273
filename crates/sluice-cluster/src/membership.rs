//! Node membership: a node registers under a lease it keeps alive; the controller lists the
//! nodes and watches them join and leave. A node that dies (SIGKILL, power loss, partition)
//! stops renewing, and etcd deletes its key when the lease expires: that deletion is how the
//! controller learns of it.

use crate::etcd::{Etcd, EtcdError, WatchEvent};
use crate::keeper::Keeper;
use crate::{check_name, ClusterError};
use std::time::Duration;

/// What a node tells the cluster about itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// Its id, unique among live nodes.
    pub id: String,
    /// Where other nodes send it packets (`HOST:PORT` of its link).
    pub addr: String,
    /// What it can host (`root`, `nf`, `store`).
    #[serde(default)]
    pub roles: Vec<String>,
}

/// A change in membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeChange {
    /// A node registered (or changed its registration).
    Joined(NodeInfo),
    /// A node left: it deregistered, or its lease expired.
    Left {
        /// Its id.
        id: String,
    },
}

fn prefix(cluster: &str) -> String {
    format!("/sluice/{cluster}/nodes/")
}

/// This node's registration, kept alive until [`Membership::leave`] (or until the process
/// dies, after which etcd removes it within the lease's TTL).
#[derive(Debug)]
pub struct Membership {
    etcd: Etcd,
    lease: i64,
    keeper: Keeper,
}

impl Membership {
    /// Registers `node` in `cluster` under a lease of `ttl`. Fails if a live node has the id.
    pub fn join(etcd: &Etcd, cluster: &str, node: &NodeInfo, ttl: Duration) -> Result<Membership, ClusterError> {
        check_name("cluster name", cluster)?;
        check_name("node id", &node.id)?;
        let value = serde_json::to_vec(node)
            .map_err(|e| ClusterError::BadRecord { key: node.id.clone(), detail: e.to_string() })?;
        let lease = etcd.grant(ttl)?;
        let key = format!("{}{}", prefix(cluster), node.id);
        if etcd.create(&key, &value, lease)?.is_some() {
            let _ = etcd.revoke(lease);
            return Err(ClusterError::NodeIdTaken(node.id.clone()));
        }
        tracing::info!(node = %node.id, cluster, lease, "joined");
        let keeper = Keeper::start(etcd.clone(), lease, ttl, format!("node {}", node.id));
        Ok(Membership { etcd: etcd.clone(), lease, keeper })
    }

    /// Like [`Membership::join`], but while etcd cannot be reached it says so (a warning naming
    /// the endpoint) and tries again, waiting 100 ms, then twice as long each time up to 5 s,
    /// for at most `give_up_after`. Any other error ends it at once.
    pub fn join_retrying(
        etcd: &Etcd,
        cluster: &str,
        node: &NodeInfo,
        ttl: Duration,
        give_up_after: Duration,
    ) -> Result<Membership, ClusterError> {
        let deadline = std::time::Instant::now() + give_up_after;
        let mut wait = Duration::from_millis(100);
        loop {
            match Membership::join(etcd, cluster, node, ttl) {
                Err(ClusterError::Etcd(e @ EtcdError::Unreachable { .. })) => {
                    let now = std::time::Instant::now();
                    if now + wait > deadline {
                        return Err(e.into());
                    }
                    tracing::warn!(endpoint = etcd.endpoint(), error = %e, retry_in_ms = wait.as_millis() as u64,
                        "cannot reach etcd; retrying");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    /// Whether the registration was lost (the lease expired, e.g. while etcd was unreachable
    /// for longer than the TTL): the cluster considers this node dead and it must rejoin.
    pub fn is_lost(&self) -> bool {
        self.keeper.is_lost()
    }

    /// The lease the registration hangs on.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Deregisters at once (revokes the lease).
    pub fn leave(mut self) -> Result<(), ClusterError> {
        self.keeper.stop();
        self.etcd.revoke(self.lease)?;
        Ok(())
    }
}

/// The nodes registered in `cluster` now, by id, and the revision to watch from.
pub fn nodes(etcd: &Etcd, cluster: &str) -> Result<(Vec<NodeInfo>, i64), ClusterError> {
    check_name("cluster name", cluster)?;
    let (kvs, revision) = etcd.get_prefix(&prefix(cluster))?;
    let nodes = kvs
        .iter()
        .map(|kv| {
            serde_json::from_slice(&kv.value)
                .map_err(|e| ClusterError::BadRecord { key: kv.key.clone(), detail: e.to_string() })
        })
        .collect::<Result<_, _>>()?;
    Ok((nodes, revision))
}

/// The lease of live node `node`'s registration (requests asked of the node are put under it,
/// so that they go with the node), or `None` if no such node is live.
pub(crate) fn lease_of(etcd: &Etcd, cluster: &str, node: &str) -> Result<Option<i64>, ClusterError> {
    let key = format!("{}{node}", prefix(cluster));
    let (kvs, _) = etcd.get_prefix(&key)?;
    Ok(kvs.iter().find(|kv| kv.key == key).map(|kv| kv.lease))
}

fn crash_key(cluster: &str, node: &str) -> String {
    format!("/sluice/{cluster}/crash/{node}")
}

/// Asks live node `node` of `cluster` to crash at once, as a drill (`sluice ctl crash`): the
/// node reads [`crash_asked`] and kills its own process, which the chain then fails over as
/// it would a SIGKILL. The request is attached to the node's lease, so it goes with the node:
/// a node started again under the same id is not crashed by it. Whether such a node was live.
pub fn ask_crash(etcd: &Etcd, cluster: &str, node: &str) -> Result<bool, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let Some(lease) = lease_of(etcd, cluster, node)? else { return Ok(false) };
    etcd.put(&crash_key(cluster, node), b"crash", lease)?;
    tracing::warn!(node, cluster, "crash drill asked");
    Ok(true)
}

/// Whether a crash drill was asked of `node` ([`ask_crash`]).
pub fn crash_asked(etcd: &Etcd, cluster: &str, node: &str) -> Result<bool, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let key = crash_key(cluster, node);
    let (kvs, _) = etcd.get_prefix(&key)?;
    Ok(kvs.iter().any(|kv| kv.key == key))
}

/// Watches `cluster`'s membership from revision `from` (the one [`nodes`] returned, plus one,
/// to miss nothing in between).
pub fn watch_nodes(etcd: &Etcd, cluster: &str, from: i64) -> Result<NodeWatch, ClusterError> {
    check_name("cluster name", cluster)?;
    let p = prefix(cluster);
    Ok(NodeWatch { watch: etcd.watch_prefix(&p, from)?, prefix: p })
}

/// Membership changes as they happen.
pub struct NodeWatch {
    watch: crate::etcd::Watch,
    prefix: String,
}

impl NodeWatch {
    /// The next changes, waiting for them; `None` when the watch ended (watch again).
    pub fn next_changes(&mut self) -> Option<Result<Vec<NodeChange>, ClusterError>> {
        let (events, _) = match self.watch.next_events()? {
            Ok(e) => e,
            Err(e) => return Some(Err(e.into())),
        };
        let changes = events.into_iter().map(|e| match e {
            WatchEvent::Put(kv) => serde_json::from_slice(&kv.value)
                .map(NodeChange::Joined)
                .map_err(|err| ClusterError::BadRecord { key: kv.key, detail: err.to_string() }),
            WatchEvent::Delete { key } => {
                Ok(NodeChange::Left { id: key.strip_prefix(&self.prefix).unwrap_or(&key).to_string() })
            }
        });
        Some(changes.collect())
    }
}
