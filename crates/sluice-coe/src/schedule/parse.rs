//! Reading schedule text into a [`FaultSchedule`], with errors located by file, line and
//! field.

use super::check::{Item, Problem};
use super::locate::{item_line, line_of};
use super::model::{Action, At, FaultEvent, FaultSchedule, Policy, RunOptions, ScaleTo, Threshold};
use super::{ScheduleError, ACTIONS, RUN_FIELDS};
use crate::engine::LogPlace;
use serde_yaml::Value;
use std::path::Path;

impl FaultSchedule {
    /// Reads and parses a schedule file (see [`Self::parse`]).
    pub fn load(path: &Path) -> Result<FaultSchedule, ScheduleError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScheduleError {
            file: path.to_path_buf(),
            line: None,
            field: String::new(),
            message: format!("cannot read the fault schedule: {e}"),
        })?;
        FaultSchedule::parse(&text, path)
    }

    /// Parses schedule text; `file` names it in errors. Checks the shape (known fields,
    /// exactly one action per event, types) and the ranges that need no chain (counts from
    /// 1, percentages strictly between 0 and 100, delays, scale targets, `from != to`,
    /// policy bounds). [`Self::validate`] then checks it against the chain.
    pub fn parse(text: &str, file: &Path) -> Result<FaultSchedule, ScheduleError> {
        let p = Parser { text, file };
        let mut schedule = p.schedule()?;
        schedule.source = Some(file.to_path_buf());
        if let Some(problem) = schedule.static_problems().into_iter().next() {
            return Err(p.problem(problem));
        }
        Ok(schedule)
    }
}

/// A short rendering of a YAML value for messages.
fn shown(v: &Value) -> String {
    let s = match v {
        Value::Null => "nothing".to_string(),
        Value::String(s) => format!("\"{s}\""),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().replace('\n', " "),
    };
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

/// Reads schedule text into a [`FaultSchedule`], with errors located in the text.
struct Parser<'a> {
    text: &'a str,
    file: &'a Path,
}

/// A mapping's entries, with string keys, in file order.
type Entries<'v> = Vec<(String, &'v Value)>;

