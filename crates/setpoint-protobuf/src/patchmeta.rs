//! Strategic-merge-patch metadata: the `patchStrategy` / `patchMergeKey` struct tags of
//! k8s.io/api, apimachinery, apiextensions-apiserver and kube-aggregator.
//!
//! This is the one place Setpoint records how each field behaves in a strategic merge patch.
//! The patch code in the API server reads it through [`crate::types::FieldRef::patch_strategy`],
//! and an OpenAPI generator can emit `x-kubernetes-patch-strategy` /
//! `x-kubernetes-patch-merge-key` from [`entries`] and [`PatchStrategy::openapi_strategy`], so
//! both always agree.
//!
//! The rows were taken from the `+patchStrategy` / `+patchMergeKey` markers that accompany the
//! Go struct tags (the same markers Kubernetes' own OpenAPI generator reads), for every message
//! in the schema table. Fields without a row have no tag: objects and maps merge key by key,
//! lists are replaced whole ("atomic": `tolerations`, `args`, `command`, `envFrom`,
//! `readinessGates`, `resizePolicy`, `NodeSpec.taints`, `containerStatuses`, …).

/// How a field is patched by a strategic merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchStrategy {
    /// No tag: objects and maps merge key by key, lists (and scalars) are replaced whole.
    Default,
    /// `patchStrategy:"merge"` on a list. With a key, items are matched on that property and
    /// merged; without one (`finalizers`, `podCIDRs`) the list of scalars is an ordered set.
    Merge {
        /// The `patchMergeKey`: the item property lists of objects are matched on; `None` for
        /// a list of scalars.
        key: Option<&'static str>,
    },
    /// `patchStrategy:"merge,retainKeys"` on a list of objects (`PodSpec.volumes`): items merge
    /// by `key`, and a client may send `$retainKeys` inside an item to clear the properties it
    /// does not list (how kubectl switches a volume from one source to another).
    MergeRetainKeys {
        /// The `patchMergeKey` items are matched on (`name` for volumes).
        key: &'static str,
    },
    /// `patchStrategy:"retainKeys"` on an object (`DeploymentSpec.strategy`): it merges, and
    /// clients send `$retainKeys` to clear the properties they do not list.
    RetainKeys,
    /// `patchStrategy:"replace"`: the value is replaced whole, even an object
    /// (`PodDisruptionBudgetSpec.selector`).
    Replace,
}

impl PatchStrategy {
    /// The merge key of a merged list of objects.
    pub fn merge_key(self) -> Option<&'static str> {
        match self {
            PatchStrategy::Merge { key } => key,
            PatchStrategy::MergeRetainKeys { key } => Some(key),
            _ => None,
        }
    }

    /// Whether a list field merges item by item (by key, or as a set of scalars).
    pub fn merges_list(self) -> bool {
        matches!(
            self,
            PatchStrategy::Merge { .. } | PatchStrategy::MergeRetainKeys { .. }
        )
    }

    /// Whether the field (or each item of the list) carries the `retainKeys` strategy.
    pub fn retains_keys(self) -> bool {
        matches!(
            self,
            PatchStrategy::RetainKeys | PatchStrategy::MergeRetainKeys { .. }
        )
    }

    /// The value of `x-kubernetes-patch-strategy` in OpenAPI, `None` when there is no tag.
    pub fn openapi_strategy(self) -> Option<&'static str> {
        match self {
            PatchStrategy::Default => None,
            PatchStrategy::Merge { .. } => Some("merge"),
            PatchStrategy::MergeRetainKeys { .. } => Some("merge,retainKeys"),
            PatchStrategy::RetainKeys => Some("retainKeys"),
            PatchStrategy::Replace => Some("replace"),
        }
    }
}

const fn merge(key: &'static str) -> PatchStrategy {
    PatchStrategy::Merge { key: Some(key) }
}

const fn merge_retain_keys(key: &'static str) -> PatchStrategy {
    PatchStrategy::MergeRetainKeys { key }
}

/// A merged list of scalars (an ordered set).
const SET: PatchStrategy = PatchStrategy::Merge { key: None };
const RETAIN_KEYS: PatchStrategy = PatchStrategy::RetainKeys;
const REPLACE: PatchStrategy = PatchStrategy::Replace;

