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
    /// `"queue"` on a visitor token: it joins and reads a waiting room, and buys nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The waiting-room ticket that admitted the buyer: set only on the tokens a queue mints
    /// (`crate::queue`), and required by the claim route of a SKU with a queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<String>,
}

/// The `scope` of a visitor token.
pub const VISITOR_SCOPE: &str = "queue";

/// Why a token was refused; every variant answers 401 `unauthorized`, and its text is the
/// problem's `detail` (and the `error_description` of `WWW-Authenticate`), so a client can
/// tell a token it must renew from one it built wrong.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("no bearer token: send Authorization: Bearer <token>")]
    Missing,
    #[error("the bearer token is not a well-formed HS256 JWT with a valid sub and exp")]
    Malformed,
    #[error("the token has expired: get a new one")]
    Expired,
    #[error("the token's signature does not verify: it was not signed with this gateway's secret")]
    BadSignature,
    #[error("the token is for another SKU")]
    WrongSku,
    #[error("the bearer token is not the admin token")]
    NotAdmin,
    #[error("the admin routes are closed: the gateway has no DROPGATE_ADMIN_TOKEN")]
    NoAdminToken,
    /// A visitor token (`"scope": "queue"`) on a route that needs an admission token.
    #[error("a visitor token only joins and reads a waiting room: claims need an admission token")]
    VisitorToken,
    /// An admission token on a waiting room's routes, which take a visitor token.
    #[error("the waiting room takes a visitor token (\"scope\": \"queue\")")]
    NotVisitor,
}

impl AuthError {
    /// Whether credentials were sent at all: RFC 6750 gives a request without any no error
    /// code in its challenge.
    pub fn had_credentials(self) -> bool {
        self != AuthError::Missing
    }
}

impl From<&jsonwebtoken::errors::Error> for AuthError {
    fn from(e: &jsonwebtoken::errors::Error) -> Self {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::ExpiredSignature => AuthError::Expired,
            K::InvalidSignature => AuthError::BadSignature,
            _ => AuthError::Malformed,
        }
    }
}

/// A buyer whose admission token verified: who, and the SKU the token is limited to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buyer {
    pub user: String,
    /// `Some`: the token acts on this SKU's claims and entries only (API.md).
    pub sku: Option<String>,
    /// The waiting-room ticket that admitted the buyer (the token's `tid`).
    pub ticket: Option<String>,
}

impl Buyer {
    /// Whether this token may act on a claim or entry of `sku`: another SKU's is as a
    /// stranger's.
    pub fn may_act_on(&self, sku: &str) -> bool {
        self.sku.as_deref().is_none_or(|s| s == sku)
    }
}

