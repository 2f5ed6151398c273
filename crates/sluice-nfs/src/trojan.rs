//! Trojan detector: flags a host that, in **chain-entry order**, opens an SSH connection, then
//! downloads an HTML, a ZIP and an EXE file over FTP (in any order among themselves), then shows
//! IRC activity.
//!
//! # Semantics
//!
//! Chain-entry order is the order of the packets' logical clocks (`ctx.clock`, stamped by the
//! root), **not** the order in which packets reach this NF: upstream NFs may delay some flows.
//! The detector therefore records the clock of each observed event per host and decides on
//! clocks, in whatever order packets arrive (CHC R4). Its memory bound is not: forgetting a host
//! after `host_timeout_ms` of packet time without events depends on the order of event times
//! across flows, so a detector with a timeout asks for chain-entry order (`InputOrder::Clock`)
//! where packets can overtake each other. With `host_timeout_ms: 0` it never forgets and takes
//! packets in arrival order, deciding on clocks alone.
//!
//! Events, all attributed to the *client* (the packet's source address):
//!
//! * **SSH**: a TCP SYN (without ACK) to one of `ssh_ports` (default 22).
//! * **FTP download**: a TCP segment to one of `ftp_ports` (default 21) whose payload holds a
//!   `RETR <name>` command line (command case-insensitive) with `<name>` ending (case-insensitive)
//!   in `.html`/`.htm` (HTML), `.zip` (ZIP) or `.exe` (EXE). Several command lines in one segment
//!   are all seen; a command split across segments is not (no reassembly).
//! * **IRC**: a TCP segment to one of `irc_ports` (default 6667) whose payload holds a `NICK`,
//!   `JOIN` or `PRIVMSG` command line (an optional `:prefix` is skipped).
//!
//! A host is flagged when there are clocks `s < h, z, e < i` with `s` an SSH event, `h`, `z`,
//! `e` an HTML, ZIP and EXE download and `i` an IRC event. Any other order, or a missing step,
//! does not flag. A flagged host gets one `trojan` event (subject: the host address). Every
//! packet is forwarded: this is an off-path detector.
//!
//! ## Deciding on clocks with bounded state
//!
//! A smaller `s` and a larger `i` can only help, so with `S` the minimum SSH clock and `I` the
//! maximum IRC clock the condition is: *each* file type has a clock in the open interval
//! `(S, I)`. Later events only lower `S` and raise `I`, so the condition is monotone and a flag
//! is final. Per file type (`S` unknown counts as +∞, `I` unknown as −∞) the clocks split into:
//!
//! * `S < x < I`: the type is satisfied for good; one witness is kept;
//! * `x < I` and `x ≤ S`: such a clock only needs a future `S' < x`, so only the largest is kept;
//! * `x > S` and `x ≥ I`: such a clock only needs a future `I' > x`, so only the smallest is kept;
//! * `I ≤ x ≤ S` (downloads before any SSH, or between a late SSH and an early IRC): any of them
//!   may be the only one inside some future `(S', I')`, so all are kept, up to
//!   `max_clocks_per_type - 2`; on overflow the middle one is dropped.
//!
//! The decision is therefore exact unless a host has more than `max_clocks_per_type - 2`
//! downloads of one type in that last zone, e.g. that many downloads before its first SSH event
//! is observed. In the expected order (SSH, downloads, IRC) each list holds one clock.
//!
//! Clocks compare as unsigned integers: order is meaningful between clocks of one root.
//!
//! The per-host update is one custom operation (`trojan_event`, argument: event kind and clock)
//! that returns whether this update flagged the host, so the decision is atomic even when
//! instances share the object through a store.
//!
//! # State objects
//!
//! | id | name | scope | pattern | value |
//! |---|---|---|---|---|
//! | 0 | `host_events` | src IP (cross-flow) | read/write often | see [`trojan_event`] |
//!
//! # Memory bounds
//!
//! A host's record holds at most `8 + 3 * max_clocks_per_type` integers and is deleted
//! `host_timeout_ms` of packet time after its last event (timer). A host forgotten this way can
//! be flagged again. With `host_timeout_ms: 0` records are kept for the whole run.
//!
//! # Configuration
//!
//! ```yaml
//! type: trojan
//! config:
//!   ssh_ports: [22]
//!   ftp_ports: [21]
//!   irc_ports: [6667]
//!   host_timeout_ms: 3600000   # forget a host after an hour without events (0: never)
//!   max_clocks_per_type: 16    # bound of each file-type clock list
//! ```
//!
//! Drop reasons: none (never drops). Event kinds: `trojan`.

