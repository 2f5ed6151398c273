//! The store conformance suite (`sluice_store::conformance`) against the embedded store served
//! over TCP: every check sees the served store only through `RemoteBackend`, so the remote
//! backend must carry the store's semantics (ordering, exactly-once, notifications, timers,
//! checkpoints, takeovers, wipes) unchanged.

use sluice_store::conformance;
use sluice_store::{Backend, EmbeddedStore};
use sluice_store_remote::{CustomOpRegistry, RemoteBackend, StoreFactory, StoreServer};
use std::sync::Arc;

/// A server of a fresh embedded store (with `threads` shards) that knows the suite's custom
/// operations, and a remote backend connected to it.
fn served(threads: usize) -> (StoreServer, RemoteBackend) {
    let registry: CustomOpRegistry = conformance::CUSTOM_OPS.iter().map(|o| (o.name, *o)).collect();
    let factory: StoreFactory = Box::new(move || Ok(Arc::new(EmbeddedStore::start(threads)?) as Arc<dyn Backend>));
    let server = StoreServer::start(factory, "127.0.0.1:0", "secret", registry).expect("serve");
    let url = format!("sluice://{}?token=secret", server.local_addr());
    let remote = RemoteBackend::connect(&url).expect("connect");
    (server, remote)
}

fn run(threads: usize, name: &str) {
    let (_server, remote) = served(threads);
    conformance::run_check(&remote, name);
}

sluice_store::conformance_tests!(one_shard => |name| super::run(1, name), two_shards => |name| super::run(2, name));

/// The whole suite, one check after the other, on one served store with several clients'
/// connections coming and going.
#[test]
fn whole_suite_on_one_served_store() {
    let (server, remote) = served(2);
    for (name, check) in conformance::all() {
        if let Err(e) = check(&remote) {
            panic!("{name}: {e}");
        }
    }
    assert!(server.stats().instances.load(std::sync::atomic::Ordering::Relaxed) > 20);
}
