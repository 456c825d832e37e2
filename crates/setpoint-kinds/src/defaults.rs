//! Defaulting of built-in kinds, as Kubernetes 1.32 applies it when decoding a request body.
//!
//! Objects are JSON as the client sent them. Every rule fills a field only when it is unset
//! (absent or `null`, or for Go value types also `""`/`0`), so applying the defaults twice gives
//! the same object as applying them once; the server can run [`apply`] on every create, update
//! and patch result. Values of the wrong JSON type are left alone for validation to report.
//!
//! Some steps need facts only the server has and are separate functions: [`job_selector`] (needs
//! the new object's uid) and [`on_create`] (namespace finalizer and status on create only).

use base64::Engine;
use serde_json::{json, Map, Value};

type Obj = Map<String, Value>;

/// Applies Kubernetes' defaults for this kind to `obj` in place.
///
/// Unknown kinds (custom resources) are left untouched. For `autoscaling` HPAs the object's own
/// `apiVersion` picks between the v1 and v2 rules.
pub fn apply(group: &str, kind: &str, obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    match (group, kind) {
        ("", "Pod") => {
            if let Some(spec) = child(root, "spec") {
                pod_spec(spec, true);
            }
        }
        ("", "PodTemplate") => {
            if let Some(t) = child(root, "template") {
                pod_template(t);
            }
        }
        ("", "ReplicationController") => replication_controller(root),
        ("", "Service") => {
            if let Some(spec) = child(root, "spec") {
                service_spec(spec);
            }
        }
        ("", "Namespace") => namespace(root),
        ("", "Secret") => secret(root),
        ("", "Endpoints") => {
            for subset in items(root, "subsets") {
                for port in items(subset, "ports") {
                    default_string(port, "protocol", "TCP");
                }
            }
        }
        ("discovery.k8s.io", "EndpointSlice") => {
            for port in items(root, "ports") {
                default_string(port, "name", "");
                default_string(port, "protocol", "TCP");
            }
        }
        ("", "LimitRange") => {
            if let Some(spec) = child(root, "spec") {
                for item in items(spec, "limits") {
                    limit_range_item(item);
                }
            }
        }
        ("", "PersistentVolumeClaim") => {
            if let Some(spec) = child(root, "spec") {
                default_value(spec, "volumeMode", json!("Filesystem"));
            }
            if let Some(status) = child_or_insert(root, "status") {
                default_string(status, "phase", "Pending");
            }
        }
        ("", "PersistentVolume") => {
            if let Some(spec) = child(root, "spec") {
                // Upstream defaults static volumes to Retain; provisioners set the class's policy.
                default_string(spec, "persistentVolumeReclaimPolicy", "Retain");
                default_value(spec, "volumeMode", json!("Filesystem"));
            }
            if let Some(status) = child_or_insert(root, "status") {
                default_string(status, "phase", "Pending");
            }
        }
        ("storage.k8s.io", "StorageClass") => {
            default_string(root, "reclaimPolicy", "Delete");
            default_string(root, "volumeBindingMode", "Immediate");
        }
        ("", "Node") => node(root),
        ("apiregistration.k8s.io", "APIService") => {
            // `SetDefaults_ServiceReference` of apiregistration/v1.
            if let Some(service) = child(root, "spec").and_then(|s| child(s, "service")) {
                default_value(service, "port", json!(443));
            }
        }
        ("apps", "Deployment") => deployment(root),
        ("apps", "ReplicaSet") => {
            if let Some(spec) = child(root, "spec") {
                default_value(spec, "replicas", json!(setpoint_api::replicas::DEFAULT));
                template_in(spec);
            }
        }
        ("apps", "StatefulSet") => stateful_set(root),
        ("apps", "DaemonSet") => daemon_set(root),
        ("batch", "Job") => job(root),
        ("batch", "CronJob") => cron_job(root),
        ("autoscaling", "HorizontalPodAutoscaler") => hpa(root),
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => rbac_binding(root),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => webhooks(root, true),
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => webhooks(root, false),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            if let Some(spec) = child(root, "spec") {
                default_string(spec, "failurePolicy", "Fail");
                if let Some(m) = child(spec, "matchConstraints") {
                    match_resources(m);
                }
            }
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            if let Some(m) = child(root, "spec").and_then(|s| child(s, "matchResources")) {
                match_resources(m);
            }
        }
        _ => {}
    }
}

/// Steps Kubernetes takes only when an object is created, after [`apply`]: a Namespace starts
/// `Active` and always carries the `kubernetes` finalizer. (These cannot be defaults because the
/// finalizer is removed during deletion and must not come back on later writes.)
pub fn on_create(group: &str, kind: &str, obj: &mut Value) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    if (group, kind) == ("", "Namespace") {
        root.insert("status".into(), json!({"phase": "Active"}));
        if let Some(spec) = child_or_insert(root, "spec") {
            let fins = spec.entry("finalizers").or_insert_with(|| json!([]));
            if fins.is_null() {
                *fins = json!([]);
            }
            if let Some(list) = fins.as_array_mut() {
                if !list.iter().any(|f| f == "kubernetes") {
                    list.push(json!("kubernetes"));
                }
            }
        }
    }
}

