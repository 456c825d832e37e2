//! End to end with the real kubectl against `setpoint server` (with an audit log):
//! ValidatingAdmissionPolicy and its bindings.
//!
//! - a policy with `paramKind: ConfigMap` denies a Deployment over `params.data.maxReplicas`
//!   (its binding's `paramRef` names the ConfigMap), and kubectl prints the
//!   `messageExpression` text in upstream's wording, as a 403 for `reason: Forbidden`;
//! - a `Warn` binding lets the write through and kubectl prints the warning;
//! - an `Audit` binding lets it through and records the failure in the audit event's
//!   `validation.policy.admission.k8s.io/validation_failure` annotation;
//! - a binding whose parameter is missing with `parameterNotFoundAction: Deny` refuses;
//! - `kubectl get` shows the policies' and bindings' columns, and the policy's status its
//!   observed generation and the expression that does not compile;
//! - a policy whose validations ask the `authorizer` (may the user update `deployments/scale`;
//!   may the user `set-tier` the request's own resource, a custom verb) lets a user whose
//!   Role grants it through and refuses one whose Role does not (both through `--as`).
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::time::Duration;

use serde_json::Value;

mod support;

use support::{eventually, Setpoint};

const POLICY: &str = "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: max-replicas
spec:
  paramKind:
    apiVersion: v1
    kind: ConfigMap
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [deployments]
  variables:
  - name: limit
    expression: int(params.data.maxReplicas)
  validations:
  - expression: object.spec.replicas <= variables.limit
    messageExpression: \"'replicas ' + string(object.spec.replicas) + ' is over the limit of ' + string(variables.limit)\"
    reason: Forbidden
  auditAnnotations:
  - key: replicas
    valueExpression: string(object.spec.replicas)
";

/// A policy `name` on Deployment creates with the one validation `expression`, which denies
/// nothing when it fails to evaluate (`failurePolicy: Ignore`).
fn creates_policy(name: &str, expression: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {name}
spec:
  failurePolicy: Ignore
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [deployments]
  validations:
  - expression: {expression}
"
    )
}

/// A policy whose validations ask what the request's user may do, its binding (namespace
/// `authz` only), and the RBAC of two users there: both may write deployments, only bob may
/// scale them and use the custom verb `set-tier`.
fn authz_policy() -> String {
    [
        AUTHZ_POLICY.to_string(),
        support::role(
            "authz",
            "deployer",
            &[("apps", "deployments", "create, get, list")],
        ),
        support::role(
            "authz",
            "scaler",
            &[
                ("apps", "deployments/scale", "update"),
                ("apps", "deployments", "set-tier"),
            ],
        ),
        support::role_binding("authz", "deployers", "deployer", &["alice", "bob"]),
        support::role_binding("authz", "scalers", "scaler", &["bob"]),
    ]
    .join("---\n")
}

/// The policy of [`authz_policy`] and its binding.
const AUTHZ_POLICY: &str = "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: scale-guard
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [deployments]
  validations:
  - expression: >-
      object.spec.replicas <= 3 ||
      authorizer.group('apps').resource('deployments').subresource('scale')
      .namespace(request.namespace).name(object.metadata.name).check('update').allowed()
    messageExpression: \"'user ' + request.userInfo.username + ' may not scale deployments past 3 replicas'\"
    reason: Forbidden
  - expression: >-
      !has(object.metadata.labels) || !('tier' in object.metadata.labels) ||
      authorizer.requestResource.check('set-tier').allowed()
    message: only who may set-tier deployments may label a tier
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: scale-guard
spec:
  policyName: scale-guard
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: authz
";

fn binding(name: &str, namespace: &str, action: &str, param: &str, not_found: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {name}
spec:
  policyName: max-replicas
  validationActions: [{action}]
  paramRef:
    name: {param}
    parameterNotFoundAction: {not_found}
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {namespace}
"
    )
}

fn deployment(name: &str, namespace: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      containers:
      - name: main
        image: registry.example/app:1
"
    )
}

