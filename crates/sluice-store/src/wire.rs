//! What travels between NF instances and a store: keys, requests, responses, notifications.
//! Every backend (embedded, Redis) speaks these types; only their encoding differs.

use serde::{Deserialize, Serialize};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{StateKey, StateOp, Value};
use std::sync::Arc;

/// The store-wide name of one value: CHC's keys. Per-flow and shared objects are both named by
/// vertex, object and key; per-flow values additionally carry an owner (see [`StoreOp::Claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StoreKey {
    /// The logical vertex (all instances of a vertex share its objects).
    pub vertex: u16,
    /// The object within the vertex's NF.
    pub object: u16,
    /// The key within the object.
    pub key: StateKey,
}

/// Identifies an update for exactly-once application: the clock of the packet that caused it
/// and the update's number among that packet's updates at this vertex. A clone replaying the
/// packet issues the same tags, so its updates are recognised as duplicates. The packet's own
/// updates are numbered from 0; those of a timer that fires before it carry the timer's
/// identity ([`timer_update_seq`]), so that an instance firing other timers at that clock than
/// its predecessor did gets none of their answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpTag {
    /// The packet's logical clock.
    pub clock: Clock,
    /// Number of the update within the packet at this vertex.
    pub seq: u32,
}

/// Bit 31 of [`OpTag::seq`]: an update made by a timer that fired before the packet.
pub const TIMER_UPDATE: u32 = 0x8000_0000;

/// The [`OpTag::seq`] of update `n` (from 0) that the handler of the timer on `(object, key)`
/// makes when it fires before a packet (`None`: an update made while due timers are looked up,
/// outside any handler). Bit 31 is set; bits 8–30 are a hash of the timer's key (and of `n`'s
/// block of 256), bits 0–7 `n`'s place in its block: a timer's updates keep their numbers
/// whatever other timers fire at that clock. Two different timers of one vertex share numbers
/// only if their hashes collide (one chance in 2²³ per pair firing at the same clock), and
/// that matters only where a replacement fires another set of timers at a clock than its
/// predecessor did. The hash is FNV-1a over the key's fixed-width fields: the same on every
/// node of a build.
pub fn timer_update_seq(timer: Option<(u16, &sluice_state::StateKey)>, n: u32) -> u32 {
    use std::hash::{Hash, Hasher};
    let mut h = sluice_packet::Fnv1a::default();
    match timer {
        Some((object, key)) => {
            h.write_u16(object);
            key.hash(&mut h);
        }
        None => h.write_u8(0xFF),
    }
    h.write_u32(n >> 8);
    let hash = h.finish();
    let folded = (hash ^ (hash >> 32)) as u32;
    TIMER_UPDATE | (folded & 0x7FFF_FF00) | (n & 0xFF)
}

/// Operations a store executes: the NF-visible state operations plus the store's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StoreOp {
    /// A state operation on the value at the request's key.
    State(StateOp),
    /// Several tagged increments of one value (the write-mostly counters of a batch of
    /// packets, sent as one request). Each is applied unless its tag was applied before.
    IncrMany(Vec<(OpTag, i64)>),
    /// The owner's update applied by the owner: write `value` (`None` deletes it) and answer
    /// `result`, which a tagged request logs like any update's. A fault-tolerant instance
    /// sends its per-flow updates this way when it applied them already (a custom operation,
    /// which only the client can run: Redis would otherwise return the value for the client to
    /// apply and write back, a second call). Only the value's owner (or anyone, if none) may.
    Write {
        /// The value after the update.
        value: Option<Value>,
        /// What the update answered.
        result: Option<Value>,
    },
    /// Register for change callbacks on the key (read-heavy cached objects). Result: the value.
    Subscribe,
    /// Stop change callbacks.
    Unsubscribe,
    /// Arm (or re-arm) a timer on the key for `deadline_ns` of packet time; the requester
    /// becomes the one told when it fires.
    SetTimer {
        /// Deadline, nanoseconds of packet time.
        deadline_ns: u64,
    },
    /// Cancel the timer on the key.
    CancelTimer,
    /// The requester's copy of the timer on the key fired at `deadline_ns`. If the store's timer
    /// on the key is still that one, it is cancelled and the result is `Int(1)`: the requester
    /// acts on the expiry. Otherwise (another instance re-armed it since, or cancelled it) the
    /// result is `Int(0)` and nothing changes: the requester's copy was stale. Instances sharing
    /// a cross-flow object each keep the timers they armed; this makes exactly one of them
    /// expire a key, at the deadline the logical NF would.
    ExpireTimer {
        /// The deadline the requester's copy had, nanoseconds of packet time.
        deadline_ns: u64,
    },
    /// Take ownership of a per-flow value. Result: `Int(1)` if the requester owns it now,
    /// `Int(0)` if another live owner holds it (the requester is then told on release).
    Claim,
    /// Give up ownership (after flushing); a waiting claimant is told.
    Release,
    /// The root finished with this packet: forget the per-clock log entries of its clock.
    ForgetClock(Clock),
    /// Advance the store's packet time (clients report it with their batches); due timers fire.
    AdvanceTime(u64),
    /// The result the update tagged like this request got, if the store applied one
    /// (`replayed: true`); applies nothing. Untagged, or no such update logged: no result,
    /// `replayed: false`. A packet processed again without changing state (CHC's emulation at
    /// an NF a replay passes through) answers its updates as its first processing's were
    /// answered (docs/correctness.md, "Fixed (2026-12-07, thirteenth session): an emulated
    /// packet's updates").
    Logged,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Client-chosen id, echoed in the response.
    pub id: u64,
    /// The instance asking.
    pub client: InstanceId,
    /// Exactly-once tag for updates (`None`: apply unconditionally).
    pub tag: Option<OpTag>,
    /// The value addressed (ignored by `ForgetClock` and `AdvanceTime`).
    pub key: StoreKey,
    /// The operation.
    pub op: StoreOp,
    /// The requester waits for this request's result. Other requests are acknowledged per
    /// batch (see [`Replies::acked`]) and answered only if they fail.
    pub reply: bool,
}

