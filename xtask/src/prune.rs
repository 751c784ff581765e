//! `cargo xtask prune`: remove the project's images that neither the local record of images.lock
//! (images.local.json) nor a version tag names.
//!
//! Every build that changes an input leaves the previous image behind, still tagged
//! `:sha-<old commit>` and `inputs:<name>-<old hash>`; after a few sandbox-init changes the engine
//! holds several generations of every agent image (gigabytes each). Kept: the images the local record
//! records and the latest build of each (the one the version tag names). Only what the build made is
//! touched: images carrying the project's inputs label, and of their tags only the prefix's
//! `agent-*` tags and the inputs tags. An image that keeps another tag (a registry tag, a tag of
//! the user's) or that a container uses stays. Nothing is forced.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::{Engine, ListedImage};
use crate::platform::Platform;
use crate::{labels, lock::LocalImages, project};

impl crate::flags::PruneFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        let opts = PruneOptions {
            lock_path: root.join(crate::lock::FILE_NAME),
            prefix: self.prefix,
            dry_run: self.dry_run,
            grace: GRACE,
        };
        let report = prune(&opts, |image, outcome| eprintln!("{}", describe(image, outcome))).await?;
        eprintln!("{}", report.summary(opts.dry_run));
        // The static builds' target folders in the user's cache (kept.rs) of checkouts that are gone.
        for (dir, bytes) in crate::kept::prune_targets(opts.dry_run) {
            let verb = if opts.dry_run { "would remove" } else { "removed" };
            eprintln!("{verb} {} ({} MB): its checkout is gone", dir.display(), bytes / 1_000_000);
        }
        Ok(())
    }
}

/// Images that no prefix tag claims (only inputs tags, or none) are taken only when older than
/// this: a build in progress tags its image a moment after the engine made it.
pub const GRACE: Duration = Duration::from_secs(10 * 60);

#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// The images the local record of this lock names are kept.
    pub lock_path: PathBuf,
    pub prefix: String,
    pub dry_run: bool,
    pub grace: Duration,
}

/// What to do with one superseded image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseded {
    pub id: String,
    /// Its graph node (the image label), `-` when unlabelled.
    pub name: String,
    /// The tags the build made, to remove.
    pub ours: Vec<String>,
    /// Other tags: the image stays while they exist.
    pub others: Vec<String>,
    pub size: u64,
    pub created: i64,
}

impl Superseded {
    /// Whether removing our tags removes the image.
    pub fn goes(&self) -> bool {
        self.others.is_empty()
    }
}

/// The superseded images among `images`, newest first (children before their parents).
pub fn plan(
    images: &[ListedImage],
    keep: &HashSet<String>,
    prefix: &str,
    now: i64,
    grace: Duration,
) -> Vec<Superseded> {
    let prefix_repo = format!("{}/{}", prefix.trim_end_matches('/'), crate::project::LOCAL_PREFIX);
    let inputs_repo = format!("{}:", project::INPUTS_REPOSITORY);
    let version_tags: Vec<String> =
        Platform::ALL.iter().map(|p| format!(":{}", p.tag(project::VERSION))).collect();
    // The version tag (one per platform) moves to every new build of an image: it names the
    // latest, whichever checkout made it, even when this checkout's lock is older.
    let latest = |image: &ListedImage| {
        image.tags.iter().any(|t| t.starts_with(&prefix_repo) && version_tags.iter().any(|v| t.ends_with(v)))
    };
    let bench_repo = format!("{}/", project::BENCH_REPOSITORY);
    // What `bench build` left behind: its tags go from any image of ours, kept or not.
    let bench_only =
        images.iter().filter(|image| image.labels.contains_key(labels::INPUTS)).filter_map(|image| {
            let (bench, others): (Vec<&String>, Vec<&String>) =
                image.tags.iter().partition(|t| t.starts_with(&bench_repo));
            let kept = keep.contains(&image.id)
                || latest(image)
                || others.iter().any(|t| !t.starts_with(&inputs_repo));
            (!bench.is_empty() && kept).then(|| Superseded {
                id: image.id.clone(),
                name: image.labels.get(labels::IMAGE).cloned().unwrap_or_else(|| "-".into()),
                ours: bench.into_iter().cloned().collect(),
                others: others.into_iter().cloned().collect(),
                size: image.size,
                created: image.created,
            })
        });
    let mut out: Vec<Superseded> = images
        .iter()
        .filter(|image| {
            image.labels.contains_key(labels::INPUTS) && !keep.contains(&image.id) && !latest(image)
        })
        .filter_map(|image| {
            let (bench, tags): (Vec<&String>, Vec<&String>) =
                image.tags.iter().partition(|t| t.starts_with(&bench_repo));
            let (prefixed, rest): (Vec<&String>, Vec<&String>) =
                tags.into_iter().partition(|t| t.starts_with(&prefix_repo));
            let prefixed: Vec<&String> = prefixed.into_iter().chain(bench).collect();
            let (inputs, others): (Vec<&String>, Vec<&String>) =
                rest.into_iter().partition(|t| t.starts_with(&inputs_repo));
            if prefixed.is_empty() {
                // Another prefix's image (a scratch copy's, a registry's): not ours to judge.
                // Unless only the inputs index names it (what a scratch copy leaves), and it is
                // older than the grace: a build tags its image a moment after the engine made it.
                let young = now.saturating_sub(image.created) < grace.as_secs() as i64;
                if !others.is_empty() || young {
                    return None;
                }
            }
            // The inputs tags are the build's index: they go only with the image itself, and
            // first, so that an image the engine refuses to remove keeps the prefix tag by which
            // the next prune finds it.
            let inputs = if others.is_empty() { inputs } else { Vec::new() };
            let ours = inputs.into_iter().chain(prefixed).cloned().collect();
            Some(Superseded {
                id: image.id.clone(),
                name: image.labels.get(labels::IMAGE).cloned().unwrap_or_else(|| "-".into()),
                ours,
                others: others.into_iter().cloned().collect(),
                size: image.size,
                created: image.created,
            })
        })
        .collect();
    let listed: HashSet<String> = out.iter().map(|s| s.id.clone()).collect();
    out.extend(bench_only.filter(|s| !listed.contains(&s.id)));
    out.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
    out
}

