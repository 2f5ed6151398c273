//! Leader election: the first candidate to create the role's key (under its own lease) leads;
//! the others watch the key and try again when it goes. A leader that dies stops renewing its
//! lease, etcd deletes the key when it expires, and the next candidate takes over. One etcd
//! transaction decides, so two candidates never both lead.

use crate::etcd::{Etcd, WatchEvent};
use crate::keeper::Keeper;
use crate::{check_name, ClusterError};
use std::time::Duration;

fn key(cluster: &str, role: &str) -> String {
    format!("/sluice/{cluster}/leader/{role}")
}

/// Leadership of a role, held while the lease lives.
#[derive(Debug)]
pub struct Leadership {
    etcd: Etcd,
    lease: i64,
    keeper: Keeper,
}

impl Leadership {
    /// Whether leadership was lost (the lease expired): stop acting as leader at once.
    pub fn is_lost(&self) -> bool {
        self.keeper.is_lost()
    }

    /// Steps down at once (revokes the lease, so the next candidate takes over now).
    pub fn resign(mut self) -> Result<(), ClusterError> {
        self.keeper.stop();
        self.etcd.revoke(self.lease)?;
        Ok(())
    }

    /// Stops renewing without revoking, as a leader that hangs or dies would: the role is
    /// free once the lease expires (for failover drills and tests).
    pub fn abandon(mut self) {
        self.keeper.stop();
    }
}

/// Campaigns for `role` in `cluster` as `candidate`, waiting until it leads. `ttl` is how long
/// the role stays taken after this candidate stops renewing (it dies).
pub fn campaign(
    etcd: &Etcd,
    cluster: &str,
    role: &str,
    candidate: &str,
    ttl: Duration,
) -> Result<Leadership, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("role", role)?;
    check_name("candidate", candidate)?;
    let k = key(cluster, role);
    // The lease lives while we wait, so winning is one transaction away.
    let lease = etcd.grant(ttl)?;
    let keeper = Keeper::start(etcd.clone(), lease, ttl, format!("candidate {candidate} for {role}"));
    loop {
        let Some(holder) = etcd.create(&k, candidate.as_bytes(), lease)? else {
            tracing::info!(role, candidate, cluster, "leading");
            return Ok(Leadership { etcd: etcd.clone(), lease, keeper });
        };
        tracing::info!(role, candidate, leader = %String::from_utf8_lossy(&holder.value), "waiting for the leader to go");
        // Watch from the revision the key is seen at, so its deletion cannot slip by.
        let (now, revision) = etcd.get_prefix(&k)?;
        if !now.iter().any(|kv| kv.key == k) {
            continue;
        }
        let mut watch = etcd.watch_prefix(&k, revision + 1)?;
        loop {
            match watch.next_events() {
                Some(Ok((events, _)))
                    if events.iter().any(|e| matches!(e, WatchEvent::Delete { key } if *key == k)) =>
                {
                    break
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                // The watch ended: look again.
                None => break,
            }
        }
    }
}

/// Who leads `role` in `cluster` now, if anyone.
pub fn leader(etcd: &Etcd, cluster: &str, role: &str) -> Result<Option<String>, ClusterError> {
    check_name("cluster name", cluster)?;
    check_name("role", role)?;
    let k = key(cluster, role);
    let (kvs, _) = etcd.get_prefix(&k)?;
    Ok(kvs.into_iter().find(|kv| kv.key == k).map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
}
