//! The keys and checks of tokens: the admission secrets (several, for rotation, each
//! optionally named by a `kid`), the JWKS file of an identity provider's public keys, and the
//! audience and issuer a token must name when they are configured (API.md "Conventions").

use std::path::{Path, PathBuf};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

use super::{
    RawConfig, Secret, ENV_ADMISSION_JWKS, ENV_ADMISSION_SECRET, ENV_TOKEN_AUDIENCE,
    ENV_TOKEN_ISSUER, MIN_SECRET_BYTES,
};

/// More keys than this is a mistake, not a rotation (each key without a `kid` in a token is
/// tried in turn).
pub const MAX_ADMISSION_SECRETS: usize = 8;

/// One HS256 secret of `DROPGATE_ADMISSION_SECRET`.
#[derive(Debug, Clone)]
pub struct HmacKey {
    /// The `kid` a token's header names to pick this key; `None`: tried for tokens naming none.
    pub kid: Option<String>,
    pub secret: Secret,
}

/// How tokens are checked: built once from the configuration.
#[derive(Debug, Clone)]
pub struct TokenConfig {
    /// Every secret; the first signs what the gateway mints (admission tokens of a queue).
    pub keys: Vec<HmacKey>,
    /// A JWKS file of public keys (EdDSA, ES256, RS256), re-read when it changes.
    pub jwks: Option<PathBuf>,
    /// When set, every token must carry this `aud` (a string, or an array containing it).
    pub audience: Option<String>,
    /// When set, every token must carry this `iss`.
    pub issuer: Option<String>,
}

impl TokenConfig {
    /// The key of what the gateway signs.
    pub fn signing(&self) -> &HmacKey {
        &self.keys[0]
    }

    /// The key that derives waiting-room tickets: the last (oldest) secret, so that putting a
    /// new secret first (a rotation's first step) changes no visitor's ticket; a ticket id
    /// changes only when that oldest secret is dropped (docs/tokens.md "Rotation").
    pub fn ticket_secret(&self) -> &Secret {
        &self.keys[self.keys.len() - 1].secret
    }
}

/// A `kid` as the configuration takes one: what identity providers use, no separators.
fn valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= 64
        && kid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
}

/// `DROPGATE_ADMISSION_SECRET` as `serve` and `token` take it: one or more comma-separated
/// secrets, each optionally `kid=secret` (split at the first `=` when what precedes it is a
/// valid kid; a secret that itself contains `=` is therefore given with a kid).
///
/// # Errors
/// Every problem found, naming the variable.
pub fn admission_keys(raw: Option<&str>) -> Result<Vec<HmacKey>, String> {
    let Some(raw) = raw else {
        return Err(format!(
            "{ENV_ADMISSION_SECRET} is required: the gateway cannot verify buyers without it \
             (e.g. export {ENV_ADMISSION_SECRET}=$(openssl rand -hex 32))"
        ));
    };
    let mut keys: Vec<HmacKey> = Vec::new();
    for (i, part) in raw.split(',').map(str::trim).enumerate() {
        let (kid, secret) = match part.split_once('=') {
            Some((kid, secret)) if valid_kid(kid) && !secret.is_empty() => (Some(kid), secret),
            _ => (None, part),
        };
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "{ENV_ADMISSION_SECRET}: secret {} has fewer than {MIN_SECRET_BYTES} bytes \
                 (e.g. openssl rand -hex 32; several are comma-separated, each optionally \
                 kid=secret)",
                i + 1
            ));
        }
        if let Some(kid) = kid {
            if keys.iter().any(|k| k.kid.as_deref() == Some(kid)) {
                return Err(format!(
                    "{ENV_ADMISSION_SECRET}: kid {kid:?} is given twice"
                ));
            }
        }
        keys.push(HmacKey {
            kid: kid.map(str::to_string),
            secret: Secret::new(secret),
        });
    }
    if keys.len() > MAX_ADMISSION_SECRETS {
        return Err(format!(
            "{ENV_ADMISSION_SECRET}: at most {MAX_ADMISSION_SECRETS} secrets (got {})",
            keys.len()
        ));
    }
    Ok(keys)
}

