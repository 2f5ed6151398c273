//! Processing a packet again without changing state: CHC's "emulated" updates of an NF a
//! replay passes through. Reads see the state as it is; updates land in a scratch copy that
//! is dropped with the packet; timers are not touched.

use sluice_packet::Meta;
use sluice_state::{ops::apply, CustomOp, ObjectId, StateError, StateHandle, StateKey, StateOp, TimerFired, Value};
use std::collections::HashMap;

/// A state handle over `inner` whose updates go to a scratch copy (see the module).
pub(crate) struct Emulating<'a> {
    inner: &'a mut dyn StateHandle,
    custom: &'a [CustomOp],
    scratch: HashMap<(ObjectId, StateKey), Option<Value>>,
}

impl<'a> Emulating<'a> {
    pub(crate) fn new(inner: &'a mut dyn StateHandle, custom: &'a [CustomOp]) -> Emulating<'a> {
        Emulating { inner, custom, scratch: HashMap::new() }
    }
}

impl StateHandle for Emulating<'_> {
    fn exec(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let slot = match self.scratch.get(&(obj, *key)) {
            Some(v) => v.clone(),
            None => self.inner.exec(obj, key, StateOp::Get)?,
        };
        if !op.is_update() {
            let mut read = slot;
            return apply(&mut read, op, self.custom);
        }
        let mut value = slot;
        let result = apply(&mut value, op, self.custom)?;
        self.scratch.insert((obj, *key), value);
        Ok(result)
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
}
