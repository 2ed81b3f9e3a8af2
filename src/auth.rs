//! Identity: admission tokens (JWTs minted by the waiting room or an identity provider),
//! visitor tokens, and the admin token (docs/tokens.md).

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::config::{HmacKey, Secret, TokenConfig};

mod keys;
mod verified;
use keys::Keyring;
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
    /// An OAuth scope list (space-separated): a token whose list holds `queue` is a visitor
    /// token (it joins and reads a waiting room, and buys nothing); any other is an admission
    /// token. `iat`, `jti`, `aud`, `iss`, `nbf` and unknown claims are not kept here: the
    /// validation reads what it checks from the token itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The waiting-room ticket that admitted the buyer: set only on the tokens a queue mints
    /// (`crate::queue`), and required by the claim route of a SKU with a queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<String>,
}

/// The scope that makes a token a visitor token.
pub const VISITOR_SCOPE: &str = "queue";

/// Whether an OAuth scope list (RFC 8693 4.2: space-separated) holds the visitor scope.
pub fn is_visitor_scope(scope: Option<&str>) -> bool {
    scope.is_some_and(|s| s.split(' ').any(|one| one == VISITOR_SCOPE))
}

/// Why a token was refused; every variant answers 401 `unauthorized`, and its text is the
/// problem's `detail` (and the `error_description` of `WWW-Authenticate`), so a client can
/// tell a token it must renew from one it built wrong.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("no bearer token: send Authorization: Bearer <token>")]
    Missing,
    #[error("the bearer token is not a well-formed JWT with a valid sub and exp")]
    Malformed,
    #[error("the token has expired: get a new one")]
    Expired,
    #[error("the token's signature does not verify: it was not signed with this gateway's secret")]
    BadSignature,
    #[error("the token is not valid yet (nbf): use it from its start time on")]
    NotYetValid,
    #[error("the token's aud is missing or does not name this gateway (DROPGATE_TOKEN_AUDIENCE)")]
    WrongAudience,
    #[error("the token's iss is missing or is not this gateway's issuer (DROPGATE_TOKEN_ISSUER)")]
    WrongIssuer,
    /// A `kid` the gateway has no key of (of the token's algorithm).
    #[error("the token's kid names no key of this gateway")]
    UnknownKey,
    /// An `alg` the gateway takes no token of (`none` among them).
    #[error("the token's alg is not one this gateway accepts (HS256; EdDSA, ES256 or RS256 with a JWKS)")]
    UnsupportedAlgorithm,
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
    #[error("the waiting room takes a visitor token (\"queue\" in its scope)")]
    NotVisitor,
}

impl AuthError {
    /// Whether credentials were sent at all: RFC 6750 gives a request without any no error
    /// code in its challenge.
    pub fn had_credentials(self) -> bool {
        self != AuthError::Missing
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
    /// A visitor token (`queue` in its scope): it acts only on its own entries and offers of
    /// SKUs with a waiting room (a sold-out visitor's way to the waitlist), never buys.
    pub visitor: bool,
}

impl Buyer {
    /// Whether this token may act on a claim or entry of `sku`: another SKU's is as a
    /// stranger's.
    pub fn may_act_on(&self, sku: &str) -> bool {
        self.sku.as_deref().is_none_or(|s| s == sku)
    }
}

/// A visitor whose token verified: who, and the SKU whose queue alone it may join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visitor {
    pub user: String,
    pub sku: Option<String>,
}

/// Verifies admission tokens; built once, shared by every request.
pub struct Verifier {
    keys: Keyring,
    admin: Option<Secret>,
    /// Tokens that verified, so a buyer's next attempt skips the HMAC and JSON (the largest
    /// share of the gateway's own CPU per claim after HTTP itself; docs/performance.md).
    verified: VerifiedTokens,
}

impl Verifier {
    /// One secret, no kid, no JWKS, no audience or issuer (tests and benches).
    pub fn new(secret: &Secret, admin: Option<Secret>) -> Self {
        let tokens = TokenConfig {
            keys: vec![HmacKey {
                kid: None,
                secret: secret.clone(),
            }],
            jwks: None,
            audience: None,
            issuer: None,
        };
        Self::from_config(&tokens, admin).expect("no JWKS file to read")
    }

