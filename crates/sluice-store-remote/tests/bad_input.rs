//! Bad input to a store server and a server that goes away: clear errors, never a panic, and
//! the server keeps serving everyone else.

use sluice_packet::InstanceId;
use sluice_state::{CustomOp, StateKey, StateOp, Value};
use sluice_store::{Backend, EmbeddedStore, Replies, Request, StoreError, StoreKey, StoreOp};
use sluice_store_remote::protocol::{read_frame, write_frame, Hello, Role, Welcome, VERSION};
use sluice_store_remote::{RemoteBackend, StoreFactory, StoreServer};
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn server(token: &str) -> StoreServer {
    let registry = sluice_nfs::custom_ops().into_iter().map(|o| (o.name, o)).collect();
    let factory: StoreFactory = Box::new(|| Ok(Arc::new(EmbeddedStore::start(1)?) as Arc<dyn Backend>));
    StoreServer::start(factory, "127.0.0.1:0", token, registry).expect("serve")
}

/// A set and a get through a fresh connection of `remote`: the store still answers.
fn answers(remote: &RemoteBackend) -> Result<(), StoreError> {
    let mut conn = remote.connect(InstanceId(3))?;
    let key = StoreKey { vertex: 9, object: 0, key: StateKey::Id(1) };
    let req = |id, op, reply| Request { id, client: InstanceId(3), tag: None, key, op: StoreOp::State(op), reply };
    conn.send(1, vec![req(1, StateOp::Set(Value::Int(5)), false), req(2, StateOp::Get, true)].into())?;
    let mut out = Replies::default();
    for _ in 0..50 {
        conn.wait(&mut out, Duration::from_millis(100))?;
        if let Some(r) = out.responses.iter().find(|r| r.id == 2) {
            assert_eq!(r.result, Ok(Some(Value::Int(5))));
            return Ok(());
        }
    }
    Err(StoreError::Timeout(Duration::from_secs(5)))
}

#[test]
fn wrong_or_missing_token_and_bad_urls_are_refused_with_the_reason() {
    let s = server("secret");
    let a = s.local_addr();
    let err = |url: String| RemoteBackend::connect(&url).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err(format!("sluice://{a}?token=nope")).contains("wrong token"),
        "{}",
        err(format!("sluice://{a}?token=nope"))
    );
    assert!(err(format!("sluice://{a}")).contains("wants a token"));
    assert!(err(format!("sluice://{a}?tokn=secret")).contains("unknown parameter `tokn=secret`"));
    assert!(err("sluice://localhost".into()).contains("no port"));
    assert!(err("sluice://:80".into()).contains("no host"));
    assert!(err("sluice://h:99999".into()).contains("port"));
    assert!(err("redis://h:1".into()).contains("not a sluice:// URL"));
    // Nobody listening: says so, names the address.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert!(err(format!("sluice://{free}")).contains(&format!("cannot reach the store server {free}")));
    assert_eq!(s.stats().refused.load(Ordering::Relaxed), 2);
    let good = RemoteBackend::connect(&format!("sluice://{a}?token=secret")).expect("the right token is accepted");
    answers(&good).expect("the store answers");
}

#[test]
fn garbage_another_version_and_a_cut_frame_end_only_their_own_connection() {
    let s = server("");
    let a = s.local_addr();
    let mut buf = Vec::new();
    // Another protocol version.
    let mut c = TcpStream::connect(a).unwrap();
    write_frame(
        &mut c,
        &Hello { version: VERSION + 1, token: String::new(), space: String::new(), role: Role::Admin },
        &mut buf,
    )
    .unwrap();
    match read_frame::<Welcome>(&mut c, &mut buf).unwrap() {
        Welcome::Refused(why) => assert!(why.contains("protocol version"), "{why}"),
        Welcome::Accepted(_) | Welcome::Failed(_) => panic!("another version accepted"),
    }
    // Bytes that are not a hello.
    let mut c = TcpStream::connect(a).unwrap();
    c.write_all(b"\x05\x00\x00\x00GET /").unwrap();
    assert!(matches!(read_frame::<Welcome>(&mut c, &mut buf).unwrap(), Welcome::Refused(_)));
    // An absurd length.
    let mut c = TcpStream::connect(a).unwrap();
    c.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(matches!(read_frame::<Welcome>(&mut c, &mut buf).unwrap(), Welcome::Refused(_)));
    // A greeted instance that then sends garbage: its connection ends, counted.
    let mut c = TcpStream::connect(a).unwrap();
    write_frame(
        &mut c,
        &Hello { version: VERSION, token: String::new(), space: String::new(), role: Role::Instance(InstanceId(1)) },
        &mut buf,
    )
    .unwrap();
    assert!(matches!(read_frame::<Welcome>(&mut c, &mut buf).unwrap(), Welcome::Accepted(_)));
    c.write_all(&[4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).unwrap();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut rest); // the server closes it
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.stats().malformed.load(Ordering::Relaxed) < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The two malformed hellos and the malformed batch.
    assert_eq!(s.stats().malformed.load(Ordering::Relaxed), 3);
    assert_eq!(s.stats().refused.load(Ordering::Relaxed), 3);
    // Everyone else is still served.
    answers(&RemoteBackend::connect(&format!("sluice://{a}")).unwrap()).expect("still answers");
}