/// What a client collects from its connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Replies {
    /// Answers to requests sent with `reply`, and failures of any request.
    pub responses: Vec<Response>,
    /// Batches (numbers returned by `Connection::send`) whose every request has been applied.
    pub acked: Vec<u64>,
}

impl Replies {
    /// Whether nothing has arrived.
    pub fn is_empty(&self) -> bool {
        self.responses.is_empty() && self.acked.is_empty()
    }
}

/// The clock of the last operation the store applied for each instance: returned with reads so
/// that a store rebuilt from a checkpoint can tell which logged operations to re-execute.
pub type TsVector = Arc<[(InstanceId, Clock)]>;

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The request's id.
    pub id: u64,
    /// The operation's result.
    pub result: Result<Option<Value>, String>,
    /// Whether the result came from the per-clock log (the update had been applied before).
    pub replayed: bool,
    /// For reads of shared values: the TS vector at the time of the read.
    pub ts: Option<TsVector>,
}

/// Something the store tells a client without being asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Notification {
    /// A subscribed value changed (`None`: deleted).
    Changed {
        /// The key.
        key: StoreKey,
        /// Its new value.
        value: Option<Value>,
    },
    /// A timer this client armed has fired.
    TimerFired {
        /// The key.
        key: StoreKey,
    },
    /// A per-flow value this client claimed has been released by its previous owner.
    Handover {
        /// The key.
        key: StoreKey,
    },
}

/// A consistent copy of a store's shared state, its TS vector, timers and per-clock log.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Every value.
    pub values: Vec<(StoreKey, Value)>,
    /// The TS vector at the time of the checkpoint.
    pub ts: Vec<(InstanceId, Clock)>,
    /// Every armed timer, sorted: the key, its deadline (nanoseconds of packet time) and the
    /// instance that would be told if it fired now (the key's owner if it is claimed, else the
    /// instance that armed it). Owners are not part of a checkpoint, so recording the recipient
    /// rather than the armer keeps "who is told" unchanged across a restore; a recovering NF
    /// instance finds here the timers its crashed predecessor armed.
    pub timers: Vec<(StoreKey, u64, InstanceId)>,
    /// The per-clock log: the results of the tagged updates of packets still in flight. A
    /// store rebuilt from the checkpoint answers a replay of those updates from it instead of
    /// applying them twice (an instance that failed after the checkpoint took its write-ahead
    /// log with it, so nothing else could tell the rebuilt store they were applied).
    pub log: Vec<LoggedResult>,
}

/// One entry of a store's per-clock log: the update tagged (`clock`, `vertex`, `seq`) was
/// applied and returned `result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedResult {
    /// Where the store keeps it (an embedded store's shard, a Redis bucket): a checkpoint is
    /// restored into a store of the same layout.
    pub part: u32,
    /// The packet's clock.
    pub clock: Clock,
    /// The vertex of the NF that made the update.
    pub vertex: u16,
    /// The update's number among the packet's updates at that vertex ([`OpTag::seq`]).
    pub seq: u32,
    /// What the update returned.
    pub result: Option<Value>,
    /// What the update found of the value it changed, where the store keeps it: what a
    /// replayed packet's read as of the update's clock returns, after a restore too.
    #[serde(default)]
    pub found: Option<Found>,
}

/// What a logged update found of the value it changed (a store's per-clock log keeps it for
/// replayed packets' reads, docs/decisions.md "A replayed packet reads what its first run
/// read").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Found {
    /// `key` held `value` before the update.
    Kept {
        /// The value's key.
        key: StoreKey,
        /// What it held (`None`: absent).
        value: Option<Value>,
    },
    /// The update changed `key`, whose earlier value was too large to keep: a replayed read
    /// of it reads the value now.
    NotKept {
        /// The value's key.
        key: StoreKey,
    },
}

#[cfg(test)]
mod timer_tag_tests {
    use super::*;
    use sluice_state::StateKey;

    #[test]
    fn a_timers_updates_are_numbered_by_the_timer_and_apart_from_the_packets() {
        let (a, b) = (StateKey::Id(1), StateKey::Id(2));
        let first = timer_update_seq(Some((0, &a)), 0);
        assert_eq!(first & TIMER_UPDATE, TIMER_UPDATE, "above every packet's own number");
        assert_eq!(timer_update_seq(Some((0, &a)), 0), first, "the same in every instance");
        assert_eq!(timer_update_seq(Some((0, &a)), 1), first + 1, "a timer's updates in order");
        assert_ne!(timer_update_seq(Some((0, &b)), 0), first, "another key");
        assert_ne!(timer_update_seq(Some((1, &a)), 0), first, "another object");
        assert_ne!(timer_update_seq(None, 0), first, "outside any handler");
        // Past a block of 256, the numbers go on elsewhere rather than wrap onto the first.
        let later = timer_update_seq(Some((0, &a)), 256);
        assert!(later & TIMER_UPDATE != 0 && later != first);
    }
}
