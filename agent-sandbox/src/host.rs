//! What `agent-sandbox run` reads from the host, checked before the engine is asked anything
//! (domains, policy files, variables, key files, the project folder, the memory limit), and the
//! host's sign-in files an image names. `spec` turns it into the sandbox, purely.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sandbox_images::labels;
use sandbox_policy::Policy;
use sandbox_policy::apis::key_vars;
use sandbox_policy::layout::AGENT_HOME;

use crate::approve;
use crate::engine::ImageFacts;
use crate::exit::{Code, Failure, Result};
use crate::flags::RunFlags;

const DEFAULT_MEMORY: &str = "8g";

/// What `run` read from the host.
#[derive(Debug, Default)]
pub struct Host {
    /// The project folder's canonical path.
    pub project: PathBuf,
    /// The `--policy` files: (path of the drop-in in the sandbox, contents).
    pub policies: Vec<(String, Vec<u8>)>,
    /// The agent's variables (`--env`, `SANDBOX_UNATTENDED`), as `NAME=VALUE`.
    pub env: Vec<String>,
    /// The keys `--key-file` read, by variable.
    pub key_files: HashMap<String, String>,
    /// The key variables set in this environment, by variable.
    pub keys_in_env: HashMap<String, String>,
    /// The memory limit in bytes.
    pub memory: i64,
}

pub fn bad(message: impl Into<String>) -> Failure {
    Failure::new(Code::BadArgument, message)
}

impl Host {
    /// Checks every argument and reads what they name, before the engine is asked anything.
    pub fn check(flags: &RunFlags) -> Result<Host> {
        check_agent(&flags.agent)?;
        let project = std::fs::canonicalize(&flags.dir)
            .map_err(|e| bad(format!("project folder {}: {e}", flags.dir.display())))?;
        if !project.is_dir() {
            return Err(bad(format!("project {} is not a folder", project.display())));
        }
        approve::validate("--allow", &flags.allow)?;
        if !flags.detach && !crate::terminal::interactive() {
            return Err(bad(
                "no terminal to attach to: add --detach, then `agent-sandbox attach` from a terminal",
            ));
        }
        let policies = read_policies(&flags.policy)?;
        let env = variables(&flags.env, flags.unattended)?;
        let is_key = |name: &str| key_vars().any(|k| k == name);
        let mut key_files = HashMap::new();
        for given in &flags.key_files {
            let (var, file) = given.split_once('=').ok_or_else(|| {
                bad(format!("--key-file {given}: write VAR=FILE, e.g. OPENAI_API_KEY=~/key"))
            })?;
            if !is_key(var) {
                return Err(bad(format!(
                    "--key-file {given}: `{var}` is not a key variable sandbox-init holds ({})",
                    key_vars().collect::<Vec<_>>().join(", ")
                )));
            }
            let path = expand_home(file);
            let key = std::fs::read_to_string(&path).map_err(|e| {
                Failure::new(Code::NoKey, format!("--key-file {var}: cannot read {}: {e}", path.display()))
            })?;
            let key = key.trim().to_string();
            if key.is_empty() {
                return Err(Failure::new(
                    Code::NoKey,
                    format!("--key-file {var}: {} is empty", path.display()),
                ));
            }
            key_files.insert(var.to_string(), key);
        }
        let memory = memory_limit(flags.memory.as_deref())?;
        let keys_in_env = key_vars()
            .filter_map(|var| {
                Some((var.to_string(), std::env::var(var).ok().filter(|v| !v.trim().is_empty())?))
            })
            .collect();
        Ok(Host { project, policies, env, key_files, keys_in_env, memory })
    }
}

fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// An agent's name: an image's folder under images/.
pub fn check_agent(agent: &str) -> Result<()> {
    if agent.is_empty() || !agent.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return Err(bad(format!("agent `{agent}`: an image name under images/, such as claude or shell")));
    }
    Ok(())
}