/// What happened to one superseded image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Removed,
    /// Untagged from the project; other tags keep it.
    Untagged,
    /// Still there, and why: a container uses it, the engine refused, or images built on it
    /// keep it (untagged).
    Kept(String),
    WouldRemove,
    WouldUntag,
}

#[derive(Debug, Default)]
pub struct PruneReport {
    pub images: Vec<(Superseded, Outcome)>,
    /// Free bytes under the engine's data directory before and after, when it is on this host.
    pub free: Option<(u64, u64)>,
    pub root_dir: Option<PathBuf>,
}

impl PruneReport {
    /// What happened to the image with this id, if it was superseded.
    pub fn outcome(&self, id: &str) -> Option<&Outcome> {
        self.images.iter().find(|(image, _)| image.id == id).map(|(_, outcome)| outcome)
    }

    pub fn summary(&self, dry_run: bool) -> String {
        let count = |o: &Outcome| self.images.iter().filter(|(_, x)| x == o).count();
        let mut s = if dry_run {
            format!(
                "would remove {} superseded images and untag {} (nothing was changed)",
                count(&Outcome::WouldRemove),
                count(&Outcome::WouldUntag)
            )
        } else {
            let kept = self.images.iter().filter(|(_, o)| matches!(o, Outcome::Kept(_))).count();
            format!(
                "removed {} superseded images, untagged {}, kept {kept}",
                count(&Outcome::Removed),
                count(&Outcome::Untagged)
            )
        };
        match (self.free, &self.root_dir) {
            (Some((before, _)), Some(dir)) if dry_run => {
                s.push_str(&format!("; free under {}: {}", dir.display(), gigabytes(before)))
            }
            (Some((before, after)), Some(dir)) => s.push_str(&format!(
                "; free under {}: {} → {}",
                dir.display(),
                gigabytes(before),
                gigabytes(after)
            )),
            _ => {}
        }
        s
    }
}

