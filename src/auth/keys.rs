//! The keys a token is checked with, and the one check (docs/tokens.md).
//!
//! The token's header picks the keys before any signature is checked: `HS256` goes to the
//! admission secrets only, `EdDSA`/`ES256`/`RS256` to the JWKS keys bound to that very
//! algorithm only, anything else (`none` among them) is refused. So an HS256 token is never
//! checked against a public key's bytes, and a public key never verifies a token of another
//! algorithm than its own (algorithm confusion). A `kid` in the header names the one key to
//! use; without one, each key of the family is tried.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use jsonwebtoken::errors::ErrorKind as K;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;

use super::{AdmissionClaims, AuthError};
use crate::config::{HmacKey, PublicKey, TokenConfig, ENV_ADMISSION_JWKS};

/// How often the JWKS file's size and modification time are looked at: a key an identity
/// provider publishes is taken within about a second, and a verification costs no `stat`.
const JWKS_RECHECK: Duration = Duration::from_secs(1);

/// Every key of the gateway and the checks each token passes.
pub(super) struct Keyring {
    /// The admission secrets, in the configured order.
    hmac: Vec<(Option<String>, DecodingKey)>,
    jwks: Option<JwksFile>,
    /// One validation per accepted algorithm (only that algorithm allowed in it).
    validations: Vec<(Algorithm, Validation)>,
}

impl Keyring {
    /// # Errors
    /// The JWKS file cannot be read or holds no usable key (config validation said so first).
    pub fn new(tokens: &TokenConfig) -> Result<Self, String> {
        let hmac = tokens
            .keys
            .iter()
            .map(|HmacKey { kid, secret }| {
                let key = DecodingKey::from_secret(secret.expose().as_bytes())
                    .expect("config validation guarantees a non-empty HMAC secret");
                (kid.clone(), key)
            })
            .collect();
        let jwks = tokens.jwks.as_deref().map(JwksFile::open).transpose()?;
        let validations = [Algorithm::HS256]
            .into_iter()
            .chain(crate::config::PUBLIC_ALGORITHMS)
            .map(|alg| (alg, validation(alg, tokens)))
            .collect();
        Ok(Keyring {
            hmac,
            jwks,
            validations,
        })
    }

    /// The token's claims once its signature and every configured check pass, and the JWKS
    /// generation it verified under (0: an admission secret, which never changes).
    pub fn check(&self, token: &str) -> Result<(AdmissionClaims, u64), AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Malformed)?;
        let validation = self
            .validations
            .iter()
            .find(|(alg, _)| *alg == header.alg)
            .map(|(_, v)| v)
            .ok_or(AuthError::UnsupportedAlgorithm)?;
        let kid = header.kid.as_deref();
        let named = |k: Option<&str>| kid.is_none_or(|kid| k == Some(kid));
        if header.alg == Algorithm::HS256 {
            let keys = self.hmac.iter().filter(|(k, _)| named(k.as_deref()));
            return first_that_verifies(token, keys.map(|(_, key)| key), validation)
                .map(|c| (c, 0));
        }
        let jwks = self.jwks.as_ref().ok_or(AuthError::UnsupportedAlgorithm)?;
        let (keys, generation) = jwks.current();
        let keys = keys
            .iter()
            .filter(|k| k.alg == header.alg && named(k.kid.as_deref()));
        first_that_verifies(token, keys.map(|k| &k.key), validation).map(|c| (c, generation))
    }

    /// The JWKS generation now (re-reading the file when due); 0 without a JWKS file.
    pub fn jwks_generation(&self) -> u64 {
        self.jwks.as_ref().map_or(0, |j| j.current().1)
    }
}

