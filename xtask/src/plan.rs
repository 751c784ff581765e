//! The build's decision for one image, pure: given its node, its parent's recorded facts and
//! what the walk shares (sandbox-init, the extra CA, the OS layer, the revision), everything its
//! build is given (context, build args, labels) and the two hashes: the input hash images.lock
//! records, and the build key an existing image must carry to be reused. No engine: the walk
//! (walk.rs) asks the engine, this only decides.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Context as _;

use crate::context::BuildContext;
use crate::dockerfile::{copies, pinned_args};
use crate::graph::{Base, ImageNode, OS_ARG};
use crate::lock::LockedImage;
use crate::platform::Platform;
use crate::{labels, project};

/// Files the xtask makes and puts into any context whose Dockerfile copies them.
pub const SANDBOX_INIT: &str = "sandbox-init";
/// The policy an image bakes: policies/<image>.yaml, put into the context under this name when
/// the Dockerfile copies it.
pub const POLICY: &str = "policy.yaml";
/// The name extra CA certificates get in root images' contexts and trust stores.
pub const EXTRA_CA_NAME: &str = "agent-sandbox-extra-ca.crt";

/// Everything one image's build is given, computed before it starts; kept in the report for
/// tools that build the same images another way (the bench).
#[derive(Debug, Clone)]
pub struct BuildPlan {
    pub name: String,
    pub context: BuildContext,
    pub build_args: BTreeMap<String, String>,
    pub labels: HashMap<String, String>,
    /// Exactly what the image is built on: the parent's id or an external reference.
    pub from: String,
    /// The platform it is built for.
    pub platform: Platform,
    /// The input hash images.lock records for that platform (the same on every machine).
    pub inputs: String,
    /// The input hash for every platform, computed without building (the lock keeps them all).
    pub all_inputs: BTreeMap<String, String>,
    /// The build key: the input hash of exactly what the engine is given (local).
    pub build_key: String,
    /// The Dockerfile's ARG defaults other than the parent's, recorded in the lock.
    pub args: BTreeMap<String, String>,
}

/// What the walk shares with every image's plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shared<'a> {
    /// The static sandbox-init and the hash of its sources, when an image copies it.
    pub sandbox_init: Option<(&'a [u8], &'a str)>,
    /// Extra CA certificates for root images.
    pub extra_ca: Option<&'a [u8]>,
    /// The OS layer's image, for root images that take one through their OS_IMAGE arg.
    pub os_base: Option<&'a str>,
    pub prefix: &'a str,
    pub revision: Option<&'a str>,
    pub platform: Platform,
}

/// The parent as the walk found it: its image id and its input hash for every platform.
#[derive(Clone, Copy, Debug)]
pub struct Parent<'a> {
    pub id: &'a str,
    pub inputs: &'a BTreeMap<String, String>,
}

