//! The CronBackup operator end to end: the operator runs as its own process (with leader
//! election) against an in-process HTTPS API server with the built-in controllers, and the
//! real `kubectl` plays the user: create, patch, hand-edit the CronJob, delete; and the
//! operator is killed half way through a batch and restarted.
//!
//! Skipped (with a message) when no kubectl is installed, unless `SETPOINT_REQUIRE_KUBECTL`
//! is set (CI sets it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use setpoint_testing::TestCluster;

fn kubectl_available() -> bool {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_KUBECTL").is_none(),
            "kubectl is required (SETPOINT_REQUIRE_KUBECTL is set)"
        );
        eprintln!("skipping: kubectl is not installed");
    }
    ok
}

/// kubectl with the test cluster's kubeconfig and a throwaway home.
struct Kubectl {
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.home.path())
            .env("KUBECACHEDIR", self.home.path().join("cache"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run kubectl")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn apply(&self, manifest: &str) {
        let f = self.home.path().join("manifest.yaml");
        std::fs::write(&f, manifest).unwrap();
        self.ok(&["apply", "-f", f.to_str().unwrap()]);
    }
}

/// Polls until `check` returns `Some`, or panics after `within`.
fn eventually<T>(what: &str, within: Duration, check: impl FnMut() -> Option<T>) -> T {
    setpoint_testing::eventually_blocking(what, within, check)
}

/// The operator process, killed when dropped.
struct Operator(Child);

impl Operator {
    fn start(kubeconfig: &Path) -> Operator {
        Operator(
            Command::new(env!("CARGO_BIN_EXE_cronbackup"))
                .args(["--leader-elect", "--lease-seconds", "2"])
                .env("KUBECONFIG", kubeconfig)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .expect("start the operator"),
        )
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn schedule_of(k: &Kubectl, cronjob: &str) -> String {
    let out = k.run(&["get", "cronjob", cronjob, "-o", "jsonpath={.spec.schedule}"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cronbackup_operator_end_to_end() {
    if !kubectl_available() {
        return;
    }
    let cluster = TestCluster::start_https_with_controllers().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig().unwrap()).unwrap();
    let k = Kubectl {
        kubeconfig: kubeconfig.clone(),
        home: tempfile::tempdir().unwrap(),
    };
    let test = tokio::task::spawn_blocking(move || {
        let operator = Operator::start(&k.kubeconfig);
        eventually("the CRD", Duration::from_secs(30), || {
            k.run(&["get", "crd", "cronbackups.example.com"])
                .status
                .success()
                .then_some(())
        });
        k.ok(&[
            "wait",
            "--for=condition=Established",
            "crd/cronbackups.example.com",
            "--timeout=30s",
        ]);

        // Create: the CronJob appears with the (defaulted) schedule; the status says so.
        k.apply("apiVersion: example.com/v1\nkind: CronBackup\nmetadata:\n  name: nightly\nspec:\n  database: orders\n");
        eventually("the CronJob", Duration::from_secs(30), || {
            (schedule_of(&k, "backup-nightly") == "0 2 * * *").then_some(())
        });
        let status = eventually("the status", Duration::from_secs(30), || {
            let s = k.ok(&[
                "get",
                "cbk",
                "nightly",
                "-o",
                "jsonpath={.status.observedGeneration} {.status.cronJob}",
            ]);
            (s == "1 backup-nightly").then_some(s)
        });
        assert_eq!(status, "1 backup-nightly");
        let table = k.ok(&["get", "cronbackups"]);
        assert!(
            table.contains("0 2 * * *") && table.contains("orders"),
            "{table}"
        );

        // Patch the schedule: the CronJob follows.
        k.ok(&[
            "patch",
            "cbk",
            "nightly",
            "--type=merge",
            "-p",
            r#"{"spec":{"schedule":"30 3 * * *"}}"#,
        ]);
        eventually("the CronJob to follow", Duration::from_secs(30), || {
            (schedule_of(&k, "backup-nightly") == "30 3 * * *").then_some(())
        });
        eventually("observedGeneration 2", Duration::from_secs(30), || {
            (k.ok(&[
                "get",
                "cbk",
                "nightly",
                "-o",
                "jsonpath={.status.observedGeneration}",
            ]) == "2")
                .then_some(())
        });

        // Edit the CronJob by hand (kubectl edit with a scripted editor): the operator puts it back.
        let edited = k
            .command(&["edit", "cronjob", "backup-nightly"])
            .env(
                "KUBE_EDITOR",
                "sed -i -e 's/schedule: 30 3 \\* \\* \\*/schedule: 0 5 * * */'",
            )
            .output()
            .unwrap();
        assert!(
            edited.status.success(),
            "{}",
            String::from_utf8_lossy(&edited.stderr)
        );
        eventually("the drift to be corrected", Duration::from_secs(30), || {
            (schedule_of(&k, "backup-nightly") == "30 3 * * *").then_some(())
        });
        let events = k.ok(&[
            "get",
            "events",
            "--field-selector",
            "reason=Corrected",
            "-o",
            "name",
        ]);
        assert!(!events.trim().is_empty(), "a Corrected event");

        // Delete: the CronJob goes with it (owner reference, garbage collector).
        k.ok(&["delete", "cbk", "nightly"]);
        eventually("the CronJob to be removed", Duration::from_secs(30), || {
            (!k.run(&["get", "cronjob", "backup-nightly"])
                .status
                .success())
            .then_some(())
        });

        // Kill the operator half way through a batch; restarted, it finishes with exactly one
        // CronJob per CronBackup.
        let batch: String = (0..30)
            .map(|i| format!("apiVersion: example.com/v1\nkind: CronBackup\nmetadata:\n  name: db-{i}\nspec:\n  database: db-{i}\n"))
            .collect::<Vec<_>>()
            .join("---\n");
        drop(operator);
        let operator = Operator::start(&k.kubeconfig);
        k.apply(&batch);
        let count = || {
            k.ok(&[
                "get",
                "cronjobs",
                "-l",
                "app.kubernetes.io/managed-by=cronbackup",
                "-o",
                "name",
            ])
            .lines()
            .filter(|l| !l.is_empty())
            .count()
        };
        eventually("some CronJobs", Duration::from_secs(30), || {
            (count() > 0).then_some(())
        });
        drop(operator);
        let _operator = Operator::start(&k.kubeconfig);
        eventually("30 CronJobs", Duration::from_secs(60), || {
            (count() == 30).then_some(())
        });
        let owners = k.ok(&[
            "get",
            "cronjobs",
            "-l",
            "app.kubernetes.io/managed-by=cronbackup",
            "-o",
            "jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{\"\\n\"}{end}",
        ]);
        let mut names: Vec<&str> = owners.lines().filter(|l| !l.is_empty()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 30, "one CronJob per CronBackup");
    });
    test.await.unwrap();
    cluster.stop().await;
}
