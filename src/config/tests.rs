//! Unit tests of the configuration's validation.

use super::checks::parse_listen;
use super::*;

#[test]
fn every_error_is_reported_at_once() {
    let raw = RawConfig {
        listen: "nonsense".into(),
        key_prefix: "{bad}".into(),
        reprocess_max_attempts: "zero".into(),
        ..RawConfig::default()
    };
    let err = raw.validate().unwrap_err();
    assert_eq!(err.0.len(), 4, "{err}");
    assert!(err.to_string().contains(ENV_ADMISSION_SECRET));
}

#[test]
fn port_shorthand_binds_loopback() {
    assert_eq!(
        parse_listen(":0").unwrap(),
        "127.0.0.1:0".parse::<SocketAddr>().unwrap()
    );
}

#[test]
fn nats_settings_are_checked_with_the_rest() {
    let raw = RawConfig {
        nats_url: Some("redis://x".into()),
        nats_stream: "a.b".into(),
        nats_subject_prefix: "shop..drops".into(),
        outbox_retention_secs: "-1".into(),
        admission_secret: Some("0123456789abcdef".into()),
        ..RawConfig::default()
    };
    let err = raw.validate().unwrap_err();
    assert_eq!(err.0.len(), 4, "{err}");
    let ok = RawConfig {
        nats_url: Some("nats://127.0.0.1:4222,tls://b:4222".into()),
        nats_subject_prefix: "shop.dropgate".into(),
        admission_secret: Some("0123456789abcdef".into()),
        ..RawConfig::default()
    };
    let config = ok.validate().unwrap();
    let nats = config.nats.unwrap();
    assert_eq!(nats.stream, DEFAULT_NATS_STREAM);
    assert!(!format!("{nats:?}").contains("127.0.0.1"));
    assert!(RawConfig {
        admission_secret: Some("0123456789abcdef".into()),
        ..RawConfig::default()
    }
    .validate()
    .unwrap()
    .nats
    .is_none());
}

#[test]
fn secrets_never_print() {
    assert_eq!(format!("{:?}", Secret::new("hunter2")), "Secret(***)");
}

#[test]
fn localhost_listens_on_loopback_and_other_names_say_to_use_an_address() {
    assert_eq!(
        parse_listen("localhost:8080").unwrap(),
        "127.0.0.1:8080".parse::<SocketAddr>().unwrap()
    );
    let err = parse_listen("example.com:8080").unwrap_err();
    assert!(err.contains("IP address"), "{err}");
}

#[test]
fn the_admission_secret_check_is_one_for_every_command() {
    assert!(checks::admission_secret(Some("0123456789abcdef")).is_ok());
    let short = checks::admission_secret(Some("short")).unwrap_err();
    assert!(
        short.contains("16 bytes") && !short.contains("short"),
        "{short}"
    );
    assert!(checks::admission_secret(None).is_err());
}

#[test]
fn several_admission_secrets_with_kids_are_checked_together() {
    let keys = admission_keys(Some("k2=0123456789abcdef-new, 0123456789abcdef-old")).unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].kid.as_deref(), Some("k2"));
    assert_eq!(keys[0].secret.expose(), "0123456789abcdef-new");
    assert_eq!(keys[1].kid, None);
    for (raw, says) in [
        ("k1=0123456789abcdef,k1=fedcba9876543210", "twice"),
        ("0123456789abcdef,short", "secret 2 has fewer than 16 bytes"),
        ("k1=short", "secret 1 has fewer"),
    ] {
        let err = admission_keys(Some(raw)).unwrap_err();
        assert!(
            err.contains(says) && !err.contains("short,"),
            "{raw}: {err}"
        );
    }
    let raw = RawConfig {
        admission_secret: Some("a=0123456789abcdef,b=fedcba9876543210".into()),
        ..RawConfig::default()
    };
    let config = raw.validate().unwrap();
    assert_eq!(config.admission_secret.expose(), "0123456789abcdef");
    assert_eq!(config.tokens.ticket_secret().expose(), "fedcba9876543210");
}

#[test]
fn a_jwks_file_audience_and_issuer_are_validated_with_the_rest() {
    let dir = std::env::temp_dir().join(format!("dg-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let symmetric = dir.join("oct.json");
    std::fs::write(
        &symmetric,
        br#"{"keys":[{"kty":"oct","k":"c2VjcmV0","alg":"HS256"}]}"#,
    )
    .unwrap();
    let raw = RawConfig {
        admission_secret: Some("0123456789abcdef".into()),
        admission_jwks: Some(dir.join("missing.json").display().to_string()),
        token_audience: Some(" ".into()),
        token_issuer: Some("bad\u{7}".into()),
        ..RawConfig::default()
    };
    let err = raw.validate().unwrap_err();
    assert_eq!(err.0.len(), 3, "{err}");
    assert!(err.0[0].contains(ENV_TOKEN_AUDIENCE), "{err}");
    assert!(err.0[1].contains(ENV_TOKEN_ISSUER), "{err}");
    assert!(err.0[2].contains(ENV_ADMISSION_JWKS), "{err}");
    // A set of symmetric keys only: a public-key file never carries an HMAC secret.
    let err = check_jwks_file(&symmetric).unwrap_err();
    assert!(err.contains("no EdDSA"), "{err}");
    assert!(parse_jwks(b"[]")
        .unwrap_err()
        .contains("not a JWKS document"));
}