/// The plan of `node`, whose parent (if it has a local one) was built or found as `parent`.
pub fn plan(node: &ImageNode, parent: Option<Parent>, shared: Shared) -> anyhow::Result<BuildPlan> {
    let name = node.name.as_str();
    let mut context = BuildContext::from_dir(&node.dir)
        .with_context(|| format!("cannot read the build context of '{name}'"))?;
    let mut build_args = BTreeMap::new();
    let from = match (&node.base, parent) {
        (Base::Local { arg, .. }, Some(parent)) => {
            build_args.insert(arg.clone(), parent.id.to_string());
            parent.id.to_string()
        }
        (Base::External { arg: Some(arg), .. }, _) if arg == OS_ARG && shared.os_base.is_some() => {
            let os = shared.os_base.expect("checked").to_string();
            build_args.insert(arg.clone(), os.clone());
            os
        }
        (Base::External { reference, .. }, _) => reference.clone(),
        (Base::Local { image, .. }, None) => anyhow::bail!("'{image}' must be built before '{name}'"),
    };
    let mut init_sources = None;
    if let Some((binary, sources)) = shared.sandbox_init
        && copies(&node.dockerfile, SANDBOX_INIT)
        && !context.files.contains_key(SANDBOX_INIT)
    {
        context.insert(SANDBOX_INIT, 0o755, binary.to_vec());
        init_sources = Some(sources);
    }
    if copies(&node.dockerfile, POLICY) && !context.files.contains_key(POLICY) {
        let policies = node.dir.parent().and_then(Path::parent).unwrap_or(Path::new(".")).join("policies");
        let file = policies.join(format!("{name}.yaml"));
        let policy = std::fs::read(&file).with_context(|| {
            format!("images/{name}/Dockerfile copies {POLICY}, but {} cannot be read", file.display())
        })?;
        context.insert(POLICY, 0o644, policy);
    }
    // The input hash the lock records: the context as the checkout has it (no extra CA,
    // sandbox-init by the hash of its sources, since its bytes depend on the toolchain), the
    // platform, and the parent by its input hash for that platform (a root by the reference its
    // Dockerfile names), not by what this engine made of it. Every platform's, since none needs
    // the engine.
    let mut checkout_args = build_args.clone();
    if let Some(arg) = node.base.arg() {
        checkout_args.remove(arg);
    }
    let mut checkout = context.clone();
    if let Some(sources) = init_sources {
        checkout.insert(SANDBOX_INIT, 0o755, format!("sources {sources}").into_bytes());
    }
    let mut all_inputs = BTreeMap::new();
    for platform in Platform::ALL {
        let checkout_from = match (&node.base, parent) {
            (Base::Local { image, .. }, Some(parent)) => {
                let inputs = parent.inputs.get(platform.name()).with_context(|| {
                    format!("'{image}' has no input hash for {platform}, so '{name}' has none")
                })?;
                format!("{image}@{inputs}")
            }
            (Base::Local { image, .. }, None) => image.clone(),
            (Base::External { reference, .. }, _) => reference.clone(),
        };
        let inputs = checkout.input_hash(&checkout_args, &format!("{checkout_from} {platform}"));
        all_inputs.insert(platform.name().to_string(), inputs);
    }
    let inputs = all_inputs[shared.platform.name()].clone();
    if let (Some(ca), Base::External { .. }) = (shared.extra_ca, &node.base) {
        inject_ca(&mut context, ca);
    }
    // Exactly what the engine is given, and the input hash its label carries: an image is
    // reused only when both match.
    let build_key = context.input_hash(&build_args, &format!("{from} {inputs}"));
    let args = pinned_args(&node.dockerfile, node.base.arg());
    let labels = image_labels(node, (&inputs, &build_key), shared);
    Ok(BuildPlan {
        name: name.to_string(),
        platform: shared.platform,
        context,
        build_args,
        labels,
        from,
        inputs,
        all_inputs,
        build_key,
        args,
    })
}

/// What differs between the lock's entry for an image and its plan, if anything.
pub fn mismatch(
    name: &str,
    entry: Option<&LockedImage>,
    plan: &BuildPlan,
    parent: &Option<String>,
) -> Option<String> {
    let Some(entry) = entry else { return Some(format!("{name}: not in the lock")) };
    for (platform, inputs) in &plan.all_inputs {
        let locked = entry.inputs.get(platform).map_or("none", |i| short(i));
        if locked != short(inputs) {
            return Some(format!(
                "{name}: inputs for {platform} changed ({locked} in the lock, {} in the checkout)",
                short(inputs)
            ));
        }
    }
    if entry.parent != *parent || entry.args != plan.args {
        return Some(format!("{name}: parent or args changed"));
    }
    None
}

/// `sha256:0123456789ab…` → `0123456789ab`
pub fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

/// Root images get the extra CA certificates: into the folder update-ca-certificates reads (so
/// every trust store built later includes them) and NODE_EXTRA_CA_CERTS. Without a bundle the
/// Dockerfile is left exactly as written.
pub fn inject_ca(context: &mut BuildContext, ca: &[u8]) {
    let target = format!("/usr/local/share/ca-certificates/{EXTRA_CA_NAME}");
    let dockerfile = context.dockerfile().unwrap_or_default().to_string();
    let injected = format!(
        "{}\n# Added by `cargo xtask build --ca-bundle`\nCOPY {EXTRA_CA_NAME} {target}\nENV NODE_EXTRA_CA_CERTS={target}\n",
        dockerfile.trim_end()
    );
    context.insert("Dockerfile", 0o644, injected.into_bytes());
    context.insert(EXTRA_CA_NAME, 0o644, ca.to_vec());
}

