//! `agent-sandbox verify IMAGE`: whether a user's own image and policy hold, checked the way the
//! attacks:: suite checks the shipped ones. A test world on a private internal network of the
//! engine, made of containers of the image itself running the static probe (nothing is pulled):
//! a peer under an allowed and a blocked name on one address, a listener under no name, and an
//! upstream DNS server that logs every query. Then the image as a sandbox with NET_ADMIN, its
//! policy plus the allowed name, and each check run as the agent, with a positive control,
//! reading its evidence where it lands (the peer's log, the resolver's log). The world is removed
//! at the end, on Ctrl-C too.

mod pair;
mod target;
mod world;

use std::path::{Path, PathBuf};
use std::time::Instant;

use sandbox_verify::{Outcome, Verdict};
use serde::Serialize;

use crate::engine::Engine;
use crate::exit::{Code, Failure, Result};
use crate::flags::VerifyFlags;
use world::World;

/// The scorecard, as `--json` prints it (docs/verify.schema.json).
#[derive(Debug, Serialize)]
pub struct Card {
    pub image: String,
    /// Whether the image's entrypoint is sandbox-init.
    pub sandbox_init: bool,
    /// The running sandbox checked (`verify S`): its image in a fresh world, with its policy and
    /// shape, and its own agent's processes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// How the sandbox ran: `one container`, `sidecar`, or `sidecar, agent under RUNTIME`.
    pub shape: String,
    pub checks: Vec<Outcome>,
    pub passed: usize,
    pub failed: usize,
    pub not_applicable: usize,
    pub seconds: f64,
}

pub async fn run(flags: &VerifyFlags) -> Result<i32> {
    let probe = probe_path(flags.probe.as_deref())?;
    let policy = match &flags.policy {
        Some(path) => Some(read_policy(path)?),
        None => None,
    };
    let engine = Engine::connect().await?;
    let target = target::Target::resolve(&engine, flags, policy).await?;
    let sandbox_init = target.facts.entrypoint.iter().any(|e| e.contains("sandbox-init"));
    let started = Instant::now();
    if let Some(runtime) = &target.runtime {
        crate::run::check_runtime(runtime, engine.runtime_args(runtime).await?)?;
    }
    if target.sidecar && !sandbox_init {
        return Err(Failure::new(
            Code::BadArgument,
            format!("--sidecar: {} has no sandbox-init to be the gateway", flags.image),
        ));
    }
    let world = World::new(&engine, &target, &probe, sandbox_init);
    eprintln!("verify: building the test world for {} (network {})", flags.image, world.net);
    let checks = tokio::select! {
        result = async {
            world.build(target.policy.as_deref()).await?;
            eprintln!("verify: running the checks as the agent");
            let mut checks = sandbox_verify::run(&world).await?;
            if let Some(running) = &target.running {
                checks.push(target::processes(&engine, running).await?);
            }
            Ok(checks)
        } => result,
        _ = interrupted() => Err(Failure::new(Code::Sandbox, "interrupted: the test world is removed")),
    };
    world.remove().await;
    let checks = checks?;
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    let card = Card {
        image: target.image.clone(),
        sandbox_init,
        sandbox: target.running.as_ref().map(|s| s.name.clone()),
        shape: match (&target.runtime, target.sidecar) {
            (Some(runtime), _) => format!("sidecar, agent under {runtime}"),
            (None, true) => "sidecar".into(),
            (None, false) => "one container".into(),
        },
        passed: count(Verdict::Pass),
        failed: count(Verdict::Fail),
        not_applicable: count(Verdict::NotApplicable),
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        checks,
    };
    if flags.json {
        crate::say::json(&card);
    } else {
        crate::say::out(&render(&card));
    }
    Ok(if card.failed > 0 { Code::Failed as i32 } else { 0 })
}

/// Ctrl-C, or the end of the terminal or of the process asked for (SIGHUP, SIGTERM): any of them
/// ends the run, and the world is removed.
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut hangup), Ok(mut terminate)) = (signal(SignalKind::hangup()), signal(SignalKind::terminate()))
    else {
        return tokio::signal::ctrl_c().await.unwrap_or(());
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = hangup.recv() => {}
        _ = terminate.recv() => {}
    }
}

