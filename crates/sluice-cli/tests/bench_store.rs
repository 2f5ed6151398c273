//! `sluice bench-store --quick`: the smoke run writes every embedded case, the offload/lock
//! comparison, the failover part, the open-loop part and the plot. No timing assertions.

use std::process::Command;

#[test]
fn quick_bench_store_writes_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("store.json");
    let svg = dir.path().join("store.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        // 2,000 packets at 10,000 a second: the crash comes 100 ms in, time enough on a busy
        // machine for packets to leave before it (the baseline latency).
        .args(["bench-store", "--quick", "--failover-rate", "10000", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .env_remove("SLUICE_REDIS_URL")
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();

    let modes = v["modes"].as_array().unwrap();
    for nf in ["nat", "lb", "example"] {
        for load in ["saturated", "paced"] {
            for (mode, store) in [
                ("local", "none"),
                ("external", "embedded"),
                ("cached", "embedded"),
                ("async", "embedded"),
                ("async-ft", "embedded"),
            ] {
                let case = modes
                    .iter()
                    .find(|m| m["nf"] == nf && m["load"] == load && m["mode"] == mode && m["store"] == store)
                    .unwrap_or_else(|| panic!("missing case {nf} {mode} {store} {load}"));
                let s = &case["summary"];
                assert!(s["mpps"]["median"].as_f64().unwrap() > 0.0, "{nf} {mode} {load}: no throughput");
                let p: Vec<f64> = ["p5_us", "p25_us", "p50_us", "p75_us", "p95_us"]
                    .iter()
                    .map(|k| s[k]["median"].as_f64().unwrap())
                    .collect();
                assert!(p.windows(2).all(|w| w[0] <= w[1]), "{nf} {mode} {load}: percentiles {p:?}");
                assert!(case["mpps_ratio_to_local"].as_f64().unwrap() > 0.0);
                if mode == "async-ft" {
                    assert!(case["mpps_ratio_to_async"].as_f64().unwrap() > 0.0, "{nf} {load}: no ratio to async");
                }
            }
        }
    }
    let aims = v["aims"].as_array().unwrap();
    assert!(
        aims.iter().filter(|a| a["aim"].as_str().unwrap().starts_with("fault tolerance on")).count() == 3,
        "one fault-tolerance aim per chain: {aims:?}"
    );
    // No Redis in a quick run, and it says so.
    assert!(!modes.iter().any(|m| m["store"] == "redis"));
    assert!(v["not_run"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("redis")));

    let contention = v["contention"].as_array().unwrap();
    let emb = contention.iter().find(|c| c["store"] == "embedded").expect("offload/lock comparison");
    for side in ["offload", "lock_rmw"] {
        let runs = emb[side].as_array().unwrap();
        assert!(!runs.is_empty());
        assert!(runs.iter().all(|r| r["ops_per_s"].as_f64().unwrap() > 0.0), "{side}");
    }
    assert!(emb["throughput_ratio"].as_f64().unwrap() > 0.0);

    assert!(!v["ops"].as_array().unwrap().is_empty());
    // The failover part: both chains, every repeat failed over with nothing lost.
    let failover = v["failover"].as_array().unwrap();
    for case in ["nat/failover", "example/failover"] {
        let f = failover.iter().find(|f| f["case"] == case).unwrap_or_else(|| panic!("missing {case}"));
        for r in f["repeats"].as_array().unwrap() {
            assert!(r["recovery_ms"].as_f64().unwrap() > 0.0, "{case}: {r}");
            assert!(r["baseline_p99_us"].as_f64().unwrap() > 0.0, "{case}: no latency before the crash: {r}");
            assert_eq!(r["packets_in"], r["packets_out"], "{case}: packets lost: {r}");
        }
    }
    // The open-loop part: every chain and mode, at each default load, with its percentiles.
    let open = v["open_loop"].as_array().unwrap();
    for nf in ["nat", "lb", "ids", "example"] {
        for mode in ["local", "async", "async-ft"] {
            let c =
                open.iter().find(|c| c["nf"] == nf && c["mode"] == mode).unwrap_or_else(|| panic!("no {nf}/{mode}"));
            assert!(c["peak_mpps"]["median"].as_f64().unwrap() > 0.0, "{nf}/{mode}: no peak");
            let loads: Vec<u64> =
                c["loads"].as_array().unwrap().iter().map(|l| l["percent"].as_u64().unwrap()).collect();
            assert_eq!(loads, [50, 90], "{nf}/{mode}");
            for l in c["loads"].as_array().unwrap() {
                let p: Vec<f64> =
                    ["p50_us", "p99_us", "p999_us"].iter().map(|k| l[k]["median"].as_f64().unwrap()).collect();
                assert!(p[0] > 0.0 && p.windows(2).all(|w| w[0] <= w[1]), "{nf}/{mode}: percentiles {p:?}");
                assert!(l["achieved_mpps"]["median"].as_f64().unwrap() > 0.0, "{nf}/{mode}");
            }
        }
    }
    assert!(aims.iter().any(|a| a["aim"].as_str().unwrap().starts_with("IDS median latency")), "{aims:?}");
    assert!(v["command"].as_str().unwrap().contains("bench-store"));
    assert!(v["machine"]["nproc"].as_u64().unwrap() >= 1);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg"), "not an SVG");
}