fn image_labels(
    node: &ImageNode,
    (inputs, build_key): (&str, &str),
    shared: Shared,
) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (labels::IMAGE.to_string(), node.name.clone()),
        (labels::INPUTS.to_string(), inputs.to_string()),
        (labels::PLATFORM.to_string(), shared.platform.name().to_string()),
        (labels::BUILD.to_string(), build_key.to_string()),
        (labels::OCI_TITLE.to_string(), format!("{}{}", project::LOCAL_PREFIX, node.name)),
        (labels::OCI_VERSION.to_string(), project::VERSION.to_string()),
        (labels::OCI_REVISION.to_string(), shared.revision.unwrap_or("unknown").to_string()),
        (labels::OCI_SOURCE.to_string(), project::SOURCE_URL.to_string()),
        (labels::OCI_LICENSES.to_string(), project::LICENSES.to_string()),
    ]);
    let base_name = match &node.base {
        Base::Local { image, .. } => {
            l.insert(labels::PARENT.to_string(), image.clone());
            format!("{}:{}", project::repository(shared.prefix, image), shared.platform.tag(project::VERSION))
        }
        Base::External { reference, .. } => reference.clone(),
    };
    l.insert(labels::OCI_BASE_NAME.to_string(), base_name);
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ImageGraph;

    /// A checkout with a root (on the OS arg), a child that copies sandbox-init and its
    /// policy, and a grandchild with a pinned version.
    fn checkout() -> (tempfile::TempDir, ImageGraph) {
        let root = tempfile::tempdir().unwrap();
        let images = root.path().join("images");
        let write = |path: &str, text: &str| {
            let file = root.path().join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        };
        write(
            "images/os/Dockerfile",
            &format!("ARG {OS_ARG}=debian:trixie-slim@sha256:{}\nFROM ${{{OS_ARG}}}\n", "a".repeat(64)),
        );
        write(
            "images/base/Dockerfile",
            "ARG BASE_IMAGE=agent-os\nFROM ${BASE_IMAGE}\nCOPY sandbox-init /usr/local/bin/\nCOPY policy.yaml /etc/p.yaml\n",
        );
        write("policies/base.yaml", "version: 1\nallow: none\n");
        write(
            "images/cli/Dockerfile",
            "ARG BASE_IMAGE=agent-base\nFROM ${BASE_IMAGE}\nARG CLI_VERSION=1.2.3\nRUN true\n",
        );
        let graph = ImageGraph::discover(&images).unwrap();
        (root, graph)
    }

    fn shared<'a>() -> Shared<'a> {
        Shared { sandbox_init: Some((b"binary-1", "sources-1")), prefix: "localhost/x", ..Shared::default() }
    }

    /// An input hash for every platform.
    fn every(inputs: &str) -> BTreeMap<String, String> {
        Platform::ALL
            .iter()
            .map(|p| (p.name().to_string(), format!("{inputs}-{}", p.debian_arch())))
            .collect()
    }

    #[test]
    fn the_ca_goes_after_the_dockerfile() {
        let mut ctx = BuildContext::default();
        ctx.insert("Dockerfile", 0o644, b"ARG OS_IMAGE=x\nFROM ${OS_IMAGE}\n".to_vec());
        let before = ctx.input_hash(&BTreeMap::new(), "x");
        inject_ca(&mut ctx, b"-----BEGIN CERTIFICATE-----\n");
        let dockerfile = ctx.dockerfile().unwrap();
        assert!(dockerfile.starts_with("ARG OS_IMAGE=x\nFROM ${OS_IMAGE}\n"), "{dockerfile}");
        assert!(dockerfile.contains(&format!("COPY {EXTRA_CA_NAME} /usr/local/share/ca-certificates/")));
        assert!(dockerfile.contains("ENV NODE_EXTRA_CA_CERTS="));
        assert!(ctx.files.contains_key(EXTRA_CA_NAME));
        assert_ne!(before, ctx.input_hash(&BTreeMap::new(), "x"));
    }

    #[test]
    fn an_extra_ca_changes_the_build_key_not_the_inputs() {
        let (_root, graph) = checkout();
        let os = graph.get("os").unwrap();
        let without = plan(os, None, shared()).unwrap();
        let with =
            plan(os, None, Shared { extra_ca: Some(b"-----BEGIN CERTIFICATE-----"), ..shared() }).unwrap();
        assert_eq!(with.inputs, without.inputs, "the lock is the same on every machine");
        assert_ne!(
            with.build_key, without.build_key,
            "an image built with the CA is not taken for one without"
        );
        assert!(with.context.files.contains_key(EXTRA_CA_NAME));
        // A child is not given the CA: it inherits it from its root.
        let base = graph.get("base").unwrap();
        let parent = Parent { id: "sha256:os", inputs: &without.all_inputs };
        let child = plan(base, Some(parent), Shared { extra_ca: Some(b"ca"), ..shared() }).unwrap();
        assert!(!child.context.files.contains_key(EXTRA_CA_NAME));
    }

    #[test]
    fn every_platform_has_its_own_inputs_and_build_key() {
        let (_root, graph) = checkout();
        let os = graph.get("os").unwrap();
        let amd64 = plan(os, None, Shared { platform: Platform::Amd64, ..shared() }).unwrap();
        let arm64 = plan(os, None, Shared { platform: Platform::Arm64, ..shared() }).unwrap();
        assert_eq!(amd64.all_inputs, arm64.all_inputs, "each walk computes every platform's");
        assert_eq!(amd64.all_inputs.len(), Platform::ALL.len());
        assert_ne!(amd64.inputs, arm64.inputs);
        assert_eq!(arm64.inputs, arm64.all_inputs["linux/arm64"]);
        assert_ne!(amd64.build_key, arm64.build_key, "an image is never reused for another platform");
        assert_eq!(arm64.labels[labels::PLATFORM], "linux/arm64");

        let base = graph.get("base").unwrap();
        let parent = Parent { id: "sha256:os", inputs: &amd64.all_inputs };
        let on_arm64 = plan(base, Some(parent), Shared { platform: Platform::Arm64, ..shared() }).unwrap();
        let tag = Platform::Arm64.tag(project::VERSION);
        assert_eq!(
            on_arm64.labels[labels::OCI_BASE_NAME],
            format!("localhost/x/agent-os:{tag}"),
            "the parent's own tag"
        );
        let mut changed = amd64.all_inputs.clone();
        changed.insert("linux/arm64".into(), "sha256:changed".into());
        let changed = plan(base, Some(Parent { inputs: &changed, ..parent }), shared()).unwrap();
        assert_eq!(changed.all_inputs["linux/amd64"], on_arm64.all_inputs["linux/amd64"]);
        assert_ne!(changed.all_inputs["linux/arm64"], on_arm64.all_inputs["linux/arm64"], "per platform");

        let only_amd64 = BTreeMap::from([("linux/amd64".to_string(), "sha256:x".to_string())]);
        let err = plan(base, Some(Parent { inputs: &only_amd64, ..parent }), shared()).unwrap_err();
        assert!(err.to_string().contains("no input hash for linux/arm64"), "{err}");
    }

    #[test]
    fn a_new_parent_id_changes_the_childs_key_and_its_inputs_only_with_the_parents() {
        let (_root, graph) = checkout();
        let base = graph.get("base").unwrap();
        let (inputs, other) = (every("sha256:in"), every("sha256:other"));
        let first = plan(base, Some(Parent { id: "sha256:one", inputs: &inputs }), shared()).unwrap();
        let rebuilt = plan(base, Some(Parent { id: "sha256:two", inputs: &inputs }), shared()).unwrap();
        assert_eq!(rebuilt.inputs, first.inputs, "the parent rebuilt from the same inputs");
        assert_ne!(rebuilt.build_key, first.build_key, "but a child of another image");
        assert_eq!(rebuilt.build_args["BASE_IMAGE"], "sha256:two");
        let changed = plan(base, Some(Parent { id: "sha256:two", inputs: &other }), shared()).unwrap();
        assert_ne!(changed.inputs, first.inputs, "the parent's inputs changed");
    }

    #[test]
    fn sandbox_init_enters_by_its_sources_hash() {
        let (_root, graph) = checkout();
        let base = graph.get("base").unwrap();
        let inputs = every("sha256:in");
        let parent = Some(Parent { id: "sha256:os", inputs: &inputs });
        let built = plan(base, parent, shared()).unwrap();
        assert_eq!(built.context.files[SANDBOX_INIT].data, b"binary-1", "the engine gets the binary");
        assert!(built.context.files.contains_key(POLICY), "and policies/base.yaml");
        let other_toolchain =
            plan(base, parent, Shared { sandbox_init: Some((b"binary-2", "sources-1")), ..shared() })
                .unwrap();
        assert_eq!(other_toolchain.inputs, built.inputs, "other bytes from the same sources");
        assert_ne!(other_toolchain.build_key, built.build_key);
        let other_sources =
            plan(base, parent, Shared { sandbox_init: Some((b"binary-1", "sources-2")), ..shared() })
                .unwrap();
        assert_ne!(other_sources.inputs, built.inputs, "changed sources");
    }

    #[test]
    fn a_pinned_arg_default_enters_args_and_the_parents_does_not() {
        let (_root, graph) = checkout();
        let cli = plan(
            graph.get("cli").unwrap(),
            Some(Parent { id: "sha256:b", inputs: &every("sha256:bi") }),
            shared(),
        )
        .unwrap();
        assert_eq!(cli.args, BTreeMap::from([("CLI_VERSION".to_string(), "1.2.3".to_string())]));
        assert_eq!(cli.labels[labels::PARENT], "base");
        let entry = LockedImage {
            parent: Some("base".into()),
            inputs: cli.all_inputs.clone(),
            args: cli.args.clone(),
            pinned: None,
        };
        assert_eq!(mismatch("cli", Some(&entry), &cli, &Some("base".into())), None);
        let old = LockedImage { args: BTreeMap::new(), ..entry };
        assert!(mismatch("cli", Some(&old), &cli, &Some("base".into())).is_some());
    }
}
