//! `cargo xtask list`: the agent images the engine holds, found by their labels (what users would
//! otherwise do with `docker images --filter label=…`).

use crate::engine::{Engine, ListedImage};
use crate::labels;

/// One row per tag, sorted by image name then tag.
pub fn render(images: &[ListedImage], all: bool) -> String {
    let mut rows: Vec<[String; 5]> = Vec::new();
    for image in images {
        let name = image.labels.get(labels::IMAGE).cloned().unwrap_or_default();
        let version = image.labels.get(labels::AGENT_VERSION).cloned();
        if !all && !image.labels.contains_key(labels::AGENT_NAME) {
            continue;
        }
        let id = image.id.trim_start_matches("sha256:").chars().take(12).collect::<String>();
        let size = format!("{:.0} MB", image.size as f64 / 1e6);
        // Only the project's own tags: the inputs tags are bookkeeping.
        for tag in image.tags.iter().filter(|t| !t.contains("/agent-sandbox/inputs:")) {
            rows.push([
                name.clone(),
                tag.clone(),
                id.clone(),
                size.clone(),
                version.clone().unwrap_or("-".into()),
            ]);
        }
    }
    rows.sort();
    let header = ["IMAGE", "TAG", "ID", "SIZE", "CLI VERSION"].map(String::from);
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

impl crate::flags::ListFlags {
    pub async fn run(self) -> anyhow::Result<()> {
        let engine = Engine::connect().await?;
        let images = engine.images_with_label(labels::IMAGE).await?;
        print!("{}", render(&images, self.all));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agent_images_one_row_per_tag() {
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
                &["localhost/agent-sandbox/agent-claude:0.1.0", "localhost/agent-sandbox/inputs:claude-ab"],
            ),
            image("base", None, &["localhost/agent-sandbox/agent-base:0.1.0"]),
            image("codex", Some("0.169.0"), &["localhost/agent-sandbox/agent-codex:0.1.0"]),
        ];
        insta::assert_snapshot!("list_agents", render(&images, false));
        insta::assert_snapshot!("list_all", render(&images, true));
    }
}
