//! A node that runs containers while keeping the pods it already runs as local processes.
//!
//! [`RoutedRuntime`] puts a container runtime (CRI) and a process runtime behind one
//! [`PodRuntime`]. A pod stays in the runtime that holds it: the choice is remembered per uid,
//! and a pod this agent has not seen yet is looked for in both before anything is started.
//! That is what lets a node whose runtime changes from processes to containers (containers
//! became the default where containerd is installed) keep the pods it was running as
//! processes, instead of starting each a second time in a container and leaving the
//! processes behind with nobody to stop them.
//!
//! A pod neither runtime holds goes to the container runtime when any of its containers
//! (init, app or ephemeral) names an image, and to the process runtime otherwise: a container
//! with only a `command` runs as a host process, as on a process node, since CRI would have no
//! image to run. (The API requires every container to name an image, as upstream does, so
//! such pods only come from stores written without that validation.)
//!
//! Pod addresses cannot collide: the process runtime takes them from its block of
//! 127.0.0.0/8 and the CRI runtime's network from its own pod subnet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use crate::runtime::{
    Duplex, ExecRequest, LogOptions, LogStream, NodeContext, PodRuntime, RuntimeError,
    RuntimeEvent, RuntimePod, RuntimeStatus, StreamIo,
};

/// Which of the two runtimes holds a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The container runtime.
    Containers,
    /// The process runtime.
    Processes,
}

/// Where a pod not yet held by either runtime goes: to the container runtime when any of
/// its containers names an image (an empty `image` names none).
pub fn route_for(pod: &Pod) -> Route {
    let Some(spec) = &pod.spec else {
        return Route::Processes;
    };
    let has_image = |image: &Option<String>| image.as_deref().is_some_and(|i| !i.trim().is_empty());
    let any = spec.containers.iter().any(|c| has_image(&c.image))
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| has_image(&c.image))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| has_image(&c.image));
    if any {
        Route::Containers
    } else {
        Route::Processes
    }
}

/// Two runtimes behind one: see the module documentation.
pub struct RoutedRuntime {
    containers: Arc<dyn PodRuntime>,
    processes: Arc<dyn PodRuntime>,
    /// Where each pod seen so far runs, by uid; forgotten when the pod is killed.
    routes: Mutex<HashMap<String, Route>>,
}

impl RoutedRuntime {
    /// Routes pods with images to `containers` and pods without to `processes`.
    pub fn new(containers: Arc<dyn PodRuntime>, processes: Arc<dyn PodRuntime>) -> Self {
        RoutedRuntime {
            containers,
            processes,
            routes: Mutex::new(HashMap::new()),
        }
    }

    fn runtime(&self, route: Route) -> &Arc<dyn PodRuntime> {
        match route {
            Route::Containers => &self.containers,
            Route::Processes => &self.processes,
        }
    }

    /// The runtime that holds the pod, if either does (remembered, else asked).
    async fn holder(&self, uid: &str, namespace: &str, name: &str) -> Option<Route> {
        if let Some(route) = self.routes.lock().unwrap().get(uid) {
            return Some(*route);
        }
        for route in [Route::Processes, Route::Containers] {
            let held = self.runtime(route).pods_named(namespace, name).await;
            if held.iter().any(|p| p.uid == uid) {
                self.routes.lock().unwrap().insert(uid.to_string(), route);
                return Some(route);
            }
        }
        None
    }

    /// The runtime a request about a held pod goes to.
    async fn for_pod(&self, pod: &RuntimePod) -> Result<&Arc<dyn PodRuntime>, RuntimeError> {
        match self.holder(&pod.uid, &pod.namespace, &pod.name).await {
            Some(route) => Ok(self.runtime(route)),
            None => Err(RuntimeError::NotFound(format!(
                "pod {}/{}",
                pod.namespace, pod.name
            ))),
        }
    }
}

