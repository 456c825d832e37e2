//! The built-in mutating admission steps that run on every create, after defaulting and
//! before validation, as upstream's admission plugins of the same names do.

use serde_json::Value;

pub mod expressions;
pub mod limitrange;
pub mod noderestriction;
mod podsecurity;
pub(crate) mod policy;
mod quota;
pub mod serviceaccount;
mod storage;

use crate::registry::ResourceDef;

/// What the admission steps are configured with (the API server's flags).
#[derive(Clone, Debug)]
pub struct AdmissionConfig {
    /// `DefaultTolerationSeconds`: how long a new pod tolerates its node being not ready or
    /// unreachable, when it says nothing itself (upstream's
    /// `--default-not-ready-toleration-seconds` and `--default-unreachable-toleration-seconds`,
    /// both 300).
    pub default_toleration_seconds: i64,
}

/// Runs the admission steps that apply to a new object of `res`.
pub fn admit(res: &ResourceDef, obj: &mut Value, config: &AdmissionConfig) {
    if res.group.is_empty() && res.plural == "pods" {
        setpoint_kinds::defaults::default_tolerations(obj, config.default_toleration_seconds);
    }
}
