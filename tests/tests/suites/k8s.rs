//! `agent-sandbox k8s`: the objects it prints for the images built here, validated offline
//! against Kubernetes' published OpenAPI schema by kubernetes-validate (pinned; `cargo xtask
//! setup --tests` installs it), for the oldest release with native sidecars and the newest the
//! validator carries. No cluster runs here: this proves the objects are what Kubernetes takes,
//! not that a cluster ran them.

use std::path::PathBuf;

use sandbox_tests::images::image;
use sandbox_tests::launcher::Launcher;
use serde_json::Value;

/// Native sidecars (init containers with `restartPolicy: Always`) are on by default from 1.29.
const KUBERNETES: &[&str] = &["1.29.0", "1.37.0"];
/// A SandboxTemplate's `spec` fields in kubernetes-sigs/agent-sandbox's v1beta1 CRD (its
/// `k8s/crds/extensions.agents.x-k8s.io_sandboxtemplates.yaml` at 2fd412d): the validator has
/// no schema for the CRD, so its own fields are checked here and its pod template by the schema.
const TEMPLATE_FIELDS: &[&str] = &[
    "envVarsInjectionPolicy",
    "networkPolicy",
    "networkPolicyManagement",
    "podTemplate",
    "service",
    "volumeClaimTemplates",
    "volumeClaimTemplatesPolicy",
];

/// kubernetes-validate: `AGENT_SANDBOX_KUBERNETES_VALIDATE`, or the one setup installs.
fn validator() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("AGENT_SANDBOX_KUBERNETES_VALIDATE") {
        return Ok(path.into());
    }
    let installed = xtask::setup::ci_tools(&sandbox_tests::root())
        .join(xtask::setup::KUBERNETES_VALIDATE_DIR)
        .join("bin/kubernetes-validate");
    anyhow::ensure!(
        installed.is_file(),
        "kubernetes-validate is not installed: `cargo xtask setup --tests` installs it as {}, or set \
         AGENT_SANDBOX_KUBERNETES_VALIDATE",
        installed.display()
    );
    Ok(installed)
}

/// Whether kubernetes-validate, strict (no field it does not know), takes `documents` for
/// every release in [`KUBERNETES`]; its complaints if not.
fn validate(documents: &[Value]) -> anyhow::Result<Result<(), String>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("objects.yaml");
    let text: Vec<String> = documents.iter().map(|d| yaml_serde::to_string(d).unwrap()).collect();
    std::fs::write(&file, text.join("---\n"))?;
    let mut complaints = String::new();
    for version in KUBERNETES {
        let out = std::process::Command::new(validator()?)
            .args(["--strict", "--kubernetes-version", version])
            .arg(&file)
            .output()?;
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let passed = said.matches("passed for resource").count();
        if !out.status.success() || passed != documents.len() {
            complaints.push_str(&format!("{version}: {said}\n"));
        }
    }
    Ok(if complaints.is_empty() { Ok(()) } else { Err(complaints) })
}

/// The YAML documents `agent-sandbox k8s ARGS…` printed (its comments skipped).
async fn k8s(launcher: &Launcher, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let out = launcher.ok(&[&["k8s"], args].concat()).await?;
    let documents = out
        .stdout
        .split("---\n")
        .filter(|d| d.lines().any(|l| !l.starts_with('#') && !l.trim().is_empty()))
        .map(yaml_serde::from_str)
        .collect::<Result<Vec<Value>, _>>()?;
    Ok(documents)
}

