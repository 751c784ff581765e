//! `cargo xtask build`: a topological walk over the image graph, siblings built in parallel,
//! images whose inputs have not changed skipped, every result tagged and written to images.lock.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use tokio::task::JoinSet;
use xshell::Shell;

use crate::context::BuildContext;
use crate::dockerfile::{copies, pinned_args};
use crate::engine::{BuildEvent, BuildFailure, Engine};
use crate::graph::{Base, ImageGraph};
use crate::lock::{ImagesLock, LocalImage, LocalImages, LockedImage};
use crate::os::{Bootstrap, OS_ARG, OsLayer, OsSource};
use crate::progress::{Progress, ProgressMode};
use crate::{labels, project};

/// Files the xtask makes and puts into any context whose Dockerfile copies them.
pub const SANDBOX_INIT: &str = "sandbox-init";
/// The policy an image bakes: policies/<image>.yaml, put into the context under this name when
/// the Dockerfile copies it.
pub const POLICY: &str = "policy.yaml";
/// The name extra CA certificates get in root images' contexts and trust stores.
pub const EXTRA_CA_NAME: &str = "agent-sandbox-extra-ca.crt";

#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The workspace: sandbox-init's sources and the git checkout.
    pub root: PathBuf,
    pub images_dir: PathBuf,
    pub lock_path: PathBuf,
    /// The images to build (with their ancestors); empty means all.
    pub images: Vec<String>,
    pub jobs: usize,
    /// `None`: mirror where mmdebstrap is installed, else registry.
    pub os_source: Option<OsSource>,
    pub bootstrap: Bootstrap,
    pub refresh_os: bool,
    pub prefix: String,
    pub ca_bundle: Option<PathBuf>,
    /// Verify only: fail if anything would differ from the lock.
    pub locked: bool,
    pub progress: ProgressMode,
}

impl BuildOptions {
    /// Defaults, overridden by the variables `cargo xtask test` sets (see [`Self::export_env`]).
    pub fn from_env(root: &Path) -> anyhow::Result<BuildOptions> {
        let mut opts = BuildOptions::new(root);
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(source) = var(project::OS_SOURCE_ENV) {
            opts.os_source = Some(<OsSource as clap::ValueEnum>::from_str(&source, true).map_err(|_| {
                anyhow::anyhow!("{}={source}: expected mirror or registry", project::OS_SOURCE_ENV)
            })?);
        }
        if let Some(mirror) = var(crate::os::MIRROR_ENV) {
            opts.bootstrap.mirror = mirror;
        }
        if let Some(security) = var(crate::os::SECURITY_MIRROR_ENV) {
            opts.bootstrap.security_mirror = (security != "none").then_some(security);
        }
        if let Some(prefix) = var(project::PREFIX_ENV) {
            opts.prefix = prefix;
        }
        opts.ca_bundle = var(project::CA_BUNDLE_ENV).map(PathBuf::from);
        opts.progress = ProgressMode::Plain;
        Ok(opts)
    }

