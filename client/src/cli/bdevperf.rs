//! `ferrite bdevperf`.

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("bdevperf: not built yet")
}
