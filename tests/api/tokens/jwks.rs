//! Public keys from a JWKS file (`DROPGATE_ADMISSION_JWKS`): EdDSA, ES256 and RS256 tokens of
//! an identity provider verify; no algorithm confusion, no `alg: none`; the file is re-read
//! when it changes. Keys are made fresh by the `openssl` command line for each test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::{claim_with, hs256, now, refused};
use crate::helpers::*;

/// A private key made by openssl, its JWK (public part only) named `kid`.
struct KeyPair {
    alg: Algorithm,
    kid: String,
    private: EncodingKey,
    jwk: Jwk,
}

/// DER of a new key: PKCS#8 for Ed25519 and P-256, PKCS#1 for RSA (as jsonwebtoken reads
/// them).
fn openssl_der(alg: Algorithm) -> Vec<u8> {
    let script = match alg {
        Algorithm::EdDSA => "openssl genpkey -algorithm ed25519 -outform DER",
        Algorithm::ES256 => {
            "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
             | openssl pkcs8 -topk8 -nocrypt -outform DER"
        }
        Algorithm::RS256 => {
            "openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 \
             | openssl rsa -outform DER -traditional"
        }
        other => panic!("no key for {other:?}"),
    };
    let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "openssl: {out:?}");
    out.stdout
}

impl KeyPair {
    fn new(alg: Algorithm, kid: &str) -> Self {
        let der = openssl_der(alg);
        let private = match alg {
            Algorithm::EdDSA => EncodingKey::from_ed_der(&der),
            Algorithm::ES256 => EncodingKey::from_ec_der(&der),
            _ => EncodingKey::from_rsa_der(&der),
        };
        let mut jwk = Jwk::from_encoding_key(&private, alg).unwrap();
        jwk.common.key_id = Some(kid.to_string());
        KeyPair {
            alg,
            kid: kid.to_string(),
            private,
            jwk,
        }
    }

    /// A token of `sub` signed with this key, its `kid` in the header when `named`.
    fn sign(&self, sub: &str, named: bool) -> String {
        let mut header = Header::new(self.alg);
        header.kid = named.then(|| self.kid.clone());
        let claims = json!({"sub": sub, "exp": now() + 600, "scope": "openid"});
        jsonwebtoken::encode(&header, &claims, &self.private).unwrap()
    }
}

