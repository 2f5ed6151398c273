//! Writing a schedule back out as schedule-file YAML.

use super::model::{Action, At, FaultSchedule, RunOptions, ScaleTo, Threshold};
use crate::engine::LogPlace;

impl FaultSchedule {
    /// The schedule as schedule-file YAML, which [`Self::parse`] reads back to the same
    /// seed, events and policies (lines aside).
    pub fn to_yaml(&self) -> String {
        let mut s = format!("seed: {}\n", self.seed);
        s.push_str(&self.run.to_yaml());
        if self.events.is_empty() {
            s.push_str("events: []\n");
        } else {
            s.push_str("events:\n");
            for e in &self.events {
                let at = match e.at {
                    At::Packet(n) => format!("{{ packet: {n} }}"),
                    At::Percent(p) => format!("{{ percent: {} }}", number(p)),
                };
                s.push_str(&format!("  - at: {at}\n    {}: {}\n", e.action.key(), e.action.yaml_value()));
            }
        }
        if !self.policies.is_empty() {
            s.push_str("policies:\n");
            for p in &self.policies {
                let mut parts = vec![format!("vertex: {}", yaml_string(&p.vertex))];
                let threshold = |t: &Threshold| {
                    let mut v = Vec::new();
                    if let Some(q) = t.queue {
                        v.push(format!("queue: {q}"));
                    }
                    if let Some(l) = t.load {
                        v.push(format!("load: {}", number(l)));
                    }
                    format!("{{ {} }}", v.join(", "))
                };
                if let Some(t) = &p.scale_out_above {
                    parts.push(format!("scale_out_above: {}", threshold(t)));
                }
                if let Some(t) = &p.scale_in_below {
                    parts.push(format!("scale_in_below: {}", threshold(t)));
                }
                if let Some(m) = p.max_instances {
                    parts.push(format!("max_instances: {m}"));
                }
                if let Some(m) = p.min_instances {
                    parts.push(format!("min_instances: {m}"));
                }
                if let Some(t) = p.straggler_slower_by_percent {
                    parts.push(format!("straggler_slower_by_percent: {}", number(t)));
                }
                s.push_str(&format!("  - {{ {} }}\n", parts.join(", ")));
            }
        }
        s
    }
}

impl RunOptions {
    /// The `run:` section as a flow mapping line, or nothing when no option is set.
    pub fn to_yaml(&self) -> String {
        let mut parts = Vec::new();
        if let Some(r) = self.roots {
            parts.push(format!("roots: {r}"));
        }
        if let Some(l) = self.log {
            parts.push(format!("log: {}", if l == LogPlace::Store { "store" } else { "root" }));
        }
        if let Some(a) = self.async_delete {
            parts.push(format!("async_delete: {a}"));
        }
        if let Some(c) = self.checkpoint_every {
            parts.push(format!("checkpoint_every: {c}"));
        }
        for (k, p) in [("chain", &self.chain), ("input", &self.input)] {
            if let Some(p) = p {
                parts.push(format!("{k}: {}", yaml_path(&p.to_string_lossy())));
            }
        }
        if let Some(l) = self.limit {
            parts.push(format!("limit: {l}"));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("run: {{ {} }}\n", parts.join(", "))
        }
    }
}

impl Action {
    /// The action as the flow mapping a schedule file holds (`{ vertex: nat, instance: 0 }`).
    pub(super) fn yaml_value(&self) -> String {
        match self {
            Action::Crash { vertex, instance } | Action::Clone { vertex, instance } => {
                format!("{{ vertex: {}, instance: {instance} }}", yaml_string(vertex))
            }
            Action::CrashRoot { root: 0 } | Action::CrashStore => "{}".to_string(),
            Action::CrashRoot { root } => format!("{{ root: {root} }}"),
            Action::Scale { vertex, to: ScaleTo::Exactly(n) } => {
                format!("{{ vertex: {}, to: {n} }}", yaml_string(vertex))
            }
            Action::Scale { vertex, to: ScaleTo::By(d) } => format!("{{ vertex: {}, by: {d} }}", yaml_string(vertex)),
            Action::Move { vertex, from, to, flows } => {
                let flows = flows.map(|n| format!(", flows: {n}")).unwrap_or_default();
                format!("{{ vertex: {}, from: {from}, to: {to}{flows} }}", yaml_string(vertex))
            }
            Action::Slow { vertex, instance, delay_us: (lo, hi) } => {
                format!("{{ vertex: {}, instance: {instance}, delay_us: [{lo}, {hi}] }}", yaml_string(vertex))
            }
        }
    }
}

/// A number as YAML: whole numbers without a fraction, others in the shortest form that
/// reads back to the same value.
pub(super) fn number(x: f64) -> String {
    if x.is_nan() {
        ".nan".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { ".inf" } else { "-.inf" }.to_string()
    } else if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:?}")
    }
}

/// A string as a YAML scalar: plain when it cannot be read as anything else, else quoted.
pub(super) fn yaml_string(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !["true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf"]
            .contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
    }
}

/// A file path as a YAML scalar: plain when made of the characters paths usually have (so
/// `../../chains/example.yaml` stays readable), else as [`yaml_string`] writes it.
fn yaml_path(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '/')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "._/-+".contains(c))
        && s.parse::<f64>().is_err()
        && !["true", "false", "yes", "no", "on", "off", "y", "n", "null"].contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_string()
    } else {
        yaml_string(s)
    }
}
