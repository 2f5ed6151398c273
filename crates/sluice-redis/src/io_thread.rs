//! [`ThreadedConnection`]: an instance's Redis connection whose round trips run on a thread of
//! its own, so that the packet path hands a batch over and goes on instead of waiting for Redis.
//!
//! The thread owns a [`RedisConnection`] and applies the batches it is handed in number order;
//! batches that queue up while it waits for Redis go together in the next call
//! ([`RedisConnection::send_all`]), so the calls per packet fall as the load rises. Answers,
//! acknowledgements and errors come back through an inbox the caller polls or waits on.
//! Notifications are drained when the caller asks for them, at most once per
//! [`NOTE_INTERVAL`] (each drain is a call to every node).
//! docs/decisions.md, "Redis round trips off the packet path".

use crate::connection::RedisConnection;
use crate::topology::{FAILOVER_WAIT, IO_TIMEOUT};
use sluice_store::{Connection, Notification, Replies, Request, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The shortest time between two drains of the notification lists.
const NOTE_INTERVAL: Duration = Duration::from_millis(1);

/// What the caller hands the thread.
enum Command {
    /// Apply this batch (see [`Connection::send`]).
    Send(u64, Arc<[Request]>),
    /// Drain the notification lists.
    Notes,
}

/// What the thread has gathered for the caller.
#[derive(Default)]
struct Received {
    replies: Replies,
    notes: Vec<Notification>,
    /// The first failure not yet reported.
    error: Option<StoreError>,
    /// The thread has ended.
    gone: bool,
    /// Unparked whenever something arrives ([`Connection::set_waker`]).
    waker: Option<std::thread::Thread>,
}

/// Shared between the caller and the thread.
#[derive(Default)]
struct Inbox {
    received: Mutex<Received>,
    arrived: Condvar,
    /// The caller has dropped the connection: apply nothing more.
    stop: AtomicBool,
    /// A drain of the notifications is asked for and not yet done.
    notes_wanted: AtomicBool,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, Received> {
        // A poisoned lock means the other side panicked; what it left is still consistent
        // (every write is a whole append).
        self.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An instance's connection to Redis with its I/O on its own thread.
pub(crate) struct ThreadedConnection {
    commands: Option<mpsc::Sender<Command>>,
    inbox: Arc<Inbox>,
    thread: Option<JoinHandle<()>>,
}

impl ThreadedConnection {
    /// Starts the thread that drives `conn`.
    pub(crate) fn spawn(conn: RedisConnection) -> Result<ThreadedConnection, StoreError> {
        let (tx, rx) = mpsc::channel();
        let inbox = Arc::new(Inbox::default());
        let shared = inbox.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-redis-io".into())
            .spawn(move || run(conn, &rx, &shared))
            .map_err(|e| StoreError::Unavailable(format!("starting a Redis I/O thread: {e}")))?;
        Ok(ThreadedConnection { commands: Some(tx), inbox, thread: Some(thread) })
    }

    fn command(&self, c: Command) -> Result<(), StoreError> {
        let gone = || StoreError::Unavailable("the Redis connection's I/O thread has ended".into());
        self.commands.as_ref().ok_or_else(gone)?.send(c).map_err(|_| gone())
    }

    /// Moves what has arrived into `out`; the pending failure, if any, after that.
    fn take(received: &mut Received, out: &mut Replies) -> Result<(), StoreError> {
        out.responses.append(&mut received.replies.responses);
        out.acked.append(&mut received.replies.acked);
        match received.error.take() {
            Some(e) => Err(e),
            None if received.gone => Err(StoreError::Unavailable("the Redis connection's I/O thread has ended".into())),
            None => Ok(()),
        }
    }
}

/// The thread: applies batches as they come, drains notifications when asked.
fn run(mut conn: RedisConnection, commands: &mpsc::Receiver<Command>, inbox: &Inbox) {
    let mut last_drain: Option<Instant> = None;
    let mut notes_due = false;
    let mut batches = Vec::new();
    loop {
        // Wait for work; with a drain asked for too early, until it may run.
        let next_drain = last_drain.map(|t| t + NOTE_INTERVAL);
        let first = match (notes_due, next_drain) {
            (true, Some(at)) => match commands.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
            (true, None) => None,
            (false, _) => match commands.recv() {
                Ok(c) => Some(c),
                Err(_) => break,
            },
        };
        if inbox.stop.load(Ordering::Acquire) {
            break;
        }
        for c in first.into_iter().chain(commands.try_iter()) {
            match c {
                Command::Send(number, batch) => batches.push((number, batch)),
                Command::Notes => notes_due = true,
            }
        }
        let mut failure = None;
        if !batches.is_empty() {
            failure = conn.send_all(batches.drain(..)).err();
        }
        let mut notes = Vec::new();
        if notes_due && last_drain.is_none_or(|t| t.elapsed() >= NOTE_INTERVAL) {
            notes_due = false;
            last_drain = Some(Instant::now());
            inbox.notes_wanted.store(false, Ordering::Release);
            if let Err(e) = conn.take_notifications(&mut notes) {
                failure = failure.or(Some(e));
            }
        }
        let mut received = inbox.lock();
        conn.take_replies(&mut received.replies);
        received.notes.append(&mut notes);
        if let Some(e) = failure {
            tracing::debug!(error = %e, "a Redis call failed; the batch waits to be sent again");
            received.error.get_or_insert(e);
        }
        if let Some(w) = &received.waker {
            w.unpark();
        }
        drop(received);
        inbox.arrived.notify_all();
    }
    let mut received = inbox.lock();
    received.gone = true;
    if let Some(w) = &received.waker {
        w.unpark();
    }
    drop(received);
    inbox.arrived.notify_all();
}

impl Connection for ThreadedConnection {
    fn send(&mut self, number: u64, batch: Arc<[Request]>) -> Result<(), StoreError> {
        self.command(Command::Send(number, batch))
    }

    fn poll(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        ThreadedConnection::take(&mut self.inbox.lock(), out)
    }

    fn wait(&mut self, out: &mut Replies, timeout: Duration) -> Result<(), StoreError> {
        let mut received = self.inbox.lock();
        if received.replies.is_empty() && received.error.is_none() && !received.gone {
            received =
                self.inbox.arrived.wait_timeout(received, timeout).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
        ThreadedConnection::take(&mut received, out)
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError> {
        out.append(&mut self.inbox.lock().notes);
        if !self.inbox.notes_wanted.swap(true, Ordering::AcqRel) {
            self.command(Command::Notes)?;
        }
        Ok(())
    }

    fn set_waker(&mut self, thread: std::thread::Thread) -> bool {
        self.inbox.lock().waker = Some(thread);
        true
    }

    fn halt(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        self.stop();
        // The thread has ended: what it gathered is complete. A failure it reported concerns
        // a batch that stays unacknowledged, sent again after the client reconnects.
        let mut received = self.inbox.lock();
        out.responses.append(&mut received.replies.responses);
        out.acked.append(&mut received.replies.acked);
        Ok(())
    }

    fn patience(&self) -> Duration {
        // The thread gives up on a call by itself (and reports it) once a cluster has had its
        // failover wait, for the call and again for the replicas' acknowledgement, and a
        // node its read timeout: a caller waiting less would give up on a batch that is
        // still being applied.
        FAILOVER_WAIT * 2 + IO_TIMEOUT
    }
}

impl ThreadedConnection {
    /// Ends the thread: what is still queued is not applied (as if the instance had crashed),
    /// a call in progress is finished, as it would be by a caller blocked in it. Returns once
    /// the thread has ended, so nothing this connection was given is applied afterwards.
    fn stop(&mut self) {
        self.inbox.stop.store(true, Ordering::Release);
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ThreadedConnection {
    fn drop(&mut self) {
        // The caller flushes first when it ends normally.
        self.stop();
    }
}
