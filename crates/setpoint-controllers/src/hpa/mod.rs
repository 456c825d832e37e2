//! The HorizontalPodAutoscaler controller (autoscaling/v2): every sync period it reads each
//! autoscaler's target through its `scale` subresource, the metrics through the metrics APIs,
//! and sets the replica count upstream's rules give.
//!
//! - [`replicas`]: upstream's replica calculator (tolerance, unready and missing pods), pure;
//! - [`behavior`]: stabilization windows, scaling policies and the min/max bounds, pure;
//! - [`selectors`]: which autoscalers select a pod (`AmbiguousSelector`), pure;
//! - [`status`]: the conditions `AbleToScale`, `ScalingActive`, `ScalingLimited` and texts;
//! - [`metrics`]: the clients of `metrics.k8s.io`, `custom.metrics.k8s.io` and
//!   `external.metrics.k8s.io`;
//! - [`source`]: one metric source (Resource, ContainerResource, Pods, Object, External) from
//!   its samples to its proposal and status;
//! - [`controller`]: the I/O (scale reads and writes, status, Events).

pub mod behavior;
pub mod controller;
pub mod metrics;
pub mod replicas;
pub mod selectors;
pub mod source;
pub mod status;

pub use controller::{controller, controller_with_clock, HpaConfig, NAME};
