//! Portscan detector: Threshold Random Walk (sequential hypothesis testing) on the outcomes of
//! the TCP connection attempts each source host makes.
//!
//! # Semantics
//!
//! * A **connection attempt** is a TCP SYN without ACK from host A to B:port. It is recorded as
//!   *pending*, with its packet time, under the connection's flow key.
//! * Its **outcome** is decided by the first packet of that connection coming back from B:
//!   an RST means *failure*, anything else (normally the SYN-ACK) means *success*. No reply within
//!   `timeout_ms` of packet time is a *failure* (a timer, not polling). Packets A sends itself
//!   before any reply (e.g. retransmitted SYNs) do not decide the outcome and are not counted
//!   twice. Only TCP is tested; UDP and ICMP unreachables are not interpreted.
//! * **First contacts only** (`first_contact: true`, the default): as in TRW, only the first
//!   attempt from A to a given destination is counted, so a benign host retrying a dead service
//!   is not punished for each retry. The destination is the *service* (B, port, protocol) rather
//!   than the host B, so that vertical scans (one target, many ports) are caught as well as
//!   horizontal ones. With `first_contact: false` every attempt counts.
//! * Per source host the detector keeps the log-likelihood ratio
//!   `Λ = Σ ln(P(outcome | scanner) / P(outcome | benign))`: a success adds `ln(θ1/θ0)`, a failure
//!   adds `ln((1-θ1)/(1-θ0))`. With `η1 = PD/PF` and `η0 = (1-PD)/(1-PF)`:
//!   - `Λ ≥ ln η1`: the host is a **scanner**. A `portscan` event (subject: the host address) is
//!     emitted exactly once, and with `block: true` every later packet *from* that host is
//!     dropped with reason `portscan-blocked` (packets to it are forwarded).
//!   - `Λ ≤ ln η0`: the host is judged **benign** for this walk; the walk restarts at `Λ = 0` so
//!     that a host that starts scanning later is still caught.
//!
//!   With the defaults (θ0 = 0.8, θ1 = 0.2, PF = 0.01, PD = 0.99) each step is ±ln 4 and the
//!   thresholds are ±ln 99, so four failed first contacts in a row flag a host.
//! * The per-host update is a single custom operation (`trw_update`, argument: the step and the
//!   thresholds) that returns whether this very update crossed `η1`, so instances sharing the
//!   host object through a store need no locks and the event is emitted once.
//! * Log-likelihoods are kept in fixed point (micro-nats) so state is exact and deterministic.
//!
//! # State objects
//!
//! | id | name | scope | pattern | value |
//! |---|---|---|---|---|
//! | 0 | `host_likelihood` | src IP (cross-flow) | read/write often | `Ints[llr_micro, status, failures, successes, last_update_ns]` |
//! | 1 | `pending` | per flow | read/write often | `Ints[initiator_side, syn_ns]` (side 0: `FlowKey::a`) |
//! | 2 | `first_contacts` | src IP, dst IP, dst port, proto | read-heavy | `Ints[first_seen_ns]` |
//!
//! `first_contacts` is keyed by a *directional* [`FlowKey`] built as `a = (src, 0)`,
//! `b = (dst, dport)`: the pair "host A contacted service B:port".
//!
//! # Memory bounds
//!
//! * `pending`: removed on the reply or by its timer after `timeout_ms`.
//! * `host_likelihood`: removed `host_timeout_ms` after the host's last resolved attempt. This is
//!   also how long a block lasts (a blocked host's SYNs are dropped, so they resolve nothing).
//! * `first_contacts`: each entry is removed `host_timeout_ms` after it was created.
//!
//! # Configuration
//!
//! ```yaml
//! type: portscan
//! config:
//!   theta0: 0.8             # P(attempt succeeds | benign host)
//!   theta1: 0.2             # P(attempt succeeds | scanner); must be < theta0
//!   p_false_positive: 0.01  # PF, target false positive rate
//!   p_detection: 0.99       # PD, target detection rate; must be > p_false_positive
//!   timeout_ms: 5000        # an unanswered SYN counts as a failure after this long
//!   host_timeout_ms: 600000 # forget a host (and lift its block) after this long
//!   first_contact: true     # count only the first attempt per (host, service)
//!   block: true             # drop packets from flagged hosts
//! ```
//!
//! Drop reasons: `portscan-blocked`. Event kinds: `portscan`.

