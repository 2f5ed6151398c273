//! Ring geometry and port options.

use crate::sys;

/// What [`AfPacketPort::recv_batch`](crate::AfPacketPort::recv_batch) does with a frame the
/// kernel truncated because it did not fit in a ring frame (`tp_snaplen < tp_len`).
///
/// Either way the frame is counted in [`PortStats::rx_truncated`](crate::PortStats::rx_truncated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TruncatedFrames {
    /// Drop it (the default). A cut frame is not the frame that was on the wire: its IP total
    /// length and checksums no longer match its bytes, and forwarding it would emit a corrupt
    /// packet, so a bridge or a chain should not see it.
    #[default]
    Drop,
    /// Deliver the captured prefix (`tp_snaplen` bytes), e.g. for monitoring.
    Deliver,
}

/// Geometry of the memory-mapped rings and the options of an
/// [`AfPacketPort`](crate::AfPacketPort).
///
/// Both rings use TPACKET_V2: fixed-size frames grouped in blocks. A frame never straddles a
/// block, so `block_size` must be a multiple of the page size and hold at least one frame, and
/// each frame count must be a whole number of blocks (`block_size / frame_size` frames each).
///
/// The default holds 4096 received and 1024 outgoing frames of 2048 bytes (10 MiB of kernel
/// memory per port), enough for a full 1514-byte Ethernet frame plus an 802.1Q tag in either
/// direction. Larger frames (jumbo MTU, or GSO/GRO super-packets, which veth delivers when
/// `gro`/`tso`/`gso` offloads are on) need a larger `frame_size`; with the default they are
/// truncated on receive and rejected on send. Sluice disables those offloads on the interfaces
/// it uses (`ethtool -K <if> gro off tso off gso off`) rather than paying 64 KiB per frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// Bytes per ring frame, header included; a multiple of 16. A received frame can use
    /// `frame_size - 66` bytes, a transmitted one `frame_size - 32`.
    pub frame_size: usize,
    /// Bytes per ring block; a multiple of the page size and at least `frame_size`.
    pub block_size: usize,
    /// Frames in the receive ring; a multiple of `block_size / frame_size`.
    pub rx_frames: usize,
    /// Frames in the transmit ring; a multiple of `block_size / frame_size`.
    pub tx_frames: usize,
    /// Put the interface in promiscuous mode for as long as the port is open, so frames
    /// addressed to other MAC addresses are received too (needed to forward between
    /// interfaces). Default: on.
    pub promiscuous: bool,
    /// Ask for `PACKET_QDISC_BYPASS`: transmitted frames go straight to the driver, skipping
    /// the interface's queueing discipline (lower cost per frame; traffic shaping configured
    /// with `tc` is skipped, frames are dropped rather than queued when the driver queue is
    /// full, and packet taps such as `tcpdump` on the interface do not see them). Ignored when
    /// the kernel does not support it. Default: on.
    pub qdisc_bypass: bool,
    /// What to do with frames the kernel had to truncate. Default: drop them.
    pub truncated: TruncatedFrames,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            frame_size: 2048,
            block_size: 1 << 16,
            rx_frames: 4096,
            tx_frames: 1024,
            promiscuous: true,
            qdisc_bypass: true,
            truncated: TruncatedFrames::Drop,
        }
    }
}

impl RingConfig {
    /// Smallest accepted frame size: room for the RX headers plus a minimum Ethernet frame.
    pub const MIN_FRAME_SIZE: usize = 128;

    /// Largest frame the receive ring delivers whole, in bytes (longer ones are truncated).
    pub fn max_rx_frame(&self) -> usize {
        self.frame_size.saturating_sub(sys::RX_MAC_OFFSET)
    }

    /// Largest frame the transmit ring can hold, in bytes (the interface MTU may lower it).
    pub fn max_tx_frame(&self) -> usize {
        self.frame_size.saturating_sub(sys::TX_DATA_OFFSET)
    }

