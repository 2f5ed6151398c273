//! Requests of a running run that its root carries out in its own time (crashes, changes).
//! The one who asks waits for the root's answer: carried out (where in the run), or refused
//! and why. Nothing asked is answered "done" and then dropped: a request the root has not
//! taken when the run's input ends is refused, and one not taken in [`PATIENCE`] is withdrawn
//! and said so.

use super::LiveError;
use crate::report::ReconfigReport;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

/// How long a request waits for the root to take it. The root looks every turn (microseconds
/// to a millisecond apart while it runs); a request not taken in this long is withdrawn.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// What the run did with a request it carried out.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Done {
    /// Packets the root had admitted when it acted (`None` on a node without the root, which
    /// admits none).
    pub at_packet: Option<u64>,
    /// A change's entry in the run's report (`None`: nothing needed changing, e.g. a scale to
    /// the count the vertex has).
    pub change: Option<ReconfigReport>,
}

/// The root's answer to one request.
type Answer = Result<Done, String>;

/// One request's way back to the one who asked. Dropped unanswered, it answers a refusal, so
/// the asker never waits for an answer that cannot come.
#[derive(Debug)]
pub(crate) struct Reply(Option<mpsc::SyncSender<Answer>>);

impl Reply {
    /// The request was carried out.
    pub(crate) fn done(mut self, done: Done) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Ok(done));
        }
    }

    /// The request was not carried out, because of `why`.
    pub(crate) fn refused(mut self, why: impl Into<String>) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Err(why.into()));
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Err("the run did not carry it out".into()));
        }
    }
}

#[derive(Debug)]
struct Filed<T> {
    /// Why nothing more is taken (the run's input has ended); `None` while requests are taken.
    closed: Option<String>,
    next_id: u64,
    asked: Vec<(u64, T, Reply)>,
}

/// Requests of one kind the root has not taken yet.
#[derive(Debug)]
pub(crate) struct Asks<T> {
    filed: Mutex<Filed<T>>,
    /// Whether `filed` may hold a request (the root takes the lock only then).
    any: AtomicBool,
}

impl<T> Default for Asks<T> {
    fn default() -> Self {
        Asks { filed: Mutex::new(Filed { closed: None, next_id: 0, asked: Vec::new() }), any: AtomicBool::new(false) }
    }
}

fn poisoned() -> LiveError {
    LiveError::Refused("the run's control state is unusable (a thread of the run failed)".into())
}

impl<T> Asks<T> {
    /// Files `what` and waits for the root's answer: what it did, or why it did not. A request
    /// not taken in [`PATIENCE`] is withdrawn ([`LiveError::NotTaken`]: nothing was done).
    pub(crate) fn ask(&self, what: T) -> Result<Done, LiveError> {
        self.ask_within(what, PATIENCE)
    }

    fn ask_within(&self, what: T, patience: Duration) -> Result<Done, LiveError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let id = {
            let mut f = self.filed.lock().map_err(|_| poisoned())?;
            if let Some(why) = &f.closed {
                return Err(LiveError::Refused(why.clone()));
            }
            let id = f.next_id;
            f.next_id += 1;
            f.asked.push((id, what, Reply(Some(tx))));
            self.any.store(true, Ordering::Release);
            id
        };
        let answer = match rx.recv_timeout(patience) {
            Ok(a) => a,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let mut f = self.filed.lock().map_err(|_| poisoned())?;
                if let Some(at) = f.asked.iter().position(|(i, ..)| *i == id) {
                    // Still untaken: withdrawn, so it is never carried out unanswered.
                    f.asked.remove(at);
                    return Err(LiveError::NotTaken(patience.as_secs()));
                }
                drop(f);
                // Taken just now: the root answers in the same turn.
                rx.recv().unwrap_or_else(|_| Err("the run did not carry it out".into()))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err("the run did not carry it out".into()),
        };
        answer.map_err(LiveError::Refused)
    }

    /// The requests filed since the last call, each with its reply.
    pub(crate) fn take(&self) -> Vec<(T, Reply)> {
        if !self.any.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        match self.filed.lock() {
            Ok(mut f) => f.asked.drain(..).map(|(_, what, reply)| (what, reply)).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Takes nothing more: the requests filed and not taken, and every later one, are refused
    /// with `why`.
    pub(crate) fn close(&self, why: &str) {
        let untaken = match self.filed.lock() {
            Ok(mut f) => {
                f.closed = Some(why.to_string());
                std::mem::take(&mut f.asked)
            }
            Err(_) => return,
        };
        for (.., reply) in untaken {
            reply.refused(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Asks `what` from another thread; its answer comes back through the handle.
    fn ask_from_thread(asks: &Arc<Asks<u8>>, what: u8) -> std::thread::JoinHandle<Result<Done, LiveError>> {
        let asks = asks.clone();
        std::thread::spawn(move || asks.ask(what))
    }

    fn taken(asks: &Asks<u8>) -> Vec<(u8, Reply)> {
        for _ in 0..5000 {
            let t = asks.take();
            if !t.is_empty() {
                return t;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("nothing was asked");
    }

    #[test]
    fn the_asker_gets_what_the_root_did() {
        let asks = Arc::new(Asks::default());
        let asker = ask_from_thread(&asks, 7);
        let mut t = taken(&asks);
        let (what, reply) = t.pop().expect("one");
        assert_eq!(what, 7);
        reply.done(Done { at_packet: Some(42), change: None });
        assert_eq!(asker.join().expect("join"), Ok(Done { at_packet: Some(42), change: None }));
        let asker = ask_from_thread(&asks, 8);
        let (_, reply) = taken(&asks).pop().expect("one");
        reply.refused("no");
        assert_eq!(asker.join().expect("join"), Err(LiveError::Refused("no".into())));
    }

    #[test]
    fn a_reply_dropped_unanswered_is_a_refusal() {
        let asks = Arc::new(Asks::default());
        let asker = ask_from_thread(&asks, 1);
        drop(taken(&asks));
        assert!(matches!(asker.join().expect("join"), Err(LiveError::Refused(why)) if why.contains("did not carry")));
    }

    #[test]
    fn closing_refuses_what_is_untaken_and_what_comes_later() {
        let asks = Arc::new(Asks::default());
        let asker = ask_from_thread(&asks, 1);
        while asks.filed.lock().map(|f| f.asked.is_empty()).unwrap_or(false) {
            std::thread::sleep(Duration::from_millis(1));
        }
        asks.close("ended");
        assert_eq!(asker.join().expect("join"), Err(LiveError::Refused("ended".into())));
        assert_eq!(asks.ask(2), Err(LiveError::Refused("ended".into())));
        assert!(asks.take().is_empty(), "nothing is left to take");
    }

    #[test]
    fn a_request_not_taken_in_time_is_withdrawn() {
        let asks: Asks<u8> = Asks::default();
        assert_eq!(asks.ask_within(3, Duration::from_millis(20)), Err(LiveError::NotTaken(0)));
        assert!(asks.take().is_empty(), "withdrawn: the root never carries it out");
    }
}