use crate::util::parse_config;
use serde::Deserialize;
use sluice_nf::{
    AccessPattern, BuildCtx, CustomOp, InputOrder, NetworkFunction, NfContext, NfError, ObjectId, Scope, StateDecl,
    StateError, StateKey, TimerFired, Value, Verdict,
};
use sluice_packet::{HeaderField, Packet, Proto, L4};

/// Per client host: clocks of its SSH, FTP-download and IRC events.
pub const HOST_EVENTS: ObjectId = ObjectId(0);

/// Index of the `trojan_event` custom operation.
pub const OP_TROJAN_EVENT: u16 = 0;

/// Event kind: SSH connection opened.
pub const EV_SSH: i64 = 0;
/// Event kind: HTML file downloaded over FTP.
pub const EV_HTML: i64 = 1;
/// Event kind: ZIP file downloaded over FTP.
pub const EV_ZIP: i64 = 2;
/// Event kind: EXE file downloaded over FTP.
pub const EV_EXE: i64 = 3;
/// Event kind: IRC activity.
pub const EV_IRC: i64 = 4;

/// The trojan detector's custom operation.
pub(crate) const CUSTOM_OPS: [CustomOp; 1] = [CustomOp { name: "trojan_event", apply: trojan_event }];

/// Configuration; see the module documentation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// TCP ports whose SYNs are SSH connection openings.
    pub ssh_ports: Vec<u16>,
    /// TCP ports of FTP control connections.
    pub ftp_ports: Vec<u16>,
    /// TCP ports of IRC.
    pub irc_ports: Vec<u16>,
    /// Milliseconds of packet time without events after which a host is forgotten (0: never;
    /// the detector then takes packets in arrival order).
    pub host_timeout_ms: u64,
    /// Bound of each per-type clock list (4 to 1024).
    pub max_clocks_per_type: u16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ssh_ports: vec![22],
            ftp_ports: vec![21],
            irc_ports: vec![6667],
            host_timeout_ms: 3_600_000,
            max_clocks_per_type: 16,
        }
    }
}

/// The Trojan detector. Holds only its configuration.
pub struct Trojan {
    decls: Vec<StateDecl>,
    ops: [CustomOp; 1],
    ssh_ports: Vec<u16>,
    ftp_ports: Vec<u16>,
    irc_ports: Vec<u16>,
    host_timeout_ns: Option<u64>,
    max_clocks: i64,
}

impl Trojan {
    /// Builds the detector from a configuration, validating it.
    pub fn new(c: &Config) -> Result<Trojan, NfError> {
        for (field, ports) in [("ssh_ports", &c.ssh_ports), ("ftp_ports", &c.ftp_ports), ("irc_ports", &c.irc_ports)] {
            if ports.is_empty() {
                return Err(NfError::config(field, "needs at least one port"));
            }
            if ports.contains(&0) {
                return Err(NfError::config(field, "port 0 is not a valid port"));
            }
        }
        if !(4..=1024).contains(&c.max_clocks_per_type) {
            return Err(NfError::config("max_clocks_per_type", "must be between 4 and 1024"));
        }
        Ok(Trojan {
            // The record holds clocks, which another root (or a root that failed and resumed
            // its clock) numbers differently, and which clocks it keeps depends on arrival
            // order: like an allocation, two correct runs hold equivalent, not equal, records.
            decls: vec![StateDecl::new(
                "host_events",
                Scope::fields(&[HeaderField::SrcIp]),
                AccessPattern::ReadWriteOften,
            )
            .allocation()],
            ops: CUSTOM_OPS,
            ssh_ports: c.ssh_ports.clone(),
            ftp_ports: c.ftp_ports.clone(),
            irc_ports: c.irc_ports.clone(),
            host_timeout_ns: (c.host_timeout_ms > 0).then(|| c.host_timeout_ms.saturating_mul(1_000_000)),
            max_clocks: i64::from(c.max_clocks_per_type),
        })
    }

