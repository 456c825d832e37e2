//! End to end in a real browser: `setpoint up` with simulated nodes prints a login URL for the
//! live view; headless Chromium, driven over the DevTools protocol, opens it, the page lists
//! and watches the cluster with the printed token, and after `kubectl scale` its DOM shows the
//! new counts, its timeline shows a controller's decision record, and its namespace filter
//! hides another namespace's Deployment; Events shaped as `setpoint chaos` writes them show in
//! its chaos panel, grouped by fault, newest first, each object's time slowest first.
//! Screenshots of the page are kept under the target dir.
//!
//! Needs `chromium` (skipped with a message when absent, unless `SETPOINT_REQUIRE_CHROMIUM`
//! is set, as CI does) and kubectl.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::{self, Message, WebSocket};

mod support;

use support::Setpoint;

const CHROMIUM: &str = "chromium";
/// How long the browser has to start, and the page to show a count.
const DEADLINE: Duration = Duration::from_secs(20);

/// Whether Chromium can be run here; panics when it cannot but `SETPOINT_REQUIRE_CHROMIUM` is
/// set, so a CI run does not pass by skipping.
fn chromium_available() -> bool {
    let found = Command::new(CHROMIUM)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_CHROMIUM").is_none(),
            "chromium is required but not installed"
        );
        eprintln!("chromium not installed; skipping");
    }
    found
}

/// Headless Chromium in its own process group, killed with all its helpers when dropped.
struct Browser {
    child: Child,
}

impl Browser {
    /// Starts Chromium on a fresh profile in `profile` and returns it with the DevTools
    /// WebSocket URL it wrote to `DevToolsActivePort`.
    fn start(profile: &Path) -> (Browser, String) {
        use std::os::unix::process::CommandExt;
        let child = Command::new(CHROMIUM)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-dev-shm-usage",
                // The cluster's CA is its own: the test trusts it as kubectl does.
                "--ignore-certificate-errors",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromium");
        let browser = Browser { child };
        let file = profile.join("DevToolsActivePort");
        let url = support::eventually("chromium's DevToolsActivePort", DEADLINE, || {
            let text = std::fs::read_to_string(&file).ok()?;
            let mut lines = text.lines();
            let port = lines.next()?.trim().parse::<u16>().ok()?;
            let path = lines.next()?.trim().to_string();
            Some(format!("ws://127.0.0.1:{port}{path}"))
        });
        (browser, url)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: the renderer and GPU helpers too.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-9", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// A DevTools protocol client on the browser's WebSocket, speaking to one page through a
/// flattened session.
struct Cdp {
    socket: WebSocket<TcpStream>,
    next_id: u64,
    session: Option<String>,
}

impl Cdp {
    fn connect(url: &str) -> Cdp {
        let authority = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .expect("a ws:// URL");
        let stream = TcpStream::connect(authority).expect("connect to DevTools");
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        let (socket, _) = tungstenite::client::client(url, stream).expect("DevTools handshake");
        Cdp {
            socket,
            next_id: 0,
            session: None,
        }
    }

    /// Sends `method` and waits for its answer (events in between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.socket
            .send(Message::text(msg.to_string()))
            .expect("send to DevTools");
        loop {
            let text = match self.socket.read() {
                Ok(Message::Text(t)) => t,
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => {
                    panic!("DevTools did not answer {method} within {DEADLINE:?}")
                }
                Err(e) => panic!("DevTools connection: {e}"),
            };
            let v: Value = serde_json::from_str(text.as_str()).expect("DevTools sends JSON");
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method} failed: {}", v["error"]);
                return v["result"].clone();
            }
        }
    }

    /// Opens `url` in a new page and talks to that page from now on.
    fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", json!({"url": "about:blank"}));
        let attached = self.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        self.session = Some(attached["sessionId"].as_str().unwrap().to_string());
        self.call("Page.enable", json!({}));
        self.call("Page.navigate", json!({"url": url}));
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        r["result"]["value"].clone()
    }

    /// Saves a PNG of the page at `path`.
    fn screenshot(&mut self, path: &Path) {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

/// Waits until the JavaScript expression `expression` is true in the page.
fn wait_until(cdp: &mut Cdp, what: &str, expression: &str) {
    support::eventually(&format!("the page showing {what}"), DEADLINE, || {
        (cdp.eval(expression) == json!(true)).then_some(())
    });
}

/// Waits until the JavaScript expression `expression`, a string, is `want` in the page.
fn wait_for_text(cdp: &mut Cdp, what: &str, expression: &str, want: &str) {
    let mut last = Value::Null;
    let shown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        support::eventually(what, DEADLINE, || {
            last = cdp.eval(expression);
            (last == json!(want)).then_some(())
        })
    }));
    assert!(
        shown.is_ok(),
        "the page did not show {what}: want {want:?}, last shown {last}"
    );
}

