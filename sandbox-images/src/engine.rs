//! The engine connection both the build and the launcher make, its errors, and the pull of an
//! image by the digest images.lock pins.

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
    let unreachable = |cause: String| EngineError::Unreachable {
        endpoint: endpoint.clone(),
        docker_host: docker_host.clone().map_or("not set".into(), |h| format!("'{h}'")),
        cause,
    };
    let docker = Docker::connect_with_defaults().map_err(|e| unreachable(e.to_string()))?;
    // The engine may be older than bollard's default API version; speak the engine's. This is
    // also the call that proves the engine answers.
    docker.negotiate_version().await.map_err(|e| unreachable(e.to_string()))
}

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
