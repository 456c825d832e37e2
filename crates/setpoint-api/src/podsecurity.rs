//! The Pod Security Standards (`privileged`, `baseline`, `restricted`) as Pod Security
//! admission evaluates them: a namespace's `pod-security.kubernetes.io/*` labels become a
//! [`Policy`], and [`evaluate`] checks a pod's metadata and spec against one level, giving
//! each failed check's reason and detail in upstream's words (clients and people grep them).
//!
//! It lives here, without I/O, so that everything that looks at pods can ask the same
//! question: the API server's admission, and any client that wants to know before it writes.
//! Every version label is accepted and evaluated with the latest checks (Kubernetes 1.32's).

use serde_json::{Map, Value};

/// The label prefix of every Pod Security label.
pub const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";
/// The namespace label whose level refuses violating pods.
pub const ENFORCE_LEVEL_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// The version the enforce level is evaluated at.
pub const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";
/// The namespace label whose level records violations in the audit log.
pub const AUDIT_LEVEL_LABEL: &str = "pod-security.kubernetes.io/audit";
/// The version the audit level is evaluated at.
pub const AUDIT_VERSION_LABEL: &str = "pod-security.kubernetes.io/audit-version";
/// The namespace label whose level answers violations with a warning.
pub const WARN_LEVEL_LABEL: &str = "pod-security.kubernetes.io/warn";
/// The version the warn level is evaluated at.
pub const WARN_VERSION_LABEL: &str = "pod-security.kubernetes.io/warn-version";

/// A Pod Security Standard, from least to most restrictive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Unrestricted.
    Privileged,
    /// Prevents known privilege escalations.
    Baseline,
    /// Current pod hardening best practice.
    Restricted,
}

impl Level {
    /// The level's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }

    /// Parses a label value; `None` when it names no level.
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }
}

/// A level at a policy version (`latest` or `v1.<minor>`), written `level:version`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LevelVersion {
    /// The level.
    pub level: Level,
    /// `latest` or `v1.<minor>`, as the label said it.
    pub version: String,
}

impl LevelVersion {
    fn privileged() -> Self {
        LevelVersion {
            level: Level::Privileged,
            version: "latest".into(),
        }
    }
}

impl std::fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.level.as_str(), self.version)
    }
}

/// What a namespace's labels ask for in each mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Violations are refused.
    pub enforce: LevelVersion,
    /// Violations are recorded in the audit log.
    pub audit: LevelVersion,
    /// Violations are answered with a warning.
    pub warn: LevelVersion,
}

impl Default for Policy {
    /// The API server's default when a namespace has no labels: privileged in every mode.
    fn default() -> Self {
        Policy {
            enforce: LevelVersion::privileged(),
            audit: LevelVersion::privileged(),
            warn: LevelVersion::privileged(),
        }
    }
}

/// A Pod Security label whose value is not understood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelError {
    /// The label's key.
    pub label: &'static str,
    /// Its value.
    pub value: String,
    /// Why it is refused (upstream's words).
    pub detail: &'static str,
}

impl std::fmt::Display for LabelError {
    /// As a field error: `metadata.labels[<label>]: Invalid value: "<value>": <detail>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "metadata.labels[{}]: Invalid value: {}: {}",
            self.label,
            Value::from(self.value.as_str()),
            self.detail
        )
    }
}

const LEVEL_DETAIL: &str = "must be one of privileged, baseline, restricted";
const VERSION_DETAIL: &str = "must be \"latest\" or \"v1.x\"";

fn valid_version(v: &str) -> bool {
    if v == "latest" {
        return true;
    }
    // `v1.<minor>`, with no leading zero unless the minor is 0 itself.
    let Some(minor) = v.strip_prefix("v1.") else {
        return false;
    };
    !minor.is_empty()
        && minor.bytes().all(|b| b.is_ascii_digit())
        && (minor == "0" || !minor.starts_with('0'))
        && minor.parse::<u32>().is_ok()
}

