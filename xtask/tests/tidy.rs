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
    for path in rust_files(src) {
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
    let sources = sources();
    let mut found = 0;
    for src in &sources {
        let dir = root().join(src);
        // The folder is a crate's: what is read below is its code.
        assert!(dir.join("lib.rs").exists() || dir.join("main.rs").exists(), "{src}: no lib.rs or main.rs");
        let modules = module_uses(&dir);
        found += modules.len();
        if let Some(found) = cycle(&modules) {
            panic!("{src}: modules use each other in a circle: {}", found.join(" -> "));
        }
    }
    // A crate may be one file, but the workspace is not: modules went unseen.
    assert!(found > 2 * sources.len(), "{found} modules in {sources:?}");
}

/// The suites depend only on the harness, never on each other: a module of tests/suites names
/// nothing through `crate::`.
#[test]
fn no_suite_uses_another() {
    let suites = rust_files(&root().join("tests/tests/suites"));
    assert!(suites.len() > 5, "{suites:?}");
    for path in suites {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("crate::"), "{} uses another suite through crate::", path.display());
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

/// The crates' source folders the shape checks look at: the `src` folder of every member of the
/// workspace that has one, so that a crate added to the workspace is held to them too.
fn sources() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = workspace_members(&manifest);
    assert!(!members.is_empty(), "the root Cargo.toml's [workspace] lists no members");
    members.into_iter().map(|m| format!("{m}/src")).filter(|src| root().join(src).is_dir()).collect()
}

/// The `members` of a Cargo.toml's `[workspace]` table: an array of strings, basic (without
/// escapes) or literal, on one line or many, with comments and a trailing comma. Anything else
/// there (an escape, a glob, a value that is not a string) fails the test rather than being
/// misread.
fn workspace_members(manifest: &str) -> Vec<String> {
    let mut table = "";
    let mut array = None;
    for line in manifest.lines() {
        let text = line.split('#').next().unwrap().trim();
        if text.starts_with('[') && text.ends_with(']') && !text.contains(['"', '\'', ',']) {
            table = text;
        } else if table == "[workspace]"
            && let Some(value) = text.strip_prefix("members").and_then(|v| v.trim_start().strip_prefix('='))
        {
            // The value runs on past this line, and past a comment: read it from the manifest.
            array = Some(&manifest[value.as_ptr() as usize - manifest.as_ptr() as usize..]);
            break;
        }
    }
    let array = array.expect("the root Cargo.toml has no `members = [...]` in its [workspace]").trim_start();
    let mut chars = array.strip_prefix('[').expect("`members` is an array").chars();
    let mut members = Vec::new();
    loop {
        match chars.next().expect("`members = [` is closed by `]`") {
            ']' => break,
            c if c.is_whitespace() || c == ',' => {}
            '#' => while chars.next().is_some_and(|c| c != '\n') {},
            quote @ ('"' | '\'') => {
                let member: String = chars.by_ref().take_while(|c| *c != quote).collect();
                assert!(
                    !member.is_empty() && !member.contains(['\\', '*', '?', '[', '\n']),
                    "a member this test cannot read: {member:?} (an escape, a glob, a multi-line string)"
                );
                members.push(member.trim_end_matches('/').to_string());
            }
            other => panic!("`members` holds something that is not a string, at {other:?}"),
        }
    }
    members
}

#[test]
fn the_workspace_members_are_read() {
    let manifest = "[package]\nmembers = [\"not-this\"]\n\n[workspace]\nresolver = \"3\"\n\
                    members = [ # the crates\n  \"a\",\n  'b/c', # literal\n  \"d\" ,\n]\n\
                    exclude = [\"e\"]\n[workspace.metadata]\nmembers = [\"nor-this\"]\n";
    assert_eq!(workspace_members(manifest), ["a", "b/c", "d"]);
    assert_eq!(workspace_members("[workspace]\nmembers=[\"x\"]"), ["x"]);
    let sources = sources();
    for src in ["xtask/src", "sandbox-verify/src", "tests/probe/src"] {
        assert!(sources.iter().any(|s| s == src), "{src} is not among {sources:?}");
    }
}

