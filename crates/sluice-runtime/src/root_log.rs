//! The root's packet log kept in the state store (`--log store`: the threaded runtime's
//! `RunConfig::log_in_store` and the virtual-time engine's `LogPlace::Store`).
//!
//! Every admitted packet is written to the store, and the write is acknowledged, before the
//! packet enters the chain: a root that crashes after that point cannot lose a packet that is
//! already in flight. Deletes are not waited for: they travel with the next write, and a delete
//! that had not reached the store when the root failed is found (and repeated) by the new root,
//! which reads the log back from the store. The entries live under a vertex number no NF uses,
//! so they are never part of the chain's state.
//!
//! The log shares the store's fate: a store instance that fails loses the entries written
//! since its last checkpoint (CHC's store is not replicated either), see docs/correctness.md.

use sluice_chc::root::{Reload, Root};
use sluice_packet::{Clock, InstanceId, Meta, Packet};
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, Connection, Replies, Request, StoreKey, StoreOp};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The vertex number of the root's log entries.
pub const ROOT_LOG_VERTEX: u16 = u16::MAX;

/// The longest the root waits for the store to acknowledge a log write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the log in the store failed.
#[derive(Debug, thiserror::Error)]
pub enum RootLogError {
    /// The store refused or lost a request.
    #[error("root log in the store: {0}")]
    Store(String),
    /// The store did not acknowledge a write in time.
    #[error("root log in the store: no acknowledgement within {0:?}")]
    Timeout(Duration),
}

/// A packet as the log keeps it.
#[derive(Debug, Clone)]
pub struct LoggedPacket {
    /// Index of the packet in the input.
    pub input: u64,
    /// The packet, with the metadata the root gave it (clock, times, input port).
    pub packet: Packet,
}

/// The root's connection to the log in the store.
pub struct StoreLog {
    conn: Box<dyn Connection>,
    next_batch: u64,
    deletes: Vec<Request>,
    replies: Replies,
    /// Writes acknowledged.
    pub writes: u64,
    /// Wall time spent waiting for them.
    pub wall: Duration,
}

fn key(clock: Clock) -> StoreKey {
    StoreKey { vertex: ROOT_LOG_VERTEX, object: 0, key: StateKey::Id(clock.0) }
}

fn request(clock: Clock, op: StateOp) -> Request {
    Request { id: 0, client: client(), tag: None, key: key(clock), op: StoreOp::State(op), reply: false }
}

fn client() -> InstanceId {
    InstanceId::new(ROOT_LOG_VERTEX, 0)
}

impl StoreLog {
    /// Connects the root to `backend`.
    pub fn connect(backend: &Arc<dyn Backend>) -> Result<StoreLog, RootLogError> {
        let conn = backend.connect(client()).map_err(|e| RootLogError::Store(e.to_string()))?;
        Ok(StoreLog {
            conn,
            next_batch: 1,
            deletes: Vec::new(),
            replies: Replies::default(),
            writes: 0,
            wall: Duration::ZERO,
        })
    }

    /// Continues over a new connection (the store instance was replaced); pending deletes are
    /// sent to the new one.
    pub fn reconnect(&mut self, backend: &Arc<dyn Backend>) -> Result<(), RootLogError> {
        self.conn = backend.connect(client()).map_err(|e| RootLogError::Store(e.to_string()))?;
        self.next_batch = 1;
        self.replies = Replies::default();
        Ok(())
    }

    /// Writes `pkt` (input packet `input`) and waits until the store has it, sending the
    /// pending deletes along.
    pub fn write(&mut self, input: u64, pkt: &Packet) -> Result<(), RootLogError> {
        self.write_all([(input, pkt)])
    }

