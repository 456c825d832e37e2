//! `setpoint bench`: load any Kubernetes-compatible cluster through its public API and report
//! figures people can read.
//!
//! Every benchmark works the same way: the driver ([`density`], [`churn`], [`api`]) only
//! *observes* — it appends timestamped [`record::Entry`]s to a [`record::Recorder`] — and every
//! figure in a report is computed afterwards by a pure function of that raw log ([`report`]).
//! The log can be written out (`--raw-log`), so a report can always be recomputed, checked
//! and compared ([`compare`]) from what was actually seen.
//!
//! - [`record`]: the raw event log (one JSON line per observation, microseconds since start);
//! - [`observe`]: the watch recorder (pods created / scheduled / Running, Deployments Available);
//! - [`placement`]: which nodes a run's pods may go to, and the taint that keeps others off;
//! - [`timed`]: API calls timed as the client saw them, with retries;
//! - [`procstat`]: peak RSS and CPU seconds of local `setpoint` processes;
//! - [`report`]: the pure computations; [`table`] and [`svg`] render them;
//! - [`progress`]: the progress line on stderr.

pub mod api;
pub mod churn;
pub mod compare;
pub mod density;
pub mod endpointslices;
pub mod observe;
pub mod placement;
pub mod procstat;
pub mod progress;
pub mod record;
pub mod report;
pub mod svg;
pub mod table;
pub mod timed;

use setpoint_runtime::client::ClientError;

/// Why a benchmark could not run (not: why the cluster was slow — that goes in the report).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The API answered with an error the benchmark cannot go on without.
    #[error("API: {0}")]
    Client(#[from] ClientError),
    /// Writing the raw log or an output file failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A raw log line or report did not parse.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The simulated nodes failed.
    #[error("simulated nodes: {0}")]
    Nodes(String),
    /// A precondition of the run did not hold within its deadline.
    #[error("{0}")]
    Setup(String),
}
