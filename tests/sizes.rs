//! The sizes the house keeps (issue 40; docs/testing.md): no file in `src/` or `lua/` past
//! [`FILE_CAP`] lines and no function in `src/` (outside its `#[cfg(test)] mod tests`) past
//! [`FN_CAP`] lines. What was past them when this test came is listed with its size then, and
//! may only shrink: a listed one that grows fails, one back under its cap must leave the list
//! (so the list stays true), and anything new past a cap fails naming the file and function.
//!
//! Functions are read from rustfmt's layout: a `fn` line, and the body closing with `}` at the
//! same indent (what `cargo fmt --all`, which CI runs first, leaves).

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const FILE_CAP: usize = 400;
const FN_CAP: usize = 70;

/// Files past [`FILE_CAP`] when this test came: (path, lines then).
const BIG_FILES: &[(&str, usize)] = &[("src/auth.rs", 405), ("src/store/mod.rs", 426)];

/// Functions past [`FN_CAP`] when this test came: (file, name, lines then).
const LONG_FNS: &[(&str, &str, usize)] = &[
    ("src/restore/mod.rs", "restore", 193),
    ("src/demo/mod.rs", "run", 187),
    ("src/metrics/register.rs", "all", 168),
    ("src/inventory/mod.rs", "declare", 162),
    ("src/app.rs", "build", 159),
    ("src/restore/lifecycle.rs", "stage", 142),
    ("src/claims/mod.rs", "claim", 130),
    ("src/http/problem/table.rs", "parts", 129),
    ("src/demo/queue.rs", "run", 116),
    ("src/books.rs", "read_between", 104),
    ("src/writer/mod.rs", "run", 100),
    ("src/http/seats.rs", "claim", 88),
    ("src/restore/claims.rs", "stage_live_claims", 97),
    ("src/queue/tickets.rs", "record", 93),
    ("src/http/problem.rs", "render", 93),
    ("src/queue/admit.rs", "run", 91),
    ("src/queue/rebuild.rs", "rebuild", 89),
    ("src/ledger.rs", "read_view", 89),
    ("src/outbox/relay.rs", "run", 88),
    ("src/journal/entry.rs", "parse_entry", 86),
    ("src/seating/plan.rs", "parse", 81),
    ("src/outbox/tail.rs", "run", 77),
    ("src/reprocess/rows.rs", "mark_compensated", 75),
    ("src/lifecycle/holds.rs", "find_claim", 74),
    ("src/http/admin.rs", "declare", 73),
    ("src/http/mod.rs", "serve", 72),
];

fn files(dir: &str, ending: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(Path::new(ROOT).join(dir)) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let rel = p.strip_prefix(ROOT).unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            files(&rel, ending, out);
        } else if rel.ends_with(ending) {
            out.push(PathBuf::from(rel));
        }
    }
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap()
}

/// The name and line count of every function of `text` before its test module.
fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines.get(i + 1).is_some_and(|l| {
                    let l = l.trim_start();
                    l.starts_with("mod tests") || l.starts_with("pub(crate) mod tests")
                })
        })
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    for i in 0..end {
        let line = lines[i];
        let indent = &line[..line.len() - line.trim_start().len()];
        let Some(name) = fn_name(line.trim_start()) else {
            continue;
        };
        let close = format!("{indent}}}");
        let last = (i..end)
            .find(|&j| lines[j] == close || (j == i && line.trim_end().ends_with('}')))
            .unwrap_or(i);
        out.push((name, last - i + 1));
    }
    out
}

/// The function a line declares, if it declares one (`pub(crate) async fn name(`...).
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line;
    // `pub`, `pub(crate)`, `pub(super)`, `pub(in a::path)`.
    if let Some(r) = rest.strip_prefix("pub(") {
        rest = r.split_once(") ").map_or(rest, |(_, after)| after);
    }
    for prefix in ["pub ", "const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    for prefix in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn no_file_grows_past_its_cap() {
    let mut all = Vec::new();
    files("src", ".rs", &mut all);
    files("lua", ".lua", &mut all);
    let mut wrong = Vec::new();
    for rel in &all {
        let path = rel.to_string_lossy().into_owned();
        let n = read(rel).lines().count();
        match BIG_FILES.iter().find(|(p, _)| *p == path) {
            Some((_, then)) if n > *then => wrong.push(format!(
                "{path}: {n} lines, more than its {then} (cap {FILE_CAP})"
            )),
            Some(_) if n <= FILE_CAP => wrong.push(format!(
                "{path}: {n} lines, under the cap: take it off BIG_FILES"
            )),
            None if n > FILE_CAP => wrong.push(format!("{path}: {n} lines (cap {FILE_CAP})")),
            _ => {}
        }
    }
    for (p, _) in BIG_FILES {
        if !all.iter().any(|rel| rel.to_string_lossy() == *p) {
            wrong.push(format!("{p}: listed in BIG_FILES but gone"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn no_function_grows_past_its_cap() {
    let mut all = Vec::new();
    files("src", ".rs", &mut all);
    let mut wrong = Vec::new();
    let mut seen = Vec::new();
    for rel in &all {
        let path = rel.to_string_lossy().into_owned();
        for (name, n) in functions(&read(rel)) {
            let listed = LONG_FNS.iter().find(|(p, f, _)| *p == path && *f == name);
            if listed.is_some() {
                seen.push((path.clone(), name.clone()));
            }
            match listed {
                Some((_, _, then)) if n > *then => {
                    wrong.push(format!("{path} fn {name}: {n} lines, more than its {then}"))
                }
                Some(_) if n <= FN_CAP => wrong.push(format!(
                    "{path} fn {name}: {n} lines, under the cap: take it off LONG_FNS"
                )),
                None if n > FN_CAP => {
                    wrong.push(format!("{path} fn {name}: {n} lines (cap {FN_CAP})"))
                }
                _ => {}
            }
        }
    }
    for (p, f, _) in LONG_FNS {
        if !seen.iter().any(|(sp, sf)| sp == p && sf == f) {
            wrong.push(format!("{p} fn {f}: listed in LONG_FNS but gone"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_function_reader_finds_a_function_and_its_end() {
    let text = "fn a() {\n    x();\n}\n\npub(crate) async fn b(\n    y: u8,\n) -> u8 {\n    y\n}\npub(in crate::x) fn d() {}\n#[cfg(test)]\nmod tests {\n    fn c() {}\n}\n";
    assert_eq!(
        functions(text),
        [
            ("a".to_string(), 3),
            ("b".to_string(), 5),
            ("d".to_string(), 1)
        ]
    );
}
