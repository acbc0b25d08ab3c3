//! The `[auth]` section of the configuration (docs/config.md#auth): ingest
//! and metrics tokens, who may read, signed tokens (`[auth.jwt]`) and static
//! tokens with scopes (`[[auth.token]]`), with the checks that types alone
//! cannot make. The configuration file holds it as `Config::auth`.
//!
//! What it is not: the verification. [`super::Access`] is built from this
//! section and decides each request.

use pollbox_table::config::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Empty = ingest needs no token.
    pub ingest_tokens: Vec<String>,
    /// Empty = `/metrics` needs no token.
    pub metrics_tokens: Vec<String>,
    /// A file of more ingest tokens, one a line (`#` comments and blank
    /// lines skipped): a Kubernetes Secret mounted as a file, so tokens need
    /// not be in the config. Read at start; "" = none.
    pub ingest_tokens_file: String,
    /// The same for `/metrics`.
    pub metrics_tokens_file: String,
    /// Who may read boxes (polls, long-polls, event streams, many-box reads).
    pub read: ReadAccess,
    /// Signed tokens scoped to keys (docs/private-boxes.md).
    pub jwt: JwtConfig,
    /// Static tokens with scopes (`[[auth.token]]`).
    pub token: Vec<StaticTokenConfig>,
}

/// `auth.read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadAccess {
    /// Reads need no token (the default).
    #[default]
    Public,
    /// Reads need a token whose `read` scope matches the key.
    Token,
}

/// `[auth.jwt]`: signed tokens (JWS compact form) verified with a JWKS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// A JWKS (RFC 7517); "" = no signed tokens.
    pub keys_file: String,
    /// "" = `iss` not checked; else it must be this.
    pub issuer: String,
    /// "" = `aud` not checked; else it must be (or list) this.
    pub audience: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_s: u64,
    /// The cookie a token may come in ("" = none).
    pub cookie: String,
    /// Accept `?access_token=` (URLs get logged: off by default).
    pub query_param: bool,
    /// The text of `keys_file`, read at start by the caller (`Config::add_jwks`);
    /// never printed.
    #[serde(skip)]
    pub keys: String,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            keys_file: String::new(),
            issuer: String::new(),
            audience: String::new(),
            leeway_s: 30,
            cookie: "pollbox_token".into(),
            query_param: false,
            keys: String::new(),
        }
    }
}

/// One `[[auth.token]]`: a static bearer token with the scopes a signed
/// token's `pollbox` claim would carry.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StaticTokenConfig {
    /// The token itself, or "" with `token_file`.
    pub token: String,
    /// A file holding the token (its first non-comment line), read at start.
    pub token_file: String,
    /// Key patterns it may read: exact keys, prefixes ending in `*`, or `*`.
    pub read: Vec<String>,
    /// Key patterns it may write.
    pub write: Vec<String>,
}

impl AuthConfig {
    /// Whether writes need a token: ingest tokens, static tokens or signed
    /// tokens are configured.
    pub fn writes_need_token(&self) -> bool {
        !self.ingest_tokens.is_empty() || self.scoped_tokens()
    }

    /// Whether scoped tokens (signed or static) are configured.
    pub fn scoped_tokens(&self) -> bool {
        !self.jwt.keys_file.is_empty() || !self.token.is_empty()
    }

    /// Every value of `[auth]` that types alone cannot check; the first
    /// found wrong is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_tokens()?;
        self.validate_scoped()
    }

    /// `auth.ingest_tokens` and `auth.metrics_tokens`.
    fn check_tokens(&self) -> Result<(), ConfigError> {
        for (name, tokens) in [
            ("ingest_tokens", &self.ingest_tokens),
            ("metrics_tokens", &self.metrics_tokens),
        ] {
            for (i, t) in tokens.iter().enumerate() {
                if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(invalid(
                        format!("auth.{name}[{i}]"),
                        "a token must be non-empty visible ASCII",
                    ));
                }
            }
        }
        Ok(())
    }

    /// `auth.read`, `[auth.jwt]` and `[[auth.token]]`.
    fn validate_scoped(&self) -> Result<(), ConfigError> {
        let j = &self.jwt;
        if j.leeway_s > 3600 {
            return Err(invalid("auth.jwt.leeway_s", "must be 0 to 3600"));
        }
        // RFC 6265's cookie-name: a token (visible ASCII but separators).
        if !j
            .cookie
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
        {
            return Err(invalid(
                "auth.jwt.cookie",
                "a cookie name is visible ASCII without ()<>@,;:\\\"/[]?={}",
            ));
        }
        for (i, t) in self.token.iter().enumerate() {
            let at = |k: &str| format!("auth.token[{i}].{k}");
            match (t.token.is_empty(), t.token_file.is_empty()) {
                (true, true) => return Err(invalid(at("token"), "give `token` or `token_file`")),
                (false, false) => {
                    return Err(invalid(
                        at("token"),
                        "give `token` or `token_file`, not both",
                    ))
                }
                (false, true) if !t.token.bytes().all(|b| b.is_ascii_graphic()) => {
                    return Err(invalid(
                        at("token"),
                        "a token must be non-empty visible ASCII",
                    ))
                }
                _ => {}
            }
            if t.read.is_empty() && t.write.is_empty() {
                return Err(invalid(
                    at("read"),
                    "a token with no `read` and no `write` pattern grants nothing",
                ));
            }
            for (name, list) in [("read", &t.read), ("write", &t.write)] {
                for (n, p) in list.iter().enumerate() {
                    if let Err(reason) = super::Pattern::parse(p) {
                        return Err(invalid(format!("auth.token[{i}].{name}[{n}]"), reason));
                    }
                }
            }
        }
        if self.read == ReadAccess::Token && !self.scoped_tokens() {
            return Err(invalid(
                "auth.read",
                "\"token\" needs a way to grant reads: auth.jwt.keys_file or an [[auth.token]]",
            ));
        }
        Ok(())
    }
}
