//! The agent against a real in-process API server, with the simulated runtime.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use setpoint_node::runtime::PodRuntime;
use setpoint_node::simulated::RUNTIME_VERSION;
use setpoint_node::{
    run_agent, run_simulated, AgentConfig, AgentError, SimulatedConfig, SimulatedRuntime,
    SimulationConfig,
};
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_testing::TestCluster;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `check` until it yields a value, failing the test after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    setpoint_testing::eventually_within(DEADLINE, what, check).await
}

fn sim_config() -> SimulatedConfig {
    SimulatedConfig {
        start_delay: Duration::from_millis(50),
        ready_delay: Duration::from_millis(100),
        ..SimulatedConfig::default()
    }
}

fn agent_config(node: &str) -> AgentConfig {
    let mut c = AgentConfig::local(node);
    c.address = "127.0.0.1".into();
    c.server_listen = "127.0.0.1:0".parse().unwrap();
    c.system_info.container_runtime_version = RUNTIME_VERSION.into();
    c.lease_interval = Duration::from_millis(200);
    c.status_interval = Duration::from_millis(200);
    c.resync_interval = Duration::from_secs(1);
    c
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), AgentError>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

fn start_agent(client: Client, config: AgentConfig, runtime: Arc<dyn PodRuntime>) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run_agent(client, config, runtime, async move {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

fn pod(name: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            termination_grace_period_seconds: Some(5),
            containers: vec![Container {
                name: "app".into(),
                image: Some("nginx:1.27".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

fn node_ready(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

async fn wait_ready(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(&format!("pod {name} Running and Ready"), || async {
        let p = pods.get_opt(name).await.unwrap()?;
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        (running && condition(&p, "Ready").as_deref() == Some("True")).then_some(p)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_registers_renews_and_runs_pods() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let runtime = Arc::new(SimulatedRuntime::new(sim_config()));
    let agent = start_agent(client.clone(), agent_config("node-a"), runtime.clone());

    let nodes: Api<Node> = Api::all(client.clone());
    let node = eventually("node registered Ready", || async {
        let n = nodes.get_opt("node-a").await.unwrap()?;
        (node_ready(&n).as_deref() == Some("True")).then_some(n)
    })
    .await;
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], "node-a");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    let status = node.status.clone().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["pods"].0, "110");
    assert_eq!(
        status.node_info.as_ref().unwrap().container_runtime_version,
        RUNTIME_VERSION
    );
    let types: Vec<_> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    for expected in [
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
        ("Ready", "True"),
    ] {
        assert!(types.contains(&expected), "{expected:?} in {types:?}");
    }

    // The Lease exists, names the node, and its renewTime moves.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let first = eventually("lease created", || async {
        let l = leases.get_opt("node-a").await.unwrap()?;
        l.spec?.renew_time
    })
    .await;
    let lease = leases.get("node-a").await.unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = &lease.metadata.owner_references.unwrap()[0];
    assert_eq!(owner.kind, "Node");
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
    eventually("lease renewed", || async {
        let l = leases.get("node-a").await.unwrap();
        (l.spec?.renew_time? > first).then_some(())
    })
    .await;

    // The lifecycle controller marks the node Unknown: the agent reports Ready again.
    let mut unknown = nodes.get("node-a").await.unwrap();
    for c in unknown
        .status
        .as_mut()
        .unwrap()
        .conditions
        .iter_mut()
        .flatten()
    {
        if c.type_ == "Ready" {
            c.status = "Unknown".into();
            c.reason = Some("NodeStatusUnknown".into());
        }
    }
    nodes
        .replace_status("node-a", &PostParams::default(), &unknown)
        .await
        .unwrap();
    eventually("node Ready again", || async {
        let n = nodes.get("node-a").await.unwrap();
        (node_ready(&n).as_deref() == Some("True")).then_some(())
    })
    .await;

    // A pod bound to the node runs, with its conditions and addresses.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("web", "node-a"))
        .await
        .unwrap();
    let running = wait_ready(&pods, "web").await;
    for c in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(condition(&running, c).as_deref(), Some("True"), "{c}");
    }
    let status = running.status.clone().unwrap();
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    assert!(status.pod_ip.is_some());
    assert!(status.start_time.is_some());
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.ready);
    assert_eq!(cs.image_id, "simulated://nginx:1.27");

    // Status is written only when it changes: several resyncs later (measured on the Lease's
    // renewTime, the agent's own clock) the pod is the same object.
    let settled = pods.get("web").await.unwrap();
    let since = leases
        .get("node-a")
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap();
    eventually("three resync periods", || async {
        let now = leases.get("node-a").await.unwrap().spec?.renew_time?;
        let waited = now.0.duration_since(since.0);
        (waited > k8s_openapi::jiff::SignedDuration::from_secs(3)).then_some(())
    })
    .await;
    let later = pods.get("web").await.unwrap();
    assert_eq!(
        settled.metadata.resource_version, later.metadata.resource_version,
        "status rewritten without a change: {:#?} vs {:#?}",
        settled.status, later.status
    );

    // The start is reported as an Event from the kubelet on this node.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    eventually("a Started event", || async {
        let list = events.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .find(|e| {
                e.reason.as_deref() == Some("Started")
                    && e.involved_object.name.as_deref() == Some("web")
                    && e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("kubelet")
            })
            .map(|_| ())
    })
    .await;

    // A pod bound elsewhere is not this agent's business.
    pods.create(&PostParams::default(), &pod("elsewhere", "node-b"))
        .await
        .unwrap();

    // Deleting: graceful (the API keeps it with a deletionTimestamp), then the agent kills
    // it and removes it for good.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("pod removed", || async {
        pods.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    let uid = created.metadata.uid.unwrap();
    assert!(!runtime.pods().await.iter().any(|p| p.uid == uid));
    let other = pods.get("elsewhere").await.unwrap();
    assert!(other
        .status
        .and_then(|s| s.phase)
        .is_none_or(|p| p == "Pending"));

    // A deleted Node is registered again.
    let old_uid = nodes.get("node-a").await.unwrap().metadata.uid;
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually("node registered again", || async {
        let n = nodes.get_opt("node-a").await.unwrap()?;
        (n.metadata.uid != old_uid && node_ready(&n).as_deref() == Some("True")).then_some(())
    })
    .await;

    agent.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_agent_adopts_its_pods_and_kills_orphans() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let runtime = Arc::new(SimulatedRuntime::new(sim_config()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("keep", "node-r"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("drop", "node-r"))
        .await
        .unwrap();

    let agent = start_agent(client.clone(), agent_config("node-r"), runtime.clone());
    let before = wait_ready(&pods, "keep").await;
    wait_ready(&pods, "drop").await;
    agent.stop().await;

    // While the agent is down, one pod is force-deleted: only the runtime remembers it.
    pods.delete(
        "drop",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(runtime.pods().await.len(), 2);

    let agent = start_agent(client.clone(), agent_config("node-r"), runtime.clone());
    eventually("orphan killed", || async {
        let held = runtime.pods().await;
        (held.len() == 1).then_some(held)
    })
    .await;
    let held = runtime.pods().await;
    assert_eq!(held[0].name, "keep");
    assert_eq!(Some(&held[0].uid), before.metadata.uid.as_ref());
    // The kept pod was not restarted or re-created: same start, no restarts.
    let after = wait_ready(&pods, "keep").await;
    let (b, a) = (before.status.unwrap(), after.status.unwrap());
    assert_eq!(b.start_time, a.start_time);
    assert_eq!(b.pod_ip, a.pod_ip);
    assert_eq!(a.container_statuses.unwrap()[0].restart_count, 0);
    // One Node, not two.
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);

    agent.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_pod_with_restart_never_fails_and_finished_pods_are_not_started() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // A pod that already finished (say, before a node restart) is never started again.
    let done = pods
        .create(&PostParams::default(), &pod("done", "node-f"))
        .await
        .unwrap();
    let mut finished = done.clone();
    finished.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    pods.replace_status("done", &PostParams::default(), &finished)
        .await
        .unwrap();

    let runtime = Arc::new(SimulatedRuntime::new(SimulatedConfig {
        failure_rate: 1.0,
        fail_after: Duration::from_millis(100),
        ..sim_config()
    }));
    let agent = start_agent(client.clone(), agent_config("node-f"), runtime.clone());
    let mut p = pod("once", "node-f");
    p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    pods.create(&PostParams::default(), &p).await.unwrap();
    let failed = eventually("pod Failed", || async {
        let p = pods.get("once").await.unwrap();
        (p.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(p)
    })
    .await;
    let cs = &failed
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    let terminated = cs.state.clone().unwrap().terminated.unwrap();
    assert_eq!(terminated.exit_code, 1);
    assert_eq!(cs.restart_count, 0);
    assert_eq!(condition(&failed, "Ready").as_deref(), Some("False"));

    // By now the agent has synced both pods (it started with both in its cache).
    let held: Vec<String> = runtime.pods().await.into_iter().map(|p| p.name).collect();
    assert_eq!(held, vec!["once".to_string()]);
    let done = pods.get("done").await.unwrap();
    assert_eq!(done.status.unwrap().phase.as_deref(), Some("Succeeded"));
    agent.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_simulated_nodes_register_and_run_their_pods() {
    const N: usize = 20;
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let config = SimulationConfig {
        nodes: N,
        name_prefix: "sim-".into(),
        runtime: sim_config(),
        lease_interval: Duration::from_millis(500),
        status_interval: Duration::from_millis(500),
        resync_interval: Duration::from_secs(2),
        ..SimulationConfig::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let host = tokio::spawn(run_simulated(client.clone(), config, async move {
        let _ = stopped.await;
    }));

    let nodes: Api<Node> = Api::all(client.clone());
    eventually("all nodes Ready", || async {
        let list = nodes.list(&Default::default()).await.unwrap();
        let ready = list
            .items
            .iter()
            .filter(|n| node_ready(n).as_deref() == Some("True"))
            .count();
        (ready == N).then_some(())
    })
    .await;
    let sim = nodes.get("sim-7").await.unwrap();
    assert_eq!(
        sim.metadata.labels.unwrap()["setpoint.dev/simulated"],
        "true"
    );
    assert_eq!(
        sim.status
            .unwrap()
            .node_info
            .unwrap()
            .container_runtime_version,
        RUNTIME_VERSION
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    eventually("a lease per node", || async {
        let l = leases.list(&Default::default()).await.unwrap();
        (l.items.len() == N).then_some(())
    })
    .await;

    // Two pods per node, bound directly (no scheduler here).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..2 * N {
        pods.create(
            &PostParams::default(),
            &pod(&format!("p{i}"), &format!("sim-{}", i % N)),
        )
        .await
        .unwrap();
    }
    let list = eventually("all pods Running and Ready", || async {
        let list = pods.list(&Default::default()).await.unwrap();
        let ready = list
            .items
            .iter()
            .filter(|p| condition(p, "Ready").as_deref() == Some("True"))
            .count();
        (ready == 2 * N).then_some(list)
    })
    .await;
    // Each pod ran on its own node: the hostIP is the shared address, pod IPs are distinct.
    let mut ips: Vec<_> = list
        .items
        .iter()
        .map(|p| p.status.clone().unwrap().pod_ip.unwrap())
        .collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 2 * N);

    let _ = stop.send(());
    host.await.unwrap().unwrap();
    cluster.stop().await;
}

/// A CA and a client certificate it signed, as PEM (CA cert, client cert, client key).
fn client_pki() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name
        .push(DnType::CommonName, "test cluster CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca, &ca_key);
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "apiserver-kubelet-client");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &issuer).unwrap();
    (ca_cert.pem(), client_cert.pem(), client_key.serialize_pem())
}

/// GET `path` from the kubelet endpoint at `port`, with a client certificate or without one.
/// Returns the status and body, or the error that stopped the request.
async fn kubelet_get(
    port: u16,
    path: &str,
    client_cert: Option<(&str, &str)>,
) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider));
    let config = match client_cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header("host", "127.0.0.1")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_endpoint_serves_over_tls_only_to_client_certificates_of_the_ca() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let (ca, cert, key) = client_pki();
    let mut config = agent_config("node-l");
    config.client_ca_pem = Some(ca);
    let agent = start_agent(
        client.clone(),
        config,
        Arc::new(SimulatedRuntime::new(sim_config())),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("web", "node-l"))
        .await
        .unwrap();
    wait_ready(&pods, "web").await;
    // The chosen port is what the Node advertises.
    let nodes: Api<Node> = Api::all(client.clone());
    let port = nodes
        .get("node-l")
        .await
        .unwrap()
        .status
        .unwrap()
        .daemon_endpoints
        .unwrap()
        .kubelet_endpoint
        .unwrap()
        .port;
    let port = u16::try_from(port).unwrap();
    assert_ne!(port, 0);
    let id = Some((cert.as_str(), key.as_str()));

    let (code, body) = kubelet_get(port, "/containerLogs/default/web/app?timestamps=true", id)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("simulated"), "{body}");
    // Path segments arrive percent-encoded from the API server's proxy.
    let (code, body) = kubelet_get(port, "/containerLogs/default/w%65b/app?follow=true", id)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("no process runs"), "{body}");
    let (code, body) = kubelet_get(port, "/containerLogs/default/web/app?limitBytes=9", id)
        .await
        .unwrap();
    assert_eq!((code, body.len()), (200, 9));
    let (code, _) = kubelet_get(port, "/containerLogs/default/web/nope", id)
        .await
        .unwrap();
    assert_eq!(code, 404);
    let (code, _) = kubelet_get(port, "/containerLogs/default/missing/app", id)
        .await
        .unwrap();
    assert_eq!(code, 404);
    let (code, _) = kubelet_get(port, "/containerLogs/default/web/app?tailLines=-3", id)
        .await
        .unwrap();
    assert_eq!(code, 400);
    let (code, _) = kubelet_get(port, "/containerLogs/default/web/app?previous=true", id)
        .await
        .unwrap();
    assert_eq!(code, 400);

    // No client certificate: the handshake is refused, nothing is served.
    let anonymous = kubelet_get(port, "/containerLogs/default/web/app", None).await;
    assert!(
        anonymous.is_err(),
        "served without a client cert: {anonymous:?}"
    );
    // A certificate from another CA is refused too.
    let (_, other_cert, other_key) = client_pki();
    let stranger = kubelet_get(
        port,
        "/containerLogs/default/web/app",
        Some((other_cert.as_str(), other_key.as_str())),
    )
    .await;
    assert!(stranger.is_err(), "served to a foreign cert: {stranger:?}");

    agent.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_the_agents_series_only_to_client_certificates_of_the_ca() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let (ca, cert, key) = client_pki();
    let mut config = agent_config("node-m");
    config.client_ca_pem = Some(ca);
    let agent = start_agent(
        client.clone(),
        config,
        Arc::new(SimulatedRuntime::new(sim_config())),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("web", "node-m"))
        .await
        .unwrap();
    wait_ready(&pods, "web").await;
    let nodes: Api<Node> = Api::all(client.clone());
    let port = nodes
        .get("node-m")
        .await
        .unwrap()
        .status
        .and_then(|s| s.daemon_endpoints?.kubelet_endpoint)
        .map(|e| u16::try_from(e.port).unwrap())
        .unwrap();
    let id = Some((cert.as_str(), key.as_str()));

    // The agent's cache may see the pod's Running status a moment after the API does.
    let metrics = eventually(
        "the node's /metrics counts its running container",
        || async {
            let (code, body) = kubelet_get(port, "/metrics", id).await.unwrap();
            assert_eq!(code, 200, "{body}");
            body.contains("kubelet_running_containers{container_state=\"running\"} 1\n")
                .then_some(body)
        },
    )
    .await;
    assert!(metrics.contains("kubelet_running_pods 1\n"), "{metrics}");
    assert!(
        metrics.contains("kubelet_running_containers{container_state=\"exited\"} 0\n"),
        "{metrics}"
    );
    // The pod workers' queue, and the agent's own API requests.
    assert!(
        metrics.contains("workqueue_adds_total{name=\"pods-node-m\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rest_client_request_duration_seconds_count{"),
        "{metrics}"
    );

    // Deleted: the gauges follow.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the node's /metrics counts no pod", || async {
        let (_, body) = kubelet_get(port, "/metrics", id).await.unwrap();
        body.contains("kubelet_running_pods 0\n").then_some(())
    })
    .await;

    // No client certificate, or one of another CA: refused at the handshake.
    let anonymous = kubelet_get(port, "/metrics", None).await;
    assert!(
        anonymous.is_err(),
        "served without a client cert: {anonymous:?}"
    );
    let (_, other_cert, other_key) = client_pki();
    let stranger = kubelet_get(
        port,
        "/metrics",
        Some((other_cert.as_str(), other_key.as_str())),
    )
    .await;
    assert!(stranger.is_err(), "served to a foreign cert: {stranger:?}");

    agent.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_stops_while_the_api_is_unreachable() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    cluster.stop().await;
    let agent = start_agent(
        client,
        agent_config("node-x"),
        Arc::new(SimulatedRuntime::new(sim_config())),
    );
    tokio::time::timeout(DEADLINE, agent.stop())
        .await
        .expect("the agent did not stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_real_processes_and_serves_their_logs() {
    use setpoint_node::process::ipam::IpRange;
    use setpoint_node::process::{ProcessRuntime, ProcessRuntimeOptions};
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let options = ProcessRuntimeOptions {
        // Addresses no other test uses.
        pod_ips: Some(IpRange {
            first: std::net::Ipv4Addr::new(127, 1, 250, 1),
            count: 10,
        }),
        poll_interval: Duration::from_millis(50),
        ..ProcessRuntimeOptions::default()
    };
    let runtime = Arc::new(ProcessRuntime::with_options(dir.path(), options).unwrap());
    let (ca, cert, key) = client_pki();
    let mut config = agent_config("node-p");
    config.system_info.container_runtime_version = "setpoint-process://0.1".into();
    config.client_ca_pem = Some(ca);
    let agent = start_agent(client.clone(), config, runtime.clone());

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut p = pod("shell", "node-p");
    p.spec.as_mut().unwrap().containers[0].command = Some(vec![
        "sh".into(),
        "-c".into(),
        "echo hello from a real process; exec sleep 300".into(),
    ]);
    pods.create(&PostParams::default(), &p).await.unwrap();
    let running = wait_ready(&pods, "shell").await;
    assert_eq!(
        running
            .status
            .unwrap()
            .pod_ip
            .as_deref()
            .map(|ip| ip.starts_with("127.1.250.")),
        Some(true)
    );

    let nodes: Api<Node> = Api::all(client.clone());
    let endpoint = nodes
        .get("node-p")
        .await
        .unwrap()
        .status
        .unwrap()
        .daemon_endpoints;
    let port = u16::try_from(endpoint.unwrap().kubelet_endpoint.unwrap().port).unwrap();
    let id = Some((cert.as_str(), key.as_str()));
    let body = eventually("the process's output in its log", || async {
        let (code, body) = kubelet_get(port, "/containerLogs/default/shell/app", id)
            .await
            .ok()?;
        (code == 200 && body.contains("hello from a real process")).then_some(body)
    })
    .await;
    assert!(!body.contains("simulated"));

    // Deleting stops the process (sleep exits on SIGTERM) and removes the pod.
    pods.delete("shell", &DeleteParams::default())
        .await
        .unwrap();
    eventually("pod removed", || async {
        pods.get_opt("shell").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(runtime.pods().await.is_empty());
    agent.stop().await;
    cluster.stop().await;
}
