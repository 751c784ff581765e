//! Registries: where images are published, the credentials to use, and manifests read back over
//! the distribution API, so the lock records the digest the registry serves.

use std::io::Read as _;

use base64::Engine as _;

use crate::platform::Platform;
use sha2::{Digest as _, Sha256};

/// `HOST/NAMESPACE`, as `--registry` takes it (e.g. `ghcr.io/agent-sandbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    pub host: String,
    pub namespace: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("`{0}` is not HOST/NAMESPACE (for example ghcr.io/agent-sandbox or 127.0.0.1:5000/test)")]
    BadName(String),
    #[error("cannot reach the registry {registry}: {message}")]
    Unreachable { registry: String, message: String },
    #[error(
        "the registry {registry} refused the credentials{hint} (set AGENT_SANDBOX_REGISTRY_USER and \
         AGENT_SANDBOX_REGISTRY_PASSWORD, GITHUB_TOKEN for ghcr.io, or `docker login {registry}`)"
    )]
    Unauthorized { registry: String, hint: String },
    #[error("the registry {registry} answered {status} for {url}: {body}")]
    Status { registry: String, status: u16, url: String, body: String },
    #[error("the registry {registry} served a manifest that does not match: {message}")]
    Mismatch { registry: String, message: String },
}

impl Registry {
    pub fn parse(text: &str) -> Result<Registry, RegistryError> {
        let bad = || RegistryError::BadName(text.to_string());
        let (host, namespace) = text.trim_end_matches('/').split_once('/').ok_or_else(bad)?;
        let host_like = host.contains('.') || host.contains(':') || host == "localhost";
        let valid_ns = !namespace.is_empty()
            && namespace.split('/').all(|part| {
                !part.is_empty()
                    && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            });
        if !host_like || !valid_ns {
            return Err(bad());
        }
        Ok(Registry { host: host.to_string(), namespace: namespace.to_string() })
    }

    /// `HOST/NAMESPACE/agent-<image>`.
    pub fn repository(&self, image: &str) -> String {
        format!("{}/{}", self.host, self.path(image))
    }

    fn path(&self, image: &str) -> String {
        format!("{}/{}{image}", self.namespace, crate::project::LOCAL_PREFIX)
    }

    fn manifest_url(&self, image: &str, reference: &str) -> String {
        format!("{}://{}/v2/{}/manifests/{reference}", self.scheme(), self.host, self.path(image))
    }

    /// Loopback registries speak plain HTTP (Docker allows that for 127.0.0.0/8 only).
    fn scheme(&self) -> &'static str {
        let name = self.host.rsplit_once(':').map_or(self.host.as_str(), |(h, _)| h);
        if name == "localhost" || name.starts_with("127.") || name == "[::1]" { "http" } else { "https" }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, ***)", self.username)
    }
}

pub const USER_ENV: &str = "AGENT_SANDBOX_REGISTRY_USER";
pub const PASSWORD_ENV: &str = "AGENT_SANDBOX_REGISTRY_PASSWORD";

/// Credentials for `host`, from (in order) AGENT_SANDBOX_REGISTRY_USER/_PASSWORD, GITHUB_TOKEN
/// for ghcr.io, or the docker config's `auths`. None: anonymous.
pub fn credentials(host: &str) -> Option<Credentials> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let (Some(username), Some(password)) = (var(USER_ENV), var(PASSWORD_ENV)) {
        return Some(Credentials { username, password });
    }
    if host == "ghcr.io"
        && let Some(password) = var("GITHUB_TOKEN")
    {
        let username = var("GITHUB_ACTOR").unwrap_or_else(|| "x-access-token".into());
        return Some(Credentials { username, password });
    }
    let dir = var("DOCKER_CONFIG")
        .map(std::path::PathBuf::from)
        .or_else(|| var("HOME").map(|home| std::path::Path::new(&home).join(".docker")))?;
    let config = std::fs::read_to_string(dir.join("config.json")).ok()?;
    docker_config_credentials(&config, host)
}

