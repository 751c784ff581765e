//! `run --model-server URL --model NAME`: the agent's CLI on a model server of the user's (Ollama
//! on this host, an OpenAI-compatible server on the network) instead of its cloud API. The
//! sandbox's forwarder alone reaches the server's one address and port, and sends it only the
//! model's endpoints (`sandbox_policy::model::ENDPOINTS`: no pull or push of an Ollama's, nothing
//! else of the user's network); the agent's container gets the URL and the name (sandbox-init
//! turns them into the variables the image declares, pointed at the forwarder), the container
//! whose PID 1 holds the firewall the address too; and no model API key is handed over.
//!
//! A server on this host's loopback (`localhost`, `127.0.0.1`) is reached through the engine's
//! host gateway (`host-gateway`, the default bridge's address); a name is resolved here, once,
//! and pinned in the sandbox's /etc/hosts. Only this host and the user's network (private
//! addresses) are reached; a name that answers with this host's loopback is refused (its owner
//! chose the answer).

use std::net::IpAddr;

use sandbox_policy::address::{Scope, scope};
use sandbox_policy::model::{self, Host, ServerUrl};

use crate::engine::{Engine, ImageFacts};
use crate::exit::{Code, Failure, Result};

/// The name a server on the host's loopback has inside the sandbox (Docker's, and Docker
/// Desktop's own).
const HOST_NAME: &str = "host.docker.internal";

/// What the sandbox needs for the server.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// `SANDBOX_MODEL_SERVER=…`, `SANDBOX_MODEL=…` and `SANDBOX_MODEL_SERVER_ADDRESS=…`, for the
    /// agent's container and the gateway.
    pub env: Vec<String>,
    /// `NAME:ADDRESS` lines for the sandbox's /etc/hosts (the network namespace's owner).
    pub extra_hosts: Vec<String>,
    /// The address the forwarder reaches, for the launcher's line.
    pub address: IpAddr,
    /// The port opened.
    pub port: u16,
    /// The URL as the agent uses it.
    pub url: String,
}

fn bad(message: String) -> Failure {
    Failure::new(Code::BadArgument, message)
}

/// The plan for `url` and `model`, for the image `facts` of `agent`.
pub async fn plan(engine: &Engine, agent: &str, facts: &ImageFacts, url: &str, model: &str) -> Result<Plan> {
    let parsed = ServerUrl::parse(url).map_err(|e| bad(format!("--model-server {e}")))?;
    model::check_model(model).map_err(|e| bad(format!("--model: {e}")))?;
    if facts.env_var(model::VARS_ENV).is_none_or(|v| v.trim().is_empty()) {
        return Err(bad(format!(
            "--model-server: {agent}'s CLI cannot use a model server of yours (its image declares no {}); \
             docs/agents.md lists the agents that can",
            model::VARS_ENV
        )));
    }
    let address = match &parsed.host {
        Host::Address(address) => *address,
        Host::Name(name) if is_localhost(name) => IpAddr::from([127, 0, 0, 1]),
        Host::Name(name) => {
            let address = resolve(name, parsed.port).await?;
            // A name of the network's that answers with this host: the answer is its owner's to
            // give (a copied URL's), and it would open this host's port through the gateway.
            if address.is_loopback() || address.is_unspecified() {
                return Err(bad(format!(
                    "--model-server {url}: {name} resolves to {address}, this host: for a server on \
                     this host, give http://localhost:{}",
                    parsed.port
                )));
            }
            address
        }
    };
    let on_host = address.is_loopback() || address.is_unspecified();
    let gateway = if on_host { Some(host_gateway(engine).await?) } else { None };
    plan_for(&parsed, model, address, gateway)
}

/// The plan once the server's address (and, for one on the host's loopback, the host gateway's)
/// is known: pure.
fn plan_for(url: &ServerUrl, model: &str, address: IpAddr, gateway: Option<IpAddr>) -> Result<Plan> {
    if url.port == 53 {
        return Err(bad(format!(
            "--model-server {url}: port 53 is DNS's, which the sandbox's DNS gate alone answers"
        )));
    }
    let (inside, opened, extra_hosts) = match (gateway, &url.host) {
        (Some(gateway), Host::Name(name)) if !is_localhost(name) => {
            (url.clone(), gateway, vec![format!("{name}:host-gateway")])
        }
        (Some(gateway), _) => {
            (url.with_host(Host::Name(HOST_NAME.into())), gateway, vec![format!("{HOST_NAME}:host-gateway")])
        }
        (None, host) => {
            let pinned = match host {
                Host::Name(name) => vec![format!("{name}:{address}")],
                Host::Address(_) => Vec::new(),
            };
            (url.clone(), address, pinned)
        }
    };
    match scope(opened) {
        Scope::Private => {}
        // The address is opened whole on its port, with no name checked: on the internet that
        // is every site a CDN fronts there, so a server out there goes by its name instead.
        Scope::Public => {
            return Err(bad(format!(
                "--model-server {url}: {opened} is a public address, which this opens with no name \
                 checked (every site behind it on that port); a server on the internet is reached by \
                 its name: `--allow NAME:PORT --env OPENAI_BASE_URL=…` (docs/agents.md)"
            )));
        }
        other => {
            return Err(bad(format!(
                "--model-server {url}: {opened} is {}, which no sandbox opens",
                other.describe()
            )));
        }
    }
    Ok(Plan {
        env: vec![
            format!("{}={inside}", model::SERVER_ENV),
            format!("{}={model}", model::MODEL_ENV),
            format!("{}={opened}", model::ADDRESS_ENV),
        ],
        extra_hosts,
        address: opened,
        port: url.port,
        url: inside.to_string(),
    })
}

