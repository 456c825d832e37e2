//! kube-controller-manager's `--horizontal-pod-autoscaler-*` flags, which `setpoint
//! controller-manager` and `setpoint up` both take.

use std::time::Duration;

use setpoint_controllers::hpa::HpaConfig;

/// The HorizontalPodAutoscaler controller's settings, with upstream's defaults.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct HpaFlags {
    /// How often every HorizontalPodAutoscaler is synced.
    #[arg(long, default_value = "15s", value_parser = crate::leadership::parse_go_duration)]
    horizontal_pod_autoscaler_sync_period: Duration,
    /// The smallest change of the metric-to-target ratio that is acted on.
    #[arg(long, default_value_t = 0.1)]
    horizontal_pod_autoscaler_tolerance: f64,
    /// How long after a pod starts its CPU samples count only once taken a whole window
    /// after it became ready.
    #[arg(long, default_value = "5m0s", value_parser = crate::leadership::parse_go_duration)]
    horizontal_pod_autoscaler_cpu_initialization_period: Duration,
    /// An unready pod whose readiness last changed within this long after its start has
    /// never been ready, and its CPU samples are left out.
    #[arg(long, default_value = "30s", value_parser = crate::leadership::parse_go_duration)]
    horizontal_pod_autoscaler_initial_readiness_delay: Duration,
    /// How far back the highest recommendation holds a scale-down (autoscalers without a
    /// `behavior.scaleDown.stabilizationWindowSeconds`).
    #[arg(long, default_value = "5m0s", value_parser = crate::leadership::parse_go_duration)]
    horizontal_pod_autoscaler_downscale_stabilization: Duration,
}

impl HpaFlags {
    /// The controller's configuration.
    pub fn config(&self) -> HpaConfig {
        HpaConfig {
            sync_period: self.horizontal_pod_autoscaler_sync_period,
            downscale_stabilization: self.horizontal_pod_autoscaler_downscale_stabilization,
            tuning: setpoint_controllers::hpa::replicas::Tuning {
                tolerance: self.horizontal_pod_autoscaler_tolerance,
                cpu_initialization_period: self.horizontal_pod_autoscaler_cpu_initialization_period,
                initial_readiness_delay: self.horizontal_pod_autoscaler_initial_readiness_delay,
            },
        }
    }
}