/// Every `.rs` file under `dir`, but under `target/` and hidden folders.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() {
            if name == "target" || (name.starts_with('.') && path != dir) {
                continue;
            }
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if name.ends_with(".rs") {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The text users read: the README and every page under docs/.
fn documentation() -> String {
    let mut text = std::fs::read_to_string(root().join("README.md")).unwrap();
    for page in std::fs::read_dir(root().join("docs")).into_iter().flatten() {
        let path = page.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            text.push_str(&std::fs::read_to_string(path).unwrap());
        }
    }
    text
}

#[test]
fn every_rust_file_opens_with_what_it_is() {
    let missing: Vec<String> = rust_files(&root())
        .into_iter()
        .filter(|f| !std::fs::read_to_string(f).unwrap().starts_with("//!"))
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(missing.is_empty(), "files that do not open with a `//!` comment: {missing:?}");
}

/// Non-test code per module: past 600 lines a module is listed, past 800 the test fails. The
/// lines up to a module's `#[cfg(test)]` count; a `tests.rs` and the suites are tests.
#[test]
fn no_module_outgrows_its_bar() {
    let mut listed = Vec::new();
    let mut over = Vec::new();
    for src in sources() {
        for file in rust_files(&root().join(src)) {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let lines = text.lines().take_while(|l| l.trim() != "#[cfg(test)]").count();
            let name = file.strip_prefix(root()).unwrap().display().to_string();
            if lines > 800 {
                over.push(format!("{name} ({lines})"));
            } else if lines > 600 {
                listed.push(format!("{name} ({lines})"));
            }
        }
    }
    if !listed.is_empty() {
        eprintln!("modules over 600 lines of code, to split before they pass 800: {}", listed.join(", "));
    }
    assert!(over.is_empty(), "modules over 800 lines of code: split them by concern: {}", over.join(", "));
}

/// The values of `enum NAME { Variant = N, … }` in `file`.
fn enum_values(file: &str, name: &str) -> BTreeSet<u32> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let start =
        text.find(&format!("pub enum {name} {{")).unwrap_or_else(|| panic!("no enum {name} in {file}"));
    let body = &text[start..start + text[start..].find("\n}").unwrap()];
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter_map(|l| l.split_once(" = ")?.1.trim_end_matches(',').trim().parse().ok())
        .collect()
}

/// The codes in the first column of the table after the line that contains `heading`.
fn table_codes(text: &str, heading: &str) -> BTreeSet<u32> {
    let start = text.find(heading).unwrap_or_else(|| panic!("no `{heading}` in the documentation"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.trim_start_matches('|').split('|').next()?.trim().parse().ok())
        .collect()
}

/// The documented exit codes are the code's: the launcher's table (and its `--help`) against
/// `Code`, sandbox-init's against `Refusal`.
#[test]
fn the_documented_exit_codes_are_the_enums() {
    let docs = documentation();
    let mut launcher = enum_values("agent-sandbox/src/exit.rs", "Code");
    // Success, and clap's own for bad usage.
    launcher.extend([0, 2]);
    assert_eq!(table_codes(&docs, "Exit codes of the launcher"), launcher, "the launcher's table");
    let help = std::fs::read_to_string(root().join("agent-sandbox/src/flags.rs")).unwrap();
    let help = &help[help.find("Exit codes:").unwrap()..help.find("\";").unwrap()];
    let in_help: BTreeSet<u32> = help
        .lines()
        .filter_map(|l| l.trim().trim_end_matches(['\\', 'n']).split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(in_help, launcher, "`agent-sandbox --help`");
    assert_eq!(
        table_codes(&docs, "Exit codes of sandbox-init"),
        enum_values("sandbox-init/src/exit.rs", "Refusal"),
        "sandbox-init's table"
    );
}

/// ARCHITECTURE.md's code map names every module of every crate (as `name.rs`, or `name`), and
/// every `name.rs` it names exists.
#[test]
fn the_code_map_names_every_module() {
    let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut unnamed = Vec::new();
    let mut on_disk = BTreeSet::new();
    for src in sources() {
        for file in rust_files(&root().join(src)) {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            on_disk.insert(name.clone());
            let stem = name.trim_end_matches(".rs");
            if ["lib.rs", "main.rs", "tests.rs", "mod.rs"].contains(&name.as_str()) {
                continue;
            }
            if !map.contains(&format!("`{name}`"))
                && !map.contains(&format!("/{name}`"))
                && !map.contains(&format!("`{stem}`"))
            {
                unnamed.push(file.strip_prefix(root()).unwrap().display().to_string());
            }
        }
    }
    assert!(unnamed.is_empty(), "modules ARCHITECTURE.md's code map does not name: {unnamed:?}");
    for file in rust_files(&root()) {
        on_disk.insert(file.file_name().unwrap().to_string_lossy().into_owned());
    }
    let named: Vec<&str> = map
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with(".rs") && s.len() > 3 && !s.contains(" "))
        .map(|s| s.rsplit('/').next().unwrap())
        .filter(|s| !on_disk.contains(*s))
        .collect();
    assert!(named.is_empty(), "ARCHITECTURE.md names files that do not exist: {named:?}");
}

/// The probe's usage text lists every command its dispatcher takes, and no other.
#[test]
fn the_probe_usage_is_its_dispatcher() {
    let main = std::fs::read_to_string(root().join("tests/probe/src/main.rs")).unwrap();
    let usage = &main[main.find("const USAGE").unwrap()..];
    let usage = &usage[..usage.find("\";").unwrap()];
    let listed: BTreeSet<&str> = usage
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let dispatch = &main[main.find("match args.arg(0)").unwrap()..];
    let dispatch = &dispatch[..dispatch.find("_ =>").unwrap()];
    let taken: BTreeSet<&str> =
        dispatch.lines().filter_map(|l| l.trim().strip_prefix('"')?.split('"').next()).collect();
    assert!(taken.len() > 20, "{taken:?}");
    assert_eq!(listed, taken, "the usage text and the dispatcher");
}

/// The anchors GitHub makes of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            let heading = line.trim_start_matches('#').trim().to_lowercase();
            let slug: String = heading
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            found.insert(slug);
        }
    }
    found
}

