//! The agent-sandbox build system as a library: the binary and the container suites share it.

pub mod bench;
pub mod build;
pub mod card;
pub mod ci;
pub mod context;
pub mod dockerfile;
pub mod engine;
pub mod flags;
pub mod graph;
pub use sandbox_images::labels;
pub mod list;
pub use sandbox_images::lock;
pub mod new_agent;
pub mod options;
pub mod os;
pub mod plan;
pub mod progress;
pub mod project;
pub mod prune;
pub mod publish;
pub mod registry;
pub mod report;
pub mod setup;
pub mod show;
pub mod test;
pub mod walk;
