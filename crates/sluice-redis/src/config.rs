//! The backend URL: one server or a cluster, the keyspace prefix and the number of buckets.

use crate::reply::invalid;
use sluice_store::StoreError;

/// Buckets (shards) when the URL does not say.
const DEFAULT_BUCKETS: u16 = 16;

/// How the backend reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One server: its connection URL (without the query).
    Single(String),
    /// A cluster: seed addresses `host:port`.
    Cluster(Vec<String>),
}

/// The parsed URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// How to reach Redis.
    pub(crate) mode: Mode,
    /// The keyspace's name (`prefix=`).
    pub(crate) prefix: String,
    /// The number of buckets (`buckets=`).
    pub(crate) buckets: u16,
    /// Replicas that must acknowledge every write before it counts as applied (`replicas=`,
    /// Redis `WAIT`); 0: the primary's answer is enough.
    pub(crate) replicas: u8,
    /// The URL without credentials, for reports.
    pub(crate) display: String,
}

/// Parses a backend URL (see the crate docs for the forms and parameters).
pub(crate) fn parse_url(url: &str) -> Result<Config, StoreError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut prefix = "sluice".to_string();
    let mut buckets = DEFAULT_BUCKETS;
    let mut replicas = 0u8;
    for kv in query.into_iter().flat_map(|q| q.split('&')).filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "prefix" => {
                let ok = !v.is_empty()
                    && v.len() <= 64
                    && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
                if !ok {
                    return Err(invalid(format!("prefix {v:?}: use 1-64 letters, digits, '-', '_', '.'")));
                }
                prefix = v.to_string();
            }
            "buckets" => {
                buckets = v
                    .parse::<u16>()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| invalid(format!("buckets {v:?}: a number from 1 to 4096")))?;
            }
            "replicas" => {
                replicas = v
                    .parse::<u8>()
                    .ok()
                    .filter(|n| *n <= 16)
                    .ok_or_else(|| invalid(format!("replicas {v:?}: a number from 0 to 16")))?;
            }
            other => return Err(invalid(format!("unknown URL parameter {other:?} (prefix, buckets, replicas)"))),
        }
    }
    let strip_credentials = |rest: &str| match rest.rsplit_once('@') {
        Some((_, host)) => host.to_string(),
        None => rest.to_string(),
    };
    if let Some(rest) = base.strip_prefix("redis+cluster://") {
        let seeds: Vec<String> =
            rest.trim_end_matches('/').split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        if seeds.is_empty() || seeds.iter().any(|s| !s.contains(':') || s.contains('@')) {
            return Err(invalid(format!("{url}: expected redis+cluster://host:port,host:port,...")));
        }
        let display = format!("redis+cluster://{}", seeds.join(","));
        return Ok(Config { mode: Mode::Cluster(seeds), prefix, buckets, replicas, display });
    }
    if let Some(rest) = base.strip_prefix("redis://") {
        let display = format!("redis://{}", strip_credentials(rest));
        return Ok(Config { mode: Mode::Single(base.to_string()), prefix, buckets, replicas, display });
    }
    Err(invalid(format!("{url}: expected redis://host:port or redis+cluster://host:port,...")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = parse_url("redis://127.0.0.1:6390?prefix=t-1&buckets=4").unwrap();
        assert_eq!(c.mode, Mode::Single("redis://127.0.0.1:6390".into()));
        assert_eq!((c.prefix.as_str(), c.buckets), ("t-1", 4));
        let c = parse_url("redis+cluster://127.0.0.1:7390,127.0.0.1:7391").unwrap();
        assert_eq!(c.mode, Mode::Cluster(vec!["127.0.0.1:7390".into(), "127.0.0.1:7391".into()]));
        assert_eq!((c.prefix.as_str(), c.replicas), ("sluice", 0));
        assert_eq!(parse_url("redis+cluster://h:1?replicas=1").unwrap().replicas, 1);
        assert!(parse_url("redis://h:1?replicas=x").is_err());
        assert!(parse_url("redis://h:1?replicas=17").is_err());
        assert!(parse_url("redis://h:1?prefix=a:b").is_err());
        assert!(parse_url("redis://h:1?buckets=0").is_err());
        assert!(parse_url("http://h:1").is_err());
        assert_eq!(parse_url("redis://u:pw@h:1").unwrap().display, "redis://h:1");
    }
}
