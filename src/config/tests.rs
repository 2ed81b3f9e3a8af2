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
