//! A store crash while the instances' batches are still on their way to the store.
//!
//! The engine's store crash wipes the store and rebuilds it from the checkpoint and the
//! instances' logs. Batches an instance sent before the crash but the store had not yet
//! applied are in those logs; if one of them reached the store after the wipe, the rebuilt
//! store would hold it too (on Redis, the random run of seed 17 lost a counter this way, about
//! one run in five). Here every batch takes a few milliseconds to reach the store, so that
//! some are always on the way when the store crashes: the engine must stop each connection
//! (nothing it was given lands later) before it wipes.

mod common;

use common::*;
use sluice_coe::engine::EngineConfig;
use sluice_coe::schedule::{Action, At};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{CustomOp, Value};
use sluice_store::{
    Backend, Checkpoint, Connection, Notification, Replies, Request, StoreError, StoreKey, TakeoverParts,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a batch takes to reach the store.
const LATENCY: Duration = Duration::from_millis(3);

/// A backend whose connections deliver every batch [`LATENCY`] after it was sent, in order.
/// Its restore (a rebuild's first step, after the wipe) lets every link that is not cut deliver
/// what it carries before it returns: the worst moment for a batch to arrive, just before the
/// rebuild re-executes the instances' logs.
struct SlowLink {
    inner: Arc<dyn Backend>,
    /// Per connection ever opened: batches on its link, not yet delivered.
    on_the_way: Mutex<Vec<Arc<AtomicUsize>>>,
}

impl SlowLink {
    fn over(inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        Arc::new(SlowLink { inner, on_the_way: Mutex::new(Vec::new()) })
    }
}

/// A batch on a slow link: when it arrives, its number, the batch.
type OnTheLink = (Instant, u64, Arc<[Request]>);

/// A connection whose batches travel a slow link: a thread delivers them to the real
/// connection. Dropped without [`Connection::halt`], what is on the link still arrives (as
/// packets on a wire do); halted, it is cut and nothing more arrives.
struct SlowConnection {
    inner: Arc<Mutex<Box<dyn Connection>>>,
    link: Option<mpsc::Sender<OnTheLink>>,
    cut: Arc<AtomicBool>,
    carrier: Option<JoinHandle<()>>,
    on_the_way: Arc<AtomicUsize>,
}

fn lock(c: &Mutex<Box<dyn Connection>>) -> std::sync::MutexGuard<'_, Box<dyn Connection>> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SlowConnection {
    fn new(inner: Box<dyn Connection>, on_the_way: Arc<AtomicUsize>) -> SlowConnection {
        let inner = Arc::new(Mutex::new(inner));
        let cut = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<OnTheLink>();
        let (to, stop, count) = (inner.clone(), cut.clone(), on_the_way.clone());
        let carrier = std::thread::spawn(move || {
            for (due, number, batch) in rx {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                if stop.load(Ordering::Acquire) || lock(&to).send(number, batch).is_err() {
                    break;
                }
                count.fetch_sub(1, Ordering::AcqRel);
            }
            // Cut or ended: nothing more arrives.
            count.store(0, Ordering::Release);
        });
        SlowConnection { inner, link: Some(tx), cut, carrier: Some(carrier), on_the_way }
    }
}

impl Connection for SlowConnection {
    fn send(&mut self, number: u64, batch: Arc<[Request]>) -> Result<(), StoreError> {
        let gone = || StoreError::Unavailable("the slow link is cut".into());
        let link = self.link.as_ref().ok_or_else(gone)?;
        self.on_the_way.fetch_add(1, Ordering::AcqRel);
        link.send((Instant::now() + LATENCY, number, batch)).map_err(|_| gone())
    }

    fn poll(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        lock(&self.inner).poll(out)
    }