    /// Writes several packets (input packet number, packet) in one batch and waits until the
    /// store has them all, sending the pending deletes along.
    pub fn write_all<'a>(&mut self, packets: impl IntoIterator<Item = (u64, &'a Packet)>) -> Result<(), RootLogError> {
        let started = Instant::now();
        let mut batch = std::mem::take(&mut self.deletes);
        let before = batch.len();
        for (input, pkt) in packets {
            let m = &pkt.meta;
            let value = Value::List(VecDeque::from([
                Value::Ints(vec![input as i64, m.ts_ns as i64, m.ingress_ns as i64, i64::from(m.in_port)]),
                Value::Bytes(pkt.data().to_vec()),
            ]));
            batch.push(request(m.clock, StateOp::Set(value)));
        }
        let written = (batch.len() - before) as u64;
        if batch.is_empty() {
            return Ok(());
        }
        self.send_and_wait(batch)?;
        self.writes += written;
        self.wall += started.elapsed();
        Ok(())
    }

    /// Deletes the entry of `clock` (sent with the next write, or by [`Self::sync`]).
    pub fn delete(&mut self, clock: Clock) {
        self.deletes.push(request(clock, StateOp::Delete));
    }

    /// Sends the pending deletes and waits for them.
    pub fn sync(&mut self) -> Result<(), RootLogError> {
        let batch = std::mem::take(&mut self.deletes);
        if batch.is_empty() {
            return Ok(());
        }
        self.send_and_wait(batch)
    }

    fn send_and_wait(&mut self, batch: Vec<Request>) -> Result<(), RootLogError> {
        let number = self.next_batch;
        self.next_batch += 1;
        self.conn.send(number, batch.into()).map_err(|e| RootLogError::Store(e.to_string()))?;
        let deadline = Instant::now() + WRITE_TIMEOUT;
        loop {
            if let Some(r) = self.replies.responses.iter().find(|r| r.result.is_err()) {
                return Err(RootLogError::Store(format!("{:?}", r.result)));
            }
            if let Some(pos) = self.replies.acked.iter().position(|b| *b == number) {
                self.replies.acked.swap_remove(pos);
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RootLogError::Timeout(WRITE_TIMEOUT));
            }
            self.conn
                .wait(&mut self.replies, Duration::from_millis(100))
                .map_err(|e| RootLogError::Store(e.to_string()))?;
        }
    }

    /// A new root takes over (CHC's root recovery, the log in the store): the store's entries
    /// of the roots `mine` covers replace what `root` logs ([`Root::reload`]), and those the
    /// old root had deleted (their deletes not sent yet) are deleted again.
    pub fn read_back(
        &mut self,
        backend: &Arc<dyn Backend>,
        root: &mut Root,
        mine: impl Fn(Clock) -> bool,
    ) -> Result<Reload, RootLogError> {
        let stored: BTreeMap<Clock, (u64, Packet)> =
            Self::read(backend)?.into_iter().filter(|(c, _)| mine(*c)).map(|(c, l)| (c, (l.input, l.packet))).collect();
        let r = root.reload(stored);
        for c in &r.stale {
            self.delete(*c);
        }
        self.sync()?;
        Ok(r)
    }

    /// The store was rebuilt from its checkpoint, which lacks the entries written since: the
    /// entries of `root`'s log that `mine` covers and the store lost are written back (so a
    /// later root crash reads a whole log back). How many.
    pub fn write_back(
        &mut self,
        backend: &Arc<dyn Backend>,
        root: &Root,
        mine: impl Fn(Clock) -> bool,
    ) -> Result<u64, RootLogError> {
        let stored = Self::read(backend)?;
        let missing: Vec<(u64, &Packet)> = root
            .log_entries()
            .filter(|(c, _, _)| mine(*c) && !stored.contains_key(c))
            .map(|(_, i, p)| (i, p))
            .collect();
        let n = missing.len() as u64;
        self.write_all(missing)?;
        Ok(n)
    }

    /// Reads the whole log back from the store (what a new root does), by clock.
    pub fn read(backend: &Arc<dyn Backend>) -> Result<BTreeMap<Clock, LoggedPacket>, RootLogError> {
        let cp = backend.checkpoint().map_err(|e| RootLogError::Store(e.to_string()))?;
        let mut out = BTreeMap::new();
        for (k, v) in cp.values {
            let (ROOT_LOG_VERTEX, StateKey::Id(c)) = (k.vertex, k.key) else { continue };
            let Value::List(parts) = v else { continue };
            let (Some(Value::Ints(head)), Some(Value::Bytes(frame))) = (parts.front(), parts.get(1)) else { continue };
            let [input, ts, ingress, port] = head.as_slice() else { continue };
            let clock = Clock(c);
            let meta = Meta {
                clock,
                ts_ns: *ts as u64,
                ingress_ns: *ingress as u64,
                in_port: u16::try_from(*port).unwrap_or(0),
                ..Meta::default()
            };
            out.insert(clock, LoggedPacket { input: *input as u64, packet: Packet::from_slice(frame, meta) });
        }
        Ok(out)
    }
}
