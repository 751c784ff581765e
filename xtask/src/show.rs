//! `cargo xtask graph`: the image graph as text, JSON or Graphviz dot (graph.rs renders it).

use std::path::Path;

use crate::graph::ImageGraph;

impl crate::flags::GraphFlags {
    pub fn run(self, root: &Path) -> anyhow::Result<()> {
        let graph = ImageGraph::discover(&root.join("images"))?;
        let out = if self.json {
            graph.render_json()
        } else if self.dot {
            graph.render_dot()
        } else {
            graph.render_text()
        };
        print!("{out}");
        if !out.ends_with('\n') {
            println!();
        }
        Ok(())
    }
}
