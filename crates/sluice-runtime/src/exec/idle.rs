//! A thread with nothing to do: it waits a little at a time while work may come back at once,
//! and longer once it has been idle a while. Why: the threads of a run poll (a packet must not
//! wait for a wake-up), and every short wait is a wake-up that costs CPU. Several idle node
//! processes on two shared cores (the tests', or a small machine's) spent most of the CPU
//! waking up — a quiet spread node took 40 % of a core (its link 25 %, its worker 15 %; 14 %
//! with the longer wait, debug build) — and the threads with work then waited for a core long
//! enough for other nodes to take their node for failed and for every store round trip to take
//! milliseconds. The cost: what comes after an idle stretch of [`LONG_AFTER`] or more may wait
//! up to [`LONG_WAIT`] more — at a link; a sleeping worker is woken when a batch is queued for
//! it (`wake.rs`) (docs/decisions.md, "Idle threads wait longer").

use std::time::{Duration, Instant};

/// Idle this long, a thread waits [`LONG_WAIT`] at a time.
const LONG_AFTER: Duration = Duration::from_millis(2);

/// How long an idle thread waits at a time once idle for [`LONG_AFTER`].
const LONG_WAIT: Duration = Duration::from_micros(500);

/// How long a thread has had nothing to do.
#[derive(Debug, Default)]
pub(super) struct Idle {
    turns: u32,
    since: Option<Instant>,
}

impl Idle {
    /// The thread did something.
    pub(super) fn busy(&mut self) {
        self.turns = 0;
        self.since = None;
    }

    /// One more turn with nothing to do: how many in a row so far.
    pub(super) fn turn(&mut self) -> u32 {
        self.turns = self.turns.saturating_add(1);
        self.turns
    }

    /// How long to wait now: `short` until the thread has been idle for [`LONG_AFTER`], then
    /// [`LONG_WAIT`].
    pub(super) fn wait(&mut self, short: Duration) -> Duration {
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= LONG_AFTER {
            LONG_WAIT.max(short)
        } else {
            short
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_short_at_first_longer_once_idle_a_while_and_short_again_after_work() {
        let short = Duration::from_micros(20);
        let mut idle = Idle::default();
        assert_eq!((idle.turn(), idle.turn()), (1, 2));
        assert_eq!(idle.wait(short), short);
        std::thread::sleep(LONG_AFTER);
        assert_eq!(idle.wait(short), LONG_WAIT);
        idle.busy();
        assert_eq!(idle.turn(), 1);
        assert_eq!(idle.wait(short), short, "the idle stretch starts again");
    }
}