/// The claims under the first key whose signature verifies; a key that does not is passed
/// over (another may have signed), any other failure is the token's own and ends the search.
fn first_that_verifies<'a>(
    token: &str,
    keys: impl Iterator<Item = &'a DecodingKey>,
    validation: &Validation,
) -> Result<AdmissionClaims, AuthError> {
    let mut tried = false;
    for key in keys {
        tried = true;
        match jsonwebtoken::decode::<AdmissionClaims>(token, key, validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) if matches!(e.kind(), K::InvalidSignature) => continue,
            Err(e) => return Err(AuthError::from(&e)),
        }
    }
    Err(if tried {
        AuthError::BadSignature
    } else {
        AuthError::UnknownKey
    })
}

/// The checks of `alg`'s tokens: `exp` and `sub` required, `nbf` honoured, no leeway, `aud`
/// and `iss` checked (and then required) only when configured.
fn validation(alg: Algorithm, tokens: &TokenConfig) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = 0;
    v.validate_nbf = true;
    let mut required = vec!["exp", "sub"];
    match &tokens.audience {
        Some(aud) => {
            v.set_audience(&[aud]);
            required.push("aud");
        }
        // jsonwebtoken refuses any `aud` unless told which it expects: a token from an
        // identity provider always carries one.
        None => v.validate_aud = false,
    }
    if let Some(iss) = &tokens.issuer {
        v.set_issuer(&[iss]);
        required.push("iss");
    }
    v.set_required_spec_claims(&required);
    v
}

impl From<&jsonwebtoken::errors::Error> for AuthError {
    fn from(e: &jsonwebtoken::errors::Error) -> Self {
        match e.kind() {
            K::ExpiredSignature => AuthError::Expired,
            K::ImmatureSignature => AuthError::NotYetValid,
            K::InvalidSignature => AuthError::BadSignature,
            K::InvalidAudience => AuthError::WrongAudience,
            K::InvalidIssuer => AuthError::WrongIssuer,
            K::MissingRequiredClaim(c) if c == "aud" => AuthError::WrongAudience,
            K::MissingRequiredClaim(c) if c == "iss" => AuthError::WrongIssuer,
            K::InvalidAlgorithm => AuthError::UnsupportedAlgorithm,
            _ => AuthError::Malformed,
        }
    }
}

// === impl JwksFile ===

/// The JWKS file and the keys last read from it.
struct JwksFile {
    path: PathBuf,
    loaded: RwLock<Loaded>,
}

struct Loaded {
    keys: Arc<[PublicKey]>,
    /// Bumped on every change, so tokens verified under older keys are checked again (a key
    /// the identity provider withdrew stops verifying at once, cached or not).
    generation: u64,
    /// The file's modification time and size when last read.
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl JwksFile {
    fn open(path: &Path) -> Result<Self, String> {
        let stamp = stamp(path);
        let keys = crate::config::check_jwks_file(path)?;
        Ok(JwksFile {
            path: path.to_path_buf(),
            loaded: RwLock::new(Loaded {
                keys: keys.into(),
                generation: 1,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The keys now: the file is re-read when its stamp changed since the last look (at
    /// most once per [`JWKS_RECHECK`]); a file that no longer parses keeps the keys it had.
    fn current(&self) -> (Arc<[PublicKey]>, u64) {
        {
            let l = self.loaded.read();
            if l.checked.elapsed() < JWKS_RECHECK {
                return (l.keys.clone(), l.generation);
            }
        }
        let mut l = self.loaded.write();
        if l.checked.elapsed() >= JWKS_RECHECK {
            l.checked = Instant::now();
            let now = stamp(&self.path);
            if now != l.stamp {
                l.stamp = now;
                match crate::config::check_jwks_file(&self.path) {
                    Ok(keys) => {
                        tracing::info!(keys = keys.len(), path = %self.path.display(), "re-read the JWKS file");
                        l.keys = keys.into();
                        l.generation += 1;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "{ENV_ADMISSION_JWKS} changed and no longer reads; keeping the keys it had"
                    ),
                }
            }
        }
        (l.keys.clone(), l.generation)
    }
}
