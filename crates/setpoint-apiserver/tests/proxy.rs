//! `services/proxy` and `pods/proxy` relaying connection upgrades against the in-process
//! server: a handshake through `services/<name>:<port>/proxy/…` and `pods/<name>:<port>/proxy/…`
//! reaches a backend that answers 101, and bytes then flow both ways until each side closes;
//! a backend that refuses the upgrade is answered as it answered; the handshake, a GET, is
//! authorized with the `get` verb on the proxy subresource, as upstream authorizes it.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::json;
use setpoint_apiserver::server::Running;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const NS: &str = "/api/v1/namespaces/default";
const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/default";
const WITHIN: Duration = Duration::from_secs(10);

/// A backend on a process pod's kind of address (`127.B.x.y`, `B ≥ 1`, which the proxy may
/// reach): a request asking for `Upgrade: echo` gets 101, then the request line it came
/// with, then its own bytes back until it closes; any other request gets 426.
async fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.61.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve_echo(conn));
        }
    });
    addr
}

async fn serve_echo(mut conn: TcpStream) {
    let Ok(head) = read_head(&mut conn).await else {
        return;
    };
    let lower = head.to_ascii_lowercase();
    if !(lower.contains("\r\nupgrade: echo\r\n") && lower.contains("\r\nconnection: upgrade\r\n")) {
        let _ = conn
            .write_all(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 7\r\nConnection: close\r\n\r\nupgrade")
            .await;
        return;
    }
    let request_line = head.lines().next().unwrap_or("").to_string();
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n{request_line}\n"
    );
    if conn.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let (mut from, mut to) = conn.split();
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}

/// Reads up to the end of an HTTP head (`\r\n\r\n`), byte by byte so nothing after it is
/// consumed.
async fn read_head(conn: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if conn.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Reads one `\n`-terminated line.
async fn read_line(conn: &mut TcpStream) -> String {
    let mut line = Vec::new();
    loop {
        let mut byte = [0u8; 1];
        assert_eq!(conn.read(&mut byte).await.unwrap(), 1, "line ended early");
        if byte[0] == b'\n' {
            return String::from_utf8(line).unwrap();
        }
        line.push(byte[0]);
    }
}

/// Sends an upgrade request for `path` as `user` (impersonated; plain-HTTP callers are
/// `system:masters`) and returns the answer's head and the connection.
async fn upgrade(r: &Running, path: &str, user: Option<&str>) -> (String, TcpStream) {
    let mut conn = TcpStream::connect(r.addr).await.unwrap();
    let user = user
        .map(|u| format!("Impersonate-User: {u}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: echo\r\n{user}\r\n"
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let head = tokio::time::timeout(WITHIN, read_head(&mut conn))
        .await
        .expect("an answer in time")
        .unwrap();
    (head, conn)
}

/// After a 101: the backend saw `request_line`, bytes go both ways, and closing our side
/// closes the backend's answer too.
async fn echoes(mut conn: TcpStream, request_line: &str) {
    let check = async {
        assert_eq!(read_line(&mut conn).await, request_line);
        for message in [&b"ping"[..], &b"\x81\x05hello"[..]] {
            conn.write_all(message).await.unwrap();
            let mut back = vec![0u8; message.len()];
            conn.read_exact(&mut back).await.unwrap();
            assert_eq!(back, message);
        }
        conn.shutdown().await.unwrap();
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
    };
    tokio::time::timeout(WITHIN, check)
        .await
        .expect("the echo in time");
}

#[tokio::test]
async fn upgrades_are_spliced_through_services_and_pods_proxy() {
    let r = start().await;
    let backend = echo_backend().await;
    let (ip, port) = (backend.ip().to_string(), backend.port());

    // A pod with the backend's address, and a Service whose Endpoints name it.
    let resp = post(
        &r,
        &format!("{NS}/pods"),
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "echo"},
                "spec": {"automountServiceAccountToken": false,
                         "containers": [{"name": "c", "image": "echo"}]}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let mut pod = resp.body;
    pod["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
    let resp = put(&r, &format!("{NS}/pods/echo/status"), &pod).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let resp = post(
        &r,
        &format!("{NS}/services"),
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo"},
                "spec": {"ports": [{"name": "ws", "port": 80}]}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let resp = post(
        &r,
        &format!("{NS}/endpoints"),
        &json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "echo"},
                "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "ws", "port": port}]}]}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);

    // Through the Service, by port number and by port name, and through the pod.
    for (path, line) in [
        (
            format!("{NS}/services/echo:80/proxy/ws?x=1"),
            "GET /ws?x=1 HTTP/1.1",
        ),
        (format!("{NS}/services/echo:ws/proxy/"), "GET / HTTP/1.1"),
        (
            format!("{NS}/pods/echo:{port}/proxy/chat"),
            "GET /chat HTTP/1.1",
        ),
    ] {
        let (head, conn) = upgrade(&r, &path, None).await;
        assert!(head.starts_with("HTTP/1.1 101 "), "{path}: {head}");
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("\r\nupgrade: echo\r\n"), "{head}");
        echoes(conn, line).await;
    }

    // A plain request is relayed as one: the backend refuses it and that answer comes back.
    let plain = get(&r, &format!("{NS}/services/echo:80/proxy/ws")).await;
    assert_eq!(
        (plain.status, plain.raw.as_ref()),
        (426, &b"upgrade"[..]),
        "{:?}",
        plain.headers
    );

    // The handshake is a GET: `get` on the proxy subresource allows it, `create` does not.
    for (name, verb) in [("proxy-getter", "get"), ("proxy-creator", "create")] {
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["services/proxy", "pods/proxy"],
                       "verbs": [verb]}]});
        assert_eq!(post(&r, &format!("{RBAC}/roles"), &role).await.status, 201);
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name}]});
        assert_eq!(
            post(&r, &format!("{RBAC}/rolebindings"), &binding)
                .await
                .status,
            201
        );
    }
    let path = format!("{NS}/services/echo:80/proxy/as-getter");
    // RBAC reads its bindings from the watch cache, a moment behind the writes.
    let conn = setpoint_testing::eventually_within(WITHIN, "the getter allowed", || async {
        let (head, conn) = upgrade(&r, &path, Some("proxy-getter")).await;
        head.starts_with("HTTP/1.1 101 ").then_some(conn)
    })
    .await;
    echoes(conn, "GET /as-getter HTTP/1.1").await;
    // Once the creator's binding counts (a plain POST through the proxy passes), its
    // handshake is still refused.
    setpoint_testing::eventually_within(WITHIN, "the creator allowed to POST", || async {
        let post = call_with(
            &r,
            "POST",
            &format!("{NS}/pods/echo:{port}/proxy/"),
            None,
            None,
            &[("Impersonate-User", "proxy-creator")],
        )
        .await;
        (post.status == 426).then_some(())
    })
    .await;
    let (head, _) = upgrade(
        &r,
        &format!("{NS}/pods/echo:{port}/proxy/"),
        Some("proxy-creator"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
}
