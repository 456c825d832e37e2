//! What the API server knows about each built-in kind, as pure functions over JSON objects:
//!
//! - [`KindInfo`] / [`BUILTIN`]: group, version, names, scope, subresources (the registry's data);
//! - [`defaults`]: defaulting as Kubernetes applies it on create and update;
//! - [`validation`]: validation (422 causes) and unknown-field detection for `fieldValidation`;
//! - [`tables`]: the columns `kubectl get` prints, the same as Kubernetes' printers;
//! - [`fields`]: the fields each kind supports in field selectors.
//!
//! Custom resources (a later addition) go through the same registry with their own functions.

pub mod defaults;
pub mod fields;
pub mod tables;
pub mod validation;

/// Static facts about one built-in resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindInfo {
    /// The API group, `""` for the core group.
    pub group: &'static str,
    /// The API version the resource is served at (`v1`).
    pub version: &'static str,
    /// The kind, as objects' `kind` field names it (`Deployment`).
    pub kind: &'static str,
    /// The resource name in URLs (plural, lower case).
    pub plural: &'static str,
    /// The singular name discovery lists and kubectl accepts (`deployment`).
    pub singular: &'static str,
    /// Whether objects live in a namespace (`false` for cluster-scoped kinds such as nodes).
    pub namespaced: bool,
    /// The short names discovery lists for kubectl (`deploy`, `po`); empty if none.
    pub short_names: &'static [&'static str],
    /// The categories discovery lists (`all` makes `kubectl get all` include the resource).
    pub categories: &'static [&'static str],
    /// Has a `status` subresource: main writes ignore `.status`, status writes change only it.
    pub status: bool,
    /// Has a `scale` subresource (autoscaling/v1 Scale over `spec.replicas`).
    pub scale: bool,
    /// `metadata.generation` is maintained (set to 1 on create, incremented on spec changes).
    pub generation: bool,
    /// The storage prefix segment when it differs from `group/plural` (resources that share
    /// storage with another version or group, e.g. events.k8s.io events live with core events).
    pub storage: Option<(&'static str, &'static str)>,
    /// Served only as `create`, never stored: a POST runs the resource's handler and answers
    /// with the object and its `status` filled in (upstream's review resources, such as
    /// SubjectAccessReview). Such resources have no cache, printer or selectable fields.
    pub create_only: bool,
}

const ALL: &[&str] = &["all"];
const NONE: &[&str] = &[];

const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
) -> KindInfo {
    KindInfo {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        short_names: NONE,
        categories: NONE,
        status: false,
        scale: false,
        generation: false,
        storage: None,
        create_only: false,
    }
}

impl KindInfo {
    const fn short(mut self, names: &'static [&'static str]) -> Self {
        self.short_names = names;
        self
    }
    const fn all(mut self) -> Self {
        self.categories = ALL;
        self
    }
    const fn categories(mut self, categories: &'static [&'static str]) -> Self {
        self.categories = categories;
        self
    }
    const fn status(mut self) -> Self {
        self.status = true;
        self
    }
    const fn scale(mut self) -> Self {
        self.scale = true;
        self
    }
    const fn generation(mut self) -> Self {
        self.generation = true;
        self
    }
    const fn stored_as(mut self, group: &'static str, plural: &'static str) -> Self {
        self.storage = Some((group, plural));
        self
    }
    const fn create_only(mut self) -> Self {
        self.create_only = true;
        self
    }

    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        setpoint_api::resource::api_version(self.group, self.version)
    }

    /// The (group, plural) whose storage this resource uses.
    pub fn storage_resource(&self) -> (&'static str, &'static str) {
        self.storage.unwrap_or((self.group, self.plural))
    }
}

