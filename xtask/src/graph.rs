//! The image graph: one node per folder under images/, edges read from each Dockerfile's `FROM`.
//!
//! Pure: it reads files and nothing else, so it is unit-tested without an engine. The Dockerfiles
//! are the single source of truth; no list of images exists anywhere else.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::project::LOCAL_PREFIX;

/// The build arg a root image takes its OS layer through: the build replaces it with the layer it
/// chose (os.rs).
pub const OS_ARG: &str = "OS_IMAGE";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GraphError {
    #[error("cannot read the images folder '{dir}': {message}")]
    ReadDir { dir: PathBuf, message: String },
    #[error("'{dir}' has no Dockerfile: every folder under images/ is an image")]
    MissingDockerfile { dir: PathBuf },
    #[error(
        "'{dir}' is not a valid image name: use lowercase letters, digits and '-', starting with a letter, at most 63 characters"
    )]
    InvalidName { dir: PathBuf },
    #[error("{file}: no FROM instruction")]
    NoFrom { file: PathBuf },
    #[error(
        "{file}:{line}: FROM {reference} names a local image directly; declare `ARG BASE_IMAGE={reference}` and use `FROM ${{BASE_IMAGE}}` so the build can pass the exact parent"
    )]
    LiteralLocalFrom { file: PathBuf, line: usize, reference: String },
    #[error(
        "{file}:{line}: FROM uses ${{{arg}}}, which no ARG before the first FROM declares with a default"
    )]
    UndeclaredArg { file: PathBuf, line: usize, arg: String },
    #[error(
        "{file}:{line}: the image '{image}' is built FROM '{parent}', but there is no folder images/{parent}"
    )]
    UnknownParent { file: PathBuf, line: usize, image: String, parent: String },
    #[error("{file}:{line}: '{image}' already has the local parent '{first}'; an image has at most one")]
    MultipleParents { file: PathBuf, line: usize, image: String, first: String },
    #[error("the images form a cycle: {}", .cycle.join(" -> "))]
    Cycle { cycle: Vec<String> },
    #[error("no image is named '{name}' (known: {})", .known.join(", "))]
    UnknownImage { name: String, known: Vec<String> },
}

/// What an image is built on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Base {
    /// Another node of the graph, passed to the build through the build arg `arg`.
    Local { image: String, arg: String },
    /// An image from outside the graph (a registry reference), possibly through a build arg.
    External { reference: String, arg: Option<String> },
}

