//! What each node's hosted run serves now, next to what the controller placed on it.
//!
//! A hosted run keeps the spread it started with, but changes itself while it runs: a scale-out
//! adds instances on the root's node, a scale-in retires some, a failed node's instances are
//! replaced on the root's node. The placement (the controller's record of what it assigned)
//! does not follow those; each hosting node files the units its run serves now under its own
//! lease, so that the cluster's status shows both and the record goes with the node.

use crate::etcd::Etcd;
use crate::membership::lease_of;
use crate::placement::Unit;
use crate::{check_name, ClusterError};
use std::collections::BTreeMap;

fn running_prefix(cluster: &str) -> String {
    format!("/sluice/{cluster}/running/")
}

/// Files `units` as what the run of live node `node` serves now. `false` if no such node is
/// live (nothing filed).
pub fn publish_running(etcd: &Etcd, cluster: &str, node: &str, units: &[Unit]) -> Result<bool, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("node id", node)?;
    let Some(lease) = lease_of(etcd, cluster, node)? else { return Ok(false) };
    let key = format!("{}{node}", running_prefix(cluster));
    let value =
        serde_json::to_vec(units).map_err(|e| ClusterError::BadRecord { key: key.clone(), detail: e.to_string() })?;
    etcd.put(&key, &value, lease)?;
    Ok(true)
}

/// What each live node's run serves now, by node id (nodes hosting no run are absent).
pub fn running(etcd: &Etcd, cluster: &str) -> Result<BTreeMap<String, Vec<Unit>>, ClusterError> {
    check_name("cluster name", cluster)?;
    let p = running_prefix(cluster);
    let (kvs, _) = etcd.get_prefix(&p)?;
    kvs.into_iter()
        .map(|kv| {
            let node = kv.key.strip_prefix(&p).unwrap_or(&kv.key).to_string();
            let units = serde_json::from_slice(&kv.value)
                .map_err(|e| ClusterError::BadRecord { key: kv.key.clone(), detail: e.to_string() })?;
            Ok((node, units))
        })
        .collect()
}
