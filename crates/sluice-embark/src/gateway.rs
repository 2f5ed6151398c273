//! The enterprise gateway: packets to the provider are encrypted field by field, packets back
//! from it are decrypted and restored.
//!
//! # The encrypted packet
//!
//! ```text
//! Ethernet (fixed gateway MACs) | IPv6: src = PM(src), dst = PM(dst), next header 60
//! | Destination Options: option 0x1E = generation ‖ nonce ‖ GCM tag ‖ sealed originals
//! | transport header with PM(sport), PM(dport), checksum recomputed | AES-GCM(payload)
//! ```
//!
//! `PM` is PrefixMatch under the connection's seed. The sealed originals are the original
//! Ethernet header, IP header, transport header and Ethernet trailer; the payload is encrypted
//! in place in the same AES-GCM operation, so the packet grows only by the IPv6 header
//! difference and the option. Option type 0x1E is an experimental type (RFC 4727) whose top
//! bits say "skip if unknown", so every IPv6 stack and NF passes it.
//!
//! # The way back
//!
//! The gateway opens the option (a wrong key, a changed payload or a packet from another
//! generation fail here), rebuilds the original frame, and recomputes what the provider should
//! have seen. A field still equal to its encryption is left as originally sent; an address the
//! provider rewrote must be one of the *pool* values the gateway handed out (a NAT's public
//! address, a load balancer's backend) and is replaced by its plaintext, with the port the NF
//! wrote; the rewrite uses [`Packet::rewrite_src`] / [`Packet::rewrite_dst`], the same
//! incremental checksum update the NFs use on plaintext, so the bytes equal what the plaintext
//! chain would have produced.

use crate::conns::ConnTable;
use crate::keys::{v6_bits, FlowKeyer, FlowPrf, MasterKey};
use crate::keyword::{KeywordKey, TokenRecord, TOKEN_PROTO};
use crate::prefixmatch::PrefixMatch;
use crate::tokenizer::{Tokenizer, TokenizerConfig};
use crate::EmbarkError;
use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes256Gcm, KeyInit};
use sluice_packet::{FiveTuple, Packet, L4};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};

/// IPv6 destination option type carrying the sealed originals.
pub const OPTION_TYPE: u8 = 0x1e;
const ETH_LEN: usize = 14;
const IP6_LEN: usize = 40;
const GW_MAC_DST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const GW_MAC_SRC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Largest sealed-originals block (an option holds 255 bytes, 32 of them fixed).
const MAX_META: usize = 255 - 32;
/// Tokens per record, so that a record fits one IPv6 packet (13 bytes each).
const TOKENS_PER_RECORD: usize = 4_800;

/// A value the provider may write into packets, and its plaintext.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PoolEntry {
    /// The plaintext address.
    pub plain: IpAddr,
    /// Its fixed encryption.
    pub enc: Ipv6Addr,
}

/// The gateway's secret state besides the key: interval maps, pool, tokenizer settings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GatewayState {
    /// [`MasterKey::id`] of the key the state was made with.
    pub key_id: String,
    /// Rule generation; bumped by every re-encryption of the rules.
    pub generation: u32,
    /// PrefixMatch map of addresses.
    pub addr: PrefixMatch,
    /// PrefixMatch map of ports.
    pub port: PrefixMatch,
    /// Pool values.
    pub pool: Vec<PoolEntry>,
    /// KeywordMatch tokenizer, when the provider runs an IDS.
    pub tokenizer: Option<TokenizerConfig>,
}

/// One encrypted packet and the token records that go before it.
pub struct Encrypted {
    /// Token record packets (side channel), in order.
    pub tokens: Vec<Packet>,
    /// The encrypted data packet.
    pub data: Packet,
}

/// The gateway.
pub struct Gateway {
    state: GatewayState,
    flow: FlowKeyer,
    aead: Aes256Gcm,
    kw: KeywordKey,
    pool_plain: HashMap<IpAddr, u128>,
    pool_enc: HashMap<u128, IpAddr>,
    tokenizer: Option<Tokenizer>,
    nonce_prefix: [u8; 4],
    counter: u64,
    /// During a rule swap: the previous generation's gateway, kept to encrypt the packets of
    /// the connections it saw that are still live, and to decrypt that generation's packets
    /// coming back from the provider.
    previous: Option<Box<Gateway>>,
    /// The connections this gateway encrypted packets of.
    conns: ConnTable,
}

