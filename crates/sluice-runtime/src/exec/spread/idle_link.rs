//! A link with nothing to do: how it waits, and what ends the wait early.

use super::{Link, IDLE_WAIT};
use crate::exec::idle::Idle;
use crate::exec::Shared;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// On a node without the root: notices when no packet has crossed its links for a while in a
/// run that has started, and then says what the node holds (a run that never ends is a bug;
/// the root's node says what it waits for, this is the other half).
#[derive(Debug, Default)]
pub(super) struct Quiet {
    moved: u64,
    since: Option<Instant>,
}

impl Link {
    /// Nothing to do: spins a little, then waits for a datagram or a ring of its doorbell
    /// (something queued for it, `exec/wake.rs`), at most [`IDLE_WAIT`] (longer once the link
    /// has been idle a while, `idle.rs`): it has timed duties too. No yielding: with more
    /// threads than cores, threads that yield stay runnable and a woken one waits for its
    /// slice (milliseconds of latency per crossing, measured).
    pub(super) fn pause(&self, shared: &Shared, idle: &mut Idle) {
        if idle.turn() < 32 {
            std::hint::spin_loop();
        } else {
            use std::os::fd::AsRawFd;
            shared.wake.link_sleep(self.socket.as_raw_fd(), idle.wait(IDLE_WAIT), || self.has_work(shared));
        }
    }

    /// Whether something waits to go out by this link: a batch for an instance elsewhere,
    /// and on a node without the root output for the egress or notes for the root's log.
    fn has_work(&self, shared: &Shared) -> bool {
        let queued = |q: Option<&crossbeam_queue::ArrayQueue<_>>| q.is_some_and(|q| !q.is_empty());
        self.remote.iter().any(|g| queued(shared.queue(*g)))
            || (!self.layout.has_root()
                && (!shared.sink.is_empty() || shared.notes.iter().flatten().any(|q| !q.is_empty())))
    }

    /// Checks whether packets moved since the last call; after [`crate::exec::waiting::NOTICE_AFTER`]
    /// without any (once some have), says what the link and the node's instances hold.
    pub(super) fn notice_quiet(&self, shared: &Shared, quiet: &mut Quiet) {
        let r = &self.report;
        let moved = r.packets_sent + r.packets_received;
        if moved != quiet.moved || moved == 0 {
            *quiet = Quiet { moved, since: None };
            return;
        }
        let since = *quiet.since.get_or_insert_with(Instant::now);
        if since.elapsed() < crate::exec::waiting::NOTICE_AFTER {
            return;
        }
        quiet.since = Some(Instant::now());
        shared.describe_asked.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            node = %self.name(self.layout.me),
            packets_sent = r.packets_sent,
            packets_received = r.packets_received,
            notes_sent = r.notes_sent,
            notes_received = r.notes_received,
            lost = r.lost,
            root_says = %shared.from_root.as_ref().map(crate::order::FromRoot::describe).unwrap_or_default(),
            "no packet crossed this node's links for a while; what it holds"
        );
    }
}
