//! The cluster's control state in etcd, as E2's manager and CHC's framework keep it: which
//! nodes are alive (each registered under a lease it keeps alive, so a node that dies leaves by
//! itself when the lease expires), watches on that membership, and leader election (one
//! controller acts at a time; another takes over when the leader's lease expires).
//!
//! Layout of the keys, for a cluster named `C`:
//!
//! | key | value | lease |
//! |---|---|---|
//! | `/sluice/C/nodes/<id>` | [`NodeInfo`] as JSON | the node's |
//! | `/sluice/C/leader/<role>` | the leader's name | the leader's |
//! | `/sluice/C/assign/<node>` | the units placed on the node, JSON | none |
//! | `/sluice/C/drain/<node>` | present while the node is drained | none |
//! | `/sluice/C/crash/<node>` | a crash drill of the whole node, asked | the node's |
//! | `/sluice/C/ask/<node>/<id>` | a request of the node's run (a crash drill of one unit, a live change, its live view) ([`run_requests`]) | the node's |
//! | `/sluice/C/answer/<node>/<id>` | the node's answer to it | the node's |
//!
//! Where the controller puts roots and instances is [`placement`], a pure function.
//!
//! Everything here blocks (threads, no async runtime): the callers are a node's control thread
//! and the controller's loop, neither on the packet path.

pub mod controller;
pub mod election;
pub mod etcd;
pub mod local;
pub mod membership;
pub mod placement;
pub mod run_requests;
pub mod running;

pub use controller::{
    assignment, assignment_at, drain, drained, stored_placement, undrain, watch_assignment, AssignmentWatch,
    Controller, ControllerStats,
};
pub use election::{campaign, leader, Leadership};
pub use etcd::{Etcd, EtcdError, KeyValue, Watch, WatchEvent};
pub use local::{LocalEtcd, LocalEtcdError};
pub use membership::{ask_crash, crash_asked, nodes, watch_nodes, Membership, NodeChange, NodeInfo, NodeWatch};
pub use placement::{place, Demand, Placement, PlacementError, Unit};
pub use run_requests::{
    answer_run_request, ask_run, ask_unit, node_is_live, take_run_requests, wait_for_answer, RunAnswer, RunRequest,
};
pub use running::{publish_running, running};

/// What went wrong with the cluster's state.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd could not be reached, refused, or answered strangely.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// A name that cannot be part of a key.
    #[error("{what} `{name}`: use letters, digits, `-`, `_` and `.` (1 to 64 of them)")]
    BadName {
        /// What the name is for.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// Another live node registered the same id.
    #[error("node id `{0}` is taken by a live node")]
    NodeIdTaken(String),
    /// This controller's leadership expired while it led (etcd unreachable for longer than
    /// the TTL): another may lead now, so it stopped acting.
    #[error("controller `{0}` lost its leadership")]
    LeadershipLost(String),
    /// A registration in etcd that is not a node's.
    #[error("`{key}` does not hold a node: {detail}")]
    BadRecord {
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
}

/// Checks that `name` can be one segment of a key.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), ClusterError> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ClusterError::BadName { what, name: name.to_string() })
    }
}

/// A thread that keeps a lease alive until told to stop, retrying with backoff while etcd is
/// unreachable, and noting when the lease is lost for good.
pub(crate) mod keeper {
    use crate::etcd::{Etcd, EtcdError};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::thread::JoinHandle;
    use std::time::Duration;

    /// The keep-alive thread of one lease.
    #[derive(Debug)]
    pub(crate) struct Keeper {
        stop: Arc<(Mutex<bool>, Condvar)>,
        lost: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Keeper {
        /// Renews `lease` every third of `ttl`.
        pub(crate) fn start(etcd: Etcd, lease: i64, ttl: Duration, what: String) -> Keeper {
            let stop = Arc::new((Mutex::new(false), Condvar::new()));
            let lost = Arc::new(AtomicBool::new(false));
            let (s, l) = (stop.clone(), lost.clone());
            let thread = std::thread::spawn(move || {
                let every = (ttl / 3).max(Duration::from_millis(100));
                let mut wait = every;
                loop {
                    let (m, cv) = &*s;
                    let Ok(guard) = m.lock() else { return };
                    let Ok((stopped, _)) = cv.wait_timeout_while(guard, wait, |stopped| !*stopped) else { return };
                    if *stopped {
                        return;
                    }
                    drop(stopped);
                    match etcd.keep_alive(lease) {
                        Ok(_) => wait = every,
                        Err(EtcdError::LeaseExpired(_)) => {
                            tracing::error!(%what, lease, "lease expired: etcd no longer has this registration");
                            l.store(true, Ordering::Release);
                            return;
                        }
                        Err(e) => {
                            // Keep trying, faster, while the lease may still be alive.
                            tracing::warn!(%what, error = %e, "cannot renew the lease; retrying");
                            wait = (every / 4).max(Duration::from_millis(50));
                        }
                    }
                }
            });
            Keeper { stop, lost, thread: Some(thread) }
        }

        /// Whether the lease was lost (expired while etcd could not be reached, or revoked).
        pub(crate) fn is_lost(&self) -> bool {
            self.lost.load(Ordering::Acquire)
        }

        /// Stops renewing (the lease then expires by itself unless revoked).
        pub(crate) fn stop(&mut self) {
            let (m, cv) = &*self.stop;
            if let Ok(mut s) = m.lock() {
                *s = true;
            }
            cv.notify_all();
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    impl Drop for Keeper {
        fn drop(&mut self) {
            self.stop();
        }
    }
}
