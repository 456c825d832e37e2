use super::*;
use serde_json::{json, Value};

fn pod(spec: Value) -> Pod {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c"}]);
    }
    serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"}, "spec": spec}))
        .unwrap()
}

fn requesting(cpu: &str, memory: &str) -> Pod {
    pod(
        json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}),
    )
}

/// A Ready node with 4 CPUs, 8Gi and room for 110 pods.
fn node_json(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

fn info(v: Value) -> NodeInfo {
    let node: Node = serde_json::from_value(v).unwrap();
    NodeInfo::new(node.metadata.name.as_deref().unwrap(), NodeFacts::of(&node))
}

fn node(name: &str) -> NodeInfo {
    info(node_json(name))
}

fn with(mut v: Value, f: impl FnOnce(&mut Value)) -> NodeInfo {
    f(&mut v);
    info(v)
}

fn reasons(p: &Pod, n: &NodeInfo) -> Vec<Reason> {
    filter(&PodFacts::of(p), n).err().unwrap_or_default()
}

fn toleration(v: Value) -> Toleration {
    serde_json::from_value(v).unwrap()
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(String::from),
        effect: effect.into(),
        time_added: None,
    }
}

#[test]
fn a_ready_node_with_room_fits() {
    assert_eq!(reasons(&requesting("1", "1Gi"), &node("a")), vec![]);
}

#[test]
fn not_ready_and_cordoned_nodes_are_rejected() {
    let p = requesting("1", "1Gi");
    let not_ready = with(node_json("a"), |v| {
        v["status"]["conditions"][0]["status"] = json!("False")
    });
    assert_eq!(reasons(&p, &not_ready), vec![Reason::NotReady]);
    let no_conditions = with(node_json("a"), |v| {
        v["status"].as_object_mut().unwrap().remove("conditions");
    });
    assert_eq!(reasons(&p, &no_conditions), vec![Reason::NotReady]);
    let unknown = with(node_json("a"), |v| {
        v["status"]["conditions"][0]["status"] = json!("Unknown")
    });
    assert_eq!(reasons(&p, &unknown), vec![Reason::NotReady]);
    // Pods that tolerate the matching taint (DaemonSet pods do) still go there.
    let tolerates_not_ready = pod(json!({"tolerations": [
        {"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoSchedule"}
    ]}));
    assert_eq!(reasons(&tolerates_not_ready, &not_ready), vec![]);
    assert_eq!(
        reasons(&tolerates_not_ready, &unknown),
        vec![Reason::NotReady]
    );
    let tolerates_unreachable = pod(json!({"tolerations": [
        {"key": UNREACHABLE_TAINT, "operator": "Exists"}
    ]}));
    assert_eq!(reasons(&tolerates_unreachable, &unknown), vec![]);
    assert_eq!(
        reasons(&tolerates_unreachable, &not_ready),
        vec![Reason::NotReady]
    );
    let cordoned = with(node_json("a"), |v| v["spec"]["unschedulable"] = json!(true));
    assert_eq!(reasons(&p, &cordoned), vec![Reason::Unschedulable]);
    // Tolerating the unschedulable taint lets a pod (e.g. a DaemonSet's) onto it.
    let tolerant = pod(json!({"tolerations": [
        {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
    ]}));
    assert_eq!(reasons(&tolerant, &cordoned), vec![]);
}

#[test]
fn resources_must_fit_what_is_left() {
    let mut n = node("a");
    let p = requesting("3", "6Gi");
    assert_eq!(reasons(&p, &n), vec![]);
    n.add(&PodRequests::of(&requesting("1500m", "1Gi")));
    assert_eq!(reasons(&p, &n), vec![Reason::InsufficientCpu]);
    n.add(&PodRequests::of(&requesting("0", "2Gi")));
    assert_eq!(
        reasons(&p, &n),
        vec![Reason::InsufficientCpu, Reason::InsufficientMemory]
    );
    // Exactly full still fits.
    let exact = requesting("2500m", "5Gi");
    assert_eq!(reasons(&exact, &n), vec![]);
    let over = requesting("2501m", "5Gi");
    assert_eq!(reasons(&over, &n), vec![Reason::InsufficientCpu]);
}

#[test]
fn best_effort_pods_need_only_a_pod_slot() {
    let mut n = with(node_json("a"), |v| {
        v["status"]["allocatable"] = json!({"cpu": "0", "memory": "0", "pods": "2"})
    });
    let p = pod(json!({}));
    assert_eq!(reasons(&p, &n), vec![]);
    n.add(&PodRequests::of(&p));
    n.add(&PodRequests::of(&p));
    assert_eq!(reasons(&p, &n), vec![Reason::TooManyPods]);
    n.remove(&PodRequests::of(&p));
    assert_eq!(reasons(&p, &n), vec![]);
}

#[test]
fn node_selector_must_match_every_label() {
    let n = with(node_json("a"), |v| {
        v["metadata"]["labels"] = json!({"disk": "ssd", "zone": "z1"})
    });
    let ok = pod(json!({"nodeSelector": {"disk": "ssd"}}));
    let both = pod(json!({"nodeSelector": {"disk": "ssd", "zone": "z1"}}));
    let wrong = pod(json!({"nodeSelector": {"disk": "ssd", "zone": "z2"}}));
    let missing = pod(json!({"nodeSelector": {"gpu": "yes"}}));
    assert_eq!(reasons(&ok, &n), vec![]);
    assert_eq!(reasons(&both, &n), vec![]);
    assert_eq!(reasons(&wrong, &n), vec![Reason::NodeAffinity]);
    assert_eq!(reasons(&missing, &n), vec![Reason::NodeAffinity]);
}

fn affinity(terms: Value) -> Pod {
    pod(json!({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
    }}}))
}

