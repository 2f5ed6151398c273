//! `sluice store serve`, and opening a store from its URL (one place for every command).

use crate::{exit, fail, Failure};
use clap::{Args, Subcommand};
use sluice_store::{Backend, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What `--store` takes, for error messages.
pub const STORE_URLS: &str =
    "`embedded`, `redis://host:port`, `redis+cluster://host:port,...` or `sluice://host:port[?token=T&space=S]`";

/// The kinds of store URL.
enum StoreUrl<'a> {
    Embedded,
    Redis(&'a str),
    Served(&'a str),
}

fn kind(url: &str) -> Option<StoreUrl<'_>> {
    if url == "embedded" {
        Some(StoreUrl::Embedded)
    } else if url.starts_with("redis://") || url.starts_with("redis+cluster://") {
        Some(StoreUrl::Redis(url))
    } else if url.starts_with("sluice://") {
        Some(StoreUrl::Served(url))
    } else {
        None
    }
}

/// Checks a store URL's form without connecting (exit 2 on a bad one).
pub fn check_store_url(url: &str) -> Result<(), Failure> {
    let invalid = |e: StoreError| fail(exit::INVALID)(anyhow::anyhow!("--store {url}: {e}"));
    match kind(url) {
        Some(StoreUrl::Embedded) => Ok(()),
        Some(StoreUrl::Redis(u)) => sluice_redis::RedisBackend::check_url(u).map_err(invalid),
        Some(StoreUrl::Served(u)) => sluice_store_remote::RemoteUrl::parse(u).map(|_| ()).map_err(invalid),
        None => Err(fail(exit::INVALID)(anyhow::anyhow!("--store takes {STORE_URLS}, not `{url}`"))),
    }
}

/// Opens the store `url` names: a new embedded store with `threads` shard threads, Redis, or a
/// store served by `sluice store serve`. A bad URL exits 2, a store that does not answer 1.
pub fn open_store(url: &str, threads: usize) -> Result<Arc<dyn Backend>, Failure> {
    check_store_url(url)?;
    let failed = |e: StoreError| fail(exit::FAILED)(anyhow::anyhow!("store {url}: {e}"));
    Ok(match kind(url) {
        Some(StoreUrl::Redis(u)) => Arc::new(sluice_redis::RedisBackend::connect(u).map_err(failed)?),
        Some(StoreUrl::Served(u)) => Arc::new(sluice_store_remote::RemoteBackend::connect(u).map_err(failed)?),
        _ => Arc::new(
            sluice_store::EmbeddedStore::start(threads.max(1))
                .map_err(|e| fail(exit::FAILED)(anyhow::Error::new(e)))?,
        ),
    })
}

/// Serve a state store to other processes.
#[derive(Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Serve embedded stores over TCP to the NF instances of other processes on this machine
    /// or others (`sluice run --store sluice://HOST:PORT[?space=NAME]`): one independent store
    /// per space name, made when first addressed, so several runs (or the halves of a split
    /// chain) share one server without seeing each other's values. Prints the address it
    /// listens on, then serves until Ctrl-C or SIGTERM. Custom operations run here, from this
    /// binary's NF library. No TLS: keep it on loopback or a private network, with a token.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on (port 0: any free port; the one chosen is printed).
    #[arg(long, default_value = "127.0.0.1:7600")]
    listen: String,
    /// Shard threads of the embedded store.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A file holding the token clients must present (`?token=...` in their URL); without
    /// it, any client that reaches the address is served.
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// Stop after this many seconds (default: run until Ctrl-C or SIGTERM).
    #[arg(long)]
    duration: Option<f64>,
    #[command(flatten)]
    control: crate::cluster::ControlArgs,
}

/// A store server's metrics, read from its statistics at each scrape.
#[derive(Debug, Clone)]
struct ServerMetrics(Arc<sluice_store_remote::ServerStats>);

impl prometheus_client::collector::Collector for ServerMetrics {
    fn encode(&self, mut enc: prometheus_client::encoding::DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use crate::cluster::{counter, gauge};
        let s = &self.0;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let e = &mut enc;
        gauge(e, "sluice_store_server_connections", "Connections open now.", get(&s.open))?;
        gauge(e, "sluice_store_server_spaces", "Store spaces kept now.", get(&s.spaces))?;
        counter(e, "sluice_store_server_instance_connections", "NF instance connections accepted.", get(&s.instances))?;
        counter(e, "sluice_store_server_admin_connections", "Administration connections accepted.", get(&s.admins))?;
        counter(e, "sluice_store_server_batches", "Batches of requests received.", get(&s.batches))?;
        counter(
            e,
            "sluice_store_server_refused",
            "Connections refused (version, token, space, bad hello).",
            get(&s.refused),
        )?;
        counter(e, "sluice_store_server_malformed", "Connections ended on a malformed frame.", get(&s.malformed))
    }
}

/// `sluice store ...`.
pub fn cmd_store(a: StoreArgs) -> Result<(), Failure> {
    match a.command {
        StoreCommand::Serve(s) => serve(s),
    }
}

fn serve(a: ServeArgs) -> Result<(), Failure> {
    let invalid = |e: anyhow::Error| fail(exit::INVALID)(e);
    if a.threads == 0 || a.threads > 64 {
        return Err(invalid(anyhow::anyhow!("--threads must be 1 to 64, not {}", a.threads)));
    }
    let token = match &a.token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .map_err(|e| invalid(anyhow::anyhow!("--token-file {}: {e}", p.display())))?;
            let t = t.trim().to_string();
            if t.is_empty() || t.contains(['&', '?', ' ']) {
                return Err(invalid(anyhow::anyhow!(
                    "--token-file {}: the token must be non-empty, without spaces, `&` or `?`",
                    p.display()
                )));
            }
            t
        }
        None => String::new(),
    };
    let threads = a.threads;
    let factory: sluice_store_remote::StoreFactory =
        Box::new(move || Ok(Arc::new(sluice_store::EmbeddedStore::start(threads)?) as Arc<dyn Backend>));
    let registry = sluice_nfs::custom_ops().into_iter().map(|o| (o.name, o)).collect();
    let mut server = sluice_store_remote::StoreServer::start(factory, a.listen.as_str(), &token, registry)
        .map_err(|e| fail(exit::FAILED)(e.into()))?;
    let addr = server.local_addr();
    let stats = server.stats();
    a.control.start(|| crate::cluster::metrics_route(ServerMetrics(stats.clone())))?;
    println!(
        "serving embedded stores ({} shard threads per space) on sluice://{addr}{}",
        a.threads,
        if token.is_empty() { "" } else { " (token required)" }
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    tracing::info!(%addr, threads = a.threads, token = !token.is_empty(), "store serving");
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
    let until = a.duration.map(|d| std::time::Instant::now() + Duration::from_secs_f64(d.max(0.0)));
    while !stop.load(Ordering::Relaxed) && until.is_none_or(|u| std::time::Instant::now() < u) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = &stats;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "stopped: {} instance connections, {} admin connections, {} batches, {} refused, {} malformed",
        n(&st.instances),
        n(&st.admins),
        n(&st.batches),
        n(&st.refused),
        n(&st.malformed)
    );
    server.stop();
    Ok(())
}