use crate::util::parse_config;
use serde::Deserialize;
use sluice_nf::{
    AccessPattern, BuildCtx, CustomOp, InputOrder, NetworkFunction, NfContext, NfError, ObjectId, Scope, StateDecl,
    StateError, StateKey, StateOp, TimerFired, Value, Verdict,
};
use sluice_packet::{FlowKey, HeaderField, Packet, Proto, L4};
use std::net::IpAddr;

/// Per source host: the walk's log-likelihood ratio and status.
pub const HOST_LIKELIHOOD: ObjectId = ObjectId(0);
/// Per connection: the pending initiation.
pub const PENDING: ObjectId = ObjectId(1);
/// Per (source host, destination service): first contacts already counted.
pub const FIRST_CONTACTS: ObjectId = ObjectId(2);

/// Index of the `trw_update` custom operation.
pub const OP_TRW_UPDATE: u16 = 0;

/// Fixed-point scale of log-likelihoods: micro-nats.
pub const LLR_SCALE: f64 = 1_000_000.0;

/// `host_likelihood` status: still testing.
pub const STATUS_TESTING: i64 = 0;
/// `host_likelihood` status: flagged as a scanner.
pub const STATUS_SCANNER: i64 = 1;

/// `trw_update` decision: no threshold crossed.
pub const DECISION_NONE: i64 = 0;
/// `trw_update` decision: this update flagged the host.
pub const DECISION_SCANNER: i64 = 1;
/// `trw_update` decision: this update judged the host benign (the walk restarted).
pub const DECISION_BENIGN: i64 = 2;

/// The scan detector's custom operation.
pub(crate) const CUSTOM_OPS: [CustomOp; 1] = [CustomOp { name: "trw_update", apply: trw_update }];

/// Configuration; see the module documentation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// P(attempt succeeds | benign).
    pub theta0: f64,
    /// P(attempt succeeds | scanner).
    pub theta1: f64,
    /// Target false positive probability PF.
    pub p_false_positive: f64,
    /// Target detection probability PD.
    pub p_detection: f64,
    /// Milliseconds of packet time after which an unanswered SYN is a failure.
    pub timeout_ms: u64,
    /// Milliseconds of packet time after which a host's state (and block) is forgotten.
    pub host_timeout_ms: u64,
    /// Count only the first attempt per (source host, destination service).
    pub first_contact: bool,
    /// Drop packets from flagged hosts.
    pub block: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            theta0: 0.8,
            theta1: 0.2,
            p_false_positive: 0.01,
            p_detection: 0.99,
            timeout_ms: 5_000,
            host_timeout_ms: 600_000,
            first_contact: true,
            block: true,
        }
    }
}

/// The portscan detector. Holds only its configuration, pre-computed in fixed point.
pub struct Portscan {
    decls: Vec<StateDecl>,
    ops: [CustomOp; 1],
    /// Step added on a success, micro-nats.
    step_success: i64,
    /// Step added on a failure, micro-nats.
    step_failure: i64,
    /// ln η1, micro-nats.
    ln_eta1: i64,
    /// ln η0, micro-nats.
    ln_eta0: i64,
    timeout_ns: u64,
    host_timeout_ns: u64,
    first_contact: bool,
    block: bool,
}

fn fixed(x: f64) -> i64 {
    (x * LLR_SCALE).round() as i64
}

fn check_prob(field: &str, v: f64) -> Result<(), NfError> {
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(())
    } else {
        Err(NfError::config(field, format!("must be strictly between 0 and 1, got {v}")))
    }
}