pub fn gigabytes(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// The line printed for one image.
pub fn describe(image: &Superseded, outcome: &Outcome) -> String {
    let id = crate::build::short(&image.id).chars().take(12).collect::<String>();
    let what = format!("{} {id} ({:.0} MB)", image.name, image.size as f64 / 1e6);
    let tags = if image.ours.is_empty() { "untagged".to_string() } else { image.ours.join(", ") };
    match outcome {
        Outcome::Removed => format!("removed {what}: {tags}"),
        Outcome::WouldRemove => format!("would remove {what}: {tags}"),
        Outcome::Untagged => format!("untagged {what}: {tags}; kept for {}", image.others.join(", ")),
        Outcome::WouldUntag => format!("would untag {what}: {tags}; kept for {}", image.others.join(", ")),
        Outcome::Kept(why) => format!("kept {what}: {why}"),
    }
}

pub async fn prune(
    opts: &PruneOptions,
    mut on_image: impl FnMut(&Superseded, &Outcome),
) -> anyhow::Result<PruneReport> {
    let mut local = LocalImages::default();
    for platform in Platform::ALL {
        let record = LocalImages::read_for(&opts.lock_path, platform)?;
        local
            .images
            .extend(record.images.into_iter().map(|(name, image)| (format!("{name} {platform}"), image)));
    }
    if local.images.is_empty() {
        // A fresh checkout: nothing recorded, so only the version tags (the latest of each
        // image) say what stays.
        eprintln!(
            "prune: {} records no image yet: keeping the images the version tags name",
            crate::lock::local_path(&opts.lock_path).display()
        );
    }
    let keep: HashSet<String> = local.images.values().map(|entry| entry.id.clone()).collect();
    let engine = Engine::connect().await?;
    let root_dir = engine.local_root_dir().await;
    let free = |dir: &Option<PathBuf>| dir.as_deref().and_then(free_bytes);
    let before = free(&root_dir);
    let images = engine.images_with_label(labels::INPUTS).await?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let mut report = PruneReport { root_dir: root_dir.clone(), ..Default::default() };
    let used = engine.images_in_use().await?;
    for image in plan(&images, &keep, &opts.prefix, now, opts.grace) {
        let outcome = match (opts.dry_run, image.goes(), used.get(&image.id)) {
            (_, _, Some(container)) => Outcome::Kept(format!("container {container} uses it")),
            (true, true, None) => Outcome::WouldRemove,
            (true, false, None) => Outcome::WouldUntag,
            (false, goes, None) => match remove(&engine, &image).await {
                Ok(true) => Outcome::Removed,
                Ok(false) if goes => Outcome::Kept("untagged; images built on it keep it".into()),
                Ok(false) => Outcome::Untagged,
                Err(why) => Outcome::Kept(why),
            },
        };
        on_image(&image, &outcome);
        report.images.push((image, outcome));
    }
    report.free = before.zip(free(&root_dir));
    Ok(report)
}

/// Removes our tags (the last one takes the image and its untagged build steps), or the image
/// itself when it has none; whether the image is gone. Never forced: the engine refuses while a
/// container uses it.
async fn remove(engine: &Engine, image: &Superseded) -> Result<bool, String> {
    if image.ours.is_empty() {
        return engine.remove_image(&image.id).await.map_err(|e| e.to_string());
    }
    let mut gone = false;
    for tag in &image.ours {
        gone |= engine.remove_image(tag).await.map_err(|e| e.to_string())?;
    }
    Ok(gone)
}

fn free_bytes(dir: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    Some(stat.f_bavail * stat.f_frsize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const NOW: i64 = 1_000_000;

    fn image(id: &str, name: &str, tags: &[&str], age: i64) -> ListedImage {
        ListedImage {
            id: id.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            labels: HashMap::from([
                (labels::IMAGE.to_string(), name.to_string()),
                (labels::INPUTS.to_string(), format!("sha256:{id}")),
            ]),
            size: 100,
            created: NOW - age,
        }
    }

    fn run(images: &[ListedImage], keep: &[&str]) -> Vec<(String, Vec<String>, bool)> {
        let keep = keep.iter().map(|k| k.to_string()).collect();
        plan(images, &keep, "localhost/agent-sandbox", NOW, GRACE)
            .into_iter()
            .map(|s| (s.id.clone(), s.ours.clone(), s.goes()))
            .collect()
    }

    #[test]
    fn what_the_lock_names_stays_and_older_generations_go_newest_first() {
        let images = [
            image(
                "current",
                "shell",
                &["localhost/agent-sandbox/agent-shell:0.1.0", "localhost/agent-sandbox/inputs:shell-c"],
                5,
            ),
            image(
                "old",
                "shell",
                &[
                    "localhost/agent-sandbox/agent-shell:sha-0a8f9309fb64",
                    "localhost/agent-sandbox/inputs:shell-o",
                ],
                3600,
            ),
            image("older", "base", &["localhost/agent-sandbox/agent-base:sha-a223551a0513"], 7200),
        ];
        assert_eq!(run(&images, &["current"]), run(&images, &[]), "the version tag alone keeps the latest");
        assert_eq!(
            run(&images, &["current"]),
            vec![
                (
                    "old".into(),
                    vec![
                        "localhost/agent-sandbox/inputs:shell-o".into(),
                        "localhost/agent-sandbox/agent-shell:sha-0a8f9309fb64".into()
                    ],
                    true
                ),
                ("older".into(), vec!["localhost/agent-sandbox/agent-base:sha-a223551a0513".into()], true),
            ]
        );
    }

    #[test]
    fn the_latest_of_each_platform_stays() {
        let other = if Platform::host() == Platform::Amd64 { Platform::Arm64 } else { Platform::Amd64 };
        let (version, sha) = (other.tag("0.1.0"), other.tag("sha-0a8f9309fb64"));
        let images = [
            image("host", "shell", &["localhost/agent-sandbox/agent-shell:0.1.0"], 5),
            image("other", "shell", &[&format!("localhost/agent-sandbox/agent-shell:{version}")], 5),
            image("old-other", "shell", &[&format!("localhost/agent-sandbox/agent-shell:{sha}")], 3600),
        ];
        let planned = run(&images, &[]);
        assert_eq!(
            planned,
            vec![("old-other".into(), vec![format!("localhost/agent-sandbox/agent-shell:{sha}")], true)],
            "only the other platform's older build goes"
        );
    }

    #[test]
    fn what_an_older_lock_names_stays_too() {
        let images = [
            image("latest", "shell", &["localhost/agent-sandbox/agent-shell:0.1.0"], 5),
            image("locked", "shell", &["localhost/agent-sandbox/agent-shell:sha-0a8f9309fb64"], 3600),
        ];
        assert_eq!(run(&images, &["locked"]), vec![]);
    }

    #[test]
    fn another_tag_keeps_the_image_and_its_inputs_index() {
        let images = [image(
            "old",
            "claude",
            &[
                "localhost/agent-sandbox/agent-claude:sha-0a8f9309fb64",
                "localhost/agent-sandbox/inputs:claude-o",
                "ghcr.io/agent-sandbox/agent-claude:0.1.0",
            ],
            3600,
        )];
        assert_eq!(
            run(&images, &[]),
            vec![("old".into(), vec!["localhost/agent-sandbox/agent-claude:sha-0a8f9309fb64".into()], false)]
        );
    }

    #[test]
    fn the_benchmarks_tags_go_from_kept_and_superseded_images_alike() {
        let images = [
            image(
                "latest",
                "shell",
                &["localhost/agent-sandbox/agent-shell:0.1.0", "agent-sandbox-bench/shell:latest"],
                10_000,
            ),
            image(
                "copy",
                "claude",
                &["agent-sandbox-bench/claude:latest", "localhost/agent-sandbox/inputs:claude-b"],
                10_000,
            ),
        ];
        let planned = run(&images, &[]);
        assert!(
            planned.contains(&("latest".into(), vec!["agent-sandbox-bench/shell:latest".into()], false)),
            "the latest keeps its version tag and loses the bench's: {planned:?}"
        );
        assert!(
            planned.iter().any(|(id, ours, goes)| id == "copy"
                && ours.contains(&"agent-sandbox-bench/claude:latest".to_string())
                && *goes),
            "{planned:?}"
        );
    }

    #[test]
    fn another_prefix_is_left_alone() {
        let images = [image("x", "shell", &["localhost/agent-sandbox-test-a-1/agent-shell:0.1.0"], 3600)];
        assert_eq!(run(&images, &[]), vec![]);
    }

    #[test]
    fn unclaimed_images_go_only_after_the_grace() {
        let images = [
            image(
                "index-only",
                "shell",
                &["localhost/agent-sandbox/inputs:shell-i"],
                GRACE.as_secs() as i64 + 1,
            ),
            image("dangling", "shell", &[], GRACE.as_secs() as i64 + 1),
            image("being-built", "shell", &[], 30),
            image("being-tagged", "shell", &["localhost/agent-sandbox/inputs:shell-t"], 30),
        ];
        assert_eq!(
            run(&images, &[]),
            vec![
                ("dangling".into(), vec![], true),
                ("index-only".into(), vec!["localhost/agent-sandbox/inputs:shell-i".into()], true),
            ]
        );
    }

    #[test]
    fn images_the_build_did_not_make_are_not_listed() {
        let mut foreign = image("foreign", "x", &["localhost/agent-sandbox/agent-x:1"], 3600);
        foreign.labels.remove(labels::INPUTS);
        assert_eq!(run(&[foreign], &[]), vec![]);
    }
}
