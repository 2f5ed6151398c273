//! `Timers` fires exactly what, and in exactly the order, a plain model does: every armed
//! timer whose deadline has passed, by deadline and then by when it was last armed — whatever
//! mix of re-arming later (kept lazily in the heap), re-arming earlier, cancelling and
//! expiring came before.

use proptest::prelude::*;
use sluice_state::{ObjectId, StateKey, TimerFired, Timers};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Step {
    Set { key: u8, deadline: u16 },
    Cancel { key: u8 },
    Expire { now: u16, max: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..12, 0u16..400).prop_map(|(key, deadline)| Step::Set { key, deadline }),
        1 => (0u8..12).prop_map(|key| Step::Cancel { key }),
        2 => (0u16..400, 1u8..6).prop_map(|(now, max)| Step::Expire { now, max }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn timers_fire_like_the_model(steps in prop::collection::vec(step(), 1..120)) {
        let mut timers = Timers::default();
        // key -> (sequence of its last arming, deadline)
        let mut model: BTreeMap<u8, (u64, u64)> = BTreeMap::new();
        let mut seq = 0u64;
        let obj = ObjectId(1);
        for s in steps {
            match s {
                Step::Set { key, deadline } => {
                    seq += 1;
                    model.insert(key, (seq, u64::from(deadline)));
                    timers.set(obj, &StateKey::Id(u64::from(key)), u64::from(deadline));
                }
                Step::Cancel { key } => {
                    let was = model.remove(&key).is_some();
                    prop_assert_eq!(timers.cancel(obj, &StateKey::Id(u64::from(key))), was);
                }
                Step::Expire { now, max } => {
                    let mut due: Vec<(u64, u64, u8)> = model
                        .iter()
                        .filter(|(_, (_, d))| *d <= u64::from(now))
                        .map(|(k, (s, d))| (*d, *s, *k))
                        .collect();
                    due.sort_unstable();
                    due.truncate(usize::from(max));
                    for (_, _, k) in &due {
                        model.remove(k);
                    }
                    let (mut out, mut deadlines) = (Vec::new(), Vec::new());
                    timers.expired_at(u64::from(now), usize::from(max), &mut out, &mut deadlines);
                    let want: Vec<TimerFired> =
                        due.iter().map(|(_, _, k)| TimerFired { object: obj, key: StateKey::Id(u64::from(*k)) }).collect();
                    prop_assert_eq!(out, want);
                    prop_assert_eq!(deadlines, due.iter().map(|(d, _, _)| *d).collect::<Vec<_>>());
                }
            }
            prop_assert_eq!(timers.len(), model.len());
        }
        let armed: Vec<(u64, u8)> = timers.armed().into_iter().map(|(_, k, d)| match k {
            StateKey::Id(k) => (d, k as u8),
            _ => (u64::MAX, 0),
        }).collect();
        let mut want: Vec<(u64, u8)> = model.iter().map(|(k, (_, d))| (*d, *k)).collect();
        want.sort_unstable();
        prop_assert_eq!(armed, want);
    }
}
