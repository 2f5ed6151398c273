//! [`RedisConnection`]: one instance's connection, applying batches in number order through
//! `sluice_exec` (one call per node), running in the client what Redis cannot, and draining
//! notifications. It blocks on every round trip; `io_thread` runs it on a thread of its own.

use crate::codec::{decode_key, decode_opt, encode_opt, Form};
use crate::config::Mode;
use crate::reply::{
    array, bytes, codec_err, invalid, is_busy, is_connection_error, is_missing_library_text, is_topology_error, number,
    redis_err, text, ts_of,
};
use crate::request::{header, is_broadcast, push_tagged, Op};
use crate::topology::{Nodes, Replicated, Settling, Shared, Topology};
use sluice_packet::InstanceId;
use sluice_state::{ops::apply, StateError, StateOp};
use sluice_store::{Notification, Replies, Request, Response, StoreError, StoreOp, TsVector};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Conditional writes of one client operation retried at most this often under contention.
const MAX_CONFLICTS: usize = 10_000;
/// Most operations in one call. A call stops at an operation the script cannot apply itself
/// (a custom one, applied by the client as a conditional write) and the rest go again in the
/// next call: with a whole batch in each call, a batch of a few hundred operations with many
/// custom ones (a NAT taking a large batch of new connections) resent itself hundreds of
/// times — 400 MB sent for 1,000 packets, ten times slower than with batches of 32.
const MAX_OPS_PER_CALL: usize = 128;

/// The name of a state operation a node reports a type error for, as [`StateError`] spells it.
fn static_op(s: &str) -> Option<&'static str> {
    ["incr", "push", "pop", "pop_n"].into_iter().find(|x| *x == s)
}

/// The name of a value type a node reports, as [`StateError`] spells it.
fn static_kind(s: &str) -> Option<&'static str> {
    ["int", "float", "endpoint", "tuple", "ints", "list", "bytes"].into_iter().find(|x| *x == s)
}

/// The error code of a call by a fenced client (`sluice.lua`, `exec`).
const FENCED: &str = "SLUICE_FENCED";

/// A batch with its number (see `Connection::send`).
pub(crate) type Numbered = (u64, Arc<[Request]>);

/// What a node answered about one operation.
enum Outcome {
    /// Done (answer included when wanted or failed).
    Done(Option<Response>),
    /// Must be applied in the client: the value's encoding and version, and for an
    /// `IncrMany` which of its tags were logged already.
    Fallback(Vec<u8>, String, Vec<bool>),
}

/// One instance's connection: its own connection to every node.
pub(crate) struct RedisConnection {
    shared: Arc<Shared>,
    /// The instance id, as `sluice_exec` takes it.
    client_arg: Vec<u8>,
    /// The instance and the epoch it connected in (`None`: acting for it, never fenced).
    client: (InstanceId, Option<u32>),
    nodes: Nodes,
    /// The next batch number to apply (numbers are per connection, from 1).
    next_batch: u64,
    /// Batches that arrived before their predecessors.
    held: BTreeMap<u64, Arc<[Request]>>,
    /// Answers not yet polled.
    responses: VecDeque<Response>,
    /// Batches applied and not yet reported as acknowledged.
    acked: Vec<u64>,
    /// Notifications drained from the nodes and not yet handed out.
    notes: Vec<Notification>,
    /// The bucket whose node keeps this client's intent.
    intent_bucket: u16,
    /// What the batch being applied still has to do with its intent.
    intent: Option<IntentStep>,
    /// The fence that refused a call, once one did: the connection stays refused (a store
    /// wiped since would no longer know the fence).
    fenced: Option<StoreError>,
}

/// A batch applied in several calls (over several nodes, or stopping at an operation the
/// client applies) is not atomic: a client killed between two calls leaves it half applied,
/// and its replacement, running the same packets again, would read what the first calls
/// wrote and take another path than the one that needs the rest (a NAT finding its forward
/// mapping and never writing the reverse one). So before such a batch changes anything, its
/// tagged updates and timer mirrors are stored on one node, as this client's *intent*,
/// atomically with the first call; once every call is done the intent is cleared, and only
/// then is the batch acknowledged (its clocks cannot be forgotten before, so running the
/// intent again applies nothing twice). A replacement finishes what it finds
/// ([`RedisConnection::roll_forward`]). docs/decisions.md, "A batch that spans Redis nodes:
/// intent and roll-forward".
#[derive(Debug)]
enum IntentStep {
    /// Store this encoding of the batch's tagged updates and timer mirrors with its first call.
    Store(Vec<u8>),
    /// Clear the stored intent (the batch is applied).
    Clear,
}

