//! What a pod's container environments read from the API besides the pod itself: the
//! ConfigMaps and Secrets of `valueFrom` and `envFrom`, and the Services of the pod's
//! namespace for service environment variables. [`gather`] reads them through the node's
//! [`crate::runtime::Sources`] before a pod's containers are created; composing the
//! environment from them is pure ([`crate::process::expand::container_env`]).

use k8s_openapi::api::core::v1::Pod;

use crate::runtime::NodeContext;

/// The API objects one pod's container environments read, as read for one sync.
#[derive(Clone, Debug, Default)]
pub struct EnvInputs {}

/// Reads what `pod`'s container environments refer to.
pub async fn gather(pod: &Pod, node: &NodeContext) -> EnvInputs {
    let _ = (pod, node);
    EnvInputs::default()
}
