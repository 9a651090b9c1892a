//! `ferrite job ...` and `ferrite worker`.

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// Submit a job file (TOML or JSON).
    Submit { file: std::path::PathBuf },
}
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[arg(long)]
    pub engine: Option<String>,
}

pub fn run(_c: JobCommand) -> anyhow::Result<()> {
    anyhow::bail!("job: not built yet")
}
pub fn worker(_a: WorkerArgs) -> anyhow::Result<()> {
    anyhow::bail!("worker: not built yet")
}