#[tokio::test]
async fn the_pod_and_the_sandbox_templates_pod_pass_kubernetes_schema_and_a_broken_one_does_not()
-> anyhow::Result<()> {
    let claude = image("claude").await?;
    let launcher = Launcher::new()?;
    let policy = tempfile::Builder::new().suffix(".yaml").tempfile()?;
    std::fs::write(policy.path(), "version: 1\ndomains:\n  - docs.rs\n")?;
    let policy = policy.path().to_str().unwrap().to_string();
    let base =
        ["claude", "--dns", "10.96.0.10", "--image", &claude, "--policy", &policy, "--allow", "pypi.org"];

    let pod = k8s(&launcher, &base).await?;
    let kinds: Vec<&str> = pod.iter().map(|d| d["kind"].as_str().unwrap_or_default()).collect();
    assert_eq!(kinds, ["ConfigMap", "NetworkPolicy", "Pod"]);
    // The policy selects this pod alone, lets nothing in, and keeps it from private addresses.
    let policy = &pod[1]["spec"];
    assert_eq!(policy["podSelector"]["matchLabels"]["agent-sandbox/sandbox"], pod[2]["metadata"]["name"]);
    assert_eq!(pod[2]["metadata"]["labels"]["agent-sandbox/sandbox"], pod[2]["metadata"]["name"]);
    assert_eq!(policy["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert!(policy.get("ingress").is_none());
    validate(&pod)?.map_err(anyhow::Error::msg)?;
    // The key of the image's API in the gateway alone, from the Secret, as a file sandbox-init
    // takes (a subPath mount: not the link a Secret folder holds).
    let spec = &pod[2]["spec"];
    let gateway = &spec["initContainers"][0];
    let key = gateway["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "keys");
    let key = key.expect("the gateway mounts claude's key");
    assert_eq!(key["mountPath"], "/run/secrets/anthropic_api_key");
    assert_eq!(key["subPath"], "anthropic_api_key");
    assert_eq!(spec["containers"][0]["image"], claude.as_str());
    // What .trivyignore says of the pod: no namespace (kubectl's -n chooses), and a memory limit
    // on each container.
    assert!(pod.iter().all(|d| d["metadata"].get("namespace").is_none()), "{pod:?}");
    assert_eq!(spec["containers"][0]["resources"]["limits"]["memory"], "8589934592");
    assert_eq!(gateway["resources"]["limits"]["memory"], "512Mi");

    // The validator refuses what Kubernetes would: the control that it checks anything.
    let mut broken = pod.clone();
    broken[2]["spec"]["initContainers"][0]["restartPolicyy"] = "Always".into();
    let refused = validate(&broken)?.expect_err("a field Kubernetes does not know passed");
    assert!(refused.contains("restartPolicyy"), "{refused}");
    let mut broken = pod.clone();
    broken[2]["spec"]["containers"][0]["securityContext"]["runAsUser"] = "agent".into();
    assert!(validate(&broken)?.is_err(), "a uid that is not a number passed");

    let template = k8s(&launcher, &[&base[..], &["--template"]].concat()).await?;
    let kinds: Vec<&str> = template.iter().map(|d| d["kind"].as_str().unwrap_or_default()).collect();
    assert_eq!(kinds, ["ConfigMap", "SandboxTemplate"], "the controller makes the template's policy");
    let sandbox_template = &template[1];
    assert_eq!(sandbox_template["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(sandbox_template["kind"], "SandboxTemplate");
    for field in sandbox_template["spec"].as_object().unwrap().keys() {
        assert!(TEMPLATE_FIELDS.contains(&field.as_str()), "SandboxTemplate has no field {field}");
    }
    assert_eq!(sandbox_template["spec"]["podTemplate"]["spec"], *spec, "the template's pod is the Pod's");
    let as_pod_template = serde_json::json!({
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": { "name": "agent-sandbox-claude" },
        "template": sandbox_template["spec"]["podTemplate"],
    });
    let policy = serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": { "name": "agent-sandbox-claude" },
        "spec": { "podSelector": {}, "policyTypes": ["Egress"], "egress": sandbox_template["spec"]["networkPolicy"]["egress"] },
    });
    validate(&[template[0].clone(), as_pod_template, policy])?.map_err(anyhow::Error::msg)?;
    Ok(())
}

#[tokio::test]
async fn gvisor_a_loopback_resolver_and_a_bad_policy_are_refused_with_their_codes() -> anyhow::Result<()> {
    let shell = image("shell").await?;
    let launcher = Launcher::new()?;
    let run = |extra: &[&str]| {
        [&["k8s", "shell", "--image", shell.as_str()][..], extra]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let gvisor = launcher.run(&run(&["--dns", "10.96.0.10", "--runtime-class", "gvisor"])).await?;
    assert_eq!(gvisor.code, 64, "{gvisor:?}");
    assert!(gvisor.stderr.contains("no nftables") && gvisor.stdout.is_empty(), "{gvisor:?}");
    let loopback = launcher.run(&run(&["--dns", "127.0.0.1"])).await?;
    assert_eq!(loopback.code, 64, "{loopback:?}");
    let policy = tempfile::Builder::new().suffix(".yaml").tempfile()?;
    std::fs::write(policy.path(), "version: 1\ndomains:\n  - 'bad name!'\n")?;
    let bad =
        launcher.run(&run(&["--dns", "10.96.0.10", "--policy", policy.path().to_str().unwrap()])).await?;
    assert_eq!(bad.code, 65, "{bad:?}");
    assert!(bad.stderr.contains(&policy.path().display().to_string()), "{bad:?}");
    // A VM runtime is taken; the shell image holds no key, so no Secret is asked for.
    let kata =
        k8s(&launcher, &["shell", "--image", &shell, "--dns", "10.96.0.10", "--runtime-class", "kata"])
            .await?;
    let kata_pod = kata.iter().find(|d| d["kind"] == "Pod").expect("a Pod");
    assert_eq!(kata_pod["spec"]["runtimeClassName"], "kata");
    assert!(!kata_pod["spec"]["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "keys"));
    validate(&kata)?.map_err(anyhow::Error::msg)?;
    Ok(())
}

const KEY: &str = "sk-ant-k8s-test-key-not-real";

net_admin! {
    [single] {
        /// The printed Pod run by the kubelet stand-in (tests/src/kubelet.rs), not by a cluster: the
        /// gateway starts first as a native sidecar and passes its startup probe, the agent's container
        /// then runs its session with no capability in any process, the key from the Secret is the
        /// gateway's alone, and the network holds: the policy's name and the ConfigMap's reached, any
        /// other refused at the gate.
        #[tokio::test]
        async fn the_printed_pod_runs_its_gateway_as_a_sidecar_and_its_agent_without_capabilities()
        -> anyhow::Result<()> {
            use std::collections::HashMap;

            use sandbox_tests::assert::{assert_unprivileged, processes_of};
            use sandbox_tests::docker::{copy_in, exec};
            use sandbox_tests::probe::{PROBE, probe_binary, spawn};

            let claude = image("claude").await?;
            let world =
                sandbox_tests::peers::ResolvedNet::start("k8s", &["platform.claude.com", "docs.rs", "example.com"])
                    .await?;
            let launcher = Launcher::new()?;
            let dns = world.dns.ipv4.to_string();
            let objects =
                k8s(&launcher, &["claude", "--dns", &dns, "--image", &claude, "--allow", "docs.rs"]).await?;
            let [config, _policy, pod] = &objects[..] else {
                anyhow::bail!("a ConfigMap, a NetworkPolicy and a Pod: {objects:?}")
            };
            let data: HashMap<String, String> = serde_json::from_value(config["data"].clone())?;
            let config_maps = HashMap::from([(config["metadata"]["name"].as_str().unwrap().to_string(), data)]);
            let secrets = HashMap::from([(
                "agent-sandbox-claude-keys".to_string(),
                HashMap::from([("anthropic_api_key".to_string(), KEY.to_string())]),
            )]);
            let pod = sandbox_tests::kubelet::Pod::run(pod, &world.net.name, &secrets, &config_maps).await?;
            let (gateway, agent) = (pod.id("gateway"), pod.id("agent"));
            sandbox_tests::docker::wait_for_log(agent, "sandbox ready: agent container", 60).await?;

            let processes = processes_of(agent).await?;
            assert!(processes.iter().any(|p| p.name == "tmux: server"), "{processes:?}");
            processes.iter().for_each(assert_unprivileged);
            // The gateway's container has exactly the capabilities the pod gives it (a process started
            // in it shows the container's bounding set; PID 1 narrows its own further), and no way to
            // gain more.
            let given: u64 = [12u32, 10, 0, 7, 6, 8, 5].iter().map(|c| 1u64 << c).sum();
            let gateway_status = exec(gateway, &["cat", "/proc/self/status"], None).await?.stdout;
            let field = |name: &str| gateway_status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
            assert_eq!(u64::from_str_radix(field("CapBnd:").unwrap_or_default(), 16)?, given, "{gateway_status}");
            assert_eq!(field("NoNewPrivs:"), Some("1"), "{gateway_status}");
            let pid1 = processes_of(gateway).await?.into_iter().find(|p| p.pid == "1").expect("the gateway's PID 1");
            let bounding = u64::from_str_radix(&pid1.fields["CapBnd"], 16)?;
            assert_eq!(bounding & !given, 0, "the gateway's PID 1 holds more than the pod gives: {:?}", pid1.fields);

            // The key: the gateway took it from the Secret's file; the session has a placeholder.
            let environ = sandbox_tests::docker::pane_environ(agent).await?;
            assert!(environ.contains("ANTHROPIC_API_KEY=sk-ant-api03-held-by-agent-sandbox"), "{environ:?}");
            let everything =
                exec(agent, &["sh", "-c", "cat /proc/*/environ 2>/dev/null; grep -rs . /run /home /tmp"], None)
                    .await?;
            assert!(!everything.stdout.contains(KEY), "the agent's container has the key");

            copy_in(agent, PROBE, &std::fs::read(probe_binary()?)?, 0o755).await?;
            let tcp = |host: &str| spawn(agent, true, &["tcp", host, "443", "--timeout-ms", "3000"]);
            for allowed in ["platform.claude.com", "docs.rs"] {
                let reached = tcp(allowed).await??;
                assert_eq!(reached.outcome(), "connected", "{allowed}: {:?}", reached.fields);
            }
            let refused = tcp("example.com").await??;
            assert!(refused.outcome().starts_with("dns:"), "{:?}", refused.fields);
            let asked = world.dns.dns_queries().await?;
            assert!(!asked.iter().any(|q| q.contains("example.com")), "asked upstream for a refused name: {asked:?}");
            Ok(())
        }
    }
}