/// Chooses `namespace` ("" for all) in the page's namespace filter.
fn choose_namespace(cdp: &mut Cdp, namespace: &str) {
    cdp.eval(&format!(
        "(() => {{ const s = document.getElementById('namespace'); s.value = {}; s.dispatchEvent(new Event('change')); }})()",
        json!(namespace)
    ));
}

/// An Event as `setpoint chaos` writes it (crates/setpoint/src/chaos/events.rs): in namespace
/// `chaos`, about that Namespace or about `object` (`(apiVersion, kind, name)`), `ago` seconds
/// old, with the fault's annotations (`annotations`: none for an older run's Event).
fn chaos_event(
    reason: &str,
    message: &str,
    object: Option<(&str, &str, &str)>,
    ago: i64,
    annotations: Value,
) -> Value {
    let at = (chrono::Utc::now() - chrono::Duration::seconds(ago))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let involved = match object {
        Some((api_version, kind, name)) => {
            json!({"apiVersion": api_version, "kind": kind, "namespace": "chaos", "name": name})
        }
        None => json!({"apiVersion": "v1", "kind": "Namespace", "name": "chaos"}),
    };
    let kind = if reason == "FaultInjected" || reason == "NotConverged" {
        "Warning"
    } else {
        "Normal"
    };
    let mut metadata = json!({"generateName": "chaos-", "namespace": "chaos"});
    if !annotations.is_null() {
        metadata["annotations"] = annotations;
    }
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": "setpoint-chaos"},
        "reportingComponent": "setpoint-chaos",
        "reportingInstance": "setpoint-chaos",
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    })
}

/// The annotations of fault `index` of seed 7's schedule, plus `extra`.
fn fault_annotations(label: &str, index: u32, extra: &[(&str, &str)]) -> Value {
    let mut a = json!({
        "setpoint.io/chaos-fault": label,
        "setpoint.io/chaos-fault-index": index.to_string(),
        "setpoint.io/chaos-seed": "7",
    });
    for (k, v) in extra {
        a[*k] = json!(v);
    }
    a
}

/// The counts the page shows for Deployment `default/web`, once they are `want`.
fn wait_for_counts(cdp: &mut Cdp, want: &str) -> String {
    let expression = "(() => { const e = document.querySelector('[data-deployment=\"default/web\"] > .head > .counts'); return e ? e.textContent : document.getElementById('status').textContent; })()";
    support::eventually(&format!("the page showing {want:?}"), DEADLINE, || {
        let shown = cdp.eval(expression);
        let shown = shown.as_str().unwrap_or_default();
        (shown == want).then(|| shown.to_string())
    })
}