/// Verifies admission tokens; built once, shared by every request.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
    admin: Option<Secret>,
    /// Tokens that verified, so a buyer's next attempt skips the HMAC and JSON (the largest
    /// share of the gateway's own CPU per claim after HTTP itself; docs/performance.md).
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

    /// Verifies a buyer's token for a request about `sku` (when the path names one): a
    /// token scoped to another SKU is refused.
    ///
    /// # Errors
    /// [`AuthError`] when the token is missing, malformed, expired, badly signed, or scoped to
    /// another SKU.
    pub fn buyer(&self, header: Option<&str>, sku: Option<&str>) -> Result<String, AuthError> {
        self.admitted(header, sku).map(|b| b.user)
    }

    /// As [`Verifier::buyer`], with the token's scope and ticket (the claim route checks a
    /// queued SKU's ticket against them).
    ///
    /// # Errors
    /// As [`Verifier::buyer`].
    pub fn admitted(&self, header: Option<&str>, sku: Option<&str>) -> Result<Buyer, AuthError> {
        let buyer = self.identify(header)?;
        match sku {
            Some(sku) if !buyer.may_act_on(sku) => Err(AuthError::WrongSku),
            _ => Ok(buyer),
        }
    }

    /// Verifies a visitor token (`"scope": "queue"`): the visitor's id.
    ///
    /// # Errors
    /// [`AuthError::NotVisitor`] for a token without that scope; otherwise as
    /// [`Verifier::identify`].
    pub fn visitor(&self, header: Option<&str>) -> Result<String, AuthError> {
        let v = self.verify(header)?;
        if v.scope.as_deref() != Some(VISITOR_SCOPE) {
            return Err(AuthError::NotVisitor);
        }
        Ok(v.sub)
    }

    /// Verifies a buyer's token: who it is and the SKU it is limited to, for a route that
    /// names a claim or entry rather than a SKU (the caller checks the scope against it).
    ///
    /// # Errors
    /// [`AuthError`] when the token is missing, malformed, expired or badly signed.
    pub fn identify(&self, header: Option<&str>) -> Result<Buyer, AuthError> {
        let claims = self.verify(header)?;
        // A visitor token buys nothing: it is minted for every visitor of a waiting room,
        // admitted or not, so taking it here would let the whole line past the queue.
        if claims.scope.is_some() {
            return Err(AuthError::VisitorToken);
        }
        Ok(Buyer {
            user: claims.sub,
            sku: claims.sku,
            ticket: claims.tid,
        })
    }

    /// The token's verified claims, whatever its scope.
    fn verify(&self, header: Option<&str>) -> Result<Verified, AuthError> {
        let token = bearer(header).ok_or(AuthError::Missing)?;
        let now = jsonwebtoken::get_current_timestamp();
        let claims = match self.verified.get(token, now) {
            Some(v) => v,
            None => {
                let data =
                    jsonwebtoken::decode::<AdmissionClaims>(token, &self.key, &self.validation)
                        .map_err(|e| AuthError::from(&e))?;
                let c = data.claims;
                if !valid_user_id(&c.sub) {
                    return Err(AuthError::Malformed);
                }
                let v = Verified {
                    sub: c.sub,
                    exp: c.exp,
                    sku: c.sku,
                    scope: c.scope,
                    tid: c.tid,
                };
                self.verified.insert(token, v.clone());
                v
            }
        };
        Ok(claims)
    }

    /// The admin token's check with the reason of a refusal.
    ///
    /// # Errors
    /// [`AuthError::Missing`], [`AuthError::NotAdmin`], or [`AuthError::NoAdminToken`] when
    /// the gateway has none configured.
    pub fn admin(&self, header: Option<&str>) -> Result<(), AuthError> {
        if self.is_admin(header) {
            return Ok(());
        }
        Err(match (&self.admin, bearer(header)) {
            (_, None) => AuthError::Missing,
            (None, Some(_)) => AuthError::NoAdminToken,
            (Some(_), Some(_)) => AuthError::NotAdmin,
        })
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
pub fn valid_user_id(sub: &str) -> bool {
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
    sign(
        secret,
        &AdmissionClaims {
            sub: user.to_string(),
            exp: jsonwebtoken::get_current_timestamp() + ttl_secs,
            sku: sku.map(str::to_string),
            scope: None,
            tid: None,
        },
    )
}

/// Mints a visitor token (`"scope": "queue"`): what a front end gives each visitor of a
/// waiting room (`dropgate token --visitor` for tests and load runs).
///
/// # Errors
/// The signing error (does not happen with an HMAC key).
pub fn mint_visitor(
    secret: &Secret,
    user: &str,
    ttl_secs: u64,
) -> Result<String, jsonwebtoken::errors::Error> {
    sign(
        secret,
        &AdmissionClaims {
            sub: user.to_string(),
            exp: jsonwebtoken::get_current_timestamp() + ttl_secs,
            sku: None,
            scope: Some(VISITOR_SCOPE.into()),
            tid: None,
        },
    )
}

/// Signs `claims` with the admission secret.
///
/// # Errors
/// The signing error (does not happen with an HMAC key).
pub fn sign(
    secret: &Secret,
    claims: &AdmissionClaims,
) -> Result<String, jsonwebtoken::errors::Error> {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
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
            Err(AuthError::BadSignature)
        );
        let claims = AdmissionClaims {
            sub: "u".into(),
            exp: jsonwebtoken::get_current_timestamp() - 10,
            sku: None,
            scope: None,
            tid: None,
        };
        let expired = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret().expose().as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v.buyer(Some(&format!("Bearer {expired}")), None),
            Err(AuthError::Expired)
        );
        assert_eq!(
            v.buyer(Some("Bearer not.a-jwt"), None),
            Err(AuthError::Malformed)
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
        assert_eq!(v.admin(None), Err(AuthError::Missing));
        assert_eq!(v.admin(Some("Bearer nope")), Err(AuthError::NotAdmin));
        assert_eq!(
            Verifier::new(&secret(), None).admin(Some("Bearer x")),
            Err(AuthError::NoAdminToken)
        );
    }

    #[test]
    fn a_scoped_token_acts_on_its_own_sku_only() {
        let v = Verifier::new(&secret(), None);
        let scoped = format!("Bearer {}", mint(&secret(), "u-1", Some("a"), 60).unwrap());
        let buyer = v.identify(Some(&scoped)).unwrap();
        assert!(buyer.may_act_on("a") && !buyer.may_act_on("b"));
        let open = format!("Bearer {}", mint(&secret(), "u-1", None, 60).unwrap());
        assert!(v.identify(Some(&open)).unwrap().may_act_on("b"));
    }
}
