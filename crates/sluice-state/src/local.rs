//! State in the NF instance's own memory: the traditional NF, and the baseline every
//! externalised mode is measured against.

use crate::decl::{CustomOp, ObjectId, StateDecl};
use crate::handle::{StateError, StateHandle, TimerFired};
use crate::ops::apply;
use crate::value::{StateKey, StateOp, Value};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

type Map<K, V> = hashbrown::HashMap<K, V, ahash::RandomState>;

/// Timers in packet time, as every state backend keeps them on the instance side: armed,
/// re-armed and cancelled by key, fired earliest first (by deadline, then by when they were
/// last armed) when time passes their deadline.
///
/// Re-arming a timer later — an idle timeout pushed back by every packet of its flow, the
/// common case — only updates its entry in `armed`: the heap keeps the earlier entry, which,
/// when it surfaces, is put back at the timer's current deadline instead of firing. A heap
/// entry's key is never later than its timer's current (deadline, sequence), so timers fire
/// in exactly the order of a heap that got an entry per arming, with one heap push per
/// timeout period instead of one per packet.
#[derive(Default)]
pub struct Timers {
    /// Deadline-ordered entries; one whose sequence number is not its timer's `queued` was
    /// superseded (re-armed earlier, or cancelled) and is skipped when it surfaces.
    heap: BinaryHeap<Reverse<(u64, u64, ObjectId, StateKey)>>,
    /// The armed timers.
    armed: Map<(ObjectId, StateKey), Armed>,
    seq: u64,
}

/// One armed timer.
#[derive(Debug, Clone, Copy)]
struct Armed {
    /// When it was last armed (sequence number).
    seq: u64,
    /// Its deadline.
    deadline: u64,
    /// The sequence number of its entry in the heap (`seq`, or an earlier arming's).
    queued: u64,
}

impl Timers {
    /// Arms or re-arms the timer of `(obj, key)`.
    pub fn set(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
        self.set_with_slack(obj, key, deadline_ns, 0);
    }

    /// Arms or re-arms the timer of `(obj, key)`, unless it is armed and `deadline_ns` is later
    /// than its deadline by less than `slack_ns` ([`StateDecl::idle_timers`](crate::StateDecl::idle_timers)):
    /// then it keeps its deadline and its place among timers of the same deadline. Whether
    /// the timer changed.
    pub fn set_with_slack(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64, slack_ns: u64) -> bool {
        // One look-up a packet: the slack is judged on the entry found for the re-arm.
        let seq = self.seq + 1;
        match self.armed.entry((obj, *key)) {
            hashbrown::hash_map::Entry::Occupied(e)
                if deadline_ns.checked_sub(e.get().deadline).is_some_and(|later| later < slack_ns) =>
            {
                return false;
            }
            hashbrown::hash_map::Entry::Occupied(mut e) if e.get().deadline <= deadline_ns => {
                // Later (or the same): the entry in the heap surfaces first and moves then.
                let a = e.get_mut();
                (a.seq, a.deadline) = (seq, deadline_ns);
            }
            hashbrown::hash_map::Entry::Occupied(mut e) => {
                e.insert(Armed { seq, deadline: deadline_ns, queued: seq });
                self.heap.push(Reverse((deadline_ns, seq, obj, *key)));
            }
            hashbrown::hash_map::Entry::Vacant(e) => {
                e.insert(Armed { seq, deadline: deadline_ns, queued: seq });
                self.heap.push(Reverse((deadline_ns, seq, obj, *key)));
            }
        }
        self.seq = seq;
        true
    }

    /// Makes room for `n` more timers at once (a replacement arming its predecessor's).
    pub fn reserve(&mut self, n: usize) {
        self.armed.reserve(n);
        self.heap.reserve(n);
    }

    /// Cancels the timer of `(obj, key)`; returns whether one was armed.
    pub fn cancel(&mut self, obj: ObjectId, key: &StateKey) -> bool {
        self.armed.remove(&(obj, *key)).is_some()
    }