    fn record(&self, kind: i64, pkt: &Packet, ctx: &mut NfContext<'_>) {
        let Some(t) = pkt.tuple() else { return };
        let key = StateKey::Addr(t.src);
        let arg = Value::Ints(vec![kind, ctx.clock.0 as i64, self.max_clocks]);
        let res = ctx.state.custom(HOST_EVENTS, &key, OP_TROJAN_EVENT, arg);
        if let Some(timeout) = self.host_timeout_ns {
            ctx.state.set_timer(HOST_EVENTS, &key, ctx.now_ns.saturating_add(timeout));
        }
        if let Ok(Some(Value::Int(1))) = res {
            ctx.emit("trojan", t.src, "ssh, then ftp downloads of html, zip and exe, then irc (by chain-entry clock)");
        }
    }
}

/// Iterates over the command lines of a text payload: each line trimmed of CR/LF and
/// surrounding blanks, empty lines skipped.
fn lines(payload: &[u8]) -> impl Iterator<Item = &[u8]> {
    payload.split(|&b| b == b'\n').map(trim).filter(|l| !l.is_empty())
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Splits a line into its first blank-separated word and the (trimmed) rest.
fn split_word(line: &[u8]) -> (&[u8], &[u8]) {
    match line.iter().position(|b| *b == b' ' || *b == b'\t') {
        Some(i) => (line.get(..i).unwrap_or(&[]), trim(line.get(i..).unwrap_or(&[]))),
        None => (line, &[]),
    }
}

fn ends_with_ci(s: &[u8], suffix: &[u8]) -> bool {
    s.len() >= suffix.len() && s.get(s.len() - suffix.len()..).is_some_and(|t| t.eq_ignore_ascii_case(suffix))
}

/// The file type of each `RETR` command in an FTP control payload.
pub fn ftp_downloads(payload: &[u8]) -> impl Iterator<Item = i64> + '_ {
    lines(payload).filter_map(|line| {
        let (cmd, name) = split_word(line);
        if !cmd.eq_ignore_ascii_case(b"RETR") {
            return None;
        }
        if ends_with_ci(name, b".html") || ends_with_ci(name, b".htm") {
            Some(EV_HTML)
        } else if ends_with_ci(name, b".zip") {
            Some(EV_ZIP)
        } else if ends_with_ci(name, b".exe") {
            Some(EV_EXE)
        } else {
            None
        }
    })
}

/// Whether an IRC client payload holds a `NICK`, `JOIN` or `PRIVMSG` command.
pub fn irc_activity(payload: &[u8]) -> bool {
    lines(payload).any(|line| {
        let (mut cmd, rest) = split_word(line);
        if cmd.first() == Some(&b':') {
            cmd = split_word(rest).0;
        }
        [&b"NICK"[..], b"JOIN", b"PRIVMSG"].iter().any(|c| cmd.eq_ignore_ascii_case(c))
    })
}

// Layout of a `host_events` record (`Ints`).
const R_FLAGGED: usize = 0;
const R_HAS_SSH: usize = 1;
const R_SSH_MIN: usize = 2;
const R_HAS_IRC: usize = 3;
const R_IRC_MAX: usize = 4;
const R_COUNTS: usize = 5; // three counts: html, zip, exe
const R_LISTS: usize = 8;

