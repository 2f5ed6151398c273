//! The pool of packet bodies: a shared stack behind a lock, and a cache of spares per thread in
//! front of it.
//!
//! Why a cache per thread: a run's threads take and give back bodies for every packet (the
//! root copies each frame it reads into one, a worker copies every mirrored packet, sinks give
//! them back). With one lock for all of them, two threads on two cores passed the lock's cache
//! line, and each other's bodies, back and forth for every packet and now and then slept on the
//! lock: the example chain with one worker ran at 0.6 of run to completion, its NFs twice as
//! slow. A thread now takes and gives bodies to its own cache and visits the shared stack once
//! per [`CHUNK`] bodies, and the body it is handed is the one it gave back last, still in its
//! own core's cache — what the last-in-first-out stack was for.

use super::{Batch, Meta, Packet, PacketBody};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// The pool's spare bodies: boxes, not bodies, because a packet takes a body's allocation over
/// as it is, by pointer.
#[allow(clippy::vec_box)]
type Spares = Vec<Box<PacketBody>>;

/// Bodies moved between a thread's cache and the shared stack at once. A thread's cache holds
/// fewer than twice as many.
const CHUNK: usize = 32;

/// The stack every thread's cache refills from and spills to.
struct Shared {
    free: Mutex<Spares>,
    /// Most spare bodies kept on the stack (the caches hold up to `2 × CHUNK - 1` more each).
    limit: usize,
}

impl Shared {
    fn free(&self) -> MutexGuard<'_, Spares> {
        // A panic elsewhere while the lock was held leaves a valid stack of bodies.
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `bodies` on the stack, dropping those beyond the limit.
    fn give_back(&self, bodies: impl Iterator<Item = Box<PacketBody>>) {
        let mut free = self.free();
        let room = self.limit.saturating_sub(free.len());
        free.extend(bodies.take(room));
    }
}

/// One thread's spares, for the pool it last used.
struct ThreadCache {
    pool: Weak<Shared>,
    spares: Spares,
}

impl ThreadCache {
    /// Hands every spare back to the pool they came from (dropped if it is gone).
    fn flush(&mut self) {
        match self.pool.upgrade() {
            Some(shared) => shared.give_back(self.spares.drain(..)),
            None => self.spares.clear(),
        }
    }
}

impl Drop for ThreadCache {
    /// A thread that ends gives its spares back: a pool loses nothing to threads that come and go.
    fn drop(&mut self) {
        self.flush();
    }
}

/// A spare body from a thread's cache, refilled with up to [`CHUNK`] from the shared stack
/// when empty.
#[allow(clippy::vec_box)]
#[inline]
fn pop_spare(spares: &mut Spares, shared: &Shared) -> Option<Box<PacketBody>> {
    if spares.is_empty() {
        let mut free = shared.free();
        let from = free.len().saturating_sub(CHUNK);
        spares.extend(free.drain(from..));
    }
    spares.pop()
}

thread_local! {
    static CACHE: RefCell<ThreadCache> =
        const { RefCell::new(ThreadCache { pool: Weak::new(), spares: Vec::new() }) };
}

/// A bounded pool of packet bodies shared by the threads of a run, so that steady-state packet
/// handling allocates nothing: sinks give bodies back, sources take them.
///
/// Each thread keeps a few dozen spares of its own in front of the shared stack (see the
/// module's documentation), last in, first out: the body given back last on this thread (by a
/// sink, just read, still in this core's cache) is the next one it takes. A thread that uses
/// another pool hands its spares back to the first, and a thread that ends hands back its own.
#[derive(Clone)]
pub struct PacketPool {
    shared: Arc<Shared>,
    buf_capacity: usize,
}

impl PacketPool {
    /// A pool holding up to `buffers` spare buffers of `buf_capacity` bytes (plus fewer than
    /// `2 × 32` in the cache of each thread using it).
    pub fn new(buffers: usize, buf_capacity: usize) -> PacketPool {
        let shared = Shared { free: Mutex::new(Vec::new()), limit: buffers.max(1) };
        PacketPool { shared: Arc::new(shared), buf_capacity }
    }

    /// Runs `f` on this thread's spares for this pool; `None` when the thread's cache cannot be
    /// used (the thread is ending, or `f` would re-enter it).
    fn with_cache<R>(&self, f: impl FnOnce(&mut Spares, &Shared) -> R) -> Option<R> {
        CACHE
            .try_with(|cell| {
                let mut cache = cell.try_borrow_mut().ok()?;
                if !std::ptr::eq(cache.pool.as_ptr(), Arc::as_ptr(&self.shared)) {
                    cache.flush();
                    cache.pool = Arc::downgrade(&self.shared);
                }
                Some(f(&mut cache.spares, &self.shared))
            })
            .ok()
            .flatten()
    }

    /// A spare body, from this thread's cache (refilled from the shared stack when empty).
    fn take(&self) -> Option<Box<PacketBody>> {
        self.with_cache(pop_spare).unwrap_or_else(|| self.shared.free().pop())
    }

    /// Keeps `body` in this thread's cache, spilling the cache's oldest [`CHUNK`] to the shared
    /// stack when it is full.
    fn give(&self, body: Box<PacketBody>) {
        let mut body = Some(body);
        self.with_cache(|spares, shared| {
            spares.extend(body.take());
            spill(spares, shared);
        });
        if let Some(b) = body {
            self.shared.give_back(std::iter::once(b));
        }
    }

