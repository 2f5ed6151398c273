//! Reading Redis replies, and Redis errors as store errors.

use crate::codec::{self, decode_key};
use sluice_packet::{Clock, InstanceId};
use sluice_store::{StoreError, StoreKey};

/// A backend-level failure (bad URL, unreachable node, unusable cluster).
pub(crate) fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::Unavailable(msg.into())
}

/// Whether the connection itself failed (it is then dropped and opened again).
pub(crate) fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

/// Whether a node answered that it is busy for now and did not run the command: `BUSY` (another
/// client's script ran past the node's busy threshold) or `LOADING` (reading its data after a
/// restart). Both end by themselves, so the command is sent again after a pause.
pub(crate) fn is_busy(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::BusyLoadingError || e.code() == Some("BUSY")
}

/// A Redis error as a store error: connection trouble makes the store unavailable, anything
/// else is a protocol error.
pub(crate) fn redis_err(e: redis::RedisError) -> StoreError {
    if is_connection_error(&e) {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Protocol(e.to_string())
    }
}

/// Whether a failed call should be retried on a fresh slot map.
pub(crate) fn is_topology_error(e: &redis::RedisError) -> bool {
    e.is_cluster_error() || is_topology_text(&e.to_string())
}

/// Whether an error's text says the slot map changed under the call (see
/// [`is_topology_error`]; also for errors already turned into [`StoreError`]s).
pub(crate) fn is_topology_text(s: &str) -> bool {
    s.contains("non local key")
        || s.contains("MOVED")
        || s.contains("ASK")
        || s.contains("CLUSTERDOWN")
        // The same, raised inside a function call (`sluice_exec`): the cluster marked itself
        // down for a moment (a node timed out under load, a failover in progress).
        || s.contains("cluster is down")
        // A write reached a primary that has become a replica (it failed and came back).
        || s.contains("READONLY")
        || s.contains("ReadOnly")
        || s.contains("TRYAGAIN")
        // A node that came back empty (restarted without its data, not yet synced from its new
        // primary) while a stale slot map still sends calls to it: the call ran nothing.
        || is_missing_library_text(s)
}

/// Whether an error's text says the node lacks Sluice's function library (restarted without
/// its data, added to the cluster after the backend connected, flushed): the call ran nothing,
/// and goes again once the library is loaded there ([`crate::topology::Shared::library_lost`]).
pub(crate) fn is_missing_library_text(s: &str) -> bool {
    s.contains("Function not found")
}

/// Whether an error's text says the cluster is down or busy for a moment, which can pass
/// without the slot map changing (a failover still spreading among the nodes).
pub(crate) fn is_passing_text(s: &str) -> bool {
    s.contains("CLUSTERDOWN") || s.contains("cluster is down") || s.contains("TRYAGAIN")
}

/// A string reply's bytes (nil is empty).
pub(crate) fn bytes(v: &redis::Value) -> Result<&[u8], StoreError> {
    match v {
        redis::Value::BulkString(b) => Ok(b),
        redis::Value::SimpleString(s) => Ok(s.as_bytes()),
        redis::Value::Nil => Ok(&[]),
        other => Err(StoreError::Protocol(format!("expected a string, got {other:?}"))),
    }
}

/// A string or integer reply as text.
pub(crate) fn text(v: &redis::Value) -> Result<String, StoreError> {
    match v {
        redis::Value::Int(i) => Ok(i.to_string()),
        other => String::from_utf8(bytes(other)?.to_vec()).map_err(|_| StoreError::Protocol("not UTF-8".into())),
    }
}

/// An array (or set) reply's elements (nil is empty).
pub(crate) fn array(v: &redis::Value) -> Result<&[redis::Value], StoreError> {
    match v {
        redis::Value::Array(a) | redis::Value::Set(a) => Ok(a),
        redis::Value::Nil => Ok(&[]),
        other => Err(StoreError::Protocol(format!("expected an array, got {other:?}"))),
    }
}

/// A reply holding a number, as text or as an integer.
pub(crate) fn number<T: std::str::FromStr>(v: &redis::Value) -> Result<T, StoreError> {
    let s = text(v)?;
    s.parse().map_err(|_| StoreError::Protocol(format!("expected a number, got {s:?}")))
}

/// A value or key that does not decode, as a protocol error.
pub(crate) fn codec_err(e: codec::CodecError) -> StoreError {
    StoreError::Protocol(e.to_string())
}

/// A flat `client, clock, ...` array as a sorted TS vector.
pub(crate) fn ts_of(v: &redis::Value) -> Result<Vec<(InstanceId, Clock)>, StoreError> {
    let a = array(v)?;
    let mut ts = Vec::with_capacity(a.len() / 2);
    for pair in a.chunks(2) {
        if let [c, k] = pair {
            ts.push((InstanceId(number(c)?), Clock(number(k)?)));
        }
    }
    ts.sort();
    Ok(ts)
}

/// A key encoding that must be exactly one key.
pub(crate) fn decode_whole_key(kb: &[u8]) -> Result<StoreKey, StoreError> {
    let (key, used) = decode_key(kb).map_err(codec_err)?;
    if used != kb.len() {
        return Err(StoreError::Protocol("trailing bytes after a key".into()));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_down_for_a_moment_is_retried_on_a_fresh_slot_map() {
        let in_function = redis::RedisError::from((
            redis::ErrorKind::ResponseError,
            "An error was signalled by the server",
            "Script attempted to execute a command while the cluster is down script: sluice_exec".to_string(),
        ));
        assert!(is_topology_error(&in_function));
        let plain = redis::RedisError::from((redis::ErrorKind::ResponseError, "ERR", "unknown command".to_string()));
        assert!(!is_topology_error(&plain), "other errors are not retried");
        // A cluster down for a moment may pass with the map as it is; a MOVED needs a new map.
        assert!(is_passing_text(&in_function.to_string()));
        assert!(!is_passing_text("MOVED 3999 127.0.0.1:6381"));
    }

    #[test]
    fn a_node_back_without_the_library_is_retried_on_a_fresh_slot_map() {
        // What a primary killed and restarted without its data answered a call sent to it on
        // the old map (sluice-redis's failover test, once in a suite run).
        let empty = redis::RedisError::from((
            redis::ErrorKind::ResponseError,
            "An error was signalled by the server",
            "Function not found".to_string(),
        ));
        assert!(is_topology_error(&empty));
        assert!(!is_passing_text(&empty.to_string()), "the map must be read again");
    }
}
