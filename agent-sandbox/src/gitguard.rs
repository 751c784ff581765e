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
/// The most entries the walk of the project looks at.
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

/// The project's git layout: every git directory git could use in or for it, every `.git`
/// file, and the repositories nested below its top.
#[derive(Debug, Default)]
struct Layout {
    git_dirs: BTreeSet<PathBuf>,
    dot_git_files: BTreeSet<PathBuf>,
    /// `.git` entries and other git directories below the project's top, relative.
    nested: BTreeSet<String>,
    truncated: bool,
}

/// Whether `dir` is a git directory as git recognises one: a `HEAD` (a file, or a link), and a configuration,
/// another directory's (`commondir`), or objects and refs.
fn is_git_dir(dir: &Path) -> bool {
    // A HEAD of any kind: git takes a symbolic link into refs/ too, dangling before the
    // branch's first commit.
    std::fs::symlink_metadata(dir.join("HEAD")).is_ok_and(|m| !m.is_dir())
        && (dir.join("config").is_file()
            || dir.join("commondir").is_file()
            || (dir.join("objects").is_dir() && dir.join("refs").is_dir()))
}

/// The folders inside a git directory that hold no git directory: walked past.
const GIT_DATA: [&str; 5] = ["objects", "refs", "logs", "lfs", "hooks"];

/// Every git directory and `.git` file of `project`: a walk of the project (a `.git` at any
/// depth, and any folder that is a git directory by another name, as a bare repository the
/// agent planted would be), the git directories `.git` files and `commondir` name, and every
/// git directory inside those (submodules' at any depth, worktrees', and any other).
fn layout(project: &Path) -> Layout {
    let mut layout = Layout::default();
    let mut seen = 0;
    let mut found = Vec::new();
    let mut stack = vec![project.to_path_buf()];
    'walk: while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            seen += 1;
            if seen > MAX_WALK {
                layout.truncated = true;
                break 'walk;
            }
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { continue };
            let relative = path.strip_prefix(project).unwrap_or(&path).display().to_string();
            if entry.file_name() == ".git" {
                if dir != project {
                    layout.nested.insert(relative);
                }
                if kind.is_file() {
                    layout.dot_git_files.insert(path.clone());
                    found.extend(gitdir_of_file(&path));
                } else if kind.is_dir() {
                    found.push(path);
                }
            } else if kind.is_dir() {
                if is_git_dir(&path) {
                    layout.nested.insert(relative);
                    found.push(path);
                } else {
                    stack.push(path);
                }
            }
        }
    }
    while let Some(dir) = found.pop() {
        let dir = dir.canonicalize().unwrap_or(dir);
        if !layout.git_dirs.insert(dir.clone()) {
            continue;
        }
        if let Ok(common) = std::fs::read_to_string(dir.join("commondir"))
            && let Ok(common) = dir.join(common.trim()).canonicalize()
        {
            found.push(common);
        }
        let mut inside = vec![dir];
        while let Some(folder) = inside.pop() {
            for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                let path = entry.path();
                if !entry.file_type().is_ok_and(|t| t.is_dir())
                    || GIT_DATA.iter().any(|d| entry.file_name() == *d)
                {
                    continue;
                }
                if is_git_dir(&path) { found.push(path) } else { inside.push(path) }
            }
        }
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
    for file in &layout.dot_git_files {
        mounts.push(mount(file, true));
    }
    mounts.sort_by(|a, b| a.target.cmp(&b.target));
    Ok((mounts, snapshot_of(layout)))
}

/// The project's git files as they are now.
pub fn snapshot(project: &Path) -> GitSnapshot {
    snapshot_of(layout(project))
}

/// The git files of `layout`, as they are now: one walk of the project serves both the mounts
/// and the snapshot at start.
fn snapshot_of(layout: Layout) -> GitSnapshot {
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
    for file in &layout.dot_git_files {
        record(file);
    }
    snapshot.git_dirs = layout.git_dirs.iter().map(|d| d.display().to_string()).collect();
    (snapshot.nested, snapshot.truncated) = (layout.nested, layout.truncated);
    snapshot
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

    /// Found by a red team: a submodule's `.git` file pointed at a git directory the agent
    /// planted inside `.git`, a submodule at a deep path, a nested repository that was there
    /// before the run, and a bare repository under another name. git on the host runs what
    /// each one's configuration names.
    #[test]
    fn submodules_at_any_depth_nested_and_bare_repositories_are_guarded_and_named() {
        let project = repo();
        let root = project.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(root.join("lib/.git"), "gitdir: ../.git/modules/lib\n").unwrap();
        let deep = root.join(".git/modules/third_party/lib/foo");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(deep.join("config"), "[core]\n").unwrap();
        let vendored = root.join("vendor/x/.git");
        std::fs::create_dir_all(vendored.join("objects")).unwrap();
        std::fs::create_dir_all(vendored.join("refs")).unwrap();
        std::fs::write(vendored.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(vendored.join("config"), "[core]\n").unwrap();
        let (mounts, before) = plan(&root).unwrap();
        let read_only: Vec<&str> = mounts.iter().filter(|m| m.read_only).map(|m| m.target.as_str()).collect();
        for guarded in [
            "/workspace/lib/.git",
            "/workspace/.git/modules/third_party/lib/foo/config",
            "/workspace/.git/modules/third_party/lib/foo/hooks",
            "/workspace/vendor/x/.git/config",
            "/workspace/vendor/x/.git/hooks",
        ] {
            assert!(read_only.contains(&guarded), "{guarded} is not read-only: {read_only:?}");
        }
        // What the mounts would stop, done on the host: each is named.
        let planted = root.join(".git/cache");
        std::fs::create_dir_all(&planted).unwrap();
        std::fs::write(planted.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(planted.join("config"), "[core]\n\tworktree = ../../lib\n\tfsmonitor = id\n").unwrap();
        std::fs::write(root.join("lib/.git"), "gitdir: ../.git/cache\n").unwrap();
        std::fs::write(deep.join("config"), "[core]\n\tfsmonitor = id\n").unwrap();
        std::fs::write(vendored.join("config"), "[core]\n\tfsmonitor = id\n").unwrap();
        let bare = root.join("docs/api");
        for folder in ["objects", "refs"] {
            std::fs::create_dir_all(bare.join(folder)).unwrap();
        }
        std::fs::write(bare.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        // Found by a second red team: a HEAD that is a dangling link, as git accepts it.
        let linked = root.join("docs/linked");
        for folder in ["objects", "refs"] {
            std::fs::create_dir_all(linked.join(folder)).unwrap();
        }
        std::os::unix::fs::symlink("refs/heads/main", linked.join("HEAD")).unwrap();
        std::fs::write(linked.join("config"), "[core]\n\tpager = id\n").unwrap();
        let text = before.changes(&snapshot(&root)).join("\n");
        for expected in [
            "changed: ",
            "/lib/.git\n",
            "new git directory: ",
            "/.git/cache",
            "/.git/modules/third_party/lib/foo/config",
            "/vendor/x/.git/config",
            "new repository in the project: docs/api",
            "new repository in the project: docs/linked",
        ] {
            assert!(text.contains(expected), "{expected}: {text}");
        }
    }

    #[test]
    fn the_snapshot_survives_its_label() {
        let project = repo();
        let snapshot = snapshot(project.path());
        let label = serde_json::to_string(&snapshot).unwrap();
        assert_eq!(serde_json::from_str::<GitSnapshot>(&label).unwrap(), snapshot);
    }
}