impl Portscan {
    /// Builds the detector from a validated configuration.
    pub fn new(c: &Config) -> Result<Portscan, NfError> {
        check_prob("theta0", c.theta0)?;
        check_prob("theta1", c.theta1)?;
        check_prob("p_false_positive", c.p_false_positive)?;
        check_prob("p_detection", c.p_detection)?;
        if c.theta1 >= c.theta0 {
            return Err(NfError::config("theta1", "must be below theta0 (scanners succeed less often)"));
        }
        if c.p_detection <= c.p_false_positive {
            return Err(NfError::config("p_detection", "must be above p_false_positive"));
        }
        if c.timeout_ms == 0 {
            return Err(NfError::config("timeout_ms", "must be positive"));
        }
        if c.host_timeout_ms == 0 {
            return Err(NfError::config("host_timeout_ms", "must be positive"));
        }
        let eta1 = c.p_detection / c.p_false_positive;
        let eta0 = (1.0 - c.p_detection) / (1.0 - c.p_false_positive);
        Ok(Portscan {
            decls: vec![
                StateDecl::new("host_likelihood", Scope::fields(&[HeaderField::SrcIp]), AccessPattern::ReadWriteOften)
                    .idle_timers(c.host_timeout_ms.saturating_mul(1_000_000)),
                StateDecl::new("pending", Scope::per_flow(), AccessPattern::ReadWriteOften),
                StateDecl::new(
                    "first_contacts",
                    Scope::fields(&[HeaderField::SrcIp, HeaderField::DstIp, HeaderField::DstPort, HeaderField::Proto]),
                    AccessPattern::ReadHeavy,
                ),
            ],
            ops: CUSTOM_OPS,
            step_success: fixed((c.theta1 / c.theta0).ln()),
            step_failure: fixed(((1.0 - c.theta1) / (1.0 - c.theta0)).ln()),
            ln_eta1: fixed(eta1.ln()),
            ln_eta0: fixed(eta0.ln()),
            timeout_ns: c.timeout_ms.saturating_mul(1_000_000),
            host_timeout_ns: c.host_timeout_ms.saturating_mul(1_000_000),
            first_contact: c.first_contact,
            block: c.block,
        })
    }

    /// Feeds one outcome for `host` into its walk and reports a crossing of η1.
    fn outcome(&self, host: IpAddr, failure: bool, ctx: &mut NfContext<'_>) {
        let step = if failure { self.step_failure } else { self.step_success };
        let arg = Value::Ints(vec![step, self.ln_eta1, self.ln_eta0, ctx.now_ns as i64]);
        let key = StateKey::Addr(host);
        let res = ctx.state.custom(HOST_LIKELIHOOD, &key, OP_TRW_UPDATE, arg);
        ctx.state.set_timer(HOST_LIKELIHOOD, &key, ctx.now_ns.saturating_add(self.host_timeout_ns));
        let Ok(Some(Value::Ints(r))) = res else { return };
        if let [DECISION_SCANNER, llr, failures, successes, ..] = r.as_slice() {
            let detail = format!(
                "log-likelihood {:.3} >= {:.3} after {failures} failures, {successes} successes",
                *llr as f64 / LLR_SCALE,
                self.ln_eta1 as f64 / LLR_SCALE
            );
            ctx.emit("portscan", host, detail);
        }
    }

    fn is_blocked(&self, host: IpAddr, ctx: &mut NfContext<'_>) -> bool {
        if !self.block {
            return false;
        }
        matches!(
            ctx.state.get(HOST_LIKELIHOOD, &StateKey::Addr(host)),
            Ok(Some(Value::Ints(r))) if r.get(1) == Some(&STATUS_SCANNER)
        )
    }
}

/// Index of the `Ints` fields of a `host_likelihood` record.
const H_LLR: usize = 0;
const H_STATUS: usize = 1;
const H_FAIL: usize = 2;
const H_SUCC: usize = 3;
const H_LAST: usize = 4;
const H_LEN: usize = 5;