impl IntentStep {
    /// The `sluice_exec` arguments: mode and blob.
    fn args(&self) -> (&'static str, &[u8]) {
        match self {
            IntentStep::Store(blob) => ("S", blob),
            IntentStep::Clear => ("C", &[]),
        }
    }
}

/// The encoding of a batch's tagged updates and timer mirrors, as its intent, if the batch
/// needs one: two or more of them (one alone cannot be half applied) and more than one call to
/// apply it (more than one node, more operations than one call takes, or an operation only the
/// client can apply). A timer mirror (`SetTimer`, `CancelTimer`: the client's own timers as
/// its batch left them) is idempotent, and nothing of its client comes after the intent, so
/// running one again is harmless; leaving it out lost the timer of a packet whose updates
/// were applied — its replacement counts the packet processed and never arms it again. A
/// timer expiry (`ExpireTimer`, a question whose answer the client acts on) and packet time
/// are not part of it.
fn intent_of(batch: &[Request], ops: &[Op], shared: &Shared) -> Result<Option<Vec<u8>>, StoreError> {
    let tagged = |r: &&Request| match &r.op {
        StoreOp::State(op) => r.tag.is_some() && op.is_update(),
        StoreOp::Write { .. } => r.tag.is_some(),
        StoreOp::IncrMany(_) => true,
        StoreOp::SetTimer { .. } | StoreOp::CancelTimer => true,
        _ => false,
    };
    if batch.iter().filter(tagged).nth(1).is_none() {
        return Ok(None);
    }
    let topo = shared.topology();
    let mut first_node = None;
    let several_calls = ops.len() > MAX_OPS_PER_CALL
        || ops.iter().any(|o| {
            let custom = o.args.first().is_some_and(|c| c.as_slice() == b"R");
            let node = o.bucket.map(|b| topo.node_of(b));
            let other_node = match (first_node, node) {
                (Some(f), Some(n)) => f != n,
                (None, Some(n)) => {
                    first_node = Some(n);
                    false
                }
                _ => false,
            };
            custom || other_node
        });
    if !several_calls {
        return Ok(None);
    }
    let updates: Vec<Request> = batch.iter().filter(tagged).map(|r| Request { reply: false, ..r.clone() }).collect();
    postcard::to_allocvec(&updates)
        .map(Some)
        .map_err(|e| StoreError::Protocol(format!("encoding a batch's intent: {e}")))
}

impl RedisConnection {
    /// Opens `client`'s connection to every node of the current slot map, failing now rather
    /// than at the first batch if a node is unreachable. In a cluster, a node that does not
    /// answer may be failing over (a replacement instance is often built just then, its node
    /// having failed with a Redis primary): the slot map is read again, with growing pauses,
    /// for up to [`FAILOVER_WAIT`], as a batch does.
    /// With `epoch`, the connection is the instance's in that epoch, and fails once it is
    /// fenced ([`Backend::fence`](sluice_store::Backend::fence)).
    pub(crate) fn open(
        shared: Arc<Shared>,
        client: InstanceId,
        epoch: Option<u32>,
    ) -> Result<RedisConnection, StoreError> {
        let cluster = matches!(shared.cfg.mode, Mode::Cluster(_));
        let mut conn = RedisConnection {
            shared,
            client_arg: client.0.to_string().into_bytes(),
            client: (client, epoch),
            nodes: Nodes::default(),
            next_batch: 1,
            held: BTreeMap::new(),
            responses: VecDeque::new(),
            acked: Vec::new(),
            notes: Vec::new(),
            intent_bucket: 0,
            intent: None,
            fenced: None,
        };
        conn.intent_bucket = conn.shared.bucket_of(&conn.client_arg);
        let mut settling = Settling::new();
        loop {
            let unreachable = conn.shared.topology().nodes.iter().find_map(|url| conn.nodes.get(url).err());
            match unreachable {
                None => return Ok(conn),
                Some(e) if cluster => {
                    tracing::debug!(error = %e, "a cluster node does not answer; reading the slot map again");
                    settling.again(&conn.shared, &mut conn.nodes).map_err(|_| e)?;
                }
                Some(e) => return Err(e),
            }
        }
    }

