use super::*;

fn sku_id(s: &str) -> &SkuId {
    SkuId::parse(s).expect("a valid SKU id")
}

#[test]
fn every_key_shares_the_sku_hash_tag() {
    let k = SkuKeys::new("dg", "drop-1");
    let id = uuid::Uuid::nil();
    for key in [
        k.state(),
        k.users(),
        k.users_restore(&id),
        k.journal(),
        k.claim(&id),
        k.idempotency(),
        k.compensation(&id),
        k.restock_op(&id),
        k.expiry_lease(),
        k.transfers(),
        k.transfer_in(&id),
        k.queue_joins(&id),
    ]
    .into_iter()
    .chain(k.lifecycle())
    .chain(k.queue())
    {
        assert!(key.starts_with("dg:{drop-1}:"), "{key}");
    }
}

#[test]
fn a_state_key_names_its_sku_and_the_units_back_channel_shares_the_prefix() {
    let k = SkuKeys::new("dg", "drop-1");
    assert_eq!(SkuKeys::sku_of_state("dg:{", &k.state()), Some("drop-1"));
    assert_eq!(SkuKeys::sku_of_state("dg:{", &k.users()), None);
    assert_eq!(SkuKeys::sku_of_state("dgx:{", &k.state()), None);
    assert_eq!(units_back_channel("dg"), "dg:units-back");
    assert_eq!(active_skus("dg"), "dg:active");
}

#[test]
fn a_shard_has_its_own_hash_tag_and_names_its_sku_back() {
    assert_eq!(shard_name(sku_id("drop-1"), 0, 0), "drop-1");
    assert_eq!(shard_name(sku_id("drop-1"), 3, 0), "drop-1#3");
    assert_eq!(split_shard("drop-1#3"), ("drop-1", 3));
    assert_eq!(split_shard("drop-1"), ("drop-1", 0));
    let k = SkuKeys::new("dg", &shard_name(sku_id("drop-1"), 3, 0));
    assert!(k.state().starts_with("dg:{drop-1#3}:"));
    assert_eq!(SkuKeys::sku_of_state("dg:{", &k.state()), Some("drop-1#3"));
}

#[test]
fn a_salted_shard_name_names_its_sku_and_shard_back() {
    // Shard 0 never carries a salt: it is the SKU itself.
    assert_eq!(shard_name(sku_id("drop-1"), 0, 7), "drop-1");
    assert_eq!(shard_name(sku_id("drop-1"), 3, 7), "drop-1#3.7");
    // SKU ids may hold dots: only the part after `#` is read.
    for sku in ["drop-1", "a.b", "x.1", "v1.2.3", "_-."] {
        for shard in [0u16, 1, 9, 15] {
            for salt in [0u16, 1, 42, u16::MAX] {
                let name = shard_name(sku_id(sku), shard, salt);
                assert_eq!(split_shard(&name), (sku, shard), "{name}");
                let k = SkuKeys::new("dg", &name);
                assert_eq!(
                    SkuKeys::sku_of_state("dg:{", &k.state()),
                    Some(name.as_str())
                );
            }
        }
    }
    // What no shard is named stays a SKU of its own.
    assert_eq!(split_shard("a#1.x"), ("a#1.x", 0));
    assert_eq!(split_shard("a#1.70000"), ("a#1.70000", 0));
    assert_eq!(split_shard("a#x"), ("a#x", 0));
}

#[test]
fn a_shard_name_is_parsed_once_into_its_sku_and_shard() {
    for (name, sku, shard) in [
        ("drop-1", "drop-1", 0),
        ("drop-1#3", "drop-1", 3),
        ("a.b#2.17", "a.b", 2),
        ("a#x", "a#x", 0),
    ] {
        let n = ShardName::parse(name);
        assert_eq!(
            (n.as_str(), n.sku().as_str(), n.shard()),
            (name, sku, shard)
        );
        assert_eq!(split_shard(name), (sku, shard));
    }
}

#[test]
fn claims_minted_together_share_a_records_bucket() {
    let k = SkuKeys::new("dg", "s");
    let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    assert_eq!(k.claim(&a), k.claim(&b));
    assert_ne!(k.claim(&a), k.claim(&uuid::Uuid::nil()));
}

#[test]
fn idempotency_fields_do_not_collide_across_user_boundaries() {
    assert_ne!(idempotency_field("a:b", "c"), idempotency_field("a", "b:c"));
    assert_ne!(idempotency_field("a", "bc"), idempotency_field("ab", "c"));
}
