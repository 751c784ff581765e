//! `agent-sandbox k8s`: sidecar mode's shape as Kubernetes objects, printed for `kubectl apply`.
//! The gateway is a native sidecar (an init container with `restartPolicy: Always`, Kubernetes
//! 1.29 and later) with NET_ADMIN and the keys; the agent's container meets the restricted Pod
//! Security Standard; the two share the pod's network namespace, as the launcher's pair shares
//! its holder's, and a NetworkPolicy keeps the pod from private and link-local addresses under the
//! gateway's names. `--template` wraps the same pod in a kubernetes-sigs/agent-sandbox
//! SandboxTemplate, whose controller makes that policy from the template's rules.
//!
//! [`render`] is pure; [`run`] reads what it needs from the flags and from the image in the
//! local engine: its state folders, and the APIs its policy reaches, whose keys the gateway holds.

use std::net::IpAddr;

use sandbox_policy::layout::{
    AGENT_UID, DNS_ENV, DROP_IN_DIR, GATEWAY_CAPS, GATEWAY_READY, ROLE_ENV, RUN_DIR, SECRETS_DIR, SHARED_DIR,
    WORKSPACE,
};
use serde_json::{Value, json};

use crate::engine::Engine;
use crate::exit::Result;
use crate::flags::K8sFlags;
use crate::host::bad;

/// The gateway's memory: the table's sets, the name check and the forwarder.
const GATEWAY_MEMORY: &str = "512Mi";
/// The SandboxTemplate's API, as kubernetes-sigs/agent-sandbox serves it.
const TEMPLATE_API: &str = "extensions.agents.x-k8s.io/v1beta1";
/// Addresses the SandboxTemplate's NetworkPolicy keeps the pod from, as the agent-sandbox
/// controller's default does: private ranges, shared address space and link-local (the cloud's
/// metadata server). The gateway's allowlist is by name; this is the address layer under it.
const PRIVATE_V4: &[&str] =
    &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"];

/// What the objects are made from.
#[derive(Debug, Clone)]
pub struct PodSpec {
    pub name: String,
    pub agent: String,
    pub image: String,
    pub dns: IpAddr,
    /// The image's state folders, under the agent's home.
    pub state_dirs: Vec<String>,
    /// The secret files the gateway reads: one per API the image's policy reaches.
    pub keys: Vec<String>,
    /// Drop-in policies: (file name in the drop-in folder, contents).
    pub drop_ins: Vec<(String, String)>,
    /// The agent's variables, `NAME=VALUE`.
    pub env: Vec<String>,
    pub memory: i64,
    pub runtime_class: Option<String>,
    pub template: bool,
}

pub async fn run(flags: &K8sFlags) -> Result<i32> {
    crate::host::check_agent(&flags.agent)?;
    check_runtime_class(flags.runtime_class.as_deref())?;
    if !sandbox_policy::resolver_outside(&flags.dns) {
        return Err(bad(format!(
            "--dns {}: give a resolver outside the pod (the cluster's DNS service); on loopback the agent \
             could bind its address and answer for it",
            flags.dns
        )));
    }
    crate::approve::validate("--allow", &flags.allow)?;
    let mut drop_ins: Vec<(String, String)> = crate::host::read_policies(&flags.policy)?
        .into_iter()
        .map(|(path, bytes)| (config_key(&path), String::from_utf8_lossy(&bytes).into_owned()))
        .collect();
    if !flags.allow.is_empty() {
        drop_ins.push(("k8s-allow.txt".into(), crate::approve::render(&flags.allow)));
    }
    let env = crate::host::variables(&flags.env, flags.unattended)?;
    let memory = crate::host::memory_limit(flags.memory.as_deref())?;
    let engine = Engine::connect().await?;
    let (local, facts) =
        crate::run::find_image(&engine, &flags.agent, flags.image.as_deref(), None, None).await?;
    let baked = engine.file_in_image(&local, sandbox_policy::BAKED_POLICY).await?.unwrap_or_default();
    let baked = crate::run::parse_baked_policy(&baked)?;
    // The cluster pulls: the digest the lock pins unless an image was named.
    let image = match (&flags.image, crate::run::pinned(&flags.agent)?) {
        (None, Some(pinned)) => pinned,
        _ => {
            if !local.contains('@') {
                eprintln!(
                    "agent-sandbox: {local} is this engine's image, not a published digest: push it where the \
                     cluster pulls from, and pass that reference with --image"
                );
            }
            local
        }
    };
    let keys = if flags.no_key {
        Vec::new()
    } else {
        crate::spec::apis_reached(&baked)
            .iter()
            .filter_map(|api| api.keys.first())
            .map(|key| key.var.to_ascii_lowercase())
            .collect()
    };
    let spec = PodSpec {
        name: flags.name.clone().unwrap_or_else(|| format!("agent-sandbox-{}", flags.agent)),
        agent: flags.agent.clone(),
        image,
        dns: flags.dns,
        state_dirs: facts.state_dirs(),
        keys,
        drop_ins,
        env,
        memory,
        runtime_class: flags.runtime_class.clone(),
        template: flags.template,
    };
    check_name(&spec.name)?;
    print!("{}", render(&spec));
    Ok(0)
}

