//! `setpoint store …`: moving a cluster's objects between stores offline (see
//! `setpoint_store::migrate` for the format).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Subcommand;
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::etcd::{EtcdOptions, EtcdStore, EtcdTls};
use setpoint_store::migrate::{self, MigrateError};
use setpoint_store::Store;
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};

#[derive(Subcommand)]
pub enum StoreCommand {
    /// Write every object of a store to a file (or stdout), as one consistent snapshot.
    ///
    /// The API server must not be running on an embedded data dir meanwhile.
    Export {
        #[command(flatten)]
        store: StoreArgs,
        /// Where to write the export; `-` is stdout.
        #[arg(long, short, default_value = "-")]
        output: String,
    },
    /// Read an export into a store, which must be empty unless `--force` is given.
    ///
    /// The API server must not be running on an embedded data dir meanwhile.
    Import {
        #[command(flatten)]
        store: StoreArgs,
        /// The export to read; `-` is stdin.
        #[arg(long, short, default_value = "-")]
        input: String,
        /// Import into a store that already holds objects, overwriting keys that exist.
        #[arg(long)]
        force: bool,
    },
    /// Copy every object from one store into another directly (an export piped into an import).
    ///
    /// Stores are `embedded:<data-dir>` or `etcd:<endpoint>[,<endpoint>…]`; the `--etcd-*`
    /// flags apply to whichever side is etcd. The API server must not be running on an
    /// embedded data dir meanwhile.
    Migrate {
        /// The store to copy from.
        #[arg(long)]
        from: String,
        /// The store to copy into, which must be empty unless `--force` is given.
        #[arg(long)]
        to: String,
        /// Import into a store that already holds objects, overwriting keys that exist.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        etcd: EtcdFlags,
    },
}

/// etcd connection flags other than the endpoints, shared by `setpoint up|server` and the
/// `store` commands.
#[derive(clap::Args, Clone, Debug)]
pub struct EtcdFlags {
    /// Prefix of the cluster's keys in etcd (as given to `setpoint server`).
    #[arg(long, default_value = "")]
    pub etcd_prefix: String,
    /// CA certificate (PEM) that signed etcd's serving certificate; use `https://` endpoints.
    #[arg(long)]
    pub etcd_cacert: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's client-certificate authentication.
    #[arg(long, requires_all = ["etcd_key", "etcd_cacert"])]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdFlags {
    /// The etcd connection to `endpoints` these flags describe (certificates are read here, so
    /// a bad path fails at start-up with its name).
    pub fn options(&self, endpoints: &[String]) -> anyhow::Result<EtcdOptions> {
        let read = |path: &Option<PathBuf>| -> anyhow::Result<Option<Vec<u8>>> {
            path.as_ref()
                .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
                .transpose()
        };
        let tls = match read(&self.etcd_cacert)? {
            Some(ca_pem) => Some(EtcdTls {
                ca_pem,
                cert_pem: read(&self.etcd_cert)?,
                key_pem: read(&self.etcd_key)?,
            }),
            None => None,
        };
        Ok(EtcdOptions {
            endpoints: endpoints.to_vec(),
            prefix: self.etcd_prefix.clone(),
            tls,
            ..EtcdOptions::default()
        })
    }

    /// The store a `--from`/`--to` spec names.
    fn store_args(&self, spec: &str) -> anyhow::Result<StoreArgs> {
        let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
        if rest.is_empty() {
            bail!("store {spec:?}: expected embedded:<data-dir> or etcd:<endpoints>");
        }
        let mut args = StoreArgs {
            data_dir: PathBuf::new(),
            store: kind.to_owned(),
            etcd_endpoints: Vec::new(),
            etcd: self.clone(),
        };
        match kind {
            "embedded" => args.data_dir = PathBuf::from(rest),
            "etcd" => args.etcd_endpoints = rest.split(',').map(str::to_owned).collect(),
            _ => bail!("store {spec:?}: the kind must be embedded or etcd"),
        }
        Ok(args)
    }
}

/// Which store to open: the flags `setpoint server` takes for it.
#[derive(clap::Args, Clone, Debug)]
pub struct StoreArgs {
    /// The data dir whose embedded store (`<data-dir>/store`) to use (with `--store embedded`).
    #[arg(long, default_value = "setpoint-data", env = "SETPOINT_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Store backend: `embedded` (in the data dir) or `etcd`.
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "etcd"])]
    pub store: String,
    /// etcd client URLs, comma-separated (with `--store etcd`).
    #[arg(
        long,
        value_delimiter = ',',
        required_if_eq("store", "etcd"),
        env = "SETPOINT_ETCD_ENDPOINTS"
    )]
    pub etcd_endpoints: Vec<String>,
    #[command(flatten)]
    pub etcd: EtcdFlags,
}

impl StoreArgs {
    /// A short description of the store for messages.
    fn describe(&self) -> String {
        match self.store.as_str() {
            "etcd" => format!(
                "etcd at {} (prefix {:?})",
                self.etcd_endpoints.join(","),
                self.etcd.etcd_prefix
            ),
            _ => format!("the embedded store in {}", self.data_dir.display()),
        }
    }

