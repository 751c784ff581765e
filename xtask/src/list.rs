//! `cargo xtask list`: the agent images the engine holds, found by their labels (what users would
//! otherwise do with `docker images --filter label=…`).

use crate::engine::{Engine, ListedImage};
use crate::labels;

/// The images to show: the agent images, or with `all` every image of the project.
fn shown(images: &[ListedImage], all: bool) -> impl Iterator<Item = &ListedImage> {
    images.iter().filter(move |image| all || image.labels.contains_key(labels::AGENT_NAME))
}

/// One row per image, its tags gathered in one column (the inputs index and the bench's copies
/// left out: bookkeeping), sorted by image name then id.
pub fn render(images: &[ListedImage], all: bool) -> String {
    let mut rows: Vec<[String; 5]> = Vec::new();
    for image in shown(images, all) {
        let name = image.labels.get(labels::IMAGE).cloned().unwrap_or_default();
        let version = image.labels.get(labels::AGENT_VERSION).cloned().unwrap_or("-".into());
        let id = image.id.trim_start_matches("sha256:").chars().take(12).collect::<String>();
        let size = format!("{:.0} MB", image.size as f64 / 1e6);
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
        rows.push([name, id, size, version, tags]);
    }
    rows.sort();
    let header = ["IMAGE", "ID", "SIZE", "CLI VERSION", "TAGS"].map(String::from);
    let widths: Vec<usize> = (0..5)
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
pub fn render_json(images: &[ListedImage], all: bool) -> String {
    let mut list: Vec<serde_json::Value> = shown(images, all)
        .map(|image| {
            let mut tags = image.tags.clone();
            tags.sort();
            serde_json::json!({
                "image": image.labels.get(labels::IMAGE),
                "id": image.id,
                "tags": tags,
                "size": image.size,
                "cli_version": image.labels.get(labels::AGENT_VERSION),
            })
        })
        .collect();
    list.sort_by_key(|v| (v["image"].to_string(), v["id"].to_string()));
    serde_json::to_string_pretty(&list).unwrap_or_default() + "\n"
}

impl crate::flags::ListFlags {
    pub async fn run(self) -> anyhow::Result<()> {
        let engine = Engine::connect().await?;
        let images = engine.images_with_label(labels::IMAGE).await?;
        if self.json {
            print!("{}", render_json(&images, self.all));
        } else {
            print!("{}", render(&images, self.all));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agent_images_one_row_per_image_with_its_tags_gathered() {
        let image = |name: &str, agent: Option<&str>, tags: &[&str]| {
            let mut labels = HashMap::from([(labels::IMAGE.to_string(), name.to_string())]);
            if let Some(version) = agent {
                labels.insert(labels::AGENT_NAME.to_string(), name.to_string());
                labels.insert(labels::AGENT_VERSION.to_string(), version.to_string());
            }
            ListedImage {
                id: format!("sha256:{name}0123456789abcdef"),
                tags: tags.iter().map(|t| t.to_string()).collect(),
                labels,
                size: 1_720_000_000,
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
        ];
        insta::assert_snapshot!("list_agents", render(&images, false));
        insta::assert_snapshot!("list_all", render(&images, true));
        let json: serde_json::Value = serde_json::from_str(&render_json(&images, false)).unwrap();
        assert_eq!(json[0]["tags"].as_array().map(Vec::len), Some(4), "--json keeps every tag: {json}");
    }
}
