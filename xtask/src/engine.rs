//! Every call to the container engine goes through here (bollard); the rest of the xtask is
//! engine-free logic.

use std::collections::{HashMap, VecDeque};

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::BuildInfoAux;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, ImportImageOptionsBuilder, RemoveImageOptionsBuilder, TagImageOptionsBuilder,
};
use futures_util::StreamExt as _;

/// How many of the engine's last output lines a failure report keeps.
const TAIL_LINES: usize = 25;

pub use sandbox_images::engine::{EngineError, PushFailure};

/// An image as the engine lists it.
#[derive(Debug, Clone)]
pub struct ListedImage {
    pub id: String,
    pub tags: Vec<String>,
    pub labels: HashMap<String, String>,
    pub size: u64,
    /// Seconds since the epoch.
    pub created: i64,
}

/// A build that the engine reported as failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct BuildFailure {
    pub message: String,
    /// The last `Step N/M : …` line the engine printed, if any.
    pub step: Option<String>,
    pub tail: Vec<String>,
}

/// What a running build reports, for progress display.
#[derive(Debug, Clone)]
pub enum BuildEvent {
    Step(String),
    Line(String),
}

/// What a build needs to know of a local image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalImage {
    pub id: String,
    pub tags: Vec<String>,
    pub labels: HashMap<String, String>,
}

#[derive(Clone)]
pub struct Engine {
    docker: Docker,
}

