//! A real registry on loopback for the publish suite: Debian's `docker-registry` with temporary
//! storage, optionally behind htpasswd, stopped and deleted when dropped.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

/// The user and password the htpasswd-protected registry accepts.
pub const USER: &str = "agent";
pub const PASSWORD: &str = "s3cret";
/// `htpasswd -nbB agent s3cret`.
const HTPASSWD: &str = "agent:$2y$05$OvL1vlkdqEpHdxgxJjMOhu6.B2/5JwcrZe1.lcDBH9DpqETnmXrHG\n";

pub struct LocalRegistry {
    pub addr: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl LocalRegistry {
    pub fn start(with_auth: bool) -> anyhow::Result<LocalRegistry> {
        let dir = tempfile::tempdir()?;
        // A free port: bind, read it, release it for the registry.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let auth = if with_auth {
            std::fs::write(dir.path().join("htpasswd"), HTPASSWD)?;
            format!(
                "auth:\n  htpasswd:\n    realm: agent-sandbox-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            )
        } else {
            String::new()
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n{auth}",
            dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("config.yml"), config)?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start docker-registry (Debian: apt-get install docker-registry)")?;
        let registry = LocalRegistry { addr, child, _dir: dir };
        for _ in 0..100 {
            if std::net::TcpStream::connect(&registry.addr).is_ok() {
                return Ok(registry);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        anyhow::bail!("docker-registry did not listen on {}", registry.addr)
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
