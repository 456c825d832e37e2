//! Setpoint's shared vocabulary, with no I/O: which resource a request names, helpers to read
//! object metadata out of JSON, Kubernetes `Status` errors, label and field selectors, names
//! and time formatting, resource quantities and the pod QoS rule, and the packed string lists
//! caches keep per object.

pub mod cidr;
pub mod cron;
pub mod disruption;
pub mod exposition;
pub mod jsonkey;
pub mod meta;
pub mod names;
pub mod nodeselector;
pub mod packed;
pub mod podsecurity;
pub mod qos;
pub mod quantity;
pub mod quota;
pub mod replicas;
pub mod resource;
pub mod selector;
pub mod status;
pub mod storage;
pub mod strconv;
pub mod taints;
pub mod time;
pub mod tls;
pub mod trail;

pub use resource::{GroupResource, GroupVersionKind, GroupVersionResource};
pub use status::{ApiError, Cause};