impl Engine {
    /// Connects to the engine named by DOCKER_HOST (or the local socket) and checks it answers.
    pub async fn connect() -> Result<Engine, EngineError> {
        Ok(Engine { docker: sandbox_images::engine::connect().await? })
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The id of a local image, `None` when there is none by that reference.
    pub async fn image_id(&self, reference: &str) -> Result<Option<String>, EngineError> {
        Ok(self.find(reference).await?.map(|i| i.id))
    }

    pub async fn image_labels(&self, reference: &str) -> Result<HashMap<String, String>, EngineError> {
        Ok(self.find(reference).await?.map(|i| i.labels).unwrap_or_default())
    }

    /// The local image `reference` names, if any (one cheap call: listing every image costs
    /// the engine more than inspecting the few a build needs).
    pub async fn find(&self, reference: &str) -> Result<Option<LocalImage>, EngineError> {
        match self.docker.inspect_image(reference).await {
            Ok(image) => Ok(image.id.map(|id| LocalImage {
                id,
                tags: image.repo_tags.unwrap_or_default(),
                labels: image.config.and_then(|c| c.labels).unwrap_or_default(),
            })),
            Err(BollardError::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(source) => Err(EngineError::Call { what: format!("inspecting '{reference}'"), source }),
        }
    }

    /// Every local image carrying `label`, with its tags, labels and size.
    pub async fn images_with_label(&self, label: &str) -> Result<Vec<ListedImage>, EngineError> {
        let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
        let options =
            bollard::query_parameters::ListImagesOptionsBuilder::default().filters(&filters).build();
        let images = self.docker.list_images(Some(options)).await.map_err(|source| EngineError::Call {
            what: format!("listing images labelled {label}"),
            source,
        })?;
        Ok(images
            .into_iter()
            .map(|i| ListedImage {
                id: i.id,
                tags: i.repo_tags,
                labels: i.labels,
                size: i.size.max(0) as u64,
                created: i.created,
            })
            .collect())
    }

    /// Every local tag that starts with `prefix`.
    pub async fn tags_with_prefix(&self, prefix: &str) -> Result<Vec<String>, EngineError> {
        Ok(self.tagged_with_prefix(prefix).await?.into_iter().map(|(tag, _)| tag).collect())
    }

    /// Every local tag that starts with `prefix`, with the id of its image: one call.
    pub async fn tagged_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>, EngineError> {
        let images = self
            .docker
            .list_images(None::<bollard::query_parameters::ListImagesOptions>)
            .await
            .map_err(|source| EngineError::Call { what: "listing images".into(), source })?;
        Ok(images
            .into_iter()
            .flat_map(|i| i.repo_tags.into_iter().map(move |tag| (tag, i.id.clone())))
            .filter(|(tag, _)| tag.starts_with(prefix))
            .collect())
    }

    /// Points `repository:tag` at `id`.
    pub async fn tag(&self, id: &str, repository: &str, tag: &str) -> Result<(), EngineError> {
        let options = TagImageOptionsBuilder::default().repo(repository).tag(tag).build();
        self.docker.tag_image(id, Some(options)).await.map_err(|source| EngineError::Call {
            what: format!("tagging {id} as {repository}:{tag}"),
            source,
        })
    }

    /// Pushes `repository:tag`, reporting each layer's status through `on_status`.
    pub async fn push(
        &self,
        repository: &str,
        tag: &str,
        credentials: Option<&crate::registry::Credentials>,
        mut on_status: impl FnMut(&str),
    ) -> Result<(), EngineError> {
        let reference = format!("{repository}:{tag}");
        let options = bollard::query_parameters::PushImageOptionsBuilder::default().tag(tag).build();
        let credentials = credentials.map(|c| bollard::auth::DockerCredentials {
            username: Some(c.username.clone()),
            password: Some(c.password.clone()),
            serveraddress: repository.split('/').next().map(str::to_string),
            ..Default::default()
        });
        let fail = |message: String| EngineError::Push {
            reference: reference.clone(),
            kind: PushFailure::classify(&message),
            message,
        };
        let mut stream = self.docker.push_image(repository, Some(options), credentials);
        while let Some(item) = stream.next().await {
            let info = match item {
                Ok(info) => info,
                Err(BollardError::DockerStreamError { error }) => return Err(fail(error)),
                Err(e) => return Err(fail(e.to_string())),
            };
            if let Some(message) = info.error_detail.and_then(|d| d.message) {
                return Err(fail(message));
            }
            if let Some(status) = info.status {
                on_status(&status);
            }
        }
        Ok(())
    }

    /// Removes a tag; the image goes too when nothing else references it, its parents stay.
    pub async fn remove_tag(&self, reference: &str) -> Result<(), EngineError> {
        self.remove(reference, true).await.map(drop)
    }

    /// Removes a tag, or an image by id, with the untagged build steps only it needed. Not
    /// forced: the engine refuses while a container uses the image. Whether an image is gone:
    /// removing the last tag of an image that others are built on only untags it.
    pub async fn remove_image(&self, reference: &str) -> Result<bool, EngineError> {
        self.remove(reference, false).await
    }

    /// Whether an image was deleted; one that is gone already counts.
    async fn remove(&self, reference: &str, noprune: bool) -> Result<bool, EngineError> {
        let options = RemoveImageOptionsBuilder::default().noprune(noprune).build();
        match self.docker.remove_image(reference, Some(options), None).await {
            Ok(items) => Ok(items.iter().any(|item| item.deleted.is_some())),
            Err(BollardError::DockerResponseServerError { status_code: 404, .. }) => Ok(true),
            Err(source) => Err(EngineError::Call { what: format!("removing '{reference}'"), source }),
        }
    }

    /// The images containers (running or not) are made from, each with one such container's
    /// name.
    pub async fn images_in_use(&self) -> Result<HashMap<String, String>, EngineError> {
        let options = bollard::query_parameters::ListContainersOptionsBuilder::default().all(true).build();
        let containers = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|source| EngineError::Call { what: "listing containers".into(), source })?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let name = c.names.and_then(|n| n.into_iter().next()).or(c.id)?;
                Some((c.image_id?, name.trim_start_matches('/').to_string()))
            })
            .collect())
    }

    /// Removes every container carrying `label` (running or not) whose value `remove` accepts,
    /// forced: the suites' shared sandboxes after their run. How many went.
    pub async fn remove_containers_labelled(
        &self,
        label: &str,
        remove: impl Fn(&str) -> bool,
    ) -> Result<usize, EngineError> {
        let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
        let options = bollard::query_parameters::ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let containers = self.docker.list_containers(Some(options)).await.map_err(|source| {
            EngineError::Call { what: format!("listing containers labelled {label}"), source }
        })?;
        let force = bollard::query_parameters::RemoveContainerOptionsBuilder::default().force(true).build();
        let mut removed = 0;
        let chosen = containers.into_iter().filter(|c| remove(labelled(&c.labels, label)));
        for id in chosen.filter_map(|c| c.id) {
            if self.docker.remove_container(&id, Some(force.clone())).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes every network carrying `label` whose value `remove` accepts (its containers
    /// removed first: see [`Engine::remove_containers_labelled`]). How many went.
    pub async fn remove_networks_labelled(
        &self,
        label: &str,
        remove: impl Fn(&str) -> bool,
    ) -> Result<usize, EngineError> {
        let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
        let options =
            bollard::query_parameters::ListNetworksOptionsBuilder::default().filters(&filters).build();
        let networks = self.docker.list_networks(Some(options)).await.map_err(|source| {
            EngineError::Call { what: format!("listing networks labelled {label}"), source }
        })?;
        let mut removed = 0;
        // By id: the engine lets two networks share a name, and refuses to remove by it then.
        let chosen = networks.into_iter().filter(|n| remove(labelled(&n.labels, label)));
        for id in chosen.filter_map(|n| n.id) {
            if self.docker.remove_network(&id).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The engine's data directory, when the engine runs on this host (a local socket) and the
    /// directory is visible here.
    pub async fn local_root_dir(&self) -> Option<std::path::PathBuf> {
        let host = std::env::var("DOCKER_HOST").unwrap_or_default();
        if !(host.is_empty() || host.starts_with("unix://")) {
            return None;
        }
        let dir = std::path::PathBuf::from(self.docker.info().await.ok()?.docker_root_dir?);
        dir.is_dir().then_some(dir)
    }

    /// The runtimes the engine has registered (`runc`, and `runsc` where gVisor is).
    pub async fn runtimes(&self) -> Result<Vec<String>, EngineError> {
        let info = self.docker.info().await.map_err(|source| EngineError::Call {
            what: "asking for the engine's runtimes".into(),
            source,
        })?;
        Ok(info.runtimes.map(|r| r.into_keys().collect()).unwrap_or_default())
    }

    /// Pulls `reference` unless it is already present.
    pub async fn ensure_pulled(&self, reference: &str) -> Result<String, EngineError> {
        sandbox_images::engine::ensure_pulled(&self.docker, reference).await
    }

    /// Pulls `reference` for `platform` (`linux/arm64`), and returns the id it then names.
    pub async fn pull_for(&self, reference: &str, platform: &str) -> Result<String, EngineError> {
        sandbox_images::engine::pull(&self.docker, reference, Some(platform)).await
    }

    /// Loads a `docker save`-format archive (the way to add an image with a chosen config).
    pub async fn load(&self, archive: Vec<u8>) -> Result<(), EngineError> {
        let options = ImportImageOptionsBuilder::default().quiet(true).build();
        let mut stream = self.docker.import_image(options, bollard::body_full(archive.into()), None);
        while let Some(item) = stream.next().await {
            item.map_err(|source| EngineError::Call { what: "loading an image archive".into(), source })?;
        }
        Ok(())
    }

    /// Runs one build with the classic builder and returns the new image's id.
    pub async fn build(
        &self,
        context_tar: Vec<u8>,
        build_args: &HashMap<String, String>,
        labels: &HashMap<String, String>,
        mut on_event: impl FnMut(BuildEvent),
    ) -> Result<String, BuildFailure> {
        let options = BuildImageOptionsBuilder::default()
            .dockerfile("Dockerfile")
            .buildargs(build_args)
            .labels(labels)
            .rm(true)
            .forcerm(true)
            .build();
        let mut stream = self.docker.build_image(options, None, Some(bollard::body_full(context_tar.into())));
        let mut tail: VecDeque<String> = VecDeque::with_capacity(TAIL_LINES);
        let mut step = None;
        let mut id = None;
        let failure = |message: String, step: &Option<String>, tail: &VecDeque<String>| BuildFailure {
            message,
            step: step.clone(),
            tail: tail.iter().cloned().collect(),
        };
        while let Some(item) = stream.next().await {
            let info = match item {
                Ok(info) => info,
                Err(BollardError::DockerStreamError { error }) => {
                    return Err(failure(error, &step, &tail));
                }
                Err(e) => return Err(failure(e.to_string(), &step, &tail)),
            };
            if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                return Err(failure(detail, &step, &tail));
            }
            if let Some(BuildInfoAux::Default(image)) = info.aux {
                id = image.id;
            }
            for line in info.stream.iter().flat_map(|s| s.lines()) {
                let line = line.trim_end();
                if line.is_empty() {
                    continue;
                }
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line.to_string());
                if line.starts_with("Step ") {
                    step = Some(line.to_string());
                    on_event(BuildEvent::Step(line.to_string()));
                } else {
                    on_event(BuildEvent::Line(line.to_string()));
                }
            }
        }
        id.ok_or_else(|| failure("the engine reported no image id".into(), &step, &tail))
    }
}

/// The docker CLI's own build of a context folder, with the classic builder the xtask drives
/// through the API: the bench's baseline, so that it compares two drivers of one builder.
pub fn cli_build(
    sh: &xshell::Shell,
    dir: &std::path::Path,
    build_args: &std::collections::BTreeMap<String, String>,
    labels: &HashMap<String, String>,
    tag: &str,
) -> anyhow::Result<()> {
    let _builder = sh.push_env("DOCKER_BUILDKIT", "0");
    let mut args: Vec<String> =
        build_args.iter().flat_map(|(k, v)| ["--build-arg".to_string(), format!("{k}={v}")]).collect();
    let mut labels: Vec<_> = labels.iter().collect();
    labels.sort();
    args.extend(labels.into_iter().flat_map(|(k, v)| ["--label".to_string(), format!("{k}={v}")]));
    xshell::cmd!(sh, "docker build --quiet {args...} --tag {tag} {dir}").quiet().ignore_stdout().run()?;
    Ok(())
}

/// The value of `label` among `labels` (empty where it has none).
fn labelled<'a>(labels: &'a Option<HashMap<String, String>>, label: &str) -> &'a str {
    labels.as_ref().and_then(|l| l.get(label)).map_or("", String::as_str)
}