#[test]
fn the_live_view_follows_a_scaled_deployment_in_chromium() {
    if !chromium_available() || !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--no-node", "--simulate", "2"], dir.path());
    let login = support::eventually("the live view's URL", DEADLINE, || {
        let line = s.output.recv_timeout(Duration::from_millis(100)).ok()?;
        let url = line.trim();
        url.contains("/ui/#token=").then(|| url.to_string())
    });
    assert!(
        login.starts_with(&format!("{}/ui/#token=", s.url)),
        "{login}"
    );

    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.25",
        "--replicas=1",
    ]);

    let profile = tempfile::tempdir().unwrap();
    let (_browser, ws) = Browser::start(profile.path());
    let mut cdp = Cdp::connect(&ws);
    cdp.open(&login);
    wait_for_counts(&mut cdp, "desired 1 · pods 1 · ready 1");
    // The token left the address bar for the tab's session storage.
    let address = cdp.eval("location.href");
    assert_eq!(address, json!(format!("{}/ui/", s.url)));

    s.ok(&["scale", "deployment", "web", "--replicas=4"]);
    wait_for_counts(&mut cdp, "desired 4 · pods 4 · ready 4");
    // The timeline interleaves decision records with Events: the ReplicaSet controller's
    // reconciles of default/web's ReplicaSet are there.
    wait_until(
        &mut cdp,
        "a decision of the replicaset controller in the timeline",
        "[...document.querySelectorAll('#timeline li.decision')].some((li) => li.textContent.includes(' decision replicaset replicaset/web-'))",
    );
    // Another namespace's Deployment, for the namespace filter to hide (created
    // now, so that its Events and decisions are among the timeline's newest).
    s.ok(&["create", "namespace", "team"]);
    s.ok(&[
        "-n",
        "team",
        "create",
        "deployment",
        "other",
        "--image=nginx:1.25",
        "--replicas=1",
    ]);
    let nodes = cdp.eval("document.querySelectorAll('#nodes tbody tr').length");
    assert_eq!(
        nodes,
        json!(2),
        "the nodes table lists both simulated nodes"
    );

    let artifacts = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui_browser");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("scaled-to-4.png");
    cdp.screenshot(&shot);
    println!("screenshot: {}", shot.display());

    // A click on a pod shows its why chain, rendered by the server as `kubectl why` prints it.
    cdp.eval("document.querySelector('[data-deployment=\"default/web\"] .pods li').click()");
    wait_until(
        &mut cdp,
        "the pod's why chain",
        "document.getElementById('why').textContent.includes('created by the replicaset controller')",
    );
    cdp.screenshot(&artifacts.join("why.png"));

    // Both namespaces are shown, then the filter keeps only `default` on the whole page.
    wait_until(
        &mut cdp,
        "team/other and the namespace filter's choices",
        "!!document.querySelector('[data-deployment=\"team/other\"]') && [...document.getElementById('namespace').options].some((o) => o.value === 'default') && [...document.querySelectorAll('#timeline li')].some((li) => li.dataset.namespace === 'team')",
    );
    cdp.eval("(() => { const s = document.getElementById('namespace'); s.value = 'default'; s.dispatchEvent(new Event('change')); })()");
    wait_until(
        &mut cdp,
        "only namespace default",
        "!document.querySelector('[data-deployment=\"team/other\"]') && !!document.querySelector('[data-deployment=\"default/web\"]') && [...document.querySelectorAll('#timeline li')].every((li) => li.dataset.namespace === 'default') && document.getElementById('totals').textContent.endsWith('pods in default')",
    );
    cdp.screenshot(&artifacts.join("namespace-default.png"));

    // The chaos panel: faults of a `setpoint chaos` run as its Events show them. Fault 1 (seed
    // 7) killed the agent and two objects returned; fault 2 killed it again and the cluster did
    // not converge; fault 3 is still converging. An older run's Event without annotations is
    // left out.
    s.ok(&["create", "namespace", "chaos"]);
    s.ok(&[
        "-n",
        "chaos",
        "create",
        "deployment",
        "web-1",
        "--image=nginx:1.25",
        "--replicas=0",
    ]);
    let kill_agent = "sigkill agent";
    let events = [
        chaos_event(
            "FaultInjected",
            "sigkill agent on agent-0",
            None,
            40,
            fault_annotations(kill_agent, 1, &[("setpoint.io/chaos-process", "agent-0")]),
        ),
        chaos_event(
            "Converged",
            "every object converged 2.61s after recovery from sigkill agent",
            None,
            30,
            fault_annotations(kill_agent, 1, &[("setpoint.io/chaos-converged-ms", "2610")]),
        ),
        chaos_event(
            "Converged",
            "converged 1.23s after recovery from sigkill agent",
            Some(("apps/v1", "StatefulSet", "db")),
            31,
            fault_annotations(kill_agent, 1, &[("setpoint.io/chaos-converged-ms", "1230")]),
        ),
        chaos_event(
            "Converged",
            "converged 2.50s after recovery from sigkill agent",
            Some(("apps/v1", "Deployment", "web-1")),
            30,
            fault_annotations(kill_agent, 1, &[("setpoint.io/chaos-converged-ms", "2500")]),
        ),
        chaos_event(
            "FaultInjected",
            "sigkill agent on agent-0",
            None,
            25,
            fault_annotations(kill_agent, 2, &[("setpoint.io/chaos-process", "agent-0")]),
        ),
        chaos_event(
            "NotConverged",
            "not converged after sigkill agent: web-0: 2 of 3 ready",
            None,
            10,
            fault_annotations(kill_agent, 2, &[]),
        ),
        chaos_event(
            "FaultInjected",
            "sigstop leading scheduler on scheduler-1",
            None,
            5,
            fault_annotations(
                "sigstop leading scheduler",
                3,
                &[("setpoint.io/chaos-process", "scheduler-1")],
            ),
        ),
        chaos_event(
            "FaultInjected",
            "sigkill api-server on api-server",
            None,
            3,
            Value::Null,
        ),
    ];
    let list = json!({"apiVersion": "v1", "kind": "List", "items": events});
    let (created, out, err) = s.create(&list.to_string(), &[]);
    assert!(created, "creating the chaos Events: {out}{err}");
    choose_namespace(&mut cdp, "");
    let faults = "[...document.querySelectorAll('#chaos .fault')].map((f) => [f.dataset.fault, ...[...f.querySelectorAll('.head > span')].map((s) => s.textContent).filter((t) => !t.startsWith('injected '))].join(' ~ ')).join(' | ')";
    wait_for_text(
        &mut cdp,
        "the chaos panel's faults, newest first",
        faults,
        "7/3 ~ sigstop leading scheduler ~ #3 of seed 7 ~ on scheduler-1 ~ converging… | \
         7/2 ~ sigkill agent ~ #2 of seed 7 ~ on agent-0 ~ not converged after sigkill agent: web-0: 2 of 3 ready | \
         7/1 ~ sigkill agent ~ #1 of seed 7 ~ on agent-0 ~ converged 2.61 s after recovery",
    );
    wait_for_text(
        &mut cdp,
        "fault 1's objects, slowest first",
        "[...document.querySelectorAll('#chaos [data-fault=\"7/1\"] tbody tr')].map((r) => [...r.cells].map((c) => c.textContent).join(' ~ ')).join(' | ')",
        "deployment chaos/web-1 ~ 2.50 s | statefulset chaos/db ~ 1.23 s",
    );
    let injected = cdp.eval(
        "document.querySelector('#chaos [data-fault=\"7/1\"] > .head').textContent.includes('injected 20')",
    );
    assert_eq!(injected, json!(true), "fault 1 says when it was injected");
    assert_eq!(
        cdp.eval("document.getElementById('chaos-section').hidden"),
        json!(false)
    );
    cdp.screenshot(&artifacts.join("chaos.png"));

    // A click on an object of a fault shows its why chain.
    cdp.eval("document.querySelector('#chaos [data-object=\"Deployment/chaos/web-1\"]').click()");
    wait_until(
        &mut cdp,
        "deployment chaos/web-1's why chain",
        "document.getElementById('why').textContent.startsWith('deployment chaos/web-1 (T = ')",
    );

    // The namespace filter narrows the panel too: in `default` there is no chaos Event.
    choose_namespace(&mut cdp, "default");
    wait_until(
        &mut cdp,
        "no chaos panel in namespace default",
        "document.getElementById('chaos-section').hidden && document.querySelectorAll('#chaos .fault').length === 0 && !!document.querySelector('[data-deployment=\"default/web\"]')",
    );

    s.ok(&["scale", "deployment", "web", "--replicas=2"]);
    wait_for_counts(&mut cdp, "desired 2 · pods 2 · ready 2");
    s.stop();
}
