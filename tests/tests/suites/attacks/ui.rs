//! The launcher's web page (`agent-sandbox ui`) can widen an agent's allowlist: it must not be
//! the agent's way out. It listens on the host's loopback, which is not any container's. These
//! need no capability: run in both modes.

use sandbox_tests::docker::{TestNet, docker};
use sandbox_tests::launcher::Launcher;
use sandbox_tests::peers::Peer;

/// The host's address on `net` (its bridge's gateway), where a container reaches the host.
async fn host_address(net: &TestNet) -> anyhow::Result<String> {
    let inspected = docker()
        .await?
        .inspect_network(&net.name, None::<bollard::query_parameters::InspectNetworkOptions>)
        .await?;
    let configs = inspected.ipam.and_then(|ipam| ipam.config).unwrap_or_default();
    configs
        .into_iter()
        .filter_map(|c| c.gateway)
        .find(|g| g.parse::<std::net::Ipv4Addr>().is_ok())
        .ok_or_else(|| anyhow::anyhow!("{} has no IPv4 gateway", net.name))
}

/// A container with no firewall at all (the worst an agent can have) tries the page's port at
/// the host's address on its network and at its own loopback: refused both ways. The control:
/// a listener of the host's on every address, on the same path, is reached, and the page
/// answers the host itself.
#[tokio::test]
async fn the_launchers_page_is_not_reachable_from_a_container() -> anyhow::Result<()> {
    let net = TestNet::create("ui-reach").await?;
    let peer = Peer::start(&net, &[]).await?;
    let ui = Launcher::new()?.ui().await?;
    let host = host_address(&net).await?;

    let (status, _) = ui.api("GET", "/api/sandboxes", None).await?;
    assert_eq!(status, 200, "the page answers the host");
    let open = std::net::TcpListener::bind("0.0.0.0:0")?;
    let open_port = open.local_addr()?.port().to_string();
    let reached = peer.probe(&["tcp", &host, &open_port, "--timeout-ms", "3000"]).await?;
    assert_eq!(
        reached.outcome(),
        "connected",
        "the control: the host's listener on every address {:?}",
        reached.fields
    );

    let port = ui.port.to_string();
    for address in [host.as_str(), "127.0.0.1"] {
        let tried = peer.probe(&["tcp", address, &port, "--timeout-ms", "3000"]).await?;
        assert_ne!(
            tried.outcome(),
            "connected",
            "the page at {address}:{port} from a container: {:?}",
            tried.fields
        );
    }
    Ok(())
}
