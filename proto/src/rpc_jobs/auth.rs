//! The token challenge-response that opens every job-service connection and
//! every verbs side-channel connection, before any other byte.
//!
//! ```text
//! client                                        service
//!   Hello     { magic, version, client_nonce }  ──▶          24 bytes
//!                                       ◀──  Challenge { magic, auth, server_nonce }  24 bytes
//!   Proof     { proof }                         ──▶          32 bytes
//!                                       ◀──  Verdict { status, server_proof }         36 bytes
//! ```
//!
//! The proofs are those of the RPC handshake (`rpc::handshake`) with labels
//! of their own per [`Service`], so a proof a client made for one service
//! (or for an engine's RPC listener) is never accepted by another:
//! `proof = HMAC-SHA256(token, "<login label>" ‖ server_nonce ‖ client_nonce)`,
//! `server_proof = HMAC-SHA256(token, "<engine label>" ‖ client_nonce ‖ server_nonce)`.
//! The token is mandatory: a service always challenges, and a client refuses
//! a service that does not (no downgrade) or whose `server_proof` is wrong.
//! Nonces come from the caller (both ends draw them from a CSPRNG), which
//! keeps this module free of randomness and devices, so it is tested over a
//! pair of TCP streams. Every byte is described in `proto/FORMAT.md`.

use std::io::{Read, Write};

use hmac::Mac;

use crate::rpc::handshake::{keyed_hash, NONCE_BYTES, PROOF_BYTES};

/// Which service a handshake opens; each has its magic and its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// The job service (`ferrite job …`, `ferrite worker`).
    Jobs,
    /// The verbs side channel (QP exchange, region descriptors).
    Verbs,
}

impl Service {
    fn magic(self) -> [u8; 4] {
        match self {
            Service::Jobs => *b"FJOB",
            Service::Verbs => *b"FVRB",
        }
    }
    fn login_label(self) -> &'static [u8] {
        match self {
            Service::Jobs => b"ferrite-jobs-login-v1",
            Service::Verbs => b"ferrite-verbs-login-v1",
        }
    }
    fn engine_label(self) -> &'static [u8] {
        match self {
            Service::Jobs => b"ferrite-jobs-engine-v1",
            Service::Verbs => b"ferrite-verbs-engine-v1",
        }
    }
}

/// Version of the handshake in Hello.
pub const AUTH_VERSION: u16 = 1;
/// Challenge `auth`: token HMAC-SHA256 (the only value a service sends).
pub const AUTH_TOKEN: u8 = 1;
/// Verdict `status` values.
pub const VERDICT_ACCEPTED: u8 = 0;
pub const VERDICT_REFUSED: u8 = 1;

pub const HELLO_BYTES: usize = 24;
pub const CHALLENGE_BYTES: usize = 24;
pub const VERDICT_BYTES: usize = 4 + PROOF_BYTES;
const _: () = assert!(HELLO_BYTES == 4 + 2 + 2 + NONCE_BYTES);
const _: () = assert!(CHALLENGE_BYTES == 4 + 1 + 3 + NONCE_BYTES);
const _: () = assert!(VERDICT_BYTES == 36);

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("handshake i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("an empty token is refused")]
    EmptyToken,
    #[error("peer is not a ferrite {0:?} endpoint (magic {1:02x?})")]
    BadMagic(Service, [u8; 4]),
    #[error("peer speaks handshake version {0}, this build {AUTH_VERSION}")]
    BadVersion(u16),
    #[error("service offers no token authentication (auth {0}): refused")]
    NoAuth(u8),
    #[error("token refused by the service")]
    Refused,
    #[error("client's token proof is wrong")]
    BadProof,
    #[error("service's proof is wrong: it does not hold this token")]
    BadServerProof,
    #[error("bad verdict status {0}")]
    BadVerdict(u8),
}

fn proof(service: Service, token: &[u8], server: &[u8; 16], client: &[u8; 16]) -> [u8; 32] {
    keyed_hash(token, service.login_label(), server, client)
        .finalize()
        .into_bytes()
        .into()
}

fn server_proof(service: Service, token: &[u8], server: &[u8; 16], client: &[u8; 16]) -> [u8; 32] {
    keyed_hash(token, service.engine_label(), client, server)
        .finalize()
        .into_bytes()
        .into()
}

fn nonce_at(buf: &[u8], at: usize) -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    n.copy_from_slice(&buf[at..at + NONCE_BYTES]);
    n
}

/// The client side: proves it holds `token` and checks that the service
/// does too. `client_nonce` must be fresh and random.
pub fn client_handshake<S: Read + Write>(
    stream: &mut S,
    service: Service,
    token: &[u8],
    client_nonce: [u8; NONCE_BYTES],
) -> Result<(), AuthError> {
    if token.is_empty() {
        return Err(AuthError::EmptyToken);
    }
    let mut hello = [0u8; HELLO_BYTES];
    hello[..4].copy_from_slice(&service.magic());
    hello[4..6].copy_from_slice(&AUTH_VERSION.to_le_bytes());
    hello[8..].copy_from_slice(&client_nonce);
    stream.write_all(&hello)?;
    stream.flush()?;
    let mut ch = [0u8; CHALLENGE_BYTES];
    stream.read_exact(&mut ch)?;
    check_magic(service, &ch)?;
    if ch[4] != AUTH_TOKEN {
        return Err(AuthError::NoAuth(ch[4]));
    }
    let server_nonce = nonce_at(&ch, 8);
    stream.write_all(&proof(service, token, &server_nonce, &client_nonce))?;
    stream.flush()?;
    let mut verdict = [0u8; VERDICT_BYTES];
    stream.read_exact(&mut verdict)?;
    match verdict[0] {
        VERDICT_ACCEPTED => {}
        VERDICT_REFUSED => return Err(AuthError::Refused),
        other => return Err(AuthError::BadVerdict(other)),
    }
    keyed_hash(token, service.engine_label(), &client_nonce, &server_nonce)
        .verify_slice(&verdict[4..])
        .map_err(|_| AuthError::BadServerProof)?;
    Ok(())
}