/// Writes the JWKS of `keys` at `path` whole (a new file renamed over the old, as a
/// deployment does), so no reader sees half a file.
fn publish(path: &Path, keys: &[&KeyPair]) {
    let set = JwkSet {
        keys: keys.iter().map(|k| k.jwk.clone()).collect(),
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&set).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn jwks_path() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dg-jwks-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("jwks.json")
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eddsa_es256_and_rs256_tokens_verify_against_the_jwks_file() {
    let keys = [
        KeyPair::new(Algorithm::EdDSA, "ed-1"),
        KeyPair::new(Algorithm::ES256, "ec-1"),
        KeyPair::new(Algorithm::RS256, "rsa-1"),
    ];
    let path = jwks_path();
    publish(&path, &keys.iter().collect::<Vec<_>>());
    let app = spawn_app_with(|c| c.admission_jwks = Some(path.display().to_string())).await;
    app.declare("jw-1", 10, 1).await;
    for (i, k) in keys.iter().enumerate() {
        for named in [true, false] {
            let sub = format!("u{i}-{named}");
            let (s, b) = claim_with(&app, "jw-1", &k.sign(&sub, named)).await;
            assert_eq!(s, 201, "{:?} named={named}: {b}", k.alg);
            assert_eq!(app.held("jw-1", &sub).await, 1);
        }
    }
    // A key the file does not hold, named or not, verifies nothing.
    let stranger = KeyPair::new(Algorithm::EdDSA, "ed-1");
    refused(
        &claim_with(&app, "jw-1", &stranger.sign("s1", true)).await,
        "signature",
        "foreign key, known kid",
    );
    refused(
        &claim_with(&app, "jw-1", &stranger.sign("s2", false)).await,
        "signature",
        "foreign key",
    );
    // A kid of the file with another algorithm's signature: the key is bound to its own.
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("ed-1".into());
    let claims = json!({"sub": "s3", "exp": now() + 600});
    let crossed = jsonwebtoken::encode(&header, &claims, &keys[1].private).unwrap();
    refused(
        &claim_with(&app, "jw-1", &crossed).await,
        "kid",
        "kid of another algorithm",
    );
    assert_eq!(app.stock("jw-1").await, Some(4));
    for s in ["s1", "s2", "s3"] {
        assert_eq!(app.held("jw-1", s).await, 0);
    }
    // The admission secret still verifies its own tokens.
    assert_eq!(claim_with(&app, "jw-1", &token("hs")).await.0, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hs256_token_keyed_with_public_key_bytes_and_alg_none_are_refused() {
    let ed = KeyPair::new(Algorithm::EdDSA, "ed-1");
    let rsa = KeyPair::new(Algorithm::RS256, "rsa-1");
    let path = jwks_path();
    publish(&path, &[&ed, &rsa]);
    let app = spawn_app_with(|c| c.admission_jwks = Some(path.display().to_string())).await;
    app.declare("conf-1", 5, 1).await;
    let claims = json!({"sub": "mallory", "exp": now() + 600});
    // Everything an attacker knows of the public keys, used as an HMAC secret.
    let jwk_text = serde_json::to_string(&ed.jwk).unwrap();
    let ed_x = match &ed.jwk.algorithm {
        jsonwebtoken::jwk::AlgorithmParameters::OctetKeyPair(p) => p.x.clone(),
        _ => unreachable!(),
    };
    let x_bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&ed_x)
        .unwrap();
    let rsa_text = serde_json::to_string(&rsa.jwk).unwrap();
    let forged: Vec<(&str, String)> = vec![
        (
            "jwk json, kid",
            hs256_bytes(&claims, jwk_text.as_bytes(), Some("ed-1")),
        ),
        ("jwk json", hs256_bytes(&claims, jwk_text.as_bytes(), None)),
        ("raw x, kid", hs256_bytes(&claims, &x_bytes, Some("ed-1"))),
        ("x text", hs256(&claims, &ed_x, None)),
        (
            "rsa jwk, kid",
            hs256_bytes(&claims, rsa_text.as_bytes(), Some("rsa-1")),
        ),
    ];
    for (case, t) in &forged {
        let (s, b) = claim_with(&app, "conf-1", t).await;
        assert_eq!(s, 401, "{case}: {b}");
    }
    let header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    let body = b64(claims.to_string().as_bytes());
    for unsigned in [format!("{header}.{body}."), format!("{header}.{body}")] {
        let (s, b) = claim_with(&app, "conf-1", &unsigned).await;
        assert_eq!(s, 401, "alg none: {b}");
    }
    // Algorithms outside the accepted four, though their family has keys here.
    let mut hs512 = Header::new(Algorithm::HS512);
    hs512.kid = None;
    let t = jsonwebtoken::encode(
        &hs512,
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
    refused(&claim_with(&app, "conf-1", &t).await, "alg", "HS512");
    assert_eq!(app.stock("conf-1").await, Some(5));
    assert_eq!(app.held("conf-1", "mallory").await, 0);
}

fn hs256_bytes(claims: &Value, secret: &[u8], kid: Option<&str>) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jwks_file_is_reread_when_it_changes_and_a_withdrawn_key_stops_at_once() {
    let first = KeyPair::new(Algorithm::ES256, "2026-1");
    let second = KeyPair::new(Algorithm::EdDSA, "2026-2");
    let path = jwks_path();
    publish(&path, &[&first]);
    let app = spawn_app_with(|c| c.admission_jwks = Some(path.display().to_string())).await;
    app.declare("rel-1", 10, 1).await;
    let old = first.sign("one", true);
    assert_eq!(
        claim_with(&app, "rel-1", &old).await.0,
        201,
        "verified (and kept)"
    );
    let new = second.sign("two", true);
    refused(
        &claim_with(&app, "rel-1", &new).await,
        "kid",
        "not published yet",
    );

    publish(&path, &[&first, &second]);
    wait_for(Duration::from_secs(10), || async {
        claim_with(&app, "rel-1", &second.sign("two", true)).await.0 == 201
    })
    .await;
    assert_eq!(app.held("rel-1", "two").await, 1);

    // The first key withdrawn: its token, verified and kept before, is refused too.
    publish(&path, &[&second]);
    wait_for(Duration::from_secs(10), || async {
        claim_with(&app, "rel-1", &old).await.0 == 401
    })
    .await;
    refused(
        &claim_with(&app, "rel-1", &old).await,
        "kid",
        "withdrawn key",
    );
    assert_eq!(app.held("rel-1", "one").await, 1, "the first claim only");
    // A file that no longer reads keeps the keys the gateway had.
    std::fs::write(&path, b"{not json").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await; // past one re-check
    assert_eq!(
        claim_with(&app, "rel-1", &second.sign("three", false))
            .await
            .0,
        201
    );
    assert_eq!(app.stock("rel-1").await, Some(7));
}