fn not_in_the_library(_: &mut Option<Value>, _: &Value) -> Result<Option<Value>, sluice_state::StateError> {
    Ok(None)
}

#[test]
fn an_unknown_custom_operation_is_refused_by_name_and_library_ones_register() {
    let s = server("");
    let remote = RemoteBackend::connect(&format!("sluice://{}", s.local_addr())).unwrap();
    let e = remote
        .register_custom_ops(2, &[CustomOp { name: "mystery-op", apply: not_in_the_library }])
        .expect_err("unknown operation registered");
    assert!(e.to_string().contains("custom operation `mystery-op`"), "{e}");
    remote.register_custom_ops(2, &sluice_nfs::custom_ops()).expect("the library's operations register");
    answers(&remote).expect("the link is usable after the refusal");
}

#[test]
fn a_server_that_goes_away_is_reported_as_unavailable() {
    let mut s = server("");
    let remote = RemoteBackend::connect(&format!("sluice://{}", s.local_addr())).unwrap();
    let mut conn = remote.connect(InstanceId(4)).unwrap();
    s.stop();
    let mut out = Replies::default();
    let mut seen = None;
    for _ in 0..50 {
        if let Err(e) = conn.wait(&mut out, Duration::from_millis(100)) {
            seen = Some(e);
            break;
        }
    }
    assert!(matches!(seen, Some(StoreError::Unavailable(_))), "{seen:?}");
    assert!(matches!(remote.checkpoint(), Err(StoreError::Unavailable(_))));
}

/// Reads key 1 of vertex 9 through a fresh connection of `remote`.
fn read(remote: &RemoteBackend) -> Option<Value> {
    let mut conn = remote.connect(InstanceId(5)).unwrap();
    let key = StoreKey { vertex: 9, object: 0, key: StateKey::Id(1) };
    let get = Request { id: 1, client: InstanceId(5), tag: None, key, op: StoreOp::State(StateOp::Get), reply: true };
    conn.send(1, vec![get].into()).unwrap();
    let mut out = Replies::default();
    while out.responses.is_empty() {
        conn.wait(&mut out, Duration::from_secs(5)).unwrap();
    }
    out.responses[0].result.clone().unwrap()
}

#[test]
fn spaces_are_independent_stores_and_bad_names_are_refused() {
    let s = server("");
    let a = s.local_addr();
    let one = RemoteBackend::connect(&format!("sluice://{a}?space=one")).unwrap();
    let two = RemoteBackend::connect(&format!("sluice://{a}?space=two")).unwrap();
    answers(&one).unwrap(); // sets key 1 to 5 in space `one`
    assert_eq!(read(&one), Some(Value::Int(5)));
    assert_eq!(read(&two), None, "a value leaked from one space to another");
    assert!(one.name().contains("space `one`"), "{}", one.name());
    two.wipe().unwrap();
    assert_eq!(read(&one), Some(Value::Int(5)), "wiping one space emptied another");
    let e = RemoteBackend::connect(&format!("sluice://{a}?space=../etc")).err().unwrap();
    assert!(e.to_string().contains("space name `../etc`"), "{e}");
    // A dropped space comes back empty; an ephemeral one goes with its backend.
    one.drop_space().unwrap();
    let again = RemoteBackend::connect(&format!("sluice://{a}?space=one")).unwrap();
    assert_eq!(read(&again), None, "a dropped space kept its values");
    {
        let short = RemoteBackend::connect(&format!("sluice://{a}?space=short&ephemeral=1")).unwrap();
        answers(&short).unwrap();
        assert_eq!(read(&short), Some(Value::Int(5)));
    }
    let later = RemoteBackend::connect(&format!("sluice://{a}?space=short")).unwrap();
    assert_eq!(read(&later), None, "an ephemeral space outlived its backend");
}
