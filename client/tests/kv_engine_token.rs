//! Guards authentication from the client side: a TCP client holding the
//! token connects and works, a wrong or missing token is refused with an
//! error that says so; the CLI finds the token by `--token-file`,
//! `$FERRITE_TOKEN`, `$FERRITE_TOKEN_FILE` and `--data-dir`, and refuses a
//! token file others may read; a client holding a token refuses a TCP peer
//! that offers no authentication or cannot prove it holds the token (no
//! downgrade); and the Unix socket refuses peers of another uid unless
//! `--allow-uids` names it.

mod kv_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use ferrite_client::client::{Client, ClientOptions, Error, Key};
use ferrite_proto::rpc::handshake::{AUTH_NONE, AUTH_TOKEN_HMAC_SHA256};
use ferrite_proto::rpc::{self, Challenge, MessageType, Reply, Request, TargetInfo, Welcome};
use kv_support::EngineProc;

/// The uid (and gid) the refused peer runs as: `nobody`.
const OTHER_UID: u32 = 65534;

fn with_token(token: Option<&str>) -> ClientOptions {
    ClientOptions {
        token: token.map(|t| t.as_bytes().to_vec()),
        ..ClientOptions::default()
    }
}

fn owner_only(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn token_is_required_on_tcp_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    owner_only(&token_file);
    let engine =
        EngineProc::start_with(dir.path(), &["--token-file", token_file.to_str().unwrap()]);

    let ok = Client::connect_with(&engine.tcp, with_token(Some("s3cret-token"))).unwrap();
    let k = Key::new(1, 1, b"auth", b"");
    ok.put(&k, b"yes").unwrap();
    assert_eq!(ok.get(&k).unwrap().as_deref(), Some(&b"yes"[..]));

    if std::env::var_os("FERRITE_TOKEN").is_none()
        && std::env::var_os("FERRITE_TOKEN_FILE").is_none()
    {
        let missing = Client::connect_with(&engine.tcp, with_token(None)).unwrap_err();
        assert!(
            missing.to_string().contains("requires a token"),
            "{missing}"
        );
    }

    let wrong = Client::connect_with(&engine.tcp, with_token(Some("guess"))).unwrap_err();
    assert!(wrong.to_string().contains("wrong token proof"), "{wrong}");
    let empty = Client::connect_with(&engine.tcp, with_token(Some(""))).unwrap_err();
    assert!(matches!(empty, Error::Unauthenticated(_)), "{empty}");
    assert!(empty.to_string().contains("empty"), "{empty}");

    let unix = Client::connect_with(&engine.unix, with_token(None)).unwrap();
    assert_eq!(unix.get(&k).unwrap().as_deref(), Some(&b"yes"[..]));
}

/// Runs `ferrite stat --json` against `url` with `args`, `env` set and
/// the token variables otherwise cleared.
fn cli_stat(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrite"));
    cmd.args(["stat", "--json", "--engine", url]).args(args);
    cmd.env_remove("FERRITE_TOKEN")
        .env_remove("FERRITE_TOKEN_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running ferrite")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_cli_finds_the_token_by_flag_environment_and_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let (url, file) = (engine.tcp.as_str(), engine.token_file.to_str().unwrap());
    let token = String::from_utf8(engine.token.clone()).unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    for (args, env) in [
        (vec!["--token-file", file], vec![]),
        (vec![], vec![("FERRITE_TOKEN", token.as_str())]),
        (vec![], vec![("FERRITE_TOKEN_FILE", file)]),
        (vec!["--data-dir", dir_arg], vec![]),
    ] {
        let out = cli_stat(url, &args, &env);
        assert!(out.status.success(), "{args:?} {env:?}: {}", stderr(&out));
    }
    // The flag comes first: a wrong file there is not rescued by the env.
    let other = tempfile::tempdir().unwrap();
    let wrong = other.path().join("wrong");
    std::fs::write(&wrong, "not-the-token\n").unwrap();
    owner_only(&wrong);
    let env = [("FERRITE_TOKEN", token.as_str())];
    let out = cli_stat(url, &["--token-file", wrong.to_str().unwrap()], &env);
    assert!(
        stderr(&out).contains("wrong token proof"),
        "{}",
        stderr(&out)
    );

    // A token file others may read, and an empty token: refused by the client.
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = cli_stat(url, &["--token-file", wrong.to_str().unwrap()], &[]);
    assert!(
        !out.status.success() && stderr(&out).contains("0644"),
        "{}",
        stderr(&out)
    );
    let out = cli_stat(url, &[], &[("FERRITE_TOKEN", "")]);
    assert!(
        !out.status.success() && stderr(&out).contains("empty"),
        "{}",
        stderr(&out)
    );
    // Nothing anywhere (a data dir without a token file): says where it looked.
    let out = cli_stat(url, &["--data-dir", other.path().to_str().unwrap()], &[]);
    assert!(stderr(&out).contains("none was found"), "{}", stderr(&out));
}

