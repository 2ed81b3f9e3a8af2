//! Identity: admission tokens (JWT HS256, minted by the waiting room) and the admin token.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::config::Secret;

mod verified;
use verified::{Verified, VerifiedTokens};

/// The claims of an admission token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdmissionClaims {
    /// The buyer, 1-128 characters.
    pub sub: String,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// When present, the token is valid for this SKU only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
}

/// Why a token was refused; every variant answers 401 `unauthorized`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing bearer token")]
    Missing,
    #[error("invalid token")]
    Invalid,
    #[error("token is for another SKU")]
    WrongSku,
}

/// Verifies admission tokens; built once, shared by every request.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
    admin: Option<Secret>,
    /// Tokens that verified, so a buyer's next attempt skips the HMAC and JSON (the largest
    /// share of the gateway's own CPU per claim after HTTP itself; README, Performance).
    verified: VerifiedTokens,
}

impl Verifier {
    pub fn new(secret: &Secret, admin: Option<Secret>) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 0;
        Verifier {
            key: DecodingKey::from_secret(secret.expose().as_bytes())
                .expect("config validation guarantees a non-empty HMAC secret"),
            validation,
            admin,
            verified: VerifiedTokens::new(),
        }
    }

    /// Verifies a buyer's token; `sku` is the SKU the request is for, if any.
    ///
    /// # Errors
    /// [`AuthError`] when the token is missing, malformed, expired, badly signed, or scoped to
    /// another SKU.
    pub fn buyer(&self, header: Option<&str>, sku: Option<&str>) -> Result<String, AuthError> {
        let token = bearer(header).ok_or(AuthError::Missing)?;
        let now = jsonwebtoken::get_current_timestamp();
        let claims = match self.verified.get(token, now) {
            Some(v) => v,
            None => {
                let data =
                    jsonwebtoken::decode::<AdmissionClaims>(token, &self.key, &self.validation)
                        .map_err(|_| AuthError::Invalid)?;
                let c = data.claims;
                if !valid_user_id(&c.sub) {
                    return Err(AuthError::Invalid);
                }
                let v = Verified {
                    sub: c.sub,
                    exp: c.exp,
                    sku: c.sku,
                };
                self.verified.insert(token, v.clone());
                v
            }
        };
        match (&claims.sku, sku) {
            (Some(scope), Some(sku)) if scope != sku => Err(AuthError::WrongSku),
            _ => Ok(claims.sub),
        }
    }

    /// Whether the header carries the admin token, compared in constant time.
    pub fn is_admin(&self, header: Option<&str>) -> bool {
        match (&self.admin, bearer(header)) {
            (Some(admin), Some(given)) => admin.expose().as_bytes().ct_eq(given.as_bytes()).into(),
            _ => false,
        }
    }
}

/// A user id is 1-128 characters without control characters: it becomes a Redis hash field
/// and a PostgreSQL `text`, and PostgreSQL refuses a NUL, which would park every claim of
/// that user after Redis had already counted it.
fn valid_user_id(sub: &str) -> bool {
    !sub.is_empty() && sub.chars().count() <= 128 && !sub.chars().any(char::is_control)
}

fn bearer(header: Option<&str>) -> Option<&str> {
    let h = header?;
    let (scheme, token) = h.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

/// Mints an admission token (what `dropgate token` prints).
///
/// # Errors
/// The signing error (does not happen with an HMAC key).
pub fn mint(
    secret: &Secret,
    user: &str,
    sku: Option<&str>,
    ttl_secs: u64,
) -> Result<String, jsonwebtoken::errors::Error> {
    let claims = AdmissionClaims {
        sub: user.to_string(),
        exp: jsonwebtoken::get_current_timestamp() + ttl_secs,
        sku: sku.map(str::to_string),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.expose().as_bytes())?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::new("0123456789abcdef0123")
    }

    #[test]
    fn a_minted_token_verifies_and_scopes_to_its_sku() {
        let v = Verifier::new(&secret(), None);
        let t = mint(&secret(), "u-1", Some("drop-1"), 60).unwrap();
        let h = format!("Bearer {t}");
        assert_eq!(v.buyer(Some(&h), Some("drop-1")).unwrap(), "u-1");
        assert_eq!(v.buyer(Some(&h), Some("drop-2")), Err(AuthError::WrongSku));
        // Again, from the verified set: the same answers.
        assert_eq!(v.buyer(Some(&h), Some("drop-1")).unwrap(), "u-1");
        assert_eq!(v.buyer(Some(&h), Some("drop-2")), Err(AuthError::WrongSku));
    }

    #[test]
    fn expired_foreign_and_missing_tokens_are_refused() {
        let v = Verifier::new(&secret(), None);
        let other = mint(&Secret::new("another-secret-0000"), "u", None, 60).unwrap();
        assert_eq!(
            v.buyer(Some(&format!("Bearer {other}")), None),
            Err(AuthError::Invalid)
        );
        let claims = AdmissionClaims {
            sub: "u".into(),
            exp: jsonwebtoken::get_current_timestamp() - 10,
            sku: None,
        };
        let expired = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret().expose().as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v.buyer(Some(&format!("Bearer {expired}")), None),
            Err(AuthError::Invalid)
        );
        assert_eq!(v.buyer(None, None), Err(AuthError::Missing));
        assert_eq!(v.buyer(Some("Basic abc"), None), Err(AuthError::Missing));
    }

    #[test]
    fn user_ids_are_short_and_printable() {
        assert!(valid_user_id("u-17"));
        assert!(valid_user_id(&"é".repeat(128)));
        for bad in ["", "a\u{0}b", "a\nb", "\u{7f}", "\u{9b}"] {
            assert!(!valid_user_id(bad), "{bad:?}");
        }
        assert!(!valid_user_id(&"u".repeat(129)));
    }

    #[test]
    fn admin_token_must_match_exactly() {
        let v = Verifier::new(&secret(), Some(Secret::new("admin-token-123456")));
        assert!(v.is_admin(Some("Bearer admin-token-123456")));
        assert!(!v.is_admin(Some("Bearer admin-token-12345")));
        assert!(!Verifier::new(&secret(), None).is_admin(Some("Bearer x")));
    }
}