fn expr(key: &str, op: &str, values: &[&str]) -> Value {
    json!({"key": key, "operator": op, "values": values})
}

fn fits_affinity(terms: Value, labels: Value, name: &str) -> bool {
    let n = with(node_json(name), |v| v["metadata"]["labels"] = labels);
    reasons(&affinity(terms), &n).is_empty()
}

#[test]
fn affinity_operators() {
    let labels = json!({"zone": "z1", "cores": "16"});
    let m = |e: Value| fits_affinity(json!([{"matchExpressions": [e]}]), labels.clone(), "n1");
    assert!(m(expr("zone", "In", &["z1", "z2"])));
    assert!(!m(expr("zone", "In", &["z2"])));
    assert!(!m(expr("rack", "In", &["r1"])));
    assert!(m(expr("zone", "NotIn", &["z2"])));
    assert!(!m(expr("zone", "NotIn", &["z1"])));
    assert!(
        m(expr("rack", "NotIn", &["r1"])),
        "NotIn matches an absent label"
    );
    assert!(m(json!({"key": "zone", "operator": "Exists"})));
    assert!(!m(json!({"key": "rack", "operator": "Exists"})));
    assert!(m(json!({"key": "rack", "operator": "DoesNotExist"})));
    assert!(!m(json!({"key": "zone", "operator": "DoesNotExist"})));
    assert!(m(expr("cores", "Gt", &["8"])));
    assert!(!m(expr("cores", "Gt", &["16"])));
    assert!(m(expr("cores", "Lt", &["17"])));
    assert!(!m(expr("cores", "Lt", &["16"])));
    assert!(
        !m(expr("zone", "Gt", &["1"])),
        "a non-integer label never compares"
    );
    assert!(
        !m(expr("cores", "Gt", &["1", "2"])),
        "Gt takes exactly one value"
    );
    assert!(!m(expr("rack", "Lt", &["100"])), "Gt/Lt need the label");
    assert!(
        !m(expr("zone", "Near", &["z1"])),
        "unknown operators match nothing"
    );
}

#[test]
fn affinity_terms_are_ored_and_expressions_anded() {
    let labels = json!({"zone": "z1", "disk": "hdd"});
    let and =
        json!([{"matchExpressions": [expr("zone", "In", &["z1"]), expr("disk", "In", &["ssd"])]}]);
    assert!(!fits_affinity(and, labels.clone(), "n1"));
    let or = json!([
        {"matchExpressions": [expr("disk", "In", &["ssd"])]},
        {"matchExpressions": [expr("zone", "In", &["z1"])]},
    ]);
    assert!(fits_affinity(or, labels.clone(), "n1"));
    // An empty term, or no terms, selects nothing.
    assert!(!fits_affinity(json!([{}]), labels.clone(), "n1"));
    assert!(!fits_affinity(json!([]), labels.clone(), "n1"));
}