/// (fully qualified message name, JSON field name, strategy), sorted by message then field.
/// The message is the one that declares the field (for inline structs: the embedded struct).
#[rustfmt::skip]
static TABLE: &[(&str, &str, PatchStrategy)] = &[
    ("k8s.io.api.admissionregistration.v1.MutatingWebhook", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1.MutatingWebhookConfiguration", "webhooks", merge("name")),
    ("k8s.io.api.admissionregistration.v1.ValidatingAdmissionPolicySpec", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1.ValidatingAdmissionPolicySpec", "variables", merge("name")),
    ("k8s.io.api.admissionregistration.v1.ValidatingWebhook", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1.ValidatingWebhookConfiguration", "webhooks", merge("name")),
    ("k8s.io.api.admissionregistration.v1alpha1.MutatingAdmissionPolicySpec", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1alpha1.ValidatingAdmissionPolicySpec", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1alpha1.ValidatingAdmissionPolicySpec", "variables", merge("name")),
    ("k8s.io.api.admissionregistration.v1beta1.MutatingAdmissionPolicySpec", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1beta1.MutatingWebhook", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1beta1.MutatingWebhookConfiguration", "webhooks", merge("name")),
    ("k8s.io.api.admissionregistration.v1beta1.ValidatingAdmissionPolicySpec", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1beta1.ValidatingAdmissionPolicySpec", "variables", merge("name")),
    ("k8s.io.api.admissionregistration.v1beta1.ValidatingWebhook", "matchConditions", merge("name")),
    ("k8s.io.api.admissionregistration.v1beta1.ValidatingWebhookConfiguration", "webhooks", merge("name")),
    ("k8s.io.api.apps.v1.DaemonSetStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1.DeploymentSpec", "strategy", RETAIN_KEYS),
    ("k8s.io.api.apps.v1.DeploymentStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1.ReplicaSetStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1.StatefulSetStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1beta1.DeploymentSpec", "strategy", RETAIN_KEYS),
    ("k8s.io.api.apps.v1beta1.DeploymentStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1beta1.StatefulSetStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1beta2.DaemonSetStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1beta2.DeploymentSpec", "strategy", RETAIN_KEYS),
    ("k8s.io.api.apps.v1beta2.DeploymentStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1beta2.ReplicaSetStatus", "conditions", merge("type")),
    ("k8s.io.api.apps.v1beta2.StatefulSetStatus", "conditions", merge("type")),
    ("k8s.io.api.autoscaling.v2.HorizontalPodAutoscalerStatus", "conditions", merge("type")),
    ("k8s.io.api.batch.v1.JobStatus", "conditions", merge("type")),
    ("k8s.io.api.certificates.v1beta1.PodCertificateRequestStatus", "conditions", merge("type")),
    ("k8s.io.api.core.v1.ComponentStatus", "conditions", merge("type")),
    ("k8s.io.api.core.v1.Container", "env", merge("name")),
    ("k8s.io.api.core.v1.Container", "ports", merge("containerPort")),
    ("k8s.io.api.core.v1.Container", "volumeDevices", merge("devicePath")),
    ("k8s.io.api.core.v1.Container", "volumeMounts", merge("mountPath")),
    ("k8s.io.api.core.v1.ContainerStatus", "allocatedResourcesStatus", merge("name")),
    ("k8s.io.api.core.v1.ContainerStatus", "volumeMounts", merge("mountPath")),
    ("k8s.io.api.core.v1.EphemeralContainerCommon", "env", merge("name")),
    ("k8s.io.api.core.v1.EphemeralContainerCommon", "ports", merge("containerPort")),
    ("k8s.io.api.core.v1.EphemeralContainerCommon", "volumeDevices", merge("devicePath")),
    ("k8s.io.api.core.v1.EphemeralContainerCommon", "volumeMounts", merge("mountPath")),
    ("k8s.io.api.core.v1.NamespaceStatus", "conditions", merge("type")),
    ("k8s.io.api.core.v1.NodeSpec", "podCIDRs", SET),
    ("k8s.io.api.core.v1.NodeStatus", "addresses", merge("type")),
    ("k8s.io.api.core.v1.NodeStatus", "conditions", merge("type")),
    ("k8s.io.api.core.v1.PersistentVolumeClaimStatus", "conditions", merge("type")),
    ("k8s.io.api.core.v1.PodSpec", "containers", merge("name")),
    ("k8s.io.api.core.v1.PodSpec", "ephemeralContainers", merge("name")),
    ("k8s.io.api.core.v1.PodSpec", "hostAliases", merge("ip")),
    ("k8s.io.api.core.v1.PodSpec", "imagePullSecrets", merge("name")),
    ("k8s.io.api.core.v1.PodSpec", "initContainers", merge("name")),
    ("k8s.io.api.core.v1.PodSpec", "resourceClaims", merge_retain_keys("name")),
    ("k8s.io.api.core.v1.PodSpec", "schedulingGates", merge("name")),
    ("k8s.io.api.core.v1.PodSpec", "topologySpreadConstraints", merge("topologyKey")),
    ("k8s.io.api.core.v1.PodSpec", "volumes", merge_retain_keys("name")),
    ("k8s.io.api.core.v1.PodStatus", "conditions", merge("type")),
    ("k8s.io.api.core.v1.PodStatus", "hostIPs", merge("ip")),
    ("k8s.io.api.core.v1.PodStatus", "podIPs", merge("ip")),
    ("k8s.io.api.core.v1.PodStatus", "resourceClaimStatuses", merge_retain_keys("name")),
    ("k8s.io.api.core.v1.ReplicationControllerStatus", "conditions", merge("type")),
    ("k8s.io.api.core.v1.ServiceAccount", "secrets", merge("name")),
    ("k8s.io.api.core.v1.ServiceSpec", "ports", merge("port")),
    ("k8s.io.api.core.v1.ServiceStatus", "conditions", merge("type")),
    ("k8s.io.api.extensions.v1beta1.DaemonSetStatus", "conditions", merge("type")),
    ("k8s.io.api.extensions.v1beta1.DeploymentSpec", "strategy", RETAIN_KEYS),
    ("k8s.io.api.extensions.v1beta1.DeploymentStatus", "conditions", merge("type")),
    ("k8s.io.api.extensions.v1beta1.ReplicaSetStatus", "conditions", merge("type")),
    ("k8s.io.api.flowcontrol.v1.FlowSchemaStatus", "conditions", merge("type")),
    ("k8s.io.api.flowcontrol.v1.PriorityLevelConfigurationStatus", "conditions", merge("type")),
    ("k8s.io.api.flowcontrol.v1beta3.FlowSchemaStatus", "conditions", merge("type")),
    ("k8s.io.api.flowcontrol.v1beta3.PriorityLevelConfigurationStatus", "conditions", merge("type")),
    ("k8s.io.api.networking.v1.ServiceCIDRStatus", "conditions", merge("type")),
    ("k8s.io.api.networking.v1beta1.ServiceCIDRStatus", "conditions", merge("type")),
    ("k8s.io.api.policy.v1.PodDisruptionBudgetSpec", "selector", REPLACE),
    ("k8s.io.api.policy.v1.PodDisruptionBudgetStatus", "conditions", merge("type")),
    ("k8s.io.api.policy.v1beta1.PodDisruptionBudgetStatus", "conditions", merge("type")),
    ("k8s.io.api.resource.v1.ResourceClaimStatus", "reservedFor", merge("uid")),
    ("k8s.io.api.resource.v1alpha3.DeviceTaintRuleStatus", "conditions", merge("type")),
    ("k8s.io.api.resource.v1beta1.ResourceClaimStatus", "reservedFor", merge("uid")),
    ("k8s.io.api.resource.v1beta2.ResourceClaimStatus", "reservedFor", merge("uid")),
    ("k8s.io.api.storage.v1.CSINodeSpec", "drivers", merge("name")),
    ("k8s.io.api.storage.v1beta1.CSINodeSpec", "drivers", merge("name")),
    ("k8s.io.api.storagemigration.v1beta1.StorageVersionMigrationStatus", "conditions", merge("type")),
    ("k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps", "x-kubernetes-validations", merge("rule")),
    ("k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1beta1.JSONSchemaProps", "x-kubernetes-validations", merge("rule")),
    ("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta", "finalizers", SET),
    ("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta", "ownerReferences", merge("uid")),
    ("k8s.io.kube_aggregator.pkg.apis.apiregistration.v1.APIServiceStatus", "conditions", merge("type")),
    ("k8s.io.kube_aggregator.pkg.apis.apiregistration.v1beta1.APIServiceStatus", "conditions", merge("type")),
];

/// The strategy of field `json_name` declared by message `message` (fully qualified protobuf
/// name, e.g. `k8s.io.api.core.v1.PodSpec`); [`PatchStrategy::Default`] when it has no tag.
pub fn lookup(message: &str, json_name: &str) -> PatchStrategy {
    TABLE
        .binary_search_by(|(m, f, _)| (*m, *f).cmp(&(message, json_name)))
        .map(|i| TABLE[i].2)
        .unwrap_or(PatchStrategy::Default)
}

/// Every field that has a strategy other than [`PatchStrategy::Default`], as (message, JSON
/// field, strategy), sorted.
pub fn entries() -> impl Iterator<Item = (&'static str, &'static str, PatchStrategy)> {
    TABLE.iter().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Elem, TypeRef};

    #[test]
    fn table_is_sorted_and_unique() {
        for pair in TABLE.windows(2) {
            assert!(
                (pair[0].0, pair[0].1) < (pair[1].0, pair[1].1),
                "{:?} must sort before {:?}",
                (pair[0].0, pair[0].1),
                (pair[1].0, pair[1].1)
            );
        }
    }

    /// Every row names a real field of the right shape, and merge keys are real properties of
    /// the list items.
    #[test]
    fn every_row_matches_the_type_graph() {
        for &(message, field, strategy) in TABLE {
            let ty = TypeRef::by_name(message).unwrap_or_else(|| panic!("no message {message}"));
            let f = ty
                .field(field)
                .unwrap_or_else(|| panic!("no field {field} in {message}"));
            assert_eq!(f.owner(), ty, "{message}.{field} is declared elsewhere");
            assert_eq!(f.patch_strategy(), strategy);
            match strategy {
                PatchStrategy::Merge { key: None } => {
                    assert!(
                        f.is_list() && f.element() == Elem::Scalar,
                        "{message}.{field}"
                    )
                }
                PatchStrategy::Merge { key: Some(key) }
                | PatchStrategy::MergeRetainKeys { key } => {
                    assert!(f.is_list(), "{message}.{field}");
                    let item = f.message().unwrap_or_else(|| panic!("{message}.{field}"));
                    assert!(item.field(key).is_some(), "{message}.{field}: no key {key}");
                }
                PatchStrategy::RetainKeys | PatchStrategy::Replace => {
                    assert!(!f.is_list() && f.message().is_some(), "{message}.{field}")
                }
                PatchStrategy::Default => panic!("{message}.{field}: Default is implied"),
            }
        }
    }

    #[test]
    fn the_keys_kubectl_relies_on() {
        let f = |m: &str, field: &str| lookup(m, field);
        assert_eq!(
            f("k8s.io.api.core.v1.PodSpec", "containers").merge_key(),
            Some("name")
        );
        assert_eq!(
            f("k8s.io.api.core.v1.PodSpec", "volumes"),
            PatchStrategy::MergeRetainKeys { key: "name" }
        );
        assert_eq!(
            f("k8s.io.api.core.v1.Container", "ports").merge_key(),
            Some("containerPort")
        );
        assert_eq!(
            f("k8s.io.api.core.v1.Container", "volumeMounts").merge_key(),
            Some("mountPath")
        );
        assert_eq!(
            f(
                "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                "finalizers"
            ),
            PatchStrategy::Merge { key: None }
        );
        assert_eq!(
            f("k8s.io.api.apps.v1.DeploymentSpec", "strategy"),
            PatchStrategy::RetainKeys
        );
        assert_eq!(
            f("k8s.io.api.core.v1.PodSpec", "tolerations"),
            PatchStrategy::Default
        );
        assert_eq!(
            f("k8s.io.api.core.v1.NodeSpec", "taints"),
            PatchStrategy::Default
        );
        assert_eq!(
            f("k8s.io.api.core.v1.PodSpec", "volumes").openapi_strategy(),
            Some("merge,retainKeys")
        );
    }
}