#[async_trait]
impl PodRuntime for RoutedRuntime {
    async fn sync_pod(&self, pod: &Pod, node: &NodeContext) -> Result<RuntimeStatus, RuntimeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let route = match self.holder(&uid, &namespace, &name).await {
            Some(route) => route,
            None => {
                let route = route_for(pod);
                self.routes.lock().unwrap().insert(uid, route);
                route
            }
        };
        self.runtime(route).sync_pod(pod, node).await
    }

    async fn kill_pod(&self, pod: &RuntimePod, grace: Duration) -> Result<(), RuntimeError> {
        let known = self.routes.lock().unwrap().get(&pod.uid).copied();
        match known {
            Some(route) => self.runtime(route).kill_pod(pod, grace).await?,
            // Not seen by this agent (it restarted): whichever holds it stops it, and the
            // other has nothing to stop, which is not an error.
            None => {
                let (a, b) = tokio::join!(
                    self.processes.kill_pod(pod, grace),
                    self.containers.kill_pod(pod, grace)
                );
                a?;
                b?;
            }
        }
        self.routes.lock().unwrap().remove(&pod.uid);
        Ok(())
    }

    async fn pods(&self) -> Vec<RuntimePod> {
        let (mut a, b) = tokio::join!(self.processes.pods(), self.containers.pods());
        a.extend(b);
        a
    }

    async fn pods_named(&self, namespace: &str, name: &str) -> Vec<RuntimePod> {
        let (mut a, b) = tokio::join!(
            self.processes.pods_named(namespace, name),
            self.containers.pods_named(namespace, name)
        );
        a.extend(b);
        a
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<String> {
        merge([self.processes.subscribe(), self.containers.subscribe()])
    }

    /// Both runtimes' pods; what one holding pods cannot measure is reported as an error
    /// beside the other's figures, so a scrape still gets them.
    async fn stats(&self) -> Result<crate::stats::RuntimeStats, RuntimeError> {
        let (mut a, mut b) = tokio::join!(self.processes.stats(), self.containers.stats());
        // A runtime that holds no pods has nothing left unmeasured.
        if a.is_err() && self.processes.pods().await.is_empty() {
            a = Ok(crate::stats::RuntimeStats::default());
        }
        if b.is_err() && self.containers.pods().await.is_empty() {
            b = Ok(crate::stats::RuntimeStats::default());
        }
        let mut out = crate::stats::RuntimeStats {
            pods: Vec::new(),
            node: None,
            errors: Vec::new(),
        };
        for (which, r) in [("processes", a), ("containers", b)] {
            match r {
                Ok(s) => {
                    out.pods.extend(s.pods);
                    out.errors.extend(s.errors);
                }
                Err(e) => out.errors.push(format!("{which}: {e}")),
            }
        }
        Ok(out)
    }

    /// The container runtime's: processes have no images.
    async fn images(&self) -> Option<Vec<k8s_openapi::api::core::v1::ContainerImage>> {
        self.containers.images().await
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<RuntimeEvent>> {
        let both: Vec<_> = [self.processes.events(), self.containers.events()]
            .into_iter()
            .flatten()
            .collect();
        (!both.is_empty()).then(|| merge(both))
    }

    async fn logs(
        &self,
        pod: &RuntimePod,
        container: &str,
        options: &LogOptions,
    ) -> Result<LogStream, RuntimeError> {
        self.for_pod(pod).await?.logs(pod, container, options).await
    }

    async fn exec(
        &self,
        pod: &RuntimePod,
        request: ExecRequest,
        io: StreamIo,
    ) -> Result<i32, RuntimeError> {
        self.for_pod(pod).await?.exec(pod, request, io).await
    }

    async fn attach(
        &self,
        pod: &RuntimePod,
        container: &str,
        tty: bool,
        io: StreamIo,
    ) -> Result<(), RuntimeError> {
        self.for_pod(pod)
            .await?
            .attach(pod, container, tty, io)
            .await
    }

    async fn port_forward(
        &self,
        pod: &RuntimePod,
        port: u16,
    ) -> Result<Box<dyn Duplex>, RuntimeError> {
        self.for_pod(pod).await?.port_forward(pod, port).await
    }
}

/// One channel that receives what any of `sources` does, until the receiver is dropped.
fn merge<T: Send + 'static>(
    sources: impl IntoIterator<Item = mpsc::UnboundedReceiver<T>>,
) -> mpsc::UnboundedReceiver<T> {
    let (tx, rx) = mpsc::unbounded_channel();
    for mut from in sources {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(item) = from.recv().await {
                if tx.send(item).is_err() {
                    break;
                }
            }
        });
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulated::{SimulatedConfig, SimulatedRuntime};

    fn pod(uid: &str, name: &str, image: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"uid": uid, "namespace": "default", "name": name},
            "spec": {"containers": [{"name": "main", "image": image, "command": ["sleep", "9"]}]},
        }))
        .unwrap()
    }

    fn runtime_pod(uid: &str, name: &str) -> RuntimePod {
        RuntimePod {
            uid: uid.into(),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn uids(pods: Vec<RuntimePod>) -> Vec<String> {
        let mut uids: Vec<String> = pods.into_iter().map(|p| p.uid).collect();
        uids.sort();
        uids
    }

    #[test]
    fn an_image_anywhere_means_containers() {
        assert_eq!(
            route_for(&pod("1", "a", Some("busybox"))),
            Route::Containers
        );
        assert_eq!(route_for(&pod("1", "a", None)), Route::Processes);
        assert_eq!(route_for(&pod("1", "a", Some(" "))), Route::Processes);
        let mut init_only = pod("1", "a", None);
        init_only.spec.as_mut().unwrap().init_containers = Some(vec![serde_json::from_value(
            serde_json::json!({"name": "init", "image": "busybox"}),
        )
        .unwrap()]);
        assert_eq!(route_for(&init_only), Route::Containers);
    }

    #[tokio::test]
    async fn pods_go_to_the_runtime_their_images_say_and_stay_there() {
        let containers = Arc::new(SimulatedRuntime::new(SimulatedConfig::default()));
        let processes = Arc::new(SimulatedRuntime::new(SimulatedConfig::default()));
        let routed = RoutedRuntime::new(containers.clone(), processes.clone());
        let mut changes = routed.subscribe();
        let node = NodeContext::default();
        routed
            .sync_pod(&pod("c", "with-image", Some("busybox")), &node)
            .await
            .unwrap();
        routed
            .sync_pod(&pod("p", "no-image", None), &node)
            .await
            .unwrap();
        assert_eq!(uids(containers.pods().await), ["c"]);
        assert_eq!(uids(processes.pods().await), ["p"]);
        assert_eq!(uids(routed.pods().await), ["c", "p"]);
        assert_eq!(uids(routed.pods_named("default", "no-image").await), ["p"]);

        // A new agent over the same runtimes finds each pod where it runs, whatever its
        // spec says now.
        let restarted = RoutedRuntime::new(containers.clone(), processes.clone());
        restarted
            .sync_pod(&pod("p", "no-image", Some("busybox")), &node)
            .await
            .unwrap();
        assert_eq!(uids(containers.pods().await), ["c"]);
        restarted
            .kill_pod(&runtime_pod("c", "with-image"), Duration::ZERO)
            .await
            .unwrap();
        assert!(containers.pods().await.is_empty());
        assert_eq!(uids(processes.pods().await), ["p"]);
        let err = restarted
            .logs(
                &runtime_pod("c", "with-image"),
                "main",
                &LogOptions::default(),
            )
            .await
            .err()
            .expect("a killed pod has no logs");
        assert!(matches!(err, RuntimeError::NotFound(_)), "{err}");

        // Either runtime's changes reach the one subscriber.
        let seen = tokio::time::timeout(Duration::from_secs(10), changes.recv())
            .await
            .expect("a change within the simulated start delay");
        assert!(matches!(seen.as_deref(), Some("c" | "p")), "{seen:?}");
    }
}