/// The `--policy` files, each checked as sandbox-init will read it: (path of the drop-in in the
/// sandbox, contents).
pub fn read_policies(files: &[PathBuf]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut policies = Vec::new();
    for (index, file) in files.iter().enumerate() {
        Policy::read(file).map_err(|e| Failure::new(Code::BadPolicy, e.to_string()))?;
        let bytes = std::fs::read(file)
            .map_err(|e| Failure::new(Code::BadPolicy, format!("{}: {e}", file.display())))?;
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        policies.push((format!("{}/run-{}-{name}", sandbox_policy::DROP_IN_DIR, index + 1), bytes));
    }
    Ok(policies)
}

/// The agent's variables, as `NAME=VALUE`: `--env` (a key variable refused: keys go in as
/// secret files) and `SANDBOX_UNATTENDED` with `--unattended`.
pub fn variables(given_env: &[String], unattended: bool) -> Result<Vec<String>> {
    let is_key = |name: &str| key_vars().any(|k| k == name);
    let mut env = Vec::new();
    for given in given_env {
        let (name, value) = match given.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => {
                let value = std::env::var(given)
                    .map_err(|_| bad(format!("--env {given}: {given} is not set in your environment")))?;
                (given.clone(), value)
            }
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad(format!("--env {given}: `{name}` is not a variable name")));
        }
        if is_key(&name) {
            return Err(bad(format!(
                "--env {name}: a key goes in as a secret file, not a variable the engine shows to anyone \
                 who inspects the container; export {name} (the launcher hands it over) or use --key-file {name}=FILE"
            )));
        }
        env.push(format!("{name}={value}"));
    }
    if unattended {
        env.push(format!("{}=1", sandbox_policy::layout::UNATTENDED_ENV));
    }
    Ok(env)
}

/// `--memory`, else the default, in bytes.
pub fn memory_limit(given: Option<&str>) -> Result<i64> {
    let size = given.unwrap_or(DEFAULT_MEMORY);
    parse_size(size).ok_or_else(|| bad(format!("--memory {size}: write a size such as 4g or 512m")))
}

/// `4g`, `512m`, `1024k` or bytes.
fn parse_size(text: &str) -> Option<i64> {
    let text = text.trim().to_ascii_lowercase();
    let text = text.strip_suffix('b').unwrap_or(&text);
    let (number, unit) = match text.char_indices().last()? {
        (i, 'k') => (&text[..i], 1 << 10),
        (i, 'm') => (&text[..i], 1 << 20),
        (i, 'g') => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    let bytes = number.parse::<f64>().ok()? * f64::from(unit);
    (bytes >= 6.0 * f64::from(1 << 20)).then_some(bytes as i64)
}

/// The credential files and folders the user's own tools keep in the home folder: the engine's
/// logins, GitHub's CLI, npm's and git's tokens, netrc, the clouds' keys, Kubernetes, SSH and
/// GnuPG keys. No image's label makes the launcher copy one in, whatever else it names: the
/// agent would hold them.
pub const CREDENTIALS: &[&str] = &[
    ".docker/config.json",
    ".config/gh",
    ".npmrc",
    ".yarnrc.yml",
    ".git-credentials",
    ".config/git/credentials",
    ".netrc",
    ".pypirc",
    ".cargo/credentials.toml",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".ssh",
    ".gnupg",
    ".password-store",
    ".config/containers/auth.json",
    ".config/hub",
    ".config/op",
    ".config/rclone",
    ".local/share/keyrings",
    ".terraform.d",
    ".vault-token",
    ".pgpass",
    ".m2/settings.xml",
    ".gem/credentials",
    ".boto",
    ".s3cfg",
    ".gitconfig",
];

/// Whether `path` (home-relative) is, or is under, one of the [`CREDENTIALS`]: which one. Without
/// case, as a case-insensitive file system (macOS's) reads `.SSH/id_ed25519` as `~/.ssh`'s.
fn credential_of(path: &Path) -> Option<&'static str> {
    let lower = PathBuf::from(path.to_string_lossy().to_lowercase());
    CREDENTIALS.iter().copied().find(|c| lower.starts_with(c))
}