    /// Whether a timer is armed on `(obj, key)`.
    pub fn is_armed(&self, obj: ObjectId, key: &StateKey) -> bool {
        self.armed.contains_key(&(obj, *key))
    }

    /// No timer is due before this packet time (`None`: none armed). Cancelled and re-armed
    /// timers may leave an earlier deadline behind until they are next looked at.
    pub fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((deadline, ..))| *deadline)
    }

    /// The armed timers as `(object, key, deadline_ns)`, earliest first.
    pub fn armed(&self) -> Vec<(ObjectId, StateKey, u64)> {
        let mut v: Vec<_> = self.armed.iter().map(|(&(o, k), a)| (o, k, a.deadline)).collect();
        v.sort_by_key(|(o, k, d)| (*d, *o, *k));
        v
    }

    /// Disarms the timers whose key `take` selects and returns them as `(object, key,
    /// deadline_ns)` in the order they would have fired here (deadline, then arming order), so
    /// that whoever arms them next in that order fires ties as this table would have. One
    /// pass over the armed timers; their heap entries are left to be skipped when they surface.
    pub fn take_where(&mut self, take: impl Fn(&StateKey) -> bool) -> Vec<(ObjectId, StateKey, u64)> {
        let mut taken: Vec<(ObjectId, StateKey, u64)> = Vec::new();
        let mut order: Vec<(u64, u64, u32)> = Vec::new();
        self.armed.retain(|(o, k), a| {
            if take(k) {
                order.push((a.deadline, a.seq, taken.len() as u32));
                taken.push((*o, *k, a.deadline));
                return false;
            }
            true
        });
        // Sorted by (deadline, seq) alone, unique per timer: an entry with its key is several
        // times larger, and moving it was a third of a 9,000-timer move's hand-over.
        order.sort_unstable();
        order.into_iter().filter_map(|(.., i)| taken.get(i as usize).copied()).collect()
    }

    /// Number of armed timers.
    pub fn len(&self) -> usize {
        self.armed.len()
    }

    /// Whether no timer is armed.
    pub fn is_empty(&self) -> bool {
        self.armed.is_empty()
    }

    /// Removes and returns up to `max` timers due at `now_ns`, earliest first.
    pub fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>) {
        let mut deadlines = Vec::new();
        self.expired_at(now_ns, max, out, &mut deadlines);
    }

    /// [`Timers::expired`], also giving each fired timer's deadline (in `deadlines`, in the
    /// same order as the timers appended to `out`).
    pub fn expired_at(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>, deadlines: &mut Vec<u64>) {
        self.expired_where(now_ns, max, out, deadlines, &|_, _| true);
    }

    /// [`Timers::expired_at`] for the timers `fire` accepts; the others stay armed (their key
    /// is not this instance's to expire now, see `StateHandle::expired_where`).
    pub fn expired_where(
        &mut self,
        now_ns: u64,
        max: usize,
        out: &mut Vec<TimerFired>,
        deadlines: &mut Vec<u64>,
        fire: &dyn Fn(ObjectId, &StateKey) -> bool,
    ) {
        if !matches!(self.heap.peek(), Some(Reverse((deadline, ..))) if *deadline <= now_ns) {
            // Nothing due (most packets): no more work than a look at the heap's top.
            self.compact_if_stale();
            return;
        }
        let mut n = 0;
        let mut kept = Vec::new();
        while n < max {
            let Some((deadline, seq, object, key)) = self.pop_due(now_ns) else { break };
            if !fire(object, &key) {
                kept.push(Reverse((deadline, seq, object, key)));
                continue;
            }
            self.armed.remove(&(object, key));
            out.push(TimerFired { object, key });
            deadlines.push(deadline);
            n += 1;
        }
        self.heap.extend(kept);
        self.compact_if_stale();
    }

    /// The first `max` timers due at `now_ns`, in the order they would fire, left armed.
    pub fn due(&mut self, now_ns: u64, max: usize) -> Vec<(ObjectId, StateKey)> {
        let (mut due, mut looked) = (Vec::new(), Vec::new());
        while due.len() < max {
            let Some(entry) = self.pop_due(now_ns) else { break };
            due.push((entry.2, entry.3));
            looked.push(Reverse(entry));
        }
        self.heap.extend(looked);
        due
    }

    /// Takes the heap's next entry due at `now_ns` that is its timer's current one, skipping
    /// (and dropping) entries of cancelled timers and moving re-armed ones to their new place;
    /// the timer stays armed.
    fn pop_due(&mut self, now_ns: u64) -> Option<(u64, u64, ObjectId, StateKey)> {
        loop {
            match self.heap.peek() {
                Some(Reverse((deadline, ..))) if *deadline <= now_ns => {}
                _ => return None,
            }
            let Reverse((deadline, seq, object, key)) = self.heap.pop()?;
            let Some(a) = self.armed.get_mut(&(object, key)) else { continue };
            if a.queued != seq {
                continue; // superseded
            }
            if (a.seq, a.deadline) != (seq, deadline) {
                // Re-armed later since this entry was queued: it takes its place now.
                a.queued = a.seq;
                self.heap.push(Reverse((a.deadline, a.seq, object, key)));
                continue;
            }
            return Some((deadline, seq, object, key));
        }
    }

    /// Whether [`Timers::expired_where`] at `now_ns` would fire a timer or tidy the heap.
    pub fn may_fire(&self, now_ns: u64) -> bool {
        matches!(self.heap.peek(), Some(Reverse((deadline, ..))) if *deadline <= now_ns) || self.stale()
    }

    /// The heap is mostly entries of cancelled and re-armed timers.
    fn stale(&self) -> bool {
        self.heap.len() > 1024 && self.heap.len() > 4 * self.armed.len()
    }

    /// Cancelled and re-armed entries would otherwise pile up in the heap: when mostly stale,
    /// rebuilds it from the armed timers (a scan and a heapify, no lookups).
    fn compact_if_stale(&mut self) {
        if self.stale() {
            let mut v = std::mem::take(&mut self.heap).into_vec();
            v.clear();
            for (&(o, k), a) in self.armed.iter_mut() {
                a.queued = a.seq;
                v.push(Reverse((a.deadline, a.seq, o, k)));
            }
            self.heap = BinaryHeap::from(v);
        }
    }
}

