//! What several integration tests share (each test crate uses some of it).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

/// A path in the repository.
pub fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

/// Runs `sluice ARGS` in the repository and waits for it.
pub fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).current_dir(repo("")).args(args).output().expect("run sluice")
}

/// A command's stdout and stderr, as text.
pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A raw HTTP/1.1 request to `addr` (`HOST:PORT`): the status code and the body; status 0 if
/// nothing listens there (yet).
pub fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let len = body.len();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {len}\r\nConnection: close\r\n\r\n{body}"
    )
    .expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// Reads `child`'s stderr (piped) up to the line announcing its control endpoint; the endpoint's
/// `HOST:PORT` and the whole line. The rest of stderr is drained on a thread of its own, so the
/// run never blocks on a full pipe.
pub fn control_endpoint(child: &mut Child) -> (String, String) {
    let stderr = child.stderr.take().expect("stderr piped");
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines.next().and_then(Result::ok).unwrap_or_else(|| panic!("sluice run ended without an endpoint"));
        if let Some(a) = line.strip_prefix("control endpoint: http://") {
            let addr = a.split_whitespace().next().unwrap_or_default().to_string();
            std::thread::spawn(move || lines.for_each(drop));
            return (addr, line);
        }
    }
}