/// A public key of the JWKS file, bound to the one algorithm it verifies.
#[derive(Clone)]
pub struct PublicKey {
    pub kid: Option<String>,
    pub alg: Algorithm,
    pub key: DecodingKey,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

/// The signature algorithms a JWKS key may carry: asymmetric only, so no token can pass
/// for one signed with a public key's bytes as an HMAC secret.
pub const PUBLIC_ALGORITHMS: [Algorithm; 3] =
    [Algorithm::EdDSA, Algorithm::ES256, Algorithm::RS256];

/// The one algorithm `jwk` verifies: its `alg` when given, else the one its key type and
/// curve allow. `None` for a key of another kind (symmetric, encryption, other curves).
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        _ => return None,
    };
    match jwk.common.key_algorithm {
        None => Some(by_type),
        Some(given) => (Algorithm::try_from(given).ok() == Some(by_type)).then_some(by_type),
    }
}

/// The usable keys of a JWKS document. Keys of other kinds are skipped (an identity
/// provider's set may hold encryption keys too); a set with none usable is an error.
///
/// # Errors
/// What is wrong with the document.
pub fn parse_jwks(bytes: &[u8]) -> Result<Vec<PublicKey>, String> {
    #[derive(serde::Deserialize)]
    struct Doc {
        keys: Vec<serde_json::Value>,
    }
    let doc: Doc = serde_json::from_slice(bytes)
        .map_err(|e| format!("not a JWKS document ({{\"keys\": [...]}}): {e}"))?;
    let mut keys = Vec::new();
    for value in doc.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        let Some(alg) = algorithm_of(&jwk) else {
            continue;
        };
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| {
            format!(
                "key {:?}: {e}",
                jwk.common.key_id.as_deref().unwrap_or("(no kid)")
            )
        })?;
        keys.push(PublicKey {
            kid: jwk.common.key_id.clone(),
            alg,
            key,
        });
    }
    if keys.is_empty() {
        return Err("holds no EdDSA (Ed25519), ES256 (P-256) or RS256 signing key".into());
    }
    Ok(keys)
}

/// Reads and checks the JWKS file at start.
///
/// # Errors
/// What is wrong, naming the variable.
pub fn check_jwks_file(path: &Path) -> Result<Vec<PublicKey>, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("{ENV_ADMISSION_JWKS}={}: {e}", path.display()))?;
    parse_jwks(&bytes).map_err(|e| format!("{ENV_ADMISSION_JWKS}={}: {e}", path.display()))
}

/// An audience or issuer: any non-empty visible text.
pub fn check_claim_value(name: &str, raw: &str) -> Result<String, String> {
    let v = raw.trim();
    if v.is_empty() || v.len() > 512 || v.chars().any(char::is_control) {
        return Err(format!(
            "{name}: 1-512 characters without control characters"
        ));
    }
    Ok(v.to_string())
}

impl RawConfig {
    /// The token settings, their problems pushed onto `errors`.
    pub(super) fn token_config(
        &self,
        keys: Option<Vec<HmacKey>>,
        errors: &mut Vec<String>,
    ) -> Option<TokenConfig> {
        let mut claim = |name: &str, raw: &Option<String>| match raw.as_deref() {
            None => None,
            Some(v) => check_claim_value(name, v).map_err(|e| errors.push(e)).ok(),
        };
        let audience = claim(ENV_TOKEN_AUDIENCE, &self.token_audience);
        let issuer = claim(ENV_TOKEN_ISSUER, &self.token_issuer);
        let jwks = self.admission_jwks.as_deref().map(std::path::PathBuf::from);
        if let Some(path) = &jwks {
            if let Err(e) = check_jwks_file(path) {
                errors.push(e);
            }
        }
        Some(TokenConfig {
            keys: keys?,
            jwks,
            audience,
            issuer,
        })
    }
}