    /// Opens the store. `create` allows creating an embedded store that does not exist yet
    /// (for imports; an export from a missing data dir is a mistake worth reporting).
    async fn open(&self, create: bool) -> anyhow::Result<Arc<dyn Store>> {
        if self.store == "etcd" {
            let store = EtcdStore::connect(self.etcd.options(&self.etcd_endpoints)?)
                .await
                .with_context(|| format!("connecting to {}", self.describe()))?;
            return Ok(Arc::new(store));
        }
        let dir = self.data_dir.join("store");
        if !create && !dir.is_dir() {
            bail!(
                "{} has no embedded store ({} does not exist)",
                self.data_dir.display(),
                dir.display()
            );
        }
        open_embedded(&dir).map(|s| Arc::new(s) as Arc<dyn Store>)
    }
}

/// Opens an embedded store, explaining the usual reason it fails: a server holds its lock.
fn open_embedded(dir: &Path) -> anyhow::Result<EmbeddedStore> {
    EmbeddedStore::open(dir, EmbeddedOptions::default()).map_err(|e| {
        let msg = e.to_string();
        if msg.to_ascii_lowercase().contains("already open") {
            anyhow::anyhow!(
                "the embedded store in {} is in use: stop the setpoint server running on this \
                 data dir first ({msg})",
                dir.display()
            )
        } else {
            anyhow::anyhow!("opening the embedded store in {}: {msg}", dir.display())
        }
    })
}

/// Runs a `setpoint store` subcommand.
pub async fn run(command: StoreCommand) -> anyhow::Result<()> {
    match command {
        StoreCommand::Export { store, output } => {
            let source = store.open(false).await?;
            let mut writer: Box<dyn AsyncWrite + Unpin + Send> = if output == "-" {
                Box::new(tokio::io::stdout())
            } else {
                let file = tokio::fs::File::create(&output)
                    .await
                    .with_context(|| format!("creating {output}"))?;
                Box::new(file)
            };
            let mut buffered = BufWriter::new(&mut writer);
            let result = migrate::export(&*source, &mut buffered).await;
            let _ = source.close().await;
            let summary = result.with_context(|| format!("exporting {}", store.describe()))?;
            buffered.flush().await?;
            writer.shutdown().await?;
            eprintln!(
                "exported {} keys from {} at revision {}",
                summary.count,
                store.describe(),
                summary.revision
            );
            Ok(())
        }
        StoreCommand::Import {
            store,
            input,
            force,
        } => {
            let mut reader: Box<dyn AsyncBufRead + Unpin + Send> = if input == "-" {
                Box::new(BufReader::new(tokio::io::stdin()))
            } else {
                let file = tokio::fs::File::open(&input)
                    .await
                    .with_context(|| format!("opening {input}"))?;
                Box::new(BufReader::new(file))
            };
            let target = store.open(true).await?;
            let result = migrate::import(&*target, &mut reader, force).await;
            // Closing waits for acknowledged writes to be durable, so do it before reporting.
            let _ = target.close().await;
            let summary = result.with_context(|| format!("importing into {}", store.describe()))?;
            eprintln!(
                "imported {} keys (exported at revision {}) into {}{}",
                summary.count,
                summary.source_revision,
                store.describe(),
                if summary.overwritten > 0 {
                    format!(", overwriting {}", summary.overwritten)
                } else {
                    String::new()
                }
            );
            Ok(())
        }
        StoreCommand::Migrate {
            from,
            to,
            force,
            etcd,
        } => migrate_between(etcd.store_args(&from)?, etcd.store_args(&to)?, force).await,
    }
}

/// Streams an export of `from` straight into an import to `to` through an in-memory pipe, so
/// memory stays bounded and nothing touches the disk in between.
async fn migrate_between(from: StoreArgs, to: StoreArgs, force: bool) -> anyhow::Result<()> {
    if from.describe() == to.describe() {
        bail!("--from and --to name the same store");
    }
    let source = from.open(false).await?;
    let target = match to.open(true).await {
        Ok(t) => t,
        Err(e) => {
            let _ = source.close().await;
            return Err(e);
        }
    };
    let (writer, reader) = tokio::io::duplex(256 * 1024);
    let exporting = {
        let source = &*source;
        async move {
            let mut writer = writer;
            let result = migrate::export(source, &mut writer).await;
            // Closing the pipe is what tells the importer the stream ended.
            let _ = writer.shutdown().await;
            result
        }
    };
    let mut reader = BufReader::new(reader);
    let importing = migrate::import(&*target, &mut reader, force);
    let (exported, imported) = tokio::join!(exporting, importing);
    let _ = source.close().await;
    let _ = target.close().await;
    // Report the side that failed first: an importer that stops early (a non-empty target)
    // leaves the exporter complaining only of the closed pipe, and an exporter that fails
    // leaves the importer complaining only of a short stream.
    let (exported, imported) = match (exported, imported) {
        (Err(e), Err(MigrateError::CountMismatch { .. } | MigrateError::BadHeader(_))) => {
            return Err(e).with_context(|| format!("exporting {}", from.describe()))
        }
        (exported, imported) => (
            exported,
            imported.with_context(|| format!("importing into {}", to.describe()))?,
        ),
    };
    let exported = exported.with_context(|| format!("exporting {}", from.describe()))?;
    eprintln!(
        "copied {} keys from {} (revision {}) into {}{}",
        imported.count,
        from.describe(),
        exported.revision,
        to.describe(),
        if imported.overwritten > 0 {
            format!(", overwriting {}", imported.overwritten)
        } else {
            String::new()
        }
    );
    Ok(())
}
