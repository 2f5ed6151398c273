//! Waking a worker that sleeps for want of work when a batch is queued for one of its
//! instances. A worker idle for a while waits long at a time (`idle.rs`) to leave the CPU to
//! others; whoever queues a batch for it (the root, another worker, a node's link) unparks
//! it, so that the packet does not wait for the sleep to end. The wait has a timeout all the
//! same: a worker has other things to look at (a crash asked, a replay drained, timers handed
//! over), and a wake-up missed for any reason costs no more than the timeout.
//!
//! A node's link thread (a chain spread over nodes) waits in `ppoll` on its socket, where an
//! unpark cannot reach it: it waits on a [`Doorbell`] beside the socket, rung when a batch is
//! queued for an instance on another node, for the egress (a node without the root), or notes
//! for the root's log go out (docs/decisions.md, "The link is rung").

use sluice_netif::Doorbell;
use std::os::fd::{AsRawFd, RawFd};

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

/// Who to wake for which queue.
pub(super) struct Wake {
    /// Per queue (an instance's global index): the worker that serves it (`usize::MAX`: none).
    owner: Vec<AtomicUsize>,
    /// Per worker: whether it sleeps (or is about to).
    sleeping: Vec<AtomicBool>,
    /// Per worker: its thread, once it runs.
    threads: Vec<OnceLock<Thread>>,
    /// Per queue (the sink's last): the node's link drains it (an instance on another node;
    /// the egress on a node without the root), so a batch queued there rings the link.
    to_link: Vec<AtomicBool>,
    /// Notes for the root's log leave by the link (a node without the root).
    notes_to_link: AtomicBool,
    /// Whether the link waits (or is about to), and its doorbell once it has one.
    link_sleeping: AtomicBool,
    link_bell: OnceLock<Doorbell>,
}

impl Wake {
    /// For `queues` instance queues and `workers` worker threads.
    pub(super) fn new(queues: usize, workers: usize) -> Wake {
        Wake {
            owner: (0..queues).map(|_| AtomicUsize::new(usize::MAX)).collect(),
            sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
            threads: (0..workers).map(|_| OnceLock::new()).collect(),
            to_link: (0..=queues).map(|_| AtomicBool::new(false)).collect(),
            notes_to_link: AtomicBool::new(false),
            link_sleeping: AtomicBool::new(false),
            link_bell: OnceLock::new(),
        }
    }

    /// The node's link waits on `bell` from now on; it drains the queues `queues` (the sink's
    /// index for the egress) and, with `notes`, takes the notes for the root's log.
    pub(super) fn link(&self, bell: Doorbell, queues: &[usize], notes: bool) {
        let _ = self.link_bell.set(bell);
        for q in queues {
            self.link_drains(*q, true);
        }
        self.notes_to_link.store(notes, Ordering::Release);
    }

    /// Whether the node's link drains queue `q` (an instance failed over to this node stops
    /// being the link's).
    pub(super) fn link_drains(&self, q: usize, drains: bool) {
        if let Some(t) = self.to_link.get(q) {
            t.store(drains, Ordering::Release);
        }
    }

    /// Notes for the roots' logs were queued.
    pub(super) fn notes_queued(&self) {
        if self.notes_to_link.load(Ordering::Relaxed) {
            self.ring_link();
        }
    }

    fn ring_link(&self) {
        // Pairs with the fence in `link_sleep`, as for the workers.
        fence(Ordering::SeqCst);
        if self.link_sleeping.load(Ordering::Relaxed) {
            if let Some(b) = self.link_bell.get() {
                b.ring();
            }
        }
    }

    /// The link waits for a datagram on `socket` or a ring, at most `timeout`, unless
    /// `has_work` (asked after it said it waits) finds something queued for it already.
    pub(super) fn link_sleep(&self, socket: RawFd, timeout: Duration, has_work: impl FnOnce() -> bool) {
        self.link_sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // An error here shows again at the link's next receive, with its context.
        let woken = !has_work()
            && match self.link_bell.get() {
                Some(b) => sluice_netif::wait_readable(&[socket, b.as_raw_fd()], timeout),
                None => sluice_netif::wait_readable(&[socket], timeout),
            }
            .unwrap_or(false);
        self.link_sleeping.store(false, Ordering::Relaxed);
        if let (true, Some(b)) = (woken, self.link_bell.get()) {
            // A ring that came after the wait ended stays for the next wait, which then ends
            // at once: the link looks at its queues once more, no ring is lost.
            b.answer();
        }
    }

    /// The calling thread is worker `worker`.
    pub(super) fn register(&self, worker: usize) {
        if let Some(t) = self.threads.get(worker) {
            let _ = t.set(std::thread::current());
        }
    }

