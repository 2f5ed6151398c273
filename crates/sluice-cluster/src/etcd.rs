//! A small etcd v3 client over etcd's JSON gateway (`/v3/...`, part of every etcd server since
//! 3.3): leases, keys, one transaction shape, and watches. Keys and values are base64 in the
//! JSON, 64-bit numbers are strings; both are handled here and nowhere else.
//!
//! Why the gateway and not gRPC: the gRPC clients generate their code from etcd's protobuf files
//! at build time and need `protoc` installed, which every build of Sluice (the README's first
//! command included) would then need. The gateway is the same API, served by the same server.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The endpoint is not an `http://host:port` URL.
    #[error("etcd endpoint `{0}`: expected http://HOST:PORT")]
    Endpoint(String),
    /// etcd could not be reached or did not answer in time.
    #[error("etcd at {endpoint}: {source}")]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// The transport's error.
        source: Box<ureq::Error>,
    },
    /// etcd answered with an error.
    #[error("etcd at {endpoint} refused {path}: {status}: {body}")]
    Refused {
        /// The endpoint.
        endpoint: String,
        /// The API path.
        path: &'static str,
        /// The HTTP status.
        status: u16,
        /// What etcd said.
        body: String,
    },
    /// etcd's answer was not what its API documents.
    #[error("etcd at {endpoint}: unexpected answer to {path}: {detail}")]
    Answer {
        /// The endpoint.
        endpoint: String,
        /// The API path.
        path: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The lease is gone (expired or revoked): whatever was attached to it has been deleted.
    #[error("lease {0:#x} has expired")]
    LeaseExpired(i64),
}

/// A key and its value, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key.
    pub create_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A change to a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was created or changed.
    Put(KeyValue),
    /// The key was deleted (or its lease expired).
    Delete {
        /// The key.
        key: String,
    },
}

/// A client of one etcd endpoint.
#[derive(Clone)]
pub struct Etcd {
    /// The members' client endpoints, in the order given.
    endpoints: Arc<[String]>,
    /// The one that answered last: calls go there first.
    current: Arc<AtomicUsize>,
    agent: ureq::Agent,
    /// For watches: no overall time limit, only on connecting.
    streaming: ureq::Agent,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd").field("endpoints", &self.endpoints).field("current", &self.endpoint()).finish()
    }
}

/// `s` as etcd's JSON wants bytes.
fn b64(s: impl AsRef<[u8]>) -> String {
    B64.encode(s)
}

/// The end of the key range that holds every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the key space.
    vec![0]
}

impl Etcd {
    /// A client of `endpoints`: one `http://HOST:PORT`, or several members of one etcd
    /// cluster separated by commas. A call that cannot reach a member goes on to the next
    /// (each once), and the member that answered is asked first from then on. `timeout` bounds
    /// every call but watches. Nothing is sent until the first call.
    pub fn new(endpoints: &str, timeout: Duration) -> Result<Etcd, EtcdError> {
        let mut list = Vec::new();
        for endpoint in endpoints.split(',').map(|e| e.trim().trim_end_matches('/')) {
            let hostport = endpoint.strip_prefix("http://").ok_or_else(|| EtcdError::Endpoint(endpoint.to_string()))?;
            if hostport.is_empty() || hostport.contains('/') || !hostport.contains(':') {
                return Err(EtcdError::Endpoint(endpoint.to_string()));
            }
            list.push(endpoint.to_string());
        }
        let agent =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().into();
        let streaming =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_connect(Some(timeout)).build().into();
        Ok(Etcd { endpoints: list.into(), current: Arc::new(AtomicUsize::new(0)), agent, streaming })
    }

    /// The endpoint calls go to first (the member that answered last).
    pub fn endpoint(&self) -> &str {
        let i = self.current.load(Ordering::Relaxed);
        self.endpoints.get(i).or_else(|| self.endpoints.first()).map_or("", String::as_str)
    }

