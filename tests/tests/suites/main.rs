//! The container suites: one test binary, one module per area.

mod build;
mod os;
