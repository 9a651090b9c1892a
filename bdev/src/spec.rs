//! Opening a device from a spec string: `malloc:8G`,
//! `uring:/path[?size=64G&direct=1&sqpoll=0]`, `pmem:/path[?size=]`,
//! `spdk:<bdev name>`.

use crate::malloc::{MallocBdev, MALLOC_BLOCK_SIZE};
use crate::pmem::PmemBdev;
use crate::uring::{UringBdev, UringOptions};
use crate::{BdevError, BdevRef, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A parsed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevSpec {
    pub backend: String,
    /// Path (uring, pmem), size (malloc) or bdev name (spdk).
    pub target: String,
    pub options: BTreeMap<String, String>,
}

impl BdevSpec {
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |reason: &str| BdevError::BadSpec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let (backend, rest) = spec
            .split_once(':')
            .ok_or_else(|| bad("expected BACKEND:TARGET, e.g. malloc:1G or uring:/path"))?;
        let (target, query) = match rest.split_once('?') {
            Some((t, q)) => (t, Some(q)),
            None => (rest, None),
        };
        if target.is_empty() {
            return Err(bad("empty target after ':'"));
        }
        let mut options = BTreeMap::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad(&format!("option {pair:?} is not KEY=VALUE")))?;
            options.insert(k.to_string(), v.to_string());
        }
        Ok(Self {
            backend: backend.to_string(),
            target: target.to_string(),
            options,
        })
    }
}

/// Parses a size like `4096`, `64K`, `8M`, `8G`, `1T` (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Reads the options of a spec: each key at most once, unknown keys refused.
struct Options<'a> {
    spec: &'a str,
    parsed: &'a BdevSpec,
    known: &'static [&'static str],
}

impl Options<'_> {
    fn bad(&self, reason: String) -> BdevError {
        BdevError::BadSpec {
            spec: self.spec.to_string(),
            reason,
        }
    }
    fn check_known(&self) -> Result<()> {
        match self
            .parsed
            .options
            .keys()
            .find(|k| !self.known.contains(&k.as_str()))
        {
            Some(k) => Err(self.bad(format!(
                "unknown option {k:?} for {} (known: {})",
                self.parsed.backend,
                self.known.join(", ")
            ))),
            None => Ok(()),
        }
    }
    fn size(&self, key: &str) -> Result<Option<u64>> {
        match self.parsed.options.get(key) {
            None => Ok(None),
            Some(v) => parse_size(v)
                .map(Some)
                .ok_or_else(|| self.bad(format!("bad {key}={v:?}: expected e.g. 4096, 64K, 8G"))),
        }
    }
    fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.parsed.options.get(key).map(String::as_str) {
            None => Ok(default),
            Some("1" | "true") => Ok(true),
            Some("0" | "false") => Ok(false),
            Some(v) => Err(self.bad(format!("bad {key}={v:?}: expected 0 or 1"))),
        }
    }
}

fn open_uring(spec: &str, parsed: &BdevSpec) -> Result<BdevRef> {
    let o = Options {
        spec,
        parsed,
        known: &[
            "size",
            "direct",
            "sqpoll",
            "qd",
            "fixed",
            "buf",
            "park_us",
            "direct_from",
        ],
    };
    o.check_known()?;
    let d = UringOptions::default();
    let qd = o.size("qd")?.map_or(Ok(d.queue_depth), |q| {
        u32::try_from(q).map_err(|_| o.bad(format!("qd={q} is too large")))
    })?;
    let opts = UringOptions {
        size: o.size("size")?,
        direct: o.flag("direct", d.direct)?,
        sqpoll: o.flag("sqpoll", d.sqpoll)?,
        queue_depth: qd,
        fixed: o.flag("fixed", d.fixed)?,
        buf_size: o.size("buf")?.map_or(d.buf_size, |b| b as usize),
        direct_from: o.size("direct_from")?.map(|b| b as usize),
        park: o
            .size("park_us")?
            .map_or(d.park, std::time::Duration::from_micros),
    };
    Ok(Arc::new(UringBdev::open(
        spec,
        Path::new(&parsed.target),
        &opts,
    )?))
}

fn open_pmem(spec: &str, parsed: &BdevSpec) -> Result<BdevRef> {
    let o = Options {
        spec,
        parsed,
        known: &["size", "populate"],
    };
    o.check_known()?;
    let dev = PmemBdev::open(
        spec,
        Path::new(&parsed.target),
        o.size("size")?,
        o.flag("populate", true)?,
    )?;
    Ok(Arc::new(dev))
}

/// Opens a device from a spec string.
pub fn open(spec: &str) -> Result<BdevRef> {
    let parsed = BdevSpec::parse(spec)?;
    match parsed.backend.as_str() {
        "malloc" => {
            let size = parse_size(&parsed.target).ok_or_else(|| BdevError::BadSpec {
                spec: spec.to_string(),
                reason: format!("bad size {:?}", parsed.target),
            })?;
            Ok(Arc::new(MallocBdev::new(spec, size, MALLOC_BLOCK_SIZE)?))
        }
        "uring" => open_uring(spec, &parsed),
        "pmem" => open_pmem(spec, &parsed),
        #[cfg(feature = "spdk")]
        "spdk" => {
            let config = parsed.options.get("config").map(String::as_str);
            Ok(Arc::new(crate::spdk::SpdkBdev::open(
                &parsed.target,
                config,
            )?))
        }
        #[cfg(not(feature = "spdk"))]
        "spdk" => Err(BdevError::BadSpec {
            spec: spec.to_string(),
            reason: "this build has no SPDK support (cargo feature `spdk`)".into(),
        }),
        other => Err(BdevError::BadSpec {
            spec: spec.to_string(),
            reason: format!("unknown backend {other:?} (known: malloc, uring, pmem, spdk)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let s = BdevSpec::parse("uring:/tmp/x?size=64G&direct=1").unwrap();
        assert_eq!(s.backend, "uring");
        assert_eq!(s.target, "/tmp/x");
        assert_eq!(s.options["size"], "64G");
        assert!(BdevSpec::parse("nocolon").is_err());
        assert!(BdevSpec::parse("uring:").is_err());
        assert!(BdevSpec::parse("uring:/x?size").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }

    #[test]
    fn malloc_size_must_be_block_multiple() {
        assert!(open("malloc:1000").is_err());
        assert!(open("malloc:1M").is_ok());
        assert!(open("nvme:whatever").is_err());
    }

    #[test]
    fn file_specs_give_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let msg = |spec: String| match open(&spec) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{spec} opened"),
        };
        assert!(msg(format!("uring:{}", p.display())).contains("does not exist"));
        assert!(msg(format!("uring:{}?size=1000", p.display())).contains("multiple"));
        assert!(msg(format!("uring:{}?size=1M&bogus=1", p.display())).contains("unknown option"));
        assert!(msg(format!("uring:{}?size=1M&direct=2", p.display())).contains("direct"));
        assert!(msg(format!("pmem:{}?size=12345", p.display())).contains("multiple"));
        let dev = open(&format!("uring:{}?size=1M", p.display())).unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        // The file now exists: it reopens without size, also as pmem.
        assert_eq!(
            open(&format!("pmem:{}", p.display()))
                .unwrap()
                .block_count(),
            256
        );
    }
}
