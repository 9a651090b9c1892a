//! The TOML form of a device spec, for config files:
//!
//! ```toml
//! backend = "uring"
//! path = "/var/lib/ferrite/target-0.bdev"   # or `size` for malloc, `name` for spdk
//! size = "64G"
//! direct = true
//! sqpoll = false
//! ```
//!
//! It names the same things as the spec string
//! (`uring:/var/lib/ferrite/target-0.bdev?direct=1&size=64G&sqpoll=0`) and
//! opens through the same code.

use crate::spec::BdevSpec;
use crate::{BdevError, BdevRef, Result};
use std::collections::BTreeMap;

fn bad(text: &str, reason: impl Into<String>) -> BdevError {
    BdevError::BadSpec {
        spec: text.trim().to_string(),
        reason: reason.into(),
    }
}

/// What names the device for each backend (the part after `backend:`).
fn target_key(backend: &str) -> &'static str {
    match backend {
        "malloc" => "size",
        "spdk" => "name",
        _ => "path",
    }
}

fn value_string(text: &str, key: &str, v: &toml::Value) -> Result<String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Boolean(b) => Ok(if *b { "1" } else { "0" }.to_string()),
        other => Err(bad(
            text,
            format!("{key} = {other}: expected a string, integer or boolean"),
        )),
    }
}

impl BdevSpec {
    /// Parses the TOML form (a table with `backend` and the backend's
    /// target key; every other key is an option).
    pub fn from_toml(text: &str) -> Result<Self> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| bad(text, e.message().to_string()))?;
        let backend = match table.get("backend") {
            Some(toml::Value::String(b)) => b.clone(),
            Some(_) => return Err(bad(text, "backend must be a string")),
            None => return Err(bad(text, "missing `backend` (malloc, uring, pmem, spdk)")),
        };
        let key = target_key(&backend);
        let mut target = None;
        let mut options = BTreeMap::new();
        for (k, v) in &table {
            if k == "backend" {
                continue;
            }
            let s = value_string(text, k, v)?;
            if k == key {
                target = Some(s);
            } else {
                options.insert(k.clone(), s);
            }
        }
        let target =
            target.ok_or_else(|| bad(text, format!("missing `{key}` for backend {backend:?}")))?;
        if target.is_empty() {
            return Err(bad(text, format!("empty `{key}`")));
        }
        Ok(Self {
            backend,
            target,
            options,
        })
    }

    /// The spec string naming the same device.
    pub fn to_spec_string(&self) -> String {
        let mut s = format!("{}:{}", self.backend, self.target);
        let mut sep = '?';
        for (k, v) in &self.options {
            s.push(sep);
            s.push_str(k);
            s.push('=');
            s.push_str(v);
            sep = '&';
        }
        s
    }
}

/// Opens a device from its TOML form.
pub fn open_toml(text: &str) -> Result<BdevRef> {
    crate::open(&BdevSpec::from_toml(text)?.to_spec_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_string_forms_agree() {
        let t = BdevSpec::from_toml(
            "backend = \"uring\"\npath = \"/d/x\"\nsize = \"64G\"\ndirect = true\nqd = 32\n",
        )
        .unwrap();
        assert_eq!(t.to_spec_string(), "uring:/d/x?direct=1&qd=32&size=64G");
        assert_eq!(BdevSpec::parse(&t.to_spec_string()).unwrap(), t);
        let m = BdevSpec::from_toml("backend = \"malloc\"\nsize = \"1M\"").unwrap();
        assert_eq!(m.to_spec_string(), "malloc:1M");
    }

    #[test]
    fn toml_errors_are_clear() {
        let e = BdevSpec::from_toml("path = \"/x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing `backend`"), "{e}");
        let e = BdevSpec::from_toml("backend = \"uring\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing `path`"), "{e}");
        let e = BdevSpec::from_toml("backend = \"pmem\"\npath = [1]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected a string"), "{e}");
        assert!(BdevSpec::from_toml("backend = ").is_err());
    }

    #[test]
    fn opens_through_the_toml_form() {
        let dev = open_toml("backend = \"malloc\"\nsize = \"1M\"").unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        assert!(
            open_toml("backend = \"malloc\"\nsize = \"1000\"").is_err(),
            "not a block multiple"
        );
    }
}
