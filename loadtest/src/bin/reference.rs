//! reference: the least a claim server can do, as the yardstick of `ratio.sh`.
//!
//! Every `POST /v1/skus/{sku}/claims` runs ONE `EVALSHA` of a tiny Lua script (per-user limit
//! check, stock decrement) over one multiplexed `redis::aio::ConnectionManager`, and answers
//! 201 or 409. No token check, no idempotency, no journal, no database: what dropgate adds on
//! top of this is what the ratio measures. Same HTTP stack as the gateway (hyper 1.x http1,
//! hyper-util, a timer for the header-read timeout, keep-alive, TCP_NODELAY).
//!
//! The buyer is the `X-User` header (default `anon`). Stock is seeded by the caller:
//! `SET <prefix>:{<sku>}:stock <units>`; a SKU without stock answers 404.
//!
//! Environment: `REFERENCE_LISTEN` (default `127.0.0.1:0`; the bound address is printed as
//! `listening on ADDR`), `REDIS_URL` (default `redis://127.0.0.1:6379`), `REFERENCE_KEY_PREFIX`
//! (default `ref`), `REFERENCE_PER_USER_LIMIT` (default 1000000000).
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::net::TcpListener;

const ENV_LISTEN: &str = "REFERENCE_LISTEN";
const DEFAULT_LISTEN: &str = "127.0.0.1:0";
const ENV_REDIS_URL: &str = "REDIS_URL";
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
const ENV_KEY_PREFIX: &str = "REFERENCE_KEY_PREFIX";
const DEFAULT_KEY_PREFIX: &str = "ref";
const ENV_PER_USER_LIMIT: &str = "REFERENCE_PER_USER_LIMIT";
const DEFAULT_PER_USER_LIMIT: &str = "1000000000";
/// As the gateway: the slowloris guard, and the bound of one Redis call.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
const REDIS_TIMEOUT: Duration = Duration::from_millis(250);
const MAX_BODY_BYTES: usize = 16 * 1024;

/// The one script (`reference.lua` beside this file): the per-user limit check and the stock
/// decrement of one claim (`benches/script_cost.rs` runs it too, as the yardstick of claim.lua).
const CLAIM_LUA: &str = include_str!("reference.lua");

type Body = Full<Bytes>;

/// Shared by every connection.
struct State {
    /// One multiplexed socket; cloning shares it.
    redis: ConnectionManager,
    script: Script,
    prefix: String,
    limit: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen = env(ENV_LISTEN, DEFAULT_LISTEN);
    let redis_url = env(ENV_REDIS_URL, DEFAULT_REDIS_URL);
    let limit: i64 = env(ENV_PER_USER_LIMIT, DEFAULT_PER_USER_LIMIT).parse()?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(REDIS_TIMEOUT * 8))
        .set_response_timeout(Some(REDIS_TIMEOUT));
    let redis =
        ConnectionManager::new_with_config(redis::Client::open(redis_url.as_str())?, config)
            .await?;
    let state = Arc::new(State {
        redis,
        script: Script::new(CLAIM_LUA),
        prefix: env(ENV_KEY_PREFIX, DEFAULT_KEY_PREFIX),
        limit,
    });
    let listener = TcpListener::bind(listen.as_str()).await?;
    println!("listening on {}", listener.local_addr()?);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    let builder = Arc::new(builder);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        eprintln!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let builder = builder.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(&state, req).await) }
                    });
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (segments.as_slice(), req.method()) {
        (["v1", "skus", sku, "claims"], &Method::POST) => {
            let sku = sku.to_string();
            claim(state, &sku, req).await
        }
        (["healthz"], &Method::GET) => json(StatusCode::OK, r#"{"status":"ok"}"#),
        _ => json(StatusCode::NOT_FOUND, r#"{"code":"not_found"}"#),
    }
}

async fn claim(state: &State, sku: &str, req: Request<Incoming>) -> Response<Body> {
    let user = req
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anon")
        .to_string();
    // Read the body as the gateway does (bounded); its content is not interpreted.
    if Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .is_err()
    {
        return json(StatusCode::BAD_REQUEST, r#"{"code":"bad_request"}"#);
    }
    let mut con = state.redis.clone();
    let mut invocation = state.script.prepare_invoke();
    invocation
        .key(format!("{}:{{{sku}}}:stock", state.prefix))
        .key(format!("{}:{{{sku}}}:users", state.prefix))
        .arg(&user)
        .arg(1)
        .arg(state.limit);
    let outcome =
        tokio::time::timeout(REDIS_TIMEOUT, invocation.invoke_async::<i64>(&mut con)).await;
    match outcome {
        Ok(Ok(remaining)) if remaining >= 0 => json(
            StatusCode::CREATED,
            &format!(r#"{{"quantity":1,"remaining":{remaining}}}"#),
        ),
        Ok(Ok(-1)) => json(StatusCode::CONFLICT, r#"{"code":"sold_out"}"#),
        Ok(Ok(-2)) => json(StatusCode::CONFLICT, r#"{"code":"limit_reached"}"#),
        Ok(Ok(_)) => json(StatusCode::NOT_FOUND, r#"{"code":"unknown_sku"}"#),
        Ok(Err(_)) | Err(_) => json(StatusCode::SERVICE_UNAVAILABLE, r#"{"code":"unavailable"}"#),
    }
}

fn json(status: StatusCode, body: &str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}
