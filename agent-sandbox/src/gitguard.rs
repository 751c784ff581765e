//! The project's git files that make the user's own git run commands on the host: the agent
//! writes the project, and the user runs git in it afterwards, to look at the agent's work. A
//! `core.fsmonitor`, `core.pager`, `core.hooksPath`, filter or textconv in a repository's
//! configuration, or a hook, runs as the user at their next `git status`, `diff` or `commit`.
//!
//! So `run` mounts each git directory of the project (its `.git`, or the one a `.git` file
//! names, the common one, and every submodule's and worktree's under it) over itself, which
//! makes it a mount point the agent can neither move nor replace, and its configuration
//! (`config`, `config.worktree`, and `commondir` and `gitdir`, which point git at another
//! configuration) and `hooks` read-only on top. git inside the sandbox still adds, commits,
//! branches and fetches: those write objects, refs and the index, not these.
//!
//! What mounts cannot stop, the snapshot names: `run` records these files' hashes, the git
//! directories and the repositories nested in the project (a `.git` below the top, which the
//! user's `git status` runs once the agent registers it as a submodule) in a label, and `stop`
//! and the end of an attached `run` compare them with what is there now. Pure but for the
//! filesystem reads; nothing here runs git.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::engine::Found;
use crate::exit::{Code, Failure, Result};

/// Where the project is mounted in the sandbox.
pub const WORKSPACE: &str = "/workspace";
/// The files of a git directory that name commands, or point git at a configuration elsewhere.
const GUARDED_FILES: [&str; 4] = ["config", "config.worktree", "commondir", "gitdir"];
/// The most entries the walk for nested repositories looks at.
const MAX_WALK: usize = 500_000;

/// A bind mount the guard asks for: host path, path in the sandbox, read-only or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardMount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// What the project's git files were (or are): the label `run` leaves and `stop` compares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitSnapshot {
    /// Each guarded file (host path): its sha256, or `absent`.
    pub files: BTreeMap<String, String>,
    /// Every git directory (host paths).
    pub git_dirs: BTreeSet<String>,
    /// The repositories nested in the project: `.git` entries below its top, relative.
    pub nested: BTreeSet<String>,
    /// Whether the walk for nested repositories stopped at its bound.
    pub truncated: bool,
}

/// The project's git layout: its git directories, and the `.git` file if it has one.
#[derive(Debug, Default)]
struct Layout {
    git_dirs: BTreeSet<PathBuf>,
    dot_git_file: Option<PathBuf>,
}

/// The git directories of `project`: its own (a `.git` folder, or the one a `.git` file names),
/// the common one it points to, and every submodule's and worktree's below the common one.
fn layout(project: &Path) -> Layout {
    let mut layout = Layout::default();
    let dot_git = project.join(".git");
    let own = match std::fs::symlink_metadata(&dot_git) {
        Ok(meta) if meta.is_dir() => dot_git,
        Ok(meta) if meta.is_file() => {
            layout.dot_git_file = Some(dot_git.clone());
            let Some(dir) = gitdir_of_file(&dot_git) else { return layout };
            dir
        }
        _ => return layout,
    };
    let common = std::fs::read_to_string(own.join("commondir"))
        .ok()
        .map(|c| own.join(c.trim()))
        .and_then(|c| c.canonicalize().ok())
        .unwrap_or_else(|| own.clone());
    layout.git_dirs.insert(own);
    let mut stack = vec![common];
    while let Some(dir) = stack.pop() {
        for sub in ["modules", "worktrees"] {
            for entry in std::fs::read_dir(dir.join(sub)).into_iter().flatten().flatten() {
                let path = entry.path();
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if path.join("HEAD").is_file() {
                    stack.push(path);
                } else if sub == "modules" {
                    // A submodule at a deeper path (`modules/a/b`): its git directory is below.
                    for deeper in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                        if deeper.path().join("HEAD").is_file() {
                            stack.push(deeper.path());
                        }
                    }
                }
            }
        }
        layout.git_dirs.insert(dir);
    }
    layout
}

/// The directory a `.git` file names (`gitdir: PATH`, relative to the file's folder).
fn gitdir_of_file(file: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(file).ok()?;
    let named = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    let base = file.parent()?;
    base.join(named).canonicalize().ok().filter(|d| d.is_dir())
}

/// The path in the sandbox of host path `path`: under /workspace for the project's own, the
/// same path for a git directory outside it (a worktree's or a submodule's, which the `.git`
/// file names by its host path).
fn in_sandbox(project: &Path, path: &Path) -> String {
    match path.strip_prefix(project) {
        Ok(relative) if relative.as_os_str().is_empty() => WORKSPACE.to_string(),
        Ok(relative) => format!("{WORKSPACE}/{}", relative.display()),
        Err(_) => path.display().to_string(),
    }
}