/// A runtime class for the pod, where the gateway still has a kernel with nftables: gVisor runs
/// every container of a pod in one sandbox, the gateway too, and its kernel has no nftables.
fn check_runtime_class(class: Option<&str>) -> Result<()> {
    match class {
        Some(class) if ["gvisor", "runsc"].iter().any(|g| class.to_ascii_lowercase().contains(g)) => {
            Err(bad(format!(
                "--runtime-class {class}: gVisor runs every container of a pod in one sandbox, the gateway too, and \
             its kernel has no nftables, so the gateway could not enforce anything. A VM runtime with a guest \
             kernel (Kata) keeps nftables; locally, `agent-sandbox run --runtime runsc` puts only the agent \
             under gVisor"
            )))
        }
        Some(class) => check_name(class),
        None => Ok(()),
    }
}

/// A name Kubernetes takes for an object (RFC 1123: lower-case letters, digits and `-`).
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(bad(format!("`{name}`: a Kubernetes name is lower-case letters, digits and `-`, at most 63")))
    }
}

/// A drop-in's file name as a ConfigMap key (letters, digits, `-`, `_`, `.`).
fn config_key(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect()
}

/// The objects, as YAML documents: the ConfigMap of drop-ins (if any), then the Pod or the
/// SandboxTemplate; comments first saying what the cluster needs.
pub fn render(spec: &PodSpec) -> String {
    let name = &spec.name;
    let labels = json!({
        "app.kubernetes.io/name": "agent-sandbox",
        "agent-sandbox/agent": spec.agent,
        "agent-sandbox/sandbox": name,
    });
    let mut out = header(spec);
    if !spec.drop_ins.is_empty() {
        let data: serde_json::Map<String, Value> =
            spec.drop_ins.iter().map(|(key, text)| (key.clone(), Value::String(text.clone()))).collect();
        let config = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": format!("{name}-policy"), "labels": labels },
            "data": data,
        });
        out.push_str("---\n");
        out.push_str(&yaml(&config));
    }
    let object = if spec.template {
        json!({
            "apiVersion": TEMPLATE_API,
            "kind": "SandboxTemplate",
            "metadata": { "name": name, "labels": labels },
            "spec": {
                "podTemplate": { "metadata": { "labels": labels }, "spec": pod_spec(spec) },
                "networkPolicyManagement": "Managed",
                "networkPolicy": { "egress": egress(spec.dns) },
            },
        })
    } else {
        // The address layer under the gateway's names, as the SandboxTemplate's controller
        // would make it: this pod's egress, and nothing in.
        let policy = json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "name": name, "labels": labels },
            "spec": {
                "podSelector": { "matchLabels": { "agent-sandbox/sandbox": name } },
                "policyTypes": ["Ingress", "Egress"],
                "egress": egress(spec.dns),
            },
        });
        out.push_str("---\n");
        out.push_str(&yaml(&policy));
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "labels": labels },
            "spec": pod_spec(spec),
        })
    };
    out.push_str("---\n");
    out.push_str(&yaml(&object));
    out
}

