//! Helpers for the NAT, load-balancer and firewall tests: instances whose local state stays
//! inspectable, and independent checksum verification.
#![allow(dead_code)]

use sluice_nf::{
    BuildCtx, Instance, LabelTable, ObjectId, StateError, StateHandle, StateKey, StateOp, TimerFired, Value,
};
use sluice_packet::{InstanceId, Meta, Packet};
use sluice_state::LocalState;
use std::sync::{Arc, Mutex};

/// A [`StateHandle`] over a [`LocalState`] the test keeps a second reference to, so it can look
/// at object sizes and timers while the instance owns the handle.
#[derive(Clone)]
pub struct Probe(pub Arc<Mutex<LocalState>>);

impl Probe {
    /// Number of values in `obj`.
    pub fn len(&self, obj: ObjectId) -> usize {
        self.0.lock().unwrap().len(obj)
    }
    /// Number of armed timers.
    pub fn timers(&self) -> usize {
        self.0.lock().unwrap().timers_armed()
    }
    /// Reads a value.
    pub fn get(&self, obj: ObjectId, key: StateKey) -> Option<Value> {
        self.0.lock().unwrap().get(obj, &key).unwrap()
    }
}

impl StateHandle for Probe {
    fn exec(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        self.0.lock().unwrap().exec(obj, key, op)
    }
    fn set_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
        self.0.lock().unwrap().set_timer(obj, key, deadline_ns)
    }
    fn cancel_timer(&mut self, obj: ObjectId, key: &StateKey) {
        self.0.lock().unwrap().cancel_timer(obj, key)
    }
    fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>) {
        self.0.lock().unwrap().expired(now_ns, max, out)
    }
}

/// Builds instance `index` of `count` of NF `kind` from YAML `config`, with probed local state.
pub fn instance_of(kind: &str, config: &str, index: u16, count: u16) -> (Instance, Probe) {
    let config: serde_yaml::Value = serde_yaml::from_str(config).expect("yaml");
    let mut labels = LabelTable::default();
    let mut bctx =
        BuildCtx { vertex: kind, instance: index, instances: count, labels: &mut labels, shared_state: false };
    let nf = sluice_nfs::registry().build(kind, &config, &mut bctx).expect("build");
    let probe = Probe(Arc::new(Mutex::new(LocalState::new(nf.state_objects(), nf.custom_ops()))));
    let inst = Instance::new(nf, Box::new(probe.clone()), kind.into(), InstanceId::new(0, index), Arc::new(labels));
    (inst, probe)
}

/// [`instance_of`] for a single instance.
pub fn instance(kind: &str, config: &str) -> (Instance, Probe) {
    instance_of(kind, config, 0, 1)
}

fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    acc
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Recomputes, from scratch, the IPv4 header checksum and the TCP/UDP/ICMP checksum of an
/// untagged Ethernet/IPv4 frame, and tells whether both verify. `None` if not IPv4 or cut short.
pub fn checksums_ok(frame: &[u8]) -> Option<bool> {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ip.len() < total || total < ihl {
        return None;
    }
    let hdr_ok = fold(sum16(&ip[..ihl], 0)) == 0xffff;
    let proto = ip[9];
    let l4 = &ip[ihl..total];
    let l4_ok = match proto {
        6 | 17 => {
            if proto == 17 && l4.len() >= 8 && l4[6..8] == [0, 0] {
                true
            } else {
                let mut acc = sum16(&ip[12..20], 0);
                acc += u32::from(proto) + l4.len() as u32;
                fold(sum16(l4, acc)) == 0xffff
            }
        }
        1 => fold(sum16(l4, 0)) == 0xffff,
        _ => true,
    };
    Some(hdr_ok && l4_ok)
}

/// Packets with their original index whose checksums verified before any rewrite (captures
/// may hold packets with offloaded, i.e. wrong, checksums).
pub fn valid_before(pkts: &[Packet]) -> Vec<bool> {
    pkts.iter().map(|p| checksums_ok(p.data()) == Some(true)).collect()
}

/// Moves `inst` to packet time `now_ns` and fires every timer due (the runtime fires at most
/// 64 per packet, so this repeats until a round fires none).
pub fn advance_all(inst: &mut sluice_nf::Instance, probe: &Probe, now_ns: u64) {
    loop {
        let before = probe.timers();
        inst.advance_time(now_ns, Default::default());
        if probe.timers() == before {
            return;
        }
    }
}

/// A packet at time `ts_ns` built from raw bytes.
pub fn raw(bytes: &[u8], ts_ns: u64) -> Packet {
    Packet::from_slice(bytes, Meta { ts_ns, ..Meta::default() })
}

fn ipv4_frame(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00];
    let total = (20 + l4.len()) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0, 0, 64, proto, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = !fold(sum16(&ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(l4);
    f
}

/// An Ethernet/IPv4/UDP frame with valid checksums.
pub fn udp_frame(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = (8 + payload.len()) as u16;
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&len.to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    let mut acc = sum16(&src, 0);
    acc = sum16(&dst, acc) + 17 + u32::from(len);
    let mut c = !fold(sum16(&u, acc));
    if c == 0 {
        c = 0xffff;
    }
    u[6..8].copy_from_slice(&c.to_be_bytes());
    ipv4_frame(src, dst, 17, &u)
}

/// An Ethernet/IPv4/ICMP echo request (`ty` 8) or reply (`ty` 0) with valid checksums.
pub fn icmp_echo_frame(src: [u8; 4], dst: [u8; 4], ty: u8, id: u16, seq: u16) -> Vec<u8> {
    let mut m = vec![ty, 0, 0, 0];
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(b"sluice-ping-data");
    let c = !fold(sum16(&m, 0));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4_frame(src, dst, 1, &m)
}
