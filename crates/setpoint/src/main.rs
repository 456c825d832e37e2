//! `setpoint`: the command-line entry point.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};

#[derive(Parser)]
#[command(
    name = "setpoint",
    version,
    about = "A Kubernetes-compatible declarative control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a whole cluster on an embedded store (API server and, as they land, the
    /// controllers, scheduler and a local node).
    Up(ServeArgs),
    /// Start the API server only.
    Server(ServeArgs),
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// Where the store, certificates and kubeconfig live.
    #[arg(long, default_value = "setpoint-data", env = "SETPOINT_DATA_DIR")]
    data_dir: PathBuf,
    /// Address to serve the API on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Store backend: `embedded` (durable, in the data dir) or `memory` (lost on exit).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "memory"])]
    store: String,
    /// Serve plain HTTP without authentication instead of HTTPS (only for local experiments).
    #[arg(long)]
    insecure_http: bool,
    /// Seconds between compactions of old store history.
    #[arg(long, default_value_t = 300)]
    compaction_interval_seconds: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SETPOINT_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Up(args) => run(args, true).await,
            Command::Server(args) => run(args, false).await,
        }
    })
}

async fn run(args: ServeArgs, all_in_one: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = args.data_dir.canonicalize()?;
    let config = ServerConfig {
        listen: args.listen,
        data_dir: Some(data_dir.clone()),
        store: match args.store.as_str() {
            "memory" => StoreConfig::Memory,
            _ => StoreConfig::Embedded(data_dir.join("store")),
        },
        insecure_http: args.insecure_http,
        compaction_interval: Duration::from_secs(args.compaction_interval_seconds.max(1)),
        ..ServerConfig::default()
    };
    let store = ApiServer::open_store(&config).await?;
    let server = ApiServer::new(config, store.clone()).await?;
    let running = server.serve().await?;
    tracing::info!(url = %running.url, ready_ms = started.elapsed().as_millis() as u64, "API server ready");
    if let Some(kc) = &running.kubeconfig {
        println!("Setpoint is running at {}", running.url);
        println!(
            "Point kubectl at it with:\n\n    export KUBECONFIG={}\n",
            kc.display()
        );
    } else {
        println!(
            "Setpoint is running at {} (plain HTTP, no authentication)",
            running.url
        );
        println!(
            "Point kubectl at it with:\n\n    kubectl --server {}\n",
            running.url
        );
    }
    if all_in_one {
        println!("Try: kubectl create namespace demo && kubectl -n demo create deployment web --image=nginx:1.25");
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    running.shutdown().await;
    drop(server);
    drop(store);
    Ok(())
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