/// The mounts that guard `project`'s git files, and the snapshot to compare with at the end.
/// A git directory without `hooks` gets an empty one first (git would create it; the agent
/// would otherwise create it and its hooks).
pub fn plan(project: &Path) -> std::io::Result<(Vec<GuardMount>, GitSnapshot)> {
    let layout = layout(project);
    let mut mounts = Vec::new();
    let mount = |source: &Path, read_only| GuardMount {
        source: source.to_path_buf(),
        target: in_sandbox(project, source),
        read_only,
    };
    for dir in &layout.git_dirs {
        let hooks = dir.join("hooks");
        if !hooks.exists() && !dir.join("commondir").exists() {
            std::fs::create_dir(&hooks)?;
        }
        mounts.push(mount(dir, false));
        for file in GUARDED_FILES.iter().map(|f| dir.join(f)).filter(|f| f.exists()) {
            mounts.push(mount(&file, true));
        }
        if hooks.exists() {
            mounts.push(mount(&hooks, true));
        }
    }
    if let Some(file) = &layout.dot_git_file {
        mounts.push(mount(file, true));
    }
    mounts.sort_by(|a, b| a.target.cmp(&b.target));
    Ok((mounts, snapshot(project)))
}

/// The project's git files as they are now.
pub fn snapshot(project: &Path) -> GitSnapshot {
    let layout = layout(project);
    let mut snapshot = GitSnapshot::default();
    let mut record = |path: &Path| {
        let hash = match std::fs::read(path) {
            Ok(bytes) => format!("{:x}", sha2::Sha256::digest(&bytes)),
            Err(_) if path.exists() => "unreadable".to_string(),
            Err(_) => "absent".to_string(),
        };
        snapshot.files.insert(path.display().to_string(), hash);
    };
    for dir in &layout.git_dirs {
        for file in GUARDED_FILES {
            record(&dir.join(file));
        }
        let mut hooks = vec![dir.join("hooks")];
        while let Some(folder) = hooks.pop() {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                match entry.file_type() {
                    Ok(t) if t.is_dir() => hooks.push(entry.path()),
                    _ => record(&entry.path()),
                }
            }
        }
    }
    if let Some(file) = &layout.dot_git_file {
        record(file);
    }
    snapshot.git_dirs = layout.git_dirs.iter().map(|d| d.display().to_string()).collect();
    (snapshot.nested, snapshot.truncated) = nested_repositories(project);
    snapshot
}

/// Every `.git` below the project's top (not following links), relative; and whether the walk
/// stopped at its bound.
fn nested_repositories(project: &Path) -> (BTreeSet<String>, bool) {
    let mut found = BTreeSet::new();
    let mut stack = vec![project.to_path_buf()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            seen += 1;
            if seen > MAX_WALK {
                return (found, true);
            }
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if entry.file_name() == ".git" {
                if dir != project {
                    found.insert(path.strip_prefix(project).unwrap_or(&path).display().to_string());
                }
                continue;
            }
            if is_dir {
                stack.push(path);
            }
        }
    }
    (found, false)
}

impl GitSnapshot {
    /// What changed since `self` was taken, one line each, for the user to look at before
    /// running git in the project.
    pub fn changes(&self, now: &GitSnapshot) -> Vec<String> {
        let mut changes = Vec::new();
        for (path, hash) in &now.files {
            match self.files.get(path).map(String::as_str) {
                Some(before) if before == hash => {}
                None | Some("absent") => changes.push(format!("new: {path}")),
                Some(_) if hash == "absent" => changes.push(format!("removed: {path}")),
                Some(_) => changes.push(format!("changed: {path}")),
            }
        }
        for dir in now.git_dirs.difference(&self.git_dirs) {
            changes.push(format!("new git directory: {dir}"));
        }
        for nested in now.nested.difference(&self.nested) {
            changes.push(format!("new repository in the project: {nested} (your git runs its configuration once it is a submodule)"));
        }
        if now.truncated && !self.truncated {
            changes.push(format!(
                "the project has over {MAX_WALK} entries: not every nested repository was checked"
            ));
        }
        changes
    }
}

