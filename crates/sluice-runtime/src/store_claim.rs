//! A run claims the state store it starts on (docs/decisions.md, "A run starts from an empty
//! store").
//!
//! Every run numbers its packets from clock 1, and the store keeps, per clock, what each
//! tagged update did, so that a replayed packet is answered as its first run was. A second run
//! on a store the first one left would have its updates taken for replays of the first run's
//! (and its reads answered with the first run's values): its output would silently not be the
//! chain's. So the node with the root writes a mark into the store before anything runs, with
//! a compare-and-set that succeeds only on a store no run has marked; a store that holds
//! another run's mark is refused with what that run was, unless the run is told to empty it
//! first (`sluice run --fresh-store`).

use crate::root_log::ROOT_LOG_VERTEX;
use sluice_packet::InstanceId;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, Replies, Request, StoreKey, StoreOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The object of the mark, under the root log's vertex (no NF's state, never recorded).
const MARK_OBJECT: u16 = 1;

/// How long the store may take to answer the claim.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a run could not claim its store.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The store holds another run's mark.
    #[error(
        "the store already holds the state of another run ({0}); a run starts from an empty store: give it one of \
         its own (`space=` of a sluice:// URL, `prefix=` of a Redis URL), or `--fresh-store` to delete what is there \
         first"
    )]
    Taken(String),
    /// The store refused, failed or did not answer.
    #[error("claiming the store for this run: {0}")]
    Store(String),
}

/// Who a run is, as its mark says it: the chain, the host and process, and when it started.
pub fn run_mark(chain: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!(
        "chain `{chain}`, started at Unix time {}.{:03} s by process {} on `{host}`",
        since_epoch.as_secs(),
        since_epoch.subsec_millis(),
        std::process::id()
    )
}

/// Claims `backend` for the run `mark` describes: writes the mark if no run has, else says
/// which run holds it. With `fresh`, empties the store first.
pub fn claim_store(backend: &Arc<dyn Backend>, mark: &str, fresh: bool) -> Result<(), ClaimError> {
    let store_err = |e: sluice_store::StoreError| ClaimError::Store(e.to_string());
    if fresh {
        backend.wipe().map_err(store_err)?;
    }
    let client = InstanceId::new(ROOT_LOG_VERTEX, MARK_OBJECT);
    let mut conn = backend.connect(client).map_err(store_err)?;
    let request = Request {
        id: 1,
        client,
        tag: None,
        key: StoreKey { vertex: ROOT_LOG_VERTEX, object: MARK_OBJECT, key: StateKey::Unit },
        op: StoreOp::State(StateOp::CompareAndSet { expect: None, new: Value::Bytes(mark.as_bytes().to_vec()) }),
        reply: true,
    };
    conn.send(1, vec![request].into()).map_err(store_err)?;
    let deadline = Instant::now() + CLAIM_TIMEOUT;
    let mut replies = Replies::default();
    loop {
        if let Some(r) = replies.responses.iter().find(|r| r.id == 1) {
            return match &r.result {
                // Set: the store was no run's.
                Ok(Some(Value::Int(1))) => Ok(()),
                Ok(Some(Value::Bytes(other))) => Err(ClaimError::Taken(String::from_utf8_lossy(other).into_owned())),
                Ok(other) => Err(ClaimError::Taken(format!("a mark this run cannot read: {other:?}"))),
                Err(e) => Err(ClaimError::Store(e.clone())),
            };
        }
        if Instant::now() >= deadline {
            return Err(ClaimError::Store(format!("no answer within {CLAIM_TIMEOUT:?}")));
        }
        conn.wait(&mut replies, Duration::from_millis(100)).map_err(store_err)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_store::EmbeddedStore;

    fn store() -> Arc<dyn Backend> {
        Arc::new(EmbeddedStore::start(1).expect("store"))
    }

    #[test]
    fn a_second_run_on_a_store_is_refused_with_what_the_first_was() {
        let b = store();
        claim_store(&b, "run one", false).expect("an empty store is claimed");
        match claim_store(&b, "run two", false) {
            Err(ClaimError::Taken(by)) => assert_eq!(by, "run one"),
            other => panic!("expected the store refused, got {other:?}"),
        }
    }

    #[test]
    fn a_fresh_claim_empties_the_store_first() {
        let b = store();
        claim_store(&b, "run one", false).expect("claimed");
        claim_store(&b, "run two", true).expect("emptied and claimed");
        match claim_store(&b, "run three", false) {
            Err(ClaimError::Taken(by)) => assert_eq!(by, "run two"),
            other => panic!("expected the store refused, got {other:?}"),
        }
    }

    #[test]
    fn the_mark_is_not_a_packet_of_the_root_log() {
        let b = store();
        claim_store(&b, &run_mark("example"), false).expect("claimed");
        let log = crate::root_log::StoreLog::read(&b).expect("read the log");
        assert!(log.is_empty(), "{log:?}");
    }
}