/// Where the parts of an original frame are.
struct Parts {
    l3: usize,
    l4: usize,
    body: usize,
    end: usize,
}

fn parts(pkt: &Packet) -> Result<Parts, EmbarkError> {
    let h = pkt.hdr();
    if !h.is_ip() {
        return Err(EmbarkError::Unsupported("not an IP packet"));
    }
    if h.fragmented {
        return Err(EmbarkError::Unsupported("IP fragment"));
    }
    let l3 = usize::from(h.l3_off);
    let ip_payload = usize::from(h.payload_off);
    let end = ip_payload + usize::from(h.payload_len);
    let (l4, body) = match h.l4 {
        L4::Tcp | L4::Udp => (usize::from(h.l4_off), ip_payload),
        L4::Icmp | L4::Icmpv6 => {
            let l4 = usize::from(h.l4_off);
            (l4, (l4 + 8).min(end))
        }
        _ => (ip_payload, ip_payload),
    };
    if !(l3 <= l4 && l4 <= body && body <= end && end <= pkt.len()) {
        return Err(EmbarkError::Malformed("header offsets out of order"));
    }
    Ok(Parts { l3, l4, body, end })
}

/// One's-complement sum of `data` added to `acc`.
fn csum_add(mut acc: u32, data: &[u8]) -> u32 {
    let mut it = data.chunks_exact(2);
    for c in &mut it {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = it.remainder() {
        acc += u32::from(*b) << 8;
    }
    acc
}

fn csum_fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Recomputes the transport checksum of an encrypted frame (IPv6 pseudo-header where the
/// protocol has one), so the provider sees well-formed packets.
fn fix_checksum(frame: &mut [u8], proto: u8, l4: usize) {
    let (off, pseudo) = match proto {
        6 => (16, true),
        17 => (6, true),
        58 => (2, true),
        1 => (2, false),
        _ => return,
    };
    if frame.len() < l4 + off + 2 {
        return;
    }
    frame[l4 + off] = 0;
    frame[l4 + off + 1] = 0;
    let mut acc = 0;
    if pseudo {
        acc = csum_add(acc, &frame[ETH_LEN + 8..ETH_LEN + 40]);
        let len = (frame.len() - l4) as u32;
        acc = csum_add(acc, &len.to_be_bytes());
        acc = csum_add(acc, &[0, 0, 0, proto]);
    }
    acc = csum_add(acc, &frame[l4..]);
    let mut c = csum_fold(acc);
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    frame[l4 + off..l4 + off + 2].copy_from_slice(&c.to_be_bytes());
}

fn push_block(m: &mut Vec<u8>, b: &[u8]) -> Result<(), EmbarkError> {
    let n = u8::try_from(b.len()).map_err(|_| EmbarkError::Unsupported("header too long to seal"))?;
    m.push(n);
    m.extend_from_slice(b);
    Ok(())
}

fn take_block<'a>(m: &mut &'a [u8]) -> Result<&'a [u8], EmbarkError> {
    let (&n, rest) = m.split_first().ok_or(EmbarkError::Malformed("sealed originals cut short"))?;
    let b = rest.get(..usize::from(n)).ok_or(EmbarkError::Malformed("sealed originals cut short"))?;
    *m = &rest[usize::from(n)..];
    Ok(b)
}

/// The HTTP request URI a payload starts with, if it starts a request.
fn request_uri(p: &[u8]) -> Option<&[u8]> {
    const METHODS: [&[u8]; 9] =
        [b"GET ", b"POST ", b"HEAD ", b"PUT ", b"DELETE ", b"OPTIONS ", b"TRACE ", b"CONNECT ", b"PATCH "];
    let m = METHODS.iter().find(|m| p.starts_with(m))?;
    let rest = &p[m.len()..];
    let end = rest.iter().take(2048).position(|&b| b == b' ' || b == b'\r' || b == b'\n')?;
    Some(&rest[..end])
}

