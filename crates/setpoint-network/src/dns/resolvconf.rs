//! `resolv.conf`: the host's, read (the upstreams the server forwards to, and what pods of
//! `dnsPolicy: Default` get), and a pod's, composed as the kubelet composes it from
//! `dnsPolicy`, `dnsConfig`, `--cluster-dns` and `--cluster-domain`. One rule for every
//! runtime: the CRI runtime passes the result as the sandbox's `DNSConfig`, and whatever writes
//! a pod's `/etc/resolv.conf` itself renders it with [`ResolvConf::render`].

use k8s_openapi::api::core::v1::Pod;

/// The kubelet's bound on nameservers (glibc reads no more than three).
pub const MAX_NAMESERVERS: usize = 3;
/// The kubelet's bound on search domains (with `ExpandedDNSConfig`, GA since 1.28).
pub const MAX_SEARCH_PATHS: usize = 32;
/// The kubelet's bound on the search line's characters (with `ExpandedDNSConfig`).
pub const MAX_SEARCH_CHARS: usize = 2048;
/// The `ndots` the kubelet gives pods resolving through the cluster DNS.
pub const CLUSTER_NDOTS: &str = "ndots:5";
/// The reason of the Warning events about a pod's DNS configuration, as the kubelet's.
pub const REASON_DNS_CONFIG_FORMING: &str = "DNSConfigForming";
/// The reason of the Warning event when a pod asks for the cluster DNS the node has none of.
pub const REASON_MISSING_CLUSTER_DNS: &str = "MissingClusterDNS";

/// The three lines of a `resolv.conf` that matter to a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// `nameserver` lines, in order.
    pub nameservers: Vec<String>,
    /// The `search` line (the last `search` or `domain` line wins, as in glibc).
    pub searches: Vec<String>,
    /// The `options` lines' words, in order.
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Reads a `resolv.conf`: comments (`#`, `;`) and unknown lines are skipped.
    pub fn parse(text: &str) -> ResolvConf {
        let mut conf = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => conf.nameservers.extend(words.next().map(String::from)),
                Some("search") | Some("domain") => {
                    conf.searches = words.map(String::from).collect();
                }
                Some("options") => conf.options.extend(words.map(String::from)),
                _ => {}
            }
        }
        conf
    }

    /// The file's text (empty lines left out).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for server in &self.nameservers {
            out.push_str(&format!("nameserver {server}\n"));
        }
        if !self.searches.is_empty() {
            out.push_str(&format!("search {}\n", self.searches.join(" ")));
        }
        if !self.options.is_empty() {
            out.push_str(&format!("options {}\n", self.options.join(" ")));
        }
        out
    }
}

/// The node's cluster DNS settings: the kubelet's `--cluster-dns` and `--cluster-domain`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterDns {
    /// The nameservers pods of `ClusterFirst` get (empty: none configured).
    pub servers: Vec<String>,
    /// The cluster domain, e.g. `cluster.local`.
    pub domain: String,
}

/// A Warning event the kubelet records on the pod while composing its DNS configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsWarning {
    /// The event's reason.
    pub reason: &'static str,
    /// The event's message, the kubelet's words.
    pub message: String,
}

/// A pod's DNS configuration and what was wrong on the way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDns {
    /// What the pod's `/etc/resolv.conf` says.
    pub config: ResolvConf,
    /// Events for the pod.
    pub warnings: Vec<DnsWarning>,
}