/// The `trw_update` custom operation on a `host_likelihood` record.
///
/// Argument: `Ints[step, ln_eta1, ln_eta0, now_ns]` (micro-nats); a positive step is a failure.
/// Result: `Ints[decision, llr, failures, successes]` with `decision` one of
/// [`DECISION_NONE`], [`DECISION_SCANNER`] (this update crossed η1), [`DECISION_BENIGN`]
/// (this update crossed η0 and restarted the walk). A flagged host's record no longer changes
/// except for its timestamp, so [`DECISION_SCANNER`] is returned once per record.
pub fn trw_update(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let Some(&[step, ln_eta1, ln_eta0, now]) = arg.as_ints() else {
        return Err(StateError::Custom("trw_update: argument must be Ints[step, ln_eta1, ln_eta0, now]"));
    };
    let mut rec = match slot.take() {
        Some(Value::Ints(v)) if v.len() == H_LEN => v,
        // Absent or unreadable (e.g. written by another version): start a fresh walk.
        _ => vec![0; H_LEN],
    };
    let mut decision = DECISION_NONE;
    rec[H_LAST] = now;
    if rec[H_STATUS] != STATUS_SCANNER {
        if step > 0 {
            rec[H_FAIL] = rec[H_FAIL].saturating_add(1);
        } else {
            rec[H_SUCC] = rec[H_SUCC].saturating_add(1);
        }
        rec[H_LLR] = rec[H_LLR].saturating_add(step);
        if rec[H_LLR] >= ln_eta1 {
            rec[H_STATUS] = STATUS_SCANNER;
            decision = DECISION_SCANNER;
        } else if rec[H_LLR] <= ln_eta0 {
            rec[H_LLR] = 0;
            decision = DECISION_BENIGN;
        }
    }
    let out = Value::Ints(vec![decision, rec[H_LLR], rec[H_FAIL], rec[H_SUCC]]);
    *slot = Some(Value::Ints(rec));
    Ok(Some(out))
}

/// The host that initiated the pending connection `key`, from its record.
fn initiator(key: &FlowKey, rec: &Value) -> Option<(IpAddr, u16)> {
    match rec.as_ints()?.first()? {
        0 => Some(key.a()),
        _ => Some(key.b()),
    }
}

impl NetworkFunction for Portscan {
    fn kind(&self) -> &'static str {
        "portscan"
    }

    fn state_objects(&self) -> &[StateDecl] {
        &self.decls
    }

    fn custom_ops(&self) -> &[CustomOp] {
        &self.ops
    }

    /// A host's walk, the point at which it crosses a threshold, and so which of its packets
    /// are blocked, depend on the order of its connection outcomes across flows (CHC R4).
    fn input_order(&self) -> InputOrder {
        InputOrder::Clock
    }

    fn process(&self, pkt: &mut Packet, ctx: &mut NfContext<'_>) -> Verdict {
        let Some(t) = pkt.tuple() else { return Verdict::Forward };
        if self.is_blocked(t.src, ctx) {
            return Verdict::Drop("portscan-blocked");
        }
        if pkt.hdr().l4 != L4::Tcp || t.proto != Proto::TCP {
            return Verdict::Forward;
        }
        let flags = pkt.hdr().tcp_flags;
        let Some(fk) = pkt.flow_key() else { return Verdict::Forward };
        let pkey = StateKey::Flow(fk);
        if flags.syn() && !flags.ack() {
            // A connection attempt.
            if self.first_contact {
                let contact = FlowKey::new((t.src, 0), (t.dst, t.dport), t.proto);
                let ckey = StateKey::Flow(contact);
                let op = StateOp::CompareAndSet { expect: None, new: Value::Ints(vec![ctx.now_ns as i64]) };
                match ctx.state.exec(FIRST_CONTACTS, &ckey, op) {
                    Ok(Some(Value::Int(1))) => {
                        ctx.state.set_timer(FIRST_CONTACTS, &ckey, ctx.now_ns.saturating_add(self.host_timeout_ns));
                    }
                    // Not a first contact (or state unavailable): not counted.
                    _ => return Verdict::Forward,
                }
            }
            let side = i64::from(!fk.source_is_a(&t));
            let op = StateOp::CompareAndSet { expect: None, new: Value::Ints(vec![side, ctx.now_ns as i64]) };
            if let Ok(Some(Value::Int(1))) = ctx.state.exec(PENDING, &pkey, op) {
                ctx.state.set_timer(PENDING, &pkey, ctx.now_ns.saturating_add(self.timeout_ns));
            }
            return Verdict::Forward;
        }
        // Any other TCP packet may be the reply that decides a pending attempt. Read first: the
        // initiator's own packets before any reply, and every packet after it, change nothing,
        // and so write nothing (with its state in a store, a rewrite a packet is a write back).
        let Ok(Some(rec)) = ctx.state.get(PENDING, &pkey) else { return Verdict::Forward };
        match initiator(&fk, &rec) {
            // The initiator again, before any reply: still pending (its timer stays armed).
            Some(init) if init == (t.src, t.sport) => {}
            Some(init) => {
                // Only the caller that removes the attempt counts its outcome.
                let taken = matches!(ctx.state.delete(PENDING, &pkey), Ok(Some(_)));
                ctx.state.cancel_timer(PENDING, &pkey);
                if taken {
                    self.outcome(init.0, flags.rst(), ctx);
                }
            }
            None => {
                let _ = ctx.state.delete(PENDING, &pkey);
                ctx.state.cancel_timer(PENDING, &pkey);
            }
        }
        Verdict::Forward
    }

    fn on_timer(&self, fired: TimerFired, ctx: &mut NfContext<'_>) {
        match fired.object {
            PENDING => {
                let StateKey::Flow(fk) = fired.key else { return };
                if let Ok(Some(rec)) = ctx.state.delete(PENDING, &fired.key) {
                    if let Some(init) = initiator(&fk, &rec) {
                        self.outcome(init.0, true, ctx);
                    }
                }
            }
            HOST_LIKELIHOOD | FIRST_CONTACTS => {
                let _ = ctx.state.delete(fired.object, &fired.key);
            }
            _ => {}
        }
    }
}