impl Gateway {
    /// A gateway for `key` with `state`; refuses state made with another key.
    pub fn new(key: &MasterKey, state: GatewayState) -> Result<Gateway, EmbarkError> {
        if state.key_id != key.id() {
            return Err(EmbarkError::WrongKey(format!(
                "gateway state made for key {}, this key is {}",
                state.key_id,
                key.id()
            )));
        }
        let aead = Aes256Gcm::new(&key.derive(b"packet-aead").into());
        let pool_plain = state.pool.iter().map(|p| (p.plain, u128::from(p.enc))).collect();
        let pool_enc = state.pool.iter().map(|p| (u128::from(p.enc), p.plain)).collect();
        let kw = KeywordKey::new(key);
        let tokenizer = state.tokenizer.clone().map(|c| Tokenizer::new(c, kw.clone()));
        Ok(Gateway {
            flow: FlowKeyer::new(key),
            aead,
            kw,
            pool_plain,
            pool_enc,
            tokenizer,
            nonce_prefix: rand::random(),
            counter: 0,
            previous: None,
            conns: ConnTable::default(),
            state,
        })
    }

    /// The rule generation this gateway encrypts for.
    pub fn generation(&self) -> u32 {
        self.state.generation
    }

    /// The generation whose packets are still accepted on the way back during a swap.
    pub fn previous_generation(&self) -> Option<u32> {
        self.previous.as_ref().map(|g| g.generation())
    }

    /// Starts a rule swap: from now on the packets of new connections are encrypted under
    /// `state` (a later generation, same key), while the connections live now keep the
    /// current generation until they end (so the provider's NF state for them stays valid);
    /// packets of the current generation coming back are decrypted until
    /// [`Gateway::retire_previous`]. The nonce sequence continues across both, so no nonce is
    /// used twice under the packet key. Refused while a previous swap is under way.
    pub fn rekey(&mut self, key: &MasterKey, state: GatewayState) -> Result<(), EmbarkError> {
        if self.previous.is_some() {
            return Err(EmbarkError::BadRule(
                "a rule swap is already under way: retire the previous generation first".into(),
            ));
        }
        if state.generation <= self.state.generation {
            return Err(EmbarkError::BadRule(format!(
                "new rule generation {} must be greater than the current {}",
                state.generation, self.state.generation
            )));
        }
        let mut next = Gateway::new(key, state)?;
        next.nonce_prefix = self.nonce_prefix;
        next.counter = self.counter;
        let old = std::mem::replace(self, next);
        self.previous = Some(Box::new(old));
        Ok(())
    }

    /// Connections still kept under the previous generation during a swap (live at the
    /// latest packet time seen); the swap can end without cutting any once this is 0.
    pub fn pinned_connections(&self) -> usize {
        self.previous.as_ref().map_or(0, |p| p.conns.live_at(self.conns.now().max(p.conns.now())))
    }

    /// Ends a rule swap: the previous generation's packets are refused from now on, and its
    /// connections still live continue under the current generation (they restart at the
    /// provider). Returns the generation retired, if a swap was under way.
    pub fn retire_previous(&mut self) -> Option<u32> {
        self.previous.take().map(|g| g.generation())
    }

    fn prf(&self, t: &FiveTuple) -> FlowPrf {
        self.flow.flow((t.src, t.sport), (t.dst, t.dport), t.proto.0)
    }

    fn enc_addr(&self, ip: IpAddr, prf: &FlowPrf) -> Result<u128, EmbarkError> {
        match self.pool_plain.get(&ip) {
            Some(&e) => Ok(e),
            None => self.state.addr.encrypt(v6_bits(ip), prf),
        }
    }

    fn enc_port(&self, ip: IpAddr, port: u16, l4: L4, prf: &FlowPrf) -> Result<u16, EmbarkError> {
        // A pool endpoint's port is the NF's own choice (a NAT's external port), and ICMP's
        // echo identifier is not a port: both stay as they are.
        if self.pool_plain.contains_key(&ip) || !matches!(l4, L4::Tcp | L4::Udp) {
            return Ok(port);
        }
        Ok(self.state.port.encrypt(u128::from(port), prf)? as u16)
    }

