//! `setpoint why <type>/<name>` and the `kubectl-why` plugin: asks the API server's write
//! trail why an object is as it is, and prints the causal chain (docs/why.md).
//!
//! The chain is built by the server (`/debug/setpoint/why`) from its write trail and the
//! decision records components push; this prints it. Shared by both binaries, so it uses
//! nothing else of the `setpoint` binary.

use std::path::PathBuf;

use anyhow::Context as _;
use setpoint_api::trail::{Explanation, WHY_PATH};
use setpoint_runtime::client::Kubeconfig;
use setpoint_runtime::Client;

/// Arguments of `setpoint why` and `kubectl why`.
#[derive(clap::Args, Clone, Debug)]
pub struct WhyArgs {
    /// The object: `<type>/<name>` (or the type and the name as two words); the type is a
    /// kind, plural, singular or short name (`pod`, `pods`, `po`, `deployment.apps`, a custom
    /// resource's names).
    #[arg(required = true, num_args = 1..=2)]
    pub object: Vec<String>,
    /// The object's namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The kubeconfig to use (default: `$KUBECONFIG`, then `~/.kube/config`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// `text` (the default) or `json` (the chain as the server answers it).
    #[arg(short = 'o', long, default_value = "text")]
    pub output: String,
}

/// The type and name `args.object` names.
fn target(object: &[String]) -> anyhow::Result<(String, String)> {
    match object {
        [one] => match one.split_once('/') {
            Some((t, n)) if !t.is_empty() && !n.is_empty() => Ok((t.into(), n.into())),
            _ => anyhow::bail!(
                "name the object as <type>/<name> or <type> <name>, e.g. pod/web-7d9-x"
            ),
        },
        [t, n] => Ok((t.clone(), n.clone())),
        _ => anyhow::bail!("name one object"),
    }
}

/// Asks the server and prints the chain.
pub async fn run(args: WhyArgs) -> anyhow::Result<()> {
    let (t, name) = target(&args.object)?;
    let client = match &args.kubeconfig {
        Some(p) => Client::from_kubeconfig(&Kubeconfig::read(p)?)?,
        None => Client::try_default()?,
    };
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("type", &t)
        .append_pair("namespace", &namespace)
        .append_pair("name", &name)
        .finish();
    let answer = client
        .request(
            http::Method::GET,
            &format!("{WHY_PATH}?{query}"),
            None,
            bytes::Bytes::new(),
        )
        .await
        .with_context(|| format!("asking the API server why {t}/{name}"))?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let e: Explanation =
        serde_json::from_value(answer).context("decoding the API server's answer")?;
    print!("{}", setpoint_api::trail::render(&e));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_named_by_type_and_name() {
        let one = |s: &str| target(&[s.to_string()]);
        assert_eq!(one("pod/web-1").unwrap(), ("pod".into(), "web-1".into()));
        assert_eq!(
            target(&["deploy".into(), "web".into()]).unwrap(),
            ("deploy".into(), "web".into())
        );
        assert!(one("pod").is_err());
        assert!(one("/web").is_err());
    }
}