/// A decoded `host_events` record.
#[derive(Debug, Default)]
struct HostEvents {
    flagged: bool,
    ssh_min: Option<u64>,
    irc_max: Option<u64>,
    /// Sorted clocks of HTML, ZIP and EXE downloads.
    files: [Vec<u64>; 3],
}

impl HostEvents {
    fn decode(v: &Value) -> Option<HostEvents> {
        let r = v.as_ints()?;
        let flag = |i: usize| r.get(i).map(|&x| x != 0);
        let opt = |has: usize, at: usize| -> Option<Option<u64>> {
            Some(if flag(has)? { Some(*r.get(at)? as u64) } else { None })
        };
        let mut h = HostEvents {
            flagged: flag(R_FLAGGED)?,
            ssh_min: opt(R_HAS_SSH, R_SSH_MIN)?,
            irc_max: opt(R_HAS_IRC, R_IRC_MAX)?,
            ..HostEvents::default()
        };
        let mut at = R_LISTS;
        for (ty, list) in h.files.iter_mut().enumerate() {
            let n = usize::try_from(*r.get(R_COUNTS + ty)?).ok()?;
            let end = at.checked_add(n)?;
            list.extend(r.get(at..end)?.iter().map(|&x| x as u64));
            list.sort_unstable();
            at = end;
        }
        Some(h)
    }

    fn encode(&self) -> Value {
        let mut r = vec![
            i64::from(self.flagged),
            i64::from(self.ssh_min.is_some()),
            self.ssh_min.unwrap_or(0) as i64,
            i64::from(self.irc_max.is_some()),
            self.irc_max.unwrap_or(0) as i64,
        ];
        r.extend(self.files.iter().map(|l| l.len() as i64));
        for l in &self.files {
            r.extend(l.iter().map(|&x| x as i64));
        }
        Value::Ints(r)
    }

    /// Keeps only the clocks that can still matter, within the bound; see the module docs.
    fn compact(&mut self, max: usize) {
        // S unknown behaves as +inf, I unknown as -inf.
        let (s, i) = (self.ssh_min, self.irc_max);
        let above_s = |x: u64| s.is_some_and(|s| x > s);
        let below_i = |x: u64| i.is_some_and(|i| x < i);
        let zone_cap = max.saturating_sub(2).max(1);
        for l in &mut self.files {
            // C: inside (S, I): the type is satisfied for good; one witness is enough.
            if let Some(c) = l.iter().copied().find(|&x| above_s(x) && below_i(x)) {
                l.clear();
                l.push(c);
                continue;
            }
            // A: x < I and x <= S: only the largest can matter (it needs S' < x only).
            let a = l.iter().copied().filter(|&x| below_i(x) && !above_s(x)).max();
            // B: x > S and x >= I: only the smallest can matter (it needs x < I' only).
            let b = l.iter().copied().filter(|&x| above_s(x) && !below_i(x)).min();
            // D: I <= x <= S: each may be the only one inside a future (S', I').
            let mut d: Vec<u64> = l.iter().copied().filter(|&x| !above_s(x) && !below_i(x)).collect();
            d.dedup();
            while d.len() > zone_cap {
                d.remove(d.len() / 2);
            }
            // Sorted: A < I <= D <= S < B.
            l.clear();
            l.extend(a);
            l.extend(d);
            l.extend(b);
        }
    }

    /// Whether every file type has a clock strictly between the first SSH and the last IRC.
    fn matches(&self) -> bool {
        match (self.ssh_min, self.irc_max) {
            (Some(s), Some(i)) => self.files.iter().all(|l| l.iter().any(|&x| s < x && x < i)),
            _ => false,
        }
    }
}