/// The taints the node lifecycle controller puts on a node that is not ready or unreachable.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// See [`NOT_READY_TAINT`].
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Kubernetes' `DefaultTolerationSeconds` admission step: a new pod that does not already
/// tolerate the `not-ready` / `unreachable` `NoExecute` taints gets tolerations for them lasting
/// `seconds`, so its pods are evicted from a failed node after that long rather than at once.
pub fn default_tolerations(obj: &mut Value, seconds: i64) {
    let Some(spec) = obj.as_object_mut().and_then(|r| child_or_insert(r, "spec")) else {
        return;
    };
    let list = spec.entry("tolerations").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    let Some(list) = list.as_array_mut() else {
        return;
    };
    for key in [NOT_READY_TAINT, UNREACHABLE_TAINT] {
        // Upstream only skips a key when a toleration names it (or tolerates every key) for
        // the NoExecute effect (or every effect).
        let covered = list.iter().any(|t| {
            let k = t.get("key").and_then(Value::as_str).unwrap_or("");
            let op = t.get("operator").and_then(Value::as_str).unwrap_or("Equal");
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            (k == key || (k.is_empty() && op == "Exists"))
                && (effect.is_empty() || effect == "NoExecute")
        });
        if !covered {
            list.push(json!({
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": seconds,
            }));
        }
    }
    if list.is_empty() {
        spec.remove("tolerations");
    }
}

/// Generates a Job's selector and pod-template labels from its uid, as the Job strategy does on
/// create unless `spec.manualSelector` is true. Call it after [`apply`] (which copies the
/// template's labels to the Job's own labels before these are added) and once the Job has its
/// final name and uid, and before validation.
pub fn job_selector(obj: &mut Value, uid: &str) {
    let name = obj
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Some(spec) = obj.as_object_mut().and_then(|r| child_or_insert(r, "spec")) else {
        return;
    };
    if spec.get("manualSelector").and_then(Value::as_bool) == Some(true) {
        return;
    }
    if let Some(labels) = child_or_insert(spec, "template")
        .and_then(|t| child_or_insert(t, "metadata"))
        .and_then(|m| child_or_insert(m, "labels"))
    {
        // Labels the user already set win; a conflict then fails validation, as upstream.
        for (key, value) in [
            ("batch.kubernetes.io/controller-uid", uid),
            ("batch.kubernetes.io/job-name", name.as_str()),
            ("controller-uid", uid),
            ("job-name", name.as_str()),
        ] {
            labels.entry(key).or_insert_with(|| json!(value));
        }
    }
    if let Some(match_labels) =
        child_or_insert(spec, "selector").and_then(|s| child_or_insert(s, "matchLabels"))
    {
        match_labels
            .entry("batch.kubernetes.io/controller-uid")
            .or_insert_with(|| json!(uid));
    }
}

// ---- small helpers over JSON maps ----

/// Absent or `null`: what a Go pointer field looks like when nil.
fn unset(v: Option<&Value>) -> bool {
    matches!(v, None | Some(Value::Null))
}

/// Sets `key` when it is absent or null (Go pointer fields).
fn default_value(m: &mut Obj, key: &str, v: Value) {
    if unset(m.get(key)) {
        m.insert(key.to_string(), v);
    }
}

/// Sets a string `key` when it is absent, null or `""` (Go string fields).
fn default_string(m: &mut Obj, key: &str, v: &str) {
    if unset(m.get(key)) || m.get(key).and_then(Value::as_str) == Some("") {
        m.insert(key.to_string(), json!(v));
    }
}

/// Sets an integer `key` when it is absent, null or `0` (Go int fields without a pointer).
fn default_nonzero(m: &mut Obj, key: &str, v: i64) {
    let zero = m.get(key).and_then(Value::as_f64) == Some(0.0);
    if unset(m.get(key)) || zero {
        m.insert(key.to_string(), json!(v));
    }
}

/// The object at `key`, if it is one.
fn child<'a>(m: &'a mut Obj, key: &str) -> Option<&'a mut Obj> {
    m.get_mut(key).and_then(Value::as_object_mut)
}

/// `SetDefaults_RoleBinding` and `SetDefaults_Subject` of `rbac/v1`: the role reference's
/// group, and User and Group subjects' group, default to `rbac.authorization.k8s.io`.
fn rbac_binding(root: &mut Obj) {
    const GROUP: &str = "rbac.authorization.k8s.io";
    if let Some(role_ref) = child(root, "roleRef") {
        default_string(role_ref, "apiGroup", GROUP);
    }
    for subject in items(root, "subjects") {
        if matches!(
            subject.get("kind").and_then(Value::as_str),
            Some("User" | "Group")
        ) {
            default_string(subject, "apiGroup", GROUP);
        }
    }
}

/// `SetDefaults_ValidatingWebhook`/`MutatingWebhook`, `SetDefaults_Rule` and
/// `SetDefaults_ServiceReference` of `admissionregistration/v1`. `sideEffects` and
/// `admissionReviewVersions` have no default in v1: validation requires them.
fn webhooks(root: &mut Obj, mutating: bool) {
    for hook in items(root, "webhooks") {
        default_string(hook, "failurePolicy", "Fail");
        default_string(hook, "matchPolicy", "Equivalent");
        default_value(hook, "namespaceSelector", json!({}));
        default_value(hook, "objectSelector", json!({}));
        default_value(hook, "timeoutSeconds", json!(10));
        if mutating {
            default_string(hook, "reinvocationPolicy", "Never");
        }
        for rule in items(hook, "rules") {
            default_string(rule, "scope", "*");
        }
        if let Some(service) = child(hook, "clientConfig").and_then(|c| child(c, "service")) {
            default_value(service, "port", json!(443));
        }
    }
}

/// An admission policy's `matchConstraints` or a binding's `matchResources`, as upstream's
/// `SetDefaults_MatchResources` and `SetDefaults_NamedRuleWithOperations` default them.
fn match_resources(m: &mut Obj) {
    default_string(m, "matchPolicy", "Equivalent");
    default_value(m, "namespaceSelector", json!({}));
    default_value(m, "objectSelector", json!({}));
    for key in ["resourceRules", "excludeResourceRules"] {
        for rule in items(m, key) {
            default_string(rule, "scope", "*");
        }
    }
}

