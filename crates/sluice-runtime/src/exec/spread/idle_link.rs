//! A link with nothing to do: how it waits, and what ends the wait early.

use super::{Link, IDLE_WAIT};
use crate::exec::idle::Idle;
use crate::exec::Shared;

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
}
