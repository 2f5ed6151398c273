//! A client's exchanges with its connection: sending what is pending, waiting for
//! acknowledgements and answers (as long as the connection's patience), taking in what has
//! arrived, and retransmitting what is overdue.

use super::{backend, StoreClient, XOR_SPARES};
use crate::wire::{Notification, OpTag, Request, Response, StoreKey, StoreOp};
use sluice_state::StateError;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl StoreClient {
    pub(super) fn send_pending(&mut self) -> Result<(), StateError> {
        self.emit_increments(None);
        if self.pending.is_empty() {
            return Ok(());
        }
        self.stats.requests += self.pending.len() as u64;
        // Moved into one allocation; `pending` keeps its buffer for the next batch.
        let batch: Arc<[Request]> = self.pending.drain(..).collect();
        let b = self.next_batch;
        self.next_batch += 1;
        self.conn.send(b, batch.clone()).map_err(backend)?;
        self.inflight.push_back((b, batch, Instant::now()));
        if self.inflight.len() > self.cfg.max_inflight {
            self.wait_for_acks(self.cfg.max_inflight / 2)?;
        }
        Ok(())
    }

    /// How long to wait for the store: the configured timeout, or longer if the connection
    /// may legitimately take longer ([`Connection::patience`]).
    pub(super) fn patience(&self) -> Duration {
        self.cfg.call_timeout.max(self.conn.patience())
    }

    /// Waits until at most `left` batches are unacknowledged. Fails only if the store makes
    /// no progress for the client's patience (`call_timeout`, or the connection's own when
    /// longer).
    pub(super) fn wait_for_acks(&mut self, left: usize) -> Result<(), StateError> {
        let mut last_progress = Instant::now();
        let patience = self.patience();
        while self.inflight.len() > left {
            let before = self.inflight.len();
            self.absorb()?;
            if self.inflight.len() <= left {
                break;
            }
            if self.inflight.len() < before {
                last_progress = Instant::now();
            }
            let idle = last_progress.elapsed();
            if idle >= patience {
                return Err(StateError::Backend(format!(
                    "{} request(s) unacknowledged; the store made no progress for {:?}",
                    self.unacknowledged(),
                    patience
                )));
            }
            let wait = (patience - idle).min(self.cfg.retransmit_after);
            self.conn.wait(&mut self.replies, wait).map_err(backend)?;
            self.settle_responses();
        }
        Ok(())
    }

    /// Queues a non-blocking request; it is sent with the batch and retransmitted until acked.
    pub(super) fn queue_nb(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) {
        // Increments of this value collected so far go first. Most requests queued here are
        // of other objects (a flow's value written through): a look, not a rebuild of the lists.
        let counted = |k: &StoreKey| k.object == key.object && *k == key;
        if self.sums.iter().any(|(k, _)| counted(k)) || self.increments.iter().any(|(k, _)| counted(k)) {
            self.emit_increments(Some(&key));
        }
        let r = self.request(key, op, tag, false);
        self.pending.push(r);
    }

    /// Sends `op` (after everything queued) and waits for its answer.
    pub(super) fn call(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<Response, StateError> {
        self.emit_increments(None);
        let r = self.request(key, op, tag, true);
        self.call = Some((r.id, None));
        self.pending.push(r);
        let answer = self.send_pending().and_then(|()| self.await_answer());
        self.call = None;
        if answer.is_err() {
            self.stats.failed_calls += 1;
        }
        answer
    }

    /// Waits for the answer to the call in progress.
    pub(super) fn await_answer(&mut self) -> Result<Response, StateError> {
        self.stats.round_trips += 1;
        let patience = self.patience();
        let deadline = Instant::now() + patience;
        loop {
            self.settle_responses();
            if let Some(resp) = self.call.as_mut().and_then(|(_, a)| a.take()) {
                if resp.replayed {
                    self.stats.duplicates += 1;
                }
                return Ok(resp);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StateError::Backend(format!("no answer within {patience:?}")));
            }
            self.conn.wait(&mut self.replies, deadline - now).map_err(backend)?;
        }
    }

    /// Consumes the received responses: acknowledgements of non-blocking requests are settled,
    /// the answer to the blocking call in progress is kept for it, the rest (answers to
    /// fire-and-forget requests) are dropped.
    pub(super) fn settle_responses(&mut self) {
        for r in self.replies.responses.drain(..) {
            match &mut self.call {
                Some((id, answer)) if *id == r.id => *answer = Some(r),
                // Only failures of requests nobody waits for arrive here.
                _ if r.result.is_err() => self.stats.async_errors += 1,
                _ => {}
            }
        }
        let acked = !self.replies.acked.is_empty();
        for b in self.replies.acked.drain(..) {
            if let Some(pos) = self.inflight.iter().position(|(x, _, _)| *x == b) {
                self.inflight.remove(pos);
            }
        }
        if acked {
            // A store applies a connection's batches in order, so everything sent before the
            // oldest unacknowledged batch is applied.
            let floor = self.inflight.front().map_or(u64::MAX, |(b, _, _)| *b);
            while self.uncommitted.front().is_some_and(|(b, _)| *b < floor) {
                if let Some((_, mut v)) = self.uncommitted.pop_front() {
                    self.committed.append(&mut v);
                    if self.xor_spares.len() < XOR_SPARES {
                        self.xor_spares.push(v);
                    }
                }
            }
        }
    }

    pub(super) fn absorb(&mut self) -> Result<(), StateError> {
        self.absorb_at(Instant::now())
    }

    /// [`StoreClient::absorb`] at `now` (a batch's start reads the clock once for both).
    pub(super) fn absorb_at(&mut self, now: Instant) -> Result<(), StateError> {
        self.conn.poll(&mut self.replies).map_err(backend)?;
        self.settle_responses();
        self.conn.notifications(&mut self.notes).map_err(backend)?;
        for n in std::mem::take(&mut self.notes) {
            if let Notification::Changed { key, value } = n {
                self.stats.callbacks += 1;
                if let Some(c) = self.caches.get_mut(usize::from(key.object)) {
                    if let Some(e) = c.get_mut(&key.key) {
                        e.value = value;
                    }
                }
            }
            // Timer notifications concern timers this client also fires itself at the right
            // packet; handovers are acted on by the flow-move protocol.
        }
        // Retransmit what has not been acknowledged in time (applied once, by tag). Checked a
        // few times per timeout, not per batch.
        if self.inflight.is_empty() || now.duration_since(self.last_resend_check) < self.cfg.retransmit_after / 4 {
            return Ok(());
        }
        self.last_resend_check = now;
        for (b, batch, sent) in self.inflight.iter_mut() {
            if now.duration_since(*sent) < self.cfg.retransmit_after {
                continue;
            }
            *sent = now;
            self.stats.retransmits += batch.len() as u64;
            self.stats.requests += batch.len() as u64;
            self.conn.send(*b, batch.clone()).map_err(backend)?;
        }
        Ok(())
    }

    /// Waits until every request sent has been acknowledged.
    pub(super) fn drain_acks(&mut self) -> Result<(), StateError> {
        self.send_pending()?;
        self.wait_for_acks(0)
    }
}
