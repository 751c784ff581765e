//! `cargo xtask new-agent`: a new agent image's Dockerfile and policy, from a template, without
//! ever overwriting a file.

use std::path::{Path, PathBuf};

/// Where the agent's CLI comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Npm(String),
    Pip(String),
    From(String),
}

impl crate::flags::NewAgentFlags {
    pub fn run(self, root: &Path) -> anyhow::Result<()> {
        let source = match (self.npm, self.pip, self.from) {
            (Some(package), None, None) => Source::Npm(package),
            (None, Some(package), None) => Source::Pip(package),
            (None, None, Some(image)) => Source::From(image),
            _ => anyhow::bail!("give exactly one of --npm, --pip, --from"),
        };
        let agent = NewAgent {
            cmd: self.cmd.unwrap_or_else(|| self.name.clone()),
            name: self.name,
            source,
            domains: self.domains,
        };
        for path in write(root, &agent)? {
            println!("created {}", path.display());
        }
        print!("next steps:\n{}", next_steps(&agent));
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct NewAgent {
    pub name: String,
    pub source: Source,
    pub cmd: String,
    pub domains: Vec<String>,
}

/// The files a new agent needs, as (path relative to the repository, contents).
pub fn files(agent: &NewAgent) -> Vec<(PathBuf, String)> {
    let NewAgent { name, source, cmd, domains } = agent;
    let version_arg = format!("{}_VERSION", name.to_ascii_uppercase().replace('-', "_"));
    let (parent, install) = match source {
        Source::Npm(package) => (
            "node".to_string(),
            format!(
                "RUN npm install --global --no-fund --no-audit \"{package}@${{{version_arg}}}\" \\\n \
                 && npm cache clean --force \\\n \
                 && {cmd} --version\n"
            ),
        ),
        Source::Pip(package) => (
            "python".to_string(),
            format!(
                "RUN uv venv --no-cache /opt/{name} \\\n \
                 && uv pip install --no-cache --python /opt/{name}/bin/python \"{package}==${{{version_arg}}}\" \\\n \
                 && ln -s /opt/{name}/bin/{cmd} /usr/local/bin/{cmd} \\\n \
                 && {cmd} --version\n"
            ),
        ),
        Source::From(image) => (image.clone(), String::new()),
    };
    let version_lines = match source {
        Source::From(_) => String::new(),
        _ => {
            format!("# The CLI's version, pinned: set it to a released version.\nARG {version_arg}=0.0.0\n\n")
        }
    };
    let version_label = match source {
        Source::From(_) => String::new(),
        _ => format!(" \\\n      io.github.agent-sandbox.agent.version=\"${{{version_arg}}}\""),
    };
    let dockerfile = format!(
        "# The {name} agent. Scaffolded by `cargo xtask new-agent`.\n\
         ARG BASE_IMAGE=agent-{parent}\n\
         FROM ${{BASE_IMAGE}}\n\n\
         {version_lines}\
         LABEL org.opencontainers.image.description=\"agent-sandbox {name}\" \\\n      \
         io.github.agent-sandbox.agent.name=\"{name}\"{version_label}\n\n\
         {install}{sep}\
         # SANDBOX_STATE_DIRS: where the CLI keeps its sign-in and history, to mount as volumes\n\
         # (`:`-separated, inside /home/agent; sandbox-init makes them the agent's).\n\
         ENV {assistant_cmd}=\"{cmd}\" \\\n    \
         {state_dirs}=\"{home}/.{name}\"\n\n\
         # Unattended mode (SANDBOX_UNATTENDED=1): the arguments sandbox-init adds to ASSISTANT_CMD\n\
         # and the variables (`;`-separated NAME=value) it sets, so that the CLI acts without\n\
         # asking (e.g. --yolo). TODO: the CLI's own, checked against the pinned version; or, if it\n\
         # asks nothing, replace both with SANDBOX_UNATTENDED_NONE=\"why\".\n\
         ENV SANDBOX_UNATTENDED_ARGS=\"\" \\\n    \
         SANDBOX_UNATTENDED_ENV=\"\"\n\n\
         COPY policy.yaml /etc/agent-sandbox/policy.yaml\n",
        sep = if install.is_empty() { "" } else { "\n" },
        assistant_cmd = sandbox_policy::layout::ASSISTANT_CMD_ENV,
        state_dirs = sandbox_policy::layout::STATE_DIRS_ENV,
        home = sandbox_policy::layout::AGENT_HOME,
    );
    let policy = if domains.is_empty() {
        format!(
            "# What {name} may reach. Add the domains its API and sign-in need.\nversion: 1\ndescription: {name}\nallow: none\n"
        )
    } else {
        let list: String = domains.iter().map(|d| format!("  - \"{d}\"\n")).collect();
        format!("# What {name} may reach.\nversion: 1\ndescription: {name}\ndomains:\n{list}")
    };
    let mut files = vec![
        (Path::new("images").join(name).join("Dockerfile"), dockerfile),
        (Path::new("policies").join(format!("{name}.yaml")), policy),
    ];
    // Where the CLI's sign-in hosts are read out of it (contract::<agent>::), for a CLI this
    // image installs.
    let installed = match source {
        Source::Npm(package) => Some(format!(
            "/usr/local/lib/node_modules/{package}/*.js, /usr/local/lib/node_modules/{package}/*/*.js"
        )),
        Source::Pip(_) => Some(format!("/opt/{name}/lib/python3*/site-packages/*/*.py")),
        Source::From(_) => None,
    };
    if let Some(installed) = installed {
        let signin = format!(
            "# Where the pinned CLI signs in, refreshes its sign-in and finds its API, read out of the\n\
             # installed CLI by contract::<image>::its_sign_in_hosts_are_in_its_policy: every host the\n\
             # `cli` patterns (grep -aoE) find in `files` must be allowed by policies/{name}.yaml, or be\n\
             # under `elsewhere: {{HOST: {{reason: …}}}}`; `browser` finds the pages only the user's browser\n\
             # opens. TODO: the CLI's own constants (its token and API URLs), as tight as they can be.\n\
             files: [{installed}]\n\
             cli:\n  - 'https://[a-z0-9.-]+/[a-z0-9/_.-]*(oauth|token)[a-z0-9/_.-]*'\n"
        );
        files.push((Path::new("images").join(name).join("signin.yaml"), signin));
    }
    files
}

/// Checks the request against the repository: a valid, unused name; a known parent.
pub fn validate(root: &Path, agent: &NewAgent) -> anyhow::Result<()> {
    if !crate::graph::valid_name(&agent.name) {
        anyhow::bail!(
            "`{}` is not a valid image name: a lowercase letter, then lowercase letters, digits and inner hyphens, at most 63",
            agent.name
        );
    }
    for (path, _) in files(agent) {
        if root.join(&path).exists() {
            anyhow::bail!("{} exists already: new-agent never overwrites a file", path.display());
        }
    }
    if let Source::From(image) = &agent.source {
        let graph = crate::graph::ImageGraph::discover(&root.join("images"))?;
        if graph.get(image).is_none() {
            anyhow::bail!("--from {image}: there is no image `{image}` in images/");
        }
    }
    if agent.cmd.trim().is_empty() || agent.cmd.contains('"') {
        anyhow::bail!("--cmd `{}`: give the command that starts the agent (no double quotes)", agent.cmd);
    }
    for domain in &agent.domains {
        sandbox_policy::parse_domain_with_ports(domain)
            .map_err(|why| anyhow::anyhow!("--domain {domain}: {why}"))?;
    }
    Ok(())
}

/// Writes the files, none of which exists (checked again, atomically, by create_new).
pub fn write(root: &Path, agent: &NewAgent) -> anyhow::Result<Vec<PathBuf>> {
    validate(root, agent)?;
    let mut written = Vec::new();
    for (path, contents) in files(agent) {
        let full = root.join(&path);
        std::fs::create_dir_all(full.parent().expect("a parent"))?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&full)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        std::io::Write::write_all(&mut file, contents.as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

/// What to do next, with the exact commands.
pub fn next_steps(agent: &NewAgent) -> String {
    let name = &agent.name;
    let mut steps = String::new();
    if !matches!(agent.source, Source::From(_)) {
        steps
            .push_str(&format!("  1. Set the pinned version in images/{name}/Dockerfile (ARG …_VERSION).\n"));
    } else {
        steps.push_str(&format!("  1. Add what the agent needs to images/{name}/Dockerfile.\n"));
    }
    steps.push_str(&format!(
        "  2. Set SANDBOX_STATE_DIRS in images/{name}/Dockerfile to the directories the CLI keeps its sign-in in,\n     \
         and SANDBOX_UNATTENDED_ARGS/_ENV to what makes it act without asking (the contract checks it).\n  \
         3. List the domains it needs in policies/{name}.yaml (check: cargo run -p sandbox-init -- check policies/{name}.yaml),\n     \
         and in images/{name}/signin.yaml the patterns of its sign-in and API URLs (the contract reads them out of the CLI).\n  \
         4. cargo xtask build {name}\n  \
         5. cargo xtask test -- contract::{}::\n",
        name.replace('-', "_")
    ));
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(source: Source, domains: &[&str]) -> NewAgent {
        NewAgent {
            name: "my-agent".into(),
            source,
            cmd: "my-agent".into(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn scaffolded_files() {
        for (label, source, domains) in [
            ("npm", Source::Npm("@acme/my-agent".into()), vec!["api.acme.test", "*.cdn.acme.test"]),
            ("pip", Source::Pip("my-agent".into()), vec![]),
            ("from", Source::From("shell".into()), vec![]),
        ] {
            let a = agent(source, &domains);
            let (path, policy) = &files(&a)[1];
            sandbox_policy::Policy::from_yaml(path, policy).unwrap_or_else(|e| panic!("{label}: {e}"));
            let rendered: String = files(&a)
                .iter()
                .map(|(p, c)| format!("==> {}\n{c}", p.display()))
                .collect::<Vec<_>>()
                .join("\n");
            insta::assert_snapshot!(
                format!("new_agent_{label}"),
                format!("{rendered}\n==> next steps\n{}", next_steps(&a))
            );
        }
    }

    #[test]
    fn names_parents_domains_and_existing_files_are_checked() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("images/shell")).unwrap();
        std::fs::write(root.path().join("images/shell/Dockerfile"), "FROM debian\n").unwrap();
        let bad_name = NewAgent { name: "My_Agent".into(), ..agent(Source::From("shell".into()), &[]) };
        assert!(validate(root.path(), &bad_name).unwrap_err().to_string().contains("not a valid image name"));
        let no_parent = agent(Source::From("nope".into()), &[]);
        assert!(validate(root.path(), &no_parent).unwrap_err().to_string().contains("no image `nope`"));
        let bad_domain = agent(Source::Npm("x".into()), &["api.*.test"]);
        assert!(validate(root.path(), &bad_domain).unwrap_err().to_string().contains("--domain api.*.test"));

        let good = agent(Source::From("shell".into()), &["api.acme.test"]);
        assert_eq!(write(root.path(), &good).unwrap().len(), 2);
        let policy = root.path().join("policies/my-agent.yaml");
        std::fs::write(&policy, "edited by hand").unwrap();
        let again = write(root.path(), &good).unwrap_err().to_string();
        assert!(again.contains("exists already: new-agent never overwrites a file"), "{again}");
        assert_eq!(std::fs::read_to_string(policy).unwrap(), "edited by hand");
    }
}
