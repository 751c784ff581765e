//! A stand-in for a kubelet: a Pod as `agent-sandbox k8s` prints it, run on the engine the way a
//! kubelet and its container runtime would run it. It is not Kubernetes (no cluster can run
//! here): it takes the fields the printed pod uses and nothing else, refusing any other, so that
//! the k8s:: suite runs exactly what a user applies.
//!
//! - The pod's network namespace is a pause container's (`sandbox-init hold`, as nobody).
//! - `dnsPolicy: None` with `dnsConfig`: a resolv.conf written from it, bind-mounted into every
//!   container, as the kubelet writes one per pod; read-only, as a runtime mounts it for a
//!   container with a read-only root (the harder case: containerd's default is writable).
//! - Init containers with `restartPolicy: Always` (native sidecars) start first, in order, and
//!   the next container starts once the sidecar's startup probe passes.
//! - `emptyDir` is a fresh volume of the pod (tmpfs for `medium: Memory`); a Secret's or a
//!   ConfigMap's key mounted by `subPath` is a file bind-mounted in, the Secret's with its
//!   `defaultMode` and owned by root, as the kubelet projects it.
//! - A container's `securityContext` is its user, its capabilities, `no-new-privileges` for
//!   `allowPrivilegeEscalation: false`, and the engine's default seccomp profile.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;

use bollard::models::{ContainerCreateBody, HostConfig};
use serde_json::Value;

use crate::docker::{RemoveOnDrop, TestVolume, docker, exec};

/// The fields of a pod spec, and of a container, the stand-in runs.
const POD_FIELDS: &[&str] = &[
    "automountServiceAccountToken",
    "enableServiceLinks",
    "dnsPolicy",
    "dnsConfig",
    "securityContext",
    "initContainers",
    "containers",
    "volumes",
];
const CONTAINER_FIELDS: &[&str] = &[
    "name",
    "image",
    "restartPolicy",
    "env",
    "securityContext",
    "startupProbe",
    "resources",
    "volumeMounts",
];

/// A pod running on the engine; its containers and volumes go when it is dropped.
pub struct Pod {
    /// Container ids by the pod's container names.
    pub containers: HashMap<String, String>,
    _guards: Vec<RemoveOnDrop>,
    _volumes: Vec<TestVolume>,
    _files: tempfile::TempDir,
}

impl Pod {
    pub fn id(&self, container: &str) -> &str {
        &self.containers[container]
    }

