//! `verify --sidecar`: the image in the test world as `agent-sandbox run --sidecar` makes it (the
//! launcher's own spec and `make`: the holder, the gateway with the firewall, the policy and the
//! keys, and the agent's container without any capability), on the world's network, with the
//! probe in the agent's container and the gateway, and verify's drop-in and made-up key the
//! gateway's alone.

use std::collections::HashMap;
use std::net::IpAddr;

use bollard::models::{Mount, MountType};
use sandbox_policy::apis::APIS;
use sandbox_policy::layout::{BAKED_POLICY, DROP_IN_DIR, SECRETS_DIR};
use sandbox_verify::DROP_IN;

use super::world::{LABEL, PROBE, World};
use crate::engine::{Entry, Sandbox};
use crate::exit::{Code, Failure, Result};
use crate::flags::RunFlags;
use crate::host::Host;
use crate::spec::SandboxSpec;

impl World {
    /// Makes and starts the pair, resolving through `dns`; `policy`, if given, replaces the
    /// image's. Its volumes are recorded before anything is made, for the world's removal.
    pub(super) async fn start_pair(&self, dns: IpAddr, policy: Option<&str>) -> Result<Sandbox> {
        let project = self.policy_dir.path().join("project");
        std::fs::create_dir_all(&project)
            .map_err(|e| Failure::new(Code::Engine, format!("cannot make the test world's project: {e}")))?;
        let project = std::fs::canonicalize(&project)
            .map_err(|e| Failure::new(Code::Engine, format!("{}: {e}", project.display())))?;
        let flags = RunFlags {
            agent: "verify".into(),
            dir: project.clone(),
            allow: Vec::new(),
            policy: Vec::new(),
            offline: false,
            detach: true,
            image: Some(self.image.clone()),
            platform: None,
            state: Some(format!("{}.state", self.net)),
            key_files: Vec::new(),
            no_key: true,
            login_from_host: false,
            unattended: false,
            env: Vec::new(),
            cpus: None,
            memory: None,
            pids_limit: None,
            network: Some(self.net.clone()),
            dns: Some(dns),
            sidecar: true,
            runtime: self.runtime.clone(),
            model_server: None,
            model: None,
            writable_git_config: true,
        };
        // One made-up key under every model API's variables: `make` gives the sandbox those of
        // the APIs the image's policy reaches, as `run` would. With `--policy`, the first API
        // that policy reaches gets it, as a file of the gateway's. Which was held is read back.
        let key = sandbox_verify::made_up_key();
        let mut key_files: HashMap<String, String> =
            APIS.iter().flat_map(|api| api.keys.iter()).map(|k| (k.var.to_string(), key.clone())).collect();
        let mut secrets = Vec::new();
        if let Some(policy) = policy {
            key_files.clear();
            let parsed = crate::run::parse_baked_policy(policy.as_bytes())?;
            if let Some(var) = crate::spec::apis_reached(&parsed).first().and_then(|a| a.keys.first()) {
                let path = format!("{SECRETS_DIR}/{}", var.var.to_ascii_lowercase());
                secrets.push(Entry { path: SECRETS_DIR.into(), contents: None, mode: 0o700, uid: 0 });
                secrets.push(Entry { path, contents: Some(key.clone().into_bytes()), mode: 0o400, uid: 0 });
            }
        }
        let host = Host {
            project,
            policies: Vec::new(),
            env: Vec::new(),
            key_files,
            keys_in_env: HashMap::new(),
            memory: crate::host::memory_limit(None)?,
        };
        let facts =
            self.engine.image(&self.image).await?.ok_or_else(|| {
                Failure::new(Code::NoImage, format!("no image {} in the engine", self.image))
            })?;
        let mut spec = SandboxSpec::new(&flags, &host, &self.image, &facts, None, Vec::new())?;
        let probe = Mount {
            target: Some(PROBE.into()),
            source: Some(self.probe.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        };
        let bodies = [Some(&mut spec.body), spec.holder.as_mut(), spec.gateway.as_mut()];
        for (index, body) in bodies.into_iter().flatten().enumerate() {
            body.labels.get_or_insert_with(HashMap::new).insert(LABEL.into(), self.net.clone());
            // The agent's container and the gateway (not the holder, which runs nothing).
            if index != 1 {
                let host = body.host_config.get_or_insert_with(Default::default);
                host.mounts.get_or_insert_with(Vec::new).push(probe.clone());
            }
        }
        let file =
            |path: String, contents: Vec<u8>| Entry { path, contents: Some(contents), mode: 0o644, uid: 0 };
        spec.files.push(file(format!("{DROP_IN_DIR}/{DROP_IN}"), sandbox_verify::drop_in().into_bytes()));
        if let Some(policy) = policy {
            spec.files.push(file(BAKED_POLICY.into(), policy.as_bytes().to_vec()));
        }
        spec.files.extend(secrets);
        spec.files.extend(self.drop_in_files());
        let name = spec.found.name.clone();
        {
            let mut volumes = self.volumes.lock().expect("volumes");
            volumes.extend(spec.volumes.iter().cloned());
            volumes.push(crate::identity::shared_volume(&name));
        }
        let pair = crate::run::make(&self.engine, &spec).await?;
        let held = pair.get(SECRETS_DIR).await?;
        let var = held.iter().find_map(|(path, _)| {
            let file = std::path::Path::new(path).file_name()?.to_str()?;
            APIS.iter()
                .flat_map(|api| api.keys.iter())
                .find(|k| k.var.eq_ignore_ascii_case(file))
                .map(|k| k.var)
        });
        *self.held.lock().expect("held key") = match var {
            Some(var) => Ok((var.to_string(), key)),
            None => {
                Err("the image's policy reaches no model API whose key sandbox-init holds: no key to hold"
                    .into())
            }
        };
        self.record_addresses(&crate::identity::holder_name(&name), sandbox_verify::Role::Sandbox).await?;
        Ok(pair)
    }
}
