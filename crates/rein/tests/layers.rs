//! The workspace's module structure: no module import cycle in any crate, and rein-sim's layers import
//! only downwards (file -> model -> engine -> report -> check); and between crates, the test-support
//! crates ([`TEST_SUPPORT`]) are dev-dependencies only and depend on no crate of the workspace.
//!
//! How it is checked: every crate's module tree is read from its sources (`mod x;` declarations, files
//! `x.rs` or `x/mod.rs`, inline `mod x { .. }` blocks), and every path a module's code names is resolved
//! to the module it points into: `crate::a::b`, `super::..`, `self::..`, and a leading name that is a
//! child module of the current one or a sibling brought into scope by `use`. A reference from module M
//! into module X is an edge between the two *siblings* under their lowest common ancestor that contain M
//! and X (a parent naming its own children, or a child naming its parent, is a namespace and not an
//! edge). Then every set of siblings must be acyclic. Comments, strings and `#[cfg(test)]` modules are
//! ignored. Run it with `cargo test -p rein --test layers`; a cycle fails with the modules and the
//! lines that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module: its path from the crate root (empty for the root) and its code.
#[derive(Debug)]
struct Module {
    path: Vec<String>,
    file: PathBuf,
    code: String,
}

/// The workspace checked: this one, or another checkout named by `REIN_LAYERS_WORKSPACE` (to see what
/// the checker says about an older tree).
fn workspace() -> PathBuf {
    std::env::var_os("REIN_LAYERS_WORKSPACE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Removes comments, string and char literals (keeping line breaks, so line numbers hold).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) && !ident_byte(b, i) {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match b.get(j) {
                    None => break,
                    Some(b'"') if b[j + 1..].iter().take(hashes).filter(|&&x| x == b'#').count() == hashes => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(b'\n') => out.push('\n'),
                    _ => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if b.get(i) == Some(&b'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == b'\'' && b.get(i + 2) == Some(&b'\'') {
            out.push_str("' '");
            i += 3;
        } else if c == b'\'' && b.get(i + 1) == Some(&b'\\') {
            let end = b[i + 2..].iter().position(|&x| x == b'\'').map_or(b.len(), |p| i + 3 + p);
            out.push_str("' '");
            i = end;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn ident_byte(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Splits `code` into its own text and its inline child modules (`mod x { .. }`), and lists `mod x;`
/// declarations. `#[cfg(test)]` modules are dropped.
fn split_modules(code: &str) -> (String, Vec<(String, Option<String>)>) {
    let b = code.as_bytes();
    let mut own = String::new();
    let mut children = Vec::new();
    let mut i = 0;
    let mut test_attr = false;
    while i < b.len() {
        if code[i..].starts_with("#[cfg(test)]") {
            test_attr = true;
            i += "#[cfg(test)]".len();
            continue;
        }
        let at_word = !ident_byte(b, i);
        let rest = &code[i..];
        let is_mod = at_word
            && (rest.starts_with("mod ") || rest.starts_with("pub mod ") || rest.starts_with("pub(crate) mod "));
        if is_mod {
            let after = &rest[rest.find("mod ").unwrap() + 4..];
            let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let tail = after[name.len()..].trim_start();
            let head_len = rest.len() - after.len() + name.len() + (after[name.len()..].len() - tail.len());
            if tail.starts_with(';') {
                if !test_attr {
                    children.push((name, None));
                }
                i += head_len + 1;
                test_attr = false;
                continue;
            }
            if tail.starts_with('{') {
                let start = i + head_len + 1;
                let mut depth = 1;
                let mut j = start;
                while j < b.len() && depth > 0 {
                    match b[j] {
                        b'{' => depth += 1,
                        b'}' => depth -= 1,
                        _ => {}
                    }
                    j += 1;
                }
                if !test_attr {
                    children.push((name, Some(code[start..j - 1].to_string())));
                }
                // Keep line numbers.
                own.extend(code[i..j].chars().filter(|&c| c == '\n'));
                i = j;
                test_attr = false;
                continue;
            }
        }
        if !b[i].is_ascii_whitespace() && test_attr && !code[i..].starts_with("#[") {
            test_attr = false;
        }
        own.push(b[i] as char);
        i += 1;
    }
    (own, children)
}

/// Every module of the crate whose root file is `root`.
fn modules(root: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let code = strip(&std::fs::read_to_string(root).unwrap());
    collect(root.parent().unwrap(), root, Vec::new(), code, &mut out);
    out
}

fn collect(dir: &Path, file: &Path, path: Vec<String>, code: String, out: &mut Vec<Module>) {
    let (own, children) = split_modules(&code);
    for (name, inline) in children {
        let mut p = path.clone();
        p.push(name.clone());
        match inline {
            Some(body) => collect(&dir.join(&name), file, p, body, out),
            None => {
                let (f, d) = if dir.join(format!("{name}.rs")).exists() {
                    (dir.join(format!("{name}.rs")), dir.join(&name))
                } else {
                    (dir.join(&name).join("mod.rs"), dir.join(&name))
                };
                let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                collect(&d, &f, p, strip(&text), out);
            }
        }
    }
    out.push(Module { path, file: file.to_path_buf(), code: own });
}

/// Paths named in `code`, each as its segments and the line it is on; `use` groups are expanded.
fn paths(code: &str) -> Vec<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    let mut line = 1;
    while i < b.len() {
        if b[i] == b'\n' {
            line += 1;
        }
        if (b[i].is_ascii_alphabetic() || b[i] == b'_') && !ident_byte(b, i) {
            let mut j = i;
            let mut segs = Vec::new();
            loop {
                let s = j;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                segs.push(code[s..j].to_string());
                if code[j..].starts_with("::") && b.get(j + 2).is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') {
                    j += 2;
                } else if code[j..].starts_with("::{") {
                    // A use group: expand each item one level (enough to find modules).
                    let end = code[j..].find('}').map_or(b.len(), |p| j + p);
                    for item in code[j + 3..end].split(',') {
                        let first: String =
                            item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if !first.is_empty() {
                            let mut s2 = segs.clone();
                            s2.push(first);
                            out.push((s2, line));
                        }
                    }
                    break;
                } else {
                    break;
                }
            }
            if segs.len() > 1 {
                out.push((segs, line));
            }
            i = j.max(i + 1);
            continue;
        }
        i += 1;
    }
    out
}

/// The module a path from module `at` points into, if it is one of the crate's (longest prefix).
fn resolve(at: &[String], segs: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = segs;
    match segs[0].as_str() {
        "crate" => {
            base = Vec::new();
            rest = &segs[1..];
        }
        "self" => {
            base = at.to_vec();
            rest = &segs[1..];
        }
        "super" => {
            base = at.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => {
            // A child of the current module, else a name from the crate root (2015-style paths are not
            // used here, so only children count).
            let mut child = at.to_vec();
            child.push(segs[0].clone());
            if !known.contains(&child) {
                return None;
            }
            base = at.to_vec();
        }
    }
    let mut found = None;
    for s in rest {
        base.push(s.clone());
        if known.contains(&base) {
            found = Some(base.clone());
        } else {
            break;
        }
    }
    found.or_else(|| (segs[0] == "super").then(|| base.clone()).filter(|b| known.contains(b)))
}

/// Imports among siblings: parent module path -> (child A -> the children B of the same parent that A
/// depends on).
type SiblingGraph = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

/// Cycles among the siblings of every module of one crate: (description) for each, and the graph they
/// were found in.
fn cycles(modules: &[Module]) -> (Vec<String>, SiblingGraph) {
    let known: BTreeSet<Vec<String>> = modules.iter().map(|m| m.path.clone()).collect();
    // parent -> (child A -> children B it depends on); with a sample reference per edge.
    let mut graph: SiblingGraph = BTreeMap::new();
    let mut why: BTreeMap<(Vec<String>, String, String), String> = BTreeMap::new();
    for m in modules {
        for (segs, line) in paths(&m.code) {
            let Some(target) = resolve(&m.path, &segs, &known) else { continue };
            let common = m.path.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == m.path.len() || common == target.len() {
                continue; // one contains the other: a namespace, not an edge
            }
            let parent = m.path[..common].to_vec();
            let (a, b) = (m.path[common].clone(), target[common].clone());
            graph.entry(parent.clone()).or_default().entry(a.clone()).or_default().insert(b.clone());
            let file = m.file.strip_prefix(workspace()).unwrap_or(&m.file).display().to_string();
            why.entry((parent, a, b)).or_insert_with(|| format!("{file}:{line}: {}", segs.join("::")));
        }
    }
    let mut found = Vec::new();
    for (parent, edges) in &graph {
        // Depth-first search for a back edge.
        let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flatten()).collect();
        let mut state: BTreeMap<&String, u8> = nodes.iter().map(|n| (*n, 0)).collect();
        fn dfs<'a>(
            n: &'a String,
            edges: &'a BTreeMap<String, BTreeSet<String>>,
            state: &mut BTreeMap<&'a String, u8>,
            stack: &mut Vec<&'a String>,
            out: &mut Vec<Vec<String>>,
        ) {
            state.insert(n, 1);
            stack.push(n);
            for m in edges.get(n).into_iter().flatten() {
                match state.get(m).copied().unwrap_or(0) {
                    0 => dfs(m, edges, state, stack, out),
                    1 => {
                        let from = stack.iter().position(|x| *x == m).unwrap();
                        out.push(stack[from..].iter().map(|s| s.to_string()).chain([m.clone()]).collect());
                    }
                    _ => {}
                }
            }
            stack.pop();
            state.insert(n, 2);
        }
        let mut out = Vec::new();
        for n in &nodes {
            if state[n] == 0 {
                dfs(n, edges, &mut state, &mut Vec::new(), &mut out);
            }
        }
        for c in out {
            let refs: Vec<String> =
                c.windows(2).map(|w| why[&(parent.clone(), w[0].clone(), w[1].clone())].clone()).collect();
            found.push(format!("in {:?}: {} ({})", parent, c.join(" -> "), refs.join("; ")));
        }
    }
    (found, graph)
}

fn crates() -> Vec<(String, PathBuf)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(workspace().join("crates")).unwrap() {
        let dir = e.unwrap().path();
        for root in ["src/lib.rs", "src/main.rs"] {
            if dir.join(root).exists() {
                v.push((dir.file_name().unwrap().to_string_lossy().into_owned(), dir.join(root)));
            }
        }
    }
    v.sort();
    v
}

#[test]
fn no_crate_has_a_module_import_cycle() {
    let mut all = Vec::new();
    let crates = crates();
    assert!(crates.len() >= 6, "found the workspace's crates: {crates:?}");
    for (name, root) in &crates {
        let mods = modules(root);
        let (found, _) = cycles(&mods);
        all.extend(found.into_iter().map(|c| format!("{name} {c}")));
    }
    assert!(all.is_empty(), "module import cycles:\n{}", all.join("\n"));
}

#[test]
fn rein_sim_layers_import_only_downwards() {
    let root = workspace().join("crates/rein-sim/src/lib.rs");
    let (_, graph) = cycles(&modules(&root));
    let rank = |m: &str| ["file", "model", "engine", "report", "check"].iter().position(|x| *x == m);
    let top = graph.get(&Vec::new()).cloned().unwrap_or_default();
    let mut bad = Vec::new();
    for (from, tos) in &top {
        for to in tos {
            match (rank(from), rank(to)) {
                (Some(a), Some(b)) if b < a => {}
                (None, Some(_)) => {} // helpers beside the layers (bench) may use any layer
                _ => bad.push(format!("{from} -> {to}")),
            }
        }
    }
    assert!(bad.is_empty(), "rein-sim imports that do not point down: {bad:?}");
    // The layers really are there and used.
    assert!(top.get("check").is_some_and(|t| t.contains("model")), "{top:?}");
    assert!(top.get("engine").is_some_and(|t| t.contains("model")), "{top:?}");
}

/// The checker finds a cycle when there is one (so a pass means something).
#[test]
fn a_cycle_is_caught() {
    let m = |path: &[&str], code: &str| Module {
        path: path.iter().map(|s| s.to_string()).collect(),
        file: PathBuf::from(path.join("/")),
        code: split_modules(&strip(code)).0,
    };
    let mods = vec![
        m(&[], "mod a; mod b; mod c;"),
        m(&["a"], "use crate::b::X; // crate::c is only in a comment\nfn f() { let s = \"crate::c::Y\"; }"),
        m(&["b"], "fn g() { super::c::h(); }"),
        m(&["c"], "use crate::a::{Z, W};"),
    ];
    let (found, _) = cycles(&mods);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a -> b -> c -> a"), "{found:?}");
    // Parent and child naming each other is a namespace, not a cycle; nor is a test module.
    let mods = vec![
        m(&[], "mod a; use a::X;"),
        m(&["a"], "use super::Y; #[cfg(test)]\nmod tests { use crate::b; }"),
        m(&["b"], "use crate::a::X;"),
    ];
    assert!(cycles(&mods).0.is_empty());
}

/// The test-support crates, each with why it is one: crates of test helpers shared by several crates'
/// tests, `publish = false`, depended on only as dev-dependencies. A crate with `publish = false` must be
/// listed here (and a listed one must have it).
const TEST_SUPPORT: [(&str, &str); 1] = [(
    "rein-testkit",
    "loop devices and file systems on them (losetup, mkfs, mount, as root), released when dropped, and test \
     certificates, keys and CRLs (the openssl command), for rein-runtime's and rein's tests",
)];

/// The names of the crates a manifest depends on in its `kind` tables (`dependencies`,
/// `build-dependencies`, `dev-dependencies`), also per target (`[target.'cfg(..)'.dependencies]`); a
/// renamed dependency by its `package`.
fn dependencies(manifest: &toml::Table, kind: &str) -> BTreeSet<String> {
    let targets = manifest.get("target").and_then(|t| t.as_table()).into_iter().flat_map(|t| t.values());
    let tables = std::iter::once(manifest.get(kind)).chain(targets.map(|t| t.get(kind)));
    let mut names = BTreeSet::new();
    for table in tables.flatten().filter_map(|t| t.as_table()) {
        for (key, spec) in table {
            let package = spec.get("package").and_then(|p| p.as_str()).unwrap_or(key);
            names.insert(package.to_string());
        }
    }
    names
}

/// Every crate's manifest under crates/: (package name, manifest).
fn manifests() -> Vec<(String, toml::Table)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(workspace().join("crates")).unwrap() {
        let path = e.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let manifest: toml::Table = text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = manifest["package"]["name"].as_str().unwrap().to_string();
        out.push((name, manifest));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The test-support crates ([`TEST_SUPPORT`]) are dev-dependencies only: no crate's normal or build
/// dependencies name one (that would build test helpers, which run commands as root, into what ships),
/// each is some crate's dev-dependency, and they depend on no crate of the workspace, so they sit below
/// every crate and a crate's tests using one close no cycle back to it.
#[test]
fn test_support_crates_are_dev_dependencies_only() {
    let manifests = manifests();
    let workspace_crates: BTreeSet<&str> = manifests.iter().map(|(name, _)| name.as_str()).collect();
    assert!(workspace_crates.len() >= 6, "found the workspace's crates: {workspace_crates:?}");
    let listed: BTreeSet<&str> = TEST_SUPPORT.iter().map(|(name, _)| *name).collect();
    let unpublished: BTreeSet<&str> = manifests
        .iter()
        .filter(|(_, m)| m["package"].get("publish").and_then(|p| p.as_bool()) == Some(false))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(unpublished, listed, "the crates with publish = false are the test-support crates listed");
    let mut bad = Vec::new();
    for (name, manifest) in &manifests {
        for kind in ["dependencies", "build-dependencies"] {
            for dep in dependencies(manifest, kind).intersection(&listed.iter().map(|s| s.to_string()).collect()) {
                bad.push(format!("{name} has test-support crate {dep} in its {kind}"));
            }
        }
        if listed.contains(name.as_str()) {
            for dep in dependencies(manifest, "dependencies") {
                if workspace_crates.contains(dep.as_str()) {
                    bad.push(format!("test-support crate {name} depends on workspace crate {dep}"));
                }
            }
        }
    }
    for support in &listed {
        if !manifests.iter().any(|(_, m)| dependencies(m, "dev-dependencies").contains(*support)) {
            bad.push(format!("test-support crate {support} is no crate's dev-dependency"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The workspace crates each crate depends on (normal and build dependencies) are the ones
/// ARCHITECTURE.md's crate table lets it use: the table's "may use" cell names them by their short names
/// (`core`, `model`, `proto`, `sim`, `runtime`, ...; `everything` for the binary), so a dependency added
/// in a manifest without the table, or a table that promises a layer it does not keep, fails here,
/// naming the crate and the difference. Cargo already refuses a cycle; this holds the drawn layers.
#[test]
fn crates_depend_on_the_layers_architecture_md_lets_them_use() {
    let manifests = manifests();
    let workspace_crates: BTreeSet<String> = manifests.iter().map(|(name, _)| name.clone()).collect();
    let table = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let mut listed = BTreeSet::new();
    let mut bad = Vec::new();
    for line in table.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `crates/NAME` ... | holds | may use | never |
        let Some(name) = cells.get(1).and_then(|c| c.strip_prefix("`crates/")).and_then(|c| c.split('`').next()) else {
            continue;
        };
        let name = name.to_string();
        let may_use = cells.get(3).copied().unwrap_or_default();
        listed.insert(name.clone());
        let Some((_, manifest)) = manifests.iter().find(|(n, _)| *n == name) else {
            bad.push(format!("ARCHITECTURE.md lists {name}, which is not a crate of the workspace"));
            continue;
        };
        let used: BTreeSet<String> = ["dependencies", "build-dependencies"]
            .iter()
            .flat_map(|kind| dependencies(manifest, kind))
            .filter(|d| workspace_crates.contains(d) && *d != name)
            .collect();
        let words: BTreeSet<String> = may_use
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect();
        let allowed: BTreeSet<String> = if words.contains("everything") {
            workspace_crates.iter().filter(|c| **c != name).cloned().collect()
        } else {
            workspace_crates
                .iter()
                .filter(|c| {
                    let short = c.strip_prefix("rein-").unwrap_or(c);
                    words.contains(short) || words.contains(c.as_str())
                })
                .cloned()
                .collect()
        };
        for dep in used.difference(&allowed) {
            bad.push(format!("{name} depends on {dep}, which its \"may use\" cell in ARCHITECTURE.md does not name"));
        }
        for dep in allowed.difference(&used) {
            if !words.contains("everything") {
                bad.push(format!("ARCHITECTURE.md lets {name} use {dep}, but its manifest does not depend on it"));
            }
        }
    }
    assert!(listed.len() >= 8, "read ARCHITECTURE.md's crate table: {listed:?}");
    for name in workspace_crates.difference(&listed) {
        bad.push(format!("crate {name} has no row in ARCHITECTURE.md's crate table"));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
