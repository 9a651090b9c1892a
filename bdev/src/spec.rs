//! Opening a device from a spec string: `malloc:8G`,
//! `uring:/path[?size=64G&direct=1&sqpoll=0]`, `pmem:/path[?size=]`,
//! `spdk:<bdev name>`.

use crate::malloc::{MallocBdev, MALLOC_BLOCK_SIZE};
use crate::{BdevError, BdevRef, Result};
use std::collections::BTreeMap;
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
}
