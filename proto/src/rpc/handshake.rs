//! The connection handshake and its token authentication.
//!
//! ```text
//! client                                   engine
//!   Hello { flags, client_nonce }   ──▶
//!                                   ◀──   Hello reply = Challenge { auth, server_nonce }
//!   Login { proof }                 ──▶   (proof checked when auth is required)
//!                                   ◀──   Login reply = Welcome { targets, regions, server_proof }
//! ```
//!
//! `proof = HMAC-SHA256(token, "ferrite-login-v1" ‖ server_nonce ‖ client_nonce)`
//! and `server_proof = HMAC-SHA256(token, "ferrite-engine-v1" ‖ client_nonce ‖
//! server_nonce)`: the token never crosses the wire, the nonces make every
//! proof single-use, and the client can check that the engine holds the token
//! too. Without auth both proofs are all zero.
//!
//! Every TCP listener requires the token; a Unix socket admits a peer by
//! its credentials (`SO_PEERCRED`) and offers [`AUTH_NONE`]. A client that
//! holds a token refuses a TCP engine offering [`AUTH_NONE`] (no
//! downgrade). The token is the text of a token file ([`read_token_file`]),
//! which the engine creates in its data dir ([`TOKEN_FILE_NAME`]) when none
//! is configured.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::codec::{len_u16, Put, Reader};
use crate::region::{RegionDescriptor, DESCRIPTOR_BYTES};
use crate::FormatError;

pub const NONCE_BYTES: usize = 16;
pub const PROOF_BYTES: usize = 32;
/// Most regions one Welcome may list (also the SCM_RIGHTS fd limit).
pub const REGIONS_MAX: usize = 253;
/// Most targets one engine may have.
pub const TARGETS_MAX: usize = 1024;

/// Hello flag: the client can map shm regions (Unix socket only).
pub const HELLO_WANT_SHM: u32 = 1;
/// Hello flag: the client attaches the fd of its bulk region (a sealed
/// memfd) to its Login frame (Unix socket only).
pub const HELLO_BULK_REGION: u32 = 1 << 1;
/// Welcome flag: one fd per shm region rides on this frame (SCM_RIGHTS).
pub const WELCOME_FDS_ATTACHED: u16 = 1;
/// Welcome flag: `served_by` names the xstream serving this connection.
pub const WELCOME_SERVED_BY: u16 = 1 << 1;
/// Welcome flag: the engine mapped the client's bulk region; BulkWrite and
/// BulkRead may be sent on this connection.
pub const WELCOME_BULK_MAPPED: u16 = 1 << 2;

/// Challenge `auth` values.
pub const AUTH_NONE: u8 = 0;
pub const AUTH_TOKEN_HMAC_SHA256: u8 = 1;

const LOGIN_LABEL: &[u8] = b"ferrite-login-v1";
const ENGINE_LABEL: &[u8] = b"ferrite-engine-v1";

type HmacSha256 = Hmac<Sha256>;

/// The token file an engine creates in its data dir when no token is
/// configured: [`GENERATED_TOKEN_BYTES`] random bytes as lowercase hex and
/// a newline, mode 0600.
pub const TOKEN_FILE_NAME: &str = "engine.token";
/// Random bytes behind a generated token (64 hex digits).
pub const GENERATED_TOKEN_BYTES: usize = 32;

/// Why a token or token file is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// An empty token (or a file holding only whitespace) proves nothing.
    #[error("{0}: the token is empty")]
    Empty(String),
    /// A token file that others than its owner may read is no secret.
    #[error("token file {path}: mode {mode:04o} lets group or others read it (chmod 600 it)")]
    TooOpen { path: String, mode: u32 },
    /// The file could not be read.
    #[error("token file {path}: {reason}")]
    Unreadable { path: String, reason: String },
}

