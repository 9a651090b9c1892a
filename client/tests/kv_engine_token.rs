//! Guards token authentication from the client side: with a token
//! configured, a TCP client holding it connects and works, a wrong token
//! and a missing token are refused with errors that say so, and the Unix
//! socket needs none.

mod kv_support;

use ferrite_client::client::{Client, ClientOptions, Key};
use kv_support::EngineProc;

fn with_token(token: Option<&str>) -> ClientOptions {
    ClientOptions {
        token: token.map(|t| t.as_bytes().to_vec()),
        ..ClientOptions::default()
    }
}

#[test]
fn token_is_required_on_tcp_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let engine =
        EngineProc::start_with(dir.path(), &["--token-file", token_file.to_str().unwrap()]);

    let ok = Client::connect_with(&engine.tcp, with_token(Some("s3cret-token"))).unwrap();
    let k = Key::new(1, 1, b"auth", b"");
    ok.put(&k, b"yes").unwrap();
    assert_eq!(ok.get(&k).unwrap().as_deref(), Some(&b"yes"[..]));

    let missing = Client::connect_with(&engine.tcp, with_token(None)).unwrap_err();
    assert!(
        missing.to_string().contains("requires a token"),
        "{missing}"
    );

    let wrong = Client::connect_with(&engine.tcp, with_token(Some("guess"))).unwrap_err();
    assert!(
        !wrong.to_string().is_empty()
            && !matches!(wrong, ferrite_client::client::Error::Url { .. }),
        "{wrong}"
    );

    let unix = Client::connect_with(&engine.unix, with_token(None)).unwrap();
    assert_eq!(unix.get(&k).unwrap().as_deref(), Some(&b"yes"[..]));
}
