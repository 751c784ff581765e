//! The engine connection both the build and the launcher make, its errors, and the pull of an
//! image by the digest images.lock pins.

use std::collections::BTreeMap;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt as _;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "no container engine answers at {endpoint}: {cause}\n\
         DOCKER_HOST is {docker_host}.\n\
         Start the engine (`sudo systemctl start docker`, or `sudo dockerd &`), or install one \
         (Debian: `sudo apt-get install docker.io`; `cargo xtask setup` in a checkout of \
         agent-sandbox does both), or point DOCKER_HOST at a running engine."
    )]
    Unreachable { endpoint: String, docker_host: String, cause: String },
    #[error("the engine refused {what}: {source}")]
    Call {
        what: String,
        #[source]
        source: BollardError,
    },
    #[error("cannot pull '{reference}': {message}")]
    Pull { reference: String, message: String },
    #[error("cannot push '{reference}': {message}")]
    Push { reference: String, message: String, kind: PushFailure },
}

/// Whether a failed push is worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushFailure {
    /// The registry refused the credentials: retrying cannot help.
    Unauthorized,
    /// The registry could not be reached, or answered with a server error.
    Transient,
    Other,
}

impl PushFailure {
    pub fn classify(message: &str) -> PushFailure {
        let m = message.to_ascii_lowercase();
        if ["unauthorized", "authentication required", "denied", "no basic auth credentials"]
            .iter()
            .any(|s| m.contains(s))
        {
            PushFailure::Unauthorized
        } else if [
            "connection refused",
            "connection reset",
            "timeout",
            "eof",
            "no such host",
            "503",
            "502",
            "500",
            "429",
            "too many requests",
        ]
        .iter()
        .any(|s| m.contains(s))
        {
            PushFailure::Transient
        } else {
            PushFailure::Other
        }
    }
}

/// Connects to the engine named by DOCKER_HOST (or the local socket) and checks it answers.
pub async fn connect() -> Result<Docker, EngineError> {
    let docker_host = std::env::var("DOCKER_HOST").ok();
    let endpoint = docker_host.clone().unwrap_or_else(|| "unix:///var/run/docker.sock".to_string());
    connect_to(&endpoint, docker_host).await
}

async fn connect_to(endpoint: &str, docker_host: Option<String>) -> Result<Docker, EngineError> {
    let unreachable = |cause: String| EngineError::Unreachable {
        endpoint: endpoint.to_string(),
        docker_host: docker_host.clone().map_or("not set".into(), |h| format!("'{h}'")),
        cause,
    };
    // A socket this process has asked before: its answer, not a second question; /_ping (which
    // costs the engine nothing) still proves the engine answers, as callers rely on.
    let known = NEGOTIATED.lock().unwrap_or_else(|e| e.into_inner()).get(endpoint).copied();
    if let Some(version) = known.filter(|_| endpoint.starts_with("unix://")) {
        let docker = Docker::connect_with_unix(endpoint, CALL_LIMIT_SECS, &version)
            .map_err(|e| unreachable(e.to_string()))?;
        docker.ping().await.map_err(|e| unreachable(e.to_string()))?;
        return Ok(docker);
    }
    let docker = Docker::connect_with_host(endpoint).map_err(|e| unreachable(e.to_string()))?;
    // The engine may be older than bollard's default API version; speak the engine's. This is
    // also the call that proves the engine answers.
    let docker = docker.negotiate_version().await.map_err(|e| unreachable(e.to_string()))?;
    NEGOTIATED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(endpoint.to_string(), docker.client_version());
    Ok(docker)
}

/// bollard's limit on one call, as `connect_with_defaults` sets it.
const CALL_LIMIT_SECS: u64 = 120;

/// The API version each engine socket answered this process with. Asking costs the engine more
/// than most calls (dockerd runs `runc --version` and `docker-init --version` to answer
/// /version), and a process that connects often (a test connects a dozen times) asked it each
/// time: about 7,400 times, 50 s of the engine's CPU, in one run of the suites. A later
/// connect to the same socket pings it instead.
static NEGOTIATED: std::sync::Mutex<BTreeMap<String, bollard::ClientVersion>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The id of `reference` in the engine, if it has it.
pub async fn image_id(docker: &Docker, reference: &str) -> Result<Option<String>, EngineError> {
    match docker.inspect_image(reference).await {
        Ok(image) => Ok(image.id),
        Err(BollardError::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
        Err(source) => Err(EngineError::Call { what: format!("inspecting '{reference}'"), source }),
    }
}

/// Pulls `reference` unless it is already present; its id.
pub async fn ensure_pulled(docker: &Docker, reference: &str) -> Result<String, EngineError> {
    if let Some(id) = image_id(docker, reference).await? {
        return Ok(id);
    }
    pull(docker, reference, None).await
}

/// Pulls `reference` (for `platform`, `linux/arm64`, where it names an index; else the
/// engine's own) whether or not the engine has it, and returns the id it then names.
pub async fn pull(docker: &Docker, reference: &str, platform: Option<&str>) -> Result<String, EngineError> {
    let mut options = CreateImageOptionsBuilder::default().from_image(reference);
    if let Some(platform) = platform {
        options = options.platform(platform);
    }
    let options = options.build();
    let mut stream = docker.create_image(Some(options), None, None);
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            return Err(EngineError::Pull { reference: reference.into(), message: e.to_string() });
        }
    }
    image_id(docker, reference).await?.ok_or_else(|| EngineError::Pull {
        reference: reference.into(),
        message: "the engine reported success but has no such image".into(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A second connect to the same socket speaks the version the first one negotiated, and asks
    /// no more: a fake engine on a socket counts the /version calls.
    #[tokio::test]
    async fn a_socket_is_asked_its_api_version_once_per_process() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("engine.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let (versions, pings) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let counts = (versions.clone(), pings.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let counts = counts.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    loop {
                        let mut request = String::new();
                        if reader.read_line(&mut request).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut line = String::new();
                        while reader.read_line(&mut line).unwrap_or(0) > 2 {
                            line.clear();
                        }
                        let body = if request.contains("/version") {
                            counts.0.fetch_add(1, Ordering::SeqCst);
                            r#"{"ApiVersion":"1.41","Version":"20.10.24"}"#
                        } else {
                            counts.1.fetch_add(1, Ordering::SeqCst);
                            "OK"
                        };
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if writer.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let endpoint = format!("unix://{}", socket.display());
        for _ in 0..3 {
            let docker = super::connect_to(&endpoint, None).await.unwrap();
            assert_eq!(docker.client_version().to_string(), "1.41");
        }
        assert_eq!(versions.load(Ordering::SeqCst), 1, "asked again");
        assert_eq!(pings.load(Ordering::SeqCst), 2, "a later connect did not prove the engine answers");
        // An engine gone since: a later connect says so, naming the socket.
        drop(dir);
        let Err(gone) = super::connect_to(&endpoint, None).await else { panic!("connected to nothing") };
        assert!(gone.to_string().contains(&endpoint), "{gone}");
    }
}