/// Checks a token given as text or bytes (`what` names where it came from).
pub fn check_token(token: &[u8], what: &str) -> Result<(), TokenError> {
    if token.iter().all(u8::is_ascii_whitespace) {
        return Err(TokenError::Empty(what.to_string()));
    }
    Ok(())
}

/// Reads a token file: its text with trailing whitespace cut. Refused when
/// group or others may read, write or run it, or when it is empty.
pub fn read_token_file(path: &std::path::Path) -> Result<Vec<u8>, TokenError> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display().to_string();
    let unreadable = |e: std::io::Error| TokenError::Unreadable {
        path: shown.clone(),
        reason: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mode = file.metadata().map_err(unreadable)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TokenError::TooOpen { path: shown, mode });
    }
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(&file, 64 << 10), &mut text)
        .map_err(unreadable)?;
    let len = text
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    text.truncate(len);
    check_token(&text, &format!("token file {shown}"))?;
    Ok(text)
}

pub(crate) fn keyed_hash(token: &[u8], label: &[u8], first: &[u8], second: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of every length, so `new_from_slice` cannot fail.
    let mut mac = match HmacSha256::new_from_slice(token) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(label);
    mac.update(first);
    mac.update(second);
    mac
}

/// The client's proof of holding `token`.
pub fn login_proof(
    token: &[u8],
    server_nonce: &[u8; NONCE_BYTES],
    client_nonce: &[u8; NONCE_BYTES],
) -> [u8; PROOF_BYTES] {
    keyed_hash(token, LOGIN_LABEL, server_nonce, client_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a client's proof in constant time.
pub fn verify_login_proof(
    token: &[u8],
    server_nonce: &[u8; NONCE_BYTES],
    client_nonce: &[u8; NONCE_BYTES],
    proof: &[u8; PROOF_BYTES],
) -> bool {
    keyed_hash(token, LOGIN_LABEL, server_nonce, client_nonce)
        .verify_slice(proof)
        .is_ok()
}

/// The engine's proof of holding `token`, sent in the Welcome.
pub fn engine_proof(
    token: &[u8],
    server_nonce: &[u8; NONCE_BYTES],
    client_nonce: &[u8; NONCE_BYTES],
) -> [u8; PROOF_BYTES] {
    keyed_hash(token, ENGINE_LABEL, client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .into()
}

/// Hello: 20 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub flags: u32,
    pub client_nonce: [u8; NONCE_BYTES],
}

impl Hello {
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u32(self.flags);
        out.put_bytes(&self.client_nonce);
    }
    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, FormatError> {
        Ok(Self {
            flags: r.u32()?,
            client_nonce: r.array()?,
        })
    }
}

/// Reply to Hello: 20 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// [`AUTH_NONE`] or [`AUTH_TOKEN_HMAC_SHA256`].
    pub auth: u8,
    pub server_nonce: [u8; NONCE_BYTES],
}

impl Challenge {
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u8(self.auth);
        out.put_bytes(&[0; 3]);
        out.put_bytes(&self.server_nonce);
    }
    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, FormatError> {
        let auth = r.u8()?;
        if auth > AUTH_TOKEN_HMAC_SHA256 {
            return Err(r.range("auth", u64::from(auth)));
        }
        let _reserved = r.bytes(3)?;
        Ok(Self {
            auth,
            server_nonce: r.array()?,
        })
    }
}

/// Login: 32 bytes, the proof (zeros when no auth is required).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Login {
    pub proof: [u8; PROOF_BYTES],
}

/// One entry of the target map: 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetInfo {
    pub target: u16,
    /// The xstream serving the target.
    pub xstream: u16,
    /// 0 = serving, 1 = read-only (poisoned after a device error).
    pub state: u8,
    /// The CPU that xstream is pinned to, when the engine says (engines
    /// before this field send none). A client on the engine's host keeps
    /// its busy-polling off these CPUs.
    pub core: Option<u16>,
}

/// [`TargetInfo`] flag byte: `core` is set.
const TARGET_CORE_SET: u8 = 1;