    fn wait(&mut self, out: &mut Replies, timeout: Duration) -> Result<(), StoreError> {
        // Short waits: the carrier needs the real connection to deliver.
        let deadline = Instant::now() + timeout;
        loop {
            let before = out.responses.len() + out.acked.len();
            lock(&self.inner).poll(out)?;
            if out.responses.len() + out.acked.len() > before || Instant::now() >= deadline {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError> {
        lock(&self.inner).notifications(out)
    }

    fn patience(&self) -> Duration {
        lock(&self.inner).patience() + LATENCY
    }

    fn halt(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        self.cut.store(true, Ordering::Release);
        self.link = None;
        if let Some(c) = self.carrier.take() {
            let _ = c.join();
        }
        lock(&self.inner).halt(out)
    }
}

impl Drop for SlowConnection {
    fn drop(&mut self) {
        // The carrier finishes delivering on its own; it holds the real connection until then.
        self.link = None;
        self.carrier = None;
    }
}

impl SlowLink {
    /// `conn`, its batches held on the way.
    fn slowed(&self, conn: Box<dyn Connection>) -> Box<dyn Connection> {
        let on_the_way = Arc::new(AtomicUsize::new(0));
        self.on_the_way.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(on_the_way.clone());
        Box::new(SlowConnection::new(conn, on_the_way))
    }
}

impl Backend for SlowLink {
    fn name(&self) -> String {
        format!("{} over a slow link", self.inner.name())
    }
    fn register_custom_ops(&self, vertex: u16, ops: &[CustomOp]) -> Result<(), StoreError> {
        self.inner.register_custom_ops(vertex, ops)
    }
    fn connect(&self, client: InstanceId) -> Result<Box<dyn Connection>, StoreError> {
        Ok(self.slowed(self.inner.connect(client)?))
    }
    fn connect_at(&self, client: InstanceId, epoch: u32) -> Result<Box<dyn Connection>, StoreError> {
        Ok(self.slowed(self.inner.connect_at(client, epoch)?))
    }
    fn fence(&self, client: InstanceId, epoch: u32) -> Result<(), StoreError> {
        self.inner.fence(client, epoch)
    }
    fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        self.inner.checkpoint()
    }
    fn timers_of(&self, owner: InstanceId) -> Result<Vec<(StoreKey, u64)>, StoreError> {
        self.inner.timers_of(owner)
    }
    fn values_of(&self, vertex: u16, objects: &[u16]) -> Result<Option<Vec<(StoreKey, Value)>>, StoreError> {
        self.inner.values_of(vertex, objects)
    }
    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }
    fn reads_as_of(&self) -> bool {
        self.inner.reads_as_of()
    }
    fn takeover_returns_at_once(&self) -> bool {
        self.inner.takeover_returns_at_once()
    }
    fn finish_interrupted_batch(&self, owner: InstanceId) -> Result<usize, StoreError> {
        self.inner.finish_interrupted_batch(owner)
    }
    fn takeover(&self, owner: InstanceId, objects: Option<&[u16]>, parts: &TakeoverParts) -> Result<usize, StoreError> {
        self.inner.takeover(owner, objects, parts)
    }
    fn clocks_updated_by(&self, vertex: u16) -> Result<Vec<Clock>, StoreError> {
        self.inner.clocks_updated_by(vertex)
    }
    fn wipe(&self) -> Result<(), StoreError> {
        self.inner.wipe()
    }
    fn restore(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.inner.restore(checkpoint)?;
        let links = self.on_the_way.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let deadline = Instant::now() + Duration::from_secs(5);
        while links.iter().any(|n| n.load(Ordering::Acquire) > 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }
}

/// The NAT's shared counters and a detector's state over a real capture; the store crashes
/// with batches of counter updates still on the link. Thirty-two crashes at different
/// points: where a batch lands relative to the rebuild's steps decides whether it does harm.
fn crash_with_batches_on_the_way(backend: impl Fn(u64) -> Arc<dyn Backend>) {
    let c = sluice_runtime::Chain::load(&repo_file("chains/nat-trojan.yaml")).expect("shipped chain");
    let p: Vec<_> = trace("echo-connections.pcap").into_iter().take(1_500).collect();
    for (i, at) in (100..1_500).step_by(45).enumerate() {
        let events = vec![event(At::Packet(at), Action::CrashStore)];
        let r = run(&c, &p, events, EngineConfig::default(), backend(i as u64));
        assert!(r.equivalent, "store crash at packet {at}:\n{}", r.render());
    }
}

fn repo_file(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

#[test]
fn a_store_crash_on_redis_with_batches_on_the_way_loses_and_doubles_nothing() {
    let Some(_) = redis("probe") else {
        panic!("SLUICE_REDIS_URL is not set: run the suite through scripts/test-all.sh, which starts Redis");
    };
    crash_with_batches_on_the_way(|i| {
        let inner = redis(&format!("slow{i}")).unwrap_or_else(|| panic!("SLUICE_REDIS_URL"));
        SlowLink::over(inner)
    });
}

#[test]
fn a_store_crash_of_the_embedded_store_with_batches_on_the_way_loses_and_doubles_nothing() {
    crash_with_batches_on_the_way(|_| SlowLink::over(embedded()));
}