fn docker_config_credentials(config: &str, host: &str) -> Option<Credentials> {
    let config: serde_json::Value = serde_json::from_str(config).ok()?;
    let auth = config["auths"][host]["auth"].as_str()?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(auth).ok()?;
    let (username, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(Credentials { username: username.into(), password: password.into() })
}

/// A `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut fields = std::collections::HashMap::new();
    // key="value" pairs; values may contain commas (scopes do), so split on `",`.
    for part in params.split("\",") {
        if let Some((key, value)) = part.split_once('=') {
            fields.insert(key.trim().to_ascii_lowercase(), value.trim().trim_matches('"').to_string());
        }
    }
    Some(Challenge::Bearer {
        realm: fields.remove("realm")?,
        service: fields.remove("service"),
        scope: fields.remove("scope"),
    })
}

const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// What an index is served as: OCI's image index (what `publish` puts) or Docker's list.
const INDEX_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";

/// The manifest the registry serves for `image:tag`: its digest (sha256 of the bytes served)
/// and the bytes.
pub fn manifest(
    registry: &Registry,
    image: &str,
    tag: &str,
    credentials: Option<&Credentials>,
) -> Result<(String, Vec<u8>), RegistryError> {
    read(registry, image, tag, MANIFEST_TYPES, credentials)
}

/// The image index the registry serves for `image:reference` (a tag or a digest): its digest
/// and bytes.
pub fn index(
    registry: &Registry,
    image: &str,
    reference: &str,
    credentials: Option<&Credentials>,
) -> Result<(String, Vec<u8>), RegistryError> {
    read(registry, image, reference, INDEX_TYPES, credentials)
}

fn read(
    registry: &Registry,
    image: &str,
    reference: &str,
    accept: &str,
    credentials: Option<&Credentials>,
) -> Result<(String, Vec<u8>), RegistryError> {
    let url = registry.manifest_url(image, reference);
    let answer = send(registry, "GET", &url, ("Accept", accept), Vec::new(), credentials)?;
    if answer.status != 200 {
        return Err(answer.status_error(registry, url));
    }
    let digest = format!("sha256:{:x}", Sha256::digest(&answer.body));
    if let Some(served) = answer.digest.filter(|d| *d != digest) {
        return Err(RegistryError::Mismatch {
            registry: registry.host.clone(),
            message: format!("Docker-Content-Digest says {served}, the bytes hash to {digest}"),
        });
    }
    Ok((digest, answer.body))
}

/// Puts `bytes` (of `media_type`) as the manifest `image:tag`; returns the digest the registry
/// says it stored, which must be the bytes' own.
pub fn put_manifest(
    registry: &Registry,
    image: &str,
    tag: &str,
    media_type: &str,
    bytes: &[u8],
    credentials: Option<&Credentials>,
) -> Result<String, RegistryError> {
    let url = registry.manifest_url(image, tag);
    let answer = send(registry, "PUT", &url, ("Content-Type", media_type), bytes.to_vec(), credentials)?;
    if answer.status != 201 {
        return Err(answer.status_error(registry, url));
    }
    let digest = format!("sha256:{:x}", Sha256::digest(bytes));
    match answer.digest {
        Some(stored) if stored != digest => Err(RegistryError::Mismatch {
            registry: registry.host.clone(),
            message: format!("it stored {stored} for a manifest whose bytes hash to {digest}"),
        }),
        _ => Ok(digest),
    }
}

/// A registry's answer: its status, its Docker-Content-Digest, its body.
struct Answer {
    status: u16,
    digest: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn status_error(&self, registry: &Registry, url: String) -> RegistryError {
        let body = String::from_utf8_lossy(&self.body).chars().take(300).collect();
        RegistryError::Status { registry: registry.host.clone(), status: self.status, url, body }
    }
}

