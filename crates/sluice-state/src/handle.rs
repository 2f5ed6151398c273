//! The handle NFs use to reach their state.

use crate::decl::ObjectId;
use crate::value::{StateKey, StateOp, Value};
use sluice_packet::Meta;

/// Why a state operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// The operation does not apply to the stored value's type.
    #[error("operation {op} does not apply to a {found} value")]
    WrongType {
        /// The operation.
        op: &'static str,
        /// The kind of value found.
        found: &'static str,
    },
    /// The NF named an object it did not declare.
    #[error("state object {0:?} is not declared")]
    UnknownObject(ObjectId),
    /// The NF named a custom operation it did not register.
    #[error("custom operation {0} is not registered")]
    UnknownCustomOp(u16),
    /// A custom operation refused its input.
    #[error("custom operation failed: {0}")]
    Custom(&'static str),
    /// The backend could not be reached or answered wrongly.
    #[error("state backend: {0}")]
    Backend(String),
}

/// A timer that expired: the object and key it was set on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerFired {
    /// The object.
    pub object: ObjectId,
    /// The key.
    pub key: StateKey,
}

/// What [`StateHandle::due_where`] sees among the timers due before a packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DueTimers {
    /// The first due timer is one the asker may fire.
    pub first_fireable: bool,
    /// One of them (within the look's limit) is another instance's to fire.
    pub foreign: bool,
}

/// Access to an NF instance's state. One handle per instance; it is driven by the runtime's
/// worker, so it needs no locks. The typed helpers are thin wrappers over [`StateHandle::exec`]
/// and [`StateHandle::exec_nb`], the two calls a backend implements.
pub trait StateHandle: Send {
    /// Executes `op` and waits for its result.
    fn exec(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError>;

    /// Executes an update without waiting for its result (CHC's non-blocking operation): the
    /// backend may apply it later, but before any later read of the same object by anyone.
    fn exec_nb(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<(), StateError> {
        self.exec(obj, key, op).map(|_| ())
    }

    /// A value the NF drew from a non-deterministic source (a random number, the wall clock)
    /// while processing the current packet. Processing the same packet again (a replay after a
    /// failure, a clone beside a straggler) must see the same value, so a backend that can
    /// replay records the first value under the packet's clock and the draw's position, and
    /// returns the recorded value to every later draw at the same place (CHC §5: values are
    /// written to the store keyed by clock). The local backend never replays: `fresh`.
    fn record(&mut self, fresh: Value) -> Result<Value, StateError> {
        Ok(fresh)
    }

    /// For a packet processed again without changing state (CHC's emulation, at an NF that a
    /// replay passes through after the record of what it emitted was lost): numbers the
    /// packet's next update of `key` in `obj` as its first processing numbered it and, with
    /// `answer`, returns what the backend logged as that update's result — `Some(result)` if
    /// it applied that update. Answered from the log, an emulated packet takes the path and
    /// the values its first processing took, where state read now would not (a NAT's port
    /// taken from the pool as it is now). `None` (the default, a backend without a per-clock
    /// log): the caller computes the update on what it reads.
    fn emulated_update(
        &mut self,
        _obj: ObjectId,
        _key: &StateKey,
        _answer: bool,
    ) -> Result<Option<Option<Value>>, StateError> {
        Ok(None)
    }

    /// Arms (or re-arms) a timer on `key` of `obj` for `deadline_ns` in packet time. A timer
    /// armed already, re-armed later by less than the object's slack
    /// ([`StateDecl::idle_timers`](crate::StateDecl::idle_timers)), keeps its deadline.
    fn set_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64);

    /// Cancels a timer; no effect if none is armed.
    fn cancel_timer(&mut self, obj: ObjectId, key: &StateKey);

    /// Removes and returns up to `max` timers due at `now_ns`, earliest first.
    fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>);

    /// [`StateHandle::expired`] for the timers `fire` accepts; the others stay armed. A flow
    /// moving to another instance is that instance's to expire from the move on, while this
    /// one still has earlier packets of it to process (and the timer to hand over once done).
    /// Backends that cannot keep timers back fire them all.
    fn expired_where(
        &mut self,
        now_ns: u64,
        max: usize,
        out: &mut Vec<TimerFired>,
        _fire: &dyn Fn(ObjectId, &StateKey) -> bool,
    ) {
        self.expired(now_ns, max, out);
    }

    /// Looks, without firing anything, at the first `max` timers due at `now_ns` in the order
    /// they would fire: whether the first is one `fire` accepts, and whether any is one it
    /// does not. A backend whose timers some other instance fires in turn (the per-flow timers
    /// of an order-sensitive vertex with several instances, kept in one table for all of them)
    /// says so; by default every timer due here is this instance's, and nothing is said.
    fn due_where(&mut self, _now_ns: u64, _max: usize, _fire: &dyn Fn(ObjectId, &StateKey) -> bool) -> DueTimers {
        DueTimers::default()
    }

    /// Called by the runtime before an instance processes a batch.
    fn begin_batch(&mut self) {}

