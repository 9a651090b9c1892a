//! `ferrite put|get|del|ls|stat`: one request each against `--engine URL`
//! (`tcp://host:port` or `unix:///path`). Without `--engine` an engine is
//! started in this process on a temp directory and discarded at exit (for
//! demos). A KEY is the dkey of `(--container, --object)`, akey `--akey`.
//! Over TCP the token is found by [`ferrite_client::auth::find_token`]:
//! `--token-file`, `$FERRITE_TOKEN`, `$FERRITE_TOKEN_FILE`, then the
//! engine's data dir (`--data-dir`, default /var/lib/ferrite).

use std::io::Write;

use anyhow::Context;
use ferrite_client::client::{Client, Key};

/// Where to connect and which object the key lives in.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// Engine URL; none = a throwaway embedded engine.
    #[arg(long)]
    pub engine: Option<String>,
    #[command(flatten)]
    pub auth: super::TokenArgs,
    #[arg(long, default_value_t = 0)]
    pub container: u64,
    #[arg(long, default_value_t = 0)]
    pub object: u128,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct PutArgs {
    #[command(flatten)]
    pub target: Target,
    pub key: String,
    /// The value; `-` reads it from stdin.
    pub value: String,
    #[arg(long, default_value = "")]
    pub akey: String,
    /// Only if the key's current version is this (0 = must be absent).
    #[arg(long)]
    pub if_version: Option<u64>,
}
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    pub target: Target,
    pub key: String,
    #[arg(long, default_value = "")]
    pub akey: String,
}
#[derive(clap::Args, Debug)]
pub struct DelArgs {
    #[command(flatten)]
    pub target: Target,
    pub key: String,
    #[arg(long, default_value = "")]
    pub akey: String,
}
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    #[command(flatten)]
    pub target: Target,
    /// List the akeys of this dkey instead of the object's dkeys.
    #[arg(long)]
    pub dkey: Option<String>,
}
#[derive(clap::Args, Debug)]
pub struct StatArgs {
    #[command(flatten)]
    pub target: Target,
}

fn connect(t: &Target) -> anyhow::Result<Client> {
    let mut opts = ferrite_client::client::ClientOptions {
        connections: 1,
        ..Default::default()
    };
    match &t.engine {
        Some(url) => {
            opts.token = t.auth.token_for(url)?;
            Client::connect_with(url, opts).with_context(|| format!("connecting to {url}"))
        }
        None => embedded(opts),
    }
}

#[cfg(feature = "embedded")]
fn embedded(opts: ferrite_client::client::ClientOptions) -> anyhow::Result<Client> {
    eprintln!("ferrite: no --engine given: using a throwaway embedded engine");
    Ok(ferrite_client::embedded::connect_with(opts, |_| {})?)
}

#[cfg(not(feature = "embedded"))]
fn embedded(_: ferrite_client::client::ClientOptions) -> anyhow::Result<Client> {
    anyhow::bail!("no --engine given and this ferrite is built without the embedded engine")
}

fn key(t: &Target, dkey: &str, akey: &str) -> Key {
    Key::new(t.container, t.object, dkey.as_bytes(), akey.as_bytes())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn put(a: PutArgs) -> anyhow::Result<()> {
    let value = if a.value == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v).context("reading stdin")?;
        v
    } else {
        a.value.clone().into_bytes()
    };
    let client = connect(&a.target)?;
    let k = key(&a.target, &a.key, &a.akey);
    let version = match a.if_version {
        Some(expected) => client.put_if_version(&k, expected, &value)?,
        None => client.put(&k, &value)?,
    };
    if a.target.json {
        println!("{}", serde_json::json!({"key": a.key, "version": version}));
    } else {
        println!("{version}");
    }
    Ok(())
}

pub fn get(a: GetArgs) -> anyhow::Result<()> {
    let client = connect(&a.target)?;
    let found = client.get_versioned(&key(&a.target, &a.key, &a.akey))?;
    let Some(found) = found else {
        if a.target.json {
            println!("{}", serde_json::json!({"key": a.key, "found": false}));
            return Ok(());
        }
        anyhow::bail!("{}: not found", a.key);
    };
    if a.target.json {
        let v = serde_json::json!({"key": a.key, "found": true, "version": found.version,
            "value": text(&found.value)});
        println!("{v}");
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(&found.value)?;
        if std::io::IsTerminal::is_terminal(&out) {
            writeln!(out)?;
        }
    }
    Ok(())
}

pub fn del(a: DelArgs) -> anyhow::Result<()> {
    let client = connect(&a.target)?;
    let version = client.delete(&key(&a.target, &a.key, &a.akey))?;
    if a.target.json {
        println!("{}", serde_json::json!({"key": a.key, "version": version}));
    }
    Ok(())
}

pub fn ls(a: LsArgs) -> anyhow::Result<()> {
    let client = connect(&a.target)?;
    let t = &a.target;
    let keys = match &a.dkey {
        Some(d) => client.list_akeys(t.container, t.object, d.as_bytes())?,
        None => client.list_dkeys(t.container, t.object)?,
    };
    if t.json {
        let names: Vec<String> = keys.iter().map(|k| text(k)).collect();
        println!("{}", serde_json::json!({"keys": names}));
    } else {
        for k in keys {
            println!("{}", text(&k));
        }
    }
    Ok(())
}

pub fn stat(a: StatArgs) -> anyhow::Result<()> {
    let client = connect(&a.target)?;
    let s = client.stat()?;
    let targets: Vec<_> = s
        .targets
        .iter()
        .map(|t| {
            let counters: serde_json::Map<String, serde_json::Value> = s
                .target_counters
                .iter()
                .find(|c| c.target == t.target)
                .map(|c| {
                    c.counters
                        .iter()
                        .map(|(k, v)| (k.clone(), (*v).into()))
                        .collect()
                })
                .unwrap_or_default();
            serde_json::json!({"target": t.target, "xstream": t.xstream,
                "state": if t.state == 0 { "serving" } else { "read-only" }, "counters": counters})
        })
        .collect();
    let regions: Vec<_> = s
        .regions
        .iter()
        .map(|r| {
            serde_json::json!({"region_id": r.region_id, "target": r.target,
                "provider": format!("{:?}", r.provider).to_lowercase(),
                "kind": format!("{:?}", r.kind).to_lowercase(), "length": r.length, "param": r.param})
        })
        .collect();
    let v = serde_json::json!({"engine": s.url, "incarnation": s.incarnation,
        "one_sided": s.one_sided_provider, "targets": targets, "regions": regions});
    if a.target.json {
        println!("{v}");
    } else {
        println!("engine {} (incarnation {:016x})", s.url, s.incarnation);
        println!("one-sided GET: {}", s.one_sided_provider.unwrap_or("off"));
        for t in &targets {
            println!("target {}: {}", t["target"], t);
        }
        for r in &regions {
            println!("region {}", r);
        }
    }
    Ok(())
}