    /// Calls `sluice_exec` on a node; `Err(Ok(()))` when the slot map changed under it.
    fn call(
        &mut self,
        url: &str,
        buckets: &[u16],
        ops: &[&Op],
        drain: bool,
        intent: Option<&IntentStep>,
    ) -> Result<Result<redis::Value, ()>, StoreError> {
        if let Some(e) = &self.fenced {
            return Err(e.clone());
        }
        let cluster = matches!(self.shared.cfg.mode, Mode::Cluster(_));
        let (mode, blob) = intent.map_or(("", &[][..]), IntentStep::args);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("sluice_exec")
            .arg(0)
            .arg(&self.shared.cfg.prefix)
            .arg(self.client_arg.as_slice())
            .arg(self.client.1.map(|e| e.to_string()).unwrap_or_default())
            .arg(if cluster { "1" } else { "0" })
            .arg(if drain { "1" } else { "0" })
            .arg(mode)
            .arg(self.intent_bucket)
            .arg(blob)
            .arg(buckets.len());
        for b in buckets {
            cmd.arg(*b);
        }
        for op in ops {
            for a in &op.args {
                cmd.arg(a.as_slice());
            }
        }
        // In a cluster, a node that does not answer may have failed: its replica takes over,
        // and the slot map says so once it has.
        let moved = |e: &redis::RedisError| cluster && (is_topology_error(e) || is_connection_error(e));
        let v = match self.nodes.query(url, &cmd) {
            Ok(v) => v,
            // Nor did a node without the library: the next reading of the slot map loads it.
            Err(e) if is_missing_library_text(&e.to_string()) => {
                self.shared.library_lost(Some(url));
                return Ok(Err(()));
            }
            // A busy node did not run the call: sent again after a pause, as for a failover.
            Err(e) if moved(&e) || is_busy(&e) => return Ok(Err(())),
            Err(e) if e.code() == Some(FENCED) => {
                let (client, epoch) = (self.client.0, self.client.1.unwrap_or(0));
                let lowest = e.detail().and_then(|d| d.trim().parse().ok()).unwrap_or(epoch.saturating_add(1));
                let fenced = StoreError::fenced(client, epoch, lowest);
                self.fenced = Some(fenced.clone());
                return Err(fenced);
            }
            Err(e) => return Err(redis_err(e)),
        };
        let want = self.shared.cfg.replicas;
        // Plain reads write nothing: nothing for a replica to acknowledge. (Applying the
        // writes again after a move is harmless: tagged updates are answered from the
        // per-clock log.)
        let writes = intent.is_some() || ops.iter().any(|o| o.args.first().is_none_or(|code| code.as_slice() != b"G"));
        if writes {
            if let Replicated::Moved(_) = self.nodes.wait_for_replicas(url, want, cluster)? {
                return Ok(Err(()));
            }
        }
        Ok(Ok(v))
    }

    /// Decodes drained notifications into `notes`.
    fn decode_notes(&mut self, v: &redis::Value) -> Result<(), StoreError> {
        for n in array(v)? {
            let b = bytes(n)?;
            let Some((kind, rest)) = b.split_first() else { continue };
            let (key, used) = decode_key(rest).map_err(codec_err)?;
            let after = rest.get(used..).unwrap_or(&[]);
            self.notes.push(match kind {
                b'C' => Notification::Changed { key, value: decode_opt(after).map_err(codec_err)? },
                b'T' => Notification::TimerFired { key },
                b'H' => Notification::Handover { key },
                k => return Err(StoreError::Protocol(format!("unknown notification kind {k:#x}"))),
            });
        }
        Ok(())
    }

