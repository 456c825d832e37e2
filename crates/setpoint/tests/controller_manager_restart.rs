//! End to end: the controller manager as its own process next to `setpoint server`,
//! `setpoint scheduler` and a simulated agent, killed (SIGKILL) in the middle of a scale-up
//! from 0 to 50 and in the middle of a rollout, then started again: the work completes, with
//! exactly the requested pods and no pod ever created twice for one slot.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod support;

use support::{eventually, Setpoint};

/// A background `setpoint` component, killed when dropped.
struct Component(Child);

impl Component {
    fn start(args: &[&str], kubeconfig: &Path) -> Component {
        let child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start a setpoint component");
        Component(child)
    }

    /// The controller manager, slowed by a client-side rate limit so its work can be
    /// interrupted half way.
    fn controller_manager(kubeconfig: &Path) -> Component {
        Component::start(
            &[
                "controller-manager",
                "--leader-elect=false",
                // A free port for its endpoint, not 10257 (tests run side by side).
                "--secure-port",
                "0",
                "--kube-api-qps",
                "10",
                "--kube-api-burst",
                "2",
            ],
            kubeconfig,
        )
    }

    fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every pod name `kubectl get pods -w` prints, as it prints them.
fn watch_pod_names(s: &Setpoint, selector: &str) -> (Child, mpsc::Receiver<String>) {
    let mut child = s
        .kubectl_command(&["get", "pods", "-l", selector, "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get pods -w");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line.trim().to_string());
        }
    });
    (child, rx)
}

fn count(s: &Setpoint, selector: &str) -> usize {
    s.ok(&["get", "pods", "-l", selector, "-o", "name"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

#[test]
fn killed_controller_manager_resumes_scale_up_and_rollout() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["server"], &data.path().join("data"));
    let _scheduler = Component::start(
        &["scheduler", "--leader-elect=false", "--secure-port", "0"],
        &s.kubeconfig,
    );
    let _agent = Component::start(
        &[
            "agent",
            "--simulate",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--start-delay-ms",
            "100",
            "--ready-delay-ms",
            "300",
        ],
        &s.kubeconfig,
    );
    let cm = Component::controller_manager(&s.kubeconfig);

    // Scale-up from 0 to 50, interrupted.
    s.apply("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: big\nspec:\n  replicas: 0\n  selector:\n    matchLabels: {app: big}\n  template:\n    metadata:\n      labels: {app: big}\n    spec:\n      containers:\n      - name: c\n        image: nginx:1.25\n");
    let (mut watch, created) = watch_pod_names(&s, "app=big");
    let mut seen = BTreeSet::new();
    s.ok(&["scale", "deployment", "big", "--replicas=50"]);
    eventually("the scale-up to start", Duration::from_secs(60), || {
        seen.extend(created.try_iter().filter(|l| l.starts_with("pod/")));
        (seen.len() >= 5).then_some(())
    });
    cm.kill();
    let at_kill = count(&s, "app=big");
    assert!(
        at_kill < 50,
        "the scale-up finished before the kill ({at_kill} pods)"
    );
    let cm = Component::controller_manager(&s.kubeconfig);
    eventually("50 pods", Duration::from_secs(120), || {
        seen.extend(created.try_iter().filter(|l| l.starts_with("pod/")));
        (count(&s, "app=big") == 50).then_some(())
    });
    let status = s.ok(&["rollout", "status", "deployment/big", "--timeout=120s"]);
    assert!(status.contains("successfully rolled out"), "{status}");
    let listed: BTreeSet<String> = s
        .ok(&["get", "pods", "-l", "app=big", "-o", "name"])
        .lines()
        .map(String::from)
        .collect();
    seen.extend(created.try_iter().filter(|l| l.starts_with("pod/")));
    assert_eq!(listed.len(), 50);
    assert!(
        seen.is_subset(&listed),
        "pods were created beyond the 50 and removed: {:?}",
        seen.difference(&listed).collect::<Vec<_>>()
    );
    eprintln!("controller manager killed at {at_kill}/50 pods; restarted, it made exactly 50");
    let _ = watch.kill();
    let _ = watch.wait();

    // A rollout (of 10 replicas, to keep the rate-limited controller brief), interrupted.
    s.ok(&["scale", "deployment", "big", "--replicas=10"]);
    eventually("10 pods", Duration::from_secs(60), || {
        (count(&s, "app=big") == 10).then_some(())
    });
    s.ok(&[
        "patch",
        "deployment",
        "big",
        "-p",
        r#"{"spec":{"strategy":{"rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}}}"#,
    ]);
    s.ok(&["set", "image", "deployment/big", "c=nginx:1.26"]);
    // (Until the controller observes the new generation, the status still describes the old
    // template.)
    eventually(
        "the rollout to be under way",
        Duration::from_secs(60),
        || {
            let st = s.ok(&[
            "get", "deployment", "big", "-o",
            "jsonpath={.metadata.generation} {.status.observedGeneration} {.status.updatedReplicas}",
        ]);
            let v: Vec<&str> = st.split(' ').collect();
            let updated: usize = v.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
            (v.len() == 3 && v[0] == v[1] && (1..8).contains(&updated)).then_some(())
        },
    );
    cm.kill();
    let updated: usize = s
        .ok(&[
            "get",
            "deployment",
            "big",
            "-o",
            "jsonpath={.status.updatedReplicas}",
        ])
        .parse()
        .unwrap_or(0);
    assert!(updated < 10, "the rollout finished before the kill");
    let cm = Component::controller_manager(&s.kubeconfig);
    let status = s.ok(&["rollout", "status", "deployment/big", "--timeout=180s"]);
    assert!(status.contains("successfully rolled out"), "{status}");
    eventually("only new pods", Duration::from_secs(60), || {
        let images = s.ok(&[
            "get",
            "pods",
            "-l",
            "app=big",
            "-o",
            "jsonpath={range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}",
        ]);
        let v: Vec<&str> = images.lines().filter(|l| !l.is_empty()).collect();
        (v.len() == 10 && v.iter().all(|i| *i == "nginx:1.26")).then_some(())
    });
    eprintln!(
        "controller manager killed at {updated}/10 updated; restarted, the rollout completed"
    );
    // The components go first, so they don't log the server's departure.
    drop((cm, _agent, _scheduler));
    s.stop();
}