/// Every relative link in the README, ARCHITECTURE.md and docs/ names a file that exists, and
/// every `#anchor` a heading of the file it points into.
#[test]
fn every_link_in_the_documentation_resolves() {
    let mut pages = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    pages.extend(
        std::fs::read_dir(root().join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    assert!(pages.len() > 5, "the docs/ pages: {pages:?}");
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut fence = false;
        for line in text.lines() {
            if line.starts_with("```") {
                fence = !fence;
                continue;
            }
            if fence {
                continue;
            }
            for (i, _) in line.match_indices("](") {
                let target: String = line[i + 2..].chars().take_while(|c| *c != ')').collect();
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                let (path, anchor) =
                    target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
                let file = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
                let name = page.strip_prefix(root()).unwrap().display();
                if !file.exists() {
                    broken.push(format!("{name}: `{target}`: no such file"));
                    continue;
                }
                if let Some(anchor) = anchor
                    && !anchors(&std::fs::read_to_string(&file).unwrap()).contains(anchor)
                {
                    broken.push(format!("{name}: `{target}`: no heading makes #{anchor}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "links that do not resolve:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_githubs() {
    let made = anchors("# Without the launcher: `docker run`\n```\n# not a heading\n```\n## API keys\n");
    assert_eq!(made, BTreeSet::from(["without-the-launcher-docker-run".to_string(), "api-keys".to_string()]));
}

/// Every image that says its CLI can use a model server of the user's (`SANDBOX_MODEL_SERVER_ENV`
/// in its Dockerfile) has that proven by a turn on one (`local:` in its turn.yaml, the agents::
/// suite), and every such turn is of an image that says so; the shell image, which has no CLI of
/// its own, is proven by attacks::models.
#[test]
fn every_cli_that_can_use_a_model_server_is_proven_to() {
    let images = root().join("images");
    let mut checked = 0;
    for entry in std::fs::read_dir(&images).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(dockerfile) = std::fs::read_to_string(dir.join("Dockerfile")) else { continue };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let declares =
            dockerfile.lines().any(|l| l.trim_start().starts_with("ENV SANDBOX_MODEL_SERVER_ENV="));
        let turn = std::fs::read_to_string(dir.join("turn.yaml")).unwrap_or_default();
        let proven = turn.lines().any(|l| l.starts_with("local:"));
        if name == "shell" {
            assert!(declares, "the shell image declares the OpenAI-compatible variables");
            continue;
        }
        assert_eq!(
            declares, proven,
            "{name}: declares SANDBOX_MODEL_SERVER_ENV {declares}, has a `local:` turn {proven}"
        );
        checked += 1;
    }
    assert!(checked >= 10, "{checked} images");
}
