//! The key check: the API key the sandbox holds is nowhere the agent can read (a file, a
//! process's environment, command line or memory), by a hunt that finds a decoy and, as root,
//! the key's own file.

use std::time::Duration;

use super::{Run, first_line};
use crate::{Outcome, Role, SECRETS_DIR, Stage, Verdict, fields};

impl<S: Stage> Run<'_, S> {
    /// The agent hunts for the key the sandbox holds: every file it can read, every process's
    /// environment, command line and memory file (PID 1's among them). The control: root, where
    /// the keys are, finds the secret file the same way.
    pub(super) async fn held_key(&self) -> Result<Outcome, S::Error> {
        let (id, check) = ("keys.held", "a held API key is invisible to the agent");
        let meaning = "the agent reads the API key and can spend it, or send it anywhere it reaches";
        let (var, key) = match self.stage.held_key() {
            Ok(held) => held,
            Err(why) => {
                return Ok(Outcome { id, check, verdict: Verdict::NotApplicable, evidence: why, meaning });
            }
        };
        let hex = |text: &str| -> String { text.bytes().map(|b| format!("{b:02x}")).collect() };
        // The hunt's own control: a decoy in the environment of a process of the agent's, which
        // the same hunt must find there.
        let decoy = format!("decoy-{:x}", self.nanos);
        let env = format!("AGENT_SANDBOX_VERIFY_DECOY={decoy}");
        self.stage.as_agent_detached(&["env", &env, "sleep", "60"]).await?;
        let mut decoy_found = false;
        for _ in 0..10 {
            let hunt = self.probe(&["find-string", &hex(&decoy), "/proc"]).await?;
            decoy_found = hunt.get("found").is_some_and(|f| f.split(',').any(|p| p.ends_with("/environ")));
            if decoy_found {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let hex = hex(&key);
        let hunt = self.probe(&["find-string", &hex, "/"]).await?;
        let secret = format!("{SECRETS_DIR}/{}", var.to_ascii_lowercase());
        let root = self
            .stage
            .peer_exec(Role::Sandbox, &[self.stage.probe_path(), "find-string", &hex, SECRETS_DIR])
            .await?;
        let control = fields(&root).get("found").is_some_and(|f| f.split(',').any(|p| p == secret));
        let found = hunt.get("found").map_or("(no answer)", String::as_str);
        let read: u64 = hunt.get("read").and_then(|r| r.parse().ok()).unwrap_or(0);
        // The hunt looked: it read a real file system's worth, and found nothing.
        let good = control && decoy_found && found.is_empty() && read >= 100;
        Ok(Outcome {
            id,
            check,
            verdict: if good { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "{var}, held as {secret}: the agent's hunt read {read} files and process memories and found it {}; \
                 the controls: root {}, and the same hunt {} a decoy in an agent process's environment",
                if found.is_empty() { "nowhere".to_string() } else { format!("in {found}") },
                if control {
                    "found the secret file".to_string()
                } else {
                    format!("did not find the secret file ({})", first_line(&root))
                },
                if decoy_found { "found" } else { "did not find" }
            ),
            meaning,
        })
    }
}
