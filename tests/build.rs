//! Generates the contract suite's list of images from images/: one module per image folder, so
//! adding an image adds its contract tests with no list to edit; and the agents suite's, one
//! module per image folder with a `turn.yaml`.

use std::path::Path;

fn main() {
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images");
    // A directory: cargo rescans it, so a new image folder regenerates the list.
    println!("cargo:rerun-if-changed={}", images.display());
    let mut names: Vec<String> = std::fs::read_dir(&images)
        .expect("images/ is readable")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Dockerfile").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let modules: String = names
        .iter()
        .map(|name| format!("mod {} {{ contract_tests!(\"{name}\"); }}\n", module(name)))
        .collect();
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(Path::new(&out_dir).join("contract_images.rs"), modules).expect("OUT_DIR is writable");
    // The agents suite: one module per image whose folder says how to run one headless turn, and
    // in it a refresh test where its turn.yaml says how the CLI's sign-in is copied in, and a
    // local model's turn where it says how the CLI runs on one (`local:`).
    let turns: String = names
        .iter()
        .filter_map(|name| {
            let path = images.join(name).join("turn.yaml");
            // Only a file that is there: cargo counts a missing one as changed, and would run this
            // script and rebuild the suites on every build. A new turn.yaml is caught by the scan of
            // images/ above.
            let turn = std::fs::read_to_string(&path).ok()?;
            println!("cargo:rerun-if-changed={}", path.display());
            let refresh = turn.lines().any(|line| line.starts_with("refresh:"));
            let refresh = if refresh { format!(" refresh_tests!(\"{name}\");") } else { String::new() };
            let local = turn.lines().any(|line| line.starts_with("local:"));
            let local = if local { format!(" local_model_tests!(\"{name}\");") } else { String::new() };
            Some(format!("mod {} {{ agent_tests!(\"{name}\");{refresh}{local} }}\n", module(name)))
        })
        .collect();
    std::fs::write(Path::new(&out_dir).join("agent_turns.rs"), turns).expect("OUT_DIR is writable");
}

/// An image's module name: `-` becomes `_`, and a Rust keyword (an image named `continue`) is
/// written raw: its tests are `contract::r#continue::…`.
fn module(name: &str) -> String {
    const KEYWORDS: &[&str] = &[
        "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "do", "dyn",
        "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl", "in", "let", "loop",
        "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref", "return", "static",
        "struct", "trait", "true", "try", "type", "typeof", "unsafe", "unsized", "use", "virtual", "where",
        "while", "yield",
    ];
    let ident = name.replace('-', "_");
    if KEYWORDS.contains(&ident.as_str()) { format!("r#{ident}") } else { ident }
}
