//! Instruction counts of the claim path's hot functions, under callgrind (gungraun): exact
//! and repeatable on a shared machine, where criterion's wall times drift by tens of percent.
//! No Redis, no network: each function is given its input ready-made (`setup`, not counted).
//!
//! ```text
//! cargo install gungraun-runner --version 0.20.0   # once; the runner must match the crate
//! cargo bench --bench instructions
//! cargo bench --bench instructions -- --baseline=main  # against gungraun's saved baseline
//! ```
//!
//! Benchmarks (ids are stable; gungraun's `--save-baseline`/`--baseline` compare them):
//! - `token::verify_{valid, valid_again, bad_signature}`: `Verifier::buyer` on a minted
//!   admission token (`valid_again`: verified once before, as a buyer's retry is).
//! - `body::decode_{typical, empty}`: `http::claim_quantity` on a claim body.
//! - `batch::build.build_{0, 1, 2}`: `scripts::claim_invocation`, the `claim.lua` call of a
//!   coalesced batch of 1, 32 and 128 claims (keys and arguments, not yet on the wire: the
//!   call id once, a piece per claim and each buyer once).
//! - `reply::parse.parse_{0, 1, 2}`: `scripts::parse_claim_reply` on the reply of a call of 1,
//!   32 and 128 claims that all won (the stock before the call; each claim's stock left is
//!   worked out here). (gungraun numbers `benches` cases by position.)

use std::hint::black_box;

use gungraun::{library_benchmark, library_benchmark_group, main};
use redis::Value;
use uuid::Uuid;

use dropgate::auth::{mint, AuthError, Verifier};
use dropgate::config::Secret;
use dropgate::keys::SkuKeys;
use dropgate::scripts::{self, ClaimInput, Decision};

const SECRET: &str = "bench-admission-secret-0123456789";

fn token_case(signed_with: &str) -> (Verifier, String) {
    let verifier = Verifier::new(&Secret::new(SECRET), None);
    let token = mint(
        &Secret::new(signed_with),
        "user-000042",
        Some("drop-1"),
        24 * 3600,
    )
    .expect("minting with an HMAC key cannot fail");
    (verifier, format!("Bearer {token}"))
}

/// As [`token_case`], the token verified once already (a buyer's retry).
fn token_seen(signed_with: &str) -> (Verifier, String) {
    let (verifier, header) = token_case(signed_with);
    let _ = verifier.buyer(Some(&header), Some("drop-1"));
    (verifier, header)
}

#[library_benchmark]
#[bench::valid(setup = token_case, args = (SECRET))]
#[bench::valid_again(setup = token_seen, args = (SECRET))]
#[bench::bad_signature(setup = token_case, args = ("another-secret-0123456789"))]
fn verify((verifier, header): (Verifier, String)) -> Result<String, AuthError> {
    black_box(verifier.buyer(black_box(Some(header.as_str())), black_box(Some("drop-1"))))
}

#[library_benchmark]
#[bench::typical(br#"{"quantity": 1}"#)]
#[bench::empty(b"")]
fn decode(body: &[u8]) -> Option<i64> {
    black_box(dropgate::http::claim_quantity(black_box(body)).ok())
}

/// `n` claims of one unit by distinct users in one call, its id minted now. The script
/// registry is built here (hashing every script once per process), not in the count.
fn batch_case(n: usize) -> (SkuKeys, Uuid, Vec<ClaimInput>) {
    let _ = scripts::SCRIPTS.claim.get_hash();
    let claims = (0..n)
        .map(|i| ClaimInput {
            user: format!("user-{i:06}"),
            quantity: 1,
            idempotency_key: None,
        })
        .collect();
    (
        SkuKeys::new("dg", "drop-1"),
        dropgate::ids::mint_call(1),
        claims,
    )
}

#[library_benchmark]
#[benches::build(args = [1, 32, 128], setup = batch_case)]
fn build((keys, call, claims): (SkuKeys, Uuid, Vec<ClaimInput>)) -> bool {
    let inv = scripts::claim_invocation(&keys, &call, black_box(&claims), 1_764_000_000_000, 0);
    black_box(inv).is_ok()
}

/// `claim.lua`'s reply for a call of `n` claims that all won: no hold expiry, then the stock
/// before the call.
fn reply_case(n: usize) -> (Value, Vec<ClaimInput>) {
    let (_, _, claims) = batch_case(n);
    (
        Value::Array(vec![Value::Int(0), Value::Int(1_000_000)]),
        claims,
    )
}

#[library_benchmark]
#[benches::parse(args = [1, 32, 128], setup = reply_case)]
fn parse((reply, claims): (Value, Vec<ClaimInput>)) -> usize {
    let decisions: Vec<Decision> =
        scripts::parse_claim_reply(black_box(reply), &claims).unwrap_or_default();
    black_box(decisions).len()
}

library_benchmark_group!(name = token, benchmarks = verify);
library_benchmark_group!(name = body, benchmarks = decode);
library_benchmark_group!(name = batch, benchmarks = build);
library_benchmark_group!(name = reply, benchmarks = parse);
main!(library_benchmark_groups = token, body, batch, reply);
