//! `kubectl-why`: the `kubectl why <type>/<name>` plugin (kubectl runs `kubectl-why` from
//! the PATH for `kubectl why`); the same command as `setpoint why` (docs/why.md).

mod why_cmd;

use clap::Parser;

/// Why is this object as it is: the writes that made it, the decisions behind them and
/// what woke those decisions.
#[derive(Parser)]
#[command(name = "kubectl why", version)]
struct Cli {
    #[command(flatten)]
    args: why_cmd::WhyArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(why_cmd::run(cli.args))
}