impl Base {
    /// The build arg that names it, if any.
    pub fn arg(&self) -> Option<&str> {
        match self {
            Base::Local { arg, .. } => Some(arg),
            Base::External { arg, .. } => arg.as_deref(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageNode {
    pub name: String,
    pub dir: PathBuf,
    pub dockerfile: String,
    pub base: Base,
}

impl ImageNode {
    pub fn parent(&self) -> Option<&str> {
        match &self.base {
            Base::Local { image, .. } => Some(image),
            Base::External { .. } => None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ImageGraph {
    nodes: BTreeMap<String, ImageNode>,
}

impl ImageGraph {
    /// Reads every folder of `images_dir` as a node.
    pub fn discover(images_dir: &Path) -> Result<ImageGraph, GraphError> {
        let read_err =
            |e: std::io::Error| GraphError::ReadDir { dir: images_dir.to_path_buf(), message: e.to_string() };
        let mut sources = Vec::new();
        for entry in std::fs::read_dir(images_dir).map_err(read_err)? {
            let entry = entry.map_err(read_err)?;
            if !entry.file_type().map_err(read_err)?.is_dir() {
                continue;
            }
            let dir = entry.path();
            let dockerfile = dir.join("Dockerfile");
            let text = match std::fs::read_to_string(&dockerfile) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(GraphError::MissingDockerfile { dir });
                }
                Err(e) => return Err(read_err(e)),
            };
            sources.push((dir, text));
        }
        ImageGraph::from_dockerfiles(sources)
    }

    /// Builds the graph from (folder, Dockerfile text) pairs; the folder's last component is the name.
    pub fn from_dockerfiles(
        sources: impl IntoIterator<Item = (PathBuf, String)>,
    ) -> Result<ImageGraph, GraphError> {
        let mut nodes = BTreeMap::new();
        for (dir, text) in sources {
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if !valid_name(&name) {
                return Err(GraphError::InvalidName { dir });
            }
            let file = dir.join("Dockerfile");
            let base = parse_base(&name, &file, &text)?;
            nodes.insert(name.clone(), ImageNode { name, dir, dockerfile: text, base });
        }
        let graph = ImageGraph { nodes };
        graph.check_parents()?;
        graph.topo_order()?;
        Ok(graph)
    }

    fn check_parents(&self) -> Result<(), GraphError> {
        for node in self.nodes.values() {
            if let Some(parent) = node.parent()
                && !self.nodes.contains_key(parent)
            {
                let line = find_line(&node.dockerfile, &format!("{LOCAL_PREFIX}{parent}"));
                return Err(GraphError::UnknownParent {
                    file: node.dir.join("Dockerfile"),
                    line,
                    image: node.name.clone(),
                    parent: parent.to_string(),
                });
            }
        }
        Ok(())
    }

    /// The pinned reference of the root images among `order` that take the OS layer through
    /// [`OS_ARG`]: what the build replaces with the OS layer it chose.
    pub fn os_reference(&self, order: &[String]) -> Option<&str> {
        order.iter().filter_map(|n| self.get(n)).find_map(|node| match &node.base {
            Base::External { reference, arg: Some(arg) } if arg == OS_ARG => Some(reference.as_str()),
            _ => None,
        })
    }

    pub fn get(&self, name: &str) -> Option<&ImageNode> {
        self.nodes.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn children(&self, name: &str) -> Vec<&str> {
        self.nodes.values().filter(|n| n.parent() == Some(name)).map(|n| n.name.as_str()).collect()
    }

    /// Every image below `name`, nearest first.
    pub fn descendants(&self, name: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut queue = vec![name];
        while let Some(current) = queue.pop() {
            for child in self.children(current) {
                out.push(child);
                queue.push(child);
            }
        }
        out
    }

    /// Parents first; ties broken by name, so the order is stable.
    pub fn topo_order(&self) -> Result<Vec<&str>, GraphError> {
        let mut order = Vec::with_capacity(self.nodes.len());
        let mut done = BTreeSet::new();
        let mut ready: BTreeSet<&str> =
            self.nodes.values().filter(|n| n.parent().is_none()).map(|n| n.name.as_str()).collect();
        while let Some(name) = ready.pop_first() {
            order.push(name);
            done.insert(name);
            ready.extend(self.children(name));
        }
        if order.len() < self.nodes.len() {
            return Err(GraphError::Cycle { cycle: self.find_cycle(&done) });
        }
        Ok(order)
    }

    fn find_cycle(&self, done: &BTreeSet<&str>) -> Vec<String> {
        // Every node has at most one parent, so following parents from any unordered node must
        // come back to a node already seen: that loop is the cycle.
        let start = self.nodes.keys().find(|n| !done.contains(n.as_str())).expect("a node left");
        let mut path: Vec<String> = vec![start.clone()];
        let mut current = start.as_str();
        while let Some(parent) = self.nodes[current].parent() {
            if let Some(pos) = path.iter().position(|p| p == parent) {
                let mut cycle = path[pos..].to_vec();
                cycle.reverse();
                cycle.insert(0, parent.to_string());
                return cycle;
            }
            path.push(parent.to_string());
            current = parent;
        }
        path
    }

    /// The named images and all their ancestors, in build order. Empty `names` selects all.
    pub fn closure<'a>(&'a self, names: &[String]) -> Result<Vec<&'a str>, GraphError> {
        let order = self.topo_order()?;
        if names.is_empty() {
            return Ok(order);
        }
        let mut wanted = BTreeSet::new();
        for name in names {
            let mut current = self.nodes.get(name.as_str()).ok_or_else(|| GraphError::UnknownImage {
                name: name.clone(),
                known: self.nodes.keys().cloned().collect(),
            })?;
            loop {
                wanted.insert(current.name.as_str());
                match current.parent() {
                    Some(parent) => current = &self.nodes[parent],
                    None => break,
                }
            }
        }
        Ok(order.into_iter().filter(|n| wanted.contains(n)).collect())
    }

    /// A tree, roots first, children sorted by name.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for root in self.nodes.values().filter(|n| n.parent().is_none()) {
            if let Base::External { reference, .. } = &root.base {
                let _ = writeln!(out, "{}  (from {reference})", root.name);
            }
            self.render_children(&root.name, "", &mut out);
        }
        out
    }

    fn render_children(&self, name: &str, indent: &str, out: &mut String) {
        let children = self.children(name);
        for (i, child) in children.iter().enumerate() {
            let last = i + 1 == children.len();
            let _ = writeln!(out, "{indent}{}{child}", if last { "└── " } else { "├── " });
            let deeper = format!("{indent}{}", if last { "    " } else { "│   " });
            self.render_children(child, &deeper, out);
        }
    }

    pub fn render_json(&self) -> String {
        #[derive(Serialize)]
        struct JsonNode<'a> {
            name: &'a str,
            parent: Option<&'a str>,
            base: &'a Base,
            children: Vec<&'a str>,
        }
        let order = self.topo_order().unwrap_or_default();
        let nodes: Vec<JsonNode> = order
            .iter()
            .map(|name| {
                let node = &self.nodes[*name];
                JsonNode { name, parent: node.parent(), base: &node.base, children: self.children(name) }
            })
            .collect();
        serde_json::to_string_pretty(&serde_json::json!({ "images": nodes })).expect("the graph serialises")
    }

    pub fn render_dot(&self) -> String {
        let mut out = String::from("digraph images {\n  rankdir=LR;\n  node [shape=box];\n");
        for node in self.nodes.values() {
            match &node.base {
                Base::Local { image, .. } => {
                    let _ = writeln!(out, "  \"{image}\" -> \"{}\";", node.name);
                }
                Base::External { reference, .. } => {
                    let _ = writeln!(out, "  \"{reference}\" [shape=ellipse, style=dashed];");
                    let _ = writeln!(out, "  \"{reference}\" -> \"{}\";", node.name);
                }
            }
        }
        out.push_str("}\n");
        out
    }
}

/// An image name: a lowercase letter, then lowercase letters, digits and inner hyphens.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-'))
        && !name.ends_with('-')
        // The inputs tag is `<name>-<64 hex digits>` and a tag has at most 128 characters.
        && name.len() <= 63
}

