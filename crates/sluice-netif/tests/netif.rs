//! The interface helpers against the loopback interface and a UDP socket.

use sluice_netif::{check_name, index, mtu, wait_readable};
use std::os::fd::AsRawFd;
use std::time::Duration;

#[test]
fn names_are_checked_before_any_call() {
    assert_eq!(check_name(""), Err("empty"));
    assert_eq!(check_name("a-very-long-interface"), Err("longer than 15 bytes"));
    assert_eq!(check_name("a\0b"), Err("contains a NUL byte"));
    assert!(check_name("eth0").is_ok());
}

#[test]
fn loopback_has_an_index_and_an_mtu() {
    let lo = check_name("lo").expect("name");
    assert!(index(&lo).expect("index") >= 1);
    assert!(mtu(&lo).expect("mtu") >= 1500);
    let missing = check_name("nosuchif42").expect("name");
    assert!(index(&missing).is_err());
}

#[test]
fn waiting_times_out_and_sees_a_readable_socket() {
    let a = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    assert!(!wait_readable(&[a.as_raw_fd()], Duration::from_millis(5)).expect("poll"));
    a.send_to(b"x", a.local_addr().expect("addr")).expect("send");
    assert!(wait_readable(&[a.as_raw_fd()], Duration::from_secs(2)).expect("poll"));
}