    /// Worker `worker` serves instance `global` from now on.
    pub(super) fn serves(&self, worker: usize, global: usize) {
        if let Some(o) = self.owner.get(global) {
            o.store(worker, Ordering::Release);
        }
    }

    /// A batch was just queued for instance `dest` (or the sink, past the last): wakes its
    /// worker if it sleeps, or the link if the link drains it.
    pub(super) fn queued(&self, dest: usize) {
        if self.to_link.get(dest).is_some_and(|t| t.load(Ordering::Relaxed)) {
            self.ring_link();
            return;
        }
        let Some(w) = self.owner.get(dest).map(|o| o.load(Ordering::Acquire)) else { return };
        // Pairs with the fence in `sleep`: either this sees the worker asleep, or the worker
        // sees the batch before it sleeps.
        fence(Ordering::SeqCst);
        if self.sleeping.get(w).is_some_and(|s| s.load(Ordering::Relaxed)) {
            if let Some(t) = self.threads.get(w).and_then(OnceLock::get) {
                t.unpark();
            }
        }
    }

    /// Worker `worker` sleeps up to `timeout`, unless `has_work` (asked after it said it
    /// sleeps) finds a batch queued for it already.
    pub(super) fn sleep(&self, worker: usize, timeout: Duration, has_work: impl FnOnce() -> bool) {
        let Some(s) = self.sleeping.get(worker) else {
            std::thread::sleep(timeout);
            return;
        };
        s.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !has_work() {
            std::thread::park_timeout(timeout);
        }
        s.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_sleeping_worker_is_woken_by_a_batch_for_its_instance_and_not_by_others() {
        let wake = Arc::new(Wake::new(3, 1));
        wake.serves(0, 2);
        let (tx, rx) = std::sync::mpsc::channel();
        let w = wake.clone();
        let sleeper = std::thread::spawn(move || {
            w.register(0);
            let _ = tx.send(());
            let t0 = Instant::now();
            w.sleep(0, Duration::from_secs(30), || false);
            t0.elapsed()
        });
        let _ = rx.recv();
        // A batch for an instance the worker does not serve: nothing to wake.
        wake.queued(1);
        // Until the worker says it sleeps, a wake-up may come before it parks; unpark's token
        // makes the park return at once then, which is what must happen.
        while !wake.sleeping[0].load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        wake.queued(2);
        let slept = sleeper.join().expect("sleeper");
        assert!(slept < Duration::from_secs(30), "woken, not timed out: {slept:?}");
    }

    #[test]
    fn a_waiting_link_is_rung_by_what_it_drains_and_by_notes_only_when_it_takes_them() {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("socket");
        let wake = Arc::new(Wake::new(3, 1));
        // The link drains instance 1's queue and the sink (index 3), and takes the notes.
        wake.link(Doorbell::new().expect("eventfd"), &[1, 3], true);
        let long = Duration::from_secs(30);
        let woken_by = |limit: Duration, ring: &dyn Fn(&Wake)| {
            let (w, fd) = (wake.clone(), socket.as_raw_fd());
            let sleeper = std::thread::spawn(move || {
                let t0 = Instant::now();
                w.link_sleep(fd, limit, || false);
                t0.elapsed()
            });
            while !wake.link_sleeping.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            ring(&wake);
            sleeper.join().expect("sleeper")
        };
        assert!(woken_by(long, &|w| w.queued(1)) < long, "a batch for an instance elsewhere");
        assert!(woken_by(long, &|w| w.queued(3)) < long, "output for the egress");
        assert!(woken_by(long, &|w| w.notes_queued()) < long, "notes for the root's log");
        // Instance 1 failed over to this node: its queue is a worker's now, the link is not
        // rung for it (the sleeper waits its timeout out), nor for instance 0's.
        wake.link_drains(1, false);
        let short = Duration::from_millis(100);
        assert!(woken_by(short, &|w| w.queued(1)) >= short - Duration::from_millis(1));
        assert!(woken_by(short, &|w| w.queued(0)) >= short - Duration::from_millis(1));
        // Something queued before the link says it waits keeps it awake.
        let t0 = Instant::now();
        wake.link_sleep(socket.as_raw_fd(), long, || true);
        assert!(t0.elapsed() < long);
    }

    #[test]
    fn work_found_after_saying_it_sleeps_keeps_it_awake() {
        let wake = Wake::new(1, 1);
        let t0 = Instant::now();
        wake.sleep(0, Duration::from_secs(30), || true);
        assert!(t0.elapsed() < Duration::from_secs(30));
        assert!(!wake.sleeping[0].load(Ordering::Relaxed));
    }
}
