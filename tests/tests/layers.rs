//! Who may depend on whom: the layer order ARCHITECTURE.md states (its `layers` block) and
//! no import cycle between modules, checked over the source of `core/` and `app/`.
//!
//! A module's imports are the `crate::…` and `super::…` paths in its files (comments left
//! out), `use crate::{a, b::c}` groups included. Top-level modules must sit in the stated
//! layers and use only modules of lower layers; within a directory module, the files
//! (`snapshot/pickle`, `snapshot/json`, …) must not import each other in a cycle. Unit-test
//! modules (`tests.rs`, `*_tests.rs`) are test code and stand outside the layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules one file's code names, as absolute module paths (`["trace", "evidence"]`).
fn imports(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let code = strip_comments(text);
    let mut out = Vec::new();
    for (start, _) in code.match_indices("crate::") {
        // `$crate::` in macros, `allocsim_crate::`: only a bare `crate::`.
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        out.extend(paths_at(&code[start + "crate::".len()..], &[]));
    }
    for (start, _) in code.match_indices("super::") {
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut base: Vec<String> = here.to_vec();
        let mut rest = &code[start..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        out.extend(paths_at(rest, &base));
    }
    out
}

/// The paths that start at `text` (just after `crate::` or the last `super::`), prefixed
/// with `base`: one path, or one per item of a `{…}` group.
fn paths_at(text: &str, base: &[String]) -> Vec<Vec<String>> {
    let mut path = base.to_vec();
    let mut rest = text;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut items = Vec::new();
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => items.push(std::mem::take(&mut item)),
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if !(c == ',' && depth == 1) {
                    item.push(c);
                }
            }
            items.push(item);
            return items
                .iter()
                .flat_map(|i| paths_at(i.trim(), &path))
                .collect();
        }
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() || ident == "self" {
            return vec![path];
        }
        path.push(ident.clone());
        rest = &rest[ident.len()..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => return vec![path],
        }
    }
}

/// `text` without `//` comments (doc comments included) and `/* */` blocks; string
/// literals are kept as they are (none of ours spells a module path).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// A unit-test module (`tests.rs`, `*_tests.rs`): test code may use any module, and no
/// module uses it, so it stands outside the layers.
fn is_test_module(p: &Path) -> bool {
    p.file_stem()
        .and_then(|s| s.to_str())
        .is_some_and(|s| s == "tests" || s.ends_with("_tests"))
}

/// Every `.rs` file under `src` (test modules left out) with its module path (`trace/mod.rs` → `["trace"]`).
fn modules(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && !is_test_module(&p) {
                let rel = p.strip_prefix(src).unwrap();
                let mut m: Vec<String> = rel
                    .with_extension("")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if m.last()
                    .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
                {
                    m.pop();
                }
                out.push((p, m));
            }
        }
    }
    out.sort();
    out
}

