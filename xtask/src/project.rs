//! Where things live in the repository, and facts about it that tags and labels need.

use std::path::{Path, PathBuf};

use crate::platform::Platform;
use anyhow::Context as _;
use xshell::{Shell, cmd};

pub use sandbox_images::naming::{
    BENCH_REPOSITORY, DEFAULT_PREFIX, INPUTS_REPOSITORY, LICENSES, LOCAL_PREFIX, PREFIX_ENV, SOURCE_URL,
    VERSION, inputs_tag, repository,
};
/// The environment variable that `--ca-bundle` reads when not given.
pub const CA_BUNDLE_ENV: &str = "AGENT_SANDBOX_CA_BUNDLE";
/// `--os-source` from the environment: how `cargo xtask test` hands its choice to the suites, so
/// that the images they ask for are the ones it built.
pub const OS_SOURCE_ENV: &str = "AGENT_SANDBOX_OS_SOURCE";

/// The images `cargo xtask test` (or `ci`) built or found up to date for the host before the
/// suites start, as `name=id` words: a test process takes an image from it (once its tag still
/// names that id) rather than walking the graph again. See [`crate::report::BuildReport::suite_images`].
pub const SUITE_IMAGES_ENV: &str = "AGENT_SANDBOX_SUITE_IMAGES";
/// The probe `cargo xtask test` (or `ci`) built for the suites: its path.
pub const PROBE_ENV: &str = "AGENT_SANDBOX_PROBE";
/// The launcher (`agent-sandbox`, debug) `cargo xtask test` (or `ci`) built for the suites: its
/// path.
pub const LAUNCHER_ENV: &str = "AGENT_SANDBOX_LAUNCHER";

/// The workspace root: the parent of the xtask crate.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// The short commit, with `-dirty` when tracked files other than the lock differ from it;
/// `None` outside a git checkout or before the first commit. One git call: a no-op build waits
/// for it.
pub fn git_revision(sh: &Shell, root: &Path) -> Option<String> {
    let _dir = sh.push_dir(root);
    let status = cmd!(sh, "git status --porcelain=v2 --branch --untracked-files=no -- . :!images.lock")
        .quiet()
        .ignore_stderr()
        .read()
        .ok()?;
    parse_revision(&status)
}

fn parse_revision(status: &str) -> Option<String> {
    let oid = status.lines().find_map(|l| l.strip_prefix("# branch.oid "))?;
    if oid.len() < 12 || !oid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None; // "(initial)": no commit yet
    }
    let dirty = status.lines().any(|l| !l.starts_with('#') && !l.trim().is_empty());
    Some(format!("{}{}", &oid[..12], if dirty { "-dirty" } else { "" }))
}

/// Whether an executable `program` is on PATH.
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The files sandbox-init is built from, relative to the workspace root: not its tests' corpus
/// (nor sandbox-wire's corpus/, which its tests read), nor fuzz/ (whose target/ and corpus/ grow
/// to gigabytes and thousands of files while fuzzing).
const SANDBOX_INIT_SOURCES: &[&str] = &[
    "sandbox-init/src",
    "sandbox-init/Cargo.toml",
    "sandbox-policy/src",
    "sandbox-policy/Cargo.toml",
    "sandbox-wire/src",
    "sandbox-wire/Cargo.toml",
    "policies/services.yaml",
    "Cargo.lock",
    "Cargo.toml",
    ".cargo/config.toml",
];

/// sandbox-init as one static binary (glibc with crt-static: no NSS is used, DNS is pure Rust).
pub fn sandbox_init_binary(sh: &Shell, root: &Path) -> anyhow::Result<Vec<u8>> {
    static_binary(sh, root, "sandbox-init", SANDBOX_INIT_SOURCES)
}

/// The files the probe (`sandbox-probe`, tests/probe) is built from.
pub const PROBE_SOURCES: &[&str] = &["tests/probe", "Cargo.lock", "Cargo.toml"];

