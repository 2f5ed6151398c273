//! The run-wide renaming of reference endpoints and connections to physical ones: built from
//! matched output frames ([`Renaming`]), then applied to state keys, values and decision
//! subjects ([`Mapping`]).

use sluice_packet::{FiveTuple, FlowKey, Proto};
use sluice_state::{StateKey, Value};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// An endpoint: address, port (0 where the protocol has none; the identifier for ICMP echo) and
/// IP protocol number.
pub(super) type Ep = (IpAddr, u16, u8);

pub(super) fn ep_text((ip, port, proto): Ep) -> String {
    format!("{} {}", Proto(proto), SocketAddr::new(ip, port))
}

/// The run-wide one-to-one renaming of reference *connections* to physical ones, being built:
/// a NAT may give a connection another port and an LB another backend, but every packet of one
/// reference connection must belong to one physical connection, and no two reference
/// connections to the same one. Each pair remembers the input that first established it.
/// Endpoints are renamed (for state keys and subjects) only where that is unambiguous.
#[derive(Default)]
pub(super) struct Renaming {
    fwd: HashMap<(Ep, Ep), ((Ep, Ep), u64)>,
    back: HashMap<(Ep, Ep), ((Ep, Ep), u64)>,
    endpoints: HashMap<Ep, Option<Ep>>,
}

fn conn_text((a, b): (Ep, Ep)) -> String {
    format!("{} <> {}", ep_text(a), ep_text(b))
}

impl Renaming {
    /// Adds the endpoint pairs of one matched packet, or explains why its connection
    /// contradicts the pairs so far.
    pub(super) fn bind(&mut self, pairs: &[(Ep, Ep)], input: u64) -> Result<(), String> {
        for (r, p) in pairs {
            merge(&mut self.endpoints, *r, *p);
        }
        let [(r1, p1), (r2, p2)] = pairs else { return Ok(()) };
        let (r, p) = if r1 <= r2 { ((*r1, *r2), (*p1, *p2)) } else { ((*r2, *r1), (*p2, *p1)) };
        if let Some(&(q, at)) = self.fwd.get(&r) {
            if q != p {
                return Err(format!(
                    "reference connection {} appears as {} here but as {} at input {at}",
                    conn_text(r),
                    conn_text(p),
                    conn_text(q)
                ));
            }
        }
        if let Some(&(s, at)) = self.back.get(&p) {
            if s != r {
                return Err(format!(
                    "physical connection {} stands for reference connection {} here but for {} at input {at}",
                    conn_text(p),
                    conn_text(r),
                    conn_text(s)
                ));
            }
        }
        self.fwd.entry(r).or_insert((p, input));
        self.back.entry(p).or_insert((r, input));
        Ok(())
    }

    pub(super) fn finish(self) -> Mapping {
        let mut m = Mapping::default();
        for (r, p) in self.endpoints {
            let Some(p) = p else {
                m.ports_renamed = true;
                continue;
            };
            if r != p {
                m.renamed += 1;
            }
            if r.1 != p.1 {
                m.ports_renamed = true;
            }
            merge(&mut m.by_addr_port, (r.0, r.1), (p.0, p.1));
            merge(&mut m.by_ip, r.0, p.0);
            m.exact.insert(r, p);
        }
        m
    }
}

/// Records `k → v`, or marks `k` ambiguous (`None`) when it already maps elsewhere.
fn merge<K: std::hash::Hash + Eq, V: PartialEq>(map: &mut HashMap<K, Option<V>>, k: K, v: V) {
    match map.get_mut(&k) {
        None => {
            map.insert(k, Some(v));
        }
        Some(slot) => {
            if slot.as_ref() != Some(&v) {
                *slot = None;
            }
        }
    }
}

/// The finished renaming, with views for keys and values that lack the protocol or the port.
/// Anything not (unambiguously) in it maps to itself.
#[derive(Default)]
pub(super) struct Mapping {
    exact: HashMap<Ep, Ep>,
    /// Address and port, over all protocols; `None` if they disagree.
    by_addr_port: HashMap<(IpAddr, u16), Option<(IpAddr, u16)>>,
    /// Address, over all its endpoints; `None` if they do not all map to one address.
    by_ip: HashMap<IpAddr, Option<IpAddr>>,
    /// Endpoints renamed to another (the identity pairs not counted).
    pub(super) renamed: u64,
    /// Whether some port was renamed, or some endpoint mapped ambiguously: allocation pools
    /// (lists of free ports) then differ legitimately.
    pub(super) ports_renamed: bool,
}

impl Mapping {
    fn endpoint(&self, e: Ep) -> Ep {
        self.exact.get(&e).copied().unwrap_or(e)
    }
    fn addr_port(&self, ip: IpAddr, port: u16) -> (IpAddr, u16) {
        match self.by_addr_port.get(&(ip, port)) {
            Some(Some(x)) => *x,
            _ => (ip, port),
        }
    }
    fn ip(&self, ip: IpAddr) -> IpAddr {
        match self.by_ip.get(&ip) {
            Some(Some(x)) => *x,
            _ => ip,
        }
    }
    fn tuple(&self, t: &FiveTuple) -> FiveTuple {
        let (src, sport, _) = self.endpoint((t.src, t.sport, t.proto.0));
        let (dst, dport, _) = self.endpoint((t.dst, t.dport, t.proto.0));
        FiveTuple { src, dst, sport, dport, proto: t.proto }
    }
    fn flow(&self, k: &FlowKey) -> FlowKey {
        let ((ia, pa), (ib, pb)) = (k.a(), k.b());
        let (src, sport, _) = self.endpoint((ia, pa, k.proto.0));
        let (dst, dport, _) = self.endpoint((ib, pb, k.proto.0));
        if (src, sport, dst, dport) == (ia, pa, ib, pb) {
            // Unchanged: keep the key exactly as the NF built it.
            return *k;
        }
        FlowKey::from(FiveTuple { src, dst, sport, dport, proto: k.proto })
    }
    pub(super) fn key(&self, k: &StateKey) -> StateKey {
        match k {
            StateKey::Endpoint(ip, port, proto) => {
                let (ip, port, proto) = self.endpoint((*ip, *port, *proto));
                StateKey::Endpoint(ip, port, proto)
            }
            StateKey::Flow(f) => StateKey::Flow(self.flow(f)),
            StateKey::Addr(ip) => StateKey::Addr(self.ip(*ip)),
            StateKey::Unit | StateKey::Id(_) => *k,
        }
    }
    /// A reference value in the physical run's names.
    pub(super) fn value(&self, v: &Value) -> Value {
        match v {
            Value::Endpoint(ip, port) => {
                let (ip, port) = self.addr_port(*ip, *port);
                Value::Endpoint(ip, port)
            }
            Value::Tuple(t) => Value::Tuple(self.tuple(t)),
            Value::List(l) => Value::List(l.iter().map(|x| self.value(x)).collect()),
            other => other.clone(),
        }
    }
    /// A decision subject in the physical run's names, if it is exactly an address or an
    /// `address:port`.
    pub(super) fn subject(&self, s: &str) -> String {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return self.ip(ip).to_string();
        }
        if let Ok(sa) = s.parse::<SocketAddr>() {
            let (ip, port) = self.addr_port(sa.ip(), sa.port());
            return SocketAddr::new(ip, port).to_string();
        }
        s.to_string()
    }
}