/// The `trojan_event` custom operation on a `host_events` record.
///
/// Argument: `Ints[kind, clock, max_clocks_per_type]` with `kind` one of [`EV_SSH`],
/// [`EV_HTML`], [`EV_ZIP`], [`EV_EXE`], [`EV_IRC`] and the clock's bits as `i64`.
/// Result: `Int(1)` if this update flagged the host, else `Int(0)`.
///
/// Record: `Ints[flagged, has_ssh, min_ssh_clock, has_irc, max_irc_clock, n_html, n_zip, n_exe,
/// html clocks.., zip clocks.., exe clocks..]`, clocks stored as their bits.
pub fn trojan_event(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let Some(&[kind, clock, max]) = arg.as_ints() else {
        return Err(StateError::Custom("trojan_event: argument must be Ints[kind, clock, max]"));
    };
    let clock = clock as u64;
    // An unreadable record (e.g. from another version) restarts the host.
    let mut h = slot.as_ref().and_then(HostEvents::decode).unwrap_or_default();
    if h.flagged {
        return Ok(Some(Value::Int(0)));
    }
    match kind {
        EV_SSH => h.ssh_min = Some(h.ssh_min.map_or(clock, |s| s.min(clock))),
        EV_IRC => h.irc_max = Some(h.irc_max.map_or(clock, |i| i.max(clock))),
        EV_HTML | EV_ZIP | EV_EXE => {
            let Some(list) = h.files.get_mut((kind - EV_HTML) as usize) else {
                return Err(StateError::Custom("trojan_event: bad kind"));
            };
            if let Err(pos) = list.binary_search(&clock) {
                list.insert(pos, clock);
            }
        }
        _ => return Err(StateError::Custom("trojan_event: bad kind")),
    }
    h.compact(usize::try_from(max).unwrap_or(4));
    let now_flagged = h.matches();
    h.flagged = now_flagged;
    *slot = Some(h.encode());
    Ok(Some(Value::Int(i64::from(now_flagged))))
}

impl NetworkFunction for Trojan {
    fn kind(&self) -> &'static str {
        "trojan"
    }

    fn state_objects(&self) -> &[StateDecl] {
        &self.decls
    }

    fn custom_ops(&self) -> &[CustomOp] {
        &self.ops
    }

    /// The detection itself is decided on clocks, but forgetting a host after
    /// `host_timeout_ms` of packet time without events is not: a packet that overtook earlier
    /// ones of other flows would fire (or re-arm) the host's timer out of time order and drop
    /// events the logical chain keeps. A detector that never forgets takes arrival order.
    fn input_order(&self) -> InputOrder {
        if self.host_timeout_ns.is_some() {
            InputOrder::Clock
        } else {
            InputOrder::Arrival
        }
    }

    fn process(&self, pkt: &mut Packet, ctx: &mut NfContext<'_>) -> Verdict {
        let Some(t) = pkt.tuple() else { return Verdict::Forward };
        if pkt.hdr().l4 != L4::Tcp || t.proto != Proto::TCP {
            return Verdict::Forward;
        }
        let flags = pkt.hdr().tcp_flags;
        if self.ssh_ports.contains(&t.dport) && flags.syn() && !flags.ack() {
            self.record(EV_SSH, pkt, ctx);
        }
        if pkt.payload().is_empty() {
            return Verdict::Forward;
        }
        if self.ftp_ports.contains(&t.dport) {
            // At most one update per file type per packet.
            let mut seen = [false; 3];
            for kind in ftp_downloads(pkt.payload()) {
                if let Some(s) = seen.get_mut((kind - EV_HTML) as usize) {
                    *s = true;
                }
            }
            for (i, s) in seen.iter().enumerate() {
                if *s {
                    self.record(EV_HTML + i as i64, pkt, ctx);
                }
            }
        }
        if self.irc_ports.contains(&t.dport) && irc_activity(pkt.payload()) {
            self.record(EV_IRC, pkt, ctx);
        }
        Verdict::Forward
    }

    fn on_timer(&self, fired: TimerFired, ctx: &mut NfContext<'_>) {
        if fired.object == HOST_EVENTS {
            let _ = ctx.state.delete(HOST_EVENTS, &fired.key);
        }
    }
}