    /// Runs `pod` (a Pod object) on `network`, with `secrets` (a Secret's data, by key) and
    /// `config_maps` (a ConfigMap's data, by name, then key).
    pub async fn run(
        pod: &Value,
        network: &str,
        secrets: &HashMap<String, HashMap<String, String>>,
        config_maps: &HashMap<String, HashMap<String, String>>,
    ) -> anyhow::Result<Pod> {
        // The gateway's NET_ADMIN (place.rs).
        crate::place::ensure(crate::place::Need::NetAdmin)?;
        anyhow::ensure!(pod["kind"] == "Pod", "not a Pod: {}", pod["kind"]);
        let spec = &pod["spec"];
        known(spec, POD_FIELDS, "spec")?;
        anyhow::ensure!(spec["dnsPolicy"] == "None", "the stand-in writes resolv.conf from dnsConfig alone");
        let files = tempfile::tempdir()?;
        let resolv = files.path().join("resolv.conf");
        let servers: Vec<String> =
            strings(&spec["dnsConfig"]["nameservers"]).iter().map(|s| format!("nameserver {s}\n")).collect();
        std::fs::write(&resolv, servers.concat())?;
        std::fs::set_permissions(&resolv, std::fs::Permissions::from_mode(0o644))?;
        let image = spec["containers"][0]["image"].as_str().unwrap_or_default().to_string();
        let docker = docker().await?;
        let mut guards = Vec::new();
        let create = |body: ContainerCreateBody| {
            let docker = docker.clone();
            async move {
                anyhow::Ok(
                    docker
                        .create_container(None::<bollard::query_parameters::CreateContainerOptions>, body)
                        .await?
                        .id,
                )
            }
        };
        let pause = create(ContainerCreateBody {
            image: Some(image),
            user: Some("65534:65534".into()),
            entrypoint: Some(vec!["/usr/local/bin/sandbox-init".into(), "hold".into()]),
            healthcheck: Some(crate::docker::no_healthcheck()),
            host_config: Some(HostConfig {
                network_mode: Some(network.to_string()),
                cap_drop: Some(vec!["ALL".into()]),
                readonly_rootfs: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
        guards.push(RemoveOnDrop(pause.clone()));
        docker.start_container(&pause, None::<bollard::query_parameters::StartContainerOptions>).await?;

        // The pod's volumes: every emptyDir a fresh folder in memory of root's, mode 777, as the
        // kubelet makes one (nothing of the image's copied in); Secret and ConfigMap keys files.
        let mut volumes = Vec::new();
        let mut empty_dirs: HashMap<String, String> = HashMap::new();
        let mut sources: HashMap<String, (HashMap<String, String>, u32)> = HashMap::new();
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            let name = volume["name"].as_str().unwrap_or_default().to_string();
            if volume.get("emptyDir").is_some() {
                let made = TestVolume::create_tmpfs("pod", "mode=0777").await?;
                empty_dirs.insert(name, made.name.clone());
                volumes.push(made);
            } else if let Some(secret) = volume.get("secret") {
                let data = secrets.get(secret["secretName"].as_str().unwrap_or_default());
                let data = data.ok_or_else(|| anyhow::anyhow!("no Secret {}", secret["secretName"]))?;
                sources.insert(name, (data.clone(), secret["defaultMode"].as_u64().unwrap_or(0o644) as u32));
            } else if let Some(map) = volume.get("configMap") {
                let data = config_maps.get(map["name"].as_str().unwrap_or_default());
                let data = data.ok_or_else(|| anyhow::anyhow!("no ConfigMap {}", map["name"]))?;
                sources.insert(name, (data.clone(), 0o644));
            } else {
                anyhow::bail!("volume {name}: a kind the stand-in does not run: {volume}");
            }
        }

        let mut containers = HashMap::new();
        let sidecars = spec["initContainers"].as_array().cloned().unwrap_or_default();
        let mains = spec["containers"].as_array().cloned().unwrap_or_default();
        for (index, container) in sidecars.iter().chain(&mains).enumerate() {
            known(container, CONTAINER_FIELDS, "a container")?;
            let name = container["name"].as_str().unwrap_or_default().to_string();
            if index < sidecars.len() {
                anyhow::ensure!(
                    container["restartPolicy"] == "Always",
                    "{name}: only native sidecars run as init containers here"
                );
            }
            let mut binds = vec![format!("{}:/etc/resolv.conf:ro", resolv.display())];
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                let volume = mount["name"].as_str().unwrap_or_default();
                let target = mount["mountPath"].as_str().unwrap_or_default();
                let mode = if mount["readOnly"] == true { "ro" } else { "rw" };
                if let Some(made) = empty_dirs.get(volume) {
                    binds.push(format!("{made}:{target}:{mode},nocopy"));
                } else if let Some((data, file_mode)) = sources.get(volume) {
                    let key = mount["subPath"]
                        .as_str()
                        .ok_or_else(|| anyhow::anyhow!("{name}: {volume} without subPath"))?;
                    let value = data.get(key).ok_or_else(|| anyhow::anyhow!("{volume} has no key {key}"))?;
                    let file = files.path().join(format!("{name}-{volume}-{key}"));
                    std::fs::write(&file, value)?;
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*file_mode))?;
                    binds.push(format!("{}:{target}:{mode}", file.display()));
                } else {
                    anyhow::bail!("{name}: no volume {volume}");
                }
            }
            let context = &container["securityContext"];
            let user = match (context["runAsUser"].as_u64(), context["runAsGroup"].as_u64()) {
                (Some(uid), Some(gid)) => Some(format!("{uid}:{gid}")),
                (Some(uid), None) => Some(uid.to_string()),
                _ => None,
            };
            if context["runAsNonRoot"] == true {
                anyhow::ensure!(
                    user.as_deref().is_some_and(|u| !u.starts_with("0")),
                    "{name}: runAsNonRoot as root"
                );
            }
            let env: Vec<String> = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    format!(
                        "{}={}",
                        e["name"].as_str().unwrap_or_default(),
                        e["value"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            let memory = container["resources"]["limits"]["memory"].as_str().and_then(quantity);
            let id = create(ContainerCreateBody {
                image: container["image"].as_str().map(str::to_string),
                user,
                env: Some(env),
                // A kubelet runs the pod's probes, never the image's HEALTHCHECK.
                healthcheck: Some(crate::docker::no_healthcheck()),
                host_config: Some(HostConfig {
                    binds: Some(binds),
                    network_mode: Some(format!("container:{pause}")),
                    cap_drop: Some(strings(&context["capabilities"]["drop"])),
                    cap_add: Some(strings(&context["capabilities"]["add"])),
                    security_opt: (context["allowPrivilegeEscalation"] == false)
                        .then(|| vec!["no-new-privileges".into()]),
                    memory,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?;
            guards.push(RemoveOnDrop(id.clone()));
            docker.start_container(&id, None::<bollard::query_parameters::StartContainerOptions>).await?;
            if let Some(probe) = container.get("startupProbe") {
                startup(&id, &name, probe).await?;
            }
            containers.insert(name, id);
        }
        // Removed in reverse: the containers, then the pause container, then the volumes.
        guards.reverse();
        Ok(Pod { containers, _guards: guards, _volumes: volumes, _files: files })
    }
}

/// Waits for an exec startup probe to pass, as the kubelet does before the next container.
async fn startup(id: &str, name: &str, probe: &Value) -> anyhow::Result<()> {
    let command = strings(&probe["exec"]["command"]);
    let period = probe["periodSeconds"].as_u64().unwrap_or(10);
    let tries = probe["failureThreshold"].as_u64().unwrap_or(3);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    for _ in 0..tries {
        // A container that stopped fails its probe: its log says why.
        if exec(id, &command, None).await.is_ok_and(|out| out.code == 0) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(period)).await;
    }
    let (out, err) = crate::docker::container_logs(id).await?;
    anyhow::bail!("{name}'s startup probe {command:?} did not pass: {out}{err}")
}

fn known(value: &Value, fields: &[&str], at: &str) -> anyhow::Result<()> {
    for key in value.as_object().into_iter().flatten().map(|(k, _)| k) {
        anyhow::ensure!(fields.contains(&key.as_str()), "{at}.{key}: a field the stand-in does not run");
    }
    Ok(())
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
}

/// A memory quantity in bytes: a number, or `Ki`, `Mi`, `Gi`.
fn quantity(text: &str) -> Option<i64> {
    let (number, scale) = match text {
        t if t.ends_with("Ki") => (&t[..t.len() - 2], 1 << 10),
        t if t.ends_with("Mi") => (&t[..t.len() - 2], 1 << 20),
        t if t.ends_with("Gi") => (&t[..t.len() - 2], 1 << 30),
        t => (t, 1),
    };
    number.parse::<i64>().ok().map(|n| n * scale)
}