#[test]
fn affinity_match_fields_on_the_node_name() {
    let f = |e: Value, name: &str| fits_affinity(json!([{"matchFields": [e]}]), json!({}), name);
    assert!(f(expr("metadata.name", "In", &["n1", "n2"]), "n1"));
    assert!(!f(expr("metadata.name", "In", &["n2"]), "n1"));
    assert!(f(expr("metadata.name", "NotIn", &["n2"]), "n1"));
    assert!(!f(expr("metadata.name", "NotIn", &["n1"]), "n1"));
    assert!(
        !f(expr("metadata.uid", "In", &["n1"]), "n1"),
        "only metadata.name"
    );
    assert!(!f(
        json!({"key": "metadata.name", "operator": "Exists"}),
        "n1"
    ));
    // Fields and expressions of one term are ANDed.
    let both = json!([{
        "matchFields": [expr("metadata.name", "In", &["n1"])],
        "matchExpressions": [expr("zone", "In", &["z1"])],
    }]);
    assert!(fits_affinity(both.clone(), json!({"zone": "z1"}), "n1"));
    assert!(!fits_affinity(both, json!({"zone": "z2"}), "n1"));
}

#[test]
fn selector_and_affinity_must_both_match() {
    let n = with(node_json("a"), |v| {
        v["metadata"]["labels"] = json!({"zone": "z1", "disk": "ssd"})
    });
    let mut p = affinity(json!([{"matchExpressions": [expr("zone", "In", &["z1"])]}]));
    p.spec.as_mut().unwrap().node_selector = Some([("disk".to_string(), "hdd".to_string())].into());
    assert_eq!(reasons(&p, &n), vec![Reason::NodeAffinity]);
}

#[test]
fn toleration_rules() {
    let t = taint("dedicated", Some("gpu"), "NoSchedule");
    let tol = |v: Value| tolerates(&toleration(v), &t);
    assert!(tol(
        json!({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"})
    ));
    assert!(
        tol(json!({"key": "dedicated", "value": "gpu"})),
        "Equal is the default, any effect"
    );
    assert!(!tol(json!({"key": "dedicated", "value": "cpu"})));
    assert!(
        !tol(json!({"key": "dedicated", "operator": "Equal"})),
        "values differ"
    );
    assert!(tol(json!({"key": "dedicated", "operator": "Exists"})));
    assert!(!tol(json!({"key": "other", "operator": "Exists"})));
    assert!(!tol(
        json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"})
    ));
    assert!(
        tol(json!({"operator": "Exists"})),
        "empty key with Exists tolerates everything"
    );
    assert!(tol(json!({"operator": "Exists", "effect": "NoSchedule"})));
    assert!(!tol(
        json!({"operator": "Exists", "effect": "PreferNoSchedule"})
    ));
    assert!(!tol(
        json!({"key": "dedicated", "operator": "Lte", "value": "gpu"})
    ));
    let no_value = taint("flag", None, "NoExecute");
    assert!(tolerates(
        &toleration(json!({"key": "flag", "operator": "Equal", "value": ""})),
        &no_value
    ));
    assert!(tolerates(&toleration(json!({"key": "flag"})), &no_value));
}

#[test]
fn taints_filter_unless_tolerated() {
    let n = with(node_json("a"), |v| {
        v["spec"]["taints"] = json!([
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "evict", "effect": "NoExecute"},
        ])
    });
    assert_eq!(
        reasons(&pod(json!({})), &n),
        vec![Reason::UntoleratedTaint {
            key: "dedicated".into(),
            value: "gpu".into()
        }]
    );
    let one = pod(
        json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}),
    );
    assert_eq!(
        reasons(&one, &n),
        vec![Reason::UntoleratedTaint {
            key: "evict".into(),
            value: "".into()
        }]
    );
    let both = pod(json!({"tolerations": [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "evict", "operator": "Exists", "effect": "NoExecute"},
    ]}));
    assert_eq!(reasons(&both, &n), vec![], "PreferNoSchedule never filters");
    let all = pod(json!({"tolerations": [{"operator": "Exists"}]}));
    assert_eq!(reasons(&all, &n), vec![]);
}

