//! API calls timed as the client saw them (send to decoded answer), with retries of what a
//! loaded server may answer transiently (429, 5xx, no answer).
//!
//! Timing here rather than through `ClientMetrics` keeps every request in the raw log with its
//! resource, so percentiles per verb *and* resource are computed from observations, not from
//! histogram buckets.

use std::future::Future;
use std::time::Duration;

use setpoint_runtime::client::ClientError;

use crate::record::{Record, Recorder};

/// How many times a transiently failed request is retried.
pub const MAX_RETRIES: u32 = 6;

/// A request not answered within this long is given up on and logged as `timeout`: a wedged
/// server must show up in the report as errors, not hang the benchmark.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The `error` field of a [`Record::Request`] for this outcome.
pub fn outcome<T>(r: &Result<T, ClientError>) -> Option<String> {
    match r {
        Ok(_) => None,
        Err(ClientError::Api(e)) => Some(e.code.to_string()),
        Err(ClientError::Transport(_)) => Some("transport".into()),
        Err(ClientError::Decode(_)) => Some("decode".into()),
        Err(ClientError::Config(_)) => Some("config".into()),
        Err(ClientError::NotSent(_)) => Some("not sent".into()),
    }
}

/// Whether a failure is worth retrying: the server was busy or unreachable, not wrong.
pub fn transient(e: &ClientError) -> bool {
    match e {
        ClientError::Transport(_) => true,
        ClientError::Api(a) => a.code == 429 || a.code >= 500,
        _ => false,
    }
}

/// Runs `call` once (at most [`REQUEST_TIMEOUT`]), recording it as `verb` on `resource`.
pub async fn once<T, Fut>(
    rec: &Recorder,
    verb: &str,
    resource: &str,
    call: Fut,
) -> Result<T, ClientError>
where
    Fut: Future<Output = Result<T, ClientError>>,
{
    let t = rec.now_us();
    let (r, error) = match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
        Ok(r) => {
            let e = outcome(&r);
            (r, e)
        }
        Err(_) => (
            Err(ClientError::Transport(format!(
                "no answer within {REQUEST_TIMEOUT:?}"
            ))),
            Some("timeout".to_string()),
        ),
    };
    let us = rec.now_us().saturating_sub(t);
    rec.record_at(
        t,
        Record::Request {
            verb: verb.into(),
            resource: resource.into(),
            us,
            error,
        },
    );
    r
}

/// Runs `call` (made afresh per attempt), recording each attempt, retrying transient failures
/// with exponential back-off (50 ms doubling, at most 2 s). Returns the last outcome and whether
/// it came after a retry (a create retried after a lost answer may meet its own object).
pub async fn with_retries<T, F, Fut>(
    rec: &Recorder,
    verb: &str,
    resource: &str,
    mut call: F,
) -> (Result<T, ClientError>, bool)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let mut attempt = 0;
    loop {
        let r = once(rec, verb, resource, call()).await;
        match &r {
            Err(e) if transient(e) && attempt < MAX_RETRIES => {
                rec.record(Record::Retry {
                    verb: verb.into(),
                    resource: resource.into(),
                    reason: outcome(&r).unwrap_or_default(),
                });
                let backoff = Duration::from_millis(50 << attempt).min(Duration::from_secs(2));
                tokio::time::sleep(backoff).await;
                attempt += 1;
            }
            _ => return (r, attempt > 0),
        }
    }
}