/// The probe as one static binary: the suites' peers and sandboxes run it, and `agent-sandbox
/// verify` copies it into the containers of its test world.
pub fn probe_binary(sh: &Shell, root: &Path) -> anyhow::Result<PathBuf> {
    static_binary(sh, root, "sandbox-probe", PROBE_SOURCES)?;
    Ok(static_binary_path(root, "sandbox-probe"))
}

/// The hash of sandbox-init's sources: what stands for its binary in the input hash images.lock
/// records, which must not depend on this machine's toolchain or paths.
pub fn sandbox_init_sources_hash(root: &Path) -> anyhow::Result<String> {
    sources_hash(root, SANDBOX_INIT_SOURCES)
}

/// A workspace package's binary of the same name, built static for the host's architecture so
/// it runs in any image.
pub fn static_binary(sh: &Shell, root: &Path, package: &str, sources: &[&str]) -> anyhow::Result<Vec<u8>> {
    static_binary_for(sh, root, package, sources, Platform::host())
}

/// sandbox-init, static, for `platform` (another one than the host's through Debian's cross
/// linker).
pub fn sandbox_init_binary_for(sh: &Shell, root: &Path, platform: Platform) -> anyhow::Result<Vec<u8>> {
    static_binary_for(sh, root, "sandbox-init", SANDBOX_INIT_SOURCES, platform)
}

/// A workspace package's binary of the same name, built static for `platform`.
///
/// Cargo's own no-op check costs more than the rest of a no-op image build, so the binary is
/// kept beside a stamp of its sources' hash and the target's triple, and cargo runs only when
/// either changed. Concurrent callers (test processes) may both build; each installs its copy
/// by an atomic rename.
pub fn static_binary_for(
    sh: &Shell,
    root: &Path,
    package: &str,
    sources: &[&str],
    platform: Platform,
) -> anyhow::Result<Vec<u8>> {
    let target_dir = target_dir(root);
    let binary = static_binary_path_for(root, package, platform);
    let cache = binary.parent().expect("in the cache directory").to_path_buf();
    let stamp = cache.join(format!("{package}.sources"));
    let triple = platform.triple();
    let hash = format!("{} {triple}", sources_hash(root, sources)?);
    let checkout_copy = std::fs::read_to_string(&stamp)
        .is_ok_and(|s| s == hash)
        .then(|| std::fs::read(&binary).ok())
        .flatten();
    let _dir = sh.push_dir(root);
    let install = |bytes: &[u8]| -> anyhow::Result<()> {
        std::fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
        let tmp = cache.join(format!("{package}.{}", std::process::id()));
        std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        std::fs::rename(&tmp, &binary).with_context(|| format!("cannot install {}", binary.display()))?;
        std::fs::write(&stamp, &hash).with_context(|| format!("cannot write {}", stamp.display()))
    };
    let cross = platform.cross_linker(Platform::host());
    if let Some((_, linker)) = &cross {
        anyhow::ensure!(
            on_path(linker),
            "building {package} for {platform} needs the cross linker {linker}: install {} (and \
             `rustup target add {triple}`), or run `cargo xtask setup --tests`",
            platform.cross_package()
        );
    }
    let linker = cross.as_ref().map_or("cc", |(_, linker)| *linker);
    let kept = crate::kept::Kept::find(sh, root, package, &hash, linker);
    match (kept.as_ref().and_then(crate::kept::Kept::read), checkout_copy) {
        // The checkout's copy is taken only if it is the kept one (whatever writes the project
        // could put both a binary and its stamp there); without a cache, as before.
        (Some(kept), Some(copy)) if kept == copy => return Ok(copy),
        (None, Some(copy)) if kept.is_none() => return Ok(copy),
        (Some(kept), _) => {
            install(&kept)?;
            return Ok(kept);
        }
        _ => {}
    }
    let _flags = sh.push_env("RUSTFLAGS", "-C target-feature=+crt-static");
    // In target folders of their own (one for the host's, one for other platforms'): they never
    // wait on the workspace's lock (the lint build, the tests' build) or on each other, so
    // `cargo xtask ci` builds them beside those from its start. The cache's where there is one
    // (kept.rs), so that what is kept was never in the checkout.
    let target_dir = kept.as_ref().map_or_else(|| target_dir.join("agent-sandbox"), |k| k.target_dir(root));
    let target_dir = target_dir.join(if platform == Platform::host() { "static" } else { "cross" });
    let _target = sh.push_env("CARGO_TARGET_DIR", &target_dir);
    let _linker = cross.as_ref().map(|(var, linker)| sh.push_env(var, linker));
    cmd!(sh, "cargo build --quiet --locked --release --package {package} --target {triple}")
        // The lint build's wrapper (`cargo xtask ci`, and the suites it starts, have it) lints;
        // it belongs neither in a release build nor in its key (kept.rs).
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .quiet()
        .run()
        .with_context(|| {
            format!("cannot build {package} for {platform} (is `rustup target add {triple}` done?)")
        })?;
    let built = target_dir.join(triple).join("release").join(package);
    let bytes = std::fs::read(&built).with_context(|| format!("cannot read {}", built.display()))?;
    install(&bytes)?;
    // Kept only if the sources did not change while cargo built (best effort: without it the
    // next clone builds again).
    if let Some(kept) = kept
        && sources_hash(root, sources).is_ok_and(|now| hash.starts_with(&now))
    {
        let _ = kept.keep(&bytes);
    }
    Ok(bytes)
}