    /// Frames per ring block.
    pub fn frames_per_block(&self) -> usize {
        self.block_size.checked_div(self.frame_size).unwrap_or(0)
    }

    /// Checks the geometry against the kernel's rules, given the page size; returns the reason
    /// for the first violation.
    pub(crate) fn validate(&self, page_size: usize) -> Result<(), String> {
        if self.frame_size < Self::MIN_FRAME_SIZE {
            return Err(format!("frame_size {} is below the minimum of {}", self.frame_size, Self::MIN_FRAME_SIZE));
        }
        if !self.frame_size.is_multiple_of(sys::TPACKET_ALIGNMENT) {
            return Err(format!("frame_size {} is not a multiple of {}", self.frame_size, sys::TPACKET_ALIGNMENT));
        }
        if page_size == 0 || self.block_size == 0 || !self.block_size.is_multiple_of(page_size) {
            return Err(format!(
                "block_size {} is not a positive multiple of the page size {page_size}",
                self.block_size
            ));
        }
        if self.block_size < self.frame_size {
            return Err(format!("block_size {} is smaller than frame_size {}", self.block_size, self.frame_size));
        }
        if u32::try_from(self.block_size).is_err() {
            return Err(format!("block_size {} does not fit in 32 bits", self.block_size));
        }
        let per_block = self.frames_per_block();
        for (name, frames) in [("rx_frames", self.rx_frames), ("tx_frames", self.tx_frames)] {
            if frames == 0 || per_block == 0 || !frames.is_multiple_of(per_block) {
                return Err(format!("{name} {frames} is not a positive multiple of the {per_block} frames per block"));
            }
            if u32::try_from(frames).is_err() {
                return Err(format!("{name} {frames} does not fit in 32 bits"));
            }
        }
        self.map_len().map(|_| ()).ok_or_else(|| "ring size overflows".to_string())
    }

    /// Bytes of the receive ring.
    pub(crate) fn rx_len(&self) -> Option<usize> {
        self.rx_frames.checked_div(self.frames_per_block())?.checked_mul(self.block_size)
    }

    /// Bytes of the transmit ring.
    pub(crate) fn tx_len(&self) -> Option<usize> {
        self.tx_frames.checked_div(self.frames_per_block())?.checked_mul(self.block_size)
    }

    /// Bytes of the whole mapping (receive ring first, then transmit ring).
    pub(crate) fn map_len(&self) -> Option<usize> {
        self.rx_len()?.checked_add(self.tx_len()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_holds_a_full_frame() {
        let c = RingConfig::default();
        assert_eq!(c.validate(4096), Ok(()));
        assert!(c.max_rx_frame() >= 1514 + 4);
        assert!(c.max_tx_frame() >= 1514 + 4);
        assert_eq!(c.map_len(), Some((4096 + 1024) * 2048));
    }

    #[test]
    fn rejects_bad_geometry() {
        let ok = RingConfig::default();
        let bad = [
            RingConfig { frame_size: 64, ..ok.clone() },
            RingConfig { frame_size: 2050, ..ok.clone() },
            RingConfig { block_size: 1000, ..ok.clone() },
            RingConfig { block_size: 4096, frame_size: 8192, ..ok.clone() },
            RingConfig { rx_frames: 0, ..ok.clone() },
            RingConfig { tx_frames: 33, ..ok.clone() },
        ];
        for c in bad {
            assert!(c.validate(4096).is_err(), "{c:?} accepted");
        }
    }

    #[test]
    fn frames_need_not_fill_blocks_exactly() {
        // 3 frames of 1360 bytes per 4096-byte block, 256 bytes unused per block.
        let c = RingConfig { frame_size: 1360, block_size: 4096, rx_frames: 30, tx_frames: 3, ..RingConfig::default() };
        assert_eq!(c.validate(4096), Ok(()));
        assert_eq!(c.map_len(), Some(11 * 4096));
    }
}