    /// The variables [`Self::from_env`] reads, for a child process.
    pub fn export_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            (crate::os::MIRROR_ENV, self.bootstrap.mirror.clone()),
            (
                crate::os::SECURITY_MIRROR_ENV,
                self.bootstrap.security_mirror.clone().unwrap_or_else(|| "none".into()),
            ),
            (project::PREFIX_ENV, self.prefix.clone()),
        ];
        if let Some(source) = self.os_source {
            vars.push((project::OS_SOURCE_ENV, source.to_string()));
        }
        if let Some(ca) = &self.ca_bundle {
            vars.push((project::CA_BUNDLE_ENV, ca.display().to_string()));
        }
        vars
    }

    pub fn new(root: &Path) -> BuildOptions {
        BuildOptions {
            root: root.to_path_buf(),
            images_dir: root.join("images"),
            lock_path: root.join(crate::lock::FILE_NAME),
            images: Vec::new(),
            jobs: 2,
            os_source: None,
            bootstrap: Bootstrap::default(),
            refresh_os: false,
            prefix: project::DEFAULT_PREFIX.to_string(),
            ca_bundle: None,
            locked: false,
            progress: ProgressMode::Auto,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Built {
        id: String,
        seconds: f64,
    },
    /// An image with the same input hash existed.
    UpToDate {
        id: String,
    },
    Failed {
        message: String,
    },
    /// Not attempted because an ancestor failed (named).
    NotBuilt {
        because: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ImageResult {
    pub name: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone)]
pub struct BuildReport {
    /// In build order.
    pub results: Vec<ImageResult>,
    /// What each image's build was given (or would have been), in build order.
    pub plans: Vec<Arc<BuildPlan>>,
    pub lock: ImagesLock,
    /// What this machine's engine holds for the lock (images.local.json).
    pub local: LocalImages,
    pub os_source: OsSource,
}

impl BuildReport {
    fn names(&self, pick: impl Fn(&Outcome) -> bool) -> Vec<&str> {
        self.results.iter().filter(|r| pick(&r.outcome)).map(|r| r.name.as_str()).collect()
    }

    pub fn built(&self) -> Vec<&str> {
        self.names(|o| matches!(o, Outcome::Built { .. }))
    }

    pub fn up_to_date(&self) -> Vec<&str> {
        self.names(|o| matches!(o, Outcome::UpToDate { .. }))
    }

    pub fn id(&self, name: &str) -> Option<&str> {
        self.results.iter().find(|r| r.name == name).and_then(|r| match &r.outcome {
            Outcome::Built { id, .. } | Outcome::UpToDate { id } => Some(id.as_str()),
            _ => None,
        })
    }

    /// An error naming every image that failed and every one left unbuilt because of it.
    pub fn ensure_success(&self) -> anyhow::Result<()> {
        let mut failed = Vec::new();
        let mut skipped = Vec::new();
        for r in &self.results {
            match &r.outcome {
                Outcome::Failed { .. } => failed.push(r.name.as_str()),
                Outcome::NotBuilt { because } => skipped.push(format!("{} (needs {because})", r.name)),
                _ => {}
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        let mut msg = format!("cannot build {}", quoted(&failed));
        if !skipped.is_empty() {
            msg.push_str(&format!("; not built because of it: {}", skipped.join(", ")));
        }
        Err(anyhow::anyhow!(msg))
    }
}

fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

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
    /// The input hash images.lock records (the same on every machine).
    pub inputs: String,
    /// The build key: the input hash of exactly what the engine is given (local).
    pub build_key: String,
    /// The Dockerfile's ARG defaults other than the parent's, recorded in the lock.
    pub args: BTreeMap<String, String>,
}

/// One walk over the graph: what every image's build needs, gathered once before the first
/// build, and the lock the walk writes.
struct Walk<'a> {
    opts: &'a BuildOptions,
    engine: Engine,
    progress: Arc<Progress>,
    graph: ImageGraph,
    revision: Option<String>,
    /// The static sandbox-init, when an image copies it, and the hash of its sources.
    sandbox_init: Option<(Vec<u8>, String)>,
    extra_ca: Option<Vec<u8>>,
    /// The OS layer's image, for root images that take one through their OS_IMAGE arg.
    os_base: Option<String>,
    old_lock: ImagesLock,
    lock: ImagesLock,
    local: LocalImages,
    /// The image id and input hash of each image built or found so far.
    ids: HashMap<String, String>,
    inputs: HashMap<String, String>,
}

impl<'a> Walk<'a> {
    async fn start(
        opts: &'a BuildOptions,
        graph: ImageGraph,
        order: &[String],
        os_source: OsSource,
    ) -> anyhow::Result<Walk<'a>> {
        let engine = Engine::connect().await?;
        let sh = Shell::new()?;
        let progress = Arc::new(Progress::new(opts.progress, order.len()));
        // git takes a few milliseconds: a no-op build is short enough for that to matter, so it
        // runs beside the engine calls.
        let revision = {
            let root = opts.root.clone();
            std::thread::spawn(move || Shell::new().ok().and_then(|sh| project::git_revision(&sh, &root)))
        };
        let extra_ca = read_ca_bundle(opts.ca_bundle.as_deref())?;
        let needs_init =
            order.iter().any(|n| copies(&graph.get(n).expect("in graph").dockerfile, SANDBOX_INIT));
        let sandbox_init = if needs_init {
            progress.note("building sandbox-init (static)");
            let binary = project::sandbox_init_binary(&sh, &opts.root)?;
            Some((binary, project::sandbox_init_sources_hash(&opts.root)?))
        } else {
            None
        };
        let os_base = match graph.os_reference(order) {
            Some(reference) => {
                let layer =
                    OsLayer { source: os_source, bootstrap: &opts.bootstrap, refresh: opts.refresh_os };
                layer.image(reference, &engine, &sh, &progress).await?
            }
            None => None,
        };
        let old_lock = ImagesLock::read(&opts.lock_path)?;
        let mut lock = old_lock.clone();
        lock.images.retain(|name, _| graph.get(name).is_some());
        let mut local = LocalImages::read(&opts.lock_path)?;
        local.images.retain(|name, _| graph.get(name).is_some());
        let revision = revision.join().expect("git_revision does not panic");
        Ok(Walk {
            opts,
            engine,
            progress,
            graph,
            revision,
            sandbox_init,
            extra_ca,
            os_base,
            old_lock,
            lock,
            local,
            ids: HashMap::new(),
            inputs: HashMap::new(),
        })
    }

    fn parent(&self, name: &str) -> Option<String> {
        self.graph.get(name).and_then(|n| n.parent()).map(str::to_string)
    }

    /// Everything `name`'s build is given: its context (plus what the xtask adds), build args,
    /// labels and input hash. Its parent is built already.
    fn prepare(&self, name: &str) -> anyhow::Result<BuildPlan> {
        let node = self.graph.get(name).expect("in graph");
        let mut context = BuildContext::from_dir(&node.dir)
            .with_context(|| format!("cannot read the build context of '{name}'"))?;
        let mut build_args = BTreeMap::new();
        let parent_id = node.parent().map(|p| self.ids[p].as_str());
        let from = match (&node.base, parent_id) {
            (Base::Local { arg, .. }, Some(parent_id)) => {
                build_args.insert(arg.clone(), parent_id.to_string());
                parent_id.to_string()
            }
            (Base::External { arg: Some(arg), .. }, _) if arg == OS_ARG && self.os_base.is_some() => {
                let os = self.os_base.clone().expect("checked");
                build_args.insert(arg.clone(), os.clone());
                os
            }
            (Base::External { reference, .. }, _) => reference.clone(),
            (Base::Local { image, .. }, None) => unreachable!("'{image}' is built before '{name}'"),
        };
        let mut init_sources = None;
        if let Some((binary, sources)) = &self.sandbox_init
            && copies(&node.dockerfile, SANDBOX_INIT)
            && !context.files.contains_key(SANDBOX_INIT)
        {
            context.insert(SANDBOX_INIT, 0o755, binary.clone());
            init_sources = Some(sources);
        }
        if copies(&node.dockerfile, POLICY) && !context.files.contains_key(POLICY) {
            let policies =
                node.dir.parent().and_then(Path::parent).unwrap_or(Path::new(".")).join("policies");
            let file = policies.join(format!("{name}.yaml"));
            let policy = std::fs::read(&file).with_context(|| {
                format!("images/{name}/Dockerfile copies {POLICY}, but {} cannot be read", file.display())
            })?;
            context.insert(POLICY, 0o644, policy);
        }
        // The input hash the lock records: the context as the checkout has it (no extra CA,
        // sandbox-init's sources for its binary), and the parent by its input hash (a root by the reference its Dockerfile names), not
        // by what this engine made of it.
        let mut checkout_args = build_args.clone();
        if let Some(arg) = node.base.arg() {
            checkout_args.remove(arg);
        }
        let checkout_from = match &node.base {
            Base::Local { image, .. } => format!("{image}@{}", self.inputs[image]),
            Base::External { reference, .. } => reference.clone(),
        };
        // sandbox-init by its sources: its bytes depend on the toolchain that built it.
        let inputs = match init_sources {
            Some(sources) => {
                let mut checkout = context.clone();
                checkout.insert(SANDBOX_INIT, 0o755, format!("sources {sources}").into_bytes());
                checkout.input_hash(&checkout_args, &checkout_from)
            }
            None => context.input_hash(&checkout_args, &checkout_from),
        };
        if let (Some(ca), Base::External { .. }) = (&self.extra_ca, &node.base) {
            inject_ca(&mut context, ca);
        }
        // Exactly what the engine is given, and the input hash its label carries: an image is
        // reused only when both match.
        let build_key = context.input_hash(&build_args, &format!("{from} {inputs}"));
        let args = pinned_args(&node.dockerfile, node.base.arg());
        let labels = image_labels(self.opts, node, (&inputs, &build_key), self.revision.as_deref());
        Ok(BuildPlan { name: name.to_string(), context, build_args, labels, from, inputs, build_key, args })
    }

    /// Tags image `id`, built or found for `plan`, and records it in the lock. `current_tags`:
    /// the tags it has already.
    async fn record(&mut self, current_tags: &[String], plan: &BuildPlan, id: &str) -> anyhow::Result<()> {
        let name = plan.name.as_str();
        let repository = project::repository(&self.opts.prefix, name);
        let inputs_tag = project::inputs_tag(name, &plan.build_key);
        if !current_tags.contains(&inputs_tag) {
            let (repository, tag) = inputs_tag.rsplit_once(':').expect("a tag");
            self.engine.tag(id, repository, tag).await?;
        }
        let sha = self.revision.as_ref().map(|rev| format!("sha-{rev}"));
        for tag in std::iter::once(project::VERSION).chain(sha.as_deref()) {
            if !current_tags.contains(&format!("{repository}:{tag}")) {
                self.engine.tag(id, &repository, tag).await?;
            }
        }
        // A digest stays pinned while the inputs it was published from are the checkout's.
        let pinned = self
            .lock
            .images
            .get(name)
            .filter(|old| old.inputs == plan.inputs)
            .and_then(|old| old.pinned.clone());
        let parent = self.parent(name);
        let entry = LockedImage {
            parent: parent.clone(),
            inputs: plan.inputs.clone(),
            args: plan.args.clone(),
            pinned,
        };
        self.lock.images.insert(name.to_string(), entry);
        let local = LocalImage {
            id: id.to_string(),
            from: plan.from.clone(),
            build: plan.build_key.clone(),
            // Every root of a walk with a CA gets it, and every image of the walk is built on one.
            extra_ca: self.extra_ca.is_some(),
            tags: vec![format!("{repository}:{}", project::VERSION)],
        };
        self.local.images.insert(name.to_string(), local);
        self.inputs.insert(name.to_string(), plan.inputs.clone());
        self.ids.insert(name.to_string(), id.to_string());
        Ok(())
    }
}

impl crate::flags::CommonBuildFlags {
    /// The build options these flags set.
    pub fn apply(&self, opts: &mut BuildOptions) {
        opts.jobs = self.jobs;
        opts.os_source = self.os_source;
        opts.bootstrap.mirror = self.debian_mirror.clone();
        opts.bootstrap.security_mirror =
            (self.debian_security_mirror != "none").then(|| self.debian_security_mirror.clone());
        opts.refresh_os = self.refresh_os;
        opts.prefix = self.prefix.clone();
        opts.ca_bundle = self.ca_bundle.clone();
        opts.progress = self.progress;
    }
}

impl crate::flags::BuildFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        let mut opts = BuildOptions::new(root);
        self.common.apply(&mut opts);
        opts.images = self.images;
        opts.locked = self.locked;
        let report = build(&opts).await?;
        report.ensure_success()?;
        eprintln!(
            "{} images: {} built, {} up to date (OS layer: {}); {} {}",
            report.results.len(),
            report.built().len(),
            report.up_to_date().len(),
            report.os_source,
            if opts.locked { "verified against" } else { "recorded in" },
            opts.lock_path.display()
        );
        Ok(())
    }
}