    /// Every endpoint this client knows.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    fn answer(&self, path: &'static str, detail: impl Into<String>) -> EtcdError {
        EtcdError::Answer { endpoint: self.endpoint().to_string(), path, detail: detail.into() }
    }

    /// POSTs `body` to `path` with `agent`, at the current member and, while members cannot
    /// be reached, at the next ones in turn; the response, if etcd accepted the request.
    ///
    /// A request whose answer was lost in a member's failure may be applied twice: every
    /// request here is a put, delete, read, lease call or create-if-absent, which a second
    /// application leaves as the first did (a second create finds the key the first made).
    fn post(
        &self,
        agent: &ureq::Agent,
        path: &'static str,
        body: Value,
    ) -> Result<ureq::http::Response<ureq::Body>, EtcdError> {
        let body = body.to_string();
        let n = self.endpoints.len().max(1);
        let first = self.current.load(Ordering::Relaxed);
        let mut last_error = None;
        for k in 0..n {
            let i = (first + k) % n;
            let Some(endpoint) = self.endpoints.get(i) else { continue };
            let url = format!("{endpoint}{path}");
            match agent.post(&url).header("Content-Type", "application/json").send(body.as_str()) {
                Ok(mut resp) => {
                    self.current.store(i, Ordering::Relaxed);
                    let status = resp.status().as_u16();
                    if !(200..300).contains(&status) {
                        let body = resp.body_mut().read_to_string().unwrap_or_default();
                        return Err(EtcdError::Refused { endpoint: endpoint.clone(), path, status, body });
                    }
                    return Ok(resp);
                }
                Err(e) => {
                    if n > 1 {
                        tracing::warn!(endpoint = %endpoint, error = %e, "etcd member unreachable; trying the next");
                    }
                    last_error = Some(EtcdError::Unreachable { endpoint: endpoint.clone(), source: Box::new(e) });
                }
            }
        }
        Err(last_error.unwrap_or_else(|| EtcdError::Endpoint(String::new())))
    }

    fn call(&self, path: &'static str, body: Value) -> Result<Value, EtcdError> {
        let mut resp = self.post(&self.agent, path, body)?;
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| EtcdError::Unreachable { endpoint: self.endpoint().to_string(), source: Box::new(e) })?;
        serde_json::from_str(&text).map_err(|e| self.answer(path, format!("{e}: {text}")))
    }

    /// Grants a lease of `ttl` seconds; returns its id.
    pub fn grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        const PATH: &str = "/v3/lease/grant";
        let v = self.call(PATH, json!({ "TTL": ttl.as_secs().max(1) }))?;
        number(&v["ID"]).ok_or_else(|| self.answer(PATH, format!("no lease id in {v}")))
    }

    /// Renews `lease`; returns its TTL in seconds. [`EtcdError::LeaseExpired`] if it is gone.
    pub fn keep_alive(&self, lease: i64) -> Result<i64, EtcdError> {
        const PATH: &str = "/v3/lease/keepalive";
        let v = self.call(PATH, json!({ "ID": lease.to_string() }))?;
        // The gateway streams keep-alive answers; one request, one `result`. A lease that is
        // gone comes back with no TTL (0).
        let ttl = number(&v["result"]["TTL"]).unwrap_or(0);
        if ttl <= 0 {
            return Err(EtcdError::LeaseExpired(lease));
        }
        Ok(ttl)
    }

    /// Revokes `lease`, deleting every key attached to it.
    pub fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() })).map(|_| ())
    }

    /// Sets `key` to `value`, attached to `lease` if given (0: none).
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        self.call("/v3/kv/put", json!({ "key": b64(key), "value": b64(value), "lease": lease.to_string() })).map(|_| ())
    }

    /// Deletes `key`.
    pub fn delete(&self, key: &str) -> Result<(), EtcdError> {
        self.call("/v3/kv/deleterange", json!({ "key": b64(key) })).map(|_| ())
    }

    /// Every key starting with `prefix`, in key order, and the store's revision then.
    pub fn get_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), EtcdError> {
        const PATH: &str = "/v3/kv/range";
        let v = self.call(PATH, json!({ "key": b64(prefix), "range_end": b64(prefix_end(prefix)) }))?;
        let revision = number(&v["header"]["revision"]).ok_or_else(|| self.answer(PATH, "no revision"))?;
        let kvs = v["kvs"].as_array().map(Vec::as_slice).unwrap_or_default();
        let kvs = kvs.iter().map(|kv| key_value(kv).ok_or_else(|| self.answer(PATH, format!("bad key {kv}"))));
        Ok((kvs.collect::<Result<_, _>>()?, revision))
    }

    /// Creates `key` with `value` on `lease` unless it exists. Returns `None` if it was
    /// created, else the key as it is (atomically: one etcd transaction).
    pub fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Option<KeyValue>, EtcdError> {
        const PATH: &str = "/v3/kv/txn";
        let k = b64(key);
        let v = self.call(
            PATH,
            json!({
                "compare": [{ "key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0" }],
                "success": [{ "request_put": { "key": k, "value": b64(value), "lease": lease.to_string() } }],
                "failure": [{ "request_range": { "key": k } }],
            }),
        )?;
        if v["succeeded"].as_bool().unwrap_or(false) {
            return Ok(None);
        }
        // The compare and the read are one transaction: the key the compare found is there.
        let kv = &v["responses"][0]["response_range"]["kvs"][0];
        key_value(kv).map(Some).ok_or_else(|| self.answer(PATH, format!("bad or missing key {kv}")))
    }

    /// Watches every key starting with `prefix` from revision `from` (0: from now). The
    /// returned watch blocks on [`Watch::next_events`] until something changes.
    pub fn watch_prefix(&self, prefix: &str, from: i64) -> Result<Watch, EtcdError> {
        let body = json!({ "create_request": {
            "key": b64(prefix), "range_end": b64(prefix_end(prefix)), "start_revision": from.to_string(),
        }});
        let resp = self.post(&self.streaming, "/v3/watch", body)?;
        let reader: Box<dyn Read + Send> = Box::new(resp.into_body().into_reader());
        Ok(Watch {
            endpoint: self.endpoint().to_string(),
            stream: serde_json::Deserializer::from_reader(reader).into_iter(),
        })
    }
}