/// The import graph of one crate: top-level module → the top-level modules it uses, and
/// per directory module its files' graph among themselves.
struct Graphs {
    top: BTreeMap<String, BTreeSet<String>>,
    inner: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

fn graphs(src: &Path) -> Graphs {
    let files = modules(src);
    let known: BTreeSet<Vec<String>> = files.iter().map(|(_, m)| m.clone()).collect();
    let is_module = |p: &[String]| known.contains(p);
    let mut g = Graphs {
        top: BTreeMap::new(),
        inner: BTreeMap::new(),
    };
    for (path, m) in &files {
        let Some(top) = m.first() else { continue };
        g.top.entry(top.clone()).or_default();
        let text = std::fs::read_to_string(path).unwrap();
        for target in imports(&text, m) {
            // The deepest module the path names (the rest are items).
            let Some(depth) = (1..=target.len()).rev().find(|&d| is_module(&target[..d])) else {
                continue; // an item of the crate root (`crate::Error`, a macro)
            };
            let target = &target[..depth];
            if &target[0] != top {
                g.top
                    .entry(top.clone())
                    .or_default()
                    .insert(target[0].clone());
            } else if m.len() >= 2 && target.len() >= 2 && m[1] != target[1] {
                g.inner
                    .entry(top.clone())
                    .or_default()
                    .entry(m[1].clone())
                    .or_default()
                    .insert(target[1].clone());
            }
        }
    }
    g
}

/// The cycles of a graph: its strongly connected components of more than one node.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = g
        .keys()
        .chain(g.values().flatten())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for t in g.get(n).into_iter().flatten() {
                if seen.insert(t) {
                    stack.push(t);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<&String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    for n in &nodes {
        if !reaches[n].contains(n) || out.iter().any(|c| c.contains(n)) {
            continue;
        }
        let scc: Vec<String> = nodes
            .iter()
            .filter(|m| reaches[n].contains(*m) && reaches[*m].contains(n))
            .map(|m| (*m).clone())
            .collect();
        out.push(scc);
    }
    out
}

/// The `layers` block of ARCHITECTURE.md: per crate directory, its top-level modules by
/// layer, lowest first (`core: units | snapshot | …`).
fn stated_layers(architecture: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let block = architecture
        .split("```layers\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("ARCHITECTURE.md has a ```layers block");
    block
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(krate, layers)| {
            let layers = layers
                .split('|')
                .map(|l| l.split_whitespace().map(str::to_string).collect())
                .collect();
            (krate.trim().to_string(), layers)
        })
        .collect()
}

/// What breaks the rules in one crate's graphs, one line each.
fn violations(krate: &str, g: &Graphs, layers: &[Vec<String>]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|l| l.iter().any(|x| x == m));
    let mut out = Vec::new();
    for (from, tos) in &g.top {
        let Some(lf) = layer_of(from) else {
            out.push(format!(
                "{krate}: module `{from}` is in no layer of ARCHITECTURE.md"
            ));
            continue;
        };
        for to in tos {
            match layer_of(to) {
                None => out.push(format!("{krate}: module `{to}` is in no layer of ARCHITECTURE.md")),
                Some(lt) if lt >= lf => out.push(format!(
                    "{krate}: `{from}` (layer {lf}) uses `{to}` (layer {lt}): only lower layers may be used"
                )),
                Some(_) => {}
            }
        }
    }
    for c in cycles(&g.top) {
        out.push(format!("{krate}: import cycle between {}", c.join(", ")));
    }
    for (parent, inner) in &g.inner {
        for c in cycles(inner) {
            out.push(format!(
                "{krate}: import cycle inside `{parent}` between {}",
                c.join(", ")
            ));
        }
    }
    out
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn modules_use_only_lower_layers_and_never_each_other_in_a_cycle() {
    let architecture = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let layers = stated_layers(&architecture);
    let mut all = Vec::new();
    for krate in ["core", "app"] {
        let stated = layers
            .get(krate)
            .unwrap_or_else(|| panic!("ARCHITECTURE.md's layers name no `{krate}`"));
        all.extend(violations(
            krate,
            &graphs(&root().join(krate).join("src")),
            stated,
        ));
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

/// The checker itself finds an upward import, a same-layer import, a module missing from
/// the layers and a cycle between a directory module's files, on a tree written for it.
#[test]
fn the_checker_finds_upward_imports_and_cycles() {
    let dir = std::env::temp_dir().join(format!("allocsim-layers-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("low")).unwrap();
    let write = |p: &str, text: &str| std::fs::write(src.join(p), text).unwrap();
    write(
        "lib.rs",
        "pub mod low; pub mod high; pub mod side; pub mod stray;\n",
    );
    write(
        "low/mod.rs",
        "pub mod a; pub mod b;\nuse crate::high::Thing; // upward\n",
    );
    write("low/a.rs", "use super::b::X;\n");
    write(
        "low/b.rs",
        "use crate::low::a::Y;\n/* crate::stray::Z in a comment */\n",
    );
    write("high.rs", "use crate::{low::a, side};\npub struct Thing;\n");
    write("side.rs", "use crate::Error;\n");
    write("stray.rs", "use crate::low;\n");
    let layers = vec![
        vec!["low".to_string()],
        vec!["high".to_string(), "side".to_string()],
    ];
    let v = violations("t", &graphs(&src), &layers);
    std::fs::remove_dir_all(&dir).ok();
    let has = |s: &str| v.iter().any(|l| l.contains(s));
    assert!(has("`low` (layer 0) uses `high` (layer 1)"), "{v:?}");
    assert!(has("`high` (layer 1) uses `side` (layer 1)"), "{v:?}");
    assert!(has("module `stray` is in no layer"), "{v:?}");
    assert!(has("import cycle between high, low"), "{v:?}");
    assert!(has("import cycle inside `low` between a, b"), "{v:?}");
    assert!(!v.iter().any(|l| l.contains("Error")), "{v:?}");
    assert_eq!(v.len(), 5, "{v:?}");
}