/// The policy a namespace's labels ask for, with the labels that could not be understood.
/// As upstream: an unknown enforce level (or version) is evaluated as `restricted`
/// (`latest`), while unknown audit and warn levels fail open to `privileged`.
pub fn policy_from_labels(labels: Option<&Map<String, Value>>) -> (Policy, Vec<LabelError>) {
    let mut policy = Policy::default();
    let mut errors = Vec::new();
    let Some(labels) = labels else {
        return (policy, errors);
    };
    let modes: [(&'static str, &'static str, Level); 3] = [
        (
            ENFORCE_LEVEL_LABEL,
            ENFORCE_VERSION_LABEL,
            Level::Restricted,
        ),
        (AUDIT_LEVEL_LABEL, AUDIT_VERSION_LABEL, Level::Privileged),
        (WARN_LEVEL_LABEL, WARN_VERSION_LABEL, Level::Privileged),
    ];
    for (i, (level_label, version_label, on_error)) in modes.into_iter().enumerate() {
        let lv = match i {
            0 => &mut policy.enforce,
            1 => &mut policy.audit,
            _ => &mut policy.warn,
        };
        if let Some(v) = labels.get(level_label) {
            let v = v.as_str().unwrap_or_default();
            match Level::parse(v) {
                Some(level) => lv.level = level,
                None => {
                    lv.level = on_error;
                    errors.push(LabelError {
                        label: level_label,
                        value: v.into(),
                        detail: LEVEL_DETAIL,
                    });
                }
            }
        }
        if let Some(v) = labels.get(version_label) {
            let v = v.as_str().unwrap_or_default();
            if valid_version(v) {
                lv.version = v.into();
            } else {
                lv.version = "latest".into();
                errors.push(LabelError {
                    label: version_label,
                    value: v.into(),
                    detail: VERSION_DETAIL,
                });
            }
        }
    }
    (policy, errors)
}

/// One failed check: its id, the short reason, and the detail (may be empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The check's id, as upstream names it (`privileged`, `runAsNonRoot`, ...).
    pub check: &'static str,
    /// The short reason (`privileged`, `allowPrivilegeEscalation != false`, ...).
    pub reason: String,
    /// What exactly was found, or empty.
    pub detail: String,
}

impl Violation {
    fn new(check: &'static str, reason: impl Into<String>, detail: impl Into<String>) -> Self {
        Violation {
            check,
            reason: reason.into(),
            detail: detail.into(),
        }
    }
}

