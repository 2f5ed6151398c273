//! The receiving side of a node's links: datagrams taken in each sender's sequence order
//! ([`super::in_order`]), packets into their queues, notes into the root's accounting; gaps
//! asked for again, resends served, hellos answered.

use super::in_order::{self, Place, Received};
use super::{node_of_addr, progress, root_hears, Link};
use crate::exec::{RunError, Shared};
use sluice_packet::{Clock, Meta};
use sluice_wire::geneve::TO_EGRESS;
use sluice_wire::notes::{decode_notes, is_notes, NoteKind};
use sluice_wire::RecvBatch;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Link {
    /// Takes in what arrived, in each sender's sequence order: packets into their queues,
    /// notes into the root's accounting. Then asks again for what is missing, resends what
    /// others asked for, and answers hellos.
    pub(super) fn receive(&mut self, shared: &Shared) -> Result<bool, RunError> {
        let Some(mut rx) = self.rx.take() else { return Ok(false) };
        let received = self.receive_into(shared, &mut rx);
        self.rx = Some(rx);
        let mut any = received?;
        self.ask_for_gaps()?;
        self.resend_asked()?;
        for node in std::mem::take(&mut self.hellos_to_answer) {
            self.control(node, NoteKind::Hello, None)?;
        }
        if self.out.retry(shared) {
            any = true;
        }
        Ok(any)
    }

    pub(super) fn receive_into(&mut self, shared: &Shared, rx: &mut RecvBatch) -> Result<bool, RunError> {
        let mut any = false;
        // A few batches per turn at most: the other side of the turn sends.
        for _ in 0..8 {
            let n = self
                .socket
                .try_recv_batch(rx)
                .map_err(|e| RunError::Worker(format!("receiving from other nodes: {e}")))?;
            if n == 0 {
                break;
            }
            any = true;
            let mut finished = 0usize;
            for (d, from) in rx.iter() {
                let Some(node) = from.and_then(|f| node_of_addr(&self.layout.addrs, f)) else {
                    self.report.strangers += 1;
                    continue;
                };
                if self.dead.get(node).copied().unwrap_or(false) {
                    self.report.fenced += 1;
                    continue;
                }
                self.report.datagrams_received += 1;
                if let Some(t) = self.last_heard.get_mut(node) {
                    *t = Instant::now();
                }
                if let Some(a) = self.awaiting.get_mut(node) {
                    *a = None;
                }
                // Without a sequence number it is not ours: taking it in says why.
                let (Some(seq), Some(r)) = (sluice_wire::link_seq(d), self.received.get_mut(node)) else {
                    self.take_in(shared, node, d, &mut finished)?;
                    continue;
                };
                let place = r.place(seq);
                if place == Place::Ahead && sluice_wire::is_control(d) {
                    // Control notes wait for nothing (the end of the run comes after all its
                    // packets): taken now, an empty place kept in the sequence.
                    if r.hold(seq, &[]) {
                        self.take_in(shared, node, d, &mut finished)?;
                        continue;
                    }
                }
                match place {
                    Place::Taken => self.report.late += 1,
                    Place::Ahead => {
                        if !r.hold(seq, d) {
                            let held = r.held();
                            return Err(RunError::Worker(format!(
                                "node `{}`: {held} datagrams held past a gap that is not filled",
                                self.name(node)
                            )));
                        }
                    }
                    Place::Next => {
                        self.take_in(shared, node, d, &mut finished)?;
                        while let Some(h) = self.received.get_mut(node).and_then(Received::take_held) {
                            if !h.is_empty() {
                                self.take_in(shared, node, &h, &mut finished)?;
                            }
                        }
                    }
                }
            }
            for (node, crashed) in std::mem::take(&mut self.crashes_heard) {
                self.take_over_crashed(shared, node, crashed)?;
            }
            self.out.flush(shared);
            if finished > 0 {
                shared.in_flight.fetch_sub(finished, Ordering::AcqRel);
            }
        }
        Ok(any)
    }

    /// Takes in one datagram from `node`, in its sequence order; adds the copies that ended
    /// to `finished`.
    fn take_in(&mut self, shared: &Shared, node: usize, d: &[u8], finished: &mut usize) -> Result<(), RunError> {
        let Link { layout, out, decoded, report, fingerprint, on_node, root_end, flushed, relayed, .. } = self;
        if is_notes(d) {
            let vni = match decode_notes(d, decoded) {
                Ok((vni, _)) => vni,
                Err(e) => {
                    report.malformed += 1;
                    report.last_error = Some(e.to_string());
                    return Ok(());
                }
            };
            if vni != layout.vni {
                report.malformed += 1;
                return Ok(());
            }
            for n in decoded.iter() {
                match n.kind {
                    NoteKind::Hello | NoteKind::End | NoteKind::Stop | NoteKind::Flushed
                        if n.meta.clock.0 != *fingerprint =>
                    {
                        return Err(RunError::Config(format!(
                            "node `{}` runs another chain or placement (fingerprint {:#x}, here {:#x}): give every node the same chain, options and spread file",
                            layout.names.get(node).map_or("?", String::as_str),
                            n.meta.clock.0,
                            fingerprint
                        )));
                    }
                    NoteKind::Hello => {
                        if let Some(h) = self.heard.get_mut(node).filter(|h| !**h) {
                            *h = true;
                            // Answered at the end of the turn: the other side waits for it.
                            self.hellos_to_answer.push(node);
                        }
                    }
                    NoteKind::Stop if n.meta.xor == super::FENCE && node == layout.root && !layout.has_root() => {
                        return Err(RunError::Worker(format!(
                            "the root's node `{}` declared this node failed (nothing heard from it for {} ms) and fenced it: its instances run there now",
                            layout.names.get(node).map_or("?", String::as_str),
                            layout.silence.as_millis()
                        )));
                    }
                    NoteKind::Stop => {
                        return Err(RunError::Worker(format!(
                            "node `{}` stopped before the run ended",
                            layout.names.get(node).map_or("?", String::as_str)
                        )));
                    }
                    NoteKind::Resend => self.asked.push((node, n.meta.clock.0, n.meta.xor)),
                    NoteKind::End if !layout.has_root() && node == layout.root => self.ended = true,
                    NoteKind::Flushed if layout.has_root() => {
                        if let Some(f) = flushed.get_mut(node) {
                            *f = true;
                        }
                    }
                    NoteKind::Last if !layout.has_root() && node == layout.root => {
                        *root_end = Some((n.meta.clock, n.meta.xor));
                    }
                    NoteKind::Oldest if !layout.has_root() && node == layout.root => {
                        if let Some(fo) = &shared.failover {
                            fo.set_oldest_logged(n.meta.clock.root(), n.meta.clock.seq());
                        }
                    }
                    NoteKind::Admitted | NoteKind::Done if !layout.has_root() && node == layout.root => {
                        if progress::heard(shared.from_root.as_ref(), n) {
                            report.progress += u64::from(n.kind == NoteKind::Admitted);
                        } else {
                            report.malformed += 1;
                        }
                    }
                    NoteKind::Lost if layout.has_root() => {
                        if let Some(l) = self.lost_heard.get_mut(node) {
                            l.push(n.meta);
                        }
                    }
                    NoteKind::Processed if layout.has_root() => {
                        if let Some(p) = self.processed_heard.get_mut(node) {
                            p.insert_word(n.meta.clock, n.meta.xor);
                        }
                    }
                    NoteKind::Crashed if layout.has_root() => self.crashes_heard.push((node, n.meta)),
                    NoteKind::End
                    | NoteKind::Last
                    | NoteKind::Oldest
                    | NoteKind::Admitted
                    | NoteKind::Done
                    | NoteKind::Flushed => report.malformed += 1,
                    _ if !layout.has_root() => report.malformed += 1,
                    kind => {
                        report.notes_received += 1;
                        if let Some(on) = on_node.get_mut(node) {
                            match kind {
                                NoteKind::Sent => on.arrived(&n.meta),
                                NoteKind::Finished => on.left(&n.meta),
                                _ => {}
                            }
                        }
                        *finished += usize::from(root_hears(shared, out, kind, n.meta));
                    }
                }
            }
            return Ok(());
        }
        let decoded = match sluice_wire::decode(d) {
            Ok(p) => p,
            Err(e) => {
                report.malformed += 1;
                report.last_error = Some(e.to_string());
                return Ok(());
            }
        };
        if decoded.vni != layout.vni {
            report.malformed += 1;
            return Ok(());
        }
        let dest = if decoded.dest == TO_EGRESS && layout.has_root() {
            Some(shared.queues.len())
        } else {
            let v = shared.vertices.get(usize::from(decoded.dest.vertex()));
            // The root's node relays what one other node sends to another.
            // A node relays what comes for an instance that crashed here to its replacement.
            v.and_then(|v| v.global(decoded.dest.index()))
                .filter(|g| layout.has_root() || layout.here(*g) || relayed.contains(g))
        };
        let Some(dest) = dest else {
            report.misaddressed += 1;
            return Ok(());
        };
        report.packets_received += 1;
        if let Some(on) = on_node.get_mut(node) {
            on.left(&decoded.meta);
        }
        let pkt = shared.pool.packet(decoded.frame, decoded.meta);
        out.push(shared, dest, pkt);
        Ok(())
    }

    /// Asks every node whose sequence shows a gap for it again (every [`in_order::ASK_EVERY`]);
    /// a gap open for the spread's `silence_ms` ends the run: its sender no longer holds it.
    fn ask_for_gaps(&mut self) -> Result<(), RunError> {
        let now = Instant::now();
        for node in 0..self.received.len() {
            if self.dead.get(node).copied().unwrap_or(true) {
                continue;
            }
            let Some(r) = self.received.get_mut(node) else { continue };
            if r.gap_open(now).is_some_and(|t| t >= self.layout.silence) {
                return Err(RunError::Worker(format!(
                    "node `{}`: datagrams lost on the way were not resent within {} ms (it keeps its last {} datagrams to each node)",
                    self.name(node),
                    self.layout.silence.as_millis(),
                    in_order::HELD
                )));
            }
            if let Some((first, count, new)) = r.gap_to_ask(now) {
                if new {
                    self.report.lost += count;
                }
                let meta = Meta { clock: Clock(first), xor: count, ..Meta::default() };
                self.control(node, NoteKind::Resend, Some(meta))?;
            }
        }
        Ok(())
    }

    /// Resends what other nodes asked for, as far as it is still held.
    fn resend_asked(&mut self) -> Result<(), RunError> {
        for (node, first, count) in std::mem::take(&mut self.asked) {
            let (Some(sent), Some(to)) = (self.sent.get(node), self.layout.addrs.get(node)) else { continue };
            let last = first.saturating_add(count.min(in_order::HELD as u64));
            let again: Vec<&[u8]> = (first..last).filter_map(|seq| sent.get(seq)).collect();
            if again.is_empty() {
                continue;
            }
            self.socket
                .send_batch(*to, &again)
                .map_err(|e| RunError::Worker(format!("resending to node `{}`: {e}", self.name(node))))?;
            self.report.resent += again.len() as u64;
            self.report.datagrams_sent += again.len() as u64;
        }
        Ok(())
    }
}