/// One request to the distribution API, answering the registry's challenge (Basic, or a Bearer
/// token from its realm for the scope it names) once when it asks for one.
fn send(
    registry: &Registry,
    method: &str,
    url: &str,
    (header, value): (&str, &str),
    body: Vec<u8>,
    credentials: Option<&Credentials>,
) -> Result<Answer, RegistryError> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .build()
        .into();
    let unreachable = |e: ureq::Error| RegistryError::Unreachable {
        registry: registry.host.clone(),
        message: e.to_string(),
    };
    let call = |authorization: Option<&str>| {
        let mut request = ureq::http::Request::builder().method(method).uri(url).header(header, value);
        if let Some(authorization) = authorization {
            request = request.header("Authorization", authorization);
        }
        let request = request.body(body.clone()).map_err(|e| RegistryError::Unreachable {
            registry: registry.host.clone(),
            message: e.to_string(),
        })?;
        agent.run(request).map_err(unreachable)
    };
    let mut response = call(None)?;
    if response.status() == 401 {
        let challenge = response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let basic = credentials.map(|c| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password))
            )
        });
        let authorization = match challenge {
            Some(Challenge::Basic) => basic,
            Some(Challenge::Bearer { realm, service, scope }) => {
                let mut token_request = agent.get(&realm);
                if let Some(service) = &service {
                    token_request = token_request.query("service", service);
                }
                if let Some(scope) = &scope {
                    token_request = token_request.query("scope", scope);
                }
                if let Some(basic) = &basic {
                    token_request = token_request.header("Authorization", basic);
                }
                let mut answer = token_request.call().map_err(unreachable)?;
                if answer.status() != 200 {
                    return Err(unauthorized(registry, credentials));
                }
                let text = answer.body_mut().read_to_string().map_err(unreachable)?;
                let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let token = body["token"].as_str().or(body["access_token"].as_str()).unwrap_or_default();
                Some(format!("Bearer {token}"))
            }
            None => None,
        };
        let Some(authorization) = authorization else { return Err(unauthorized(registry, credentials)) };
        response = call(Some(&authorization))?;
        if response.status() == 401 || response.status() == 403 {
            return Err(unauthorized(registry, credentials));
        }
    }
    let status = response.status().as_u16();
    let digest =
        response.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).map(str::to_string);
    let mut bytes = Vec::new();
    response.body_mut().as_reader().read_to_end(&mut bytes).map_err(|e| RegistryError::Unreachable {
        registry: registry.host.clone(),
        message: e.to_string(),
    })?;
    Ok(Answer { status, digest, body: bytes })
}

fn unauthorized(registry: &Registry, credentials: Option<&Credentials>) -> RegistryError {
    let hint = match credentials {
        Some(c) => format!(" of user `{}`", c.username),
        None => ": none were given".to_string(),
    };
    RegistryError::Unauthorized { registry: registry.host.clone(), hint }
}

/// Checks that a manifest refers to the image pushed: its config digest is the image id.
pub fn check_manifest(registry: &Registry, bytes: &[u8], image_id: &str) -> Result<(), RegistryError> {
    let manifest =
        oci_spec::image::ImageManifest::from_reader(bytes).map_err(|e| RegistryError::Mismatch {
            registry: registry.host.clone(),
            message: format!("not an image manifest: {e}"),
        })?;
    let config = manifest.config().digest().to_string();
    if config != image_id {
        return Err(RegistryError::Mismatch {
            registry: registry.host.clone(),
            message: format!("its config is {config}, the image pushed is {image_id}"),
        });
    }
    Ok(())
}

/// One platform's manifest as the registry serves it, for the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformManifest {
    pub platform: Platform,
    pub digest: String,
    pub media_type: String,
    pub size: u64,
}

impl PlatformManifest {
    /// The manifest served as `bytes` with `digest`, for `platform`: its media type is its own
    /// `mediaType` (the engine pushes Docker's), else OCI's.
    pub fn of(platform: Platform, digest: &str, bytes: &[u8]) -> PlatformManifest {
        let media_type = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| v["mediaType"].as_str().map(str::to_string))
            .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".to_string());
        PlatformManifest { platform, digest: digest.to_string(), media_type, size: bytes.len() as u64 }
    }
}

