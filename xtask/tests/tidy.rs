//! Repository invariants that are about the code's shape, checked as tests so that `cargo xtask
//! test` passing means they hold.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// The crate's modules (`name`, or `folder::name` for a module in a folder) and the modules each
/// names through `crate::…`.
fn module_uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(src).unwrap().with_extension("");
        let parts: Vec<String> =
            relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        // A module's tests (`dns/tests.rs`) belong to it; lib.rs and main.rs are the crate.
        let name = match &parts[..] {
            [one] if one == "lib" || one == "main" => continue,
            [one] => one.clone(),
            [folder, file] if file == "tests" => folder.clone(),
            [folder, file, ..] => format!("{folder}::{file}"),
            [] => continue,
        };
        // Code only: a doc link upward names a module without depending on it.
        let text: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let uses = modules.entry(name.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            let path: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut segments = path.split("::").filter(|s| !s.is_empty());
            let Some(first) = segments.next() else { continue };
            let target = match segments.next() {
                Some(second)
                    if src.join(first).is_dir() && src.join(first).join(format!("{second}.rs")).exists() =>
                {
                    format!("{first}::{second}")
                }
                _ => first.to_string(),
            };
            if target != name && !name.starts_with(&format!("{target}::")) {
                uses.insert(target);
            }
        }
    }
    modules
}

/// A cycle in the use graph, if there is one.
fn cycle(modules: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        modules: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut found = path[start..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in modules.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, modules, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    modules.keys().find_map(|m| visit(m, modules, &mut Vec::new(), &mut done))
}

/// "A module may use what is below it, never what is above it": the modules of each crate form
/// layers, so no chain of `crate::` uses leads back to where it started.
#[test]
fn no_module_imports_upward() {
    for src in [
        "xtask/src",
        "agent-sandbox/src",
        "sandbox-images/src",
        "sandbox-init/src",
        "sandbox-policy/src",
        "tests/src",
        "tests/probe/src",
    ] {
        let modules = module_uses(&root().join(src));
        assert!(modules.len() > 1 || src.contains("policy"), "{src}: no modules found");
        if let Some(found) = cycle(&modules) {
            panic!("{src}: modules use each other in a circle: {}", found.join(" -> "));
        }
    }
}

/// The suites depend only on the harness, never on each other: a module of tests/suites names
/// nothing through `crate::`.
#[test]
fn no_suite_uses_another() {
    let suites = root().join("tests/tests/suites");
    let mut files = vec![suites];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("crate::"), "{} uses another suite through crate::", path.display());
        }
    }
}

#[test]
fn a_circle_is_found() {
    let modules: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(cycle(&modules).unwrap(), ["a", "b", "c", "a"]);
    let layered: BTreeMap<String, BTreeSet<String>> =
        [("a".to_string(), BTreeSet::from(["b".to_string()])), ("b".to_string(), BTreeSet::new())].into();
    assert_eq!(cycle(&layered), None);
}
