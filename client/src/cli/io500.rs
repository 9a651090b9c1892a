//! `ferrite io500`.

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("io500: not built yet")
}