    /// Interprets one entry of `sluice_exec`'s results.
    fn outcome(&self, batch: &[Request], op: &Op, r: &[redis::Value]) -> Result<Outcome, StoreError> {
        let req = batch.get(op.req).ok_or_else(|| StoreError::Protocol("result for no request".into()))?;
        let kind = r.get(1).map(text).transpose()?.unwrap_or_default();
        let field = |i: usize| r.get(i).ok_or_else(|| StoreError::Protocol("short result".into()));
        let resp = |result, replayed, ts| Response { id: req.id, result, replayed, ts };
        Ok(match kind.as_str() {
            "o" => {
                let value = decode_opt(bytes(field(2)?)?).map_err(codec_err)?;
                let ts: Option<TsVector> = match r.get(3) {
                    Some(t) => Some(ts_of(t)?.into()),
                    None => None,
                };
                Outcome::Done(Some(resp(Ok(value), false, ts)))
            }
            "r" => Outcome::Done(Some(resp(Ok(decode_opt(bytes(field(2)?)?).map_err(codec_err)?), true, None))),
            // A `Logged` request whose tag has no logged update.
            "n" => Outcome::Done(Some(resp(Ok(None), false, None))),
            "e" => {
                let code = text(field(2)?)?;
                let a = text(field(3)?)?;
                let b = r.get(4).map(text).transpose()?.unwrap_or_default();
                let msg = match code.as_str() {
                    "owned" => format!("{:?} is owned by instance {}", req.key, a),
                    "wrong" => match (static_op(&a), static_kind(&b)) {
                        (Some(op), Some(found)) => StateError::WrongType { op, found }.to_string(),
                        _ => format!("operation {a} does not apply to a {b} value"),
                    },
                    _ => return Err(StoreError::Protocol(format!("{code}: {a}"))),
                };
                Outcome::Done(Some(resp(Err(msg), false, None)))
            }
            "f" => {
                let logged = match r.get(4) {
                    Some(f) => bytes(f)?.iter().map(|b| *b == b'1').collect(),
                    None => Vec::new(),
                };
                Outcome::Fallback(bytes(field(2)?)?.to_vec(), text(field(3)?)?, logged)
            }
            other => return Err(StoreError::Protocol(format!("unknown result kind {other:?}"))),
        })
    }

    /// Applies an operation the store could not apply itself; returns the conditional write to
    /// send in its place, or the failure to answer.
    fn fallback(
        &self,
        batch: &[Request],
        op: &Op,
        enc: &[u8],
        ver: &str,
        logged: &[bool],
    ) -> Result<Result<Op, Response>, StoreError> {
        let req = batch.get(op.req).ok_or_else(|| StoreError::Protocol("fallback for no request".into()))?;
        let fail =
            |e: StateError| Ok(Err(Response { id: req.id, result: Err(e.to_string()), replayed: false, ts: None }));
        let mut slot = decode_opt(enc).map_err(codec_err)?;
        // The increments of an IncrMany applied here, to log with the write.
        let mut applied: Vec<Vec<u8>> = Vec::new();
        let result = match &req.op {
            StoreOp::State(sop) => {
                let custom = self.shared.custom_ops(req.key.vertex);
                match apply(&mut slot, sop.clone(), &custom) {
                    Ok(r) => r,
                    Err(e) => return fail(e),
                }
            }
            StoreOp::IncrMany(incrs) => {
                for (i, (tag, d)) in incrs.iter().enumerate() {
                    if logged.get(i).copied().unwrap_or(false) {
                        continue;
                    }
                    match apply(&mut slot, StateOp::Incr(*d), &[]) {
                        Ok(r) => push_tagged(&mut applied, *tag, req.key.vertex, encode_opt(r.as_ref())),
                        Err(e) => return fail(e),
                    }
                }
                None
            }
            other => return Err(StoreError::Protocol(format!("fallback for {other:?}"))),
        };
        let mut args = header("W", op.bucket, &op.kenc, req, req.reply);
        args.push(ver.as_bytes().to_vec());
        Form::of(slot.as_ref()).push_args(&mut args);
        args.push(encode_opt(result.as_ref()));
        args.push((applied.len() / 3).to_string().into_bytes());
        args.extend(applied);
        Ok(Ok(Op { req: op.req, bucket: op.bucket, kenc: op.kenc.clone(), args }))
    }

    /// Executes `ops` (in order per bucket) on the nodes of the slot map, reading the map again
    /// and regrouping what a node no longer serves (or, in a cluster, did not answer; or, busy,
    /// did not run) until [`FAILOVER_WAIT`] has passed.
    fn run(&mut self, batch: &[Request], ops: Vec<Op>) -> Result<(), StoreError> {
        let mut settling = Settling::new();
        let mut pending = ops;
        loop {
            pending = self.run_once(batch, pending)?;
            if pending.is_empty() && self.intent.is_none() {
                return Ok(());
            }
            settling.again(&self.shared, &mut self.nodes)?;
        }
    }

