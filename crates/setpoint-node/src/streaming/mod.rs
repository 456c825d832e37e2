//! The kubelet's streaming endpoints on the agent's HTTPS server, which the API server's
//! `pods/exec`, `pods/attach` and `pods/portforward` proxy to:
//! `/exec/{namespace}/{pod}/{container}` and `/attach/{namespace}/{pod}/{container}`
//! (query: `command` repeated, `stdin`, `stdout`, `stderr`, `tty`, each on when `1`).
//!
//! Served under the same rule as the logs: only to client certificates of the cluster CA.
//! A request is resolved to the runtime holding the pod ([`LogTargets`]) before the
//! connection is upgraded, so an unknown pod is a plain 404; everything after the upgrade is
//! reported on the session's error channel.
//!
//! Layers: [`remotecommand`] is protocol-neutral (options, pipes, the runtime call, the
//! outcome as a `Status`); [`websocket`] carries it over the kubelet's WebSocket channel
//! protocols (`v5.channel.k8s.io`, `v4.channel.k8s.io`, `channel.k8s.io` and their base64
//! forms); [`spdycommand`] over SPDY/3.1 ([`spdy`]), kubectl's fallback. A request that
//! upgrades to neither is refused with 400.
//!
//! `/portforward/{namespace}/{pod}` is [`portforward`]'s: SPDY, SPDY tunneled over WebSocket,
//! and the WebSocket channel protocol.

pub mod portforward;
pub mod remotecommand;
pub mod spdy;
pub mod spdycommand;
pub mod websocket;

use std::sync::Arc;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::server::LogTargets;

use self::remotecommand::{Operation, Session};

/// The streaming routes, resolving pods through `targets`.
pub fn router(targets: Arc<LogTargets>) -> Router {
    Router::new()
        .route("/exec/{namespace}/{pod}/{container}", get(exec).post(exec))
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach).post(attach),
        )
        .route(
            "/portforward/{namespace}/{pod}",
            get(portforward::handle).post(portforward::handle),
        )
        .with_state(targets)
}

/// A plain-text answer, as the kubelet gives before a stream is set up.
pub(crate) fn text(code: StatusCode, message: impl Into<String>) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

/// The query's pairs in order, repeated keys kept (`command` is one per argument).
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

async fn exec(
    State(targets): State<Arc<LogTargets>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    stream(
        Operation::Exec,
        &targets,
        (namespace, pod, container),
        query,
        request,
    )
    .await
}

async fn attach(
    State(targets): State<Arc<LogTargets>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    stream(
        Operation::Attach,
        &targets,
        (namespace, pod, container),
        query,
        request,
    )
    .await
}

/// Validates, resolves the pod, and hands the request to the protocol it upgrades to.
async fn stream(
    operation: Operation,
    targets: &LogTargets,
    (namespace, pod, container): (String, String, String),
    query: Option<String>,
    request: Request,
) -> Response {
    let options = match remotecommand::parse_options(operation, &query_pairs(query.as_deref())) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let Some((runtime, held)) = targets.find(&namespace, &pod).await else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let session = Session {
        operation,
        runtime,
        pod: held,
        container,
        options,
    };
    if websocket::is_upgrade(request.headers()) {
        return websocket::serve(request, session);
    }
    if spdy::is_upgrade(request.headers()) {
        return spdycommand::serve(request, session);
    }
    text(
        StatusCode::BAD_REQUEST,
        "unable to upgrade: this endpoint speaks WebSocket or SPDY/3.1 (Upgrade: websocket or SPDY/3.1)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_query_keys_are_kept_in_order() {
        let q = query_pairs(Some("command=sh&command=-c&command=echo%20hi&stdout=1"));
        let command: Vec<&str> = q
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(command, ["sh", "-c", "echo hi"]);
        assert!(query_pairs(None).is_empty());
    }
}
