//! The world of peers the tests of one run share, for those that only reach or are refused and
//! read nothing of the peers: an internal network (a test network's ranges: the peers play
//! public services), a peer under `api.allowed.test`, `a.wild.test` and `wild.test`, and one
//! under `blocked.test`. The first test of a nextest run that asks makes it, under names of the
//! run's; the others, in processes of their own, find it by those names. `cargo xtask test`
//! removes it after the run, and before the next if the run was interrupted (Ctrl-C leaves it
//! behind until then); a run beside it on the same engine has its own and leaves this one alone. Outside it (a plain `cargo nextest run`) each test gets a world of its own.

use std::time::Duration;

use crate::docker::{TestNet, docker};
use crate::peers::{Peer, PeerSpec};

/// The allowed peer's names, and the blocked one's.
pub const ALLOWED: &[&str] = &["api.allowed.test", "a.wild.test", "wild.test"];
pub const BLOCKED: &[&str] = &["blocked.test"];

pub struct World {
    pub net: TestNet,
    pub allowed: Peer,
    pub blocked: Peer,
}

impl World {
    /// The run's world, or one of the test's own where none is shared.
    pub async fn shared() -> anyhow::Result<World> {
        let Some(run) = crate::spec::shared_run() else { return World::own().await };
        let name = format!("agent-sandbox-shared-world-{run}");
        let labels = [(crate::spec::SHARED_LABEL, run.as_str())];
        let peers = [(format!("{name}-allowed"), ALLOWED), (format!("{name}-blocked"), BLOCKED)];
        // The engine lets two networks share a name, not two containers: a container created,
        // never started, is the lock that says which test makes the world.
        if claim(&format!("{name}-claim"), &labels).await? {
            let net = TestNet::create_kept(&name, &labels).await?;
            let mut started = Vec::new();
            for (container, aliases) in &peers {
                started.push(PeerSpec::named(aliases).kept(container, &labels).start(&net).await?);
            }
            let blocked = started.pop().expect("two peers");
            let allowed = started.pop().expect("two peers");
            return Ok(World { net, allowed, blocked });
        }
        let net = TestNet::kept(&name);
        let allowed = World::wait_for(&peers[0].0, &net).await?;
        let blocked = World::wait_for(&peers[1].0, &net).await?;
        Ok(World { net, allowed, blocked })
    }

    async fn own() -> anyhow::Result<World> {
        let net = TestNet::create("world").await?;
        let allowed = Peer::start(&net, ALLOWED).await?;
        let blocked = Peer::start(&net, BLOCKED).await?;
        Ok(World { net, allowed, blocked })
    }

    /// A peer another test of the run is starting, once it is ready.
    async fn wait_for(container: &str, net: &TestNet) -> anyhow::Result<Peer> {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            if docker().await?.inspect_container(container, None).await.is_ok()
                && crate::docker::wait_for_log(container, "peer ready", 1).await.is_ok()
            {
                return Peer::of_container(container, net).await;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the run's world has no {container} after 90 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Claims `name` for this test process among the run's: creates a container of that name (never
/// started, carrying `labels`: the run's end removes it) and says whether it was this call that
/// made it; false where another process had.
async fn claim(name: &str, labels: &[(&str, &str)]) -> anyhow::Result<bool> {
    let body = bollard::models::ContainerCreateBody {
        image: Some(crate::images::peer_image().await?),
        labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    };
    let options = bollard::query_parameters::CreateContainerOptionsBuilder::default().name(name).build();
    match docker().await?.create_container(Some(options), body).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