/// The probe binary: `--probe`, `AGENT_SANDBOX_PROBE`, or `sandbox-probe` beside this program.
fn probe_path(given: Option<&Path>) -> Result<PathBuf> {
    let beside = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("sandbox-probe")));
    let path = given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("AGENT_SANDBOX_PROBE").map(PathBuf::from))
        .or(beside)
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            Failure::new(
                Code::BadArgument,
                "verify needs the static probe binary (tests/probe, `sandbox-probe`): `cargo xtask setup \
                 AGENT` installs it beside agent-sandbox; or give it with --probe FILE or \
                 AGENT_SANDBOX_PROBE (the suites build it as target/agent-sandbox/sandbox-probe)",
            )
        })?;
    std::fs::canonicalize(&path)
        .map_err(|e| Failure::new(Code::BadArgument, format!("{}: {e}", path.display())))
}

fn read_policy(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::new(Code::BadPolicy, format!("{}: {e}", path.display())))?;
    sandbox_policy::Policy::from_yaml(path, &text)
        .map_err(|e| Failure::new(Code::BadPolicy, e.to_string()))?;
    Ok(text)
}

/// The scorecard as text: one line per check, the evidence and, for a FAIL, what it means.
pub fn render(card: &Card) -> String {
    let mut out = format!(
        "agent-sandbox verify {}{} ({}){}\n\n",
        card.sandbox.as_ref().map_or(String::new(), |s| format!("{s}: ")),
        card.image,
        card.shape,
        if card.sandbox_init { "" } else { "; its entrypoint is not sandbox-init" }
    );
    for c in &card.checks {
        out.push_str(&format!("{:<5} {:<24} {}\n", c.verdict.to_string(), c.id, c.check));
        out.push_str(&format!("      {}\n", c.evidence));
        if c.verdict == Verdict::Fail {
            out.push_str(&format!("      means: {}\n", c.meaning));
        }
    }
    out.push_str(&format!(
        "\n{} passed, {} failed, {} not applicable, in {:.1} s\n",
        card.passed, card.failed, card.not_applicable, card.seconds
    ));
    out
}
#[cfg(test)]
mod tests {
    use super::*;

    fn card(verdicts: &[Verdict]) -> Card {
        let checks: Vec<Outcome> = verdicts
            .iter()
            .map(|&verdict| Outcome {
                id: "egress.address",
                check: "an address no allowed name resolves to is refused",
                verdict,
                evidence: "10.0.0.3:80: refused; the listener logged nothing".into(),
                meaning: "the agent connects to any address",
            })
            .collect();
        Card {
            image: "i".into(),
            sandbox_init: true,
            sandbox: None,
            shape: "one container".into(),
            passed: verdicts.iter().filter(|v| **v == Verdict::Pass).count(),
            failed: verdicts.iter().filter(|v| **v == Verdict::Fail).count(),
            not_applicable: verdicts.iter().filter(|v| **v == Verdict::NotApplicable).count(),
            seconds: 1.0,
            checks,
        }
    }

    #[test]
    fn a_fail_says_what_it_means_and_a_pass_does_not() {
        let text = render(&card(&[Verdict::Pass, Verdict::Fail, Verdict::NotApplicable]));
        assert_eq!(text.matches("means: the agent connects to any address").count(), 1, "{text}");
        assert!(text.contains("PASS  egress.address"), "{text}");
        assert!(text.contains("N/A   egress.address"), "{text}");
        assert!(text.ends_with("1 passed, 1 failed, 1 not applicable, in 1.0 s\n"), "{text}");
    }

    #[test]
    fn the_json_names_verdicts_as_the_schema_does() {
        let json =
            serde_json::to_value(card(&[Verdict::Pass, Verdict::Fail, Verdict::NotApplicable])).unwrap();
        let verdicts: Vec<&str> =
            json["checks"].as_array().unwrap().iter().map(|c| c["verdict"].as_str().unwrap()).collect();
        assert_eq!(verdicts, ["PASS", "FAIL", "N/A"]);
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/verify.schema.json")).expect("the schema is JSON");
        let required: Vec<&str> =
            schema["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        for key in &required {
            assert!(json.get(key).is_some(), "{key} is required by the schema");
        }
        let object = json.as_object().unwrap();
        for key in object.keys() {
            assert!(schema["properties"].get(key).is_some(), "{key} is not in the schema");
        }
        let check = &schema["properties"]["checks"]["items"];
        for key in json["checks"][0].as_object().unwrap().keys() {
            assert!(check["properties"].get(key).is_some(), "checks[].{key} is not in the schema");
        }
        let allowed: Vec<&str> = check["properties"]["verdict"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(allowed, ["PASS", "FAIL", "N/A"]);
    }
}
