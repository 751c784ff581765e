//! The test world of `agent-sandbox verify`, built by the harness: the same peers and policy on a
//! test network, the sandbox started as every suite starts one (so in the sidecar shape and under
//! gVisor too), and sandbox-verify's checks run in it through this [`Stage`]. The checks are one
//! implementation, the launcher's and the suite's.

use std::net::IpAddr;

use sandbox_verify::{
    ALLOWED, BLOCKED, Closed, DNS_SERVE, DROP_IN, Role, SECRETS_DIR, SITE_SERVE, Stage, ZONE,
};

use crate::docker::{TestNet, copy_in, exec};
use crate::peers::{Peer, PeerSpec};
use crate::probe::PROBE;
use crate::sandbox::Sandbox;
use crate::spec::{SandboxSpec, secret_file};

/// The world and its sandbox, removed when dropped.
pub struct VerifyWorld {
    net: TestNet,
    site: Peer,
    outside: Peer,
    dns: Peer,
    sandbox: Sandbox,
    /// The sandbox's addresses on the network (in sidecar mode, its holder's).
    addrs: (IpAddr, IpAddr),
    /// The image, for its start without NET_ADMIN.
    image: String,
    /// The key the sandbox holds, Anthropic's, and the folder of its secret file.
    key: String,
    _secrets: tempfile::TempDir,
}

impl VerifyWorld {
    /// The world for `image` (one the harness builds): its own policy, the world's names, and
    /// Anthropic's API with a made-up key for the sandbox to hold.
    pub async fn start(test: &str, image: String) -> anyhow::Result<VerifyWorld> {
        let net = TestNet::create(test).await?;
        let site = PeerSpec::named(&[ALLOWED, BLOCKED]).serving(SITE_SERVE).start(&net).await?;
        let outside = PeerSpec::named(&[]).serving(SITE_SERVE).start(&net).await?;
        let dns = PeerSpec::named(&[]).serving(DNS_SERVE).start(&net).await?;
        copy_in(&dns.id, ZONE, sandbox_verify::zone(site.ipv4).as_bytes(), 0o644).await?;
        let secrets = tempfile::tempdir()?;
        let key = sandbox_verify::made_up_key();
        let key_file = secret_file(secrets.path(), "anthropic_api_key", &key)?;
        let sandbox = SandboxSpec::of(image.clone())
            .net_admin()
            .on(&net)
            .dns(&dns)
            .drop_in(DROP_IN, &sandbox_verify::drop_in())
            .drop_in("keys.yaml", "version: 1\ndomains:\n  - api.anthropic.com\n")
            .mount(&key_file, &format!("{SECRETS_DIR}/anthropic_api_key"))
            .start()
            .await?;
        let addrs = sandbox.addresses(&net).await?;
        Ok(VerifyWorld { net, site, outside, dns, sandbox, addrs, image, key, _secrets: secrets })
    }

    fn peer(&self, role: Role) -> &Peer {
        match role {
            Role::Site => &self.site,
            Role::Outside => &self.outside,
            Role::Dns => &self.dns,
            Role::Sandbox | Role::Closed => panic!("{role:?} is not a peer"),
        }
    }
}

impl Stage for VerifyWorld {
    type Error = anyhow::Error;

    fn sandbox_init(&self) -> bool {
        true
    }

    fn probe_path(&self) -> &str {
        PROBE
    }

    fn addr(&self, role: Role) -> IpAddr {
        match role {
            Role::Sandbox => self.addrs.0,
            Role::Closed => panic!("the start without NET_ADMIN has no address the checks use"),
            peer => self.peer(peer).ipv4,
        }
    }

    fn addr6(&self, role: Role) -> Option<IpAddr> {
        match role {
            Role::Sandbox => Some(self.addrs.1),
            Role::Closed => None,
            peer => Some(self.peer(peer).ipv6),
        }
    }

    async fn as_agent(&self, role: Role, cmd: &[&str]) -> anyhow::Result<String> {
        anyhow::ensure!(role == Role::Sandbox, "the harness's start without NET_ADMIN runs to its end");
        let out = self.sandbox.as_agent(cmd).await?;
        Ok(format!("{}{}", out.stdout, out.stderr))
    }

    async fn as_agent_detached(&self, cmd: &[&str]) -> anyhow::Result<()> {
        self.sandbox.exec_detached(&[&["sandbox-exec", "--"], cmd].concat(), None).await
    }

    async fn peer_exec(&self, role: Role, cmd: &[&str]) -> anyhow::Result<String> {
        Ok(match role {
            Role::Sandbox => self.sandbox.exec(cmd).await?.stdout,
            peer => exec(&self.peer(peer).id, cmd, None).await?.stdout,
        })
    }

    fn held_key(&self) -> Result<(String, String), String> {
        Ok(("ANTHROPIC_API_KEY".into(), self.key.clone()))
    }

    /// A peer's file as root; the sandbox's in the container the agent runs in, as that
    /// container's user (a file the agent wrote is the agent's to read).
    async fn read(&self, role: Role, path: &str) -> anyhow::Result<String> {
        let cat = ["sh", "-c", "cat \"$0\" 2>/dev/null || true", path];
        Ok(match role {
            Role::Sandbox => self.sandbox.exec_agent_side(&cat).await?.stdout,
            Role::Closed => anyhow::bail!("the start without NET_ADMIN has no files the checks read"),
            peer => exec(&self.peer(peer).id, &cat, None).await?.stdout,
        })
    }

    async fn closed(&self) -> anyhow::Result<Closed> {
        let exited = SandboxSpec::of(self.image.clone())
            .on(&self.net)
            .dns(&self.dns)
            .drop_in(DROP_IN, &sandbox_verify::drop_in())
            .run_to_exit()
            .await?;
        Ok(Closed::Exited { code: exited.code, log: format!("{}{}", exited.stdout, exited.stderr) })
    }
}