    /// One pass of [`Self::run`] over the current slot map: the operations left to regroup.
    fn run_once(&mut self, batch: &[Request], ops: Vec<Op>) -> Result<Vec<Op>, StoreError> {
        let topo = self.shared.topology();
        let mut groups = group_by_node(&topo, ops);
        // The node keeping the intent goes first: its first call stores or clears the intent.
        let first = self.intent.as_ref().map(|_| topo.node_of(self.intent_bucket));
        let mut left = Vec::new();
        if let Some(n) = first {
            let group = groups.get_mut(n).map(std::mem::take).unwrap_or_default();
            let url = topo.nodes.get(n).cloned().ok_or_else(|| invalid("node vanished"))?;
            if let Some(rest) = self.run_group(batch, &url, &topo.buckets_of(n), group)? {
                left.extend(rest);
            }
            if matches!(self.intent, Some(IntentStep::Store(_))) {
                // Not stored (the node no longer serves the bucket): nothing of the batch may
                // change before it is.
                left.extend(groups.into_iter().flatten());
                return Ok(left);
            }
        }
        for (n, group) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let url = topo.nodes.get(n).cloned().ok_or_else(|| invalid("node vanished"))?;
            let buckets = topo.buckets_of(n);
            if let Some(rest) = self.run_group(batch, &url, &buckets, group)? {
                left.extend(rest);
            }
        }
        Ok(left)
    }

    /// Executes one node's operations; returns those left when the node no longer serves them.
    fn run_group(
        &mut self,
        batch: &[Request],
        url: &str,
        buckets: &[u16],
        mut ops: Vec<Op>,
    ) -> Result<Option<Vec<Op>>, StoreError> {
        let mut start = 0;
        let mut conflicts = 0;
        // The first call carries the intent step, if the batch has one for this node.
        let mut intent = if buckets.contains(&self.intent_bucket) { self.intent.take() } else { None };
        while start < ops.len() || intent.is_some() {
            let end = ops.len().min(start + MAX_OPS_PER_CALL);
            let refs: Vec<&Op> = ops.get(start..end).unwrap_or_default().iter().collect();
            let reply = match self.call(url, buckets, &refs, false, intent.as_ref())? {
                Ok(v) => v,
                Err(()) => {
                    if intent.is_some() {
                        self.intent = intent;
                    }
                    return Ok(Some(ops.split_off(start)));
                }
            };
            intent = None;
            let parts = array(&reply)?;
            let results = parts.first().map(array).transpose()?.unwrap_or(&[]);
            let mut next = end;
            for r in results {
                let r = array(r)?;
                let idx: usize = r.first().map(number).transpose()?.unwrap_or(0);
                let pos = start + idx.checked_sub(1).ok_or_else(|| StoreError::Protocol("result index 0".into()))?;
                let op = ops
                    .get(pos)
                    .filter(|_| pos < end)
                    .ok_or_else(|| StoreError::Protocol("result index out of range".into()))?;
                match self.outcome(batch, op, r)? {
                    Outcome::Done(Some(resp)) => self.responses.push_back(resp),
                    Outcome::Done(None) => {}
                    Outcome::Fallback(enc, ver, logged) => {
                        if op.args.first().is_some_and(|c| c == b"W") {
                            conflicts += 1;
                            if conflicts > MAX_CONFLICTS {
                                let id = batch.get(op.req).map(|r| r.id).unwrap_or(0);
                                self.responses.push_back(Response {
                                    id,
                                    result: Err("too many concurrent updates to apply a custom operation".into()),
                                    replayed: false,
                                    ts: None,
                                });
                                next = pos + 1;
                                break;
                            }
                        }
                        match self.fallback(batch, op, &enc, &ver, &logged)? {
                            Ok(write) => {
                                ops[pos] = write;
                                next = pos;
                            }
                            Err(resp) => {
                                self.responses.push_back(resp);
                                next = pos + 1;
                            }
                        }
                        break;
                    }
                }
            }
            start = next;
        }
        Ok(None)
    }

    /// Applies one batch's operations, under an intent if it needs one ([`IntentStep`]).
    fn apply(&mut self, batch: &[Request], ops: Vec<Op>) -> Result<(), StoreError> {
        let intent = intent_of(batch, &ops, &self.shared)?;
        let with_intent = intent.is_some();
        self.intent = intent.map(IntentStep::Store);
        self.run(batch, ops)?;
        if with_intent {
            self.intent = Some(IntentStep::Clear);
            self.run(batch, Vec::new())?;
        }
        Ok(())
    }

    /// Finishes the batch this client's failed predecessor (same id) left half applied, if
    /// its intent is still stored: applies its tagged updates again (those applied before are
    /// answered from the per-clock log) and its timer mirrors, and clears it. Returns how many
    /// operations it held.
    pub(crate) fn roll_forward(&mut self) -> Result<usize, StoreError> {
        let key = format!("{{{}:{}}}I", self.shared.cfg.prefix, self.intent_bucket);
        let get = redis::cmd("HGET").arg(&key).arg(self.client_arg.as_slice()).clone();
        let cluster = matches!(self.shared.cfg.mode, Mode::Cluster(_));
        let mut settling = Settling::new();
        let stored = loop {
            let topo = self.shared.topology();
            let url = topo.nodes.get(topo.node_of(self.intent_bucket)).cloned().ok_or_else(|| invalid("no node"))?;
            match self.nodes.query(&url, &get) {
                Ok(v) => break v,
                Err(e) if is_busy(&e) || (cluster && (is_topology_error(&e) || is_connection_error(&e))) => {
                    settling.again(&self.shared, &mut self.nodes).map_err(|_| redis_err(e))?;
                }
                Err(e) => return Err(redis_err(e)),
            }
        };
        if matches!(stored, redis::Value::Nil) {
            return Ok(0);
        }
        let updates: Vec<Request> = postcard::from_bytes(bytes(&stored)?)
            .map_err(|e| StoreError::Protocol(format!("decoding a stored intent: {e}")))?;
        let count = updates.len();
        let number = self.next_batch;
        self.send_all([(number, updates.into())])?;
        // The batch stored and cleared an intent of its own only if it needed one here.
        self.intent = Some(IntentStep::Clear);
        let cleared = self.run(&[], Vec::new());
        self.intent = None;
        cleared?;
        let failed = self.responses.drain(..).filter(|r| r.result.is_err()).count();
        if failed > 0 {
            tracing::warn!(failed, "updates of a half-applied batch failed when finished");
        }
        self.acked.clear();
        Ok(count)
    }

    /// Drains this instance's notification lists on every node.
    fn drain_notifications(&mut self) -> Result<(), StoreError> {
        let topo = self.shared.topology();
        for (n, url) in topo.nodes.iter().enumerate() {
            let buckets = topo.buckets_of(n);
            let reply = match self.call(url, &buckets, &[], true, None)? {
                Ok(v) => v,
                Err(()) => {
                    // Buckets moved: the next poll uses the new map.
                    self.shared.refresh(&mut self.nodes)?;
                    continue;
                }
            };
            let parts = array(&reply)?;
            if let Some(notes) = parts.get(1) {
                self.decode_notes(notes)?;
            }
        }
        Ok(())
    }
}