    /// The encryptions of a tuple's four fields.
    fn enc_tuple(&self, t: &FiveTuple, l4: L4) -> Result<(u128, u128, u16, u16), EmbarkError> {
        let prf = self.prf(t);
        let (esrc, edst) = (self.enc_addr(t.src, &prf)?, self.enc_addr(t.dst, &prf)?);
        let (mut esport, mut edport) =
            (self.enc_port(t.src, t.sport, l4, &prf)?, self.enc_port(t.dst, t.dport, l4, &prf)?);
        // Ports have few suffix bits and may collide. That is harmless unless both addresses
        // encrypt alike (a host talking to itself): then the two endpoints would merge and
        // NFs could no longer tell the directions apart. Re-draw the larger port's suffix
        // with a tweak; both directions see the same pair, so they re-draw alike.
        let mut tweak = 0u16;
        while esrc == edst && esport == edport && t.sport != t.dport && matches!(l4, L4::Tcp | L4::Udp) {
            tweak = tweak.checked_add(1).ok_or(EmbarkError::Unsupported("port encryptions keep colliding"))?;
            let redo = |p: u16| -> Result<u16, EmbarkError> {
                Ok(self.state.port.encrypt_tweaked(u128::from(p), tweak, &prf)? as u16)
            };
            if t.sport > t.dport {
                esport = redo(t.sport)?;
            } else {
                edport = redo(t.dport)?;
            }
        }
        Ok((esrc, edst, esport, edport))
    }

    /// Encrypts one packet going to the provider: under the previous generation during a
    /// swap if its connection was live at the swap and still is, else under the current one.
    pub fn encrypt(&mut self, pkt: &Packet) -> Result<Encrypted, EmbarkError> {
        if let Some(prev) = self.previous.as_mut().filter(|p| p.conns.is_live(pkt)) {
            prev.counter = self.counter;
            let out = prev.encrypt_here(pkt);
            self.counter = prev.counter;
            return out;
        }
        self.encrypt_here(pkt)
    }