/// Builds an instance from its config.
pub fn build(config: &serde_yaml::Value, _ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    let c: Config = parse_config(config)?;
    Ok(Box::new(Trojan::new(&c)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(events: &[(i64, u64)], max: i64) -> Vec<i64> {
        let mut slot = None;
        events
            .iter()
            .map(|&(k, c)| {
                trojan_event(&mut slot, &Value::Ints(vec![k, c as i64, max]))
                    .ok()
                    .flatten()
                    .and_then(|v| v.as_int())
                    .unwrap_or(-1)
            })
            .collect()
    }

    /// Brute force over all witnesses.
    fn brute(events: &[(i64, u64)]) -> bool {
        let of = |k: i64| events.iter().filter(move |e| e.0 == k).map(|e| e.1);
        of(EV_SSH).any(|s| of(EV_IRC).any(|i| [EV_HTML, EV_ZIP, EV_EXE].iter().all(|&t| of(t).any(|x| s < x && x < i))))
    }

    #[test]
    fn parsers() {
        let p = b"USER x\r\nRETR /a/B.HTM\r\nretr c.zip\r\nRETR d.exe.txt\r\nRETR e.Exe\r\n";
        assert_eq!(ftp_downloads(p).collect::<Vec<_>>(), vec![EV_HTML, EV_ZIP, EV_EXE]);
        assert!(irc_activity(b"USER a * * :a\r\nNICK bob\r\n"));
        assert!(irc_activity(b":nick!u@h privmsg #c :hi\r\n"));
        assert!(!irc_activity(b"PING :x\r\nNICKNAME x\r\n"));
        assert_eq!(ftp_downloads(b"RETR").count(), 0);
    }

    #[test]
    fn flags_once_in_order_only() {
        let good = [(EV_SSH, 1), (EV_ZIP, 5), (EV_HTML, 3), (EV_EXE, 7), (EV_IRC, 9), (EV_IRC, 10)];
        assert_eq!(feed(&good, 16), vec![0, 0, 0, 0, 1, 0]);
        let late_ssh = [(EV_ZIP, 5), (EV_HTML, 3), (EV_EXE, 7), (EV_IRC, 9), (EV_SSH, 4)];
        assert!(!feed(&late_ssh, 16).contains(&1));
        // Arrival order differs from clock order: the SSH with the smallest clock comes last.
        let reordered = [(EV_IRC, 9), (EV_ZIP, 5), (EV_HTML, 3), (EV_EXE, 7), (EV_SSH, 2)];
        assert_eq!(feed(&reordered, 16).last(), Some(&1));
    }

    #[test]
    fn lists_stay_bounded() {
        let mut slot = None;
        for c in 0..500u64 {
            let kind = [EV_HTML, EV_ZIP, EV_EXE][(c % 3) as usize];
            let _ = trojan_event(&mut slot, &Value::Ints(vec![kind, c as i64, 4]));
        }
        assert!(slot.as_ref().and_then(|v| v.as_ints()).is_some_and(|r| r.len() <= 8 + 3 * 4));
        // Still decides: an SSH before the last downloads and an IRC after them.
        let _ = trojan_event(&mut slot, &Value::Ints(vec![EV_SSH, 490, 4]));
        let r = trojan_event(&mut slot, &Value::Ints(vec![EV_IRC, 600, 4]));
        assert_eq!(r.ok().flatten(), Some(Value::Int(1)));
    }

    #[test]
    fn matches_brute_force_on_random_sequences() {
        // Deterministic LCG; sequences short enough for lists never to overflow.
        let mut x: u64 = 0x1234_5678;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        for _ in 0..3000 {
            let n = 1 + next() % 12;
            let mut ev = Vec::new();
            let mut used = std::collections::BTreeSet::new();
            for _ in 0..n {
                let c = next() % 40;
                if used.insert(c) {
                    ev.push(((next() % 5) as i64, c));
                }
            }
            let got = feed(&ev, 16).contains(&1);
            assert_eq!(got, brute(&ev), "{ev:?}");
        }
    }
}