/// `ops` grouped by the node of `topo` serving their buckets, in order; a broadcast operation
/// (every bucket applies it) goes to every node. Once: the operations left after a pass hold a
/// broadcast once per node that did not answer, and copying each copy to every node again
/// multiplied them by the node count at every pass while a cluster failed over (gigabytes
/// within seconds with the whole cluster down). Running one again on a node that applied it
/// changes nothing: forgetting clocks and advancing packet time are idempotent.
fn group_by_node(topo: &Topology, ops: Vec<Op>) -> Vec<Vec<Op>> {
    let mut groups: Vec<Vec<Op>> = vec![Vec::new(); topo.nodes.len()];
    let mut broadcast: Vec<usize> = Vec::new();
    for op in ops {
        match op.bucket {
            None if broadcast.contains(&op.req) => {}
            None => {
                broadcast.push(op.req);
                groups.iter_mut().for_each(|g| g.push(op.clone()));
            }
            Some(b) => {
                if let Some(g) = groups.get_mut(topo.node_of(b)) {
                    g.push(op);
                }
            }
        }
    }
    groups
}

impl RedisConnection {
    /// Takes the batches ready to apply next, in number order, as one unit: consecutive held
    /// batches from `next_batch`, up to [`MAX_OPS_PER_CALL`] requests in all (a single batch
    /// of any size). `None` when the next batch has not arrived.
    fn take_ready(&mut self) -> Option<(Vec<Numbered>, Arc<[Request]>)> {
        let mut taken: Vec<Numbered> = Vec::new();
        let mut requests = 0;
        loop {
            let number = self.next_batch + taken.len() as u64;
            let Some(len) = self.held.get(&number).map(|b| b.len()) else { break };
            if !taken.is_empty() && requests + len > MAX_OPS_PER_CALL {
                break;
            }
            let Some(batch) = self.held.remove(&number) else { break };
            requests += len;
            taken.push((number, batch));
        }
        let unit: Arc<[Request]> = match taken.as_slice() {
            [] => return None,
            [(_, only)] => only.clone(),
            several => several.iter().flat_map(|(_, b)| b.iter().cloned()).collect(),
        };
        Some((taken, unit))
    }

