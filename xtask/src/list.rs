//! `cargo xtask list`: the agent images the engine holds, found by their labels (what users would
//! otherwise do with `docker images --filter label=…`).

use std::collections::HashMap;

use crate::engine::{Engine, ListedImage};
use crate::labels;
use crate::lock::LocalImages;
use crate::platform::Platform;

/// What an image adds to the image it was built on (`built_on`: image id → that image's id, from
/// the local record), when both are listed.
fn own_bytes(image: &ListedImage, images: &[ListedImage], built_on: &HashMap<String, String>) -> Option<u64> {
    let parent = built_on.get(&image.id)?;
    let parent = images.iter().find(|i| &i.id == parent)?;
    Some(image.size.saturating_sub(parent.size))
}

/// Image id → the id it was built on, for every image the local records of `lock` name (every
/// platform's).
pub fn built_on(lock: &std::path::Path) -> HashMap<String, String> {
    Platform::ALL
        .iter()
        .filter_map(|&platform| LocalImages::read_for(lock, platform).ok())
        .flat_map(|local| local.images.into_values().map(|i| (i.id, i.from)))
        .collect()
}

/// The images to show: the agent images, or with `all` every image of the project.
fn shown(images: &[ListedImage], all: bool) -> impl Iterator<Item = &ListedImage> {
    images.iter().filter(move |image| all || image.labels.contains_key(labels::AGENT_NAME))
}

/// One row per image, its tags gathered in one column (the inputs index and the bench's copies
/// left out: bookkeeping), sorted by image name then id. OWN is what the image adds to the one
/// it was built on.
pub fn render(images: &[ListedImage], all: bool, built_on: &HashMap<String, String>) -> String {
    let mut rows: Vec<[String; 7]> = Vec::new();
    for image in shown(images, all) {
        let name = image.labels.get(labels::IMAGE).cloned().unwrap_or_default();
        let version = image.labels.get(labels::AGENT_VERSION).cloned().unwrap_or("-".into());
        let id = image.id.trim_start_matches("sha256:").chars().take(12).collect::<String>();
        let size = format!("{:.0} MB", image.size as f64 / 1e6);
        let own = own_bytes(image, images, built_on)
            .map_or("-".to_string(), |b| format!("{:.0} MB", b as f64 / 1e6));
        let mut tags: Vec<&str> = image
            .tags
            .iter()
            .map(String::as_str)
            .filter(|t| {
                !t.starts_with(crate::project::INPUTS_REPOSITORY)
                    && !t.starts_with(crate::project::BENCH_REPOSITORY)
            })
            .collect();
        tags.sort();
        let tags = if tags.is_empty() { "-".to_string() } else { tags.join(", ") };
        let platform = image.labels.get(labels::PLATFORM).cloned().unwrap_or("-".into());
        rows.push([name, platform, id, size, own, version, tags]);
    }
    rows.sort();
    let header = ["IMAGE", "PLATFORM", "ID", "SIZE", "OWN", "CLI VERSION", "TAGS"].map(String::from);
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().chain([&header]).map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `--json`: every tag kept.
pub fn render_json(images: &[ListedImage], all: bool, built_on: &HashMap<String, String>) -> String {
    let mut list: Vec<serde_json::Value> = shown(images, all)
        .map(|image| {
            let mut tags = image.tags.clone();
            tags.sort();
            serde_json::json!({
                "image": image.labels.get(labels::IMAGE),
                "platform": image.labels.get(labels::PLATFORM),
                "id": image.id,
                "tags": tags,
                "size": image.size,
                "own_size": own_bytes(image, images, built_on),
                "cli_version": image.labels.get(labels::AGENT_VERSION),
            })
        })
        .collect();
    list.sort_by_key(|v| (v["image"].to_string(), v["platform"].to_string(), v["id"].to_string()));
    serde_json::to_string_pretty(&list).unwrap_or_default() + "\n"
}

impl crate::flags::ListFlags {
    pub async fn run(self) -> anyhow::Result<()> {
        let engine = Engine::connect().await?;
        let images = engine.images_with_label(labels::IMAGE).await?;
        let built_on = built_on(&crate::project::root().join(crate::lock::FILE_NAME));
        if self.json {
            print!("{}", render_json(&images, self.all, &built_on));
        } else {
            print!("{}", render(&images, self.all, &built_on));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_images_one_row_per_image_with_its_tags_gathered() {
        let image = |name: &str, agent: Option<&str>, tags: &[&str]| {
            let platform =
                if tags.iter().any(|t| t.ends_with("-arm64")) { "linux/arm64" } else { "linux/amd64" };
            let mut labels = HashMap::from([
                (labels::IMAGE.to_string(), name.to_string()),
                (labels::PLATFORM.to_string(), platform.to_string()),
            ]);
            if let Some(version) = agent {
                labels.insert(labels::AGENT_NAME.to_string(), name.to_string());
                labels.insert(labels::AGENT_VERSION.to_string(), version.to_string());
            }
            ListedImage {
                id: format!("sha256:{name}{}0123456789abcdef", &platform[6..]),
                tags: tags.iter().map(|t| t.to_string()).collect(),
                labels,
                size: if name == "base" { 252_000_000 } else { 1_720_000_000 },
                created: 0,
            }
        };
        let images = [
            image(
                "claude",
                Some("2.1.332"),
                &[
                    "localhost/agent-sandbox/agent-claude:0.1.0",
                    "localhost/agent-sandbox/agent-claude:sha-0123456789ab",
                    "agent-sandbox-bench/claude:latest",
                    "localhost/agent-sandbox/inputs:claude-ab",
                ],
            ),
            image("base", None, &["localhost/agent-sandbox/agent-base:0.1.0"]),
            image("codex", Some("0.169.0"), &["localhost/agent-sandbox/agent-codex:0.1.0"]),
            image("claude", Some("2.1.332"), &["localhost/agent-sandbox/agent-claude:0.1.0-arm64"]),
        ];
        // claude was built on base; codex on an image no longer listed.
        let built_on = HashMap::from([
            (images[0].id.clone(), images[1].id.clone()),
            (images[2].id.clone(), "sha256:gone".to_string()),
        ]);
        insta::assert_snapshot!("list_agents", render(&images, false, &built_on));
        insta::assert_snapshot!("list_all", render(&images, true, &built_on));
        let json: serde_json::Value = serde_json::from_str(&render_json(&images, false, &built_on)).unwrap();
        assert_eq!(json[0]["own_size"], 1_468_000_000, "{json}");
        assert_eq!(json[0]["tags"].as_array().map(Vec::len), Some(4), "--json keeps every tag: {json}");
    }
}
