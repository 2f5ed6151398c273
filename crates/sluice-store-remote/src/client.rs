//! [`RemoteBackend`]: the store of another process, reached over TCP (`sluice://host:port`).

use crate::protocol::{
    read_frame, write_frame, AdminAnswer, AdminRequest, BatchOut, Delivery, FrameError, Hello, Role, Welcome, VERSION,
};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{CustomOp, Value};
use sluice_store::{
    Backend, Checkpoint, Connection, Notification, Replies, Request, StoreError, StoreKey, TakeoverParts,
};
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a served store is, parsed from `sluice://HOST:PORT[?token=TOKEN]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// `HOST:PORT`.
    pub addr: String,
    /// The server's token (empty: none).
    pub token: String,
    /// The store space (empty: the default one).
    pub space: String,
    /// `ephemeral=1`: the space is dropped when the [`RemoteBackend`] is.
    pub ephemeral: bool,
}

impl RemoteUrl {
    /// Parses a `sluice://HOST:PORT[?token=T][&space=S][&ephemeral=1]` URL.
    pub fn parse(url: &str) -> Result<RemoteUrl, StoreError> {
        let bad = |why: &str| {
            StoreError::Protocol(format!(
                "store URL `{url}`: {why} (expected sluice://HOST:PORT[?token=TOKEN][&space=NAME][&ephemeral=1])"
            ))
        };
        let rest = url.strip_prefix("sluice://").ok_or_else(|| bad("not a sluice:// URL"))?;
        let (addr, query) = rest.split_once('?').unwrap_or((rest, ""));
        let Some((host, port)) = addr.rsplit_once(':') else { return Err(bad("no port")) };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        port.parse::<u16>().map_err(|_| bad("the port is not a number from 0 to 65535"))?;
        let mut token = String::new();
        let mut space = String::new();
        let mut ephemeral = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("token", t)) => token = t.to_string(),
                Some(("space", s)) => space = s.to_string(),
                Some(("ephemeral", "1")) => ephemeral = true,
                Some(("ephemeral", "0")) => ephemeral = false,
                _ => return Err(bad(&format!("unknown parameter `{pair}`"))),
            }
        }
        Ok(RemoteUrl { addr: addr.to_string(), token, space, ephemeral })
    }
}

/// A store served by `sluice store serve` (a [`StoreServer`](crate::StoreServer)) in another
/// process. Each NF instance gets a TCP connection of its own; administration (custom
/// operations, checkpoints, takeovers) goes over one more.
pub struct RemoteBackend {
    url: RemoteUrl,
    served: String,
    admin: Mutex<Option<Link>>,
}

/// A connected, greeted stream.
struct Link {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    buf: Vec<u8>,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn frame_err(addr: &str) -> impl Fn(FrameError) -> StoreError + '_ {
    move |e| match e {
        FrameError::Malformed(_) | FrameError::TooLarge(_) => StoreError::Protocol(format!("store server {addr}: {e}")),
        _ => StoreError::Unavailable(format!("store server {addr}: {e}")),
    }
}

impl Link {
    /// Connects and says hello; returns the link and the served store's name.
    fn open(url: &RemoteUrl, role: Role) -> Result<(Link, String), StoreError> {
        let addrs: Vec<SocketAddr> =
            url.addr.to_socket_addrs().map_err(|e| unavailable(format!("store server {}: {e}", url.addr)))?.collect();
        let mut last = None;
        let mut stream = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(stream) = stream else {
            let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
            return Err(unavailable(format!("cannot reach the store server {}: {why}", url.addr)));
        };
        let io = |e: std::io::Error| unavailable(format!("store server {}: {e}", url.addr));
        stream.set_nodelay(true).map_err(io)?;
        let mut link = Link {
            reader: BufReader::with_capacity(64 * 1024, stream.try_clone().map_err(io)?),
            writer: BufWriter::with_capacity(64 * 1024, stream),
            buf: Vec::new(),
        };
        let hello = Hello { version: VERSION, token: url.token.clone(), space: url.space.clone(), role };
        write_frame(&mut link.writer, &hello, &mut link.buf).map_err(frame_err(&url.addr))?;
        link.writer.flush().map_err(io)?;
        match read_frame::<Welcome>(&mut link.reader, &mut link.buf).map_err(frame_err(&url.addr))? {
            Welcome::Accepted(name) => Ok((link, name)),
            Welcome::Refused(why) => Err(StoreError::Protocol(format!("the store server {} refused: {why}", url.addr))),
            Welcome::Failed(e) => Err(e),
        }
    }

    fn send<T: serde::Serialize>(&mut self, msg: &T, addr: &str) -> Result<(), StoreError> {
        write_frame(&mut self.writer, msg, &mut self.buf).map_err(frame_err(addr))?;
        self.writer.flush().map_err(|e| unavailable(format!("store server {addr}: {e}")))
    }

    fn receive(&mut self, addr: &str) -> Result<AdminAnswer, StoreError> {
        read_frame(&mut self.reader, &mut self.buf).map_err(frame_err(addr))
    }
}