fn yaml(value: &Value) -> String {
    yaml_serde::to_string(value).expect("JSON values serialise as YAML")
}

fn header(spec: &PodSpec) -> String {
    let name = &spec.name;
    let mut lines = vec![
        format!(
            "agent-sandbox k8s {}: sidecar mode as a {}. Validated against Kubernetes' schema; not run on a cluster.",
            spec.agent,
            if spec.template { "kubernetes-sigs/agent-sandbox SandboxTemplate" } else { "Pod" }
        ),
        "Needs Kubernetes 1.29 or later (native sidecars), and a namespace whose Pod Security admits".into(),
        "NET_ADMIN for the gateway (privileged); the agent's container alone meets restricted.".into(),
    ];
    if !spec.keys.is_empty() {
        let files: Vec<String> = spec.keys.iter().map(|k| format!("--from-file={k}=PATH")).collect();
        lines.push(format!(
            "The keys, read by the gateway alone: kubectl create secret generic {name}-keys {}",
            files.join(" ")
        ));
    }
    lines
        .push("/workspace and the state folders are emptyDir: mount your volumes there to keep them.".into());
    lines.push(format!("The session: kubectl exec -it {name} -c agent -- sandbox-attach"));
    lines.iter().map(|l| format!("# {l}\n")).collect()
}