/// The object at `key`, created when absent or null; `None` when it holds another type.
fn child_or_insert<'a>(m: &'a mut Obj, key: &str) -> Option<&'a mut Obj> {
    let slot = m.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut()
}

/// The object elements of the array at `key`.
fn items<'a>(m: &'a mut Obj, key: &str) -> impl Iterator<Item = &'a mut Obj> {
    m.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn has_entries(m: &Obj, key: &str) -> bool {
    match m.get(key) {
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        _ => false,
    }
}

/// Absent, null, or an empty map or list: what Go's `len(x) == 0` sees. Other types are
/// malformed and left for validation.
fn empty_or_unset(m: &Obj, key: &str) -> bool {
    match m.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::Object(o)) => o.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

// ---- pods and pod templates ----

/// `spec.template` of a workload: pod template defaults.
fn template_in(spec: &mut Obj) {
    if let Some(t) = child(spec, "template") {
        pod_template(t);
    }
}

fn pod_template(t: &mut Obj) {
    if let Some(spec) = child(t, "spec") {
        pod_spec(spec, false);
    }
}

/// `SetDefaults_PodSpec` plus the per-container, per-volume and (for Pods, `is_pod`) the
/// Pod-only defaults.
fn pod_spec(spec: &mut Obj, is_pod: bool) {
    default_string(spec, "dnsPolicy", "ClusterFirst");
    default_string(spec, "restartPolicy", "Always");
    default_value(spec, "securityContext", json!({}));
    default_value(spec, "terminationGracePeriodSeconds", json!(30));
    default_string(spec, "schedulerName", "default-scheduler");
    if is_pod {
        default_value(spec, "enableServiceLinks", json!(true));
    }
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in items(spec, list) {
            container(c);
            if is_pod && list != "ephemeralContainers" {
                requests_from_limits(c);
                if host_network {
                    // With host networking a container port is a host port.
                    for p in items(c, "ports") {
                        if let Some(cp) = p.get("containerPort").and_then(Value::as_i64) {
                            default_nonzero(p, "hostPort", cp);
                        }
                    }
                }
            }
        }
    }
    for v in items(spec, "volumes") {
        volume(v);
    }
}

/// What `imagePullPolicy` defaults to: `Always` when the tag is `latest` or absent (and there is
/// no digest), otherwise `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    let image = image.trim();
    if image.is_empty() {
        // Upstream cannot parse the reference and so finds no tag.
        return "IfNotPresent";
    }
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    // The tag follows the last `:` of the last path component; a `:` before a `/` is a port.
    let last = name.rsplit('/').next().unwrap_or(name);
    let tag = last.rsplit_once(':').map(|(_, t)| t);
    match (tag, digest) {
        (Some("latest"), _) | (None, None) => "Always",
        _ => "IfNotPresent",
    }
}

fn container(c: &mut Obj) {
    if unset(c.get("imagePullPolicy"))
        || c.get("imagePullPolicy").and_then(Value::as_str) == Some("")
    {
        let image = c.get("image").and_then(Value::as_str).unwrap_or("");
        let policy = default_pull_policy(image);
        c.insert("imagePullPolicy".into(), json!(policy));
    }
    default_string(c, "terminationMessagePath", "/dev/termination-log");
    default_string(c, "terminationMessagePolicy", "File");
    // `resources` is a Go struct, not a pointer: it always serializes, as `{}` when empty.
    default_value(c, "resources", json!({}));
    for p in items(c, "ports") {
        default_string(p, "protocol", "TCP");
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = child(c, probe) {
            default_nonzero(p, "timeoutSeconds", 1);
            default_nonzero(p, "periodSeconds", 10);
            default_nonzero(p, "successThreshold", 1);
            default_nonzero(p, "failureThreshold", 3);
            if let Some(h) = child(p, "httpGet") {
                http_get(h);
            }
        }
    }
    if let Some(lc) = child(c, "lifecycle") {
        for hook in ["postStart", "preStop"] {
            if let Some(h) = child(lc, hook).and_then(|h| child(h, "httpGet")) {
                http_get(h);
            }
        }
    }
    for env in items(c, "env") {
        if let Some(f) = child(env, "valueFrom").and_then(|vf| child(vf, "fieldRef")) {
            default_string(f, "apiVersion", "v1");
        }
    }
}

fn http_get(h: &mut Obj) {
    default_string(h, "path", "/");
    default_string(h, "scheme", "HTTP");
}

/// Pods only: a resource with a limit but no request is requested at its limit.
fn requests_from_limits(c: &mut Obj) {
    let Some(res) = child(c, "resources") else {
        return;
    };
    let Some(limits) = res.get("limits").and_then(Value::as_object).cloned() else {
        return;
    };
    if let Some(requests) = child_or_insert(res, "requests") {
        for (k, v) in limits {
            requests.entry(k).or_insert(v);
        }
    }
}

