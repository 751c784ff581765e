//! Static binaries kept outside the checkout, in the user's cache: sandbox-init goes into every
//! image, and its release build with LTO costs minutes of two cores, so a fresh clone on a machine
//! that built the same sources before (a CI machine, a second worktree) takes the kept copy.
//!
//! A copy is named by everything that decides its bytes: the sources' hash and the target
//! (project.rs's stamp), the compiler (`rustc -vV`), the linker and the C library it links
//! statically, the build's environment variables and cargo's configuration files. It is built
//! in a target folder inside the cache, never the checkout's (which whatever writes the project
//! could fill with a binary cargo takes as fresh), and taken only if the folder and the file are
//! the user's and no one else may write them, never through a link. A checkout's own copy is
//! taken only if it is the kept one.

use std::io::Write as _;
use std::os::unix::ffi::OsStringExt as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use xshell::{Shell, cmd};

/// How many builds of each binary and target are kept (the newest).
const KEPT_BUILDS: usize = 3;

/// The variables that change what cargo and rustc make of the same sources. Not
/// RUSTC_WORKSPACE_WRAPPER, which `cargo xtask ci` sets to clippy-driver for its own builds and
/// the suites inherit: the static builds run without it (project.rs).
fn shapes_the_build(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTUP_TOOLCHAIN",
        "CARGO_INCREMENTAL",
    ];
    const PREFIXES: &[&str] = &["CARGO_BUILD_", "CARGO_PROFILE_", "CARGO_UNSTABLE_"];
    // The C compiler the cc crate runs for dependencies with C in them (ring): CC, CFLAGS, AR,
    // their CC_<triple> and TARGET_ forms.
    const C: &[&str] =
        &["CC", "CXX", "AR", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "ARFLAGS", "CRATE_CC_NO_DEFAULTS"];
    let c_tool = |name: &str| {
        C.iter().any(|c| name == *c || name.starts_with(&format!("{c}_")))
            || name.starts_with("TARGET_")
            || name.starts_with("HOST_")
    };
    EXACT.contains(&name)
        || c_tool(name)
        || PREFIXES.iter().any(|p| name.starts_with(p))
        // CARGO_TARGET_<TRIPLE>_LINKER, _RUSTFLAGS, …; not the folder.
        || (name.starts_with("CARGO_TARGET_") && !matches!(name, "CARGO_TARGET_DIR" | "CARGO_TARGET_TMPDIR"))
}

/// One binary's place in the cache.
pub struct Kept {
    /// `$XDG_CACHE_HOME/agent-sandbox/static`, the user's, 0700.
    dir: PathBuf,
    /// `<package>-<triple>-`: the name's part shared by its builds.
    family: String,
    key: String,
}

impl Kept {
    /// The place of `package`'s build for `stamp` (sources hash and triple), linked by `linker`
    /// (`cc` for the host's target); None where there is no cache folder of the user's alone,
    /// or the compiler or linker does not answer.
    pub fn find(sh: &Shell, root: &Path, package: &str, stamp: &str, linker: &str) -> Option<Kept> {
        let dir = cache_dir()?;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).ok()?;
        if !private(&dir) {
            return None;
        }
        let key = key(sh, root, stamp, linker)?;
        let triple = stamp.rsplit(' ').next().unwrap_or_default();
        Some(Kept { dir, family: format!("{package}-{triple}-"), key })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(format!("{}{}", self.family, self.key))
    }

    /// The target folder cargo builds `root`'s binaries in: the cache's, not the checkout's, and
    /// one per checkout, since cargo takes a build as fresh by its files' times and paths, and
    /// one clone's build must never be taken for another's.
    /// It names its checkout in a file `checkout`, so that [`prune_targets`] can remove it once
    /// the checkout is gone.
    pub fn target_dir(&self, root: &Path) -> PathBuf {
        let checkout = Sha256::digest(root.as_os_str().as_encoded_bytes());
        let checkout: String = checkout.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let dir = self.dir.join("target").join(checkout);
        // Best effort: without the file the folder is only never pruned.
        let _ = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(dir.join(CHECKOUT), root.as_os_str().as_encoded_bytes()));
        dir
    }

    /// The kept binary, if there is one: a file of the user's that no one else may write, opened
    /// without following a link.
    pub fn read(&self) -> Option<Vec<u8>> {
        let mut file =
            std::fs::File::options().read(true).custom_flags(libc::O_NOFOLLOW).open(self.path()).ok()?;
        let meta = file.metadata().ok()?;
        if !(meta.is_file() && owned_and_closed(&meta)) {
            return None;
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).ok()?;
        Some(bytes)
    }

    /// Keeps `bytes` (0755), and the newest [`KEPT_BUILDS`] of the same binary and target.
    pub fn keep(&self, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!(".{}{}.{}", self.family, self.key, std::process::id()));
        let mut file = std::fs::File::options().write(true).create_new(true).mode(0o755).open(&tmp)?;
        file.write_all(bytes)?;
        drop(file);
        std::fs::rename(&tmp, self.path())?;
        let mut builds: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&self.family)))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        builds.sort_by_key(|b| std::cmp::Reverse(b.0));
        for (_, old) in builds.into_iter().skip(KEPT_BUILDS) {
            let _ = std::fs::remove_file(old);
        }
        Ok(())
    }
}

