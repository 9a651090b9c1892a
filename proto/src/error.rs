//! Errors of decoding and checking formats.

/// Why bytes did not decode as the layout they were expected to hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("{what}: need {need} bytes, have {have}")]
    Short {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{what}: bad magic {found:#010x}")]
    BadMagic { what: &'static str, found: u32 },
    #[error("{what}: unsupported format version {found}")]
    BadVersion { what: &'static str, found: u8 },
    #[error("{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
    #[error("{what}: field {field} out of range ({value})")]
    Range {
        what: &'static str,
        field: &'static str,
        value: u64,
    },
    #[error("record is not the one asked for: {0}")]
    Mismatch(&'static str),
}