    fn encrypt_here(&mut self, pkt: &Packet) -> Result<Encrypted, EmbarkError> {
        let t = pkt.tuple().ok_or(EmbarkError::Unsupported("not an IP packet"))?;
        let p = parts(pkt)?;
        let l4kind = pkt.hdr().l4;
        let d = pkt.data();
        let mut meta = Vec::with_capacity(128);
        push_block(&mut meta, &d[..p.l3])?;
        push_block(&mut meta, &d[p.l3..p.l4])?;
        push_block(&mut meta, &d[p.l4..p.body])?;
        push_block(&mut meta, &d[p.end..])?;
        if meta.len() > MAX_META {
            return Err(EmbarkError::Unsupported("headers too long to seal in one option"));
        }
        let (esrc, edst, esport, edport) = self.enc_tuple(&t, l4kind)?;
        // Seal originals and payload in one AEAD operation.
        let mut sealed = meta;
        let meta_len = sealed.len();
        sealed.extend_from_slice(&d[p.body..p.end]);
        self.counter += 1;
        let mut nonce = [0u8; 12];
        nonce[..4].copy_from_slice(&self.nonce_prefix);
        nonce[4..].copy_from_slice(&self.counter.to_be_bytes());
        let gen = self.state.generation.to_be_bytes();
        let tag = self
            .aead
            .encrypt_in_place_detached(&nonce.into(), &gen, &mut sealed)
            .map_err(|_| EmbarkError::Unsupported("payload too long"))?;
        // Destination options header: 2 fixed bytes, the option, padding to 8 bytes.
        let opt_len = 4 + 12 + 16 + meta_len;
        let used = 2 + 2 + opt_len;
        let do_len = used.div_ceil(8) * 8;
        let l4_len = p.body - p.l4;
        let body_len = p.end - p.body;
        let ip_payload = do_len + l4_len + body_len;
        let ip_payload = u16::try_from(ip_payload).map_err(|_| EmbarkError::Unsupported("packet too long for IPv6"))?;
        let mut f = Vec::with_capacity(ETH_LEN + IP6_LEN + usize::from(ip_payload));
        f.extend_from_slice(&GW_MAC_DST);
        f.extend_from_slice(&GW_MAC_SRC);
        f.extend_from_slice(&[0x86, 0xdd]);
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&ip_payload.to_be_bytes());
        f.extend_from_slice(&[60, 64]);
        f.extend_from_slice(&esrc.to_be_bytes());
        f.extend_from_slice(&edst.to_be_bytes());
        f.extend_from_slice(&[t.proto.0, (do_len / 8 - 1) as u8, OPTION_TYPE, opt_len as u8]);
        f.extend_from_slice(&gen);
        f.extend_from_slice(&nonce);
        f.extend_from_slice(&tag);
        f.extend_from_slice(&sealed[..meta_len]);
        match do_len - used {
            0 => {}
            1 => f.push(0),
            n => {
                f.extend_from_slice(&[1, (n - 2) as u8]);
                f.resize(f.len() + n - 2, 0);
            }
        }
        let l4 = f.len();
        f.extend_from_slice(&d[p.l4..p.body]);
        if matches!(l4kind, L4::Tcp | L4::Udp) && l4_len >= 4 {
            f[l4..l4 + 2].copy_from_slice(&esport.to_be_bytes());
            f[l4 + 2..l4 + 4].copy_from_slice(&edport.to_be_bytes());
        }
        f.extend_from_slice(&sealed[meta_len..]);
        fix_checksum(&mut f, t.proto.0, l4);
        let data = Packet::new(f, pkt.meta);
        let mut tokens = Vec::new();
        if let Some(tk) = self.tokenizer.as_mut() {
            let toks = tk.feed(pkt);
            let uri = request_uri(pkt.payload()).map(|u| self.kw.uri_token(u));
            if toks.is_some() || uri.is_some() {
                let (salt, base, list) = toks.map_or((0, 0, Vec::new()), |x| (x.salt, x.base, x.tokens));
                // A record must fit one IPv6 packet: long token lists go in several.
                let mut chunks: Vec<&[crate::keyword::Token]> = list.chunks(TOKENS_PER_RECORD).collect();
                if chunks.is_empty() {
                    chunks.push(&[]);
                }
                for (i, chunk) in chunks.into_iter().enumerate() {
                    let rec = TokenRecord {
                        generation: self.state.generation,
                        sport: esport,
                        dport: edport,
                        salt,
                        base,
                        tokens: chunk.to_vec(),
                        uri: if i == 0 { uri } else { None },
                    };
                    tokens.push(token_packet(esrc, edst, &rec.encode(), pkt)?);
                }
            }
        }
        self.conns.track(pkt);
        Ok(Encrypted { tokens, data })
    }

    /// Decrypts a packet coming back from the provider into what the plaintext chain would
    /// have delivered.
    pub fn decrypt(&self, pkt: &Packet) -> Result<Packet, EmbarkError> {
        let d = pkt.data();
        let bad = EmbarkError::Malformed;
        if d.len() < ETH_LEN + IP6_LEN + 8 || d[12..14] != [0x86, 0xdd] || d[ETH_LEN] >> 4 != 6 {
            return Err(bad("not an Embark IPv6 packet"));
        }
        if d[ETH_LEN + 6] != 60 {
            return Err(bad("no destination options header"));
        }
        let ip_payload = usize::from(u16::from_be_bytes([d[ETH_LEN + 4], d[ETH_LEN + 5]]));
        let end = ETH_LEN + IP6_LEN + ip_payload;
        let do_start = ETH_LEN + IP6_LEN;
        let do_len = (usize::from(d[do_start + 1]) + 1) * 8;
        if end > d.len() || do_start + do_len > end {
            return Err(bad("lengths exceed the packet"));
        }
        // Find the option.
        let opts = &d[do_start + 2..do_start + do_len];
        let mut i = 0;
        let mut found = None;
        while i < opts.len() {
            match opts[i] {
                0 => i += 1,
                ty => {
                    let len = usize::from(*opts.get(i + 1).ok_or(bad("option cut short"))?);
                    let data = opts.get(i + 2..i + 2 + len).ok_or(bad("option cut short"))?;
                    if ty == OPTION_TYPE {
                        found = Some(data);
                    }
                    i += 2 + len;
                }
            }
        }
        let opt = found.ok_or(bad("no Embark option"))?;
        if opt.len() < 32 {
            return Err(bad("Embark option too short"));
        }
        let gen = u32::from_be_bytes([opt[0], opt[1], opt[2], opt[3]]);
        if gen != self.state.generation {
            return match &self.previous {
                Some(prev) if prev.generation() == gen => prev.decrypt(pkt),
                _ => Err(EmbarkError::WrongKey(format!(
                    "packet of rule generation {gen}, gateway at {}",
                    self.state.generation
                ))),
            };
        }
        let nonce: [u8; 12] = opt[4..16].try_into().map_err(|_| bad("nonce"))?;
        let tag: [u8; 16] = opt[16..32].try_into().map_err(|_| bad("tag"))?;
        let meta_ct = &opt[32..];
        // The transport header keeps its original length; the rest is ciphertext.
        let mut sealed = meta_ct.to_vec();
        let meta_len = sealed.len();
        // Length of the original transport header, known only after opening; the body is
        // everything after it, so open over the whole IP payload tail and split afterwards.
        let l4_start = do_start + do_len;
        let l4_len = self.l4_len_hint(pkt, l4_start)?;
        let body = d.get(l4_start + l4_len..end).ok_or(bad("transport header exceeds the packet"))?;
        sealed.extend_from_slice(body);
        self.aead
            .decrypt_in_place_detached(&nonce.into(), &opt[0..4], &mut sealed, &tag.into())
            .map_err(|_| EmbarkError::WrongKey("packet does not authenticate under this key".into()))?;
        let mut m = &sealed[..meta_len];
        let eth = take_block(&mut m)?;
        let l3 = take_block(&mut m)?;
        let l4 = take_block(&mut m)?;
        let trailer = take_block(&mut m)?;
        if l4.len() != l4_len {
            return Err(bad("transport header length changed"));
        }
        let mut orig = Vec::with_capacity(eth.len() + l3.len() + l4.len() + body.len() + trailer.len());
        orig.extend_from_slice(eth);
        orig.extend_from_slice(l3);
        orig.extend_from_slice(l4);
        orig.extend_from_slice(&sealed[meta_len..]);
        orig.extend_from_slice(trailer);
        let mut out = Packet::new(orig, pkt.meta);
        let ot = out.tuple().ok_or(bad("sealed originals do not parse"))?;
        let cur = pkt.tuple().ok_or(bad("encrypted packet does not parse"))?;
        let (esrc, edst, esport, edport) = self.enc_tuple(&ot, out.hdr().l4)?;
        let bits = |ip: IpAddr| v6_bits(ip);
        let src = self.restore(bits(cur.src), esrc, ot.src)?;
        let dst = self.restore(bits(cur.dst), edst, ot.dst)?;
        let sport = if cur.sport == esport { ot.sport } else { cur.sport };
        let dport = if cur.dport == edport { ot.dport } else { cur.dport };
        if src != ot.src || sport != ot.sport {
            out.rewrite_src(src, sport).map_err(|_| EmbarkError::Unsupported("source rewritten across IP families"))?;
        }
        if dst != ot.dst || dport != ot.dport {
            out.rewrite_dst(dst, dport)
                .map_err(|_| EmbarkError::Unsupported("destination rewritten across IP families"))?;
        }
        Ok(out)
    }

    /// The original transport header's length, from the encrypted packet's own header (the
    /// gateway copied it unchanged in length).
    fn l4_len_hint(&self, pkt: &Packet, l4_start: usize) -> Result<usize, EmbarkError> {
        let h = pkt.hdr();
        let d = pkt.data();
        Ok(match h.l4 {
            L4::Tcp => {
                let off = *d.get(l4_start + 12).ok_or(EmbarkError::Malformed("TCP header cut short"))?;
                usize::from(off >> 4) * 4
            }
            L4::Udp => 8,
            L4::Icmp | L4::Icmpv6 => {
                (usize::from(h.payload_off) + usize::from(h.payload_len)).saturating_sub(l4_start).min(8)
            }
            _ => 0,
        })
    }

    /// The plaintext of an address field: the original if the provider left it, a pool
    /// plaintext if the provider wrote a pool value.
    fn restore(&self, cur: u128, expected: u128, orig: IpAddr) -> Result<IpAddr, EmbarkError> {
        if cur == expected {
            return Ok(orig);
        }
        self.pool_enc.get(&cur).copied().ok_or(EmbarkError::Malformed("address rewritten to a value not in the pool"))
    }
}

