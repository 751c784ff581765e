//! The checks of `agent-sandbox verify` (sandbox-verify: one implementation, the launcher's and
//! this suite's), run through the harness on the shipped shell image holding a key: every check holds, each
//! with its own positive control, its evidence read where it lands. In the sidecar shape and
//! under gVisor too (`cargo xtask test`'s second and third passes). The checks that fail with a
//! guard removed are `launcher::verify_*`'s.

use sandbox_tests::images::image;
use sandbox_tests::spec::SMALLEST;
use sandbox_tests::verify::VerifyWorld;
use sandbox_verify::{CHECKS, Verdict};

net_admin! {
    [single, sidecar, gvisor] {
        #[tokio::test]
        async fn every_check_of_verify_holds_on_the_shell_image() -> anyhow::Result<()> {
            let world = VerifyWorld::start("verify", image(SMALLEST).await?).await?;
            let card = sandbox_verify::run(&world).await?;
            let ids: Vec<&str> = card.iter().map(|o| o.id).collect();
            assert_eq!(ids, CHECKS, "the scorecard runs every check, in order");
            let lines: Vec<String> =
                card.iter().map(|o| format!("{:<5} {:<22} {}", o.verdict.to_string(), o.id, o.evidence)).collect();
            let wrong: Vec<&String> =
                card.iter().zip(&lines).filter(|(o, _)| o.verdict != Verdict::Pass).map(|(_, line)| line).collect();
            assert!(wrong.is_empty(), "checks that do not hold: {wrong:#?}\nthe whole card: {lines:#?}");
            Ok(())
        }
    }
}