/// Builds an instance from its config.
pub fn build(config: &serde_yaml::Value, _ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    let c: Config = parse_config(config)?;
    Ok(Box::new(Portscan::new(&c)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_flags_once_and_restarts_on_benign() {
        let mut slot = None;
        let fail = Value::Ints(vec![1_386_294, 4_595_120, -4_595_120, 7]);
        let ok = Value::Ints(vec![-1_386_294, 4_595_120, -4_595_120, 8]);
        for _ in 0..3 {
            let r = trw_update(&mut slot, &fail).ok().flatten();
            assert_eq!(r.and_then(|v| v.as_ints().map(|x| x[0])), Some(DECISION_NONE));
        }
        // Back down: 3 failures then 7 successes cross η0 once.
        let mut decisions = Vec::new();
        for _ in 0..7 {
            let r = trw_update(&mut slot, &ok).ok().flatten();
            decisions.push(r.and_then(|v| v.as_ints().map(|x| x[0])).unwrap_or(-1));
        }
        assert_eq!(decisions.iter().filter(|&&d| d == DECISION_BENIGN).count(), 1);
        let mut slot = None;
        let mut flagged = 0;
        for _ in 0..10 {
            let r = trw_update(&mut slot, &fail).ok().flatten();
            if r.and_then(|v| v.as_ints().map(|x| x[0])) == Some(DECISION_SCANNER) {
                flagged += 1;
            }
        }
        assert_eq!(flagged, 1);
        assert!(trw_update(&mut slot, &Value::Int(3)).is_err());
    }

    #[test]
    fn config_validation() {
        let bad = |y: &str| build(&serde_yaml::from_str(y).unwrap_or(serde_yaml::Value::Null), &mut dummy()).is_err();
        assert!(bad("theta0: 0.1\ntheta1: 0.2"));
        assert!(bad("p_detection: 0.001"));
        assert!(bad("timeout_ms: 0"));
        assert!(bad("bogus: 1"));
        assert!(!bad("timeout_ms: 100"));
    }

    fn dummy() -> BuildCtx<'static> {
        let labels = Box::leak(Box::default());
        BuildCtx { vertex: "p", instance: 0, instances: 1, labels, shared_state: false }
    }
}
