//! The container suites: one test binary, one module per area.

mod agents;
mod arm64;
mod attacks;
mod browser;
mod build;
mod contract;
mod examples;
mod firewall;
mod forward;
mod k8s;
mod keys;
mod launcher;
mod names;
mod os;
mod podman;
mod privileges;
mod prune;
mod publish;
mod refusals;
mod session;
mod state;
mod ui;
