//! containerd for the node agent: a private containerd daemon started as the agent's child
//! ([`daemon`]), its configuration and CNI network ([`config`]), the images every node needs
//! without a registry, built locally from the host's static busybox and imported
//! ([`image`], written as OCI layouts with [`tar`]), and a per-test containerd
//! ([`testing::TestContainerd`]).
//!
//! `setpoint up` needs no setup where containerd is installed: [`LocalContainerd`] uses a
//! running containerd ([`daemon::find_system_endpoint`]) or starts its own under the data
//! dir, as k3s does with its bundled one.

pub mod config;
pub mod daemon;
pub mod image;
pub mod tar;
pub mod testing;

pub use daemon::{
    find_system_endpoint, ContainerdDaemon, DaemonOptions, LocalContainerd, SYSTEM_SOCKET,
};
pub use image::{ensure_local_images, BUSYBOX_IMAGE, PAUSE_IMAGE};
pub use testing::TestContainerd;

/// What went wrong starting, driving or feeding containerd.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    /// Something this needs is not installed; the message says what to install.
    #[error("{0}")]
    Missing(String),
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// containerd did not start (the message points at its log).
    #[error("containerd did not start: {0}")]
    Start(String),
    /// A command (`ctr`, `containerd --version`) failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it ended.
        status: String,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// An image could not be built or is not in containerd after its import.
    #[error("image: {0}")]
    Image(String),
}

impl ContainerdError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| ContainerdError::Io { context, source }
    }
}