/// Builds (or, with `locked`, verifies) the selected images. Failures of single images are in
/// the report (see [`BuildReport::ensure_success`]); errors are for what stops the whole walk.
pub async fn build(opts: &BuildOptions) -> anyhow::Result<BuildReport> {
    let graph = ImageGraph::discover(&opts.images_dir)?;
    let order: Vec<String> = graph.closure(&opts.images)?.into_iter().map(String::from).collect();
    let os_source = opts.os_source.unwrap_or_else(OsSource::detect);
    let mut walk = Walk::start(opts, graph, &order, os_source).await?;
    let progress = walk.progress.clone();

    let mut results: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut pending: Vec<String> = order.clone();
    let mut running: JoinSet<(Arc<BuildPlan>, Result<String, BuildFailure>, f64)> = JoinSet::new();
    let mut mismatches = Vec::new();
    let mut plans = Vec::new();

    loop {
        // Start everything whose parent is done, up to the bound.
        let mut i = 0;
        while i < pending.len() && running.len() < opts.jobs.max(1) {
            let name = pending[i].clone();
            if let Some(parent) = walk.parent(&name) {
                match results.get(&parent) {
                    None => {
                        i += 1;
                        continue;
                    }
                    Some(Outcome::Failed { .. }) | Some(Outcome::NotBuilt { .. }) => {
                        let because = match &results[&parent] {
                            Outcome::NotBuilt { because } => because.clone(),
                            _ => parent.clone(),
                        };
                        progress.finish(&name, &format!("not built: needs '{because}'"));
                        results.insert(name.clone(), Outcome::NotBuilt { because });
                        pending.remove(i);
                        continue;
                    }
                    Some(_) => {}
                }
            }
            pending.remove(i);
            let plan = Arc::new(walk.prepare(&name)?);
            plans.push(plan.clone());
            // Found by the inputs tag, not by the label alone: labels are inherited, so every
            // image built FROM ours carries the same values.
            if opts.locked
                && let Some(mismatch) =
                    describe_mismatch(&name, walk.old_lock.images.get(&name), &plan, &walk.parent(&name))
            {
                progress.finish(&name, &format!("not built: {mismatch} (--locked)"));
                results.insert(name, Outcome::Failed { message: mismatch.clone() });
                mismatches.push(mismatch);
                continue;
            }
            let existing = walk
                .engine
                .find(&project::inputs_tag(&name, &plan.build_key))
                .await?
                .filter(|image| image.labels.get(labels::BUILD) == Some(&plan.build_key));
            if let Some(image) = existing {
                progress.finish(&name, &format!("up to date ({})", short(&image.id)));
                walk.record(&image.tags, &plan, &image.id).await?;
                results.insert(name, Outcome::UpToDate { id: image.id });
                continue;
            }
            progress.state(&name, "building");
            let engine = walk.engine.clone();
            let progress = progress.clone();
            running.spawn(async move {
                let started = Instant::now();
                let tar = plan.context.to_tar();
                let args: HashMap<String, String> = plan.build_args.clone().into_iter().collect();
                let result = engine
                    .build(tar, &args, &plan.labels, |event| {
                        if let BuildEvent::Step(step) = event {
                            progress.state(&plan.name, &step);
                        }
                    })
                    .await;
                (plan, result, started.elapsed().as_secs_f64())
            });
        }
        let Some(joined) = running.join_next().await else { break };
        let (plan, result, seconds) = joined.context("a build task panicked")?;
        let name = plan.name.clone();
        match result {
            Ok(id) => {
                progress.finish(&name, &format!("built {} in {seconds:.1}s", short(&id)));
                walk.record(&[], &plan, &id).await?;
                results.insert(name, Outcome::Built { id, seconds });
            }
            Err(failure) => {
                progress.finish(&name, &format!("FAILED after {seconds:.1}s: {}", failure.message));
                progress.note(&failure_report(&name, &failure));
                results.insert(name, Outcome::Failed { message: failure.message });
            }
        }
    }
    progress.done();

    if walk.local != LocalImages::read(&opts.lock_path)? {
        walk.local.write(&opts.lock_path)?;
    }
    if opts.locked {
        if !mismatches.is_empty() {
            anyhow::bail!(
                "--locked: the checkout's inputs differ from {}:\n  {}",
                opts.lock_path.display(),
                mismatches.join("\n  ")
            );
        }
    } else if walk.lock != walk.old_lock {
        walk.lock.write(&opts.lock_path)?;
    }
    let results = order
        .iter()
        .map(|name| ImageResult {
            name: name.clone(),
            outcome: results.remove(name).expect("every image has an outcome"),
        })
        .collect();
    Ok(BuildReport { results, plans, lock: walk.lock, local: walk.local, os_source })
}