fn find_line(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).map_or(1, |i| i + 1)
}

fn parse_base(name: &str, file: &Path, text: &str) -> Result<Base, GraphError> {
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut stages: BTreeSet<String> = BTreeSet::new();
    let mut base: Option<(usize, Base)> = None;
    let mut seen_from = false;
    for ins in crate::dockerfile::instructions(text) {
        match ins.keyword.as_str() {
            "ARG" if !seen_from => {
                if let Some((key, value)) = ins.args.split_once('=') {
                    args.insert(key.trim().to_string(), crate::dockerfile::unquote(value.trim()).to_string());
                }
            }
            "FROM" => {
                seen_from = true;
                let mut words = ins.args.split_whitespace().filter(|w| !w.starts_with("--"));
                let reference = words.next().unwrap_or_default().to_string();
                if let (Some(kw), Some(alias)) = (words.next(), words.next())
                    && kw.eq_ignore_ascii_case("as")
                {
                    stages.insert(alias.to_string());
                }
                if stages.contains(&reference) {
                    continue;
                }
                let this = resolve_from(file, ins.line, &reference, &args)?;
                match (&base, &this) {
                    (None, _) => base = Some((ins.line, this)),
                    (Some((_, Base::Local { image: first, .. })), Base::Local { .. }) => {
                        return Err(GraphError::MultipleParents {
                            file: file.to_path_buf(),
                            line: ins.line,
                            image: name.to_string(),
                            first: first.clone(),
                        });
                    }
                    // A build stage on an external image next to the local parent: the local
                    // one is the edge that matters.
                    (Some((_, Base::External { .. })), Base::Local { .. }) => base = Some((ins.line, this)),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    base.map(|(_, b)| b).ok_or_else(|| GraphError::NoFrom { file: file.to_path_buf() })
}

fn resolve_from(
    file: &Path,
    line: usize,
    reference: &str,
    args: &BTreeMap<String, String>,
) -> Result<Base, GraphError> {
    let arg_name = reference
        .strip_prefix("${")
        .and_then(|r| r.strip_suffix('}'))
        .or_else(|| reference.strip_prefix('$'));
    match arg_name {
        Some(arg) => {
            let value = args.get(arg).ok_or_else(|| GraphError::UndeclaredArg {
                file: file.to_path_buf(),
                line,
                arg: arg.to_string(),
            })?;
            Ok(match value.strip_prefix(LOCAL_PREFIX) {
                Some(image) if !value.contains(['/', ':', '@']) => {
                    Base::Local { image: image.to_string(), arg: arg.to_string() }
                }
                _ => Base::External { reference: value.clone(), arg: Some(arg.to_string()) },
            })
        }
        None if reference.starts_with(LOCAL_PREFIX) && !reference.contains(['/', ':', '@']) => {
            Err(GraphError::LiteralLocalFrom {
                file: file.to_path_buf(),
                line,
                reference: reference.to_string(),
            })
        }
        None => Ok(Base::External { reference: reference.to_string(), arg: None }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Result<ImageGraph, GraphError> {
        ImageGraph::from_dockerfiles(
            files.iter().map(|(name, text)| (PathBuf::from("images").join(name), text.to_string())),
        )
    }

    const OS: &str = "ARG OS_IMAGE=debian:trixie-slim@sha256:abc\nFROM ${OS_IMAGE}\n";

    fn child(parent: &str) -> String {
        format!("ARG BASE_IMAGE=agent-{parent}\nFROM ${{BASE_IMAGE}}\nRUN true\n")
    }

    /// os → base → {shell, node → claude}
    fn sample() -> ImageGraph {
        graph(&[
            ("shell", &child("base")),
            ("node", &child("base")),
            ("claude", &child("node")),
            ("base", &child("os")),
            ("os", OS),
        ])
        .unwrap()
    }

    #[test]
    fn orders_parents_before_children_and_picks_ready_images_by_name() {
        let g = sample();
        assert_eq!(g.topo_order().unwrap(), ["os", "base", "node", "claude", "shell"]);
    }

    #[test]
    fn closure_adds_ancestors_only() {
        let g = sample();
        assert_eq!(g.closure(&["claude".into()]).unwrap(), ["os", "base", "node", "claude"]);
        assert_eq!(g.closure(&[]).unwrap().len(), 5);
        let err = g.closure(&["nope".into()]).unwrap_err();
        assert!(err.to_string().starts_with("no image is named 'nope' (known: base, claude"));
    }

    #[test]
    fn descendants_follow_every_level() {
        let g = graph(&[
            ("node", &child("base")),
            ("claude", &child("node")),
            ("base", &child("os")),
            ("os", OS),
        ])
        .unwrap();
        let mut d = g.descendants("base");
        d.sort();
        assert_eq!(d, ["claude", "node"]);
        assert!(g.descendants("claude").is_empty());
    }

    #[test]
    fn a_cycle_is_rejected_and_named() {
        let err =
            graph(&[("a", &child("b")), ("b", &child("c")), ("c", &child("a")), ("os", OS)]).unwrap_err();
        assert_eq!(err, GraphError::Cycle { cycle: vec!["a".into(), "c".into(), "b".into(), "a".into()] });
        assert_eq!(err.to_string(), "the images form a cycle: a -> c -> b -> a");
    }

    #[test]
    fn a_self_parent_is_a_cycle() {
        let err = graph(&[("a", &child("a"))]).unwrap_err();
        assert_eq!(err.to_string(), "the images form a cycle: a -> a");
    }

    #[test]
    fn an_unknown_parent_is_rejected_with_file_and_line() {
        let err =
            graph(&[("shell", "# shell\nARG BASE_IMAGE=agent-bsae\nFROM ${BASE_IMAGE}\n")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "images/shell/Dockerfile:2: the image 'shell' is built FROM 'bsae', but there is no folder images/bsae"
        );
    }

    #[test]
    fn a_folder_without_dockerfile_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("os")).unwrap();
        std::fs::write(dir.path().join("os/Dockerfile"), OS).unwrap();
        std::fs::create_dir_all(dir.path().join("empty")).unwrap();
        let err = ImageGraph::discover(dir.path()).unwrap_err();
        assert_eq!(err, GraphError::MissingDockerfile { dir: dir.path().join("empty") });
    }

    #[test]
    fn discover_reads_folders_and_ignores_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("os")).unwrap();
        std::fs::write(dir.path().join("os/Dockerfile"), OS).unwrap();
        std::fs::create_dir_all(dir.path().join("base")).unwrap();
        std::fs::write(dir.path().join("base/Dockerfile"), child("os")).unwrap();
        std::fs::write(dir.path().join("README.md"), "not an image").unwrap();
        let g = ImageGraph::discover(dir.path()).unwrap();
        assert_eq!(g.topo_order().unwrap(), ["os", "base"]);
    }

    #[test]
    fn a_literal_local_from_is_rejected() {
        let err = graph(&[("base", "FROM agent-os\n"), ("os", OS)]).unwrap_err();
        assert!(matches!(err, GraphError::LiteralLocalFrom { line: 1, .. }), "{err}");
    }

    #[test]
    fn an_undeclared_arg_is_rejected() {
        let err = graph(&[("base", "FROM ${NOPE}\n")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "images/base/Dockerfile:1: FROM uses ${NOPE}, which no ARG before the first FROM declares with a default"
        );
    }

    #[test]
    fn a_missing_from_is_rejected() {
        let err = graph(&[("base", "RUN true\n")]).unwrap_err();
        assert_eq!(err.to_string(), "images/base/Dockerfile: no FROM instruction");
    }

    #[test]
    fn invalid_folder_names_are_rejected() {
        for bad in ["Base", "1base", "ba_se", "base-", "-base", "bäse"] {
            assert!(graph(&[(bad, OS)]).is_err(), "{bad:?} accepted");
        }
        assert!(graph(&[("base-2", OS)]).is_ok());
        assert!(graph(&[(&"a".repeat(64), OS)]).is_err());
        assert!(graph(&[(&"a".repeat(63), OS)]).is_ok());
    }

    #[test]
    fn build_stages_and_flags_do_not_make_edges() {
        let text = "ARG BASE_IMAGE=agent-base\nFROM --platform=linux/amd64 ${BASE_IMAGE} AS build\nRUN true\nFROM build\n";
        let g = graph(&[("x", text), ("base", OS)]).unwrap();
        assert_eq!(g.get("x").unwrap().parent(), Some("base"));
    }

    #[test]
    fn two_local_parents_are_rejected() {
        let text = "ARG A=agent-os\nARG B=agent-os\nFROM ${A} AS one\nFROM ${B}\n";
        let err = graph(&[("x", text), ("os", OS)]).unwrap_err();
        assert!(matches!(err, GraphError::MultipleParents { line: 4, .. }), "{err}");
    }

    #[test]
    fn external_bases_keep_their_reference() {
        let g = graph(&[("os", OS)]).unwrap();
        assert_eq!(
            g.get("os").unwrap().base,
            Base::External {
                reference: "debian:trixie-slim@sha256:abc".into(),
                arg: Some("OS_IMAGE".into())
            }
        );
    }

    #[test]
    fn renders_text_json_and_dot() {
        let g = sample();
        insta::assert_snapshot!("graph_text", g.render_text());
        insta::assert_snapshot!("graph_dot", g.render_dot());
        insta::assert_snapshot!("graph_json", g.render_json());
    }
}