/// Where [`static_binary`] keeps `package`'s binary.
pub fn static_binary_path(root: &Path, package: &str) -> PathBuf {
    static_binary_path_for(root, package, Platform::host())
}

/// Where [`static_binary_for`] keeps `package`'s binary for `platform`: the host's where it
/// always was, another platform's in a folder of its own.
pub fn static_binary_path_for(root: &Path, package: &str, platform: Platform) -> PathBuf {
    let cache = target_dir(root).join("agent-sandbox");
    if platform == Platform::host() {
        cache.join(package)
    } else {
        cache.join(platform.debian_arch()).join(package)
    }
}

pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

fn sources_hash(root: &Path, sources: &[&str]) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for source in sources {
        let path = root.join(source);
        if path.is_dir() {
            let ctx = crate::context::BuildContext::from_dir(&path)?;
            h.update(ctx.input_hash(&Default::default(), source));
        } else if let Ok(bytes) = std::fs::read(&path) {
            h.update(source.as_bytes());
            h.update(Sha256::digest(bytes));
        }
    }
    Ok(format!("{:x}", h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path dependency of sandbox-init left out of its sources would leave a stale binary in
    /// the images when only that dependency changed.
    #[test]
    fn sandbox_init_sources_cover_its_path_dependencies() {
        let manifest = std::fs::read_to_string(root().join("sandbox-init/Cargo.toml")).unwrap();
        let dependencies: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.split_once("path = \"../")?.1.split_once('"').map(|(dir, _)| dir))
            .collect();
        assert!(!dependencies.is_empty(), "sandbox-init has path dependencies");
        for dir in dependencies {
            assert!(SANDBOX_INIT_SOURCES.contains(&format!("{dir}/src").as_str()), "{dir}/src is not hashed");
        }
    }

    #[test]
    fn revision_from_git_status() {
        let clean = "# branch.oid 0123456789abcdef0123456789abcdef01234567\n# branch.head main\n";
        assert_eq!(parse_revision(clean).as_deref(), Some("0123456789ab"));
        let dirty = format!("{clean}1 .M N... 100644 100644 100644 a b images/shell/Dockerfile\n");
        assert_eq!(parse_revision(&dirty).as_deref(), Some("0123456789ab-dirty"));
        assert_eq!(parse_revision("# branch.oid (initial)\n# branch.head main\n"), None);
        assert_eq!(parse_revision(""), None);
    }
}
