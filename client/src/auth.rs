//! Finding the token an engine's TCP listener asks for. Every TCP listener
//! requires the token challenge-response (`ferrite_proto::rpc::handshake`);
//! the Unix socket admits peers by their uid instead and needs none.
//!
//! [`find_token`] looks, in this order, at:
//! 1. `--token-file PATH` (the `token_file` argument),
//! 2. `$FERRITE_TOKEN`, the token itself,
//! 3. `$FERRITE_TOKEN_FILE`, a file holding it,
//! 4. the engine's data dir: `DATA_DIR/engine.token` (the `data_dir`
//!    argument, e.g. `--data-dir`; else [`DEFAULT_DATA_DIR`] when that file
//!    exists), the file an engine creates on first start.
//!
//! A token file must be readable by its owner only (mode 0600 or stricter)
//! and an empty token is refused, wherever either comes from.
//!
//! ```
//! # use std::os::unix::fs::PermissionsExt;
//! let dir = tempfile::tempdir().unwrap();
//! let file = dir.path().join("engine.token");
//! std::fs::write(&file, "c0ffee\n").unwrap();
//! std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
//! let token = ferrite_client::auth::find_token(Some(&file), None).unwrap();
//! assert_eq!(token.as_deref(), Some(&b"c0ffee"[..]));
//! ```

use std::path::{Path, PathBuf};

use ferrite_proto::rpc::handshake::{check_token, read_token_file, TOKEN_FILE_NAME};

use crate::client::{Error, Result};

/// The environment variable holding the token itself.
pub const TOKEN_ENV: &str = "FERRITE_TOKEN";
/// The environment variable naming a token file.
pub const TOKEN_FILE_ENV: &str = "FERRITE_TOKEN_FILE";
/// Where an engine keeps its data when started as the README shows; its
/// token file is the last place [`find_token`] looks.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/ferrite";

/// The token to prove to an engine's TCP listener: from `token_file`,
/// `$FERRITE_TOKEN`, `$FERRITE_TOKEN_FILE`, or the token file in
/// `data_dir` (default [`DEFAULT_DATA_DIR`]), the first that is given.
/// `None` when none is. A token file that group or others may read, an
/// unreadable one that was named, and an empty token are errors.
pub fn find_token(token_file: Option<&Path>, data_dir: Option<&Path>) -> Result<Option<Vec<u8>>> {
    find_token_with(token_file, data_dir, |name| std::env::var_os(name))
}

/// [`find_token`] with the environment given by `env` (for tests).
pub fn find_token_with(
    token_file: Option<&Path>,
    data_dir: Option<&Path>,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Option<Vec<u8>>> {
    if let Some(path) = token_file {
        return read(path).map(Some);
    }
    if let Some(token) = env(TOKEN_ENV) {
        let token = token.into_encoded_bytes();
        check_token(&token, TOKEN_ENV).map_err(invalid)?;
        return Ok(Some(token));
    }
    if let Some(path) = env(TOKEN_FILE_ENV) {
        return read(Path::new(&path)).map(Some);
    }
    let path = match data_dir {
        Some(dir) => dir.join(TOKEN_FILE_NAME),
        None => PathBuf::from(DEFAULT_DATA_DIR).join(TOKEN_FILE_NAME),
    };
    match path.exists() {
        true => read(&path).map(Some),
        false => Ok(None),
    }
}

/// The sources [`find_token`] looks at, for an error saying none had one.
pub fn sources_looked_at(data_dir: Option<&Path>) -> String {
    let dir = data_dir.unwrap_or(Path::new(DEFAULT_DATA_DIR));
    format!(
        "--token-file, ${TOKEN_ENV}, ${TOKEN_FILE_ENV}, {}",
        dir.join(TOKEN_FILE_NAME).display()
    )
}

fn read(path: &Path) -> Result<Vec<u8>> {
    read_token_file(path).map_err(invalid)
}

fn invalid(e: impl ToString) -> Error {
    Error::InvalidArgument(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::os::unix::fs::PermissionsExt;

    fn token_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    /// Guards the documented order: flag, $FERRITE_TOKEN,
    /// $FERRITE_TOKEN_FILE, data dir; and that each source is checked.
    #[test]
    fn sources_are_tried_in_order_and_each_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let flag = token_file(dir.path(), "flag", "from-flag\n", 0o600);
        let env_file = token_file(dir.path(), "env", "from-env-file", 0o400);
        token_file(dir.path(), TOKEN_FILE_NAME, "from-data-dir\n", 0o600);
        let all = |name: &str| match name {
            TOKEN_ENV => Some(OsString::from("from-env")),
            TOKEN_FILE_ENV => Some(env_file.clone().into_os_string()),
            _ => None,
        };
        let no_token = |name: &str| all(name).filter(|_| name != TOKEN_ENV);
        let none = |_: &str| None;
        let found = |f: Option<&Path>, e: &dyn Fn(&str) -> Option<OsString>| {
            find_token_with(f, Some(dir.path()), e).unwrap()
        };
        assert_eq!(found(Some(&flag), &all).unwrap(), b"from-flag");
        assert_eq!(found(None, &all).unwrap(), b"from-env");
        assert_eq!(found(None, &no_token).unwrap(), b"from-env-file");
        assert_eq!(found(None, &none).unwrap(), b"from-data-dir");
        let empty_dir = tempfile::tempdir().unwrap();
        assert_eq!(
            find_token_with(None, Some(empty_dir.path()), none).unwrap(),
            None
        );

        let open = token_file(dir.path(), "open", "secret", 0o644);
        let e = find_token_with(Some(&open), None, none).unwrap_err();
        assert!(e.to_string().contains("0644"), "{e}");
        let empty_env = |name: &str| (name == TOKEN_ENV).then(OsString::new);
        let e = find_token_with(None, None, empty_env).unwrap_err();
        assert!(
            e.to_string().contains("FERRITE_TOKEN: the token is empty"),
            "{e}"
        );
        let missing = dir.path().join("missing");
        assert!(find_token_with(Some(&missing), None, none).is_err());
    }
}
