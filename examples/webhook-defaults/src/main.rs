//! Serves the Website defaulting and validating webhooks over HTTPS.
//!
//! `webhook-defaults --tls-cert-file tls.crt --tls-private-key-file tls.key [--listen
//! 0.0.0.0:9443]`: the certificate must be valid for the name the API server calls
//! (`<service>.<namespace>.svc` for a Service reference), and its CA is the configurations'
//! `caBundle`. `--print-manifests <url>` prints the CRD and the two configurations pointed at
//! `<url>` (no `caBundle`: add yours) instead of serving.

use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use setpoint_runtime::serving::{self, ClientCertificates};

/// The largest review read (the API server sends at most a few MiB).
const MAX_BODY: usize = 8 * 1024 * 1024;

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

async fn review(req: http::Request<hyper::body::Incoming>) -> http::Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let reply = |status: u16, body: Vec<u8>| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reply(400, e.to_string().into_bytes()),
    };
    let Ok(review) = serde_json::from_slice::<Value>(&body) else {
        return reply(400, b"the body is not an AdmissionReview".to_vec());
    };
    let request = review.get("request").cloned().unwrap_or(Value::Null);
    let response = webhook_defaults::answer(&path, &request);
    tracing::info!(%path, allowed = %response["allowed"], "admission review");
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "response": response});
    reply(200, serde_json::to_vec(&out).unwrap_or_default())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    if let Some(url) = flag(&args, "--print-manifests") {
        let url = url.trim_end_matches('/').to_string();
        let mut docs = vec![webhook_defaults::crd()];
        docs.extend(webhook_defaults::webhook_configurations(
            |path| json!({"url": format!("{url}{path}")}),
        ));
        let mut out = std::io::stdout().lock();
        for d in docs {
            writeln!(out, "---\n{}", serde_json::to_string_pretty(&d)?)?;
        }
        return Ok(());
    }
    let cert = flag(&args, "--tls-cert-file").ok_or("--tls-cert-file is required")?;
    let key = flag(&args, "--tls-private-key-file").ok_or("--tls-private-key-file is required")?;
    let listen = flag(&args, "--listen").unwrap_or_else(|| "0.0.0.0:9443".into());
    let certs = CertificateDer::pem_file_iter(&cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&key)?;
    let tls = serving::tls_config(certs, key, None, ClientCertificates::Optional)?;
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    let server = serving::serve(listener, Some(Arc::new(tls)), "webhooks", |_| {
        hyper::service::service_fn(|req| async move { Ok::<_, Infallible>(review(req).await) })
    })?;
    tracing::info!(address = %server.local_addr(), "serving the Website webhooks");
    tokio::signal::ctrl_c().await?;
    server.stop().await;
    Ok(())
}