/// The home-relative paths an image's login-files label names. The label is the image's, which
/// anyone may build: a path that leaves the home folder (`..`, an absolute path, `.`) is
/// refused, so that no label makes the launcher read another of the user's files, and so is one
/// that is, or is under, one of the user's [`CREDENTIALS`].
fn login_paths(declared: &str) -> Result<Vec<PathBuf>> {
    use std::path::Component;
    declared
        .split(':')
        .filter(|p| !p.is_empty())
        .map(|relative| {
            let path = PathBuf::from(relative);
            let segments_normal = relative.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
            let credential = credential_of(&path);
            if let Some(credential) = credential {
                Err(Failure::new(
                    Code::NoLogin,
                    format!(
                        "--login-from-host: the image names `{relative}` as a sign-in file, which is your \
                         `~/{credential}`, a credential of your own tools: it is never copied in"
                    ),
                ))
            } else if segments_normal && path.components().all(|c| matches!(c, Component::Normal(_))) {
                Ok(path)
            } else {
                Err(Failure::new(
                    Code::NoLogin,
                    format!(
                        "--login-from-host: the image names `{relative}` as a sign-in file: only a path \
                         inside the home folder, without `..` or `.`, is read"
                    ),
                ))
            }
        })
        .collect()
}

/// A file's bytes, refusing a link as the last component (the CLI writes a plain file there).
fn read_no_link(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The host's sign-in files the image names, read now: (path in the sandbox, contents).
pub fn login_files(agent: &str, facts: &ImageFacts) -> Result<Vec<(String, Vec<u8>)>> {
    let Some(declared) = facts.labels.get(labels::LOGIN_FILES).filter(|l| !l.trim().is_empty()) else {
        return Err(Failure::new(
            Code::NoLogin,
            format!(
                "--login-from-host: the {agent} image names no sign-in files to copy (its CLI keeps none in a file, or takes a key)"
            ),
        ));
    };
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .ok_or_else(|| Failure::new(Code::NoLogin, "--login-from-host: HOME is not set"))?;
    let mut files = Vec::new();
    for relative in login_paths(declared)? {
        let host = home.join(&relative);
        let bytes = read_no_link(&host).map_err(|e| {
            Failure::new(
                Code::NoLogin,
                format!(
                    "--login-from-host: cannot read {}: {e} (sign in on the host first, or drop the flag)",
                    host.display()
                ),
            )
        })?;
        files.push((format!("{AGENT_HOME}/{}", relative.display()), bytes));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_label_names_files_in_the_home_folder_alone_and_no_link_is_read() {
        let ok = login_paths(".claude/.credentials.json:.codex/auth.json").unwrap();
        assert_eq!(ok, [PathBuf::from(".claude/.credentials.json"), PathBuf::from(".codex/auth.json")]);
        for bad in ["../.ssh/id_ed25519", "/etc/shadow", ".claude/../../x", "./.claude/x", ".a/./b"] {
            let refused = login_paths(bad).unwrap_err();
            assert_eq!(refused.code, Code::NoLogin, "{bad}");
            assert!(refused.message.contains(bad), "{bad}: {}", refused.message);
        }
        // The user's tools' credentials, however the label names them among others.
        for credential in [
            ".docker/config.json",
            ".config/gh/hosts.yml",
            ".npmrc",
            ".git-credentials",
            ".netrc",
            ".aws/credentials",
            ".config/gcloud/application_default_credentials.json",
            ".kube/config",
            ".ssh/id_ed25519",
        ] {
            let refused = login_paths(&format!(".claude/.credentials.json:{credential}")).unwrap_err();
            assert!(refused.message.contains("a credential of your own tools"), "{credential}: {refused}");
        }
        for spelled in [".SSH/id_ed25519", ".Docker/config.json", ".AWS/credentials", ".Kube/config"] {
            assert!(
                login_paths(spelled).is_err(),
                "{spelled}: a case-insensitive file system reads it as the real one"
            );
        }
        assert!(
            login_paths(".npmrc.d/x:.sshd/x:.config/ghost").is_ok(),
            "only those paths, not their prefixes"
        );
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("secret"), "private key").unwrap();
        std::os::unix::fs::symlink(home.path().join("secret"), home.path().join("credentials.json")).unwrap();
        assert!(read_no_link(&home.path().join("credentials.json")).is_err(), "a link was read");
        assert_eq!(read_no_link(&home.path().join("secret")).unwrap(), b"private key");
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("8g"), Some(8 << 30));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("1k"), None, "below the engine's minimum");
        assert_eq!(parse_size("lots"), None);
    }
}