/// Volume sources with defaults, and the empty-dir default for a volume without a source.
fn volume(v: &mut Obj) {
    let has_source = v.iter().any(|(k, val)| k != "name" && !val.is_null());
    if !has_source {
        v.insert("emptyDir".into(), json!({}));
    }
    for source in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = child(v, source) {
            default_value(s, "defaultMode", json!(420));
        }
    }
    if let Some(d) = child(v, "downwardAPI") {
        field_refs(d);
    }
    if let Some(p) = child(v, "projected") {
        for src in items(p, "sources") {
            if let Some(t) = child(src, "serviceAccountToken") {
                default_value(t, "expirationSeconds", json!(3600));
            }
            if let Some(d) = child(src, "downwardAPI") {
                field_refs(d);
            }
        }
    }
    if let Some(h) = child(v, "hostPath") {
        default_value(h, "type", json!(""));
    }
    if let Some(i) = child(v, "iscsi") {
        default_string(i, "iscsiInterface", "default");
    }
    if let Some(r) = child(v, "rbd") {
        default_string(r, "pool", "rbd");
        default_string(r, "user", "admin");
        default_string(r, "keyring", "/etc/ceph/keyring");
    }
    if let Some(a) = child(v, "azureDisk") {
        default_value(a, "cachingMode", json!("ReadWrite"));
        default_value(a, "kind", json!("Shared"));
        default_value(a, "fsType", json!("ext4"));
        default_value(a, "readOnly", json!(false));
    }
    if let Some(s) = child(v, "scaleIO") {
        default_string(s, "storageMode", "ThinProvisioned");
        default_string(s, "fsType", "xfs");
    }
    if let Some(spec) = child(v, "ephemeral")
        .and_then(|e| child(e, "volumeClaimTemplate"))
        .and_then(|t| child(t, "spec"))
    {
        default_value(spec, "volumeMode", json!("Filesystem"));
    }
}

fn field_refs(downward: &mut Obj) {
    for item in items(downward, "items") {
        if let Some(f) = child(item, "fieldRef") {
            default_string(f, "apiVersion", "v1");
        }
    }
}

// ---- core kinds ----

fn replication_controller(root: &mut Obj) {
    let template_labels = root
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .cloned();
    if let Some(labels @ Value::Object(_)) = template_labels {
        if let Some(spec) = child(root, "spec") {
            if empty_or_unset(spec, "selector") {
                spec.insert("selector".into(), labels.clone());
            }
        }
        if let Some(meta) = child_or_insert(root, "metadata") {
            if empty_or_unset(meta, "labels") {
                meta.insert("labels".into(), labels);
            }
        }
    }
    if let Some(spec) = child(root, "spec") {
        default_value(spec, "replicas", json!(setpoint_api::replicas::DEFAULT));
        template_in(spec);
    }
}

fn service_spec(spec: &mut Obj) {
    default_string(spec, "sessionAffinity", "None");
    match spec.get("sessionAffinity").and_then(Value::as_str) {
        Some("None") => {
            spec.remove("sessionAffinityConfig");
        }
        Some("ClientIP") => {
            let timeout = spec
                .get("sessionAffinityConfig")
                .and_then(|c| c.get("clientIP"))
                .and_then(|c| c.get("timeoutSeconds"))
                .filter(|t| !t.is_null());
            if timeout.is_none() {
                spec.insert(
                    "sessionAffinityConfig".into(),
                    json!({"clientIP": {"timeoutSeconds": 10800}}),
                );
            }
        }
        _ => {}
    }
    default_string(spec, "type", "ClusterIP");
    for p in items(spec, "ports") {
        default_string(p, "protocol", "TCP");
        let target_unset = match p.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(n) => n.as_f64() == Some(0.0),
        };
        if target_unset {
            if let Some(port) = p.get("port").cloned().filter(Value::is_number) {
                p.insert("targetPort".into(), port);
            }
        }
    }
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let externally_accessible = ty == "LoadBalancer"
        || ty == "NodePort"
        || (ty == "ClusterIP" && has_entries(spec, "externalIPs"));
    if externally_accessible {
        default_string(spec, "externalTrafficPolicy", "Cluster");
    }
    if matches!(ty.as_str(), "ClusterIP" | "NodePort" | "LoadBalancer") {
        default_value(spec, "internalTrafficPolicy", json!("Cluster"));
        // Upstream's IP family allocation on a single-stack IPv4 cluster.
        default_value(spec, "ipFamilyPolicy", json!("SingleStack"));
        if empty_or_unset(spec, "ipFamilies") {
            spec.insert("ipFamilies".into(), json!(["IPv4"]));
        }
    }
    if ty == "LoadBalancer" {
        default_value(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
}

fn namespace(root: &mut Obj) {
    let name = root
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // A namespace from generateName has no name yet; the label follows once it has one.
    if !name.is_empty() {
        if let Some(labels) =
            child_or_insert(root, "metadata").and_then(|m| child_or_insert(m, "labels"))
        {
            labels.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }
    if let Some(spec) = child_or_insert(root, "spec") {
        // Only when the list is missing altogether: the namespace controller empties it while
        // deleting, and an empty list must stay empty (see `on_create` for the create rule).
        default_value(spec, "finalizers", json!(["kubernetes"]));
    }
    if let Some(status) = child_or_insert(root, "status") {
        default_string(status, "phase", "Active");
    }
}

fn secret(root: &mut Obj) {
    default_string(root, "type", "Opaque");
    // `stringData` is write-only: upstream's conversion merges it into `data` (it wins over
    // `data` for the same key) and it is never stored.
    // A malformed `stringData` (not a map of strings) is kept for validation to report.
    let well_formed = match root.get("stringData") {
        Some(Value::Null) => true,
        Some(Value::Object(sd)) => {
            sd.values().all(Value::is_string)
                && !root
                    .get("data")
                    .is_some_and(|d| !d.is_object() && !d.is_null())
        }
        _ => false,
    };
    if !well_formed {
        return;
    }
    if let Some(Value::Object(sd)) = root.remove("stringData") {
        if let Some(data) = child_or_insert(root, "data") {
            for (k, v) in sd {
                if let Some(s) = v.as_str() {
                    data.insert(
                        k,
                        json!(base64::engine::general_purpose::STANDARD.encode(s)),
                    );
                }
            }
        }
    }
}

fn limit_range_item(item: &mut Obj) {
    if item.get("type").and_then(Value::as_str) != Some("Container") {
        return;
    }
    let max = item
        .get("max")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let min = item
        .get("min")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(default) = child_or_insert(item, "default") {
        for (k, v) in max {
            default.entry(k).or_insert(v);
        }
    }
    let default = item
        .get("default")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(request) = child_or_insert(item, "defaultRequest") {
        for (k, v) in default {
            request.entry(k).or_insert(v);
        }
        for (k, v) in min {
            request.entry(k).or_insert(v);
        }
    }
}

fn node(root: &mut Obj) {
    if let Some(status) = child(root, "status") {
        if unset(status.get("allocatable")) {
            if let Some(cap) = status.get("capacity").filter(|c| c.is_object()).cloned() {
                status.insert("allocatable".into(), cap);
            }
        }
    }
}

// ---- apps ----

fn deployment(root: &mut Obj) {
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_value(spec, "replicas", json!(setpoint_api::replicas::DEFAULT));
    if let Some(strategy) = child_or_insert(spec, "strategy") {
        default_string(strategy, "type", "RollingUpdate");
        if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            if let Some(ru) = child_or_insert(strategy, "rollingUpdate") {
                default_value(ru, "maxUnavailable", json!("25%"));
                default_value(ru, "maxSurge", json!("25%"));
            }
        }
    }
    default_value(spec, "revisionHistoryLimit", json!(10));
    default_value(spec, "progressDeadlineSeconds", json!(600));
    template_in(spec);
}

fn stateful_set(root: &mut Obj) {
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_string(spec, "podManagementPolicy", "OrderedReady");
    if let Some(us) = child_or_insert(spec, "updateStrategy") {
        let type_unset =
            unset(us.get("type")) || us.get("type").and_then(Value::as_str) == Some("");
        if type_unset {
            us.insert("type".into(), json!("RollingUpdate"));
            default_value(us, "rollingUpdate", json!({}));
        }
        // The partition is defaulted only when `rollingUpdate` exists (possibly just created).
        if us.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            if let Some(ru) = child(us, "rollingUpdate") {
                default_value(ru, "partition", json!(0));
            }
        }
    }
    if let Some(p) = child_or_insert(spec, "persistentVolumeClaimRetentionPolicy") {
        default_string(p, "whenDeleted", "Retain");
        default_string(p, "whenScaled", "Retain");
    }
    default_value(spec, "replicas", json!(setpoint_api::replicas::DEFAULT));
    default_value(spec, "revisionHistoryLimit", json!(10));
    for pvc in items(spec, "volumeClaimTemplates") {
        if let Some(s) = child(pvc, "spec") {
            default_value(s, "volumeMode", json!("Filesystem"));
        }
        if let Some(status) = child_or_insert(pvc, "status") {
            default_string(status, "phase", "Pending");
        }
    }
    template_in(spec);
}