/// Local-memory state of one NF instance: per declared object, a hash map of its keyed values
/// and, apart, its value under [`StateKey::Unit`] (a global object's only one: a counter
/// updated by every packet is read and written in place, with no hashing or probing); and
/// timers driven by packet time.
pub struct LocalState {
    objects: Vec<Object>,
    custom: Vec<CustomOp>,
    timers: Timers,
    /// Per object, its timers' slack ([`StateDecl::timer_slack_ns`]).
    timer_slack: Vec<u64>,
}

/// One declared object's values.
#[derive(Default)]
struct Object {
    unit: Option<Value>,
    keyed: Map<StateKey, Value>,
}

impl Object {
    fn len(&self) -> usize {
        self.keyed.len() + usize::from(self.unit.is_some())
    }

    fn get_mut(&mut self, key: &StateKey) -> Option<&mut Value> {
        match key {
            StateKey::Unit => self.unit.as_mut(),
            key => self.keyed.get_mut(key),
        }
    }
}

impl LocalState {
    /// Local state for an NF with these declarations and custom operations.
    pub fn new(decls: &[StateDecl], custom: &[CustomOp]) -> LocalState {
        LocalState {
            objects: decls.iter().map(|_| Object::default()).collect(),
            custom: custom.to_vec(),
            timers: Timers::default(),
            timer_slack: decls.iter().map(|d| d.timer_slack_ns).collect(),
        }
    }

    /// Number of values held in object `obj`.
    pub fn len(&self, obj: ObjectId) -> usize {
        self.objects.get(usize::from(obj.0)).map_or(0, Object::len)
    }

    /// Whether no object holds any value.
    pub fn is_empty(&self) -> bool {
        self.objects.iter().all(|m| m.len() == 0)
    }

    /// Number of armed timers.
    pub fn timers_armed(&self) -> usize {
        self.timers.len()
    }

