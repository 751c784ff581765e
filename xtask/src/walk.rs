//! One walk over the image graph: the scheduler. It gathers once what every image's build
//! shares (the engine, the revision, the static sandbox-init, the extra CA, the OS layer, the
//! lock), asks plan.rs what each image's build is, finds an image already built with that key
//! or builds it through the engine, parents first and siblings at once, and records tags, the
//! lock entry and the local record.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use tokio::task::JoinSet;
use xshell::Shell;

use crate::dockerfile::copies;
use crate::engine::{BuildEvent, BuildFailure, Engine};
use crate::graph::ImageGraph;
use crate::lock::{ImagesLock, LocalImage, LocalImages, LockedImage};
use crate::options::BuildOptions;
use crate::os::{OsLayer, OsSource};
use crate::plan::short;
use crate::plan::{BuildPlan, Parent, SANDBOX_INIT, Shared, mismatch, plan};
use crate::platform::Platform;
use crate::progress::Progress;
use crate::report::{BuildReport, ImageResult, Outcome};
use crate::{labels, project};

/// One walk over the graph: what every image's build needs, gathered once before the first
/// build, and the lock the walk writes.
struct Walk<'a> {
    opts: &'a BuildOptions,
    platform: Platform,
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
    /// The image id of each image built or found so far, and its input hash for every platform.
    ids: HashMap<String, String>,
    inputs: HashMap<String, BTreeMap<String, String>>,
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
        let platform = opts.platform;
        // Read first: a lock that cannot be read stops the walk before any long work.
        let old_lock = ImagesLock::read(&opts.lock_path)?;
        let mut progress = Progress::new(opts.progress, order.len());
        if platform != Platform::host() {
            progress = progress.naming(platform.name());
        }
        let progress = Arc::new(progress);
        // git takes a few milliseconds: a no-op build is short enough for that to matter, so it
        // runs beside the engine calls.
        let revision = {
            let opts = opts.clone();
            std::thread::spawn(move || opts.revision_or_git())
        };
        let extra_ca = read_ca_bundle(opts.ca_bundle.as_deref())?;
        let needs_init =
            order.iter().any(|n| copies(&graph.get(n).expect("in graph").dockerfile, SANDBOX_INIT));
        let sandbox_init = if needs_init {
            progress.note(&format!("building sandbox-init (static, {platform})"));
            let binary = project::sandbox_init_binary_for(&sh, &opts.root, platform)?;
            Some((binary, project::sandbox_init_sources_hash(&opts.root)?))
        } else {
            None
        };
        let os_base = match graph.os_reference(order) {
            Some(reference) => {
                let layer = OsLayer {
                    source: os_source,
                    bootstrap: &opts.bootstrap,
                    refresh: opts.refresh_os,
                    platform,
                };
                layer.image(reference, &engine, &sh, &progress).await?
            }
            None => None,
        };
        let mut lock = old_lock.clone();
        lock.images.retain(|name, _| graph.get(name).is_some());
        let mut local = LocalImages::read_for(&opts.lock_path, platform)?;
        local.images.retain(|name, _| graph.get(name).is_some());
        let revision = revision.join().expect("git_revision does not panic");
        Ok(Walk {
            opts,
            platform,
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

    /// Everything `name`'s build is given (plan.rs decides); its parent is built already.
    fn prepare(&self, name: &str) -> anyhow::Result<BuildPlan> {
        let node = self.graph.get(name).expect("in graph");
        let parent = node.parent().map(|p| Parent { id: &self.ids[p], inputs: &self.inputs[p] });
        let shared = Shared {
            sandbox_init: self
                .sandbox_init
                .as_ref()
                .map(|(binary, sources)| (binary.as_slice(), sources.as_str())),
            extra_ca: self.extra_ca.as_deref(),
            os_base: self.os_base.as_deref(),
            prefix: &self.opts.prefix,
            revision: self.revision.as_deref(),
            platform: self.platform,
        };
        plan(node, parent, shared)
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
        let version = self.platform.tag(project::VERSION);
        let sha = self.revision.as_ref().map(|rev| self.platform.tag(&format!("sha-{rev}")));
        for tag in std::iter::once(version.as_str()).chain(sha.as_deref()) {
            if !current_tags.contains(&format!("{repository}:{tag}")) {
                self.engine.tag(id, &repository, tag).await?;
            }
        }
        // A digest stays pinned while the inputs it was published from are the checkout's.
        let pinned = self
            .lock
            .images
            .get(name)
            .filter(|old| old.inputs == plan.all_inputs)
            .and_then(|old| old.pinned.clone());
        let parent = self.parent(name);
        let entry = LockedImage {
            parent: parent.clone(),
            inputs: plan.all_inputs.clone(),
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
            tags: vec![format!("{repository}:{version}")],
        };
        self.local.images.insert(name.to_string(), local);
        self.inputs.insert(name.to_string(), plan.all_inputs.clone());
        self.ids.insert(name.to_string(), id.to_string());
        Ok(())
    }
}

/// Held while a walk reads, merges and writes the lock.
static LOCK_WRITE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Walks the graph: builds (or, with `locked`, verifies) the selected images, parents first,
/// siblings at once up to `opts.jobs`. Failures of single images are in the report; errors are
/// for what stops the whole walk.
pub async fn run(opts: &BuildOptions) -> anyhow::Result<BuildReport> {
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
                    mismatch(&name, walk.old_lock.images.get(&name), &plan, &walk.parent(&name))
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

    if walk.local != LocalImages::read_for(&opts.lock_path, walk.platform)? {
        walk.local.write_for(&opts.lock_path, walk.platform)?;
    }
    if opts.locked {
        if !mismatches.is_empty() {
            anyhow::bail!(
                "--locked: the checkout's inputs differ from {}:\n  {}",
                opts.lock_path.display(),
                mismatches.join("\n  ")
            );
        }
    } else {
        // Only this walk's images, into the lock as it is on disk now: another platform's walk
        // of other images may have written it since this one read it (`build --platform`), and
        // in this process none writes it between this read and this write.
        let _writing = LOCK_WRITE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = ImagesLock::read(&opts.lock_path)?;
        let mut on_disk = current.clone();
        on_disk.images.retain(|name, _| walk.graph.get(name).is_some());
        for name in &order {
            if let Some(entry) = walk.lock.images.get(name) {
                on_disk.images.insert(name.clone(), entry.clone());
            }
        }
        if on_disk != current {
            on_disk.write(&opts.lock_path)?;
        }
        walk.lock = on_disk;
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

fn read_ca_bundle(path: Option<&Path>) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(path) = path else { return Ok(None) };
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read the CA bundle {}", path.display()))?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN CERTIFICATE-----") {
        anyhow::bail!("{}: not a PEM certificate bundle (no BEGIN CERTIFICATE line)", path.display());
    }
    Ok(Some(bytes))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
