//! Waking a worker that sleeps for want of work when a batch is queued for one of its
//! instances. A worker idle for a while waits long at a time (`idle.rs`) to leave the CPU to
//! others; whoever queues a batch for it (the root, another worker, a node's link) unparks
//! it, so that the packet does not wait for the sleep to end. The wait has a timeout all the
//! same: a worker has other things to look at (a crash asked, a replay drained, timers handed
//! over), and a wake-up missed for any reason costs no more than the timeout.

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
}

impl Wake {
    /// For `queues` instance queues and `workers` worker threads.
    pub(super) fn new(queues: usize, workers: usize) -> Wake {
        Wake {
            owner: (0..queues).map(|_| AtomicUsize::new(usize::MAX)).collect(),
            sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
            threads: (0..workers).map(|_| OnceLock::new()).collect(),
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

    /// A batch was just queued for instance `dest`: wakes its worker if it sleeps.
    pub(super) fn queued(&self, dest: usize) {
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
    fn work_found_after_saying_it_sleeps_keeps_it_awake() {
        let wake = Wake::new(1, 1);
        let t0 = Instant::now();
        wake.sleep(0, Duration::from_secs(30), || true);
        assert!(t0.elapsed() < Duration::from_secs(30));
        assert!(!wake.sleeping[0].load(Ordering::Relaxed));
    }
}