    /// Every `(object, key, value)` held, sorted; for final-state comparison and debugging.
    pub fn snapshot(&self) -> Vec<(ObjectId, StateKey, Value)> {
        let mut v: Vec<_> = self
            .objects
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                let unit = m.unit.iter().map(|v| (StateKey::Unit, v));
                unit.chain(m.keyed.iter().map(|(k, v)| (*k, v))).map(move |(k, v)| (ObjectId(i as u16), k, v.clone()))
            })
            .collect();
        v.sort_by_key(|x| (x.0, x.1));
        v
    }
}

impl StateHandle for LocalState {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn exec(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let object = self.objects.get_mut(usize::from(obj.0)).ok_or(StateError::UnknownObject(obj))?;
        if let StateKey::Unit = key {
            return apply(&mut object.unit, op, &self.custom);
        }
        let map = &mut object.keyed;
        match op {
            StateOp::Get => Ok(map.get(key).cloned()),
            StateOp::Set(v) => {
                map.insert(*key, v);
                Ok(None)
            }
            StateOp::Delete => Ok(map.remove(key)),
            op => match map.get_mut(key) {
                Some(v) => {
                    let mut slot = Some(std::mem::replace(v, Value::Int(0)));
                    let r = apply(&mut slot, op, &self.custom);
                    match slot {
                        Some(nv) => *v = nv,
                        None => {
                            map.remove(key);
                        }
                    }
                    r
                }
                None => {
                    let mut slot = None;
                    let r = apply(&mut slot, op, &self.custom);
                    if let Some(nv) = slot {
                        map.insert(*key, nv);
                    }
                    r
                }
            },
        }
    }

    /// A counter's increment, the most frequent update (a NAT counts every packet twice), in
    /// place and without a result to make and drop; anything else as [`StateHandle::exec`].
    fn exec_nb(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<(), StateError> {
        if let StateOp::Incr(d) = op {
            let object = self.objects.get_mut(usize::from(obj.0)).ok_or(StateError::UnknownObject(obj))?;
            if let Some(Value::Int(i)) = object.get_mut(key) {
                *i = i.wrapping_add(d);
                return Ok(());
            }
        }
        self.exec(obj, key, op).map(|_| ())
    }

    fn set_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
        let slack = self.timer_slack.get(usize::from(obj.0)).copied().unwrap_or(0);
        self.timers.set_with_slack(obj, key, deadline_ns, slack);
    }

    fn may_fire(&self, now_ns: u64) -> bool {
        self.timers.may_fire(now_ns)
    }

    /// No clocks, tags or XOR vectors in local state: nothing to do around a packet.
    fn brackets_packets(&self) -> bool {
        false
    }

    fn cancel_timer(&mut self, obj: ObjectId, key: &StateKey) {
        self.timers.cancel(obj, key);
    }

    fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>) {
        self.timers.expired(now_ns, max, out);
    }

    fn expired_where(
        &mut self,
        now_ns: u64,
        max: usize,
        out: &mut Vec<TimerFired>,
        fire: &dyn Fn(ObjectId, &StateKey) -> bool,
    ) {
        self.timers.expired_where(now_ns, max, out, &mut Vec::new(), fire);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decl::{AccessPattern, Scope};

    #[test]
    fn timers_taken_come_in_firing_order_and_leave_the_rest_armed() {
        let mut t = Timers::default();
        let k = |i: u64| StateKey::Id(i);
        // Armed in the order 5, 1, 7, 3; 1 re-armed later to the same deadline as 5.
        t.set(ObjectId(0), &k(5), 300);
        t.set(ObjectId(0), &k(1), 100);
        t.set(ObjectId(1), &k(7), 200);
        t.set(ObjectId(0), &k(3), 50);
        t.set(ObjectId(0), &k(1), 300);
        let above_two = |key: &StateKey| matches!(key, StateKey::Id(i) if *i > 2);
        let taken = t.take_where(above_two);
        // By deadline (1, re-armed to 5's deadline, is not taken).
        assert_eq!(taken, vec![(ObjectId(0), k(3), 50), (ObjectId(1), k(7), 200), (ObjectId(0), k(5), 300)]);
        assert_eq!(t.len(), 1, "only 1 stays armed");
        assert!(t.is_armed(ObjectId(0), &k(1)));
        // The taken ones never fire here; the one left fires at its re-armed deadline.
        let mut fired = Vec::new();
        t.expired(1_000, 10, &mut fired);
        assert_eq!(fired.iter().map(|f| f.key).collect::<Vec<_>>(), vec![k(1)]);
        // Ties keep the order they were armed in.
        let mut t = Timers::default();
        for i in [9, 4, 6] {
            t.set(ObjectId(0), &k(i), 10);
        }
        let order: Vec<StateKey> = t.take_where(|_| true).into_iter().map(|(_, key, _)| key).collect();
        assert_eq!(order, vec![k(9), k(4), k(6)]);
    }

    #[test]
    fn a_rearm_within_the_slack_keeps_the_deadline_and_its_place() {
        let mut t = Timers::default();
        let (o, k) = (ObjectId(0), |i: u64| StateKey::Id(i));
        assert!(t.set_with_slack(o, &k(1), 100, 10), "arming is a change");
        assert!(!t.set_with_slack(o, &k(1), 109, 10), "later by less than the slack");
        assert!(!t.set_with_slack(o, &k(1), 100, 10), "the same deadline");
        assert_eq!(t.armed(), vec![(o, k(1), 100)]);
        assert!(t.set_with_slack(o, &k(1), 110, 10), "later by the slack");
        assert!(t.set_with_slack(o, &k(1), 60, 10), "earlier");
        assert_eq!(t.armed(), vec![(o, k(1), 60)]);
        // 2 armed after 1 at the same deadline; 1 re-armed within the slack stays first.
        assert!(t.set_with_slack(o, &k(2), 60, 10));
        assert!(!t.set_with_slack(o, &k(1), 65, 10));
        let mut fired = Vec::new();
        t.expired(60, 10, &mut fired);
        assert_eq!(fired.iter().map(|f| f.key).collect::<Vec<_>>(), vec![k(1), k(2)]);
    }

    #[test]
    fn local_state_keeps_an_idle_timer_within_its_objects_slack() {
        let decls = [
            StateDecl::new("idle", Scope::per_flow(), AccessPattern::ReadWriteOften).idle_timers(1_600),
            StateDecl::new("exact", Scope::per_flow(), AccessPattern::ReadWriteOften),
        ];
        let mut s = LocalState::new(&decls, &[]);
        let k = StateKey::Id(1);
        for (o, deadlines) in [(ObjectId(0), [1_000, 1_099]), (ObjectId(1), [1_000, 1_001])] {
            for d in deadlines {
                s.set_timer(o, &k, d);
            }
        }
        let mut fired = Vec::new();
        s.expired(1_000, 10, &mut fired);
        assert_eq!(fired.iter().map(|f| f.object).collect::<Vec<_>>(), vec![ObjectId(0)], "slack 100: kept at 1,000");
        fired.clear();
        s.expired(1_001, 10, &mut fired);
        assert_eq!(fired.iter().map(|f| f.object).collect::<Vec<_>>(), vec![ObjectId(1)], "no slack: moved to 1,001");
    }

    #[test]
    fn a_look_at_the_due_timers_sees_them_in_firing_order_and_fires_none() {
        let mut t = Timers::default();
        let k = |i: u64| StateKey::Id(i);
        t.set(ObjectId(0), &k(1), 300);
        t.set(ObjectId(0), &k(2), 100);
        t.set(ObjectId(0), &k(3), 100);
        t.set(ObjectId(0), &k(4), 900);
        // 1 re-armed earlier, 2 cancelled: the heap holds stale entries for both.
        t.set(ObjectId(0), &k(1), 50);
        t.cancel(ObjectId(0), &k(2));
        assert_eq!(t.due(500, 10), vec![(ObjectId(0), k(1)), (ObjectId(0), k(3))]);
        assert_eq!(t.due(500, 1), vec![(ObjectId(0), k(1))], "no more than asked for");
        assert!(t.due(49, 10).is_empty());
        let mut fired = Vec::new();
        t.expired(1_000, 10, &mut fired);
        assert_eq!(fired.iter().map(|f| f.key).collect::<Vec<_>>(), vec![k(1), k(3), k(4)], "all still armed");
    }

    fn state() -> LocalState {
        LocalState::new(
            &[
                StateDecl::new("a", Scope::global(), AccessPattern::WriteMostly),
                StateDecl::new("b", Scope::per_flow(), AccessPattern::ReadHeavy),
            ],
            &[],
        )
    }

    #[test]
    fn ops_and_unknown_object() {
        let mut s = state();
        let k = StateKey::Unit;
        assert_eq!(s.incr(ObjectId(0), &k, 3).ok(), Some(3));
        assert_eq!(s.incr(ObjectId(0), &k, 3).ok(), Some(6));
        // The unit value is kept apart from the keyed ones, and counted and listed with them.
        s.set(ObjectId(0), &StateKey::Id(1), Value::Int(1)).unwrap();
        assert_eq!(s.len(ObjectId(0)), 2);
        assert_eq!(
            s.snapshot(),
            vec![(ObjectId(0), StateKey::Unit, Value::Int(6)), (ObjectId(0), StateKey::Id(1), Value::Int(1))]
        );
        assert_eq!(s.delete(ObjectId(0), &k).ok(), Some(Some(Value::Int(6))));
        assert_eq!(s.get(ObjectId(0), &k).ok(), Some(None));
        assert_eq!(s.delete(ObjectId(0), &StateKey::Id(1)).ok(), Some(Some(Value::Int(1))));
        assert!(s.is_empty());
        assert!(s.get(ObjectId(2), &k).is_err());
        s.set(ObjectId(1), &StateKey::Id(4), Value::Int(9)).ok();
        assert_eq!(s.len(ObjectId(1)), 1);
        assert_eq!(s.delete(ObjectId(1), &StateKey::Id(4)).ok(), Some(Some(Value::Int(9))));
        assert_eq!(s.len(ObjectId(1)), 0);
    }

    #[test]
    fn non_blocking_increments_do_what_increments_do() {
        let mut s = state();
        let (o, k) = (ObjectId(1), StateKey::Id(1));
        s.incr_nb(o, &k, 5).unwrap();
        s.incr_nb(o, &k, -2).unwrap();
        assert_eq!(s.get(o, &k).ok(), Some(Some(Value::Int(3))));
        s.set(o, &k, Value::Int(i64::MAX)).unwrap();
        s.incr_nb(o, &k, 1).unwrap();
        assert_eq!(s.get(o, &k).ok(), Some(Some(Value::Int(i64::MIN))), "wraps as `incr` does");
        s.set(o, &k, Value::Float(0.5)).unwrap();
        s.incr_nb(o, &k, 1).unwrap();
        assert_eq!(s.get(o, &k).ok(), Some(Some(Value::Float(1.5))));
        s.set(o, &k, Value::Ints(vec![1])).unwrap();
        assert!(matches!(s.incr_nb(o, &k, 1), Err(StateError::WrongType { .. })));
        assert!(matches!(s.incr_nb(ObjectId(9), &k, 1), Err(StateError::UnknownObject(_))));
    }

    #[test]
    fn timers_fire_once_in_order_and_rearm() {
        let mut s = state();
        let o = ObjectId(1);
        s.set_timer(o, &StateKey::Id(1), 100);
        s.set_timer(o, &StateKey::Id(2), 50);
        s.set_timer(o, &StateKey::Id(3), 70);
        s.cancel_timer(o, &StateKey::Id(3));
        s.set_timer(o, &StateKey::Id(1), 200); // re-armed later
        let mut out = Vec::new();
        s.expired(150, 10, &mut out);
        assert_eq!(out, vec![TimerFired { object: o, key: StateKey::Id(2) }]);
        out.clear();
        s.expired(250, 10, &mut out);
        assert_eq!(out, vec![TimerFired { object: o, key: StateKey::Id(1) }]);
        out.clear();
        s.expired(1000, 10, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.timers_armed(), 0);
    }
}