/// A watch on a key range: a stream of changes from etcd.
pub struct Watch {
    endpoint: String,
    stream: serde_json::StreamDeserializer<'static, serde_json::de::IoRead<Box<dyn Read + Send>>, Value>,
}

impl Watch {
    /// The next changes (at least one), waiting as long as it takes. `None`: the watch ended
    /// (etcd went away or cancelled it); watch again from the last revision seen.
    pub fn next_events(&mut self) -> Option<Result<(Vec<WatchEvent>, i64), EtcdError>> {
        loop {
            let v = match self.stream.next()? {
                Ok(v) => v,
                Err(e) => {
                    return Some(Err(EtcdError::Answer {
                        endpoint: self.endpoint.clone(),
                        path: "/v3/watch",
                        detail: e.to_string(),
                    }))
                }
            };
            let result = &v["result"];
            if result["canceled"].as_bool().unwrap_or(false) {
                return None;
            }
            let Some(events) = result["events"].as_array() else { continue };
            let revision = number(&result["header"]["revision"]).unwrap_or(0);
            let events = events
                .iter()
                .filter_map(|e| match e["type"].as_str() {
                    Some("DELETE") => key(&e["kv"]).map(|key| WatchEvent::Delete { key }),
                    // PUT is the default (0) and left out of the JSON.
                    _ => key_value(&e["kv"]).map(WatchEvent::Put),
                })
                .collect::<Vec<_>>();
            if !events.is_empty() {
                return Some(Ok((events, revision)));
            }
        }
    }
}

/// A 64-bit number, which etcd's JSON writes as a string.
fn number(v: &Value) -> Option<i64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64())
}

fn key(kv: &Value) -> Option<String> {
    let raw = B64.decode(kv["key"].as_str()?).ok()?;
    String::from_utf8(raw).ok()
}

fn key_value(kv: &Value) -> Option<KeyValue> {
    Some(KeyValue {
        key: key(kv)?,
        value: kv["value"].as_str().map_or(Ok(Vec::new()), |s| B64.decode(s)).ok()?,
        create_revision: number(&kv["create_revision"]).unwrap_or(0),
        lease: number(&kv["lease"]).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges_cover_exactly_the_prefix() {
        assert_eq!(prefix_end("/sluice/nodes/"), b"/sluice/nodes0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }

    #[test]
    fn endpoints_must_be_http_host_port() {
        assert!(Etcd::new("http://127.0.0.1:2379", Duration::from_secs(1)).is_ok());
        assert!(Etcd::new("http://127.0.0.1:2379/", Duration::from_secs(1)).is_ok());
        for bad in
            ["127.0.0.1:2379", "https://x:1", "http://", "http://host", "http://h:1/v3", "http://a:1,,http://b:2"]
        {
            assert!(matches!(Etcd::new(bad, Duration::from_secs(1)), Err(EtcdError::Endpoint(_))), "{bad}");
        }
        let several = Etcd::new("http://a:1, http://b:2/,http://c:3", Duration::from_secs(1)).expect("three members");
        assert_eq!(several.endpoints(), ["http://a:1", "http://b:2", "http://c:3"]);
        assert_eq!(several.endpoint(), "http://a:1", "the first is asked first");
    }

    #[test]
    fn a_call_goes_on_to_the_next_member_and_names_the_last_one_tried() {
        // Two loopback ports nobody listens on: both are tried, the error names the last.
        let free = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port());
        let (p1, p2) = (free().expect("port"), free().expect("port"));
        let etcd =
            Etcd::new(&format!("http://127.0.0.1:{p1},http://127.0.0.1:{p2}"), Duration::from_secs(1)).expect("client");
        let e = etcd.grant(Duration::from_secs(1)).expect_err("nobody listens");
        assert!(matches!(&e, EtcdError::Unreachable { endpoint, .. } if endpoint.ends_with(&format!(":{p2}"))), "{e}");
    }

    #[test]
    fn answers_decode_numbers_as_strings_and_keys_as_base64() {
        let kv = json!({ "key": b64("/a/b"), "value": b64("x"), "create_revision": "7", "lease": "12" });
        let got = key_value(&kv).expect("a key");
        assert_eq!(got, KeyValue { key: "/a/b".into(), value: b"x".to_vec(), create_revision: 7, lease: 12 });
        assert_eq!(number(&json!("-3")), Some(-3));
        assert_eq!(number(&json!(5)), Some(5));
        assert_eq!(key_value(&json!({ "key": "%%%" })), None, "bad base64 is no key");
    }
}