impl RemoteBackend {
    /// Connects to the server at `url` (`sluice://HOST:PORT[?token=TOKEN]`), checking that it
    /// answers and accepts the token.
    pub fn connect(url: &str) -> Result<RemoteBackend, StoreError> {
        let url = RemoteUrl::parse(url)?;
        let (link, served) = Link::open(&url, Role::Admin)?;
        Ok(RemoteBackend { url, served, admin: Mutex::new(Some(link)) })
    }

    /// Sends one administration request and reads its answer (every answer but a takeover's
    /// is one frame). A broken link is dropped and opened again by the next call.
    fn ask(&self, req: &AdminRequest, mut part: impl FnMut(sluice_store::Takeover)) -> Result<AdminAnswer, StoreError> {
        let mut guard = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Link::open(&self.url, Role::Admin)?.0);
        }
        let Some(link) = guard.as_mut() else { return Err(unavailable("no link")) };
        let addr = &self.url.addr;
        let result = (|| {
            link.send(req, addr)?;
            loop {
                match link.receive(addr)? {
                    AdminAnswer::TakeoverPart(p) => part(p),
                    AdminAnswer::Failed(e) => return Err(e),
                    other => return Ok(other),
                }
            }
        })();
        if matches!(result, Err(StoreError::Unavailable(_) | StoreError::Protocol(_))) {
            *guard = None;
        }
        result
    }

    /// Tells the server to forget this backend's space: the next connection to its name gets
    /// an empty store (a space lives until then, or until the server stops). With
    /// `ephemeral=1` in the URL, dropping the backend does this.
    pub fn drop_space(&self) -> Result<(), StoreError> {
        match self.ask(&AdminRequest::DropSpace, |_| {})? {
            AdminAnswer::Done => Ok(()),
            a => Err(self.unexpected(a)),
        }
    }

    fn unexpected(&self, a: AdminAnswer) -> StoreError {
        StoreError::Protocol(format!("store server {}: unexpected answer {a:?}", self.url.addr))
    }
}

impl Drop for RemoteBackend {
    fn drop(&mut self) {
        if self.url.ephemeral {
            if let Err(e) = self.drop_space() {
                tracing::warn!(space = %self.url.space, error = %e, "could not drop an ephemeral store space");
            }
        }
    }
}

impl Backend for RemoteBackend {
    fn name(&self) -> String {
        format!("sluice://{} ({})", self.url.addr, self.served)
    }

    fn is_shared(&self) -> bool {
        true
    }

    /// The server's store is an embedded one.
    fn reads_as_of(&self) -> bool {
        true
    }

    fn register_custom_ops(&self, vertex: u16, ops: &[CustomOp]) -> Result<(), StoreError> {
        let names = ops.iter().map(|o| o.name.to_string()).collect();
        match self.ask(&AdminRequest::RegisterCustomOps { vertex, names }, |_| {})? {
            AdminAnswer::Done => Ok(()),
            a => Err(self.unexpected(a)),
        }
    }

    fn connect(&self, client: InstanceId) -> Result<Box<dyn Connection>, StoreError> {
        Ok(Box::new(RemoteConnection::open(&self.url, Role::Instance(client))?))
    }

    fn connect_at(&self, client: InstanceId, epoch: u32) -> Result<Box<dyn Connection>, StoreError> {
        Ok(Box::new(RemoteConnection::open(&self.url, Role::InstanceAt(client, epoch))?))
    }

    fn fence(&self, instance: InstanceId, epoch: u32) -> Result<(), StoreError> {
        match self.ask(&AdminRequest::Fence { instance, epoch }, |_| {})? {
            AdminAnswer::Done => Ok(()),
            a => Err(self.unexpected(a)),
        }
    }

    fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        match self.ask(&AdminRequest::Checkpoint, |_| {})? {
            AdminAnswer::Checkpoint(c) => Ok(c),
            a => Err(self.unexpected(a)),
        }
    }

    fn clocks_updated_by(&self, vertex: u16) -> Result<Vec<Clock>, StoreError> {
        match self.ask(&AdminRequest::ClocksUpdatedBy(vertex), |_| {})? {
            AdminAnswer::Clocks(c) => Ok(c),
            a => Err(self.unexpected(a)),
        }
    }

    fn timers_of(&self, owner: InstanceId) -> Result<Vec<(StoreKey, u64)>, StoreError> {
        match self.ask(&AdminRequest::TimersOf(owner), |_| {})? {
            AdminAnswer::Timers(t) => Ok(t),
            a => Err(self.unexpected(a)),
        }
    }

    fn values_of(&self, vertex: u16, objects: &[u16]) -> Result<Option<Vec<(StoreKey, Value)>>, StoreError> {
        match self.ask(&AdminRequest::ValuesOf { vertex, objects: objects.to_vec() }, |_| {})? {
            AdminAnswer::Values(v) => Ok(v),
            a => Err(self.unexpected(a)),
        }
    }

    fn takeover(&self, owner: InstanceId, objects: Option<&[u16]>, parts: &TakeoverParts) -> Result<usize, StoreError> {
        // The parts are passed on as they arrive, so the replacement takes one in while the
        // server streams the next; they end with one `None`.
        let req = AdminRequest::Takeover { owner, objects: objects.map(<[u16]>::to_vec) };
        match self.ask(&req, |p| {
            let _ = parts.send(Some(p));
        })? {
            AdminAnswer::TakeoverEnd => {
                let _ = parts.send(None);
                Ok(1)
            }
            a => Err(self.unexpected(a)),
        }
    }

    fn restore(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        match self.ask(&AdminRequest::Restore(checkpoint.clone()), |_| {})? {
            AdminAnswer::Done => Ok(()),
            a => Err(self.unexpected(a)),
        }
    }

    fn wipe(&self) -> Result<(), StoreError> {
        match self.ask(&AdminRequest::Wipe, |_| {})? {
            AdminAnswer::Done => Ok(()),
            a => Err(self.unexpected(a)),
        }
    }
}

