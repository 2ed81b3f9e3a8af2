//! Unit tests of token verification (the HTTP-level ones are in tests/api/tokens/).

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

#[test]
fn a_visitor_token_is_one_whose_scope_list_holds_queue() {
    assert!(is_visitor_scope(Some("queue")));
    assert!(is_visitor_scope(Some("openid queue profile")));
    for other in [
        None,
        Some(""),
        Some("openid profile"),
        Some("queues"),
        Some("queue:read"),
    ] {
        assert!(!is_visitor_scope(other), "{other:?}");
    }
}

#[test]
fn what_is_signed_with_a_named_key_carries_its_kid() {
    let key = HmacKey {
        kid: Some("k2".into()),
        secret: secret(),
    };
    let t = mint(&key, "u-1", None, 60).unwrap();
    let header = jsonwebtoken::decode_header(&t).unwrap();
    assert_eq!(header.kid.as_deref(), Some("k2"));
    let v = Verifier::new(&secret(), None);
    assert_eq!(
        v.buyer(Some(&format!("Bearer {t}")), None),
        Err(AuthError::UnknownKey),
        "a kid this gateway has no key of"
    );
}
