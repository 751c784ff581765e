//! Debian trixie's packages on bookworm, for what bookworm's own builds do badly: the engine
//! (docker.io 26.1 and its CLI; bookworm's is 20.10) and gVisor's runsc (gvisor.rs).
//!
//! On bookworm the packages alone are fetched from trixie's archive into a temporary folder,
//! without adding trixie to the machine's sources, and installed by apt-get from there: their
//! dependencies (containerd, runc, tini, iptables) come from the machine's own sources. On
//! trixie and later they are the distribution's.
//!
//! Why the engine: bookworm's docker.io 20.10 (end of life upstream) runs its own 75 MB binary
//! again for every network setting of every container that has a network namespace of its own
//! (the prestart hook, one `set-ipv6` per interface, the embedded resolver's setup); 26.1 does
//! them in process but the hook. A container started and removed on an internal IPv6 network:
//! 0.77 CPU-s under 20.10, 0.43 under 26.1 (docs/test.md).

use anyhow::Context as _;
use xshell::Shell;

/// The engine as trixie packages it: the daemon, and the client it moved into its own package.
pub const ENGINE: [&str; 2] = ["docker.io", "docker-cli"];

/// The codename an os-release file names. Pure.
pub fn codename_in(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(|c| c.trim_matches('"').to_string()))
        .unwrap_or_default()
}

/// `args` run as root: through sudo, or as they are.
pub fn as_root<'a>(sh: &'a Shell, sudo: bool, args: &[&str]) -> xshell::Cmd<'a> {
    let (program, rest) = if sudo { ("sudo", args) } else { (args[0], &args[1..]) };
    sh.cmd(program).args(rest)
}

/// Installs trixie's `packages` on Debian's bookworm: fetched alone from trixie's archive (or
/// its security archive, where newer) and installed from the downloaded files, their
/// dependencies from the machine's sources (whose lists the caller has updated). Bookworm's apt
/// does not update them afterwards: nothing of trixie stays in its sources. (Elsewhere they
/// are the distribution's own packages, which setup installs as the others.)
pub fn install(sh: &Shell, sudo: bool, packages: &[&str]) -> anyhow::Result<()> {
    let as_root = |args: &[&str]| as_root(sh, sudo, args);
    let apt_get = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"];
    let dir = tempfile::tempdir()?;
    let path = dir.path().display().to_string();
    // trixie and its security archive: the newest of either is fetched. Both are signed by
    // Debian's archive keys, which apt checks the lists against and the files against the lists.
    std::fs::write(
        dir.path().join("trixie.sources"),
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
         Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: trixie-security\n\
         Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    )?;
    // Only trixie's list, in the temporary folder: the machine's sources and lists stay.
    for sub in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(dir.path().join(sub))?;
    }
    let options = [
        "-q".to_string(),
        "-o".into(),
        "Dir::Etc::SourceList=/dev/null".into(),
        "-o".into(),
        format!("Dir::Etc::SourceParts={path}"),
        "-o".into(),
        format!("Dir::State::Lists={path}/lists"),
        "-o".into(),
        format!("Dir::Cache={path}/cache"),
        "-o".into(),
        "APT::Sandbox::User=root".into(),
    ];
    let _dir = sh.push_dir(dir.path());
    let trixie_apt = |what: &'static str| {
        let mut args: Vec<&str> = vec!["apt-get"];
        args.extend(options.iter().map(String::as_str));
        args.push(what);
        args
    };
    as_root(&trixie_apt("update")).run().context("cannot read trixie's package list")?;
    let mut download = trixie_apt("download");
    download.extend(packages);
    as_root(&download).run().with_context(|| format!("cannot fetch trixie's {}", packages.join(", ")))?;
    let debs: Vec<String> = std::fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .map(|p| p.display().to_string())
        .collect();
    // The files are the packages asked for, each by its own control file.
    let mut names = debs
        .iter()
        .map(|deb| Ok(sh.cmd("dpkg-deb").args(["--field", deb, "Package"]).read()?.trim().to_string()))
        .collect::<anyhow::Result<Vec<String>>>()?;
    names.sort();
    let mut asked = packages.to_vec();
    asked.sort_unstable();
    anyhow::ensure!(names == asked, "apt-get download left {names:?} (from {debs:?}) for {asked:?}");
    // The machine's own apt-get: the files as they are, what they depend on from its sources.
    let args: Vec<&str> = apt_get
        .iter()
        .copied()
        .chain(["install", "-y", "-q"])
        .chain(debs.iter().map(String::as_str))
        .collect();
    as_root(&args)
        .run()
        .with_context(|| format!("apt-get could not install trixie's {}", packages.join(", ")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codename_is_read_quoted_or_not_and_empty_when_absent() {
        assert_eq!(codename_in("NAME=\"Debian GNU/Linux\"\nVERSION_CODENAME=bookworm\n"), "bookworm");
        assert_eq!(codename_in("VERSION_CODENAME=\"trixie\""), "trixie");
        assert_eq!(codename_in("ID=alpine\n"), "");
    }
}
