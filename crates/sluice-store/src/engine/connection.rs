//! An instance's connection to the embedded store: its batches go to every shard, their
//! answers come back on the instance's own queues.

use super::*;

pub(super) struct EmbeddedConnection {
    pub(super) inner: Arc<Inner>,
    pub(super) queues: Arc<ClientQueues>,
    /// Shard acknowledgements still missing, by batch.
    pub(super) parts: Map<u64, usize>,
    /// A waker is set ([`Connection::set_waker`]): the caller parks rather than waits here.
    pub(super) waker_set: bool,
    /// Batches without a call may wait for a napping shard ([`Connection::allow_lazy_batches`]).
    pub(super) lazy: bool,
}

impl Connection for EmbeddedConnection {
    fn send(&mut self, number: u64, batch: Arc<[Request]>) -> Result<(), StoreError> {
        if self.inner.stop.load(Ordering::Acquire) {
            return Err(StoreError::Unavailable("store stopped".into()));
        }
        let n = self.inner.shards.len();
        self.parts.insert(number, n);
        // A batch nobody will wait for may wait for a napping shard: not a call's answer, nor
        // any batch of a client that did not say so (with the root's log, packets stay logged
        // until their updates are acknowledged: a paced chain's window waited), nor one of a
        // caller that parks instead of waiting here (a store server).
        let urgent = !self.lazy || self.waker_set || batch.iter().any(|r| r.reply);
        let post = |inner: &Inner| {
            for s in 0..n {
                inner.post_to(s, Msg::Batch(batch.clone(), number, self.queues.clone()), urgent);
            }
        };
        let Some(epoch) = self.queues.epoch else {
            post(&self.inner);
            return Ok(());
        };
        // An instance's batch goes out whole or not at all: a fence waits for this lock.
        let fenced = self.queues.fenced.lock().map_err(|_| StoreError::Unavailable("connection poisoned".into()))?;
        if let Some(lowest) = *fenced {
            self.parts.remove(&number);
            return Err(StoreError::fenced(self.queues.id, epoch, lowest));
        }
        post(&self.inner);
        drop(fenced);
        Ok(())
    }

    fn poll(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        while let Some(r) = self.queues.replies.pop() {
            match r {
                Reply::Response(resp) => out.responses.push(resp),
                Reply::Ack(b) => {
                    if let Some(left) = self.parts.get_mut(&b) {
                        *left -= 1;
                        if *left == 0 {
                            self.parts.remove(&b);
                            out.acked.push(b);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn wait(&mut self, out: &mut Replies, timeout: Duration) -> Result<(), StoreError> {
        let start = out.responses.len() + out.acked.len();
        self.poll(out)?;
        if out.responses.len() + out.acked.len() > start {
            return Ok(());
        }
        self.inner.hurry();
        let deadline = Instant::now() + timeout;
        if let Ok(mut w) = self.queues.waiter.lock() {
            *w = Some(std::thread::current());
        }
        self.queues.waiting.store(true, Ordering::Release);
        let spin_until = Instant::now() + Duration::from_micros(50);
        loop {
            self.poll(out)?;
            if out.responses.len() + out.acked.len() > start {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // A round trip to a busy shard takes microseconds: poll first, sleep only if not.
            if now < spin_until {
                std::thread::yield_now();
            } else {
                std::thread::park_timeout((deadline - now).min(Duration::from_micros(200)));
            }
        }
        self.queues.waiting.store(false, Ordering::Release);
        Ok(())
    }

    fn allow_lazy_batches(&mut self, lazy: bool) {
        self.lazy = lazy;
    }

    fn set_waker(&mut self, thread: std::thread::Thread) -> bool {
        if let Ok(mut w) = self.queues.waiter.lock() {
            *w = Some(thread);
            self.queues.waiting.store(true, Ordering::Release);
            self.waker_set = true;
            return true;
        }
        false
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError> {
        while let Some(n) = self.queues.notifications.pop() {
            out.push(n);
        }
        Ok(())
    }
}
