//! `ferrite mount|umount`.

#[derive(clap::Args, Debug)]
pub struct MountArgs {
    pub mountpoint: std::path::PathBuf,
}
#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    pub mountpoint: std::path::PathBuf,
}

pub fn mount(_a: MountArgs) -> anyhow::Result<()> {
    anyhow::bail!("mount: not built yet")
}
pub fn umount(_a: UmountArgs) -> anyhow::Result<()> {
    anyhow::bail!("umount: not built yet")
}
