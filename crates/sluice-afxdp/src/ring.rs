//! Memory shared with the kernel: the UMEM and the four single-producer/single-consumer rings
//! (fill and TX produced by us; RX and completion produced by the kernel).

use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

/// A memory mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) base: *mut u8,
    pub(crate) len: usize,
}

impl Mapping {
    /// Maps `len` bytes: anonymous (`fd` = `None`, for the UMEM, pre-faulted) or a ring of the
    /// socket `fd` at `offset`.
    pub(crate) fn new(len: usize, fd: Option<libc::c_int>, offset: libc::off_t) -> std::io::Result<Mapping> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1),
        };
        // SAFETY: a fresh mapping; no existing memory is affected.
        let base = unsafe { libc::mmap(ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, offset) };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base: base.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are what a successful mmap returned, owned by this value alone.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// One ring: a power-of-two array of `T` with a producer and a consumer index (free-running
/// u32 counters) and a flags word, all inside `map`. The side that is ours keeps a cached
/// copy of the other side's index and rereads it only when the cache says the ring is full
/// (producer) or empty (consumer).
#[derive(Debug)]
pub(crate) struct Ring<T> {
    _map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    entries: *mut T,
    mask: u32,
    size: u32,
    cached_prod: u32,
    cached_cons: u32,
    _t: PhantomData<T>,
}

impl<T: Copy> Ring<T> {
    /// The ring laid out in `map` at the kernel's offsets, `size` entries.
    ///
    /// # Safety
    /// `map` must be the mapping of a ring of `size` entries of `T` whose fields lie at `off`
    /// (as `XDP_MMAP_OFFSETS` reported); the offsets are checked against the mapping's length.
    pub(crate) unsafe fn new(map: Mapping, off: &crate::sys::XdpRingOffset, size: u32) -> Option<Ring<T>> {
        let end = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let fits = |o: u64| (o as usize) + 4 <= map.len && o.is_multiple_of(4);
        if end > map.len || !fits(off.producer) || !fits(off.consumer) || !fits(off.flags) {
            return None;
        }
        let at = |o: u64| map.base.wrapping_add(o as usize);
        let producer = at(off.producer).cast::<AtomicU32>().cast_const();
        let consumer = at(off.consumer).cast::<AtomicU32>().cast_const();
        // SAFETY (of the loads): both words are inside the live mapping, 4-byte aligned.
        let (p, c) = unsafe { ((*producer).load(Ordering::Acquire), (*consumer).load(Ordering::Acquire)) };
        Some(Ring {
            producer,
            consumer,
            flags: at(off.flags).cast::<AtomicU32>().cast_const(),
            entries: at(off.desc).cast::<T>(),
            mask: size - 1,
            size,
            cached_prod: p,
            cached_cons: c,
            _map: map,
            _t: PhantomData,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: checked to lie inside the mapping, which lives as long as `self`.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }

    /// Whether the kernel asks for a syscall to make progress on this ring.
    pub(crate) fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `producer`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & crate::sys::XDP_RING_NEED_WAKEUP != 0
    }

    fn slot(&self, index: u32) -> *mut T {
        // In bounds: `index & mask < size`, and `size` entries were checked to fit.
        self.entries.wrapping_add((index & self.mask) as usize)
    }

    // --- our side produces (fill, TX) ---

    /// How many entries up to `want` can be written now.
    pub(crate) fn reserve(&mut self, want: u32) -> u32 {
        let mut free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free < want {
            // Acquire pairs with the kernel's release of the consumer index: it is done with
            // the entries it consumed.
            self.cached_cons = self.consumer().load(Ordering::Acquire);
            free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        }
        free.min(want)
    }

    /// Writes the `i`-th reserved entry.
    pub(crate) fn put(&mut self, i: u32, value: T) {
        // SAFETY: the slot lies inside the ring and belongs to the producer (reserved), so the
        // kernel does not read it before `submit` publishes it.
        unsafe { ptr::write_volatile(self.slot(self.cached_prod.wrapping_add(i)), value) }
    }

    /// Publishes `n` written entries.
    pub(crate) fn submit(&mut self, n: u32) {
        self.cached_prod = self.cached_prod.wrapping_add(n);
        // Release: the entries are visible before the index that hands them over.
        self.producer().store(self.cached_prod, Ordering::Release);
    }

    /// Whether entries we produced are still waiting for the kernel.
    pub(crate) fn outstanding(&self) -> bool {
        self.consumer().load(Ordering::Acquire) != self.cached_prod
    }

    // --- the kernel produces (RX, completion) ---

    /// How many entries up to `max` are ready to read.
    pub(crate) fn peek(&mut self, max: u32) -> u32 {
        let mut n = self.cached_prod.wrapping_sub(self.cached_cons);
        if n == 0 {
            // Acquire pairs with the kernel's release of the producer index.
            self.cached_prod = self.producer().load(Ordering::Acquire);
            n = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        n.min(max)
    }

    /// Reads the `i`-th ready entry.
    pub(crate) fn get(&self, i: u32) -> T {
        // SAFETY: the slot lies inside the ring and was published by the kernel (peeked), which
        // does not rewrite it before `release`.
        unsafe { ptr::read_volatile(self.slot(self.cached_cons.wrapping_add(i))) }
    }

    /// Hands `n` read entries back.
    pub(crate) fn release(&mut self, n: u32) {
        self.cached_cons = self.cached_cons.wrapping_add(n);
        // Release: our reads of the entries happen before the kernel may reuse them.
        self.consumer().store(self.cached_cons, Ordering::Release);
    }

    /// Whether the kernel has published entries not yet read.
    pub(crate) fn ready(&self) -> bool {
        self.producer().load(Ordering::Acquire) != self.cached_cons
    }
}
