//! [`Raw`]: one instance's raw connection, as the checks drive it.

use super::support::note_key;
use super::TIMEOUT;
use crate::backend::{Backend, Connection};
use crate::wire::{Notification, OpTag, Replies, Request, Response, StoreKey, StoreOp};
use sluice_packet::InstanceId;
use sluice_state::{StateOp, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One instance's raw connection, with the bookkeeping to wait for answers, acks and
/// notifications.
pub(super) struct Raw {
    conn: Box<dyn Connection>,
    client: InstanceId,
    next_id: u64,
    next_batch: u64,
    replies: Replies,
    /// The notifications received so far, in arrival order (checks clear or inspect them).
    pub(super) notes: Vec<Notification>,
}

impl Raw {
    pub(super) fn open(b: &dyn Backend, client: InstanceId) -> Result<Raw, String> {
        let conn = b.connect(client).map_err(|e| format!("connect({client:?}): {e}"))?;
        Ok(Raw::of(conn, client))
    }

    /// The connection of instance `client` in `epoch` (fenced once its epoch is passed).
    pub(super) fn open_at(b: &dyn Backend, client: InstanceId, epoch: u32) -> Result<Raw, String> {
        let conn = b.connect_at(client, epoch).map_err(|e| format!("connect_at({client:?}, {epoch}): {e}"))?;
        Ok(Raw::of(conn, client))
    }

    fn of(conn: Box<dyn Connection>, client: InstanceId) -> Raw {
        Raw { conn, client, next_id: 1, next_batch: 1, replies: Replies::default(), notes: Vec::new() }
    }

    fn who(&self) -> String {
        format!("instance {}.{}", self.client.vertex(), self.client.index())
    }

    pub(super) fn req(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>, reply: bool) -> Request {
        let id = self.next_id;
        self.next_id += 1;
        Request { id, client: self.client, tag, key, op, reply }
    }

    pub(super) fn send(&mut self, reqs: Vec<Request>) -> Result<u64, String> {
        self.send_arc(reqs.into())
    }

    pub(super) fn send_arc(&mut self, reqs: Arc<[Request]>) -> Result<u64, String> {
        let who = self.who();
        let n = self.next_batch;
        self.next_batch += 1;
        self.conn.send(n, reqs).map_err(|e| format!("{who}: send failed: {e}"))?;
        Ok(n)
    }

    fn pump(&mut self, deadline: Instant) -> Result<(), String> {
        let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(50));
        let who = self.who();
        self.conn.wait(&mut self.replies, left).map_err(|e| format!("{who}: wait failed: {e}"))
    }

    /// Waits for the response to request `id`.
    pub(super) fn response(&mut self, id: u64) -> Result<Response, String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(p) = self.replies.responses.iter().position(|r| r.id == id) {
                return Ok(self.replies.responses.remove(p));
            }
            if Instant::now() >= deadline {
                return Err(format!("{}: no response to request {id} within {TIMEOUT:?}", self.who()));
            }
            self.pump(deadline)?;
        }
    }

    /// Waits for batch `b` to be acknowledged.
    pub(super) fn wait_ack(&mut self, b: u64) -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(p) = self.replies.acked.iter().position(|x| *x == b) {
                self.replies.acked.remove(p);
                let who = self.who();
                return self.conn.poll(&mut self.replies).map_err(|e| format!("{who}: poll failed: {e}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("{}: batch {b} not acknowledged within {TIMEOUT:?}", self.who()));
            }
            self.pump(deadline)?;
        }
    }

    /// Removes and returns the responses (failures, for requests sent without `reply`) to `ids`.
    pub(super) fn take_responses(&mut self, ids: &[u64]) -> Vec<Response> {
        let (mine, rest) = std::mem::take(&mut self.replies.responses).into_iter().partition(|r| ids.contains(&r.id));
        self.replies.responses = rest;
        mine
    }

    /// Sends `op` alone in a batch and waits for its response.
    pub(super) fn call(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<Response, String> {
        let r = self.req(key, op, tag, true);
        let id = r.id;
        self.send(vec![r])?;
        self.response(id)
    }

    /// Like [`Raw::call`], requiring success.
    pub(super) fn ok(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<Option<Value>, String> {
        let what = format!("{op:?} on {key:?}");
        let r = self.call(key, op, tag)?;
        r.result.map_err(|e| format!("{}: {what} failed: {e}", self.who()))
    }

    /// A state operation that must succeed.
    pub(super) fn state(&mut self, key: StoreKey, op: StateOp, tag: Option<OpTag>) -> Result<Option<Value>, String> {
        self.ok(key, StoreOp::State(op), tag)
    }

    /// Reads a value.
    pub(super) fn get(&mut self, key: StoreKey) -> Result<Option<Value>, String> {
        self.state(key, StateOp::Get, None)
    }

    /// Sends one request without `reply` and waits for its ack; fails if it failed.
    pub(super) fn apply_nb(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<(), String> {
        let what = format!("{op:?} on {key:?}");
        let r = self.req(key, op, tag, false);
        let id = r.id;
        let b = self.send(vec![r])?;
        self.wait_ack(b)?;
        match self.take_responses(&[id]).into_iter().next() {
            Some(Response { result: Err(e), .. }) => Err(format!("{}: {what} failed: {e}", self.who())),
            _ => Ok(()),
        }
    }

    /// Advances the store's packet time and waits until every shard has it.
    pub(super) fn advance(&mut self, key: StoreKey, t: u64) -> Result<(), String> {
        self.apply_nb(key, StoreOp::AdvanceTime(t), None)
    }

    pub(super) fn poll_notes(&mut self) -> Result<(), String> {
        let who = self.who();
        self.conn.poll(&mut self.replies).map_err(|e| format!("{who}: poll failed: {e}"))?;
        self.conn.notifications(&mut self.notes).map_err(|e| format!("{who}: notifications failed: {e}"))
    }

    /// Waits until a notification matching `pred` has arrived (it stays in `notes`).
    pub(super) fn wait_note(&mut self, what: &str, pred: impl Fn(&Notification) -> bool) -> Result<(), String> {
        self.wait_until(what, |notes| notes.iter().any(&pred))
    }

    /// Waits until the notifications received so far satisfy `done`.
    pub(super) fn wait_until(&mut self, what: &str, done: impl Fn(&[Notification]) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            self.poll_notes()?;
            if done(&self.notes) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: no {what} within {TIMEOUT:?}; notifications received: {:?}",
                    self.who(),
                    self.notes
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The notifications received so far about `key`.
    pub(super) fn notes_about(&self, key: StoreKey) -> Vec<Notification> {
        self.notes.iter().filter(|n| note_key(n) == key).cloned().collect()
    }
}
