//! Judging another node's silence: how long it has not been heard from, counted over the time
//! this node's link was running (docs/decisions.md, "Silence is counted over the time a node
//! itself was listening").

use super::Link;
use std::time::{Duration, Instant};

/// Of a gap between two looks of a link at the clock (an idle link looks every 50 µs, every
/// 500 µs once idle for 2 ms), what goes past this much is time it was not running, not
/// counted towards other nodes' silence ([`Link::absence`]).
const ABSENT_AFTER: Duration = Duration::from_millis(20);

impl Link {
    /// Whether node `n`, one this node talks to and has heard from, has been silent past the
    /// limit (and is not declared failed yet).
    pub(super) fn silent(&self, n: usize) -> bool {
        let live = self.talks_to(n) && !self.dead.get(n).copied().unwrap_or(true);
        let heard = self.heard.get(n).copied().unwrap_or(true);
        live && heard && self.last_heard.get(n).is_some_and(|t| t.elapsed() >= self.layout.silence)
    }

    /// Time this link was not running does not count towards another node's silence, nor
    /// towards a gap in its datagrams: when the whole machine stalls (a virtual machine paused
    /// by its host, a container throttled), every node stops together, and the first to run
    /// again would otherwise declare the others failed before they had a chance to speak (seen
    /// under load: a node declared the root's node silent within the first second of a run,
    /// no turn on either side slow). Of a gap since the link last looked longer than
    /// [`ABSENT_AFTER`], the excess moves every node's last-heard time forward; silence is
    /// judged over the time this node was listening.
    pub(super) fn absence(&mut self) {
        let now = Instant::now();
        let gap = now.saturating_duration_since(std::mem::replace(&mut self.looked, now));
        // What a busy machine's scheduler takes anyway still counts: a link kept waiting
        // 25 ms at every turn judges silence a little slower, not never.
        let Some(excused) = gap.checked_sub(ABSENT_AFTER).filter(|e| !e.is_zero()) else { return };
        for t in &mut self.last_heard {
            *t = (*t + excused).min(now);
        }
        for r in &mut self.received {
            r.excuse(excused, now);
        }
        if gap >= self.layout.silence / 2 {
            tracing::warn!(
                away_ms = gap.as_millis() as u64,
                silence_ms = self.layout.silence.as_millis() as u64,
                "this node's link did not run for a while (a busy or paused machine): other nodes may take this node for failed"
            );
        }
    }
}