#[test]
fn filters_stop_at_the_first_failure_in_kubernetes_order() {
    let n = with(node_json("a"), |v| {
        v["spec"]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
        v["metadata"]["labels"] = json!({});
    });
    let p = pod(json!({
        "nodeSelector": {"x": "y"},
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "100"}}}],
    }));
    assert_eq!(
        reasons(&p, &n),
        vec![Reason::UntoleratedTaint {
            key: "k".into(),
            value: "".into()
        }]
    );
}

#[test]
fn least_allocated_prefers_emptier_nodes() {
    let p = requesting("1", "2Gi");
    let mut busy = node("busy");
    busy.add(&PodRequests::of(&requesting("2", "4Gi")));
    let empty = node("empty");
    let pf = PodFacts::of(&p);
    // empty: cpu (4-1)/4 = 75, memory (8-2)/8 = 75 → 75; busy: 25 and 25 → 25.
    assert_eq!(least_allocated_score(&pf, &empty), 75);
    assert_eq!(least_allocated_score(&pf, &busy), 25);
    // Both balanced (cpu fraction = memory fraction): 100 each.
    assert_eq!(balanced_allocation_score(&pf, &empty), 100);
    assert_eq!(balanced_allocation_score(&pf, &busy), 100);
    let nodes = vec![busy, empty];
    let placed = schedule(&pf, &nodes, 0, 2, &mut Rng::new(1)).unwrap();
    assert_eq!(nodes[placed.node].name, "empty");
}

#[test]
fn least_allocated_counts_unset_requests_at_defaults() {
    let best_effort = pod(json!({}));
    let n = node("a");
    // cpu: (4000 - 100) * 100 / 4000 = 97; memory: (8Gi - 200Mi) / 8Gi → 97.
    assert_eq!(least_allocated_score(&PodFacts::of(&best_effort), &n), 97);
    assert_eq!(least_requested(5, 4), 0, "over capacity scores zero");
    assert_eq!(least_requested(0, 0), 0);
}

#[test]
fn balanced_allocation_prefers_even_use() {
    let mut cpu_heavy = node("cpu-heavy");
    cpu_heavy.add(&PodRequests::of(&requesting("2", "0")));
    let even = node("even");
    let p = requesting("1", "2Gi");
    let pf = PodFacts::of(&p);
    // cpu-heavy after: cpu 3/4 = .75, memory 2/8 = .25 → std .25 → 75.
    assert_eq!(balanced_allocation_score(&pf, &cpu_heavy), 75);
    assert_eq!(balanced_allocation_score(&pf, &even), 100);
    // A memory-heavy pod balances the cpu-heavy node.
    let mem = requesting("0", "4Gi");
    let mf = PodFacts::of(&mem);
    assert_eq!(balanced_allocation_score(&mf, &cpu_heavy), 100);
    assert_eq!(balanced_allocation_score(&mf, &even), 75);
    // Fractions are capped at 1.
    let huge = requesting("8", "0");
    assert_eq!(balanced_allocation_score(&PodFacts::of(&huge), &even), 50);
}

#[test]
fn the_placement_keeps_the_best_scores_chosen_first() {
    let p = requesting("1", "2Gi");
    let pf = PodFacts::of(&p);
    let mut busy = node("busy");
    busy.add(&PodRequests::of(&requesting("2", "4Gi")));
    let mut half = node("half");
    half.add(&PodRequests::of(&requesting("1", "2Gi")));
    let nodes = vec![busy, node("empty"), half, node("empty2"), node("empty3")];
    let placed = schedule(&pf, &nodes, 0, 5, &mut Rng::new(3)).unwrap();
    assert_eq!(placed.scores.len(), TOP_SCORES);
    // The chosen node leads; the rest follow by score, the busy node not among them.
    assert_eq!(placed.scores[0].0, placed.node);
    let names: Vec<&str> = placed
        .scores
        .iter()
        .map(|&(i, _)| nodes[i].name.as_str())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("empty")), "{names:?}");
    assert!(placed.scores.windows(2).all(|w| w[0].1 >= w[1].1));
    // One feasible node is not scored.
    let one = schedule(&pf, &nodes[..1], 0, 1, &mut Rng::new(3)).unwrap();
    assert!(one.scores.is_empty());
}

