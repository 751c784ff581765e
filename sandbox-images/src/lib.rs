//! What the build system (xtask) and the launcher (agent-sandbox) share about the images: their
//! labels, how they are named and tagged, images.lock and the local record beside it, and the
//! engine connection with the pull of an image by its pinned digest. Its own crate so that the
//! launcher a user installs does not bring the build system with it.

pub mod engine;
pub mod labels;
pub mod lock;
pub mod naming;
pub mod platform;