/// The name of a build of `stamp` (sources hash and triple) in `root` linked by `linker`: what
/// decides its bytes, hashed. The same for every clone of the same sources on the machine.
fn key(sh: &Shell, root: &Path, stamp: &str, linker: &str) -> Option<String> {
    let mut key = Sha256::new();
    key.update(format!("{stamp}\n"));
    key.update(cmd!(sh, "rustc -vV").quiet().read().ok()?);
    key.update(cmd!(sh, "{linker} --version").quiet().read().ok()?);
    let libc = cmd!(sh, "{linker} -print-file-name=libc.a").quiet().read().ok()?;
    key.update(std::fs::read(libc.trim()).unwrap_or_default());
    // CARGO_INCREMENTAL=0 is a release build's default (CI sets it): the same key as unset.
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(name, value)| shapes_the_build(name) && !(name == "CARGO_INCREMENTAL" && value == "0"))
        .collect();
    vars.sort();
    for (name, value) in vars {
        key.update(format!("{name}={value}\n"));
    }
    // Their contents, not where they are: every clone has its own .cargo/config.toml.
    for config in cargo_configs(root) {
        key.update(Sha256::digest(std::fs::read(&config).unwrap_or_default()));
    }
    let key: String = key.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    Some(key)
}

/// The file naming the checkout a target folder builds.
const CHECKOUT: &str = "checkout";

/// `$XDG_CACHE_HOME/agent-sandbox/static`, else `~/.cache/…`.
fn cache_dir() -> Option<PathBuf> {
    Some(sandbox_images::cache_home()?.join("agent-sandbox/static"))
}

/// Removes the cache's target folders whose checkout is gone (`cargo xtask prune`), or, with
/// `dry_run`, only names them: each with its size in bytes.
pub fn prune_targets(dry_run: bool) -> Vec<(PathBuf, u64)> {
    cache_dir().map(|dir| prune_targets_in(&dir.join("target"), dry_run)).unwrap_or_default()
}

fn prune_targets_in(targets: &Path, dry_run: bool) -> Vec<(PathBuf, u64)> {
    let mut gone = Vec::new();
    for entry in std::fs::read_dir(targets).into_iter().flatten().flatten() {
        let dir = entry.path();
        let Ok(checkout) = std::fs::read(dir.join(CHECKOUT)) else { continue };
        let checkout = PathBuf::from(std::ffi::OsString::from_vec(checkout));
        if checkout.join("Cargo.toml").is_file() {
            continue;
        }
        let size = walkdir_size(&dir);
        if dry_run || std::fs::remove_dir_all(&dir).is_ok() {
            gone.push((dir, size));
        }
    }
    gone
}

/// The bytes of the files under `dir`, links not followed.
fn walkdir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walkdir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// The user's, and writable by no one else.
fn owned_and_closed(meta: &std::fs::Metadata) -> bool {
    // SAFETY: geteuid reads no memory.
    meta.uid() == unsafe { libc::geteuid() } && meta.mode() & 0o022 == 0
}

/// A folder (not a link to one) of the user's that no one else may write.
fn private(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|meta| meta.is_dir() && owned_and_closed(&meta))
}