impl Parser<'_> {
    /// An error at a field path; the line is that of the deepest part of the path found.
    fn err(&self, path: &[String], message: impl Into<String>) -> ScheduleError {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let line = line_of(self.text, &refs);
        ScheduleError { file: self.file.to_path_buf(), line, field: path.join("."), message: message.into() }
    }

    /// An error for a problem found in the built schedule.
    fn problem(&self, p: Problem) -> ScheduleError {
        let (list, i) = match p.item {
            Item::Event(i) => ("events", i),
            Item::Policy(i) => ("policies", i),
            Item::Run => {
                let mut path = vec!["run".to_string()];
                path.extend(p.field);
                return self.err(&path, p.message);
            }
        };
        let mut path = vec![list.to_string(), i.to_string()];
        path.extend(p.field);
        self.err(&path, p.message)
    }

    fn schedule(&self) -> Result<FaultSchedule, ScheduleError> {
        let doc: Value = serde_yaml::from_str(self.text).map_err(|e| ScheduleError {
            file: self.file.to_path_buf(),
            line: e.location().map(|l| l.line()),
            field: String::new(),
            message: format!("not valid YAML: {e}"),
        })?;
        if doc.is_null() {
            return Err(self.err(&[], "the schedule is empty; expected a mapping with `events:` and/or `policies:`"));
        }
        let top = self.entries(&doc, &[], &["seed", "run", "events", "policies"], "the schedule")?;
        let mut s = FaultSchedule::default();
        for (k, v) in top {
            let path = [k.clone()];
            match k.as_str() {
                "seed" => s.seed = self.uint(v, &path, "a seed (a whole number, 0 or more)")?,
                "run" => s.run = self.run_options(v)?,
                "events" => {
                    for (i, e) in self.list(v, &path, "a list of events")?.iter().enumerate() {
                        s.events.push(self.event(i, e)?);
                    }
                }
                _ => {
                    for (i, p) in self.list(v, &path, "a list of policies")?.iter().enumerate() {
                        s.policies.push(self.policy(i, p)?);
                    }
                }
            }
        }
        Ok(s)
    }

    /// A mapping's entries, checking that every key is one of `allowed`.
    fn entries<'v>(
        &self,
        v: &'v Value,
        path: &[String],
        allowed: &[&str],
        what: &str,
    ) -> Result<Entries<'v>, ScheduleError> {
        let expected = allowed.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ");
        let Value::Mapping(m) = v else {
            return Err(self.err(path, format!("expected {what}: a mapping with {expected}; found {}", shown(v))));
        };
        let mut out = Vec::with_capacity(m.len());
        for (k, val) in m {
            let Some(key) = k.as_str() else {
                return Err(self.err(path, format!("field names must be strings, found {}", shown(k))));
            };
            if !allowed.contains(&key) {
                let mut at = path.to_vec();
                at.push(key.to_string());
                return Err(self.err(&at, format!("unknown field `{key}` in {what}; expected {expected}")));
            }
            out.push((key.to_string(), val));
        }
        Ok(out)
    }

    fn list<'v>(&self, v: &'v Value, path: &[String], what: &str) -> Result<&'v [Value], ScheduleError> {
        match v {
            Value::Sequence(s) => Ok(s),
            Value::Null => Ok(&[]),
            other => Err(self.err(path, format!("expected {what} (`- ...` items); found {}", shown(other)))),
        }
    }

    fn uint(&self, v: &Value, path: &[String], what: &str) -> Result<u64, ScheduleError> {
        v.as_u64().ok_or_else(|| self.err(path, format!("expected {what}; found {}", shown(v))))
    }

    fn small(&self, v: &Value, path: &[String], what: &str) -> Result<u16, ScheduleError> {
        let n = self.uint(v, path, what)?;
        u16::try_from(n).map_err(|_| self.err(path, format!("{n} is too large; expected {what}")))
    }

    fn float(&self, v: &Value, path: &[String], what: &str) -> Result<f64, ScheduleError> {
        match v {
            Value::Number(n) => n.as_f64(),
            _ => None,
        }
        .ok_or_else(|| self.err(path, format!("expected {what}; found {}", shown(v))))
    }

    fn string(&self, v: &Value, path: &[String], what: &str) -> Result<String, ScheduleError> {
        v.as_str().map(str::to_string).ok_or_else(|| self.err(path, format!("expected {what}; found {}", shown(v))))
    }

    fn event(&self, i: usize, v: &Value) -> Result<FaultEvent, ScheduleError> {
        let path = vec!["events".to_string(), i.to_string()];
        let mut allowed = vec!["at"];
        allowed.extend(ACTIONS);
        let entries = self.entries(v, &path, &allowed, "an event (`at:` and one action)")?;
        let line = item_line(self.text, "events", i);
        let mut at = None;
        let mut action: Option<(String, &Value)> = None;
        for (k, val) in &entries {
            let mut p = path.clone();
            p.push(k.clone());
            if k == "at" {
                at = Some(self.at(val, &p)?);
            } else if let Some((first, _)) = &action {
                let first_line = line_of(self.text, &["events", &i.to_string(), first.as_str()])
                    .map(|l| format!(" (line {l})"))
                    .unwrap_or_default();
                return Err(self.err(
                    &p,
                    format!(
                        "an event has exactly one action, and this one already has `{first}`{first_line}; \
                         put `{k}` in an event of its own"
                    ),
                ));
            } else {
                action = Some((k.clone(), val));
            }
        }
        let Some(at) = at else {
            return Err(self.err(&path, "the event has no `at:`; expected `at: { packet: N }` or `at: { percent: P }`"));
        };
        let Some((key, value)) = action else {
            return Err(self.err(&path, format!("the event has no action; expected one of {}", ACTIONS.join(", "))));
        };
        let mut p = path.clone();
        p.push(key.clone());
        let action = self.action(&key, value, &p)?;
        Ok(FaultEvent { at, action, line })
    }

    fn at(&self, v: &Value, path: &[String]) -> Result<At, ScheduleError> {
        let entries = self.entries(v, path, &["packet", "percent"], "a point of the trace")?;
        let mut it = entries.into_iter();
        let (Some((k, val)), None) = (it.next(), it.next()) else {
            return Err(self.err(path, "expected exactly one of `packet: N` and `percent: P`"));
        };
        let mut p = path.to_vec();
        p.push(k.clone());
        if k == "packet" {
            Ok(At::Packet(self.uint(val, &p, "a packet count (1 is the first input packet)")?))
        } else {
            Ok(At::Percent(self.float(val, &p, "a percentage of the trace, strictly between 0 and 100")?))
        }
    }

    fn action(&self, key: &str, v: &Value, path: &[String]) -> Result<Action, ScheduleError> {
        let field = |f: &str| {
            let mut p = path.to_vec();
            p.push(f.to_string());
            p
        };
        let vertex_of = |entries: &Entries<'_>| -> Result<String, ScheduleError> {
            match entries.iter().find(|(k, _)| k == "vertex") {
                Some((_, v)) => self.string(v, &field("vertex"), "a vertex name"),
                None => Err(self.err(path, format!("`{key}` needs `vertex:` (a vertex of the chain)"))),
            }
        };
        let index = |entries: &Entries<'_>, f: &str, default: Option<u16>| -> Result<u16, ScheduleError> {
            match (entries.iter().find(|(k, _)| k == f), default) {
                (Some((_, v)), _) => self.small(v, &field(f), "an instance index (0 is the first instance)"),
                (None, Some(d)) => Ok(d),
                (None, None) => Err(self.err(path, format!("`{key}` needs `{f}:` (an instance index)"))),
            }
        };
        match key {
            "crash_store" => {
                if !v.is_null() {
                    self.entries(v, path, &[], &format!("`{key}`, which takes no fields (write `{key}: {{}}`)"))?;
                }
                Ok(Action::CrashStore)
            }
            "crash_root" => {
                if v.is_null() {
                    return Ok(Action::CrashRoot { root: 0 });
                }
                let e = self.entries(v, path, &["root"], "`crash_root`")?;
                let root = match e.iter().find(|(k, _)| k == "root") {
                    Some((_, v)) => {
                        let r = self.small(v, &field("root"), "a root number (0 is the first root)")?;
                        u8::try_from(r).map_err(|_| self.err(&field("root"), "a root number below 256"))?
                    }
                    None => 0,
                };
                Ok(Action::CrashRoot { root })
            }
            "crash" | "clone" => {
                let e = self.entries(v, path, &["vertex", "instance"], &format!("`{key}`"))?;
                let vertex = vertex_of(&e)?;
                let instance = index(&e, "instance", Some(0))?;
                Ok(if key == "crash" { Action::Crash { vertex, instance } } else { Action::Clone { vertex, instance } })
            }
            "scale" => {
                let e = self.entries(v, path, &["vertex", "to", "by"], "`scale`")?;
                let vertex = vertex_of(&e)?;
                let to = e.iter().find(|(k, _)| k == "to");
                let by = e.iter().find(|(k, _)| k == "by");
                let to = match (to, by) {
                    (Some((_, t)), None) => {
                        ScaleTo::Exactly(self.small(t, &field("to"), "an instance count (1 to 64)")?)
                    }
                    (None, Some((_, b))) => {
                        let what = "a change in the instance count (e.g. 1 or -1)";
                        let d = b
                            .as_i64()
                            .ok_or_else(|| self.err(&field("by"), format!("expected {what}; found {}", shown(b))))?;
                        ScaleTo::By(
                            i32::try_from(d)
                                .map_err(|_| self.err(&field("by"), format!("{d} is out of range; expected {what}")))?,
                        )
                    }
                    _ => {
                        return Err(
                            self.err(path, "`scale` needs exactly one of `to: N` (instances) and `by: N` (change)")
                        )
                    }
                };
                Ok(Action::Scale { vertex, to })
            }
            "move" => {
                let e = self.entries(v, path, &["vertex", "from", "to", "flows"], "`move`")?;
                let vertex = vertex_of(&e)?;
                let from = index(&e, "from", None)?;
                let to = index(&e, "to", None)?;
                let flows = match e.iter().find(|(k, _)| k == "flows") {
                    Some((_, f)) if !f.is_null() => Some(self.uint(f, &field("flows"), "a number of flows")?),
                    _ => None,
                };
                Ok(Action::Move { vertex, from, to, flows })
            }
            _ => {
                let e = self.entries(v, path, &["vertex", "instance", "delay_us"], "`slow`")?;
                let vertex = vertex_of(&e)?;
                let instance = index(&e, "instance", Some(0))?;
                let what = "a delay range in µs, `[LOW, HIGH]`";
                let delay_us = match e.iter().find(|(k, _)| k == "delay_us") {
                    Some((_, Value::Sequence(s))) if s.len() == 2 => {
                        let lo = s.first().and_then(Value::as_u64);
                        let hi = s.get(1).and_then(Value::as_u64);
                        match (lo, hi) {
                            (Some(lo), Some(hi)) => (lo, hi),
                            _ => return Err(self.err(&field("delay_us"), format!("expected {what} of whole numbers"))),
                        }
                    }
                    Some((_, other)) => {
                        return Err(self.err(&field("delay_us"), format!("expected {what}; found {}", shown(other))))
                    }
                    None => {
                        return Err(self.err(path, format!("`slow` needs `delay_us:`, {what} ([0, 0] ends a slowdown)")))
                    }
                };
                Ok(Action::Slow { vertex, instance, delay_us })
            }
        }
    }

    /// The `run:` section.
    fn run_options(&self, v: &Value) -> Result<RunOptions, ScheduleError> {
        let path = vec!["run".to_string()];
        let mut r = RunOptions { line: line_of(self.text, &["run"]), ..RunOptions::default() };
        if v.is_null() {
            return Ok(r);
        }
        for (k, val) in self.entries(v, &path, &RUN_FIELDS, "the run options")? {
            let f = vec!["run".to_string(), k.clone()];
            match k.as_str() {
                "roots" => {
                    let n = self.small(val, &f, "a number of roots (1 to 64)")?;
                    let n = u8::try_from(n)
                        .map_err(|_| self.err(&f, format!("{n} roots is too many; expected 1 to 64")))?;
                    r.roots = Some(n);
                }
                "log" => {
                    r.log = Some(match val.as_str() {
                        Some("root") => LogPlace::Root,
                        Some("store") => LogPlace::Store,
                        _ => {
                            return Err(self.err(
                                &f,
                                format!(
                                    "expected `root` or `store` (where the root keeps its packet log); found {}",
                                    shown(val)
                                ),
                            ))
                        }
                    })
                }
                "async_delete" => {
                    let b = val
                        .as_bool()
                        .ok_or_else(|| self.err(&f, format!("expected true or false; found {}", shown(val))))?;
                    r.async_delete = Some(b);
                }
                "checkpoint_every" => {
                    r.checkpoint_every =
                        Some(self.uint(val, &f, "a number of input packets (0: only after failovers)")?)
                }
                "limit" => r.limit = Some(self.uint(val, &f, "a number of input packets (1 or more)")?),
                _ => {
                    let s = self.string(val, &f, "a file path (relative to this file's directory)")?;
                    if k == "chain" {
                        r.chain = Some(s.into());
                    } else {
                        r.input = Some(s.into());
                    }
                }
            }
        }
        Ok(r)
    }

    fn threshold(&self, v: &Value, path: &[String]) -> Result<Threshold, ScheduleError> {
        let e = self.entries(v, path, &["queue", "load"], "a threshold")?;
        let mut t = Threshold::default();
        for (k, val) in e {
            let mut p = path.to_vec();
            p.push(k.clone());
            if k == "queue" {
                t.queue = Some(self.uint(val, &p, "a number of queued packets")?);
            } else {
                t.load = Some(self.float(val, &p, "a fraction of busy time, 0 to 1")?);
            }
        }
        Ok(t)
    }

    fn policy(&self, i: usize, v: &Value) -> Result<Policy, ScheduleError> {
        let path = vec!["policies".to_string(), i.to_string()];
        let allowed = [
            "vertex",
            "scale_out_above",
            "scale_in_below",
            "max_instances",
            "min_instances",
            "straggler_slower_by_percent",
        ];
        let entries = self.entries(v, &path, &allowed, "a policy")?;
        let mut p = Policy { line: item_line(self.text, "policies", i), ..Policy::default() };
        let mut vertex = None;
        for (k, val) in entries {
            let mut f = path.clone();
            f.push(k.clone());
            match k.as_str() {
                "vertex" => vertex = Some(self.string(val, &f, "a vertex name")?),
                "scale_out_above" => p.scale_out_above = Some(self.threshold(val, &f)?),
                "scale_in_below" => p.scale_in_below = Some(self.threshold(val, &f)?),
                "max_instances" => p.max_instances = Some(self.small(val, &f, "an instance count (1 to 64)")?),
                "min_instances" => p.min_instances = Some(self.small(val, &f, "an instance count (1 to 64)")?),
                _ => {
                    p.straggler_slower_by_percent =
                        Some(self.float(val, &f, "a percentage above 0 (time per packet above the median)")?)
                }
            }
        }
        p.vertex = vertex.ok_or_else(|| self.err(&path, "the policy needs `vertex:` (a vertex of the chain)"))?;
        Ok(p)
    }
}
