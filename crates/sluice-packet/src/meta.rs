//! Per-packet metadata. Every field the CHC protocols need has a place here from day one, even
//! while a chain runs with local state: the logical clock, the move/replay flags, the target
//! instance of a replayed packet, the XOR vector of non-blocking updates, NF-set labels and times.

use std::fmt;

/// A logical clock stamped by a root on every packet at chain entry. The high
/// [`Clock::ROOT_BITS`] bits hold the root's id, the rest a per-root sequence number, so clocks of
/// different roots never collide and order is total within one root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Clock(pub u64);

impl Clock {
    /// Bits of the clock that name the root.
    pub const ROOT_BITS: u32 = 8;
    const SEQ_BITS: u32 = 64 - Self::ROOT_BITS;
    const SEQ_MASK: u64 = (1 << Self::SEQ_BITS) - 1;

    /// The clock of sequence number `seq` at root `root`.
    pub fn new(root: u8, seq: u64) -> Self {
        Clock((u64::from(root) << Self::SEQ_BITS) | (seq & Self::SEQ_MASK))
    }
    /// The root that stamped this clock.
    pub fn root(self) -> u8 {
        (self.0 >> Self::SEQ_BITS) as u8
    }
    /// The sequence number within the root.
    pub fn seq(self) -> u64 {
        self.0 & Self::SEQ_MASK
    }
}

impl fmt::Display for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.root(), self.seq())
    }
}

/// Identifies an NF instance in the physical chain: vertex index in the high 16 bits, instance
/// index within the vertex in the low 16 bits (the same split the XOR vector uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct InstanceId(pub u32);

impl InstanceId {
    /// The id of instance `index` of vertex `vertex`.
    pub fn new(vertex: u16, index: u16) -> Self {
        InstanceId((u32::from(vertex) << 16) | u32::from(index))
    }
    /// The vertex part.
    pub fn vertex(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// The instance index within its vertex.
    pub fn index(self) -> u16 {
        self.0 as u16
    }
}

/// Bit flags carried by a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaFlags(u8);

impl MetaFlags {
    /// First packet of a flow sent to a new instance after a move.
    pub const FIRST: MetaFlags = MetaFlags(1);
    /// Last packet of a flow sent to the old instance before a move (or last replayed packet).
    pub const LAST: MetaFlags = MetaFlags(2);
    /// The packet is a replay from the root's log.
    pub const REPLAYED: MetaFlags = MetaFlags(4);
    /// A replay of a packet the root knows has already left the chain (it is replayed to redo
    /// state updates that were not committed): its output is dropped at the chain's egress.
    pub const EMITTED: MetaFlags = MetaFlags(8);
    /// A replay copy that has passed its target instance: downstream it is subject to duplicate
    /// suppression like any packet, while the root still knows which replay it belongs to.
    pub const REACHED: MetaFlags = MetaFlags(16);
    /// A copy made by a mirror edge (bound for an off-path vertex): after a node fails, the
    /// copies it held tell the replacements of the main path's instances nothing when they
    /// are mirror copies, and those of the mirror targets nothing when they are not.
    pub const MIRROR: MetaFlags = MetaFlags(32);

    /// Every flag defined above.
    pub const ALL: MetaFlags = MetaFlags(0x3f);

    /// The flags as one byte (for the wire).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// The flags in `bits`, or `None` if it sets a bit no flag above defines.
    pub fn from_bits(bits: u8) -> Option<MetaFlags> {
        (bits & !Self::ALL.0 == 0).then_some(MetaFlags(bits))
    }

    /// Whether every flag in `other` is set.
    pub fn contains(self, other: MetaFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// Sets the flags in `other`.
    pub fn insert(&mut self, other: MetaFlags) {
        self.0 |= other.0;
    }
    /// Clears the flags in `other`.
    pub fn remove(&mut self, other: MetaFlags) {
        self.0 &= !other.0;
    }
}

/// Index of a label name, interned when a chain is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelId(pub u16);

/// How many labels one packet can carry.
pub const MAX_LABELS: usize = 6;

/// Derived attributes NFs attach to a packet (E2's metadata tags), read by edge filters and
/// downstream NFs. Fixed size: setting a label never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Labels {
    len: u8,
    ids: [u16; MAX_LABELS],
    values: [u32; MAX_LABELS],
}

impl Labels {
    /// Sets `id` to `value`, replacing an earlier value. Returns `false`, leaving the labels as
    /// they were, when the packet already carries [`MAX_LABELS`] other labels.
    pub fn set(&mut self, id: LabelId, value: u32) -> bool {
        let n = usize::from(self.len);
        if let Some(i) = self.ids[..n].iter().position(|&x| x == id.0) {
            self.values[i] = value;
            return true;
        }
        if n == MAX_LABELS {
            return false;
        }
        self.ids[n] = id.0;
        self.values[n] = value;
        self.len += 1;
        true
    }
    /// The value of `id`, if set.
    pub fn get(&self, id: LabelId) -> Option<u32> {
        let n = usize::from(self.len);
        self.ids[..n].iter().position(|&x| x == id.0).map(|i| self.values[i])
    }
    /// Number of labels set.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }
    /// Whether no label is set.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Iterates over `(label, value)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (LabelId, u32)> + '_ {
        let n = usize::from(self.len);
        self.ids[..n].iter().zip(&self.values[..n]).map(|(&i, &v)| (LabelId(i), v))
    }
}

/// Metadata travelling with a packet through the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    /// Logical clock stamped at chain entry (zero before the root has seen the packet).
    pub clock: Clock,
    /// Move and replay marks.
    pub flags: MetaFlags,
    /// For replayed packets: the instance the replay is meant for (others only forward).
    pub target: Option<InstanceId>,
    /// XOR of an id per (instance, object) for every non-blocking state update made for the
    /// packet (64 bits: distinct updates cancel out with a chance of about 2^-64).
    pub xor: u64,
    /// Labels set by NFs.
    pub labels: Labels,
    /// Capture time of the packet, nanoseconds since the Unix epoch. NFs use it as "now" so that
    /// runs over a trace are deterministic.
    pub ts_ns: u64,
    /// Wall-clock time the root accepted the packet, nanoseconds since the run started; used
    /// for latency measurement only.
    pub ingress_ns: u64,
    /// Interface or input port the packet came in on.
    pub in_port: u16,
}

impl Meta {
    /// The instance a replay copy is on its way to, until it has passed it.
    pub fn replay_target(&self) -> Option<InstanceId> {
        let on_way = self.flags.contains(MetaFlags::REPLAYED) && !self.flags.contains(MetaFlags::REACHED);
        self.target.filter(|_| on_way)
    }
}