fn is_localhost(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

/// `name`'s address, as this host resolves it: an IPv4 one first.
async fn resolve(name: &str, port: u16) -> Result<IpAddr> {
    let addresses: Vec<IpAddr> = tokio::net::lookup_host((name, port))
        .await
        .map_err(|e| bad(format!("--model-server: cannot resolve {name}: {e}")))?
        .map(|a| a.ip())
        .collect();
    addresses
        .iter()
        .find(|a| a.is_ipv4())
        .or(addresses.first())
        .copied()
        .ok_or_else(|| bad(format!("--model-server: {name} has no address")))
}

/// The address `host-gateway` stands for: the default bridge's gateway (dockerd's default for
/// `--host-gateway-ip`), which is this host.
async fn host_gateway(engine: &Engine) -> Result<IpAddr> {
    let bridge = engine
        .docker()
        .inspect_network("bridge", None::<bollard::query_parameters::InspectNetworkOptions>)
        .await
        .map_err(|e| {
            Failure::new(Code::Engine, format!("--model-server: cannot read the default bridge: {e}"))
        })?;
    bridge
        .ipam
        .and_then(|ipam| ipam.config)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|config| config.gateway?.parse::<IpAddr>().ok())
        .find(IpAddr::is_ipv4)
        .ok_or_else(|| {
            Failure::new(
                Code::Engine,
                "--model-server: the engine's default bridge has no gateway address, through which the \
                 sandbox would reach this host: give the server's address on your network instead"
                    .to_string(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(url: &str, address: &str, gateway: Option<&str>) -> Result<Plan> {
        let url = ServerUrl::parse(url).unwrap();
        plan_for(&url, "qwen2.5-coder:7b", address.parse().unwrap(), gateway.map(|g| g.parse().unwrap()))
    }

    #[test]
    fn a_server_on_the_hosts_loopback_is_reached_through_the_host_gateway() {
        let plan = planned("http://localhost:11434", "127.0.0.1", Some("172.17.0.1")).unwrap();
        assert_eq!(plan.url, "http://host.docker.internal:11434");
        assert_eq!(plan.extra_hosts, ["host.docker.internal:host-gateway"]);
        assert_eq!(
            plan.env,
            [
                "SANDBOX_MODEL_SERVER=http://host.docker.internal:11434",
                "SANDBOX_MODEL=qwen2.5-coder:7b",
                "SANDBOX_MODEL_SERVER_ADDRESS=172.17.0.1"
            ]
        );
        // A name of the host's keeps its name (a certificate names it), pinned to the gateway.
        let plan = planned("https://models.home:8443/v1", "127.0.1.1", Some("172.17.0.1")).unwrap();
        assert_eq!(plan.url, "https://models.home:8443/v1");
        assert_eq!(plan.extra_hosts, ["models.home:host-gateway"]);
    }

    #[test]
    fn a_server_on_the_network_is_its_address_alone_and_a_name_is_pinned() {
        let plan = planned("http://gpu.lan:8000", "192.168.1.20", None).unwrap();
        assert_eq!(
            (plan.url.as_str(), plan.address),
            ("http://gpu.lan:8000", "192.168.1.20".parse().unwrap())
        );
        assert_eq!(plan.extra_hosts, ["gpu.lan:192.168.1.20"]);
        assert!(
            plan.env.contains(&"SANDBOX_MODEL_SERVER_ADDRESS=192.168.1.20".to_string()),
            "{:?}",
            plan.env
        );
        let plan = planned("http://[fd00::7]:11434", "fd00::7", None).unwrap();
        assert!(plan.extra_hosts.is_empty());
        assert!(plan.env.contains(&"SANDBOX_MODEL_SERVER_ADDRESS=fd00::7".to_string()), "{:?}", plan.env);
    }

    #[test]
    fn a_metadata_service_or_a_link_local_address_is_never_opened() {
        for (url, address) in [
            ("http://169.254.169.254", "169.254.169.254"),
            ("http://metadata.google.internal", "169.254.169.254"),
            ("http://100.100.100.200:80", "100.100.100.200"),
            ("http://169.254.1.1:11434", "169.254.1.1"),
            ("http://224.0.0.1:11434", "224.0.0.1"),
            ("http://[fd00:ec2::23]", "fd00:ec2::23"),
        ] {
            let refused = planned(url, address, None).unwrap_err();
            assert_eq!(refused.code, Code::BadArgument, "{url}");
            assert!(refused.message.contains("which no sandbox opens"), "{url}: {}", refused.message);
        }
    }

    #[test]
    fn a_public_address_and_dns_s_port_are_refused() {
        // Only the user's network and this host.
        let refused = planned("https://llm.example.com", "104.16.1.1", None).unwrap_err();
        assert_eq!(refused.code, Code::BadArgument);
        assert!(
            refused.message.contains("public address") && refused.message.contains("--allow"),
            "{}",
            refused.message
        );
        let refused = planned("http://[2606:4700::1]:11434", "2606:4700::1", None).unwrap_err();
        assert!(refused.message.contains("public address"), "{}", refused.message);
        // Around the DNS gate, through the user's resolver.
        let refused = planned("http://192.168.1.1:53", "192.168.1.1", None).unwrap_err();
        assert!(refused.message.contains("port 53"), "{}", refused.message);
        // The control: the same server on another port of the network.
        planned("http://192.168.1.1:8080", "192.168.1.1", None).unwrap();
    }
}