/// The rule generation an encrypted frame was made under, read without any key: the Embark
/// option's first field for a data packet, the record header's for a token record. `None` for
/// a frame that is neither (not IPv6, no Embark option, cut short).
#[inline]
pub fn frame_generation(d: &[u8]) -> Option<u32> {
    // The gateway writes its option first in the destination options header: read it at that
    // fixed place (one bounds check), and walk the options only for a frame laid out otherwise.
    const EXT: usize = ETH_LEN + IP6_LEN;
    if let Some(h) = d.get(..EXT + 8) {
        if h[12..14] == [0x86, 0xdd] && h[ETH_LEN + 6] == 60 && h[EXT + 2] == OPTION_TYPE {
            return Some(u32::from_be_bytes([h[EXT + 4], h[EXT + 5], h[EXT + 6], h[EXT + 7]]));
        }
    }
    frame_generation_walk(d)
}

/// [`frame_generation`] for token records and frames whose Embark option is not first.
fn frame_generation_walk(d: &[u8]) -> Option<u32> {
    if d.get(12..14)? != [0x86, 0xdd] {
        return None;
    }
    let word = |at: usize| d.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let ext = ETH_LEN + IP6_LEN;
    match *d.get(ETH_LEN + 6)? {
        TOKEN_PROTO => word(ext + crate::keyword::RECORD_GENERATION_OFFSET),
        60 => {
            let end = ext + (usize::from(*d.get(ext + 1)?) + 1) * 8;
            let mut i = ext + 2;
            while i < end {
                match *d.get(i)? {
                    0 => i += 1,
                    OPTION_TYPE => return word(i + 2),
                    _ => i += 2 + usize::from(*d.get(i + 1)?),
                }
            }
            None
        }
        _ => None,
    }
}