/// What differs between the lock's entry for `name` and the checkout's, if anything.
fn describe_mismatch(
    name: &str,
    entry: Option<&LockedImage>,
    plan: &BuildPlan,
    parent: &Option<String>,
) -> Option<String> {
    let Some(entry) = entry else { return Some(format!("{name}: not in the lock")) };
    if entry.inputs != plan.inputs {
        return Some(format!(
            "{name}: inputs changed ({} in the lock, {} in the checkout)",
            short(&entry.inputs),
            short(&plan.inputs)
        ));
    }
    if entry.parent != *parent || entry.args != plan.args {
        return Some(format!("{name}: parent or args changed"));
    }
    None
}

/// Root images get the extra CA certificates: into the folder update-ca-certificates reads (so
/// every trust store built later includes them) and NODE_EXTRA_CA_CERTS. Without a bundle the
/// Dockerfile is left exactly as written.
fn inject_ca(context: &mut BuildContext, ca: &[u8]) {
    let target = format!("/usr/local/share/ca-certificates/{EXTRA_CA_NAME}");
    let dockerfile = context.dockerfile().unwrap_or_default().to_string();
    let injected = format!(
        "{}\n# Added by `cargo xtask build --ca-bundle`\nCOPY {EXTRA_CA_NAME} {target}\nENV NODE_EXTRA_CA_CERTS={target}\n",
        dockerfile.trim_end()
    );
    context.insert("Dockerfile", 0o644, injected.into_bytes());
    context.insert(EXTRA_CA_NAME, 0o644, ca.to_vec());
}