/// A hostile TCP peer: answers the Hello with `challenge`, then, if a Login
/// comes, with a Welcome whose server proof is all zeros. Returns whether
/// a Login came.
fn fake_engine(listener: TcpListener, auth: u8) -> std::thread::JoinHandle<bool> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let Some((hello_kind, hello_id)) = read_frame(&mut s) else {
            return false;
        };
        let challenge = Reply::Challenge(Challenge {
            auth,
            server_nonce: [7; 16],
        });
        let mut out = Vec::new();
        rpc::encode_reply(hello_kind, hello_id, &challenge, &mut out);
        s.write_all(&out).unwrap();
        let Some((MessageType::Login, login_id)) = read_frame(&mut s) else {
            return false;
        };
        let welcome = Reply::Welcome(Welcome {
            flags: 0,
            served_by: 0,
            incarnation: 1,
            server_proof: [0; 32],
            targets: vec![TargetInfo {
                target: 0,
                xstream: 0,
                state: 0,
                core: None,
            }],
            regions: Vec::new(),
        });
        out.clear();
        rpc::encode_reply(MessageType::Login, login_id, &welcome, &mut out);
        let _ = s.write_all(&out);
        true
    })
}

/// Reads one request frame; None at EOF.
fn read_frame(s: &mut TcpStream) -> Option<(MessageType, u64)> {
    let mut head = [0u8; rpc::HEADER_BYTES];
    s.read_exact(&mut head).ok()?;
    let (header, len) = rpc::split_frame(&head, 1 << 16).ok()??;
    let mut body = vec![0u8; len - rpc::HEADER_BYTES];
    s.read_exact(&mut body).ok()?;
    let request = rpc::decode_request(&header, &body).ok()?;
    assert!(matches!(request, Request::Hello(_) | Request::Login(_)));
    Some((header.kind, header.request_id))
}

#[test]
fn a_client_holding_a_token_refuses_a_tcp_engine_without_auth_or_proof() {
    // AUTH_NONE over TCP: refused before any Login is sent.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("tcp://{}", listener.local_addr().unwrap());
    let fake = fake_engine(listener, AUTH_NONE);
    let e = Client::connect_with(&url, with_token(Some("held"))).unwrap_err();
    assert!(matches!(e, Error::Unauthenticated(_)), "{e}");
    assert!(e.to_string().contains("no authentication"), "{e}");
    assert!(!fake.join().unwrap(), "the client sent a Login anyway");

    // Asks for the token but cannot prove it holds it: refused.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("tcp://{}", listener.local_addr().unwrap());
    let fake = fake_engine(listener, AUTH_TOKEN_HMAC_SHA256);
    let e = Client::connect_with(&url, with_token(Some("held"))).unwrap_err();
    assert!(fake.join().unwrap(), "the fake saw the Login");
    assert!(matches!(e, Error::Unauthenticated(_)), "{e}");
    assert!(e.to_string().contains("bad server proof"), "{e}");
}

/// `ferrite stat` on `engine`'s Unix socket as [`OTHER_UID`], after
/// opening the data dir and socket to everyone (so only the engine's
/// credential check stands in the way).
fn stat_as_other_uid(engine: &EngineProc) -> Output {
    let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(&engine.dir, 0o755).unwrap();
    let sock = engine.unix.strip_prefix("unix://").unwrap();
    mode(Path::new(sock), 0o666).unwrap();
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(["stat", "--json", "--engine", &engine.unix])
        .uid(OTHER_UID)
        .gid(OTHER_UID)
        .current_dir("/")
        .output()
        .expect("running ferrite as another uid")
}

#[test]
fn unix_peers_of_another_uid_are_refused_unless_allowed() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: running a client as another uid needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProc::start(dir.path());
    let refused = stat_as_other_uid(&engine);
    let text = stderr(&refused);
    assert!(!refused.status.success(), "admitted: {text}");
    assert!(text.contains(&format!("uid {OTHER_UID}")), "{text}");
    assert!(
        text.contains("may not use this engine") && text.contains("status 3"),
        "{text}"
    );
    // The engine's own uid still gets in.
    let own = Client::connect(&engine.unix).unwrap();
    own.stat().unwrap();

    let allowed_dir = tempfile::tempdir().unwrap();
    let uid = OTHER_UID.to_string();
    let allowing = EngineProc::start_with(allowed_dir.path(), &["--allow-uids", &uid]);
    let admitted = stat_as_other_uid(&allowing);
    assert!(admitted.status.success(), "refused: {}", stderr(&admitted));
}