/// Every built-in resource Setpoint serves, in discovery order (`kubectl get all` lists the
/// `all` category in this order).
pub static BUILTIN: &[KindInfo] = &[
    // core/v1
    kind("", "v1", "Pod", "pods", "pod", true)
        .short(&["po"])
        .all()
        .status(),
    kind("", "v1", "Service", "services", "service", true)
        .short(&["svc"])
        .all()
        .status(),
    kind(
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        "replicationcontroller",
        true,
    )
    .short(&["rc"])
    .all()
    .status()
    .scale()
    .generation(),
    kind("", "v1", "Namespace", "namespaces", "namespace", false)
        .short(&["ns"])
        .status(),
    kind("", "v1", "Node", "nodes", "node", false)
        .short(&["no"])
        .status(),
    kind("", "v1", "Endpoints", "endpoints", "endpoints", true).short(&["ep"]),
    kind("", "v1", "ConfigMap", "configmaps", "configmap", true).short(&["cm"]),
    kind("", "v1", "Secret", "secrets", "secret", true),
    kind(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
    )
    .short(&["sa"]),
    kind("", "v1", "Event", "events", "event", true).short(&["ev"]),
    kind(
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        "resourcequota",
        true,
    )
    .short(&["quota"])
    .status(),
    kind("", "v1", "LimitRange", "limitranges", "limitrange", true).short(&["limits"]),
    kind(
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        "persistentvolume",
        false,
    )
    .short(&["pv"])
    .status(),
    kind(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        true,
    )
    .short(&["pvc"])
    .status(),
    // apps/v1
    kind(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        true,
    )
    .short(&["deploy"])
    .all()
    .status()
    .scale()
    .generation(),
    kind(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
    )
    .short(&["rs"])
    .all()
    .status()
    .scale()
    .generation(),
    kind(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
    )
    .short(&["sts"])
    .all()
    .status()
    .scale()
    .generation(),
    kind("apps", "v1", "DaemonSet", "daemonsets", "daemonset", true)
        .short(&["ds"])
        .all()
        .status()
        .generation(),
    kind(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
    ),
    // batch/v1
    kind("batch", "v1", "Job", "jobs", "job", true)
        .all()
        .status()
        .generation(),
    kind("batch", "v1", "CronJob", "cronjobs", "cronjob", true)
        .short(&["cj"])
        .all()
        .status()
        .generation(),
    // autoscaling/v2
    kind(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        true,
    )
    .short(&["hpa"])
    .all()
    .status()
    .generation(),
    // autoscaling/v1: the same objects, stored as v2 and converted on the way in and out
    // (after v2, which stays the group's preferred version and the stored one)
    kind(
        "autoscaling",
        "v1",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        true,
    )
    .short(&["hpa"])
    .status()
    .generation(),
    // policy/v1
    kind(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        true,
    )
    .short(&["pdb"])
    .status()
    .generation(),
    // coordination.k8s.io/v1
    kind(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
    ),
    // storage.k8s.io/v1
    kind(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        "storageclass",
        false,
    )
    .short(&["sc"]),
    // discovery.k8s.io/v1
    kind(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        true,
    )
    .generation(),
    // apiextensions.k8s.io/v1
    kind(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        false,
    )
    .short(&["crd", "crds"])
    .categories(&["api-extensions"])
    .status()
    .generation(),
    // certificates.k8s.io/v1
    kind(
        "certificates.k8s.io",
        "v1",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificatesigningrequest",
        false,
    )
    .short(&["csr"])
    .status(),
    // rbac.authorization.k8s.io/v1
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
    ),
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
    ),
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
    ),
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        "role",
        true,
    ),
    // admissionregistration.k8s.io/v1: CEL admission policies
    kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        false,
    )
    .categories(&["api-extensions"])
    .status()
    .generation(),
    kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        false,
    )
    .categories(&["api-extensions"])
    .generation(),
    // admissionregistration.k8s.io/v1: admission webhooks
    kind(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        false,
    )
    .categories(&["api-extensions"]),
    kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        false,
    )
    .categories(&["api-extensions"]),
    // apiregistration.k8s.io/v1: the aggregation layer's APIServices
    kind(
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        "apiservices",
        "apiservice",
        false,
    )
    .categories(&["api-extensions"])
    .status(),
    // events.k8s.io/v1 (stored with core events and converted on the way in and out)
    kind("events.k8s.io", "v1", "Event", "events", "event", true)
        .short(&["ev"])
        .stored_as("", "events"),
    // authentication.k8s.io/v1 and authorization.k8s.io/v1: reviews, answered on create and
    // never stored
    kind(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        "selfsubjectreview",
        false,
    )
    .create_only(),
    kind(
        "authentication.k8s.io",
        "v1",
        "TokenReview",
        "tokenreviews",
        "tokenreview",
        false,
    )
    .create_only(),
    kind(
        "authorization.k8s.io",
        "v1",
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        true,
    )
    .create_only(),
    kind(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        false,
    )
    .create_only(),
    kind(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        false,
    )
    .create_only(),
    kind(
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview",
        "subjectaccessreviews",
        "subjectaccessreview",
        false,
    )
    .create_only(),
];

/// Looks up a built-in resource by group, version and plural.
pub fn by_resource(group: &str, version: &str, plural: &str) -> Option<&'static KindInfo> {
    BUILTIN
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
}

/// The version a built-in resource's objects are stored at: its first entry (another
/// version of the same group and plural is converted to and from it).
pub fn storage_version(group: &str, plural: &str) -> Option<&'static str> {
    BUILTIN
        .iter()
        .find(|k| k.group == group && k.plural == plural && k.storage.is_none())
        .map(|k| k.version)
}

/// Looks up a built-in resource by group, version and kind.
pub fn by_kind(group: &str, version: &str, kind: &str) -> Option<&'static KindInfo> {
    BUILTIN
        .iter()
        .find(|k| k.group == group && k.version == version && k.kind == kind)
}
