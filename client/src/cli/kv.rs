//! `ferrite put|get|del|ls|stat`.

#[derive(clap::Args, Debug)]
pub struct PutArgs {
    #[arg(long)]
    pub engine: Option<String>,
}
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    #[arg(long)]
    pub engine: Option<String>,
}
#[derive(clap::Args, Debug)]
pub struct DelArgs {
    #[arg(long)]
    pub engine: Option<String>,
}
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    #[arg(long)]
    pub engine: Option<String>,
}
#[derive(clap::Args, Debug)]
pub struct StatArgs {
    #[arg(long)]
    pub engine: Option<String>,
}

pub fn put(_a: PutArgs) -> anyhow::Result<()> {
    anyhow::bail!("put: not built yet")
}
pub fn get(_a: GetArgs) -> anyhow::Result<()> {
    anyhow::bail!("get: not built yet")
}
pub fn del(_a: DelArgs) -> anyhow::Result<()> {
    anyhow::bail!("del: not built yet")
}
pub fn ls(_a: LsArgs) -> anyhow::Result<()> {
    anyhow::bail!("ls: not built yet")
}
pub fn stat(_a: StatArgs) -> anyhow::Result<()> {
    anyhow::bail!("stat: not built yet")
}