fn read_ca_bundle(path: Option<&Path>) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(path) = path else { return Ok(None) };
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read the CA bundle {}", path.display()))?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN CERTIFICATE-----") {
        anyhow::bail!("{}: not a PEM certificate bundle (no BEGIN CERTIFICATE line)", path.display());
    }
    Ok(Some(bytes))
}

fn image_labels(
    opts: &BuildOptions,
    node: &crate::graph::ImageNode,
    (inputs, build_key): (&str, &str),
    revision: Option<&str>,
) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (labels::IMAGE.to_string(), node.name.clone()),
        (labels::INPUTS.to_string(), inputs.to_string()),
        (labels::BUILD.to_string(), build_key.to_string()),
        (labels::OCI_TITLE.to_string(), format!("{}{}", crate::project::LOCAL_PREFIX, node.name)),
        (labels::OCI_VERSION.to_string(), project::VERSION.to_string()),
        (labels::OCI_REVISION.to_string(), revision.unwrap_or("unknown").to_string()),
        (labels::OCI_SOURCE.to_string(), project::SOURCE_URL.to_string()),
        (labels::OCI_LICENSES.to_string(), project::LICENSES.to_string()),
    ]);
    let base_name = match &node.base {
        Base::Local { image, .. } => {
            l.insert(labels::PARENT.to_string(), image.clone());
            format!("{}:{}", project::repository(&opts.prefix, image), project::VERSION)
        }
        Base::External { reference, .. } => reference.clone(),
    };
    l.insert(labels::OCI_BASE_NAME.to_string(), base_name);
    l
}

fn failure_report(name: &str, failure: &BuildFailure) -> String {
    let mut out = format!("error: cannot build '{name}'");
    if let Some(step) = &failure.step {
        out.push_str(&format!("\n  at {step}"));
    }
    out.push_str(&format!("\n  {}", failure.message.trim()));
    if !failure.tail.is_empty() {
        out.push_str("\n  last lines from the engine:");
        for line in &failure.tail {
            out.push_str(&format!("\n    {line}"));
        }
    }
    out
}

/// `sha256:0123456789ab…` → `0123456789ab`
pub fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_goes_after_the_dockerfile_and_changes_the_inputs() {
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
    fn a_ca_bundle_must_be_pem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "not a certificate").unwrap();
        let err = read_ca_bundle(Some(&path)).unwrap_err().to_string();
        assert!(err.ends_with("not a PEM certificate bundle (no BEGIN CERTIFICATE line)"), "{err}");
        assert!(read_ca_bundle(Some(&dir.path().join("missing"))).is_err());
        assert_eq!(read_ca_bundle(None).unwrap(), None);
    }

    #[test]
    fn short_keeps_twelve_hex_digits() {
        assert_eq!(short("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
    }
}
