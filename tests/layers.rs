//! The layers of `src/lib.rs` held against the code. Each module of the crate (a file or a
//! folder under `src/`) is in one layer of the list under "# Layers" in `src/lib.rs`, the one
//! table of them; this test reads that list, then every `crate::…`, `super::…` and `self::…`
//! path of every file under `src/` (`use` items, paths in code and types, paths inside macro
//! calls), and fails on:
//! - an import from a higher layer than the importing file's, naming the file, the path and
//!   both layers (unless it is one of [`EXCEPTIONS`]);
//! - two modules that import each other round a circle (within one layer);
//! - a module that is in no layer, or in two;
//! - a script called other than through its typed wrapper: the registry (`scripts::SCRIPTS`)
//!   or a `redis::Script` named outside `src/scripts/` and the waiting room's own
//!   wrappers ([`WRAPPERS`]), so KEYS and ARGV are put in order in one place per script.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Imports allowed to run up a layer: (file, module it imports, why). At most three, each
/// still needed (an exception no import uses fails too, so the list stays true).
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// The files that may name the script registry or build a script: the wrappers.
const WRAPPERS: &[&str] = &["src/scripts/", "src/queue/calls.rs"];

/// A layer of the list: its number (1 = the lowest) and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layer {
    number: usize,
    name: String,
}

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "layer {} ({})", self.number, self.name)
    }
}

/// The list under "# Layers" in lib.rs's docs: `N. **name** ([`module`], …): …` per layer.
/// Returns each module's layer.
fn layers(lib: &str) -> BTreeMap<String, Layer> {
    let docs: String = lib
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let section = docs
        .split("\n# Layers\n")
        .nth(1)
        .expect("src/lib.rs has a \"# Layers\" section")
        .split("\n# ")
        .next()
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    let mut expected = 1;
    for line in section.lines() {
        let Some((number, rest)) = line.split_once(". **") else {
            continue;
        };
        let Ok(number) = number.trim().parse::<usize>() else {
            continue;
        };
        assert_eq!(
            number, expected,
            "the layers are numbered 1, 2, 3, … in order"
        );
        expected += 1;
        let (name, rest) = rest.split_once("** (").expect("`N. **name** (modules)`");
        // The modules run to the closing parenthesis, over as many lines as they need.
        let start =
            section.find(line).expect("the line is in the section") + line.len() - rest.len();
        let list = section[start..].split(')').next().unwrap_or_default();
        let layer = Layer {
            number,
            name: name.to_string(),
        };
        for module in list.split("[`").skip(1) {
            let module = module.split('`').next().unwrap_or_default().to_string();
            if let Some(first) = out.insert(module.clone(), layer.clone()) {
                panic!("module {module} is in {first} and in {layer}");
            }
        }
    }
    assert!(expected > 2, "the layers section lists layers");
    out
}

