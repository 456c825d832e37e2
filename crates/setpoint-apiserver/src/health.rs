//! `/healthz`, `/livez` and `/readyz`, as kube-apiserver serves them: each is a list of named
//! checks; `?verbose` lists them one per line (`[+]ping ok`, `[-]etcd failed: reason
//! withheld`), `?exclude=<name>` leaves one out, and `/<endpoint>/<check>` runs one.
//!
//! The checks: `ping` (the server answers), `etcd` (the store answers a read of its current
//! revision, within a few seconds; kube-apiserver's name, whichever store is configured), and
//! for readiness also `informer-sync` (the watch caches are loaded and the bootstrap objects
//! exist) and `shutdown` (the server is not stopping).

use std::time::Duration;

use http::StatusCode;

use crate::state::ApiServer;

/// How long the store may take to answer the `etcd` check.
const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Check {
    Ping,
    Etcd,
    InformerSync,
    Shutdown,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::Ping => "ping",
            Check::Etcd => "etcd",
            Check::InformerSync => "informer-sync",
            Check::Shutdown => "shutdown",
        }
    }

    async fn run(self, server: &ApiServer) -> Result<(), String> {
        match self {
            Check::Ping => Ok(()),
            Check::Etcd => {
                match tokio::time::timeout(STORE_CHECK_TIMEOUT, server.store().current_revision())
                    .await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("the store did not answer: {e}")),
                    Err(_) => Err(format!(
                        "the store did not answer within {STORE_CHECK_TIMEOUT:?}"
                    )),
                }
            }
            Check::InformerSync => server
                .is_ready()
                .then_some(())
                .ok_or_else(|| "the watch caches are not loaded yet".to_owned()),
            Check::Shutdown => (!server.is_stopping())
                .then_some(())
                .ok_or_else(|| "the server is shutting down".to_owned()),
        }
    }
}

/// The checks of an endpoint (`healthz`, `livez` or `readyz`); `None` for other paths.
fn checks(endpoint: &str) -> Option<&'static [Check]> {
    match endpoint {
        "healthz" | "livez" => Some(&[Check::Ping, Check::Etcd]),
        "readyz" => Some(&[
            Check::Ping,
            Check::Etcd,
            Check::InformerSync,
            Check::Shutdown,
        ]),
        _ => None,
    }
}

/// Answers a health path (`/livez`, `/readyz/etcd`, …) with its status and text body;
/// `None` when `path` is not one.
pub async fn answer(server: &ApiServer, path: &str, query: &str) -> Option<(StatusCode, String)> {
    let rest = path.strip_prefix('/')?;
    let (endpoint, single) = match rest.split_once('/') {
        Some((e, c)) => (e, Some(c)),
        None => (rest, None),
    };
    let all = checks(endpoint)?;
    if let Some(name) = single {
        let check = all.iter().find(|c| c.name() == name)?;
        return Some(match check.run(server).await {
            Ok(()) => (StatusCode::OK, "ok".to_owned()),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: {e}\n"),
            ),
        });
    }
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let verbose = params.iter().any(|(k, _)| k == "verbose");
    let mut excluded: Vec<&str> = params
        .iter()
        .filter(|(k, _)| k == "exclude")
        .map(|(_, v)| v.as_str())
        .collect();
    let mut out = String::new();
    let mut failed = false;
    for check in all {
        if let Some(i) = excluded.iter().position(|e| *e == check.name()) {
            excluded.remove(i);
            out.push_str(&format!("[+]{} excluded: ok\n", check.name()));
            continue;
        }
        match check.run(server).await {
            Ok(()) => out.push_str(&format!("[+]{} ok\n", check.name())),
            Err(e) => {
                tracing::warn!(check = check.name(), endpoint, error = %e, "health check failed");
                failed = true;
                out.push_str(&format!("[-]{} failed: reason withheld\n", check.name()));
            }
        }
    }
    if !excluded.is_empty() {
        out.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            excluded
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    Some(if failed {
        out.push_str(&format!("{endpoint} check failed\n"));
        (StatusCode::INTERNAL_SERVER_ERROR, out)
    } else if verbose {
        out.push_str(&format!("{endpoint} check passed\n"));
        (StatusCode::OK, out)
    } else {
        (StatusCode::OK, "ok".to_owned())
    })
}