/// The pod's DNS configuration, as the kubelet's `GetPodDNS`: the base from `dnsPolicy`
/// (`ClusterFirst`, the default; `ClusterFirstWithHostNet`; `Default`, the node's
/// `resolv.conf`; `None`), then `dnsConfig` appended (duplicates dropped, its options
/// overriding the base's of the same name), then the kubelet's limits.
pub fn pod_dns(pod: &Pod, cluster: &ClusterDns, host: &ResolvConf) -> PodDns {
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let mut warnings = Vec::new();
    let wants_cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        // A host-network pod of ClusterFirst gets the node's configuration, as upstream.
        "ClusterFirst" => !host_network,
        _ => false,
    };
    let mut config = match policy {
        "None" => ResolvConf::default(),
        _ if wants_cluster && cluster.servers.is_empty() => {
            warnings.push(DnsWarning {
                reason: REASON_MISSING_CLUSTER_DNS,
                message: format!(
                    "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using {:?} policy. Falling back to {:?} policy.",
                    pod_label(pod),
                    policy,
                    "Default"
                ),
            });
            host.clone()
        }
        _ if wants_cluster => {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let domain = cluster.domain.trim_end_matches('.');
            let mut searches = vec![
                format!("{namespace}.svc.{domain}"),
                format!("svc.{domain}"),
                domain.to_string(),
            ];
            searches.extend(host.searches.iter().cloned());
            ResolvConf {
                nameservers: cluster.servers.clone(),
                searches,
                options: vec![CLUSTER_NDOTS.to_string()],
            }
        }
        _ => host.clone(),
    };
    if let Some(extra) = spec.dns_config.as_ref() {
        config
            .nameservers
            .extend(extra.nameservers.iter().flatten().cloned());
        config
            .searches
            .extend(extra.searches.iter().flatten().cloned());
        for option in extra.options.iter().flatten() {
            let Some(name) = option.name.as_deref().filter(|n| !n.is_empty()) else {
                continue;
            };
            let word = match option.value.as_deref() {
                Some(value) => format!("{name}:{value}"),
                None => name.to_string(),
            };
            config.options.retain(|o| option_name(o) != name);
            config.options.push(word);
        }
    }
    dedup(&mut config.nameservers);
    // The kubelet drops a search domain's trailing dot and empty ones before deduplicating.
    config.searches = config
        .searches
        .iter()
        .map(|s| s.trim_end_matches('.').to_string())
        .filter(|s| !s.is_empty())
        .collect();
    dedup(&mut config.searches);
    dedup_options(&mut config.options);
    if config.nameservers.len() > MAX_NAMESERVERS {
        config.nameservers.truncate(MAX_NAMESERVERS);
        warnings.push(DnsWarning {
            reason: REASON_DNS_CONFIG_FORMING,
            message: format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                config.nameservers.join(" ")
            ),
        });
    }
    if fit_searches(&mut config.searches) {
        warnings.push(DnsWarning {
            reason: REASON_DNS_CONFIG_FORMING,
            message: format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                config.searches.join(" ")
            ),
        });
    }
    PodDns { config, warnings }
}

/// Cuts the search list to the kubelet's limits; whether anything was cut.
fn fit_searches(searches: &mut Vec<String>) -> bool {
    let mut cut = false;
    if searches.len() > MAX_SEARCH_PATHS {
        searches.truncate(MAX_SEARCH_PATHS);
        cut = true;
    }
    // The line's length counts the spaces between the domains.
    while !searches.is_empty() && searches.join(" ").len() > MAX_SEARCH_CHARS {
        searches.pop();
        cut = true;
    }
    cut
}

/// `name:value` → `name`.
fn option_name(option: &str) -> &str {
    option.split(':').next().unwrap_or(option)
}

fn dedup(values: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    values.retain(|v| seen.insert(v.clone()));
}

/// Options by name, the last of a name kept in the place of the first.
fn dedup_options(options: &mut Vec<String>) {
    let mut out: Vec<String> = Vec::new();
    for option in options.drain(..) {
        match out
            .iter_mut()
            .find(|o| option_name(o) == option_name(&option))
        {
            Some(existing) => *existing = option,
            None => out.push(option),
        }
    }
    *options = out;
}