/// A token record packet: IPv6 with the data packet's encrypted addresses, next header
/// [`TOKEN_PROTO`], the record as payload.
fn token_packet(src: u128, dst: u128, rec: &[u8], orig: &Packet) -> Result<Packet, EmbarkError> {
    let len = u16::try_from(rec.len()).map_err(|_| EmbarkError::Unsupported("token record too long"))?;
    let mut f = Vec::with_capacity(ETH_LEN + IP6_LEN + rec.len());
    f.extend_from_slice(&GW_MAC_DST);
    f.extend_from_slice(&GW_MAC_SRC);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(&[TOKEN_PROTO, 64]);
    f.extend_from_slice(&src.to_be_bytes());
    f.extend_from_slice(&dst.to_be_bytes());
    f.extend_from_slice(rec);
    Ok(Packet::new(f, orig.meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + IPv6 (next header 60) + a destination options header holding `opts`.
    fn frame(opts: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, 60, 64]);
        f.extend_from_slice(&[0u8; 32]);
        let len = (2 + opts.len()).div_ceil(8) * 8;
        f.extend_from_slice(&[6, (len / 8 - 1) as u8]);
        f.extend_from_slice(opts);
        f.resize(ETH_LEN + IP6_LEN + len, 0);
        f
    }

    #[test]
    fn generation_read_at_the_fixed_place_and_by_walking_the_options() {
        let opt = [OPTION_TYPE, 4, 0, 0, 0, 7];
        assert_eq!(frame_generation(&frame(&opt)), Some(7));
        // Behind a Pad1 and a PadN: found by the walk.
        let mut padded = vec![0, 1, 1, 0];
        padded.extend_from_slice(&opt);
        assert_eq!(frame_generation(&frame(&padded)), Some(7));
        // No Embark option; cut short; not IPv6.
        assert_eq!(frame_generation(&frame(&[1, 4, 0, 0, 0, 0])), None);
        assert_eq!(frame_generation(&frame(&opt)[..ETH_LEN + IP6_LEN + 5]), None);
        let mut v4 = frame(&opt);
        v4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(frame_generation(&v4), None);
    }
}