/// Cargo's configuration files that apply to a build in `root`: the checkout's and its
/// parents', and `$CARGO_HOME`'s.
fn cargo_configs(root: &Path) -> Vec<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    root.ancestors()
        .map(|dir| dir.join(".cargo"))
        .chain(cargo_home)
        .flat_map(|dir| [dir.join("config"), dir.join("config.toml")])
        .filter(|file| file.is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(dir: &Path, key: usize) -> Kept {
        Kept {
            dir: dir.to_path_buf(),
            family: "sandbox-init-x86_64-unknown-linux-gnu-".into(),
            key: format!("{key:016x}"),
        }
    }

    #[test]
    fn a_kept_binary_is_taken_only_if_no_one_else_may_write_it_and_three_are_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        for n in 0..5 {
            kept(dir.path(), n).keep(format!("build {n}").as_bytes()).unwrap();
            // Newer by mtime, as later builds are.
            let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + n as u64);
            std::fs::File::options()
                .write(true)
                .open(kept(dir.path(), n).path())
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        let probe = Kept { family: "sandbox-probe-x86_64-unknown-linux-gnu-".into(), ..kept(dir.path(), 0) };
        probe.keep(b"probe").unwrap();
        let left: Vec<bool> = (0..5).map(|n| kept(dir.path(), n).path().exists()).collect();
        // The fifth keep pruned the two oldest of the family; the probe is another family.
        assert_eq!(left, [false, false, true, true, true]);
        assert_eq!(probe.read().as_deref(), Some(&b"probe"[..]));
        assert_eq!(kept(dir.path(), 4).read().as_deref(), Some(&b"build 4"[..]));
        std::fs::set_permissions(kept(dir.path(), 4).path(), std::fs::Permissions::from_mode(0o775)).unwrap();
        assert_eq!(kept(dir.path(), 4).read(), None, "a file the group may write is not taken");
        // A link in the binary's place is not followed, even to a file of the user's.
        std::os::unix::fs::symlink(kept(dir.path(), 3).path(), kept(dir.path(), 7).path()).unwrap();
        assert_eq!(kept(dir.path(), 7).read(), None);
        assert_eq!(kept(dir.path(), 9).read(), None, "nothing kept");
    }

    /// Two clones of the same sources name the same build, whatever their paths; a flag that
    /// changes the code names another.
    #[test]
    fn two_clones_share_a_key_and_a_changed_flag_does_not() {
        let clones = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        for clone in &clones {
            std::fs::create_dir(clone.path().join(".cargo")).unwrap();
            std::fs::write(clone.path().join(".cargo/config.toml"), "[alias]\nxtask = \"run\"\n").unwrap();
        }
        let sh = Shell::new().unwrap();
        let stamp = "0123 x86_64-unknown-linux-gnu";
        let [a, b] = clones.each_ref().map(|c| key(&sh, c.path(), stamp, "cc").expect("rustc and cc answer"));
        assert_eq!(a, b);
        std::fs::write(clones[1].path().join(".cargo/config.toml"), "[profile.release]\nlto = false\n")
            .unwrap();
        assert_ne!(
            key(&sh, clones[1].path(), stamp, "cc"),
            Some(a.clone()),
            "a config that changes the build"
        );
        assert_ne!(
            key(&sh, clones[0].path(), "4567 x86_64-unknown-linux-gnu", "cc"),
            Some(a),
            "other sources"
        );
    }

    #[test]
    fn a_target_folder_goes_with_its_checkout() {
        let cache = tempfile::tempdir().unwrap();
        let kept = kept(cache.path(), 0);
        let (here, gone) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for checkout in [&here, &gone] {
            std::fs::write(checkout.path().join("Cargo.toml"), "[workspace]\n").unwrap();
        }
        let (kept_dir, pruned_dir) = (kept.target_dir(here.path()), kept.target_dir(gone.path()));
        std::fs::write(pruned_dir.join("built"), [0u8; 100]).unwrap();
        assert_ne!(kept_dir, pruned_dir);
        let gone_path = gone.path().to_path_buf();
        drop(gone);
        let targets = cache.path().join("target");
        assert_eq!(prune_targets_in(&targets, true).len(), 1, "named, not removed");
        assert!(pruned_dir.exists());
        let pruned = prune_targets_in(&targets, false);
        assert_eq!(pruned.len(), 1, "{pruned:?} ({} is gone)", gone_path.display());
        assert!(pruned[0].1 >= 100);
        assert!(!pruned_dir.exists() && kept_dir.exists());
    }

    #[test]
    fn a_folder_others_may_write_or_a_link_is_not_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("mine");
        std::fs::DirBuilder::new().mode(0o700).create(&mine).unwrap();
        assert!(private(&mine));
        std::os::unix::fs::symlink(&mine, dir.path().join("link")).unwrap();
        assert!(!private(&dir.path().join("link")));
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!private(&mine));
    }

    #[test]
    fn the_variables_that_shape_a_build_are_in_the_key_and_the_folder_is_not() {
        for name in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_PROFILE_RELEASE_LTO",
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
        ] {
            assert!(shapes_the_build(name), "{name}");
        }
        for name in [
            "CARGO_TARGET_DIR",
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_VERSION",
            "CARGO_HOME",
            "HOME",
            "CCACHE_DIR",
        ] {
            assert!(!shapes_the_build(name), "{name}");
        }
    }
}