/// The pod: the gateway (a native sidecar, ready once its firewall holds), then the agent's
/// container; every container resolves through the gate on 127.0.0.1.
fn pod_spec(spec: &PodSpec) -> Value {
    let mut gateway_mounts = vec![json!({ "name": "shared", "mountPath": SHARED_DIR })];
    gateway_mounts.extend(spec.keys.iter().map(|key| {
        json!({ "name": "keys", "mountPath": format!("{SECRETS_DIR}/{key}"), "subPath": key, "readOnly": true })
    }));
    gateway_mounts.extend(spec.drop_ins.iter().map(|(key, _)| {
        json!({ "name": "policy", "mountPath": format!("{DROP_IN_DIR}/{key}"), "subPath": key, "readOnly": true })
    }));
    let gateway = json!({
        "name": "gateway",
        "image": spec.image,
        "restartPolicy": "Always",
        "env": [
            { "name": ROLE_ENV, "value": "gateway" },
            { "name": DNS_ENV, "value": spec.dns.to_string() },
        ],
        "securityContext": {
            "runAsUser": 0,
            "allowPrivilegeEscalation": false,
            "capabilities": { "drop": ["ALL"], "add": GATEWAY_CAPS },
        },
        "startupProbe": {
            "exec": { "command": ["test", "-e", GATEWAY_READY] },
            "periodSeconds": 1,
            "failureThreshold": 120,
        },
        "resources": { "limits": { "memory": GATEWAY_MEMORY } },
        "volumeMounts": gateway_mounts,
    });
    let mut agent_mounts = vec![
        json!({ "name": "workspace", "mountPath": WORKSPACE }),
        json!({ "name": "run", "mountPath": RUN_DIR }),
        json!({ "name": "shared", "mountPath": SHARED_DIR, "readOnly": true }),
    ];
    agent_mounts.extend(
        spec.state_dirs
            .iter()
            .enumerate()
            .map(|(i, dir)| json!({ "name": format!("state-{i}"), "mountPath": dir })),
    );
    let mut agent_env = vec![json!({ "name": ROLE_ENV, "value": "agent" })];
    agent_env.extend(spec.env.iter().map(|e| {
        let (name, value) = e.split_once('=').unwrap_or((e, ""));
        json!({ "name": name, "value": value })
    }));
    let agent = json!({
        "name": "agent",
        "image": spec.image,
        "env": agent_env,
        "securityContext": {
            "runAsUser": AGENT_UID,
            "runAsGroup": AGENT_UID,
            "runAsNonRoot": true,
            "allowPrivilegeEscalation": false,
            "capabilities": { "drop": ["ALL"] },
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "resources": { "limits": { "memory": spec.memory.to_string() } },
        "volumeMounts": agent_mounts,
    });
    let mut volumes = vec![
        json!({ "name": "shared", "emptyDir": { "medium": "Memory", "sizeLimit": "16Mi" } }),
        json!({ "name": "run", "emptyDir": { "medium": "Memory", "sizeLimit": "64Mi" } }),
        json!({ "name": "workspace", "emptyDir": {} }),
    ];
    volumes
        .extend((0..spec.state_dirs.len()).map(|i| json!({ "name": format!("state-{i}"), "emptyDir": {} })));
    if !spec.keys.is_empty() {
        volumes.push(json!({
            "name": "keys",
            "secret": { "secretName": format!("{}-keys", spec.name), "defaultMode": 0o400 },
        }));
    }
    if !spec.drop_ins.is_empty() {
        volumes.push(json!({ "name": "policy", "configMap": { "name": format!("{}-policy", spec.name) } }));
    }
    let mut pod = json!({
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "dnsPolicy": "None",
        "dnsConfig": { "nameservers": ["127.0.0.1"] },
        "securityContext": { "seccompProfile": { "type": "RuntimeDefault" } },
        "initContainers": [gateway],
        "containers": [agent],
        "volumes": volumes,
    });
    if let Some(class) = &spec.runtime_class {
        pod["runtimeClassName"] = json!(class);
    }
    pod
}

/// The pod's egress (its NetworkPolicy, or the SandboxTemplate's): DNS to the cluster's resolver (or the one given), and the
/// internet but private, shared and link-local ranges. Ingress is the controller's default: none.
fn egress(dns: IpAddr) -> Value {
    let resolver = match dns {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    };
    json!([
        {
            "to": [
                {
                    "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "kube-system" } },
                    "podSelector": { "matchLabels": { "k8s-app": "kube-dns" } },
                },
                { "ipBlock": { "cidr": resolver } },
            ],
            "ports": [{ "protocol": "UDP", "port": 53 }, { "protocol": "TCP", "port": 53 }],
        },
        { "to": [{ "ipBlock": { "cidr": "0.0.0.0/0", "except": PRIVATE_V4 } }] },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::Code;

    fn claude() -> PodSpec {
        PodSpec {
            name: "agent-sandbox-claude".into(),
            agent: "claude".into(),
            image: "ghcr.io/example/agent-claude@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
                .into(),
            dns: "10.96.0.10".parse().unwrap(),
            state_dirs: vec!["/home/agent/.claude".into()],
            keys: vec!["anthropic_api_key".into()],
            drop_ins: vec![("run-1-team.yaml".into(), "allow:\n  - docs.rs\n".into())],
            env: vec!["SANDBOX_UNATTENDED=1".into()],
            memory: 8 << 30,
            runtime_class: None,
            template: false,
        }
    }

    #[test]
    fn a_claude_pod() {
        insta::assert_snapshot!(render(&claude()));
    }

    #[test]
    fn a_shell_sandbox_template() {
        let spec = PodSpec {
            name: "agent-sandbox-shell".into(),
            agent: "shell".into(),
            keys: vec![],
            drop_ins: vec![],
            state_dirs: vec![],
            env: vec![],
            runtime_class: Some("kata".into()),
            template: true,
            ..claude()
        };
        insta::assert_snapshot!(render(&spec));
    }

    #[test]
    fn gvisor_is_refused_as_the_pods_runtime_class_and_a_vm_runtime_is_taken() {
        for class in ["gvisor", "runsc", "gvisor-ptrace"] {
            let refused = check_runtime_class(Some(class)).unwrap_err();
            assert_eq!(refused.code, Code::BadArgument);
            assert!(refused.message.contains("no nftables"), "{refused}");
        }
        assert!(check_runtime_class(Some("kata")).is_ok());
        assert!(check_runtime_class(Some("kata-qemu")).is_ok());
        assert!(check_runtime_class(None).is_ok());
        assert!(check_runtime_class(Some("Kata_QEMU")).is_err(), "not a Kubernetes name");
    }

    /// What the restricted Pod Security Standard (Kubernetes 1.29's checks) refuses in one
    /// container of `pod`.
    fn restricted_violations(pod: &Value, container: &Value) -> Vec<String> {
        let mut found = Vec::new();
        let (sc, psc) = (&container["securityContext"], &pod["securityContext"]);
        let either = |field: &str| if sc[field].is_null() { &psc[field] } else { &sc[field] };
        if either("runAsNonRoot") != &json!(true) {
            found.push("runAsNonRoot is not true".into());
        }
        if either("runAsUser") == &json!(0) {
            found.push("runAsUser is 0".into());
        }
        if sc["allowPrivilegeEscalation"] != json!(false) {
            found.push("allowPrivilegeEscalation is not false".into());
        }
        if sc["privileged"] == json!(true) {
            found.push("privileged".into());
        }
        if !sc["capabilities"]["drop"].as_array().is_some_and(|d| d.contains(&json!("ALL"))) {
            found.push("capabilities do not drop ALL".into());
        }
        for cap in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if cap != "NET_BIND_SERVICE" {
                found.push(format!("adds {}", cap.as_str().unwrap_or_default()));
            }
        }
        if !matches!(either("seccompProfile")["type"].as_str(), Some("RuntimeDefault" | "Localhost")) {
            found.push("no seccomp profile".into());
        }
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            if pod[field] == json!(true) {
                found.push(field.into());
            }
        }
        let allowed = [
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "persistentVolumeClaim",
            "projected",
            "secret",
        ];
        for volume in pod["volumes"].as_array().into_iter().flatten() {
            let object = volume.as_object().unwrap();
            if let Some(kind) = object.keys().find(|k| *k != "name" && !allowed.contains(&k.as_str())) {
                found.push(format!("a {kind} volume"));
            }
        }
        found
    }

    #[test]
    fn the_agents_container_meets_the_restricted_standard_and_the_gateway_holds_only_its_capabilities() {
        for spec in [claude(), PodSpec { template: true, ..claude() }] {
            let docs: Vec<Value> = render(&spec)
                .split("---\n")
                .filter(|d| d.lines().any(|l| !l.starts_with('#') && !l.is_empty()))
                .map(|d| yaml_serde::from_str(d).unwrap())
                .collect();
            let object = docs.last().unwrap();
            let pod = if spec.template { &object["spec"]["podTemplate"]["spec"] } else { &object["spec"] };
            let agent = &pod["containers"][0];
            assert_eq!(agent["name"], "agent");
            assert_eq!(restricted_violations(pod, agent), Vec::<String>::new());
            assert_eq!(pod["containers"].as_array().unwrap().len(), 1, "one container besides the gateway");
            // The checker sees what it must: the gateway is refused for its root and its capabilities.
            let gateway = &pod["initContainers"][0];
            assert_eq!(gateway["restartPolicy"], "Always", "a native sidecar");
            let refused = restricted_violations(pod, gateway);
            assert!(refused.contains(&"adds NET_ADMIN".to_string()), "{refused:?}");
            assert!(refused.contains(&"runAsUser is 0".to_string()), "{refused:?}");
            assert_eq!(gateway["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
            // No token of the cluster's, no addresses of its services, the gate as every
            // container's resolver; the keys in the gateway alone.
            assert_eq!(pod["automountServiceAccountToken"], false);
            assert_eq!(pod["enableServiceLinks"], false);
            assert_eq!(pod["dnsConfig"]["nameservers"], json!(["127.0.0.1"]));
            let mounts = |c: &Value| {
                c["volumeMounts"].as_array().unwrap().iter().map(|m| m["name"].clone()).collect::<Vec<_>>()
            };
            assert!(mounts(gateway).contains(&json!("keys")) && !mounts(agent).contains(&json!("keys")));
            assert!(!mounts(agent).contains(&json!("policy")));
            let shared =
                agent["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "shared").unwrap();
            assert_eq!(shared["readOnly"], true);
        }
    }

    #[test]
    fn drop_in_names_become_config_map_keys() {
        assert_eq!(config_key("/etc/agent-sandbox/policy.d/run-1-my team.yaml"), "run-1-my-team.yaml");
        assert!(check_name("agent-sandbox-claude").is_ok());
        for bad in ["", "-a", "a-", "Agent", "a_b", &"a".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
