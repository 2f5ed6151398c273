//! Requests of a hosted run asked through etcd of the node that runs the unit concerned — a
//! crash drill of an instance or of the root, a live change (scale a vertex, move flows, clone
//! an instance), the run's live view — and that node's answers.
//!
//! A controller does not reach into a node's run: it puts the request, as the JSON action a
//! run's control endpoint takes (`{"crash": {...}}`, `{"scale": {...}}`, or `{"view": {}}` for
//! the run's live statistics), under the node's lease, and waits for the answer. The node's
//! drill thread takes each request once, applies it to its run (which refuses what it cannot
//! do, saying why) and answers with the status and body its own endpoint would have given.
//! Changes and views go to the root's node: it applies every change a spread run can take
//! (vertices whole on that node) and refuses the others with the node in the way. Requests and
//! answers live under the node's lease, so both go with the node: a node started again under
//! the same id finds nothing stale.

use crate::etcd::Etcd;
use crate::membership::lease_of;
use crate::{check_name, ClusterError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often an asker looks for the answer.
const ANSWER_POLL: Duration = Duration::from_millis(50);

fn asked_prefix(cluster: &str, node: &str) -> String {
    format!("/sluice/{cluster}/ask/{node}/")
}

fn answer_key(cluster: &str, node: &str, id: &str) -> String {
    format!("/sluice/{cluster}/answer/{node}/{id}")
}

/// A request asked of a node's run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    /// The request's id (what the answer is filed under).
    pub id: String,
    /// The action, as a run's control endpoint takes it (`{"scale": {...}}`, `{"view": {}}`).
    pub action: serde_json::Value,
}

/// A node's answer to a request: the HTTP status and JSON body its run's control endpoint
/// gives the same action.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunAnswer {
    /// The status (200 applied, 4xx refused).
    pub status: u16,
    /// The body (`{"applied": ...}` or `{"error": "..."}`).
    pub body: serde_json::Value,
}

/// A fresh request id: unique among the askers of one etcd (time, process and a counter).
fn request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{nanos:032x}-{:x}-{:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Asks live node `node` to apply `action` to its run. The request's id, or `None` if no such
/// node is live.
pub fn ask_run(
    etcd: &Etcd,
    cluster: &str,
    node: &str,
    action: &serde_json::Value,
) -> Result<Option<String>, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let Some(lease) = lease_of(etcd, cluster, node)? else { return Ok(None) };
    let id = request_id();
    let key = format!("{}{id}", asked_prefix(cluster, node));
    let value =
        serde_json::to_vec(action).map_err(|e| ClusterError::BadRecord { key: key.clone(), detail: e.to_string() })?;
    etcd.put(&key, &value, lease)?;
    tracing::info!(node, cluster, %action, "request of a run asked");
    Ok(Some(id))
}

/// Asks the node the stored placement gives `unit` to apply `action` to its run (a crash drill
/// of that instance or root, or, asked of root 0's node, a live change or the view). The node
/// and the request's id, or `None` if the placement gives the unit to no live node.
pub fn ask_unit(
    etcd: &Etcd,
    cluster: &str,
    unit: &crate::Unit,
    action: &serde_json::Value,
) -> Result<Option<(String, String)>, ClusterError> {
    check_name("cluster name", cluster)?;
    if let crate::Unit::Instance { vertex, .. } = unit {
        check_name("vertex name", vertex)?;
    }
    let placement = crate::controller::stored_placement(etcd, cluster)?;
    let Some(node) = placement.get(unit) else { return Ok(None) };
    Ok(ask_run(etcd, cluster, node, action)?.map(|id| (node.clone(), id)))
}

/// The requests asked of `node` ([`ask_run`]), each taken once (its request is deleted), in
/// the order asked. A request that does not parse is answered 400 and left out.
pub fn take_run_requests(etcd: &Etcd, cluster: &str, node: &str) -> Result<Vec<RunRequest>, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let prefix = asked_prefix(cluster, node);
    let (mut kvs, _) = etcd.get_prefix(&prefix)?;
    // Ids begin with the time asked, in fixed-width hex: key order is the order asked.
    kvs.sort_by(|x, y| x.key.cmp(&y.key));
    let mut asked = Vec::new();
    for kv in kvs {
        etcd.delete(&kv.key)?;
        // Every key listed under the prefix starts with it; another is not a request.
        let Some(id) = kv.key.strip_prefix(&prefix).map(str::to_string) else { continue };
        match serde_json::from_slice(&kv.value) {
            Ok(action) => asked.push(RunRequest { id, action }),
            Err(e) => {
                let body = serde_json::json!({ "error": format!("the request is not JSON: {e}") });
                answer_run_request(etcd, cluster, node, &id, &RunAnswer { status: 400, body })?;
            }
        }
    }
    Ok(asked)
}

/// Files `node`'s answer to request `id`, under the node's lease (nothing, if the node is no
/// longer registered: the asker times out).
pub fn answer_run_request(
    etcd: &Etcd,
    cluster: &str,
    node: &str,
    id: &str,
    answer: &RunAnswer,
) -> Result<(), ClusterError> {
    let Some(lease) = lease_of(etcd, cluster, node)? else { return Ok(()) };
    let key = answer_key(cluster, node, id);
    let value =
        serde_json::to_vec(answer).map_err(|e| ClusterError::BadRecord { key: key.clone(), detail: e.to_string() })?;
    etcd.put(&key, &value, lease)?;
    Ok(())
}

/// Waits up to `patience` for `node`'s answer to request `id`, and deletes it once read.
/// `None` if none came in time, or the node left first ([`node_is_live`] tells which).
pub fn wait_for_answer(
    etcd: &Etcd,
    cluster: &str,
    node: &str,
    id: &str,
    patience: Duration,
) -> Result<Option<RunAnswer>, ClusterError> {
    let key = answer_key(cluster, node, id);
    let deadline = Instant::now() + patience;
    loop {
        let (kvs, _) = etcd.get_prefix(&key)?;
        if let Some(kv) = kvs.iter().find(|kv| kv.key == key) {
            etcd.delete(&key)?;
            return serde_json::from_slice(&kv.value)
                .map(Some)
                .map_err(|e| ClusterError::BadRecord { key, detail: e.to_string() });
        }
        if Instant::now() >= deadline || !node_is_live(etcd, cluster, node)? {
            return Ok(None);
        }
        std::thread::sleep(ANSWER_POLL);
    }
}

/// Whether `node` is registered under a live lease.
pub fn node_is_live(etcd: &Etcd, cluster: &str, node: &str) -> Result<bool, ClusterError> {
    Ok(lease_of(etcd, cluster, node)?.is_some())
}
