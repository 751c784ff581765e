//! What a build did (`BuildReport`): each image's outcome, the plans it built from, the lock and
//! the local record it wrote.

use std::sync::Arc;

use crate::lock::{ImagesLock, LocalImages};
use crate::os::OsSource;
use crate::plan::BuildPlan;

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

    /// Each image this build left, as `name=id` words ([`crate::project::SUITE_IMAGES_ENV`]).
    pub fn suite_images(&self) -> String {
        let ids = self.results.iter().filter_map(|r| Some(format!("{}={}", r.name, self.id(&r.name)?)));
        ids.collect::<Vec<_>>().join(" ")
    }

    /// The id [`Self::suite_images`] gave `name` in `words`.
    pub fn suite_image<'a>(words: &'a str, name: &str) -> Option<&'a str> {
        words.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suites_images_name_each_id_and_only_the_built_ones() {
        let result = |name: &str, outcome| ImageResult { name: name.into(), outcome };
        let report = BuildReport {
            results: vec![
                result("os", Outcome::UpToDate { id: "sha256:aa".into() }),
                result("base", Outcome::Built { id: "sha256:bb".into(), seconds: 1.0 }),
                result("node", Outcome::Failed { message: "no".into() }),
                result("claude", Outcome::NotBuilt { because: "node".into() }),
            ],
            plans: Vec::new(),
            lock: ImagesLock::default(),
            local: LocalImages::default(),
            os_source: OsSource::Mirror,
        };
        let words = report.suite_images();
        assert_eq!(words, "os=sha256:aa base=sha256:bb");
        assert_eq!(BuildReport::suite_image(&words, "base"), Some("sha256:bb"));
        assert_eq!(BuildReport::suite_image(&words, "bas"), None, "a prefix of a name is not the name");
        assert_eq!(BuildReport::suite_image(&words, "node"), None);
    }
}
