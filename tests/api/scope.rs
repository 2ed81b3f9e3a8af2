//! A token carrying `sku` acts on that SKU's claims and entries only, on every route (API.md):
//! for another SKU's claim or entry it is 404, as for a stranger, and nothing changes.

use serde_json::{json, Value};

use crate::helpers::*;
use crate::lifecycle::{
    claim_id, claim_one, declare_with, get_as, ledger_statuses, post_as, settled,
};

async fn delete_as(api: &Api, path: &str, auth: &str) -> (u16, Value) {
    let r = api
        .http
        .delete(format!("{}{path}", api.base))
        .bearer_auth(auth)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_another_sku_reads_confirms_cancels_and_leaves_nothing_of_this_one() {
    let app = spawn_app().await;
    declare_with(&app, "drop-a", json!({"total": 1, "hold_seconds": 600})).await;
    declare_with(&app, "drop-b", json!({"total": 5, "hold_seconds": 600})).await;
    let (s, held) = claim_one(&app, "drop-a", "ann").await;
    assert_eq!(s, 201, "{held}");
    let claim = claim_id(&held);
    let (s, entry) = post_as(&app, "/v1/skus/drop-a/waitlist", &token("bob")).await;
    assert_eq!(s, 201, "{entry}");
    let entry = entry["entry_id"].as_str().unwrap().to_string();

    // The owners' own tokens, scoped to drop-b: every route by id answers as for a stranger.
    let ann_b = token_for("ann", "drop-b");
    let bob_b = token_for("bob", "drop-b");
    let claim_path = format!("/v1/claims/{claim}");
    let entry_path = format!("/v1/waitlist/{entry}");
    let (s, body) = get_as(&app, &claim_path, &ann_b).await;
    assert_eq!(
        (s, code(&body)),
        (404, "unknown_claim"),
        "GET claim: {body}"
    );
    for op in ["confirm", "cancel"] {
        let (s, body) = post_as(&app, &format!("{claim_path}/{op}"), &ann_b).await;
        assert_eq!((s, code(&body)), (404, "unknown_claim"), "{op}: {body}");
    }
    let (s, body) = get_as(&app, &entry_path, &bob_b).await;
    assert_eq!(
        (s, code(&body)),
        (404, "unknown_entry"),
        "GET entry: {body}"
    );
    let (s, body) = delete_as(&app, &entry_path, &bob_b).await;
    assert_eq!(
        (s, code(&body)),
        (404, "unknown_entry"),
        "DELETE entry: {body}"
    );
    // The routes that name the SKU refuse the token itself.
    let (s, body) = post_as(&app, "/v1/skus/drop-a/waitlist", &token_for("cy", "drop-b")).await;
    assert_eq!((s, code(&body)), (401, "unauthorized"), "join: {body}");
    let r = app
        .http
        .post(format!("{}/v1/skus/drop-a/claims", app.base))
        .bearer_auth(token_for("cy", "drop-b"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // Nothing moved: the hold is still held, the entry still waits, in Redis and the ledger.
    let (s, now) = get_as(&app, &claim_path, &token_for("ann", "drop-a")).await;
    assert_eq!((s, now["status"].as_str()), (200, Some("held")), "{now}");
    let (s, now) = get_as(&app, &entry_path, &token_for("bob", "drop-a")).await;
    assert_eq!((s, now["status"].as_str()), (200, Some("waiting")), "{now}");
    let view = settled(&app, &app.probe, "drop-a").await;
    assert_eq!(
        (view["held"].as_i64(), view["waiting"].as_i64()),
        (Some(1), Some(1)),
        "{view}"
    );
    let statuses = ledger_statuses(&app.probe, "drop-a").await;
    assert_eq!(
        statuses.values().map(String::as_str).collect::<Vec<_>>(),
        ["held"]
    );
    // The entry reaches the ledger through the journal, like a win.
    wait_for(std::time::Duration::from_secs(10), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM waitlist WHERE sku = 'drop-a' AND status = 'waiting'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        waiting == 1
    })
    .await;

    // A token scoped to the claim's own SKU acts as the owner's: the confirm goes through.
    let (s, body) = post_as(
        &app,
        &format!("{claim_path}/confirm"),
        &token_for("ann", "drop-a"),
    )
    .await;
    assert_eq!(
        (s, body["status"].as_str()),
        (200, Some("confirmed")),
        "{body}"
    );
    let (s, body) = delete_as(&app, &entry_path, &token_for("bob", "drop-a")).await;
    assert_eq!((s, body["status"].as_str()), (200, Some("left")), "{body}");
}