/// How the kubelet names a pod in messages: `name_namespace(uid)`.
fn pod_label(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "team", "uid": "u1"},
            "spec": spec
        }))
        .unwrap()
    }

    fn host() -> ResolvConf {
        ResolvConf::parse(
            "# generated\nnameserver 192.168.1.1\nnameserver 192.168.1.2 ; second\nsearch corp.example lab.example\noptions edns0 timeout:2\n",
        )
    }

    fn cluster() -> ClusterDns {
        ClusterDns {
            servers: vec!["10.96.0.10".into()],
            domain: "cluster.local".into(),
        }
    }

    #[test]
    fn parses_and_renders() {
        let h = host();
        assert_eq!(h.nameservers, vec!["192.168.1.1", "192.168.1.2"]);
        assert_eq!(h.searches, vec!["corp.example", "lab.example"]);
        assert_eq!(h.options, vec!["edns0", "timeout:2"]);
        assert_eq!(ResolvConf::parse(&h.render()), h);
        // The last search/domain line wins.
        assert_eq!(
            ResolvConf::parse("search a b\ndomain c\n").searches,
            vec!["c"]
        );
    }

    #[test]
    fn cluster_first_uses_the_cluster_dns_and_search_path() {
        let dns = pod_dns(&pod(json!({"containers": []})), &cluster(), &host());
        assert_eq!(
            dns.config.render(),
            "nameserver 10.96.0.10\nsearch team.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\noptions ndots:5\n"
        );
        assert!(dns.warnings.is_empty());
    }

    #[test]
    fn host_network_cluster_first_gets_the_node_config_unless_with_host_net() {
        let p = pod(json!({"containers": [], "hostNetwork": true}));
        assert_eq!(pod_dns(&p, &cluster(), &host()).config, host());
        let p = pod(json!({"containers": [], "hostNetwork": true,
                           "dnsPolicy": "ClusterFirstWithHostNet"}));
        assert_eq!(
            pod_dns(&p, &cluster(), &host()).config.nameservers,
            vec!["10.96.0.10"]
        );
    }

    #[test]
    fn default_and_none() {
        let p = pod(json!({"containers": [], "dnsPolicy": "Default"}));
        assert_eq!(pod_dns(&p, &cluster(), &host()).config, host());
        let p = pod(json!({"containers": [], "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["x.example."],
                          "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}));
        assert_eq!(
            pod_dns(&p, &cluster(), &host()).config.render(),
            "nameserver 1.1.1.1\nsearch x.example\noptions ndots:2 edns0\n"
        );
    }

    #[test]
    fn dns_config_is_appended_deduplicated_and_overrides_options() {
        let p = pod(json!({"containers": [],
            "dnsConfig": {"nameservers": ["10.96.0.10", "9.9.9.9"],
                          "searches": ["svc.cluster.local", "extra.example"],
                          "options": [{"name": "ndots", "value": "1"}]}}));
        let dns = pod_dns(&p, &cluster(), &host());
        assert_eq!(dns.config.nameservers, vec!["10.96.0.10", "9.9.9.9"]);
        assert_eq!(
            dns.config.searches,
            vec![
                "team.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "lab.example",
                "extra.example"
            ]
        );
        assert_eq!(dns.config.options, vec!["ndots:1"]);
    }

    #[test]
    fn limits_cut_with_the_kubelets_events() {
        let p = pod(json!({"containers": [], "dnsConfig": {
            "nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3"],
            "searches": (0..40).map(|i| format!("d{i}.example")).collect::<Vec<_>>()}}));
        let dns = pod_dns(&p, &cluster(), &host());
        assert_eq!(
            dns.config.nameservers,
            vec!["10.96.0.10", "1.1.1.1", "2.2.2.2"]
        );
        assert_eq!(dns.config.searches.len(), MAX_SEARCH_PATHS);
        assert_eq!(dns.warnings.len(), 2);
        assert_eq!(
            dns.warnings[0].message,
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 10.96.0.10 1.1.1.1 2.2.2.2"
        );
        assert!(dns.warnings[1]
            .message
            .starts_with("Search Line limits were exceeded, some search paths have been omitted, the applied search line is: team.svc.cluster.local "));
        // Long domains are cut by characters.
        let long = "a".repeat(250);
        let p = pod(json!({"containers": [], "dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["1.1.1.1"],
            "searches": (0..10).map(|i| format!("{long}{i}")).collect::<Vec<_>>()}}));
        let dns = pod_dns(&p, &cluster(), &host());
        assert_eq!(dns.config.searches.len(), 8);
        assert!(dns.config.searches.join(" ").len() <= MAX_SEARCH_CHARS);
    }

    #[test]
    fn missing_cluster_dns_falls_back_to_default() {
        let dns = pod_dns(
            &pod(json!({"containers": []})),
            &ClusterDns::default(),
            &host(),
        );
        assert_eq!(dns.config, host());
        assert_eq!(
            dns.warnings,
            vec![DnsWarning {
                reason: REASON_MISSING_CLUSTER_DNS,
                message: "pod: \"p_team(u1)\". kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.".into(),
            }]
        );
    }
}
