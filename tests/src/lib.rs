//! The harness of the container suites: build settings shared with `cargo xtask test`, scratch
//! copies of the repository's images/, and cleanup of everything a test tagged.

pub mod registry;
pub mod sandbox;

use std::path::{Path, PathBuf};

use xtask::build::BuildOptions;
use xtask::engine::Engine;
use xtask::progress::ProgressMode;

/// The workspace root.
pub fn root() -> PathBuf {
    xtask::project::root()
}

/// A scratch copy of images/ with its own lock file and tag prefix, so a test can change files
/// and build without touching the repository or the images users see. Tags under the prefix are
/// removed when it is dropped.
pub struct ScratchImages {
    dir: tempfile::TempDir,
    pub prefix: String,
}

impl ScratchImages {
    /// Copies the named images (all when empty) of the repository.
    pub fn copy(test: &str, only: &[&str]) -> anyhow::Result<ScratchImages> {
        let dir = tempfile::tempdir()?;
        copy_dir(&root().join("images"), &dir.path().join("images"), only)?;
        // Images bake policies/<image>.yaml and policies/services.yaml is compiled in.
        copy_dir(&root().join("policies"), &dir.path().join("policies"), &[])?;
        let prefix = format!("localhost/agent-sandbox-test-{test}-{}", std::process::id());
        Ok(ScratchImages { dir, prefix })
    }

    pub fn images_dir(&self) -> PathBuf {
        self.dir.path().join("images")
    }

    pub fn lock_path(&self) -> PathBuf {
        self.dir.path().join("images.lock")
    }

    /// Build options resolved like `cargo xtask test` does, pointed at this copy.
    pub fn options(&self) -> anyhow::Result<BuildOptions> {
        let mut opts = BuildOptions::from_env(&root())?;
        opts.images_dir = self.images_dir();
        opts.lock_path = self.lock_path();
        opts.prefix = self.prefix.clone();
        opts.progress = ProgressMode::Plain;
        Ok(opts)
    }
}

impl Drop for ScratchImages {
    fn drop(&mut self) {
        let prefix = format!("{}/", self.prefix);
        remove_tags_blocking(move |engine| async move { engine.tags_with_prefix(&prefix).await.ok() });
    }
}

/// Removes a tag when dropped, whatever the test's outcome.
pub struct RemoveTagOnDrop(pub String);

impl Drop for RemoveTagOnDrop {
    fn drop(&mut self) {
        let tag = self.0.clone();
        remove_tags_blocking(move |_| async move { Some(vec![tag]) });
    }
}

/// Removes the tags `which` names, from synchronous code such as `Drop` (which cannot await):
/// a thread with its own runtime can, even inside a test's runtime. Best effort: cleanup must not
/// hide the test's own result.
pub fn remove_tags_blocking<F, Fut>(which: F)
where
    F: FnOnce(Engine) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<Vec<String>>>,
{
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        rt.block_on(async {
            let engine = Engine::connect().await.ok()?;
            for tag in which(engine.clone()).await? {
                let _ = engine.remove_tag(&tag).await;
            }
            Some(())
        })
    })
    .join();
}

fn copy_dir(from: &Path, to: &Path, only: &[&str]) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if !only.is_empty() && !only.iter().any(|o| name == *o) {
            continue;
        }
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &to.join(&name), &[])?;
        } else {
            std::fs::copy(entry.path(), to.join(&name))?;
        }
    }
    Ok(())
}