fn daemon_set(root: &mut Obj) {
    let Some(spec) = child(root, "spec") else {
        return;
    };
    if let Some(us) = child_or_insert(spec, "updateStrategy") {
        default_string(us, "type", "RollingUpdate");
        if us.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            if let Some(ru) = child_or_insert(us, "rollingUpdate") {
                default_value(ru, "maxUnavailable", json!(1));
                default_value(ru, "maxSurge", json!(0));
            }
        }
    }
    default_value(spec, "revisionHistoryLimit", json!(10));
    template_in(spec);
}

// ---- batch ----

fn job(root: &mut Obj) {
    let template_labels = root
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("metadata"))
        .and_then(|m| m.get("labels"))
        .cloned();
    if let Some(labels @ Value::Object(_)) = template_labels {
        if let Some(meta) = child_or_insert(root, "metadata") {
            if empty_or_unset(meta, "labels") {
                meta.insert("labels".into(), labels);
            }
        }
    }
    let Some(spec) = child(root, "spec") else {
        return;
    };
    // A non-parallel job may leave both unset; then both are 1.
    if unset(spec.get("completions")) && unset(spec.get("parallelism")) {
        spec.insert("completions".into(), json!(1));
        spec.insert("parallelism".into(), json!(1));
    }
    default_value(spec, "parallelism", json!(1));
    let backoff = if unset(spec.get("backoffLimitPerIndex")) {
        6
    } else {
        i64::from(i32::MAX)
    };
    default_value(spec, "backoffLimit", json!(backoff));
    default_value(spec, "completionMode", json!("NonIndexed"));
    default_value(spec, "suspend", json!(false));
    let has_failure_policy = !unset(spec.get("podFailurePolicy"));
    if let Some(pfp) = child(spec, "podFailurePolicy") {
        for rule in items(pfp, "rules") {
            for cond in items(rule, "onPodConditions") {
                default_string(cond, "status", "True");
            }
        }
    }
    default_value(
        spec,
        "podReplacementPolicy",
        json!(if has_failure_policy {
            "Failed"
        } else {
            "TerminatingOrFailed"
        }),
    );
    template_in(spec);
}

fn cron_job(root: &mut Obj) {
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_string(spec, "concurrencyPolicy", "Allow");
    default_value(spec, "suspend", json!(false));
    default_value(spec, "successfulJobsHistoryLimit", json!(3));
    default_value(spec, "failedJobsHistoryLimit", json!(1));
    // Only the pod template inside the job template is defaulted; the job spec itself is
    // defaulted when the controller creates each Job.
    if let Some(job_spec) = child(spec, "jobTemplate").and_then(|t| child(t, "spec")) {
        template_in(job_spec);
    }
}