/// What the reader thread has collected for the connection's owner.
#[derive(Default)]
struct Inbox {
    replies: Replies,
    notifications: Vec<Notification>,
    /// Why the connection ended, once it has.
    ended: Option<StoreError>,
    /// Who to unpark when something arrives.
    waiter: Option<Thread>,
}

/// One NF instance's connection to a served store. A reader thread collects what the server
/// sends, so [`Connection::poll`] never blocks.
struct RemoteConnection {
    addr: String,
    writer: BufWriter<TcpStream>,
    buf: Vec<u8>,
    inbox: Arc<Mutex<Inbox>>,
}

impl RemoteConnection {
    fn open(url: &RemoteUrl, role: Role) -> Result<RemoteConnection, StoreError> {
        let (link, _) = Link::open(url, role)?;
        let Link { mut reader, writer, .. } = link;
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let collected = inbox.clone();
        let addr = url.addr.clone();
        std::thread::Builder::new()
            .name("store-client".into())
            .spawn(move || {
                let mut buf = Vec::new();
                loop {
                    let got = read_frame::<Delivery>(&mut reader, &mut buf);
                    let mut inbox = collected.lock().unwrap_or_else(|p| p.into_inner());
                    let end = match got {
                        Ok(Delivery::Arrived(r, n)) => {
                            inbox.replies.responses.extend(r.responses);
                            inbox.replies.acked.extend(r.acked);
                            inbox.notifications.extend(n);
                            None
                        }
                        Ok(Delivery::Failed(e)) => Some(e),
                        Err(e) => Some(frame_err(&addr)(e)),
                    };
                    let stop = end.is_some();
                    if stop {
                        inbox.ended = end;
                    }
                    if let Some(w) = &inbox.waiter {
                        w.unpark();
                    }
                    if stop {
                        return;
                    }
                }
            })
            .map_err(unavailable)?;
        Ok(RemoteConnection { addr: url.addr.clone(), writer, buf: Vec::new(), inbox })
    }

    fn inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for RemoteConnection {
    fn drop(&mut self) {
        // Ends the reader thread (and the server's side) at once.
        let _ = self.writer.get_ref().shutdown(Shutdown::Both);
    }
}

impl Connection for RemoteConnection {
    fn send(&mut self, number: u64, batch: Arc<[Request]>) -> Result<(), StoreError> {
        if let Some(e) = &self.inbox().ended {
            return Err(e.clone());
        }
        write_frame(&mut self.writer, &BatchOut { number, requests: &batch }, &mut self.buf)
            .map_err(frame_err(&self.addr))?;
        self.writer.flush().map_err(|e| unavailable(format!("store server {}: {e}", self.addr)))
    }

    fn poll(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        let mut inbox = self.inbox();
        if inbox.replies.is_empty() {
            if let Some(e) = &inbox.ended {
                return Err(e.clone());
            }
            return Ok(());
        }
        out.responses.append(&mut inbox.replies.responses);
        out.acked.append(&mut inbox.replies.acked);
        Ok(())
    }

    fn wait(&mut self, out: &mut Replies, timeout: Duration) -> Result<(), StoreError> {
        let start = out.responses.len() + out.acked.len();
        let deadline = Instant::now() + timeout;
        self.inbox().waiter = Some(std::thread::current());
        // A round trip to a served store takes tens of microseconds: yield first, sleep after.
        let yield_until = Instant::now() + Duration::from_micros(50);
        let result = loop {
            if let Err(e) = self.poll(out) {
                break Err(e);
            }
            let now = Instant::now();
            if out.responses.len() + out.acked.len() > start || now >= deadline {
                break Ok(());
            }
            if now < yield_until {
                std::thread::yield_now();
            } else {
                std::thread::park_timeout(deadline - now);
            }
        };
        self.inbox().waiter = None;
        result
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError> {
        out.append(&mut self.inbox().notifications);
        Ok(())
    }

    fn set_waker(&mut self, thread: Thread) -> bool {
        self.inbox().waiter = Some(thread);
        true
    }
}