    /// Applies every batch that can be applied now, in number order. Batches that wait in
    /// line are applied together, as one unit (their requests in order, in as few calls as
    /// one batch of that many): a connection whose caller does not wait for each batch (the
    /// I/O thread) pays a node's per-call cost once for all of them. A unit is all or nothing
    /// towards the caller: it is acknowledged once applied, and its intent (if it needs one)
    /// covers all its batches, so a replacement finishes it whole.
    fn apply_ready(&mut self) -> Result<(), StoreError> {
        while let Some((taken, unit)) = self.take_ready() {
            let ops: Vec<Op> = unit.iter().enumerate().map(|(i, r)| Op::encode(&self.shared, i, r)).collect();
            let applied = self.apply(&unit, ops);
            self.intent = None;
            if let Err(e) = applied {
                // Not acknowledged: the client sends them again (tagged updates apply once).
                self.held.extend(taken);
                return Err(e);
            }
            for r in unit.iter() {
                if r.reply && is_broadcast(&r.op) {
                    self.responses.push_back(Response { id: r.id, result: Ok(None), replayed: false, ts: None });
                }
            }
            for (number, _) in taken {
                self.acked.push(number);
                self.next_batch = number + 1;
            }
        }
        Ok(())
    }

    /// Takes batch `number` in (held until those before it have arrived), without applying it.
    fn receive(&mut self, number: u64, batch: Arc<[Request]>) {
        if number < self.next_batch {
            // Applied before (a retransmission): acknowledge again.
            self.acked.push(number);
        } else {
            self.held.insert(number, batch);
        }
    }

    /// Takes in every batch given, then applies what can be applied (see
    /// [`Self::apply_ready`]).
    pub(crate) fn send_all(
        &mut self,
        batches: impl IntoIterator<Item = (u64, Arc<[Request]>)>,
    ) -> Result<(), StoreError> {
        for (number, batch) in batches {
            self.receive(number, batch);
        }
        self.apply_ready()
    }

    /// Moves the answers and acknowledgements gathered so far into `out`.
    pub(crate) fn take_replies(&mut self, out: &mut Replies) {
        out.responses.extend(self.responses.drain(..));
        out.acked.append(&mut self.acked);
    }

    /// Drains this instance's notifications from every node into `out`.
    pub(crate) fn take_notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError> {
        self.drain_notifications()?;
        out.append(&mut self.notes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(req: usize, bucket: Option<u16>) -> Op {
        Op { req, bucket, kenc: Vec::new(), args: Vec::new() }
    }

    #[test]
    fn a_broadcast_left_by_every_node_goes_to_each_node_once_again() {
        let topo = Topology { nodes: vec!["a".into(), "b".into(), "c".into()], bucket_node: vec![0, 1, 2, 0] };
        // The first pass: one broadcast (request 1) between two keyed operations.
        let first = group_by_node(&topo, vec![op(0, Some(1)), op(1, None), op(2, Some(3))]);
        let reqs = |g: &Vec<Op>| g.iter().map(|o| o.req).collect::<Vec<_>>();
        assert_eq!(first.iter().map(reqs).collect::<Vec<_>>(), [vec![1, 2], vec![0, 1], vec![1]]);
        // No node answered: what is left holds the broadcast three times.
        let mut left: Vec<Op> = first.into_iter().flatten().collect();
        for _ in 0..10 {
            let again = group_by_node(&topo, left);
            assert!(again.iter().all(|g| g.iter().filter(|o| o.req == 1).count() == 1), "a broadcast copied");
            left = again.into_iter().flatten().collect();
        }
        assert_eq!(left.len(), 5, "the two keyed operations and the broadcast on each of three nodes");
    }
}