// ---- autoscaling ----

fn hpa(root: &mut Obj) {
    let v1 = root.get("apiVersion").and_then(Value::as_str) == Some("autoscaling/v1");
    let Some(spec) = child(root, "spec") else {
        return;
    };
    default_value(spec, "minReplicas", json!(1));
    if v1 {
        return;
    }
    if empty_or_unset(spec, "metrics") {
        spec.insert(
            "metrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]),
        );
    }
    // Scaling rules are filled in only when the client gave a `behavior` at all.
    if let Some(behavior) = child(spec, "behavior") {
        scaling_rules(
            behavior,
            "scaleUp",
            0,
            json!([{"type": "Pods", "value": 4, "periodSeconds": 15}, {"type": "Percent", "value": 100, "periodSeconds": 15}]),
        );
        scaling_rules(
            behavior,
            "scaleDown",
            300,
            json!([{"type": "Percent", "value": 100, "periodSeconds": 15}]),
        );
    }
}

fn scaling_rules(behavior: &mut Obj, key: &str, window: i64, policies: Value) {
    if let Some(rules) = child_or_insert(behavior, key) {
        default_value(rules, "stabilizationWindowSeconds", json!(window));
        default_value(rules, "selectPolicy", json!("Max"));
        default_value(rules, "policies", policies);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_tolerations_added_once_and_respect_existing() {
        let mut pod = json!({"spec": {"containers": []}});
        default_tolerations(&mut pod, 300);
        default_tolerations(&mut pod, 300);
        let t = pod["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1]["key"], UNREACHABLE_TAINT);
        assert_eq!(t[1]["tolerationSeconds"], 300);

        let mut own = json!({"spec": {"tolerations": [
            {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
        ]}});
        default_tolerations(&mut own, 300);
        let t = own["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0]["tolerationSeconds"], 5);
        assert_eq!(t[1]["key"], NOT_READY_TAINT);

        let mut all = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_tolerations(&mut all, 300);
        assert_eq!(all["spec"]["tolerations"].as_array().unwrap().len(), 1);
    }

    use super::*;
    use proptest::prelude::*;

    fn applied(group: &str, kind: &str, mut v: Value) -> Value {
        apply(group, kind, &mut v);
        v
    }

    fn deployment_json() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{
                        "name": "main", "image": "nginx:1.25",
                        "ports": [{"containerPort": 80}],
                        "livenessProbe": {"httpGet": {"port": 80}},
                        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
                    }]}
                }
            }
        })
    }

    #[test]
    fn deployment_defaults() {
        let d = applied("apps", "Deployment", deployment_json());
        let spec = &d["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(
            spec["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert_eq!(spec["progressDeadlineSeconds"], 600);
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Always");
        assert_eq!(pod["dnsPolicy"], "ClusterFirst");
        assert_eq!(pod["schedulerName"], "default-scheduler");
        assert_eq!(pod["terminationGracePeriodSeconds"], 30);
        assert_eq!(pod["securityContext"], json!({}));
        assert!(
            pod.get("enableServiceLinks").is_none(),
            "pod-only default leaked into a template"
        );
        let c = &pod["containers"][0];
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["resources"], json!({}));
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(
            c["livenessProbe"],
            json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
    }

    #[test]
    fn recreate_strategy_gets_no_rolling_update() {
        let mut d = deployment_json();
        d["spec"]["strategy"] = json!({"type": "Recreate"});
        let d = applied("apps", "Deployment", d);
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn explicit_values_are_kept() {
        let mut d = deployment_json();
        d["spec"]["replicas"] = json!(0);
        d["spec"]["strategy"] = json!({"rollingUpdate": {"maxSurge": 1}});
        d["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        let d = applied("apps", "Deployment", d);
        assert_eq!(d["spec"]["replicas"], 0);
        assert_eq!(
            d["spec"]["strategy"]["rollingUpdate"],
            json!({"maxSurge": 1, "maxUnavailable": "25%"})
        );
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Never");
    }

    #[test]
    fn pull_policy_follows_the_tag() {
        for (image, want) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.25", "IfNotPresent"),
            ("localhost:5000/nginx", "Always"),
            ("localhost:5000/nginx:v1", "IfNotPresent"),
            ("nginx@sha256:abcd", "IfNotPresent"),
            ("nginx:latest@sha256:abcd", "Always"),
            ("", "IfNotPresent"),
        ] {
            assert_eq!(default_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn pod_only_defaults() {
        let p = applied(
            "",
            "Pod",
            json!({"spec": {"hostNetwork": true, "containers": [{
                "name": "a", "image": "busybox",
                "ports": [{"containerPort": 8080}],
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}}
            }], "volumes": [{"name": "scratch"}, {"name": "s", "secret": {"secretName": "x"}}]}}),
        );
        let spec = &p["spec"];
        assert_eq!(spec["enableServiceLinks"], true);
        let c = &spec["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(
            c["resources"]["requests"],
            json!({"cpu": "500m", "memory": "1Gi"})
        );
        assert_eq!(c["ports"][0]["hostPort"], 8080);
        assert_eq!(
            spec["volumes"][0],
            json!({"name": "scratch", "emptyDir": {}})
        );
        assert_eq!(spec["volumes"][1]["secret"]["defaultMode"], 420);
    }

    #[test]
    fn job_template_is_defaulted_like_any_pod_template() {
        let j = applied(
            "batch",
            "Job",
            json!({"metadata": {"name": "pi"}, "spec": {"template": {"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "pi", "image": "perl"}]}}}}),
        );
        let spec = &j["spec"];
        assert_eq!(spec["completions"], 1);
        assert_eq!(spec["parallelism"], 1);
        assert_eq!(spec["backoffLimit"], 6);
        assert_eq!(spec["completionMode"], "NonIndexed");
        assert_eq!(spec["suspend"], false);
        assert_eq!(spec["podReplacementPolicy"], "TerminatingOrFailed");
        assert_eq!(j["metadata"]["labels"], json!({"x": "y"}));
        // Upstream's Job defaulter runs SetDefaults_PodSpec on the template too, so a Job that
        // omits restartPolicy fails validation with `Unsupported value: "Always"`.
        assert_eq!(spec["template"]["spec"]["restartPolicy"], "Always");
    }

    #[test]
    fn job_parallelism_only() {
        let j = applied(
            "batch",
            "Job",
            json!({"spec": {"parallelism": 3, "template": {}}}),
        );
        assert!(j["spec"].get("completions").is_none());
        assert_eq!(j["spec"]["parallelism"], 3);
    }

    #[test]
    fn job_selector_generation() {
        let mut j = applied(
            "batch",
            "Job",
            json!({"metadata": {"name": "pi"}, "spec": {"template": {"spec": {"containers": [{"name": "pi", "image": "perl"}]}}}}),
        );
        job_selector(&mut j, "1234");
        assert_eq!(
            j["spec"]["selector"],
            json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "1234"}})
        );
        let labels = &j["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["controller-uid"], "1234");
        assert_eq!(labels["batch.kubernetes.io/controller-uid"], "1234");
        assert_eq!(labels["job-name"], "pi");
        assert_eq!(labels["batch.kubernetes.io/job-name"], "pi");
        let mut manual = json!({"metadata": {"name": "m"}, "spec": {"manualSelector": true, "selector": {"matchLabels": {"a": "b"}}}});
        let before = manual.clone();
        job_selector(&mut manual, "1");
        assert_eq!(manual, before);
    }

    #[test]
    fn cron_job_defaults() {
        let c = applied(
            "batch",
            "CronJob",
            json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "b:1"}]}}}}}}),
        );
        let spec = &c["spec"];
        assert_eq!(spec["concurrencyPolicy"], "Allow");
        assert_eq!(spec["suspend"], false);
        assert_eq!(spec["successfulJobsHistoryLimit"], 3);
        assert_eq!(spec["failedJobsHistoryLimit"], 1);
        assert!(spec["jobTemplate"]["spec"].get("backoffLimit").is_none());
        assert_eq!(
            spec["jobTemplate"]["spec"]["template"]["spec"]["dnsPolicy"],
            "ClusterFirst"
        );
    }

    #[test]
    fn service_defaults() {
        let s = applied(
            "",
            "Service",
            json!({"spec": {"selector": {"app": "web"}, "ports": [{"port": 80}, {"port": 443, "targetPort": "https"}]}}),
        );
        let spec = &s["spec"];
        assert_eq!(spec["type"], "ClusterIP");
        assert_eq!(spec["sessionAffinity"], "None");
        assert_eq!(
            spec["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80})
        );
        assert_eq!(spec["ports"][1]["targetPort"], "https");
        assert_eq!(spec["internalTrafficPolicy"], "Cluster");
        assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
        assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
        assert!(spec.get("externalTrafficPolicy").is_none());
        let lb = applied(
            "",
            "Service",
            json!({"spec": {"type": "LoadBalancer", "sessionAffinity": "ClientIP", "ports": [{"port": 80}]}}),
        );
        assert_eq!(lb["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(lb["spec"]["allocateLoadBalancerNodePorts"], true);
        assert_eq!(
            lb["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"],
            10800
        );
        let ext = applied(
            "",
            "Service",
            json!({"spec": {"type": "ExternalName", "externalName": "example.com"}}),
        );
        assert!(ext["spec"].get("ipFamilies").is_none());
        assert!(ext["spec"].get("internalTrafficPolicy").is_none());
    }

    #[test]
    fn namespace_defaults_and_create() {
        let mut ns = applied("", "Namespace", json!({"metadata": {"name": "team-a"}}));
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "team-a"
        );
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        // The finalizer removed during deletion does not come back.
        ns["spec"]["finalizers"] = json!([]);
        ns["status"]["phase"] = json!("Terminating");
        let again = applied("", "Namespace", ns.clone());
        assert_eq!(again, ns);
        let mut created = json!({"metadata": {"name": "b"}, "spec": {"finalizers": ["example.com/x"]}, "status": {"phase": "Terminating"}});
        apply("", "Namespace", &mut created);
        on_create("", "Namespace", &mut created);
        assert_eq!(
            created["spec"]["finalizers"],
            json!(["example.com/x", "kubernetes"])
        );
        assert_eq!(created["status"], json!({"phase": "Active"}));
    }

    #[test]
    fn secret_defaults_merge_string_data() {
        let s = applied(
            "",
            "Secret",
            json!({"data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "new", "c": "z"}}),
        );
        assert_eq!(s["type"], "Opaque");
        assert!(s.get("stringData").is_none());
        assert_eq!(s["data"], json!({"a": "eA==", "b": "bmV3", "c": "eg=="}));
    }

    #[test]
    fn workload_defaults() {
        let sts = applied(
            "apps",
            "StatefulSet",
            json!({"spec": {"volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}], "template": {"spec": {}}}}),
        );
        let spec = &sts["spec"];
        assert_eq!(spec["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            spec["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        );
        assert_eq!(
            spec["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert_eq!(
            spec["volumeClaimTemplates"][0]["spec"]["volumeMode"],
            "Filesystem"
        );
        assert_eq!(
            spec["volumeClaimTemplates"][0]["status"]["phase"],
            "Pending"
        );
        let ds = applied("apps", "DaemonSet", json!({"spec": {"template": {}}}));
        assert_eq!(
            ds["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(ds["spec"]["revisionHistoryLimit"], 10);
        let rs = applied("apps", "ReplicaSet", json!({"spec": {}}));
        assert_eq!(rs["spec"]["replicas"], 1);
        let rc = applied(
            "",
            "ReplicationController",
            json!({"spec": {"template": {"metadata": {"labels": {"app": "x"}}}}}),
        );
        assert_eq!(rc["spec"]["selector"], json!({"app": "x"}));
        assert_eq!(rc["metadata"]["labels"], json!({"app": "x"}));
        assert_eq!(rc["spec"]["replicas"], 1);
    }

    #[test]
    fn hpa_defaults() {
        let h = applied(
            "autoscaling",
            "HorizontalPodAutoscaler",
            json!({"apiVersion": "autoscaling/v2", "spec": {"maxReplicas": 3, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}}),
        );
        assert_eq!(h["spec"]["minReplicas"], 1);
        assert_eq!(
            h["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        assert_eq!(
            h["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            60
        );
        assert_eq!(h["spec"]["behavior"]["scaleUp"]["policies"][0]["value"], 4);
        let v1 = applied(
            "autoscaling",
            "HorizontalPodAutoscaler",
            json!({"apiVersion": "autoscaling/v1", "spec": {"maxReplicas": 3}}),
        );
        assert!(v1["spec"].get("metrics").is_none());
    }

    #[test]
    fn wrong_types_are_left_alone() {
        let weird = json!({"spec": {"replicas": "three", "strategy": "fast", "template": {"spec": {"containers": "x"}}}});
        let d = applied("apps", "Deployment", weird.clone());
        assert_eq!(d["spec"]["replicas"], "three");
        assert_eq!(d["spec"]["strategy"], "fast");
        assert_eq!(d["spec"]["template"]["spec"]["containers"], "x");
        // Not an object at all: nothing to do, no panic.
        let mut s = json!("text");
        apply("apps", "Deployment", &mut s);
        assert_eq!(s, json!("text"));
    }

    fn every_kind() -> Vec<(&'static str, &'static str, Value)> {
        vec![
            ("apps", "Deployment", deployment_json()),
            (
                "",
                "Pod",
                json!({"spec": {"hostNetwork": true, "containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 1}], "resources": {"limits": {"cpu": 1}}}], "volumes": [{"name": "v"}]}}),
            ),
            (
                "",
                "Service",
                json!({"spec": {"type": "NodePort", "sessionAffinity": "ClientIP", "ports": [{"port": 1}]}}),
            ),
            ("", "Namespace", json!({"metadata": {"name": "n"}})),
            ("", "Secret", json!({"stringData": {"a": "b"}})),
            (
                "",
                "ReplicationController",
                json!({"spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {}}}}),
            ),
            (
                "apps",
                "StatefulSet",
                json!({"spec": {"updateStrategy": {}, "template": {"spec": {}}}}),
            ),
            ("apps", "DaemonSet", json!({"spec": {}})),
            (
                "batch",
                "Job",
                json!({"spec": {"podFailurePolicy": {"rules": [{"onPodConditions": [{"type": "X"}]}]}, "template": {"metadata": {"labels": {"a": "b"}}}}}),
            ),
            (
                "batch",
                "CronJob",
                json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {}}}}}}),
            ),
            (
                "autoscaling",
                "HorizontalPodAutoscaler",
                json!({"spec": {"behavior": {}}}),
            ),
            (
                "",
                "LimitRange",
                json!({"spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "1Mi"}}]}}),
            ),
            (
                "",
                "Endpoints",
                json!({"subsets": [{"ports": [{"port": 1}]}]}),
            ),
            ("", "Node", json!({"status": {"capacity": {"cpu": "2"}}})),
        ]
    }

    #[test]
    fn defaulting_is_idempotent_for_every_kind() {
        for (group, kind, obj) in every_kind() {
            let once = applied(group, kind, obj);
            let twice = applied(group, kind, once.clone());
            assert_eq!(once, twice, "{kind}");
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-3i64..70000).prop_map(Value::from),
            prop_oneof![
                Just("".to_string()),
                Just("Always".to_string()),
                Just("RollingUpdate".to_string()),
                "[a-z:0-9]{0,6}".prop_map(|s| s)
            ]
            .prop_map(Value::from),
        ];
        let keys = prop_oneof![
            Just("spec"),
            Just("template"),
            Just("containers"),
            Just("ports"),
            Just("strategy"),
            Just("type"),
            Just("rollingUpdate"),
            Just("image"),
            Just("metadata"),
            Just("labels"),
            Just("name"),
            Just("replicas"),
            Just("updateStrategy"),
            Just("volumes"),
            Just("resources"),
            Just("limits"),
            Just("stringData"),
            Just("selector"),
            Just("targetPort"),
            Just("port"),
            Just("behavior"),
            Just("jobTemplate"),
            Just("hostNetwork"),
        ];
        leaf.prop_recursive(5, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::vec((keys.clone(), inner), 0..5).prop_map(
                    |kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                ),
            ]
        })
    }

    proptest! {
        /// Applying defaults twice equals applying them once, whatever shape the input has.
        #[test]
        fn idempotent_on_arbitrary_input(obj in arb_json(), which in 0usize..14) {
            let (group, kind, _) = every_kind()[which].clone();
            let once = applied(group, kind, obj);
            let twice = applied(group, kind, once.clone());
            prop_assert_eq!(once, twice);
        }
    }
}