/// The annotations of the audit event of `path` at `ResponseComplete` for the create of
/// deployment `namespace/name`.
fn audit_annotations(path: &std::path::Path, namespace: &str, name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| {
            e["stage"] == "ResponseComplete"
                && e["verb"] == "create"
                && e.pointer("/objectRef/resource") == Some(&Value::from("deployments"))
                && e.pointer("/objectRef/namespace") == Some(&Value::from(namespace))
                && e.pointer("/objectRef/name") == Some(&Value::from(name))
        })
        .map(|e| e["annotations"].clone())
}

#[test]
fn admission_policies_deny_warn_and_audit_with_params() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policy_file = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy_file,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Request\n  resources:\n  - group: apps\n    resources: [deployments]\n- level: None\n",
    )
    .unwrap();
    let log = dir.path().join("audit.log");
    let data = dir.path().join("data");
    let s = Setpoint::start(
        &[
            "server",
            "--audit-policy-file",
            policy_file.to_str().unwrap(),
            "--audit-log-path",
            log.to_str().unwrap(),
        ],
        &data,
    );
    for ns in ["denied", "warned", "audited", "unset"] {
        s.ok(&["create", "namespace", ns]);
        s.ok(&[
            "create",
            "configmap",
            "limits",
            "-n",
            ns,
            "--from-literal=maxReplicas=3",
        ]);
    }
    s.apply(POLICY);
    s.apply(&creates_policy("broken", "object.spec.replica <= 3"));
    // An expression that does not compile refuses the policy when it is written.
    let (ok, _, stderr) = s.create(
        &creates_policy("syntax-error", "object.spec.replicas >"),
        &[],
    );
    assert!(
        !ok && stderr.contains(
            "The ValidatingAdmissionPolicy \"syntax-error\" is invalid: \
             spec.validations[0].expression: Invalid value: \"object.spec.replicas >\": \
             compilation failed: "
        ),
        "{stderr}"
    );
    s.apply(&binding("deny-over", "denied", "Deny", "limits", "Deny"));
    s.apply(&binding("warn-over", "warned", "Warn", "limits", "Deny"));
    s.apply(&binding(
        "audit-over",
        "audited",
        "Audit",
        "limits",
        "Allow",
    ));
    s.apply(&binding("missing-param", "unset", "Deny", "absent", "Deny"));

    let listed = s.ok(&["get", "validatingadmissionpolicies"]);
    assert!(
        listed.contains("VALIDATIONS")
            && listed.contains("PARAMKIND")
            && listed.contains("max-replicas")
            && listed.contains("v1/ConfigMap"),
        "{listed}"
    );
    let listed = s.ok(&["get", "validatingadmissionpolicybindings"]);
    assert!(
        listed.contains("POLICYNAME") && listed.contains("*/limits"),
        "{listed}"
    );

    // The policy reaches the watch cache a moment after the write: wait for the denial.
    let mut probes = 0;
    let stderr = eventually(
        "the policy denies a deployment over the limit",
        Duration::from_secs(20),
        || {
            probes += 1;
            let (ok, _, stderr) = s.create(&deployment(&format!("big-{probes}"), "denied", 5), &[]);
            (!ok).then_some(stderr)
        },
    );
    assert!(
        stderr.contains(
            "deployments.apps \"big-"
        ) && stderr.contains(
            "is forbidden: ValidatingAdmissionPolicy 'max-replicas' with binding 'deny-over' denied request: replicas 5 is over the limit of 3"
        ),
        "{stderr}"
    );
    let (ok, _, stderr) = s.create(&deployment("small", "denied", 2), &[]);
    assert!(ok, "within the limit: {stderr}");

    // Warn: written, with kubectl's `Warning:` line.
    let (ok, _, stderr) = s.create(&deployment("big", "warned", 5), &[]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'max-replicas' with binding 'warn-over': replicas 5 is over the limit of 3"),
        "{stderr}"
    );

    // Audit: written, and the audit event says why it would have failed.
    let (ok, _, stderr) = s.create(&deployment("big", "audited", 7), &[]);
    assert!(ok, "{stderr}");
    let notes = eventually(
        "the audit event is written",
        Duration::from_secs(10),
        || {
            audit_annotations(&log, "audited", "big").filter(|n| {
                n.is_object() && n.get("max-replicas/replicas") == Some(&Value::from("7"))
            })
        },
    );
    let failure: Value = serde_json::from_str(
        notes["validation.policy.admission.k8s.io/validation_failure"]
            .as_str()
            .unwrap_or_else(|| panic!("{notes}")),
    )
    .unwrap();
    assert_eq!(failure[0]["message"], "replicas 7 is over the limit of 3");
    assert_eq!(failure[0]["binding"], "audit-over");
    assert_eq!(failure[0]["expressionIndex"], 0);

    // A missing parameter with parameterNotFoundAction: Deny fails the policy (Fail).
    let (ok, _, stderr) = s.create(&deployment("any", "unset", 1), &[]);
    assert!(!ok);
    assert!(
        stderr.contains("ValidatingAdmissionPolicy 'max-replicas' with binding 'missing-param' denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"),
        "{stderr}"
    );

    // Status: the generation looked at, and the expression that does not type-check.
    let status = eventually(
        "the policy status is written",
        Duration::from_secs(20),
        || {
            let out = s.ok(&["get", "validatingadmissionpolicy", "broken", "-o", "json"]);
            let v: Value = serde_json::from_str(&out).unwrap();
            (v.pointer("/status/observedGeneration") == Some(&Value::from(1)))
                .then(|| v["status"].clone())
        },
    );
    let warnings = &status["typeChecking"]["expressionWarnings"];
    assert_eq!(
        warnings[0]["fieldRef"], "spec.validations[0].expression",
        "{status}"
    );

    // The authorizer: what the user may do decides.
    s.ok(&["create", "namespace", "authz"]);
    s.apply(&authz_policy());
    let mut probes = 0;
    let stderr = eventually(
        "the authorizer policy refuses alice a deployment of 5 replicas",
        Duration::from_secs(20),
        || {
            probes += 1;
            let manifest = deployment(&format!("alice-{probes}"), "authz", 5);
            let (ok, _, stderr) = s.create(&manifest, &["--as=alice"]);
            // Until alice's RoleBinding is seen, RBAC refuses her before admission.
            (!ok && stderr.contains("scale-guard")).then_some(stderr)
        },
    );
    assert!(
        stderr.contains("is forbidden: ValidatingAdmissionPolicy 'scale-guard' with binding 'scale-guard' denied request: user alice may not scale deployments past 3 replicas"),
        "{stderr}"
    );
    let (ok, _, stderr) = s.create(&deployment("alice-small", "authz", 2), &["--as=alice"]);
    assert!(ok, "alice within 3 replicas: {stderr}");
    // bob's RoleBindings may reach the cache after alice's.
    let mut probes = 0;
    eventually(
        "bob, who may update deployments/scale, creates 5 replicas",
        Duration::from_secs(10),
        || {
            probes += 1;
            let manifest = deployment(&format!("bob-{probes}"), "authz", 5);
            let (ok, _, stderr) = s.create(&manifest, &["--as=bob"]);
            if !ok {
                eprintln!("bob's create refused (retrying): {stderr}");
            }
            ok.then_some(())
        },
    );
    let tiered = |name: &str| {
        deployment(name, "authz", 1).replacen(
            "  namespace: authz\n",
            "  namespace: authz\n  labels:\n    tier: gold\n",
            1,
        )
    };
    let (ok, _, stderr) = s.create(&tiered("alice-tier"), &["--as=alice"]);
    assert!(!ok, "alice may not set-tier");
    assert!(
        stderr.contains("denied request: only who may set-tier deployments may label a tier"),
        "{stderr}"
    );
    let (ok, _, stderr) = s.create(&tiered("bob-tier"), &["--as=bob"]);
    assert!(ok, "bob may set-tier: {stderr}");
    s.stop();
}