#[test]
fn ties_are_broken_at_random_and_spread() {
    let nodes: Vec<NodeInfo> = (0..4).map(|i| node(&format!("n{i}"))).collect();
    let p = requesting("100m", "100Mi");
    let pf = PodFacts::of(&p);
    let mut rng = Rng::new(7);
    let mut seen = [0usize; 4];
    for _ in 0..400 {
        seen[schedule(&pf, &nodes, 0, 4, &mut rng).unwrap().node] += 1;
    }
    assert!(
        seen.iter().all(|&n| n > 50),
        "uneven tie-breaking: {seen:?}"
    );
}

#[test]
fn search_starts_at_start_and_stops_after_enough_feasible_nodes() {
    let nodes: Vec<NodeInfo> = (0..10).map(|i| node(&format!("n{i}"))).collect();
    let p = requesting("1", "1Gi");
    let pf = PodFacts::of(&p);
    let placed = schedule(&pf, &nodes, 8, 3, &mut Rng::new(1)).unwrap();
    assert_eq!(placed.evaluated, 3);
    assert_eq!(placed.feasible, 3);
    assert!([8, 9, 0].contains(&placed.node), "{placed:?}");
}

#[test]
fn infeasible_nodes_do_not_count_towards_the_sample() {
    let mut nodes: Vec<NodeInfo> = (0..6).map(|i| node(&format!("n{i}"))).collect();
    for n in &mut nodes[..5] {
        n.facts.unschedulable = true;
    }
    let p = requesting("1", "1Gi");
    let pf = PodFacts::of(&p);
    let placed = schedule(&pf, &nodes, 0, 2, &mut Rng::new(1)).unwrap();
    assert_eq!(placed.node, 5);
    assert_eq!(placed.evaluated, 6);
    assert_eq!(placed.feasible, 1);
}

#[test]
fn diagnosis_counts_reasons_per_node() {
    let mut nodes = vec![node("a"), node("b"), node("c")];
    nodes[0].facts.labels.insert("disk".into(), "ssd".into());
    nodes[0].add(&PodRequests::of(&requesting("4", "8Gi")));
    nodes[2].facts.not_ready = Some(NOT_READY_TAINT);
    let p = pod(json!({
        "nodeSelector": {"disk": "ssd"},
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
    }));
    let d = schedule(&PodFacts::of(&p), &nodes, 0, 3, &mut Rng::new(1)).unwrap_err();
    assert_eq!(d.nodes, 3);
    assert_eq!(
        d.message(),
        "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, \
         1 node(s) didn't match Pod's node affinity/selector, 1 node(s) were not ready."
    );
    let none = schedule(&PodFacts::of(&p), &[], 0, 0, &mut Rng::new(1)).unwrap_err();
    assert_eq!(none.message(), "no nodes available to schedule pods");
}