    /// # Errors
    /// The JWKS file cannot be read or holds no usable key.
    pub fn from_config(tokens: &TokenConfig, admin: Option<Secret>) -> Result<Self, String> {
        Ok(Verifier {
            keys: Keyring::new(tokens)?,
            admin,
            verified: VerifiedTokens::new(),
        })
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

    /// Verifies a visitor token (`queue` in its scope) for a request about `sku` (when
    /// known): the visitor's id. A visitor token carrying `sku` is for that SKU's queue only.
    ///
    /// # Errors
    /// [`AuthError::NotVisitor`] for a token without that scope, [`AuthError::WrongSku`] for
    /// a token of another SKU; otherwise as [`Verifier::identify`].
    pub fn visitor(&self, header: Option<&str>, sku: Option<&str>) -> Result<String, AuthError> {
        let v = self.verify(header)?;
        if !is_visitor_scope(v.scope.as_deref()) {
            return Err(AuthError::NotVisitor);
        }
        match (sku, v.sku.as_deref()) {
            (Some(asked), Some(own)) if asked != own => Err(AuthError::WrongSku),
            _ => Ok(v.sub),
        }
    }

    /// Verifies a visitor token for a route that names an entry or a claim: the visitor and
    /// the SKU the token is limited to (the caller checks it as for a buyer's).
    ///
    /// # Errors
    /// As [`Verifier::visitor`].
    pub fn visitor_caller(&self, header: Option<&str>) -> Result<Buyer, AuthError> {
        let v = self.verify(header)?;
        if !is_visitor_scope(v.scope.as_deref()) {
            return Err(AuthError::NotVisitor);
        }
        Ok(Buyer {
            user: v.sub,
            sku: v.sku,
            ticket: None,
            visitor: true,
        })
    }

    /// Verifies any token the gateway accepts, an admission token or a visitor's, for a read
    /// about `sku` that both may make (the seat map): its `sub`. A token scoped to another SKU
    /// is refused.
    ///
    /// # Errors
    /// [`AuthError::WrongSku`] for a token of another SKU; otherwise as [`Verifier::identify`].
    pub fn reader(&self, header: Option<&str>, sku: Option<&str>) -> Result<String, AuthError> {
        let v = self.verify(header)?;
        match (sku, v.sku.as_deref()) {
            (Some(asked), Some(own)) if asked != own => Err(AuthError::WrongSku),
            _ => Ok(v.sub),
        }
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
        if is_visitor_scope(claims.scope.as_deref()) {
            return Err(AuthError::VisitorToken);
        }
        Ok(Buyer {
            user: claims.sub,
            sku: claims.sku,
            ticket: claims.tid,
            visitor: false,
        })
    }

    /// The token's verified claims, whatever its scope.
    fn verify(&self, header: Option<&str>) -> Result<Verified, AuthError> {
        let token = bearer(header).ok_or(AuthError::Missing)?;
        let now = jsonwebtoken::get_current_timestamp();
        // A token verified under JWKS keys the file has changed since is checked again.
        let claims = match self
            .verified
            .get(token, now)
            .filter(|v| v.generation == 0 || v.generation == self.keys.jwks_generation())
        {
            Some(v) => v,
            None => {
                let (c, generation) = self.keys.check(token)?;
                if !valid_user_id(&c.sub) {
                    return Err(AuthError::Malformed);
                }
                let v = Verified {
                    sub: c.sub,
                    exp: c.exp,
                    sku: c.sku,
                    scope: c.scope,
                    tid: c.tid,
                    generation,
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
pub fn mint<'a>(
    secret: impl Into<Signer<'a>>,
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
pub fn mint_visitor<'a>(
    secret: impl Into<Signer<'a>>,
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

/// An HS256 key to sign with: a bare secret, or a configured key whose `kid` goes into the
/// header (so gateways holding several secrets check the token with that one only).
#[derive(Clone, Copy)]
pub struct Signer<'a> {
    kid: Option<&'a str>,
    secret: &'a Secret,
}

impl<'a> From<&'a Secret> for Signer<'a> {
    fn from(secret: &'a Secret) -> Self {
        Signer { kid: None, secret }
    }
}

impl<'a> From<&'a HmacKey> for Signer<'a> {
    fn from(key: &'a HmacKey) -> Self {
        Signer {
            kid: key.kid.as_deref(),
            secret: &key.secret,
        }
    }
}

/// Signs `claims` with an admission secret (the first configured one, for what a gateway
/// mints).
///
/// # Errors
/// The signing error (does not happen with an HMAC key).
pub fn sign<'a>(
    key: impl Into<Signer<'a>>,
    claims: &AdmissionClaims,
) -> Result<String, jsonwebtoken::errors::Error> {
    let key = key.into();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = key.kid.map(str::to_string);
    jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_secret(key.secret.expose().as_bytes())?,
    )
}

#[cfg(test)]
mod tests;