/// The violations as upstream's messages list them: `reason (detail), reason (detail)`.
pub fn forbidden_detail(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| {
            if v.detail.is_empty() {
                v.reason.clone()
            } else {
                format!("{} ({})", v.reason, v.detail)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The pod template a workload carries (`metadata`, `spec`), for the kinds Pod Security
/// admission looks into: Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs,
/// ReplicationControllers (`spec.template`) and CronJobs (`spec.jobTemplate.spec.template`).
pub fn workload_template<'a>(group: &str, plural: &str, obj: &'a Value) -> Option<&'a Value> {
    match (group, plural) {
        ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets")
        | ("batch", "jobs")
        | ("", "replicationcontrollers") => obj.pointer("/spec/template"),
        ("batch", "cronjobs") => obj.pointer("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// Checks a pod (its `metadata` and `spec`) against `level` with the latest checks, and
/// returns every failed check in upstream's order: the baseline checks, then (for
/// `restricted`) the restricted ones, which replace the baseline checks they tighten
/// (capabilities, hostPath volumes, seccomp).
pub fn evaluate(level: Level, metadata: &Value, spec: &Value) -> Vec<Violation> {
    if level == Level::Privileged {
        return vec![];
    }
    let pod = Pod { metadata, spec };
    let mut checks: Vec<fn(&Pod) -> Option<Violation>> = vec![
        app_armor_profile,
        host_namespaces,
        host_ports,
        privileged,
        proc_mount,
        se_linux_options,
        sysctls,
        windows_host_process,
    ];
    if level == Level::Baseline {
        checks.extend([
            capabilities_baseline as fn(&Pod) -> Option<Violation>,
            host_path_volumes,
            seccomp_profile_baseline,
        ]);
    } else {
        checks.extend([
            allow_privilege_escalation as fn(&Pod) -> Option<Violation>,
            capabilities_restricted,
            restricted_volumes,
            run_as_non_root,
            run_as_user,
            seccomp_profile_restricted,
        ]);
    }
    checks.iter().filter_map(|check| check(&pod)).collect()
}

struct Pod<'a> {
    metadata: &'a Value,
    spec: &'a Value,
}

impl Pod<'_> {
    /// Init containers, containers, then ephemeral containers, as upstream visits them.
    fn containers(&self) -> impl Iterator<Item = &Value> {
        ["initContainers", "containers", "ephemeralContainers"]
            .into_iter()
            .flat_map(|k| {
                self.spec
                    .get(k)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
    }

    fn pod_sc(&self, field: &str) -> Option<&Value> {
        self.spec
            .get("securityContext")
            .and_then(|sc| sc.get(field))
            .filter(|v| !v.is_null())
    }

    fn annotations(&self) -> impl Iterator<Item = (&String, &str)> {
        self.metadata
            .get("annotations")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default()))
    }
}

fn name(c: &Value) -> String {
    c.get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn sc<'a>(c: &'a Value, field: &str) -> Option<&'a Value> {
    c.get("securityContext")
        .and_then(|sc| sc.get(field))
        .filter(|v| !v.is_null())
}

fn is_true(v: Option<&Value>) -> bool {
    v.and_then(Value::as_bool) == Some(true)
}

fn pluralize<'a>(singular: &'a str, plural: &'a str, n: usize) -> &'a str {
    if n == 1 {
        singular
    } else {
        plural
    }
}

fn join_quote<S: AsRef<str>>(items: &[S]) -> String {
    items
        .iter()
        .map(|s| format!("\"{}\"", s.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `container "a"` / `containers "a", "b"`.
fn containers_phrase(names: &[String]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

/// Sorted, without duplicates (upstream's string sets list this way).
fn set(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

fn str_of(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or_default()
}

// ---- baseline ----

fn app_armor_profile(pod: &Pod) -> Option<Violation> {
    let allowed = |t: &str| matches!(t, "RuntimeDefault" | "Localhost");
    let mut setters = Vec::new();
    let mut values = Vec::new();
    if let Some(p) = pod.pod_sc("appArmorProfile") {
        let t = str_of(p.get("type"));
        if !allowed(t) {
            setters.push("pod".to_string());
            values.push(t.to_string());
        }
    }
    let mut bad = Vec::new();
    for c in pod.containers() {
        if let Some(p) = sc(c, "appArmorProfile") {
            let t = str_of(p.get("type"));
            if !allowed(t) {
                bad.push(name(c));
                values.push(t.to_string());
            }
        }
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    let mut values = set(values);
    let mut annotations: Vec<String> = pod
        .annotations()
        .filter(|(k, v)| {
            k.starts_with("container.apparmor.security.beta.kubernetes.io/")
                && !(v.is_empty() || *v == "runtime/default" || v.starts_with("localhost/"))
        })
        .map(|(k, v)| format!("{k}={}", Value::from(v)))
        .collect();
    annotations.sort();
    if !annotations.is_empty() {
        setters.push(pluralize("annotation", "annotations", annotations.len()).to_string());
        values.extend(annotations);
    }
    if setters.is_empty() {
        return None;
    }
    Some(Violation::new(
        "appArmorProfile",
        pluralize(
            "forbidden AppArmor profile",
            "forbidden AppArmor profiles",
            values.len(),
        ),
        format!(
            "{} must not set AppArmor profile type to {}",
            setters.join(" and "),
            join_quote(&values)
        ),
    ))
}

fn host_namespaces(pod: &Pod) -> Option<Violation> {
    // In upstream's order: network, PID, IPC.
    let found: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|k| is_true(pod.spec.get(*k)))
        .map(|k| format!("{k}=true"))
        .collect();
    (!found.is_empty())
        .then(|| Violation::new("hostNamespaces", "host namespaces", found.join(", ")))
}

fn host_ports(pod: &Pod) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut ports = Vec::new();
    for c in pod.containers() {
        let mut uses = false;
        for p in c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let hp = p.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
            if hp != 0 {
                uses = true;
                ports.push(hp.to_string());
            }
        }
        if uses {
            bad.push(name(c));
        }
    }
    if bad.is_empty() {
        return None;
    }
    let ports = set(ports);
    Some(Violation::new(
        "hostPorts",
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    ))
}

fn privileged(pod: &Pod) -> Option<Violation> {
    let bad: Vec<String> = pod
        .containers()
        .filter(|c| is_true(sc(c, "privileged")))
        .map(name)
        .collect();
    (!bad.is_empty()).then(|| {
        Violation::new(
            "privileged",
            "privileged",
            format!(
                "{} must not set securityContext.privileged=true",
                containers_phrase(&bad)
            ),
        )
    })
}

fn proc_mount(pod: &Pod) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types = Vec::new();
    for c in pod.containers() {
        if let Some(t) = sc(c, "procMount") {
            let t = t.as_str().unwrap_or_default();
            if t != "Default" {
                bad.push(name(c));
                types.push(t.to_string());
            }
        }
    }
    (!bad.is_empty()).then(|| {
        Violation::new(
            "procMount",
            "procMount",
            format!(
                "{} must not set securityContext.procMount to {}",
                containers_phrase(&bad),
                join_quote(&set(types))
            ),
        )
    })
}

fn se_linux_options(pod: &Pod) -> Option<Violation> {
    let mut types = Vec::new();
    let (mut set_user, mut set_role) = (false, false);
    let mut valid = |o: &Value| {
        let mut ok = true;
        let t = str_of(o.get("type"));
        if !matches!(
            t,
            "" | "container_t" | "container_init_t" | "container_kvm_t"
        ) {
            ok = false;
            types.push(t.to_string());
        }
        if !str_of(o.get("user")).is_empty() {
            ok = false;
            set_user = true;
        }
        if !str_of(o.get("role")).is_empty() {
            ok = false;
            set_role = true;
        }
        ok
    };
    let mut setters = Vec::new();
    if let Some(o) = pod.pod_sc("seLinuxOptions") {
        if !valid(o) {
            setters.push("pod".to_string());
        }
    }
    let bad: Vec<String> = pod
        .containers()
        .filter(|c| sc(c, "seLinuxOptions").is_some_and(|o| !valid(o)))
        .map(name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    let types = set(types);
    let mut data = Vec::new();
    // Upstream names the user and role only alongside a bad type (its nesting); kept as is.
    if !types.is_empty() {
        data.push(format!(
            "{} {}",
            pluralize("type", "types", types.len()),
            join_quote(&types)
        ));
        if set_user {
            data.push("user may not be set".to_string());
        }
        if set_role {
            data.push("role may not be set".to_string());
        }
    }
    Some(Violation::new(
        "seLinuxOptions",
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters.join(" and "),
            data.join("; ")
        ),
    ))
}

/// The sysctls the baseline level allows (upstream's list as of 1.32).
pub const SAFE_SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

fn sysctls(pod: &Pod) -> Option<Violation> {
    let bad: Vec<String> = pod
        .pod_sc("sysctls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|s| str_of(s.get("name")).to_string())
        .filter(|n| !SAFE_SYSCTLS.contains(&n.as_str()))
        .collect();
    (!bad.is_empty()).then(|| Violation::new("sysctls", "forbidden sysctls", bad.join(", ")))
}

fn windows_host_process(pod: &Pod) -> Option<Violation> {
    let host_process = |o: Option<&Value>| is_true(o.and_then(|w| w.get("hostProcess")));
    let bad: Vec<String> = pod
        .containers()
        .filter(|c| host_process(sc(c, "windowsOptions")))
        .map(name)
        .collect();
    let mut setters = Vec::new();
    if host_process(pod.pod_sc("windowsOptions")) {
        setters.push("pod".to_string());
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    (!setters.is_empty()).then(|| {
        Violation::new(
            "windowsHostProcess",
            "hostProcess",
            format!(
                "{} must not set securityContext.windowsOptions.hostProcess=true",
                setters.join(" and ")
            ),
        )
    })
}

const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn added_capabilities(c: &Value) -> impl Iterator<Item = &str> {
    sc(c, "capabilities")
        .and_then(|caps| caps.get("add"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or_default())
}

fn capabilities_baseline(pod: &Pod) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut caps = Vec::new();
    for c in pod.containers() {
        let extra: Vec<String> = added_capabilities(c)
            .filter(|cap| !BASELINE_CAPABILITIES.contains(cap))
            .map(String::from)
            .collect();
        if !extra.is_empty() {
            bad.push(name(c));
            caps.extend(extra);
        }
    }
    (!bad.is_empty()).then(|| {
        Violation::new(
            "capabilities_baseline",
            "non-default capabilities",
            format!(
                "{} must not include {} in securityContext.capabilities.add",
                containers_phrase(&bad),
                join_quote(&set(caps))
            ),
        )
    })
}

fn host_path_volumes(pod: &Pod) -> Option<Violation> {
    let bad: Vec<String> = volumes(pod)
        .filter(|v| v.get("hostPath").is_some_and(|h| !h.is_null()))
        .map(name)
        .collect();
    (!bad.is_empty()).then(|| {
        Violation::new(
            "hostPathVolumes",
            "hostPath volumes",
            format!(
                "{} {}",
                pluralize("volume", "volumes", bad.len()),
                join_quote(&bad)
            ),
        )
    })
}

fn volumes<'a>(pod: &'a Pod) -> impl Iterator<Item = &'a Value> {
    pod.spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn seccomp_type(v: &Value) -> &str {
    str_of(v.get("type"))
}

fn valid_seccomp(t: &str) -> bool {
    matches!(t, "RuntimeDefault" | "Localhost")
}

fn seccomp_profile_baseline(pod: &Pod) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut values = Vec::new();
    if let Some(p) = pod.pod_sc("seccompProfile") {
        if !valid_seccomp(seccomp_type(p)) {
            setters.push("pod".to_string());
            values.push(seccomp_type(p).to_string());
        }
    }
    let mut bad = Vec::new();
    for c in pod.containers() {
        if let Some(p) = sc(c, "seccompProfile") {
            if !valid_seccomp(seccomp_type(p)) {
                bad.push(name(c));
                values.push(seccomp_type(p).to_string());
            }
        }
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    (!setters.is_empty()).then(|| {
        Violation::new(
            "seccompProfile_baseline",
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters.join(" and "),
                join_quote(&set(values))
            ),
        )
    })
}

// ---- restricted ----

fn allow_privilege_escalation(pod: &Pod) -> Option<Violation> {
    let bad: Vec<String> = pod
        .containers()
        .filter(|c| sc(c, "allowPrivilegeEscalation").and_then(Value::as_bool) != Some(false))
        .map(name)
        .collect();
    (!bad.is_empty()).then(|| {
        Violation::new(
            "allowPrivilegeEscalation",
            "allowPrivilegeEscalation != false",
            format!(
                "{} must set securityContext.allowPrivilegeEscalation=false",
                containers_phrase(&bad)
            ),
        )
    })
}

fn capabilities_restricted(pod: &Pod) -> Option<Violation> {
    let mut missing_drop = Vec::new();
    let mut adding = Vec::new();
    let mut caps = Vec::new();
    for c in pod.containers() {
        let Some(capabilities) = sc(c, "capabilities") else {
            missing_drop.push(name(c));
            continue;
        };
        let dropped_all = capabilities
            .get("drop")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|v| v.as_str() == Some("ALL")));
        if !dropped_all {
            missing_drop.push(name(c));
        }
        let extra: Vec<String> = added_capabilities(c)
            .filter(|cap| *cap != "NET_BIND_SERVICE")
            .map(String::from)
            .collect();
        if !extra.is_empty() {
            adding.push(name(c));
            caps.extend(extra);
        }
    }
    let mut details = Vec::new();
    if !missing_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_phrase(&missing_drop)
        ));
    }
    if !adding.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding),
            join_quote(&set(caps))
        ));
    }
    (!details.is_empty()).then(|| {
        Violation::new(
            "capabilities_restricted",
            "unrestricted capabilities",
            details.join("; "),
        )
    })
}