/// Every module lib.rs declares (`pub mod x;`, `mod x;`).
fn declared(lib: &str) -> BTreeSet<String> {
    let file = syn::parse_file(lib).expect("src/lib.rs parses");
    file.items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file: `src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs` is `a::b`.
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(SRC).expect("a file under src/");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// The `crate::`, `super::` and `self::` paths of one file, each made absolute.
struct Paths {
    /// The module of the file, then the inline modules (`mod tests { … }`) the visitor is in.
    module: Vec<String>,
    /// (the path as written, the absolute path).
    found: Vec<(String, Vec<String>)>,
    /// Every path of the file as written (the crate's and others), for the wrappers' check.
    written: Vec<String>,
}

impl Paths {
    fn add(&mut self, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        self.written.push(segments.join("::"));
        let absolute = match first.as_str() {
            "crate" => segments[1..].to_vec(),
            "self" => {
                let mut m = self.module.clone();
                m.extend_from_slice(&segments[1..]);
                m
            }
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let mut m = self.module.clone();
                m.truncate(m.len().saturating_sub(ups));
                m.extend_from_slice(&segments[ups..]);
                m
            }
            _ => return,
        };
        self.found.push((segments.join("::"), absolute));
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.add(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.add(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.add(prefix),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }

    /// `crate :: a :: b …` sequences inside a macro call's tokens, which syn leaves unparsed.
    fn tokens(&mut self, tokens: TokenStream) {
        let flat = flatten(tokens);
        let mut i = 0;
        while i < flat.len() {
            let starts =
                matches!(&flat[i], Tok::Ident(s) if s == "crate" || s == "super" || s == "self");
            if !starts {
                i += 1;
                continue;
            }
            let mut segments = Vec::new();
            let mut j = i;
            while let Some(Tok::Ident(s)) = flat.get(j) {
                segments.push(s.clone());
                if flat.get(j + 1) == Some(&Tok::Colons) {
                    j += 2;
                } else {
                    j += 1;
                    break;
                }
            }
            if segments.len() > 1 {
                self.add(&segments);
            }
            i = j.max(i + 1);
        }
    }
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Colons,
    Other,
}

fn flatten(tokens: TokenStream) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut iter = tokens.into_iter().peekable();
    while let Some(t) = iter.next() {
        match t {
            TokenTree::Ident(i) => out.push(Tok::Ident(i.to_string())),
            TokenTree::Punct(p) if p.as_char() == ':' => {
                if matches!(iter.peek(), Some(TokenTree::Punct(q)) if q.as_char() == ':') {
                    iter.next();
                    out.push(Tok::Colons);
                } else {
                    out.push(Tok::Other);
                }
            }
            TokenTree::Group(g) => {
                out.push(Tok::Other);
                out.extend(flatten(g.stream()));
                out.push(Tok::Other);
            }
            _ => out.push(Tok::Other),
        }
    }
    out
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.add(&segments);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    /// `pub(crate)`, `pub(super)`: a visibility, not an import.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
}

/// Every path of one file, as written and made absolute where it is the crate's.
fn paths(file: &Path) -> Paths {
    let text = std::fs::read_to_string(file).expect("a readable source file");
    let parsed = syn::parse_file(&text)
        .unwrap_or_else(|e| panic!("{}: does not parse: {e}", file.display()));
    let mut paths = Paths {
        module: module_of(file),
        found: Vec::new(),
        written: Vec::new(),
    };
    paths.visit_file(&parsed);
    paths
}

/// One file's paths into other modules of the crate: (the path as written, the module the
/// path names, its first segment).
fn imports(file: &Path) -> Vec<(String, String)> {
    paths(file)
        .found
        .into_iter()
        .filter_map(|(written, absolute)| Some((written, absolute.first()?.clone())))
        .collect()
}

fn display(file: &Path) -> String {
    let root = Path::new(SRC).parent().expect("src/ has a parent");
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

#[test]
fn every_module_of_the_crate_is_in_exactly_one_layer() {
    let lib = std::fs::read_to_string(format!("{SRC}/lib.rs")).unwrap();
    let layers = layers(&lib);
    let declared = declared(&lib);
    let listed: BTreeSet<String> = layers.keys().cloned().collect();
    let missing: Vec<_> = declared.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "modules in no layer of src/lib.rs: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "the layers name modules src/lib.rs does not declare: {unknown:?}"
    );
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let lib = std::fs::read_to_string(format!("{SRC}/lib.rs")).unwrap();
    let layers = layers(&lib);
    assert!(EXCEPTIONS.len() <= 3, "at most three exceptions");
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    files.sort();
    let mut upward = BTreeSet::new();
    let mut used = BTreeSet::new();
    for file in &files {
        let Some(home) = module_of(file).first().cloned() else {
            continue; // lib.rs: the map, no imports
        };
        if home == "main" {
            continue; // the binary: it sees the library from outside (`dropgate::`)
        }
        let from = layers
            .get(&home)
            .unwrap_or_else(|| panic!("module {home} is in no layer of src/lib.rs"));
        let name = display(file);
        for (written, target) in imports(file) {
            let Some(to) = layers.get(&target) else {
                continue; // an item of lib.rs itself, or a child module of this file
            };
            if to.number <= from.number {
                continue;
            }
            if let Some(e) = EXCEPTIONS
                .iter()
                .find(|(f, m, _)| *f == name && *m == target)
            {
                used.insert(*e);
                continue;
            }
            upward.insert(format!("{name}: `{written}` imports {to} into {from}"));
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up a layer (see \"# Layers\" in src/lib.rs):\n{}",
        upward.into_iter().collect::<Vec<_>>().join("\n")
    );
    let stale: Vec<_> = EXCEPTIONS.iter().filter(|e| !used.contains(*e)).collect();
    assert!(stale.is_empty(), "exceptions no import needs: {stale:?}");
}

#[test]
fn no_two_modules_import_each_other_round_a_circle() {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    // Module → the modules it imports (each with one path that shows it).
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &files {
        let Some(home) = module_of(file).first().cloned() else {
            continue;
        };
        if home == "main" {
            continue;
        }
        for (written, target) in imports(file) {
            if target != home && target != "main" {
                edges
                    .entry(home.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| format!("{}: `{written}`", display(file)));
            }
        }
    }
    let circles = circles(&edges);
    let shown: Vec<String> = circles
        .iter()
        .map(|c| {
            let ties: Vec<String> = c
                .iter()
                .flat_map(|a| {
                    edges[a]
                        .iter()
                        .filter(|(b, _)| c.contains(*b))
                        .map(|(_, how)| format!("  {how}"))
                })
                .collect();
            format!("{}:\n{}", c.join(" <-> "), ties.join("\n"))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "modules that import each other round a circle:\n{}",
        shown.join("\n")
    );
}

#[test]
fn every_script_is_called_through_its_typed_wrapper() {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    files.sort();
    let mut outside = Vec::new();
    for file in &files {
        let name = display(file);
        if WRAPPERS.iter().any(|w| name.starts_with(w)) {
            continue;
        }
        for path in paths(file).written {
            let last = path.rsplit("::").next().unwrap_or_default();
            if last == "SCRIPTS" || path.ends_with("redis::Script") || path.starts_with("Script::")
            {
                outside.push(format!("{name}: `{path}`"));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "scripts called outside their typed wrappers (src/scripts/):\n{}",
        outside.join("\n")
    );
}

/// The strongly connected groups of more than one module (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.out.push(group);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}
