//! Finding the line of a field path in schedule text, for located errors.

use sluice_runtime::spec::locate;

/// The 1-based line of a field path in schedule text (`events.2.slow.delay_us`), or of the
/// deepest part of it that is found. Items of the top-level lists are found here, indented or
/// not (`events:` followed by `- at:` at column 0 is common YAML), and so is an item's field,
/// even when the item's first line holds a flow mapping (`- at: { packet: 1 }`), where
/// [`locate`] would stop; `locate` goes on from there.
pub(super) fn line_of(text: &str, path: &[&str]) -> Option<usize> {
    (1..=path.len()).rev().find_map(|n| path.get(..n).and_then(|p| line_of_exactly(text, p)))
}

fn indent_of(l: &str) -> usize {
    l.len() - l.trim_start().len()
}

fn significant(l: &str) -> bool {
    !l.trim().is_empty() && !l.trim_start().starts_with('#')
}

/// The 1-based line of item `index` of the top-level list `list`.
pub(super) fn item_line(text: &str, list: &str, index: usize) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let header = lines.iter().position(|l| {
        l.strip_prefix(list)
            .and_then(|r| r.strip_prefix(':'))
            .is_some_and(|rest| rest.trim().is_empty() || rest.trim_start().starts_with('#'))
    })?;
    let mut item_indent = None;
    let mut n = 0;
    for (j, l) in lines.iter().enumerate().skip(header + 1) {
        if !significant(l) {
            continue;
        }
        let t = l.trim_start();
        let is_item = t.starts_with("- ") || t == "-";
        if indent_of(l) == 0 && !is_item {
            break;
        }
        if is_item && *item_indent.get_or_insert(indent_of(l)) == indent_of(l) {
            if n == index {
                return Some(j + 1);
            }
            n += 1;
        }
    }
    None
}

fn line_of_exactly(text: &str, path: &[&str]) -> Option<usize> {
    let (Some(list), Some(Ok(index))) = (path.first(), path.get(1).map(|i| i.parse::<usize>())) else {
        return locate(text, path);
    };
    let item = item_line(text, list, index)?;
    let Some(key) = path.get(2) else { return Some(item) };
    let lines: Vec<&str> = text.lines().collect();
    // A line's key indentation and the text from the key on (`- a: 1` has its key at +2).
    let key_of = |l: &str| {
        let t = l.trim_start();
        match t.strip_prefix("- ") {
            Some(rest) => (indent_of(l) + 2 + rest.len() - rest.trim_start().len(), rest.trim_start().to_string()),
            None => (indent_of(l), t.to_string()),
        }
    };
    let start = item.checked_sub(1)?;
    let base = indent_of(lines.get(start)?);
    let end = (start + 1..lines.len())
        .find(|&j| lines.get(j).is_some_and(|l| significant(l) && indent_of(l) <= base))
        .unwrap_or(lines.len());
    let wanted = [format!("{key}:"), format!("\"{key}\":")];
    let at = (start..end).find(|&j| {
        lines.get(j).is_some_and(|l| {
            let (ki, rest) = key_of(l);
            ki == base + 2 && wanted.iter().any(|w| rest.starts_with(w.as_str()))
        })
    })?;
    let sub = lines.get(at..end)?.join("\n");
    locate(&sub, path.get(2..)?).map(|l| l + at)
}