/// The service side: challenges the client and checks its proof; on a
/// wrong proof it sends a refusal and returns [`AuthError::BadProof`] (the
/// caller closes the connection). `server_nonce` must be fresh and random.
pub fn server_handshake<S: Read + Write>(
    stream: &mut S,
    service: Service,
    token: &[u8],
    server_nonce: [u8; NONCE_BYTES],
) -> Result<(), AuthError> {
    if token.is_empty() {
        return Err(AuthError::EmptyToken);
    }
    let mut hello = [0u8; HELLO_BYTES];
    stream.read_exact(&mut hello)?;
    check_magic(service, &hello)?;
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    if version != AUTH_VERSION {
        return Err(AuthError::BadVersion(version));
    }
    let client_nonce = nonce_at(&hello, 8);
    let mut ch = [0u8; CHALLENGE_BYTES];
    ch[..4].copy_from_slice(&service.magic());
    ch[4] = AUTH_TOKEN;
    ch[8..].copy_from_slice(&server_nonce);
    stream.write_all(&ch)?;
    stream.flush()?;
    let mut got = [0u8; PROOF_BYTES];
    stream.read_exact(&mut got)?;
    let ok = keyed_hash(token, service.login_label(), &server_nonce, &client_nonce)
        .verify_slice(&got)
        .is_ok();
    let mut verdict = [0u8; VERDICT_BYTES];
    if ok {
        verdict[4..].copy_from_slice(&server_proof(service, token, &server_nonce, &client_nonce));
    } else {
        verdict[0] = VERDICT_REFUSED;
    }
    stream.write_all(&verdict)?;
    stream.flush()?;
    match ok {
        true => Ok(()),
        false => Err(AuthError::BadProof),
    }
}

fn check_magic(service: Service, buf: &[u8]) -> Result<(), AuthError> {
    let mut magic = [0u8; 4];
    magic.copy_from_slice(&buf[..4]);
    match magic == service.magic() {
        true => Ok(()),
        false => Err(AuthError::BadMagic(service, magic)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    /// Runs a service handshake with `server_token` on one end of a
    /// loopback TCP pair and a client one with `client_token` on the other.
    fn pair(
        service: Service,
        client_service: Service,
        server_token: &'static [u8],
        client_token: &'static [u8],
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            server_handshake(&mut s, service, server_token, [7; 16])
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let client = client_handshake(&mut c, client_service, client_token, [9; 16]);
        drop(c);
        (server.join().unwrap(), client)
    }

    #[test]
    fn the_same_token_is_accepted_by_both_ends() {
        // Guards the happy path: both ends hold the token, both succeed.
        let (s, c) = pair(Service::Jobs, Service::Jobs, b"tok", b"tok");
        assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
        let (s, c) = pair(Service::Verbs, Service::Verbs, b"tok", b"tok");
        assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
    }

    #[test]
    fn a_wrong_token_is_refused_at_both_ends() {
        // Guards the check itself: a client without the token gets a
        // refusal, and the service reports the bad proof.
        let (s, c) = pair(Service::Jobs, Service::Jobs, b"tok", b"guess");
        assert!(matches!(s, Err(AuthError::BadProof)), "{s:?}");
        assert!(matches!(c, Err(AuthError::Refused)), "{c:?}");
    }

    #[test]
    fn a_proof_for_one_service_is_not_one_for_another() {
        // Guards the labels: the same token and nonces give different
        // proofs per service and for the RPC login, so none can be replayed.
        let (s, n) = ([1u8; 16], [2u8; 16]);
        let jobs = proof(Service::Jobs, b"t", &s, &n);
        assert_ne!(jobs, proof(Service::Verbs, b"t", &s, &n));
        assert_ne!(jobs, crate::rpc::handshake::login_proof(b"t", &s, &n));
        let (srv, cli) = pair(Service::Verbs, Service::Jobs, b"t", b"t");
        assert!(srv.is_err() && cli.is_err());
    }

    #[test]
    fn empty_tokens_and_silent_services_are_refused() {
        // Guards no-downgrade: an empty token never authenticates, and a
        // client refuses a peer whose challenge offers no authentication.
        let (_, c) = pair(Service::Jobs, Service::Jobs, b"tok", b"");
        assert!(matches!(c, Err(AuthError::EmptyToken)), "{c:?}");
        let mut no_auth = Vec::new();
        no_auth.extend_from_slice(b"FJOB");
        no_auth.extend_from_slice(&[0u8; 20]);
        let mut io = Duplex(std::io::Cursor::new(no_auth), Vec::new());
        let r = client_handshake(&mut io, Service::Jobs, b"tok", [3; 16]);
        assert!(matches!(r, Err(AuthError::NoAuth(0))), "{r:?}");
    }

    /// Reads from a script, records writes.
    struct Duplex(std::io::Cursor<Vec<u8>>, Vec<u8>);
    impl Read for Duplex {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(b)
        }
    }
    impl Write for Duplex {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.1.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
