//! Every file the prose names exists. The README and each note under `docs/` cite the code
//! by path (`src/writer/order.rs`), by link (`[the runbook](runbook.md)`) and, in lists after
//! a folder, by bare file name (`src/writer/` (`mod.rs`, `order.rs`)); a rename that forgets
//! the prose leaves a reader looking for a file that is gone (`docs/invariants.md` named three
//! files under `src/writer/` for a round before anyone noticed). This test reads each of those
//! forms and fails, naming the document and the path, on any that does not resolve.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Endings of the files the prose cites; a backticked word with one of them is a path.
const ENDINGS: &[&str] = &[
    ".rs", ".lua", ".sql", ".md", ".sh", ".toml", ".yml", ".yaml", ".json", ".py", ".html", ".svg",
];

/// Paths the prose names on purpose although they are not in the repository: (path, why).
const ELSEWHERE: &[(&str, &str)] = &[
    ("Cargo.lock", "made by the first build"),
    (
        "config.toml",
        "cargo's own configuration file, named as cargo's",
    ),
    ("report.html", "written by a load run into its run folder"),
    ("tmp/", "the target dir's, made by the tests"),
];

fn documents() -> Vec<PathBuf> {
    let mut docs = vec![Path::new(ROOT).join("README.md")];
    for dir in ["docs", "loadtest", "deploy", "benches"] {
        let Ok(entries) = std::fs::read_dir(Path::new(ROOT).join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "md") {
                docs.push(p);
            }
        }
    }
    docs.sort();
    docs
}

/// Every file and folder of the repository (outside target dirs and VCS) as a path from its
/// root ending in `/` for a folder: prose may name a file by the tail of its path
/// (`writer/order.rs`) or by its bare name.
fn every_path() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if matches!(name.as_str(), "target" | ".git" | "node_modules" | "vendor") {
                continue;
            }
            let p = e.path();
            let rel = p.strip_prefix(ROOT).unwrap_or(&p).display().to_string();
            if p.is_dir() {
                out.insert(format!("/{rel}/"));
                walk(&p, out);
            } else {
                out.insert(format!("/{rel}"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Path::new(ROOT), &mut out);
    out
}

fn backticked(paragraph: &str) -> Vec<&str> {
    paragraph.split('`').skip(1).step_by(2).collect()
}

/// The paths a paragraph cites, each with the folder it is listed under when it sits in the
/// parentheses right after a folder: "`src/writer/` (`mod.rs`, `order.rs`)".
fn cited(paragraph: &str) -> Vec<(Option<&str>, &str)> {
    let mut out = Vec::new();
    // The folder just named, and whether its parenthesised list is open.
    let mut folder: Option<(&str, bool)> = None;
    // Odd parts are inside backticks, even parts are the prose between them.
    for (i, part) in paragraph.split('`').enumerate() {
        if i % 2 == 0 {
            folder = match folder {
                Some((dir, false)) if part.trim() == "(" => Some((dir, true)),
                Some((dir, true)) if !part.contains(')') => Some((dir, true)),
                _ => None,
            };
            continue;
        }
        let word = part.trim_end_matches([':', ',']);
        if !is_path(word) {
            continue;
        }
        if word.ends_with('/') {
            out.push((None, word));
            folder = Some((word, false));
            continue;
        }
        let listed = folder.filter(|(_, open)| *open && !word.contains('/'));
        out.push((listed.map(|(dir, _)| dir), word));
    }
    out
}

fn is_path(word: &str) -> bool {
    !word.is_empty()
        && !word.contains("://")
        && !word.contains(['*', '<', '>', '{', '}', '$', ' ', '\n', '='])
        && (!word.starts_with('.') || word.starts_with("./") || word.starts_with(".ci/"))
        && (ENDINGS.iter().any(|e| word.ends_with(e)) || word.ends_with('/'))
        && word
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '.')
}

/// Markdown links' targets that stay inside the repository.
fn link_targets(paragraph: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = paragraph;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target);
        }
        rest = &rest[end..];
    }
    out
}

fn resolves(doc: &Path, word: &str) -> bool {
    let root = Path::new(ROOT);
    let here = doc.parent().unwrap_or(root);
    root.join(word).exists() || here.join(word).exists()
}

#[test]
fn every_file_the_docs_name_exists() {
    let paths = every_path();
    let anywhere = |word: &str| {
        let tail = format!("/{}", word.trim_start_matches("./"));
        paths.iter().any(|p| p.ends_with(&tail))
    };
    let mut missing = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let shown = doc.strip_prefix(ROOT).unwrap_or(&doc).display().to_string();
        // Code blocks hold commands and output, not citations.
        let prose: String = text
            .split("```")
            .step_by(2)
            .collect::<Vec<_>>()
            .join("\n\n");
        for paragraph in prose.split("\n\n") {
            for (folder, word) in cited(paragraph) {
                if ELSEWHERE.iter().any(|(p, _)| *p == word) {
                    continue;
                }
                // A name listed in parentheses right after its folder belongs to that folder;
                // any other may be the tail of a path anywhere in the repository.
                let ok = match folder {
                    Some(dir) => resolves(&doc, &format!("{dir}{word}")),
                    None => resolves(&doc, word) || anywhere(word),
                };
                if !ok {
                    let under = folder
                        .map(|d| format!(" (listed under `{d}`)"))
                        .unwrap_or_default();
                    missing.push(format!("{shown}: `{word}`{under}"));
                }
            }
            for target in link_targets(paragraph) {
                if !resolves(&doc, target) {
                    missing.push(format!("{shown}: link ({target})"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files the docs name that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_bare_name_after_its_folder_is_checked_in_that_folder() {
    let para = "`src/writer/` (`mod.rs`, `batch.rs`)";
    let words = backticked(para);
    assert_eq!(words, ["src/writer/", "mod.rs", "batch.rs"]);
    assert!(is_path("src/writer/"));
    assert!(!resolves(
        Path::new(ROOT).join("docs/invariants.md").as_path(),
        "src/writer/batch.rs"
    ));
    assert!(resolves(
        Path::new(ROOT).join("docs/invariants.md").as_path(),
        "src/writer/mod.rs"
    ));
}