/// The OCI image index of `manifests`, one per platform, as the bytes to put.
pub fn image_index(manifests: &[PlatformManifest]) -> anyhow::Result<Vec<u8>> {
    use oci_spec::image::{DescriptorBuilder, ImageIndexBuilder, MediaType, PlatformBuilder};
    let descriptors = manifests
        .iter()
        .map(|m| {
            let mut platform =
                PlatformBuilder::default().architecture(arch(m.platform)).os(oci_spec::image::Os::Linux);
            if let Some(variant) = m.platform.variant() {
                platform = platform.variant(variant);
            }
            Ok(DescriptorBuilder::default()
                .media_type(MediaType::from(m.media_type.as_str()))
                .digest(m.digest.parse::<oci_spec::image::Digest>()?)
                .size(m.size)
                .platform(platform.build()?)
                .build()?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(descriptors)
        .build()?;
    Ok(serde_json::to_vec(&index)?)
}

fn arch(platform: Platform) -> oci_spec::image::Arch {
    match platform {
        Platform::Amd64 => oci_spec::image::Arch::Amd64,
        Platform::Arm64 => oci_spec::image::Arch::ARM64,
    }
}

/// Checks an index the registry served: exactly `manifests`, each under its platform.
pub fn check_index(
    registry: &Registry,
    bytes: &[u8],
    manifests: &[PlatformManifest],
) -> Result<(), RegistryError> {
    let mismatch = |message: String| RegistryError::Mismatch { registry: registry.host.clone(), message };
    let index = oci_spec::image::ImageIndex::from_reader(bytes)
        .map_err(|e| mismatch(format!("not an image index: {e}")))?;
    let served: Vec<(String, String, Option<String>)> = index
        .manifests()
        .iter()
        .map(|d| {
            let platform = d.platform().as_ref();
            (
                d.digest().to_string(),
                platform.map(|p| p.architecture().to_string()).unwrap_or_default(),
                platform.and_then(|p| p.variant().clone()),
            )
        })
        .collect();
    let pushed: Vec<(String, String, Option<String>)> = manifests
        .iter()
        .map(|m| (m.digest.clone(), arch(m.platform).to_string(), m.platform.variant().map(str::to_string)))
        .collect();
    if served != pushed {
        return Err(mismatch(format!("it lists {served:?}, the manifests pushed are {pushed:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_lists_each_platforms_manifest_and_is_checked_against_them() {
        let manifest =
            br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json"}"#;
        let manifests = [
            PlatformManifest::of(Platform::Amd64, &format!("sha256:{}", "a".repeat(64)), manifest),
            PlatformManifest::of(Platform::Arm64, &format!("sha256:{}", "b".repeat(64)), b"{}"),
        ];
        assert_eq!(manifests[0].media_type, "application/vnd.docker.distribution.manifest.v2+json");
        assert_eq!(
            manifests[1].media_type, "application/vnd.oci.image.manifest.v1+json",
            "OCI's where unsaid"
        );
        let bytes = image_index(&manifests).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["mediaType"], "application/vnd.oci.image.index.v1+json", "{json}");
        assert_eq!(json["manifests"][1]["platform"]["architecture"], "arm64", "{json}");
        assert_eq!(json["manifests"][1]["platform"]["variant"], "v8", "{json}");
        assert_eq!(json["manifests"][0]["size"], manifest.len(), "{json}");
        assert_eq!(image_index(&manifests).unwrap(), bytes, "the same bytes each time: the same digest");

        let registry = Registry::parse("127.0.0.1:5000/test").unwrap();
        check_index(&registry, &bytes, &manifests).unwrap();
        let swapped = [manifests[1].clone(), manifests[0].clone()];
        assert!(check_index(&registry, &bytes, &swapped).is_err(), "another order is another index");
        let other = [manifests[0].clone()];
        assert!(check_index(&registry, &bytes, &other).is_err(), "a manifest more than pushed");
        assert!(check_index(&registry, manifest, &manifests).is_err(), "a manifest is no index");
    }

    #[test]
    fn registry_names_are_host_and_namespace() {
        let r = Registry::parse("ghcr.io/agent-sandbox").unwrap();
        assert_eq!(r.repository("shell"), "ghcr.io/agent-sandbox/agent-shell");
        assert_eq!(r.scheme(), "https");
        let local = Registry::parse("127.0.0.1:5000/test/nested").unwrap();
        assert_eq!(local.repository("os"), "127.0.0.1:5000/test/nested/agent-os");
        assert_eq!(local.scheme(), "http");
        for bad in ["ghcr.io", "agent-sandbox/shell", "ghcr.io/Upper", "ghcr.io//x", ""] {
            assert!(Registry::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn challenges_are_parsed() {
        assert_eq!(parse_challenge("Basic realm=\"Registry\""), Some(Challenge::Basic));
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://ghcr.io/token".into(),
                service: Some("ghcr.io".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(parse_challenge("Negotiate"), None);
    }

    #[test]
    fn docker_config_auths_are_decoded() {
        let config = r#"{"auths": {"ghcr.io": {"auth": "dXNlcjpzM2NyZXQ6eA=="}}}"#;
        let creds = docker_config_credentials(config, "ghcr.io").unwrap();
        assert_eq!((creds.username.as_str(), creds.password.as_str()), ("user", "s3cret:x"));
        assert_eq!(docker_config_credentials(config, "docker.io"), None);
        assert_eq!(format!("{creds:?}"), "Credentials(user, ***)", "the password is never printed");
    }
}
