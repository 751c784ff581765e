//! The xtask's command line as a user meets it: help texts, exit codes, and `graph` on the
//! repository's own images/. None of these needs a container engine.

use std::process::Command;

fn xtask(args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    // Help shows the values of these variables; the snapshots are of the defaults.
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("AGENT_SANDBOX_")) {
        cmd.env_remove(key);
    }
    let out = cmd.args(args).output().expect("xtask runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

#[test]
fn help_texts() {
    for (name, args) in [
        ("help", &["--help"][..]),
        ("build_help", &["build", "--help"]),
        ("graph_help", &["graph", "--help"]),
        ("test_help", &["test", "--help"]),
        ("bench_build_help", &["bench", "build", "--help"]),
    ] {
        let (code, out, _) = xtask(args);
        assert_eq!(code, 0, "{args:?}");
        insta::assert_snapshot!(name, out);
    }
}

#[test]
fn no_arguments_prints_help_and_exits_2() {
    let (code, _, err) = xtask(&[]);
    assert_eq!(code, 2);
    assert!(err.contains("Usage: cargo xtask <COMMAND>"), "{err}");
    assert!(err.contains("build"), "{err}");
}

#[test]
fn bad_usage_exits_2_and_names_the_problem() {
    let (code, _, err) = xtask(&["build", "--os-source", "floppy"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'floppy' for '--os-source <OS_SOURCE>'"), "{err}");
}

#[test]
fn graph_of_the_repository() {
    let (code, text, _) = xtask(&["graph"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!("graph", text);
    let (code, json, _) = xtask(&["graph", "--json"]);
    assert_eq!(code, 0);
    let parsed: serde_json::Value = serde_json::from_str(&json).expect("graph --json is JSON");
    let names: Vec<&str> =
        parsed["images"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"os"), "roots first: {names:?}");
    for required in ["os", "base", "shell"] {
        assert!(names.contains(&required), "{required} missing from {names:?}");
    }
    let (code, dot, _) = xtask(&["graph", "--dot"]);
    assert_eq!(code, 0);
    assert!(dot.starts_with("digraph images {") && dot.contains("\"base\" -> \"shell\";"), "{dot}");
}

#[test]
fn no_engine_is_a_clear_error_naming_the_socket() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["build", "--progress", "quiet"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .expect("xtask runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("error: no container engine answers at unix:///nonexistent/docker.sock"), "{err}");
    assert!(err.contains("DOCKER_HOST is 'unix:///nonexistent/docker.sock'"), "{err}");
    assert!(err.contains("apt-get install docker.io"), "{err}");
}
