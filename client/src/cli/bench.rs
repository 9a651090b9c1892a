//! `ferrite bench ...`: side-by-side benchmarks. With `--json` each prints
//! one JSON object per line: `{"name","unit","ferrite","peer","peer_name","ratio"}`.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Execution streams vs a tokio multi-thread runtime.
    Xstream(BenchXstreamArgs),
    /// The record store in-process: updates and fetches per xstream.
    Store(BenchStoreArgs),
    /// Key-value operations against an engine.
    Kv(BenchKvArgs),
    /// A random DAG of no-op tasks on workers.
    Jobs(BenchJobsArgs),
}

#[derive(clap::Args, Debug)]
pub struct BenchXstreamArgs {
    #[arg(long)]
    pub json: bool,
}
#[derive(clap::Args, Debug)]
pub struct BenchStoreArgs {
    #[arg(long)]
    pub json: bool,
}
pub use ferrite_client::bench_kv::BenchKvArgs;
#[derive(clap::Args, Debug)]
pub struct BenchJobsArgs {
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Xstream(_) => anyhow::bail!("bench xstream: not built yet"),
        BenchCommand::Store(_) => anyhow::bail!("bench store: not built yet"),
        BenchCommand::Kv(a) => ferrite_client::bench_kv::run(a),
        BenchCommand::Jobs(_) => anyhow::bail!("bench jobs: not built yet"),
    }
}