/// The volume sources the restricted level allows.
const RESTRICTED_VOLUME_SOURCES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

fn restricted_volumes(pod: &Pod) -> Option<Violation> {
    let bad = set(volumes(pod)
        .filter(|v| {
            !RESTRICTED_VOLUME_SOURCES
                .iter()
                .any(|s| v.get(*s).is_some_and(|x| !x.is_null()))
        })
        .map(name)
        .collect());
    // Upstream formats the sorted names with Go's %q of a string slice: ["a" "b"].
    (!bad.is_empty()).then(|| {
        let quoted: Vec<String> = bad
            .iter()
            .map(|n| Value::from(n.as_str()).to_string())
            .collect();
        Violation::new(
            "restrictedVolumes",
            "restricted volume types",
            format!("volumes [{}] have restricted types", quoted.join(" ")),
        )
    })
}

fn run_as_non_root(pod: &Pod) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut pod_non_root = false;
    if let Some(v) = pod.pod_sc("runAsNonRoot").and_then(Value::as_bool) {
        if v {
            pod_non_root = true;
        } else {
            setters.push("pod".to_string());
        }
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in pod.containers() {
        match sc(c, "runAsNonRoot").and_then(Value::as_bool) {
            Some(false) => explicit.push(name(c)),
            Some(true) => {}
            None if !pod_non_root => implicit.push(name(c)),
            None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    if !setters.is_empty() {
        return Some(Violation::new(
            "runAsNonRoot",
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters.join(" and ")
            ),
        ));
    }
    (!implicit.is_empty()).then(|| {
        Violation::new(
            "runAsNonRoot",
            "runAsNonRoot != true",
            format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                containers_phrase(&implicit)
            ),
        )
    })
}