    /// A packet holding a copy of `frame`, in a recycled buffer when one is free.
    pub fn packet(&self, frame: &[u8], meta: Meta) -> Packet {
        match self.take() {
            Some(mut body) => {
                body.data.clear();
                body.data.extend_from_slice(frame);
                let PacketBody { data, headers, .. } = &mut *body;
                headers.parse_into(data);
                body.meta = meta;
                Packet { body }
            }
            None => {
                let mut buf = Vec::with_capacity(self.buf_capacity.max(frame.len()));
                buf.extend_from_slice(frame);
                Packet::new(buf, meta)
            }
        }
    }

    /// A copy of `pkt` (bytes, headers and metadata) in a recycled buffer; the headers are
    /// copied, not parsed again.
    pub fn copy_of(&self, pkt: &Packet) -> Packet {
        let spare = self.take();
        self.copy_into(pkt, spare)
    }

    /// A copy of `pkt` in `spare`, or in a new buffer.
    fn copy_into(&self, pkt: &Packet, spare: Option<Box<PacketBody>>) -> Packet {
        match spare {
            Some(body) => pkt.copy_onto(Packet { body }),
            None => {
                let mut buf = Vec::with_capacity(self.buf_capacity.max(pkt.len()));
                buf.extend_from_slice(pkt.data());
                Packet { body: Box::new(PacketBody { data: buf, headers: pkt.headers, meta: pkt.meta }) }
            }
        }
    }

    /// Appends a copy of each of `pkts` to `out`: the spares for all of them taken in one
    /// visit to this thread's cache (a source's batch), not one a packet.
    pub fn copy_all(&self, pkts: &[Packet], out: &mut Batch) {
        out.reserve(pkts.len());
        let copied = self.with_cache(|spares, shared| {
            for pkt in pkts {
                out.push(self.copy_into(pkt, pop_spare(spares, shared)));
            }
        });
        if copied.is_none() {
            for pkt in pkts {
                out.push(self.copy_of(pkt));
            }
        }
    }

    /// Returns a packet's buffers to the pool (dropped when the pool is full).
    pub fn recycle(&self, pkt: Packet) {
        self.give(pkt.body);
    }

    /// Returns every packet of `batch` to the pool, leaving the batch empty.
    pub fn recycle_batch(&self, batch: &mut Batch) {
        let cached = self.with_cache(|spares, shared| {
            for p in batch.drain(..) {
                spares.push(p.body);
                spill(spares, shared);
            }
        });
        if cached.is_none() {
            self.shared.give_back(batch.drain(..).map(|p| p.body));
        }
    }

    /// Spare bodies on the shared stack (not counting the threads' caches).
    pub fn shared_spares(&self) -> usize {
        self.shared.free().len()
    }
}

/// Moves the oldest [`CHUNK`] of a full cache to the shared stack (its newest stay: they are the
/// ones in this core's cache).
fn spill(spares: &mut Spares, shared: &Shared) {
    if spares.len() >= 2 * CHUNK {
        shared.give_back(spares.drain(..CHUNK));
    }
}

impl std::fmt::Debug for PacketPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketPool").field("shared_spares", &self.shared_spares()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn frame() -> Vec<u8> {
        crate::test_frame(true, b"pool")
    }

    fn address(p: &Packet) -> usize {
        std::ptr::from_ref::<PacketBody>(&p.body) as usize
    }

    #[test]
    fn bodies_given_back_on_a_thread_that_ends_are_taken_on_another() {
        let pool = PacketPool::new(1024, 2048);
        let f = frame();
        let made: Vec<Packet> = (0..200).map(|_| pool.packet(&f, Meta::default())).collect();
        let given: HashSet<usize> = made.iter().map(address).collect();
        let p2 = pool.clone();
        std::thread::spawn(move || {
            for p in made {
                p2.recycle(p);
            }
        })
        .join()
        .unwrap();
        // The ended thread's cache went back to the shared stack with the rest.
        assert_eq!(pool.shared_spares(), 200);
        let taken: HashSet<usize> = (0..200).map(|_| address(&pool.packet(&f, Meta::default()))).collect();
        assert_eq!(taken, given, "every body reused, none allocated anew");
    }

    #[test]
    fn a_thread_takes_back_the_body_it_gave_last() {
        let pool = PacketPool::new(1024, 2048);
        let f = frame();
        let mut batch: Batch = (0..100).map(|_| pool.packet(&f, Meta::default())).collect();
        let last = address(batch.last().unwrap());
        pool.recycle_batch(&mut batch);
        assert!(batch.is_empty());
        let again = pool.packet(&f, Meta::default());
        assert_eq!(address(&again), last);
        assert_eq!(again.data(), &f[..]);
        assert_eq!(*again.hdr(), crate::Headers::parse(&f), "a reused body's headers are the new frame's");
    }

    #[test]
    fn the_limit_holds_and_caches_stay_small() {
        let pool = PacketPool::new(10, 2048);
        let f = frame();
        let mut batch: Batch = (0..1000).map(|_| pool.packet(&f, Meta::default())).collect();
        pool.recycle_batch(&mut batch);
        assert_eq!(pool.shared_spares(), 10);
        let cached = CACHE.with(|c| c.borrow().spares.len());
        assert!(cached < 2 * CHUNK, "{cached} in this thread's cache");
    }

    #[test]
    fn a_thread_switching_pools_hands_its_spares_back() {
        let (a, b) = (PacketPool::new(100, 2048), PacketPool::new(100, 2048));
        let f = frame();
        let pa = a.packet(&f, Meta::default());
        a.recycle(pa);
        assert_eq!(a.shared_spares(), 0, "kept in the thread's cache");
        let pb = b.packet(&f, Meta::default());
        assert_eq!(a.shared_spares(), 1, "given back when the thread turned to another pool");
        b.recycle(pb);
        let copy = a.copy_of(&a.packet(&f, Meta::default()));
        assert_eq!(copy.data(), &f[..]);
        assert_eq!(b.shared_spares(), 1);
    }
}