#[test]
fn taint_reasons_name_the_taint() {
    let nodes = vec![
        with(
            node_json("a"),
            |v| {
                v["spec"]["taints"] =
                    json!([{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
            },
        ),
        with(
            node_json("b"),
            |v| {
                v["spec"]["taints"] =
                    json!([{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
            },
        ),
    ];
    let d = schedule(
        &PodFacts::of(&pod(json!({}))),
        &nodes,
        0,
        2,
        &mut Rng::new(1),
    )
    .unwrap_err();
    assert_eq!(
        d.message(),
        "0/2 nodes are available: 2 node(s) had untolerated taint {gpu: true}."
    );
}

#[test]
fn adaptive_sampling_like_kubernetes() {
    assert_eq!(nodes_to_find(0, 0), 0);
    assert_eq!(nodes_to_find(99, 0), 99);
    assert_eq!(nodes_to_find(100, 0), 100);
    assert_eq!(nodes_to_find(1000, 0), 420); // 50 - 8 = 42%
    assert_eq!(nodes_to_find(5000, 0), 500); // 50 - 40 = 10%
    assert_eq!(nodes_to_find(6000, 0), 300); // floor of 5%
    assert_eq!(nodes_to_find(150, 0), 100); // at least 100
    assert_eq!(nodes_to_find(1000, 10), 100);
    assert_eq!(nodes_to_find(1000, 30), 300);
    assert_eq!(nodes_to_find(1000, 100), 1000);
}

#[test]
fn node_facts_ignore_soft_taints_and_read_readiness() {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": "a", "labels": {"x": "1"}},
        "spec": {"unschedulable": true, "taints": [
            {"key": "a", "effect": "PreferNoSchedule"},
            {"key": "b", "effect": "NoSchedule"},
        ]},
        "status": {"conditions": [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": "True"},
        ], "allocatable": {"cpu": "2", "memory": "1Gi", "pods": "10"}},
    }))
    .unwrap();
    let f = NodeFacts::of(&n);
    assert!(f.not_ready.is_none() && f.unschedulable);
    assert_eq!(f.taints.len(), 1);
    assert_eq!(f.taints[0].key, "b");
    assert_eq!(f.allocatable.pods, 10);
    assert_eq!(f.labels.get("x").map(String::as_str), Some("1"));
}

#[test]
fn preferred_affinity_attracts() {
    let plain = node("plain");
    let ssd = with(node_json("ssd"), |v| {
        v["metadata"]["labels"] = json!({"disk": "ssd", "zone": "z1"})
    });
    let zone = with(node_json("zone"), |v| {
        v["metadata"]["labels"] = json!({"zone": "z1"})
    });
    let p = pod(
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 80, "preference": {"matchExpressions": [expr("disk", "In", &["ssd"])]}},
            {"weight": 20, "preference": {"matchExpressions": [expr("zone", "In", &["z1"])]}},
            {"weight": 50, "preference": {}},
        ]}}}),
    );
    let pf = PodFacts::of(&p);
    assert_eq!(preferred_affinity_score(&pf, &plain), 0);
    assert_eq!(preferred_affinity_score(&pf, &ssd), 100);
    assert_eq!(preferred_affinity_score(&pf, &zone), 20);
    let nodes = vec![plain, zone, ssd];
    let s = scores(&pf, &nodes, &[0, 1, 2]);
    // Equal resource scores; affinity normalized to 0, 20, 100, times weight 2; no soft
    // taints anywhere: 100 × 3 for all.
    let base = score(&pf, &nodes[0]);
    assert_eq!(s, vec![base + 300, base + 40 + 300, base + 200 + 300]);
    let placed = schedule(&pf, &nodes, 0, 3, &mut Rng::new(1)).unwrap();
    assert_eq!(nodes[placed.node].name, "ssd");
}

#[test]
fn prefer_no_schedule_taints_repel_unless_tolerated() {
    let soft = |name: &str, n: usize| {
        with(node_json(name), |v| {
            v["spec"]["taints"] = json!((0..n)
                .map(|i| json!({"key": format!("soft-{i}"), "effect": "PreferNoSchedule"}))
                .collect::<Vec<_>>())
        })
    };
    let nodes = vec![soft("two", 2), soft("one", 1), soft("none", 0)];
    let p = pod(json!({}));
    let pf = PodFacts::of(&p);
    assert_eq!(intolerable_soft_taints(&pf, &nodes[0]), 2);
    let base = score(&pf, &nodes[0]);
    assert_eq!(
        scores(&pf, &nodes, &[0, 1, 2]),
        vec![base, base + 150, base + 300]
    );
    let placed = schedule(&pf, &nodes, 0, 3, &mut Rng::new(1)).unwrap();
    assert_eq!(nodes[placed.node].name, "none");
    // Tolerations for PreferNoSchedule (or for every effect) count; NoSchedule ones do not.
    let tolerant = pod(json!({"tolerations": [
        {"key": "soft-0", "operator": "Exists", "effect": "PreferNoSchedule"},
        {"key": "soft-1", "operator": "Exists"},
    ]}));
    assert_eq!(
        intolerable_soft_taints(&PodFacts::of(&tolerant), &nodes[0]),
        0
    );
    let wrong_effect = pod(json!({"tolerations": [
        {"key": "soft-0", "operator": "Exists", "effect": "NoSchedule"},
    ]}));
    assert_eq!(
        intolerable_soft_taints(&PodFacts::of(&wrong_effect), &nodes[1]),
        1
    );
}
