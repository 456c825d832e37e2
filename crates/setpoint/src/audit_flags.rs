//! kube-apiserver's audit flags (`--audit-policy-file`, `--audit-log-*`), which `setpoint
//! server` and `setpoint up` both take.

use std::path::PathBuf;

use setpoint_apiserver::audit::{sink::Rotation, AuditOptions, Format, Mode};

/// Audit logging: off unless both a policy file and a log path are given.
#[derive(clap::Args, Clone, Debug)]
pub struct AuditFlags {
    /// The audit policy (`audit.k8s.io/v1` `Policy`, YAML or JSON); without it nothing is
    /// audited.
    #[arg(long)]
    audit_policy_file: Option<PathBuf>,
    /// Where audit events are written, `-` for standard output; without it nothing is
    /// audited.
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// Days a rotated audit log is kept (0: no limit).
    #[arg(long, default_value_t = 0)]
    audit_log_maxage: u64,
    /// Rotated audit logs kept (0: no limit).
    #[arg(long, default_value_t = 0)]
    audit_log_maxbackup: usize,
    /// Megabytes the audit log may reach before it is rotated (0: 100, as upstream).
    #[arg(long, default_value_t = 0)]
    audit_log_maxsize: u64,
    /// The events' format: `json` (the `legacy` text format is not supported).
    #[arg(long, default_value = "json", value_parser = ["json", "legacy"])]
    audit_log_format: String,
    /// `blocking`: a request writes its events before it answers; `batch`: events are queued
    /// for a writer thread and dropped (and counted) when the queue is full.
    /// (`blocking-strict` is not supported.)
    #[arg(long, default_value = "blocking", value_parser = ["blocking", "batch", "blocking-strict"])]
    audit_log_mode: String,
    /// The batch mode's queue, in events.
    #[arg(long, default_value_t = setpoint_apiserver::audit::DEFAULT_BATCH_BUFFER_SIZE)]
    audit_log_batch_buffer_size: usize,
}

impl AuditFlags {
    /// The server's audit options, or why the flags cannot be honoured.
    pub fn options(&self) -> anyhow::Result<AuditOptions> {
        let format = match self.audit_log_format.as_str() {
            "json" => Format::Json,
            other => anyhow::bail!("--audit-log-format {other} is not supported; use json"),
        };
        let mode = match self.audit_log_mode.as_str() {
            "blocking" => Mode::Blocking,
            "batch" => Mode::Batch,
            other => {
                anyhow::bail!("--audit-log-mode {other} is not supported; use blocking or batch")
            }
        };
        Ok(AuditOptions {
            policy_file: self.audit_policy_file.clone(),
            log_path: self.audit_log_path.clone(),
            rotation: Rotation {
                max_size_mb: self.audit_log_maxsize,
                max_backups: self.audit_log_maxbackup,
                max_age_days: self.audit_log_maxage,
            },
            format,
            mode,
            batch_buffer_size: self.audit_log_batch_buffer_size,
        })
    }
}