fn run_as_user(pod: &Pod) -> Option<Violation> {
    let is_root = |v: Option<&Value>| v.and_then(Value::as_i64) == Some(0);
    let mut setters = Vec::new();
    if is_root(pod.pod_sc("runAsUser")) {
        setters.push("pod".to_string());
    }
    let bad: Vec<String> = pod
        .containers()
        .filter(|c| is_root(sc(c, "runAsUser")))
        .map(name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    (!setters.is_empty()).then(|| {
        Violation::new(
            "runAsUser",
            "runAsUser=0",
            format!("{} must not set runAsUser=0", setters.join(" and ")),
        )
    })
}

fn seccomp_profile_restricted(pod: &Pod) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut values = Vec::new();
    let mut pod_set = false;
    if let Some(p) = pod.pod_sc("seccompProfile") {
        if valid_seccomp(seccomp_type(p)) {
            pod_set = true;
        } else {
            setters.push("pod".to_string());
            values.push(seccomp_type(p).to_string());
        }
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in pod.containers() {
        match sc(c, "seccompProfile") {
            Some(p) if !valid_seccomp(seccomp_type(p)) => {
                explicit.push(name(c));
                values.push(seccomp_type(p).to_string());
            }
            Some(_) => {}
            None if !pod_set => implicit.push(name(c)),
            None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    if !setters.is_empty() {
        return Some(Violation::new(
            "seccompProfile_restricted",
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters.join(" and "),
                join_quote(&set(values))
            ),
        ));
    }
    (!implicit.is_empty()).then(|| {
        Violation::new(
            "seccompProfile_restricted",
            "seccompProfile",
            format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                containers_phrase(&implicit)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(level: Level, spec: Value) -> Vec<(&'static str, String)> {
        check_with(level, json!({}), spec)
    }

    fn check_with(level: Level, meta: Value, spec: Value) -> Vec<(&'static str, String)> {
        evaluate(level, &meta, &spec)
            .into_iter()
            .map(|v| {
                let text = forbidden_detail(std::slice::from_ref(&v));
                (v.check, text)
            })
            .collect()
    }

    /// A pod that passes the restricted level.
    fn hardened() -> Value {
        json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "c",
                "image": "x",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
                }
            }],
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "s"}}]
        })
    }

    fn with(mut base: Value, pointer: &str, v: Value) -> Value {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        let mut cur = &mut base;
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            cur = if let Ok(i) = part.parse::<usize>() {
                &mut cur[i]
            } else {
                cur.as_object_mut()
                    .unwrap()
                    .entry(part)
                    .or_insert_with(|| json!({}))
            };
        }
        match key.parse::<usize>() {
            Ok(i) => cur[i] = v,
            Err(_) => cur[key] = v,
        }
        base
    }

    /// `spec` fails exactly one check, `id`, whose text is `text`.
    fn only(level: Level, spec: Value, id: &str, text: &str) {
        let got = check(level, spec);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].0, got[0].1.as_str()), (id, text));
    }

    #[test]
    fn hardened_pod_passes_every_level() {
        for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
            assert!(check(level, hardened()).is_empty(), "{level:?}");
        }
    }

    #[test]
    fn privileged_level_allows_anything() {
        let spec = with(
            hardened(),
            "/containers/0/securityContext/privileged",
            json!(true),
        );
        assert!(check(Level::Privileged, spec).is_empty());
    }

    #[test]
    fn privileged_containers() {
        let spec = with(
            hardened(),
            "/containers/0/securityContext/privileged",
            json!(true),
        );
        only(
            Level::Baseline,
            spec,
            "privileged",
            r#"privileged (container "c" must not set securityContext.privileged=true)"#,
        );
    }

    #[test]
    fn host_namespaces_in_upstream_order() {
        let spec = with(
            with(
                with(hardened(), "/hostIPC", json!(true)),
                "/hostNetwork",
                json!(true),
            ),
            "/hostPID",
            json!(true),
        );
        only(
            Level::Baseline,
            spec,
            "hostNamespaces",
            "host namespaces (hostNetwork=true, hostPID=true, hostIPC=true)",
        );
    }

    #[test]
    fn host_ports() {
        let spec = with(
            hardened(),
            "/containers/0/ports",
            json!([{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81, "hostPort": 8081}]),
        );
        only(
            Level::Baseline,
            spec,
            "hostPorts",
            r#"hostPort (container "c" uses hostPorts 8080, 8081)"#,
        );
    }

    #[test]
    fn baseline_capabilities() {
        let spec = with(
            hardened(),
            "/containers/0/securityContext/capabilities/add",
            json!(["SYS_ADMIN", "CHOWN", "NET_RAW"]),
        );
        only(
            Level::Baseline,
            spec,
            "capabilities_baseline",
            r#"non-default capabilities (container "c" must not include "NET_RAW", "SYS_ADMIN" in securityContext.capabilities.add)"#,
        );
    }

    #[test]
    fn host_path_volumes() {
        let spec = with(
            hardened(),
            "/volumes/0",
            json!({"name": "h", "hostPath": {"path": "/"}}),
        );
        only(
            Level::Baseline,
            spec,
            "hostPathVolumes",
            r#"hostPath volumes (volume "h")"#,
        );
    }

    #[test]
    fn app_armor_fields_and_annotations() {
        let spec = with(
            hardened(),
            "/containers/0/securityContext/appArmorProfile",
            json!({"type": "Unconfined"}),
        );
        only(
            Level::Baseline,
            spec.clone(),
            "appArmorProfile",
            r#"forbidden AppArmor profile (container "c" must not set AppArmor profile type to "Unconfined")"#,
        );
        let meta = json!({"annotations": {
            "container.apparmor.security.beta.kubernetes.io/c": "unconfined",
            "container.apparmor.security.beta.kubernetes.io/d": "runtime/default"
        }});
        assert_eq!(
            check_with(Level::Baseline, meta, hardened()),
            vec![(
                "appArmorProfile",
                r#"forbidden AppArmor profile (annotation must not set AppArmor profile type to "container.apparmor.security.beta.kubernetes.io/c="unconfined"")"#.to_string()
            )]
        );
    }

    #[test]
    fn se_linux_options() {
        let spec = with(
            hardened(),
            "/securityContext/seLinuxOptions",
            json!({"type": "spc_t", "user": "root"}),
        );
        only(
            Level::Baseline,
            spec,
            "seLinuxOptions",
            r#"seLinuxOptions (pod set forbidden securityContext.seLinuxOptions: type "spc_t"; user may not be set)"#,
        );
        let allowed = with(
            hardened(),
            "/securityContext/seLinuxOptions",
            json!({"type": "container_t", "level": "s0:c1"}),
        );
        assert!(check(Level::Baseline, allowed).is_empty());
    }

    #[test]
    fn proc_mount() {
        let spec = with(
            hardened(),
            "/containers/0/securityContext/procMount",
            json!("Unmasked"),
        );
        only(
            Level::Baseline,
            spec,
            "procMount",
            r#"procMount (container "c" must not set securityContext.procMount to "Unmasked")"#,
        );
        let default = with(
            hardened(),
            "/containers/0/securityContext/procMount",
            json!("Default"),
        );
        assert!(check(Level::Baseline, default).is_empty());
    }

    #[test]
    fn seccomp_unconfined_at_baseline() {
        let spec = with(
            hardened(),
            "/securityContext/seccompProfile",
            json!({"type": "Unconfined"}),
        );
        only(
            Level::Baseline,
            spec,
            "seccompProfile_baseline",
            r#"seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")"#,
        );
    }

    #[test]
    fn sysctls_outside_the_safe_list() {
        let spec = with(
            hardened(),
            "/securityContext/sysctls",
            json!([{"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": "kernel.msgmax", "value": "1"}, {"name": "net.core.somaxconn", "value": "1"}]),
        );
        only(
            Level::Baseline,
            spec,
            "sysctls",
            "forbidden sysctls (kernel.msgmax, net.core.somaxconn)",
        );
    }

    #[test]
    fn windows_host_process() {
        let spec = with(
            with(
                hardened(),
                "/securityContext/windowsOptions",
                json!({"hostProcess": true}),
            ),
            "/containers/0/securityContext/windowsOptions",
            json!({"hostProcess": true}),
        );
        only(
            Level::Baseline,
            spec,
            "windowsHostProcess",
            r#"hostProcess (pod and container "c" must not set securityContext.windowsOptions.hostProcess=true)"#,
        );
    }

    #[test]
    fn allow_privilege_escalation() {
        let spec = with(
            hardened(),
            "/containers/0/securityContext/allowPrivilegeEscalation",
            Value::Null,
        );
        only(
            Level::Restricted,
            spec,
            "allowPrivilegeEscalation",
            r#"allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false)"#,
        );
    }

    #[test]
    fn restricted_capabilities() {
        let spec = with(
            hardened(),
            "/containers/0/securityContext/capabilities",
            json!({"add": ["CHOWN"]}),
        );
        only(
            Level::Restricted,
            spec,
            "capabilities_restricted",
            r#"unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]; container "c" must not include "CHOWN" in securityContext.capabilities.add)"#,
        );
    }

    #[test]
    fn restricted_volume_types() {
        let spec = with(
            with(
                hardened(),
                "/volumes/0",
                json!({"name": "h", "hostPath": {"path": "/"}}),
            ),
            "/volumes/1",
            json!({"name": "n", "nfs": {"server": "x", "path": "/"}}),
        );
        only(
            Level::Restricted,
            spec,
            "restrictedVolumes",
            r#"restricted volume types (volumes ["h" "n"] have restricted types)"#,
        );
    }

    #[test]
    fn run_as_non_root() {
        let spec = with(hardened(), "/securityContext/runAsNonRoot", Value::Null);
        only(
            Level::Restricted,
            spec,
            "runAsNonRoot",
            r#"runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true)"#,
        );
        let explicit = with(
            hardened(),
            "/containers/0/securityContext/runAsNonRoot",
            json!(false),
        );
        only(
            Level::Restricted,
            explicit,
            "runAsNonRoot",
            r#"runAsNonRoot != true (container "c" must not set securityContext.runAsNonRoot=false)"#,
        );
    }

    #[test]
    fn run_as_user_zero() {
        let spec = with(
            with(hardened(), "/securityContext/runAsUser", json!(0)),
            "/containers/0/securityContext/runAsUser",
            json!(0),
        );
        only(
            Level::Restricted,
            spec,
            "runAsUser",
            r#"runAsUser=0 (pod and container "c" must not set runAsUser=0)"#,
        );
    }

    #[test]
    fn restricted_seccomp() {
        let spec = with(hardened(), "/securityContext/seccompProfile", Value::Null);
        only(
            Level::Restricted,
            spec,
            "seccompProfile_restricted",
            r#"seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#,
        );
    }

    #[test]
    fn a_plain_privileged_pod_at_restricted_lists_every_check_in_order() {
        let spec = json!({"containers": [
            {"name": "c", "image": "x", "securityContext": {"privileged": true}},
            {"name": "d", "image": "x"}
        ]});
        let violations = evaluate(Level::Restricted, &json!({}), &spec);
        assert_eq!(
            format!(
                "violates PodSecurity \"restricted:latest\": {}",
                forbidden_detail(&violations)
            ),
            r#"violates PodSecurity "restricted:latest": privileged (container "c" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (containers "c", "d" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (containers "c", "d" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or containers "c", "d" must set securityContext.runAsNonRoot=true), seccompProfile (pod or containers "c", "d" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#
        );
    }

    #[test]
    fn init_and_ephemeral_containers_are_checked_first_and_last() {
        let spec = json!({
            "initContainers": [{"name": "i", "securityContext": {"privileged": true}}],
            "containers": [{"name": "c", "securityContext": {"privileged": true}}],
            "ephemeralContainers": [{"name": "e", "securityContext": {"privileged": true}}]
        });
        assert_eq!(
            check(Level::Baseline, spec),
            vec![(
                "privileged",
                r#"privileged (containers "i", "c", "e" must not set securityContext.privileged=true)"#.to_string()
            )]
        );
    }

    #[test]
    fn labels_become_a_policy() {
        let labels = json!({
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "v1.30",
            "pod-security.kubernetes.io/warn": "baseline"
        });
        let (policy, errors) = policy_from_labels(labels.as_object());
        assert!(errors.is_empty());
        assert_eq!(policy.enforce.to_string(), "restricted:v1.30");
        assert_eq!(policy.warn.to_string(), "baseline:latest");
        assert_eq!(policy.audit.to_string(), "privileged:latest");
        assert_eq!(policy_from_labels(None).0, Policy::default());
    }

    #[test]
    fn bad_labels_are_reported_and_fail_closed_for_enforce_only() {
        let labels = json!({
            "pod-security.kubernetes.io/enforce": "strict",
            "pod-security.kubernetes.io/warn": "nope",
            "pod-security.kubernetes.io/audit-version": "v1.01"
        });
        let (policy, errors) = policy_from_labels(labels.as_object());
        assert_eq!(policy.enforce.level, Level::Restricted);
        assert_eq!(policy.warn.level, Level::Privileged);
        let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            vec![
                r#"metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of privileged, baseline, restricted"#,
                r#"metadata.labels[pod-security.kubernetes.io/audit-version]: Invalid value: "v1.01": must be "latest" or "v1.x""#,
                r#"metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: "nope": must be one of privileged, baseline, restricted"#,
            ]
        );
        for ok in ["latest", "v1.0", "v1.32", "v1.100"] {
            assert!(valid_version(ok), "{ok}");
        }
        for bad in ["v2.1", "1.30", "v1.", "v1.x", "v1.-1", ""] {
            assert!(!valid_version(bad), "{bad}");
        }
    }

    #[test]
    fn templates_of_workloads() {
        let deploy = json!({"spec": {"template": {"spec": {"containers": []}}}});
        assert!(workload_template("apps", "deployments", &deploy).is_some());
        assert!(workload_template("", "replicationcontrollers", &deploy).is_some());
        let cron = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {}}}}}});
        assert!(workload_template("batch", "cronjobs", &cron).is_some());
        assert!(workload_template("", "pods", &deploy).is_none());
    }
}