/// Reply to Login: the engine's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// [`WELCOME_FDS_ATTACHED`] when shm fds ride on this frame,
    /// [`WELCOME_SERVED_BY`] when `served_by` is set.
    pub flags: u16,
    /// The xstream that runs this connection's requests: a client that sends
    /// each request on a connection served by the owning target's xstream
    /// spares the engine a hop between xstreams. Meaningful with
    /// [`WELCOME_SERVED_BY`] only.
    pub served_by: u16,
    /// Random per engine start; a change tells a client the engine restarted.
    pub incarnation: u64,
    pub server_proof: [u8; PROOF_BYTES],
    pub targets: Vec<TargetInfo>,
    pub regions: Vec<RegionDescriptor>,
}

impl Welcome {
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u16(self.flags);
        out.put_u16(len_u16(self.targets.len()));
        out.put_u16(len_u16(self.regions.len()));
        out.put_u16(self.served_by);
        out.put_u64(self.incarnation);
        out.put_bytes(&self.server_proof);
        for t in &self.targets {
            out.put_u16(t.target);
            out.put_u16(t.xstream);
            out.put_u8(t.state);
            out.put_u8(if t.core.is_some() { TARGET_CORE_SET } else { 0 });
            out.put_u16(t.core.unwrap_or(0));
        }
        for d in &self.regions {
            out.put_bytes(&d.encode());
        }
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Result<Self, FormatError> {
        let flags = r.u16()?;
        let target_count = usize::from(r.u16()?);
        let region_count = usize::from(r.u16()?);
        let served_by = r.u16()?;
        if target_count == 0 || target_count > TARGETS_MAX {
            return Err(r.range("target_count", target_count as u64));
        }
        if region_count > REGIONS_MAX {
            return Err(r.range("region_count", region_count as u64));
        }
        let incarnation = r.u64()?;
        let server_proof = r.array()?;
        let mut targets = Vec::with_capacity(target_count);
        for _ in 0..target_count {
            let (target, xstream, state) = (r.u16()?, r.u16()?, r.u8()?);
            let (flags, core) = (r.u8()?, r.u16()?);
            targets.push(TargetInfo {
                target,
                xstream,
                state,
                core: (flags & TARGET_CORE_SET != 0).then_some(core),
            });
        }
        let mut regions = Vec::with_capacity(region_count);
        for _ in 0..region_count {
            regions.push(RegionDescriptor::decode(r.bytes(DESCRIPTOR_BYTES)?)?);
        }
        Ok(Self {
            flags,
            served_by,
            incarnation,
            server_proof,
            targets,
            regions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_token_and_nonces() {
        let (s, c) = ([1u8; 16], [2u8; 16]);
        let p = login_proof(b"secret", &s, &c);
        assert!(verify_login_proof(b"secret", &s, &c, &p));
        assert!(!verify_login_proof(b"secreT", &s, &c, &p));
        assert!(!verify_login_proof(b"secret", &c, &s, &p));
        assert_ne!(engine_proof(b"secret", &s, &c), p);
    }

    #[test]
    fn token_files_that_others_read_or_that_are_empty_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TOKEN_FILE_NAME);
        std::fs::write(&path, "abc123\n").unwrap();
        let set = |mode| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
        set(0o600).unwrap();
        assert_eq!(read_token_file(&path).unwrap(), b"abc123");
        set(0o640).unwrap();
        let e = read_token_file(&path).unwrap_err();
        assert!(matches!(e, TokenError::TooOpen { mode: 0o640, .. }), "{e}");
        set(0o604).unwrap();
        assert!(read_token_file(&path).is_err());
        set(0o600).unwrap();
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(read_token_file(&path), Err(TokenError::Empty(_))));
        assert!(check_token(b"", "FERRITE_TOKEN").is_err());
        let missing = read_token_file(&dir.path().join("none")).unwrap_err();
        assert!(matches!(missing, TokenError::Unreadable { .. }));
    }
}
