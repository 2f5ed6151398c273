//! Processing a packet again without changing state: CHC's "emulated" updates of an NF a
//! replay passes through. Reads see the state as it is (a replayed packet's: as of its
//! clock, where the backend keeps earlier values); updates land in a scratch copy that is
//! dropped with the packet, and answer what the backend logged for the first processing's
//! update at the same place where it has one ([`StateHandle::emulated_update`]), else what
//! the scratch copy gives; timers are not touched. A non-blocking update (a write-mostly
//! counter) reads nothing: the NF never sees its result, so it is only noted, and applied to
//! the scratch copy should the packet read that value after all — reading it from the store
//! cost a round trip per packet, which made a replay through a replacement crawl.

use sluice_packet::Meta;
use sluice_state::{ops::apply, CustomOp, ObjectId, StateError, StateHandle, StateKey, StateOp, TimerFired, Value};
use std::collections::HashMap;

/// A state handle over `inner` whose updates go to a scratch copy (see the module).
pub(crate) struct Emulating<'a> {
    inner: &'a mut dyn StateHandle,
    custom: &'a [CustomOp],
    scratch: HashMap<(ObjectId, StateKey), Option<Value>>,
    /// Non-blocking updates of values not read yet, in order.
    unread: HashMap<(ObjectId, StateKey), Vec<StateOp>>,
}

impl<'a> Emulating<'a> {
    pub(crate) fn new(inner: &'a mut dyn StateHandle, custom: &'a [CustomOp]) -> Emulating<'a> {
        Emulating { inner, custom, scratch: HashMap::new(), unread: HashMap::new() }
    }
}

impl StateHandle for Emulating<'_> {
    fn exec(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let slot = match self.scratch.get(&(obj, *key)) {
            Some(v) => v.clone(),
            None => {
                let mut v = self.inner.exec(obj, key, StateOp::Get)?;
                for earlier in self.unread.remove(&(obj, *key)).unwrap_or_default() {
                    apply(&mut v, earlier, self.custom)?;
                }
                v
            }
        };
        if !op.is_update() {
            let mut read = slot;
            return apply(&mut read, op, self.custom);
        }
        // Numbered after the read: a replayed read is answered as of the next update's number.
        let first = self.inner.emulated_update(obj, key, true)?;
        let mut value = slot;
        let result = apply(&mut value, op, self.custom)?;
        self.scratch.insert((obj, *key), value);
        Ok(first.unwrap_or(result))
    }

    fn exec_nb(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<(), StateError> {
        // Its number taken, as its first processing took one; the NF never sees its result.
        self.inner.emulated_update(obj, key, false)?;
        match self.scratch.get_mut(&(obj, *key)) {
            Some(v) => apply(v, op, self.custom).map(|_| ()),
            None => {
                self.unread.entry((obj, *key)).or_default().push(op);
                Ok(())
            }
        }
    }

    fn record(&mut self, fresh: Value) -> Result<Value, StateError> {
        // The first processing's draw, where the backend keeps one (answered from its log).
        self.inner.record(fresh)
    }

    fn set_timer(&mut self, _obj: ObjectId, _key: &StateKey, _deadline_ns: u64) {}

    fn cancel_timer(&mut self, _obj: ObjectId, _key: &StateKey) {}

    fn expired(&mut self, _now_ns: u64, _max: usize, _out: &mut Vec<TimerFired>) {}

    fn begin_packet(&mut self, meta: &Meta) {
        self.inner.begin_packet(meta);
    }

    fn end_packet(&mut self, meta: &mut Meta) {
        self.inner.end_packet(meta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_state::{AccessPattern, LocalState, Scope, StateDecl};

    #[test]
    fn updates_see_each_other_and_leave_the_state_and_timers_as_they_were() {
        let decls = [StateDecl::new("counter", Scope::global(), AccessPattern::ReadWriteOften)];
        let mut state = LocalState::new(&decls, &[]);
        let (obj, key) = (ObjectId(0), StateKey::Unit);
        state.incr(obj, &key, 5).expect("incr");
        state.set_timer(obj, &key, 1_000);
        {
            let mut emulating = Emulating::new(&mut state, &[]);
            // Reads see the real state, updates build on each other.
            assert_eq!(emulating.incr(obj, &key, 2).expect("incr"), 7);
            assert_eq!(emulating.incr(obj, &key, 1).expect("incr"), 8);
            assert_eq!(emulating.get(obj, &key).expect("get"), Some(Value::Int(8)));
            emulating.cancel_timer(obj, &key);
            assert_eq!(emulating.delete(obj, &key).expect("delete"), Some(Value::Int(8)));
            assert_eq!(emulating.get(obj, &key).expect("get"), None);
        }
        assert_eq!(state.get(obj, &key).expect("get"), Some(Value::Int(5)), "the state is untouched");
        let mut fired = Vec::new();
        state.expired(1_000, 10, &mut fired);
        assert_eq!(fired.len(), 1, "the timer is still armed");
    }

    /// Local state that counts what reaches it.
    struct Counting {
        inner: LocalState,
        calls: usize,
    }

    impl StateHandle for Counting {
        fn exec(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
            self.calls += 1;
            self.inner.exec(obj, key, op)
        }
        fn set_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
            self.inner.set_timer(obj, key, deadline_ns);
        }
        fn cancel_timer(&mut self, obj: ObjectId, key: &StateKey) {
            self.inner.cancel_timer(obj, key);
        }
        fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>) {
            self.inner.expired(now_ns, max, out);
        }
    }

    #[test]
    fn a_non_blocking_update_reads_nothing_unless_the_packet_reads_its_value() {
        let decls = [StateDecl::new("counter", Scope::global(), AccessPattern::WriteMostly)];
        let mut state = Counting { inner: LocalState::new(&decls, &[]), calls: 0 };
        let (obj, key) = (ObjectId(0), StateKey::Unit);
        state.inner.incr(obj, &key, 10).expect("incr");
        {
            let mut emulating = Emulating::new(&mut state, &[]);
            emulating.incr_nb(obj, &key, 2).expect("incr_nb");
            emulating.incr_nb(obj, &key, 3).expect("incr_nb");
        }
        assert_eq!(state.calls, 0, "a counter the packet only counts on is not read");
        {
            let mut emulating = Emulating::new(&mut state, &[]);
            emulating.incr_nb(obj, &key, 2).expect("incr_nb");
            // Read after all: the value with the packet's earlier updates, in order.
            assert_eq!(emulating.incr(obj, &key, 3).expect("incr"), 15);
            emulating.incr_nb(obj, &key, 1).expect("incr_nb");
            assert_eq!(emulating.get(obj, &key).expect("get"), Some(Value::Int(16)));
        }
        assert_eq!(state.calls, 1, "one read, for the value the packet read");
        assert_eq!(state.inner.get(obj, &key).expect("get"), Some(Value::Int(10)), "the state is untouched");
    }
}
