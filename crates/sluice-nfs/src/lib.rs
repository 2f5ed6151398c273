//! The NF library. Each NF keeps all of its state behind the state API, declared with the scope
//! and access pattern of CHC's Table 4 (NAT, load balancer, portscan and Trojan detectors) and
//! StatelessNF's Table 1 (firewall connection state, IDS automaton and reassembly state).

pub mod firewall;
pub mod ids;
pub mod ids_enc;
pub mod lb;
pub mod nat;
pub mod portscan;
pub mod trojan;
mod util;

use sluice_nf::NfRegistry;

/// A registry holding every NF type of this crate.
pub fn registry() -> NfRegistry {
    let mut r = NfRegistry::new();
    r.register("nat", "source NAT with a dynamic port pool and endpoint-independent mapping", nat::build);
    r.register("lb", "least-connections load balancer", lb::build);
    r.register("firewall", "stateful firewall: TCP connection tracking and ACL rules", firewall::build);
    r.register("portscan", "portscan detector: sequential hypothesis testing per source host", portscan::build);
    r.register("trojan", "Trojan detector: SSH, then FTP downloads, then IRC, in chain-entry order", trojan::build);
    r.register("ids", "IDS: Aho-Corasick signatures over reassembled TCP streams", ids::build);
    r.register("passthrough", "forwards every packet unchanged (the framework's ceiling)", util::build_passthrough);
    r
}

/// Every custom operation of this crate's NFs. A store that runs custom operations in another
/// process (`sluice store serve`) resolves them by name from this list, so names are unique
/// across the library (tested).
pub fn custom_ops() -> Vec<sluice_state::CustomOp> {
    [&nat::CUSTOM_OPS[..], &lb::CUSTOM_OPS[..], &portscan::CUSTOM_OPS[..], &trojan::CUSTOM_OPS[..]].concat()
}

#[cfg(test)]
mod tests {
    #[test]
    fn custom_op_names_are_unique_across_the_library() {
        let ops = super::custom_ops();
        let mut names: Vec<&str> = ops.iter().map(|o| o.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a custom operation name is used twice: {names:?}");
        assert!(before >= 9);
    }
}
