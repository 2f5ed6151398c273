//! [`StoreServer`]: a store (the embedded one) served over TCP.

use crate::protocol::{
    read_frame, write_frame, AdminAnswer, AdminRequest, BatchIn, Delivery, FrameError, Hello, Role, Welcome, VERSION,
};
use sluice_state::CustomOp;
use sluice_store::{Backend, Connection, Notification, Replies, StoreError};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Turns a pump yields, finding nothing, before it sleeps until woken (NAT over a served
/// store, 1 M packets: 1.25 Mpps without, 1.40 with 64; docs/benchmarks.md).
const IDLE_YIELDS: u32 = 64;

/// How long a connection may take to say [`Hello`].
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The custom operations a server can run, by name: the server runs its own copy of an NF's
/// operation (code cannot travel), so it must know every operation its clients register.
pub type CustomOpRegistry = HashMap<&'static str, CustomOp>;

/// What a server has seen, for its report and metrics.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Instance connections accepted.
    pub instances: AtomicU64,
    /// Administration connections accepted.
    pub admins: AtomicU64,
    /// Connections refused (version, token, malformed hello).
    pub refused: AtomicU64,
    /// Connections that ended on a malformed frame.
    pub malformed: AtomicU64,
    /// Batches received.
    pub batches: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Spaces kept now.
    pub spaces: AtomicU64,
}

/// Makes the store of a space the first time a client addresses it.
pub type StoreFactory = Box<dyn Fn() -> Result<Arc<dyn Backend>, StoreError> + Send + Sync>;

/// The most spaces a server keeps (each is a store with its own threads).
pub const MAX_SPACES: usize = 256;

struct Shared {
    factory: StoreFactory,
    spaces: Mutex<HashMap<String, Arc<dyn Backend>>>,
    registry: CustomOpRegistry,
    token: String,
    stats: Arc<ServerStats>,
    stop: AtomicBool,
    /// Open connections by number, to shut down on stop.
    open: Mutex<HashMap<u64, TcpStream>>,
}

