//! Attacks on the forwarded services: the agent asks GitHub's forwarder, which holds the
//! user's token, for a push to a repository the policy does not list as writable, bent every way
//! a path or a request can be bent, and smuggles a second request behind an allowed one.
//! NET_ADMIN, private networks; the evidence is what the forge peer received.

use sandbox_tests::docker::TestNet;
use sandbox_tests::peers::Peer;
use sandbox_tests::spec::{SandboxSpec, ca_secret_file, secret_file};

const TOKEN: &str = "ghp_REAL-token-of-the-services-attacks-2d7f";

net_admin! {
    [single, sidecar] {
        /// The receive-pack of octo/secret (not writable), hidden by `..`, percent-escapes, `//`, case,
        /// a trailing `.git`, a `service=` given twice, or pipelined behind an
        /// allowed request whose framing header the agent named hop-by-hop. None reaches the forge. The
        /// control: the same requests for octo/hello, which the policy lists, do. A method-override
        /// header reaches nobody either: the fetch it dressed arrives as a fetch.
        #[tokio::test]
        async fn a_push_to_an_unlisted_repository_never_reaches_github_however_it_is_asked() -> anyhow::Result<()> {
            let net = TestNet::create("attack-services").await?;
            let forge = Peer::start_forge(&net, &["github.com", "api.github.com", "uploads.github.com"]).await?;
            let dir = tempfile::tempdir()?;
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("forward.yaml", "version: 1\nforward:\n  github:\n    write: [octo/hello]\n")
                .mount(&secret_file(dir.path(), "gh_token", TOKEN)?, "/run/secrets/gh_token")
                .mount(&ca_secret_file(dir.path())?, "/run/secrets/sandbox_api_ca.pem")
                .start()
                .await?;
            let ask = async |request: String| -> anyhow::Result<String> {
                let probe = sb
                    .probe(&["tcp", "127.0.0.1", "15110", "--raw", "--send", &request, "--timeout-ms", "10000"])
                    .await?;
                Ok(probe.fields.get("greeting").and_then(|g| g.split("\\n").next()).unwrap_or_default().to_string())
            };
            let push = |path: &str, extra: &str| {
                format!(
                    "POST {path} HTTP/1.1\\r\\nContent-Type: application/x-git-receive-pack-request\\r\\n{extra}Content-Length: 4\\r\\n\\r\\n0000"
                )
            };
            let discover = |path: &str| format!("GET {path} HTTP/1.1\\r\\n\\r\\n");
            for (repo, allowed) in [("hello", true), ("secret", false)] {
                let attempts = [
                    push(&format!("/octo/{repo}/git-receive-pack"), ""),
                    push(&format!("/OCTO/{}.git/git-receive-pack", repo.to_uppercase()), ""),
                    push(&format!("/octo/hello/../{repo}/git-receive-pack"), ""),
                    push(&format!("/octo/hello/%2e%2e/{repo}/git-receive-pack"), ""),
                    push(&format!("/octo//{repo}/git-receive-pack"), ""),
                    discover(&format!("/octo/{repo}/info/refs?service=git-receive-pack")),
                    discover(&format!("/octo/{repo}/info/refs?service=git-upload-pack&service=git-receive-pack")),
                ];
                for request in attempts {
                    let status = ask(request.clone()).await?;
                    // The bent paths are refused for both: a server could read them otherwise.
                    let bent = request.contains("..")
                        || request.contains("%2e")
                        || request.contains("//")
                        || request.contains("&service");
                    if allowed && !bent {
                        assert!(!status.contains(" 403 ") && !status.contains(" 400 "), "{request}: {status}");
                    } else {
                        assert!(
                            status.starts_with("HTTP/1.1 403") || status.starts_with("HTTP/1.1 400"),
                            "{request}: {status}"
                        );
                    }
                }
            }
            // Smuggled: an allowed fetch whose Content-Length the agent names hop-by-hop, with the push
            // of octo/secret as its "body".
            let hidden = push("/octo/secret/git-receive-pack", "");
            let smuggle = format!(
                "POST /octo/hello/git-upload-pack HTTP/1.1\\r\\nConnection: Content-Length\\r\\nContent-Length: {}\\r\\n\\r\\n{hidden}",
                hidden.replace("\\r\\n", "\r\n").len()
            );
            let status = ask(smuggle).await?;
            assert!(status.starts_with("HTTP/1.1 400"), "{status}");

            // A fetch dressed by a method-override header arrives as the fetch it is, the header gone.
            ask(push("/octo/secret/git-upload-pack", "X-HTTP-Method-Override: PUT\\r\\n")).await?;

            let log = forge.log().await?;
            assert!(
                log.iter().any(|l| l.contains("method=POST path=/octo/secret/git-upload-pack")),
                "the overridden fetch did not arrive as a POST: {log:#?}"
            );
            assert!(!log.iter().any(|l| l.contains("method=PUT")), "{log:#?}");
            let pushes: Vec<&String> = log.iter().filter(|l| l.contains("git-receive-pack")).collect();
            assert!(
                pushes.iter().any(|l| l.contains("path=/octo/hello")),
                "the control never reached the forge: {log:#?}"
            );
            assert!(
                !pushes.iter().any(|l| l.to_ascii_lowercase().contains("secret")),
                "a push to the unlisted repository reached the forge: {pushes:#?}"
            );
            Ok(())
        }
        /// GitHub's download hosts (codeload, raw, objects) took the agent's own TLS directly, and a
        /// front end that routes by Host would carry a push or an API write sent under their names
        /// (the red team's git push printed `[new branch]` that way). Now every host of the bundle is
        /// the forwarder's: the agent's own connection to each, with github.com's Host inside, is
        /// refused on 443 and 80; through each one's forwarder a push and an issue are refused (GET
        /// and HEAD only), and nothing but GETs reaches the forge. The controls: a read through each
        /// forwarder reaches the forge under that host's name, and a release download that github.com
        /// redirects to objects.githubusercontent.com is followed through its forwarder.
        #[tokio::test]
        async fn a_write_fronted_through_a_download_host_reaches_no_front_end() -> anyhow::Result<()> {
            let net = TestNet::create("attack-downloads").await?;
            let github = sandbox_init::policy::forward::builtin("github").expect("github is built in");
            let hosts: Vec<&str> = github.hosts.iter().map(|h| h.host).collect();
            let forge = Peer::start_forge(&net, &hosts).await?;
            let dir = tempfile::tempdir()?;
            let spec = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .mount(&secret_file(dir.path(), "gh_token", TOKEN)?, "/run/secrets/gh_token")
                .mount(&ca_secret_file(dir.path())?, "/run/secrets/sandbox_api_ca.pem");
            let sb = spec.start().await?;
            let ask = async |port: u16, request: &str| -> anyhow::Result<String> {
                let port = port.to_string();
                let args = ["tcp", "127.0.0.1", &port, "--raw", "--send", request, "--timeout-ms", "10000"];
                Ok(sb.probe(&args).await?.fields.get("greeting").cloned().unwrap_or_default())
            };
            let push = "POST /octo/hello/git-receive-pack HTTP/1.1\\r\\nHost: github.com\\r\\nContent-Type: application/x-git-receive-pack-request\\r\\nContent-Length: 4\\r\\n\\r\\n0000";
            let issue = "POST /repos/octo/hello/issues HTTP/1.1\\r\\nHost: api.github.com\\r\\nContent-Type: application/json\\r\\nContent-Length: 2\\r\\n\\r\\n{}";
            let downloads: Vec<_> = github
                .hosts
                .iter()
                .filter(|h| h.host.contains("githubusercontent") || h.host.starts_with("codeload"))
                .collect();
            assert_eq!(downloads.len(), 3, "codeload, raw and objects");
            for host in &downloads {
                for port in ["443", "80"] {
                    let direct =
                        sb.probe(&["tcp", host.host, port, "--host", "github.com", "--timeout-ms", "3000"]).await?;
                    assert_ne!(direct.outcome(), "connected", "{}:{port} took the agent's own connection", host.host);
                }
                for write in [push, issue] {
                    let answer = ask(host.port, write).await?;
                    assert!(answer.starts_with("HTTP/1.1 403"), "{}: {answer}", host.host);
                }
                let read = ask(host.port, "GET /octo/hello/main/README HTTP/1.1\\r\\n\\r\\n").await?;
                assert!(
                    read.starts_with("HTTP/1.1 200") && read.contains("download /octo/hello/main/README"),
                    "{}: {read}",
                    host.host
                );
            }
            let git = github.hosts.iter().find(|h| h.host == "github.com").expect("github.com").port;
            let redirect = ask(git, "GET /octo/hello/releases/download/v1/a.bin HTTP/1.1\\r\\n\\r\\n").await?;
            let objects = downloads.iter().find(|h| h.host == "objects.githubusercontent.com").expect("objects").port;
            let location = format!("Location: http://127.0.0.1:{objects}/release-asset/a.bin?sig=forge");
            assert!(redirect.starts_with("HTTP/1.1 302") && redirect.contains(&location), "{redirect}");
            let asset = ask(objects, "GET /release-asset/a.bin?sig=forge HTTP/1.1\\r\\n\\r\\n").await?;
            assert!(asset.starts_with("HTTP/1.1 200"), "{asset}");

            let log = forge.log().await?;
            let requests: Vec<&String> = log.iter().filter(|l| l.starts_with("forge ")).collect();
            assert!(!requests.iter().any(|l| l.contains("method=POST")), "a write reached the forge: {requests:?}");
            for host in &downloads {
                assert!(
                    requests.iter().any(|l| l.contains(&format!("host={} method=GET", host.host))),
                    "{requests:?}"
                );
            }
            let objects_line =
                requests.iter().find(|l| l.contains("host=objects.githubusercontent.com")).expect("a line");
            assert!(objects_line.contains("auth=-"), "the token went to a signed URL's host: {objects_line}");
            Ok(())
        }
    }
}