/// What changed in the project's git files since the sandbox started, as a failure naming each
/// change (exit 72); nothing if they were not guarded (`--writable-git-config`) or nothing
/// changed.
pub fn changes_since_start(sandbox: &Found) -> Result<i32> {
    if sandbox.git.is_empty() {
        return Ok(0);
    }
    let Ok(before) = serde_json::from_str::<GitSnapshot>(&sandbox.git) else {
        return Err(Failure::new(
            Code::GitChanged,
            format!(
                "{}'s record of the project's git files does not parse: check them before you run git in {}",
                sandbox.name, sandbox.project
            ),
        ));
    };
    let changes = before.changes(&snapshot(Path::new(&sandbox.project)));
    if changes.is_empty() {
        return Ok(0);
    }
    Err(Failure::new(
        Code::GitChanged,
        format!(
            "the project's git files changed while {} ran; your own git runs what they name, as you: \
             look at each before you run git in {}:\n  {}",
            sandbox.name,
            sandbox.project,
            changes.join("\n  ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        std::fs::create_dir_all(git.join("hooks")).unwrap();
        std::fs::create_dir_all(git.join("modules/lib/hooks")).unwrap();
        std::fs::create_dir_all(git.join("worktrees/feature")).unwrap();
        for head in [git.join("HEAD"), git.join("modules/lib/HEAD"), git.join("worktrees/feature/HEAD")] {
            std::fs::write(head, "ref: refs/heads/main\n").unwrap();
        }
        std::fs::write(git.join("config"), "[core]\n").unwrap();
        std::fs::write(git.join("hooks/pre-commit.sample"), "#!/bin/sh\n").unwrap();
        std::fs::write(git.join("modules/lib/config"), "[core]\n").unwrap();
        std::fs::write(git.join("worktrees/feature/commondir"), "../..\n").unwrap();
        std::fs::write(git.join("worktrees/feature/gitdir"), "/elsewhere/.git\n").unwrap();
        dir
    }

    #[test]
    fn every_git_directory_is_a_mount_point_with_its_configuration_read_only() {
        let project = repo();
        let root = project.path().canonicalize().unwrap();
        let (mounts, _) = plan(&root).unwrap();
        let read_only: Vec<&str> = mounts.iter().filter(|m| m.read_only).map(|m| m.target.as_str()).collect();
        let writable: Vec<&str> = mounts.iter().filter(|m| !m.read_only).map(|m| m.target.as_str()).collect();
        assert_eq!(
            read_only,
            [
                "/workspace/.git/config",
                "/workspace/.git/hooks",
                "/workspace/.git/modules/lib/config",
                "/workspace/.git/modules/lib/hooks",
                "/workspace/.git/worktrees/feature/commondir",
                "/workspace/.git/worktrees/feature/gitdir",
            ]
        );
        assert_eq!(
            writable,
            ["/workspace/.git", "/workspace/.git/modules/lib", "/workspace/.git/worktrees/feature"]
        );
    }

    #[test]
    fn a_git_file_is_read_only_and_its_directory_mounted_where_it_names_it() {
        let outside = repo();
        let main = outside.path().canonicalize().unwrap();
        let worktree = tempfile::tempdir().unwrap();
        let root = worktree.path().canonicalize().unwrap();
        let gitdir = main.join(".git/worktrees/feature");
        std::fs::write(root.join(".git"), format!("gitdir: {}\n", gitdir.display())).unwrap();
        let (mounts, snapshot) = plan(&root).unwrap();
        let targets: Vec<(&str, bool)> = mounts.iter().map(|m| (m.target.as_str(), m.read_only)).collect();
        assert!(targets.contains(&("/workspace/.git", true)), "{targets:?}");
        let gitdir_target = gitdir.display().to_string();
        assert!(targets.contains(&(gitdir_target.as_str(), false)), "{targets:?}");
        let config = format!("{}/.git/config", main.display());
        assert!(targets.contains(&(config.as_str(), true)), "the common directory's: {targets:?}");
        assert!(snapshot.git_dirs.contains(&main.join(".git").display().to_string()), "{snapshot:?}");
    }

    #[test]
    fn a_missing_hooks_folder_is_made_so_that_it_can_be_guarded() {
        let project = repo();
        std::fs::remove_dir_all(project.path().join(".git/hooks")).unwrap();
        let (mounts, _) = plan(project.path()).unwrap();
        assert!(project.path().join(".git/hooks").is_dir());
        assert!(mounts.iter().any(|m| m.target == "/workspace/.git/hooks" && m.read_only), "{mounts:?}");
    }

    #[test]
    fn what_the_agent_could_plant_is_named() {
        let project = repo();
        let root = project.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        let before = snapshot(root);
        assert_eq!(before.changes(&snapshot(root)), Vec::<String>::new(), "nothing changed");
        // A redirect of the main repository's configuration, a hook, a new submodule's git
        // directory and a repository nested in the project, each as the agent would write it.
        std::fs::write(root.join(".git/commondir"), "../evil\n").unwrap();
        std::fs::write(root.join(".git/hooks/post-checkout"), "#!/bin/sh\nid\n").unwrap();
        std::fs::write(root.join(".git/modules/lib/config"), "[core]\n\tfsmonitor = id\n").unwrap();
        std::fs::create_dir_all(root.join(".git/modules/planted")).unwrap();
        std::fs::write(root.join(".git/modules/planted/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::create_dir_all(root.join("src/vendor/.git")).unwrap();
        let changes = before.changes(&snapshot(root));
        let text = changes.join("\n");
        for expected in [
            "new: ",
            ".git/commondir",
            "new: ",
            ".git/hooks/post-checkout",
            "changed: ",
            ".git/modules/lib/config",
            "new repository in the project: src/vendor/.git",
        ] {
            assert!(text.contains(expected), "{expected}: {text}");
        }
        // The commondir now points git elsewhere: the planted module is found through the
        // layout as it is now, or named as new.
        assert!(changes.len() >= 4, "{changes:?}");
    }

    #[test]
    fn the_snapshot_survives_its_label() {
        let project = repo();
        let snapshot = snapshot(project.path());
        let label = serde_json::to_string(&snapshot).unwrap();
        assert_eq!(serde_json::from_str::<GitSnapshot>(&label).unwrap(), snapshot);
    }
}