/// A store served to NF instances of other processes. Dropping it (or [`StoreServer::stop`])
/// closes the listener and every connection.
pub struct StoreServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Serves stores made by `factory`, one per space, on `addr` (port 0: any free port, see
    /// [`StoreServer::local_addr`]). Clients must present `token` when it is not empty.
    /// `registry` lists the custom operations clients may register.
    pub fn start(
        factory: StoreFactory,
        addr: impl ToSocketAddrs + std::fmt::Display,
        token: &str,
        registry: CustomOpRegistry,
    ) -> Result<StoreServer, ServeError> {
        let listen_err = |source| ServeError::Listen { addr: addr.to_string(), source };
        let listener = TcpListener::bind(&addr).map_err(listen_err)?;
        let local = listener.local_addr().map_err(listen_err)?;
        let shared = Arc::new(Shared {
            factory,
            spaces: Mutex::new(HashMap::new()),
            registry,
            token: token.to_string(),
            stats: Arc::new(ServerStats::default()),
            stop: AtomicBool::new(false),
            open: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("store-accept".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(listen_err)?;
        Ok(StoreServer { shared, addr: local, acceptor: Some(acceptor) })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server has seen so far (shared: it goes on counting).
    pub fn stats(&self) -> Arc<ServerStats> {
        self.shared.stats.clone()
    }

    /// Stops accepting and closes every connection.
    pub fn stop(&mut self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the acceptor with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for (_, s) in lock(&self.shared.open).drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for (number, stream) in (0u64..).zip(listener.incoming()) {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "store server: accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        if let Ok(s) = stream.try_clone() {
            lock(&shared.open).insert(number, s);
        }
        let s = shared.clone();
        shared.stats.open.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new().name("store-conn".into()).spawn(move || {
            let result = serve_connection(stream, &s);
            lock(&s.open).remove(&number);
            s.stats.open.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = result {
                match e {
                    FrameError::Closed => {}
                    FrameError::Malformed(_) | FrameError::TooLarge(_) => {
                        s.stats.malformed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(peer, error = %e, "store server: connection ended on a malformed frame");
                    }
                    FrameError::Io(_) => tracing::debug!(peer, error = %e, "store server: connection ended"),
                }
            }
        });
        if let Err(e) = spawned {
            lock(&shared.open).remove(&number);
            shared.stats.open.fetch_sub(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "store server: cannot start a connection's thread");
        }
    }
}

fn serve_connection(stream: TcpStream, shared: &Shared) -> Result<(), FrameError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
    let mut reader = BufReader::with_capacity(64 * 1024, stream.try_clone()?);
    let mut writer = BufWriter::with_capacity(64 * 1024, stream.try_clone()?);
    let mut buf = Vec::new();
    let hello: Hello = match read_frame(&mut reader, &mut buf) {
        Ok(h) => h,
        Err(e) => {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            let _ = write_frame(&mut writer, &Welcome::Refused(format!("expected a hello: {e}")), &mut buf);
            let _ = writer.flush();
            return Err(e);
        }
    };
    let refuse = |why: String, writer: &mut BufWriter<TcpStream>, buf: &mut Vec<u8>| {
        shared.stats.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(reason = %why, "store server: connection refused");
        write_frame(writer, &Welcome::Refused(why), buf)?;
        writer.flush()?;
        Ok(())
    };
    if hello.version != VERSION {
        let why = format!("protocol version {} is not this server's {VERSION}", hello.version);
        return refuse(why, &mut writer, &mut buf);
    }
    if hello.token != shared.token {
        let why = if hello.token.is_empty() { "this store wants a token" } else { "wrong token" };
        return refuse(why.to_string(), &mut writer, &mut buf);
    }
    let backend = match space(shared, &hello.space) {
        Ok(b) => b,
        Err(why) => return refuse(why, &mut writer, &mut buf),
    };
    stream.set_read_timeout(None)?;
    let name = format!("{} (space `{}`)", backend.name(), hello.space);
    let instance = match hello.role {
        Role::Instance(id) => Some(backend.connect(id)),
        Role::InstanceAt(id, epoch) => Some(backend.connect_at(id, epoch)),
        Role::Admin => None,
    };
    match instance {
        Some(connected) => {
            let conn = match connected {
                Ok(c) => c,
                Err(e @ StoreError::Fenced { .. }) => {
                    shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                    write_frame(&mut writer, &Welcome::Failed(e), &mut buf)?;
                    writer.flush()?;
                    return Ok(());
                }
                Err(e) => return refuse(e.to_string(), &mut writer, &mut buf),
            };
            shared.stats.instances.fetch_add(1, Ordering::Relaxed);
            write_frame(&mut writer, &Welcome::Accepted(name), &mut buf)?;
            writer.flush()?;
            serve_instance(conn, reader, writer, shared)
        }
        None => {
            shared.stats.admins.fetch_add(1, Ordering::Relaxed);
            write_frame(&mut writer, &Welcome::Accepted(name), &mut buf)?;
            writer.flush()?;
            serve_admin(reader, writer, shared, &*backend, &hello.space)
        }
    }
}

/// One instance's connection: this thread reads batches and hands them to a pump thread that
/// owns the store connection, sends them on and writes back what arrives.
fn serve_instance(
    conn: Box<dyn Connection>,
    mut reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    shared: &Shared,
) -> Result<(), FrameError> {
    let (tx, rx) = mpsc::channel::<BatchIn>();
    let pump = std::thread::Builder::new().name("store-pump".into()).spawn(move || pump(conn, rx, writer))?;
    let mut buf = Vec::new();
    let result = loop {
        match read_frame::<BatchIn>(&mut reader, &mut buf) {
            Ok(batch) => {
                shared.stats.batches.fetch_add(1, Ordering::Relaxed);
                if tx.send(batch).is_err() {
                    break Ok(()); // the pump ended: the store failed
                }
                pump.thread().unpark();
            }
            Err(e) => break Err(e),
        }
    };
    drop(tx);
    pump.thread().unpark();
    let _ = pump.join();
    result
}

fn pump(mut conn: Box<dyn Connection>, rx: mpsc::Receiver<BatchIn>, mut writer: BufWriter<TcpStream>) {
    let woken = conn.set_waker(std::thread::current());
    // Without a waker, poll; with one, the store and the reader wake us.
    let nap = if woken { Duration::from_millis(50) } else { Duration::from_micros(100) };
    let mut replies = Replies::default();
    let mut notes: Vec<Notification> = Vec::new();
    let mut buf = Vec::new();
    let mut idle = 0u32;
    let fail = |e: StoreError, writer: &mut BufWriter<TcpStream>, buf: &mut Vec<u8>| {
        let _ = write_frame(writer, &Delivery::Failed(e), buf);
        let _ = writer.flush();
        if let Ok(s) = writer.get_ref().try_clone() {
            let _ = s.shutdown(Shutdown::Both);
        }
    };
    loop {
        loop {
            match rx.try_recv() {
                Ok(b) => {
                    if let Err(e) = conn.send(b.number, b.requests.into()) {
                        return fail(e, &mut writer, &mut buf);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        if let Err(e) = conn.poll(&mut replies).and_then(|_| conn.notifications(&mut notes)) {
            return fail(e, &mut writer, &mut buf);
        }
        if replies.is_empty() && notes.is_empty() {
            // A busy instance sends its next batch within microseconds: yield a few turns
            // before sleeping, which would cost a wake-up (a system call) per batch.
            idle += 1;
            if idle < IDLE_YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::park_timeout(nap);
            }
            continue;
        }
        idle = 0;
        let out = Delivery::Arrived(std::mem::take(&mut replies), std::mem::take(&mut notes));
        if write_frame(&mut writer, &out, &mut buf).and_then(|_| Ok(writer.flush()?)).is_err() {
            return; // the client went away; the reader sees it too
        }
    }
}

/// The store of space `name`, made on first use.
fn space(shared: &Shared, name: &str) -> Result<Arc<dyn Backend>, String> {
    let valid = name.len() <= 64 && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    if !valid {
        return Err(format!("space name `{name}`: at most 64 letters, digits, `-` or `_`"));
    }
    let mut spaces = lock(&shared.spaces);
    if let Some(b) = spaces.get(name) {
        return Ok(b.clone());
    }
    if spaces.len() >= MAX_SPACES {
        return Err(format!("this server already keeps {MAX_SPACES} spaces"));
    }
    let b = (shared.factory)().map_err(|e| format!("cannot make a store for space `{name}`: {e}"))?;
    spaces.insert(name.to_string(), b.clone());
    shared.stats.spaces.store(spaces.len() as u64, Ordering::Relaxed);
    tracing::info!(space = name, "store server: new space");
    Ok(b)
}

fn serve_admin(
    mut reader: BufReader<TcpStream>,
    mut writer: BufWriter<TcpStream>,
    shared: &Shared,
    b: &dyn Backend,
    space: &str,
) -> Result<(), FrameError> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    loop {
        let req: AdminRequest = read_frame(&mut reader, &mut buf)?;
        let answer = match req {
            AdminRequest::RegisterCustomOps { vertex, names } => {
                match names.iter().map(|n| shared.registry.get(n.as_str()).copied().ok_or(n)).collect::<Result<Vec<_>, _>>() {
                    Ok(ops) => done(b.register_custom_ops(vertex, &ops)),
                    Err(name) => AdminAnswer::Failed(StoreError::Protocol(format!(
                        "this store server does not know the custom operation `{name}` (it knows those of its own NF library)"
                    ))),
                }
            }
            AdminRequest::Checkpoint => b.checkpoint().map_or_else(AdminAnswer::Failed, AdminAnswer::Checkpoint),
            AdminRequest::ClocksUpdatedBy(vertex) => {
                b.clocks_updated_by(vertex).map_or_else(AdminAnswer::Failed, AdminAnswer::Clocks)
            }
            AdminRequest::TimersOf(owner) => b.timers_of(owner).map_or_else(AdminAnswer::Failed, AdminAnswer::Timers),
            AdminRequest::ValuesOf { vertex, objects } => {
                b.values_of(vertex, &objects).map_or_else(AdminAnswer::Failed, AdminAnswer::Values)
            }
            AdminRequest::Takeover { owner, objects } => {
                let (tx, rx) = mpsc::channel();
                match b.takeover(owner, objects.as_deref(), &tx) {
                    Ok(ends) => {
                        drop(tx);
                        let mut seen = 0;
                        while seen < ends {
                            match rx.recv() {
                                Ok(Some(part)) => write_frame(&mut writer, &AdminAnswer::TakeoverPart(part), &mut out)?,
                                Ok(None) => seen += 1,
                                Err(_) => break,
                            }
                        }
                        if seen < ends {
                            AdminAnswer::Failed(StoreError::Unavailable("the store stopped during a takeover".into()))
                        } else {
                            AdminAnswer::TakeoverEnd
                        }
                    }
                    Err(e) => AdminAnswer::Failed(e),
                }
            }
            AdminRequest::Restore(cp) => done(b.restore(&cp)),
            AdminRequest::Wipe => done(b.wipe()),
            AdminRequest::Fence { instance, epoch } => done(b.fence(instance, epoch)),
            AdminRequest::DropSpace => {
                let mut spaces = lock(&shared.spaces);
                spaces.remove(space);
                shared.stats.spaces.store(spaces.len() as u64, Ordering::Relaxed);
                drop(spaces);
                tracing::info!(space, "store server: space dropped");
                AdminAnswer::Done
            }
        };
        write_frame(&mut writer, &answer, &mut out)?;
        writer.flush()?;
    }
}

fn done(r: Result<(), StoreError>) -> AdminAnswer {
    r.map_or_else(AdminAnswer::Failed, |_| AdminAnswer::Done)
}
