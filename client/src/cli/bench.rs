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
    /// Nodes of the random DAG.
    #[arg(long, default_value_t = 1_000_000)]
    pub dag_tasks: usize,
    /// Cross-core round trips to time.
    #[arg(long, default_value_t = 20_000)]
    pub round_trips: usize,
    /// Empty tasks spawned per core.
    #[arg(long, default_value_t = 2_000_000)]
    pub spawns_per_core: usize,
    /// Seed of the random DAG and its ready order.
    #[arg(long, default_value_t = 0xF3_2217E)]
    pub seed: u64,
}
pub use ferrite_client::bench_kv::BenchKvArgs;
pub use ferrite_client::bench_store::BenchStoreArgs;
#[derive(clap::Args, Debug)]
pub struct BenchJobsArgs {
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub options: ferrite_client::bench_jobs::BenchJobsOptions,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Xstream(a) => {
            let options = ferrite_client::bench_xstream::XstreamBenchOptions {
                dag_tasks: a.dag_tasks,
                round_trips: a.round_trips,
                spawns_per_core: a.spawns_per_core,
                seed: a.seed,
                ..Default::default()
            };
            ferrite_client::bench_xstream::run(&options, a.json)
        }
        BenchCommand::Store(a) => ferrite_client::bench_store::run(a),
        BenchCommand::Kv(a) => ferrite_client::bench_kv::run(a),
        BenchCommand::Jobs(a) => crate::cli::job::bench(a),
    }
}