    /// Called by the runtime after an instance processed a batch; backends that batch requests
    /// send them here.
    fn end_batch(&mut self) {}

    /// Whether [`StateHandle::begin_packet`] and [`StateHandle::end_packet`] do anything here. A
    /// handle that keeps both as the no-ops they are by default may say `false`, and an instance
    /// then skips the two calls a packet.
    fn brackets_packets(&self) -> bool {
        true
    }

    /// Whether [`StateHandle::end_packet`] does anything here, where packets are bracketed: a
    /// handle whose packets never carry anything into their metadata may say `false`, and an
    /// instance then skips that call a packet.
    fn ends_packets(&self) -> bool {
        self.brackets_packets()
    }

    /// Called before each packet with its metadata (its clock keys logs and replays).
    fn begin_packet(&mut self, _meta: &Meta) {}

    /// Called after each packet; backends record the packet's non-blocking updates in its XOR
    /// vector here.
    fn end_packet(&mut self, _meta: &mut Meta) {}

    /// The instance starts (`true`) or ends (`false`) firing the timers due before the current
    /// packet. A backend that tags updates by their order in the packet numbers the timers'
    /// apart from the packet's own: another instance processing the same packet again (a
    /// replacement, a clone) may find other timers due, and the packet's own updates must keep
    /// their numbers, or the store answers one from the log of another.
    fn timers(&mut self, _firing: bool) {}

    /// Whether asking for the timers due at `now_ns` ([`StateHandle::expired`]) may find any
    /// or has other work to do; `false` only when it certainly would not, so that an instance
    /// skips the asking (once per packet). By default, always `true`.
    fn may_fire(&self, _now_ns: u64) -> bool {
        true
    }

    /// Between `timers(true)` and `timers(false)`: the handler of `timer` runs now, and the
    /// updates until the next call are that timer's. A backend that tags updates numbers a
    /// timer's by the timer, so that an instance firing other timers at this packet than
    /// another instance did gets none of their updates' answers.
    fn timer_fires(&mut self, _timer: &TimerFired) {}

    /// The runtime says whether this instance is now the only user of shared object `obj`
    /// (it may then cache it) or not (it must flush and stop caching it).
    fn set_exclusive(&mut self, _obj: ObjectId, _exclusive: bool) {}

    /// Moves into `out` the updates now committed where the state lives, as `(packet clock,
    /// XOR of the ids this instance folded into that packet's vector)`: the root folds them
    /// into its copy of the vector and may forget a logged packet once it comes to zero.
    /// Local state commits nothing (it is lost with the instance anyway).
    fn take_commits(&mut self, _out: &mut Vec<(sluice_packet::Clock, u64)>) {}

    /// The backend as `Any`, for the runtime's recovery procedures (reconnecting a client after
    /// a store failure, collecting its write-ahead log).
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }

    /// Counters describing how the backend served the instance (round trips, cache hits, ...),
    /// for reports; empty for local state.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// Writes everything cached or pending to where the state lives and waits until it is
    /// there (end of a run, before a planned handover).
    fn flush(&mut self) -> Result<(), StateError> {
        Ok(())
    }

    /// Reads a value.
    fn get(&mut self, obj: ObjectId, key: &StateKey) -> Result<Option<Value>, StateError> {
        self.exec(obj, key, StateOp::Get)
    }

    /// Writes a value.
    fn set(&mut self, obj: ObjectId, key: &StateKey, value: Value) -> Result<(), StateError> {
        self.exec(obj, key, StateOp::Set(value)).map(|_| ())
    }

    /// Removes a value, returning it.
    fn delete(&mut self, obj: ObjectId, key: &StateKey) -> Result<Option<Value>, StateError> {
        self.exec(obj, key, StateOp::Delete)
    }

    /// Adds `delta` and returns the new value.
    fn incr(&mut self, obj: ObjectId, key: &StateKey, delta: i64) -> Result<i64, StateError> {
        let v = self.exec(obj, key, StateOp::Incr(delta))?;
        Ok(v.and_then(|v| v.as_int()).unwrap_or(0))
    }

    /// Adds `delta` without waiting (write-mostly counters).
    fn incr_nb(&mut self, obj: ObjectId, key: &StateKey, delta: i64) -> Result<(), StateError> {
        self.exec_nb(obj, key, StateOp::Incr(delta))
    }

    /// Pops the front of a list.
    fn pop(&mut self, obj: ObjectId, key: &StateKey) -> Result<Option<Value>, StateError> {
        self.exec(obj, key, StateOp::Pop)
    }

    /// Appends to a list without waiting.
    fn push_nb(&mut self, obj: ObjectId, key: &StateKey, value: Value) -> Result<(), StateError> {
        self.exec_nb(obj, key, StateOp::Push(value))
    }

    /// Runs custom operation `op` (index into the NF's registered list).
    fn custom(&mut self, obj: ObjectId, key: &StateKey, op: u16, arg: Value) -> Result<Option<Value>, StateError> {
        self.exec(obj, key, StateOp::Custom { op, arg })
    }
}
