//! The gateway's admin API as this tool uses it: readiness, declaring SKUs, reading the SKU
//! view, and waiting for the journal writer to drain. Also mints admission tokens.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use crate::settings::Secret;

/// Bound of any one admin call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two reads of the SKU view while waiting for the writer.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// `GET /admin/skus/{sku}`, as documented in API.md.
#[derive(Debug, Clone, Deserialize)]
pub struct SkuView {
    pub sku: String,
    pub total: i64,
    pub per_user_limit: i64,
    pub remaining: Option<i64>,
    pub recorded: i64,
    pub in_flight: Option<i64>,
    pub pending: i64,
    pub compensated: i64,
    /// Lifecycle figures (API.md "Holds", "Waitlist"): units of `recorded` still held and
    /// confirmed, and waitlist entries waiting and holding an offer.
    #[serde(default)]
    pub hold_seconds: i64,
    #[serde(default)]
    pub held: i64,
    #[serde(default)]
    pub confirmed: i64,
    #[serde(default)]
    pub waiting: i64,
    #[serde(default)]
    pub offered: i64,
    pub consistent: bool,
}

impl SkuView {
    /// The writer has written every winner Redis decided, and the books balance.
    pub fn drained(&self) -> bool {
        self.in_flight == Some(0) && self.consistent
    }
}

/// The body of `PUT /admin/skus/{sku}`; the lifecycle and waiting-room fields only when set.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Declare {
    pub total: i64,
    pub per_user_limit: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_seconds: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offer_seconds: Option<u32>,
    /// RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
    /// `{"admit_per_second", "admission_ttl_seconds"}` (API.md, "Waiting room").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<serde_json::Value>,
}

/// A client of the admin routes of one gateway.
pub struct Admin {
    /// Base URL, without a trailing slash.
    base: String,
    /// Keeps connections open across the many polls of the drain wait.
    http: reqwest::Client,
    /// `Bearer <DROPGATE_ADMIN_TOKEN>`.
    auth: String,
}

impl Admin {
    /// # Errors
    /// The HTTP client could not be built.
    pub fn new(base: &str, token: &Secret) -> anyhow::Result<Admin> {
        Admin::with_client(base, token, reqwest::Client::builder())
    }

    /// A client that opens a connection per call: for calls seconds apart, which would
    /// otherwise reuse a connection the gateway may be closing as idle (connection reset).
    ///
    /// # Errors
    /// The HTTP client could not be built.
    pub fn unpooled(base: &str, token: &Secret) -> anyhow::Result<Admin> {
        Admin::with_client(
            base,
            token,
            reqwest::Client::builder().pool_max_idle_per_host(0),
        )
    }

    fn with_client(
        base: &str,
        token: &Secret,
        builder: reqwest::ClientBuilder,
    ) -> anyhow::Result<Admin> {
        Ok(Admin {
            base: base.trim_end_matches('/').to_string(),
            http: builder.timeout(CALL_TIMEOUT).build()?,
            auth: format!("Bearer {}", token.expose()),
        })
    }

    /// # Errors
    /// The gateway is unreachable or `/readyz` is not 200.
    pub async fn ready(&self) -> anyhow::Result<()> {
        let url = format!("{}/readyz", self.base);
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if !resp.status().is_success() {
            bail!(
                "GET {url}: {} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Declares a new SKU and checks that it is fresh: a SKU that already exists, or whose
    /// stock already moved, would make the run's accounting meaningless.
    ///
    /// # Errors
    /// Any answer but 201 with `remaining == total`.
    pub async fn declare_fresh(
        &self,
        sku: &str,
        total: i64,
        per_user_limit: i64,
    ) -> anyhow::Result<SkuView> {
        self.declare(
            sku,
            Declare {
                total,
                per_user_limit,
                ..Declare::default()
            },
        )
        .await
    }

    /// [`Admin::declare_fresh`] with every field of the declaration (holds, offers).
    ///
    /// # Errors
    /// Any answer but 201 with `remaining == total`.
    pub async fn declare(&self, sku: &str, body: Declare) -> anyhow::Result<SkuView> {
        let total = body.total;
        let url = format!("{}/admin/skus/{sku}", self.base);
        let resp = self
            .http
            .put(&url)
            .header(reqwest::header::AUTHORIZATION, &self.auth)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("PUT {url}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if status != reqwest::StatusCode::CREATED {
            bail!("PUT {url}: expected 201 for a new SKU, got {status}: {text}");
        }
        let view: SkuView =
            serde_json::from_str(&text).with_context(|| format!("PUT {url}: body {text}"))?;
        if view.remaining != Some(total) {
            bail!("PUT {url}: a new SKU should have all its stock, got {view:?}");
        }
        Ok(view)
    }

    /// `POST /admin/skus/{sku}/restock` with a positive `delta`: units that go to the head of
    /// the waitlist as offers while anybody waits.
    ///
    /// # Errors
    /// Transport errors, or a status other than 200.
    pub async fn restock(&self, sku: &str, delta: i64) -> anyhow::Result<()> {
        let url = format!("{}/admin/skus/{sku}/restock", self.base);
        let resp = self
            .http
            .post(&url)
            .header(reqwest::header::AUTHORIZATION, &self.auth)
            .json(&serde_json::json!({ "delta": delta }))
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = resp.status();
        if status != reqwest::StatusCode::OK {
            bail!(
                "POST {url}: {status}: {}",
                resp.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }

    /// # Errors
    /// Transport errors, a status other than 200, or a body that is not a SKU view.
    pub async fn view(&self, sku: &str) -> anyhow::Result<SkuView> {
        let url = format!("{}/admin/skus/{sku}", self.base);
        let resp = self
            .http
            .get(&url)
            .header(reqwest::header::AUTHORIZATION, &self.auth)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if status != reqwest::StatusCode::OK {
            bail!("GET {url}: {status}: {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("GET {url}: body {text}"))
    }

    /// Reads the view until the writer has drained (`in_flight == 0` and `consistent`), or
    /// until `limit` has passed; returns the last view read and whether it drained.
    ///
    /// # Errors
    /// A read that fails (the wait does not go on past a failing gateway).
    pub async fn wait_drained(
        &self,
        sku: &str,
        limit: Duration,
    ) -> anyhow::Result<(SkuView, bool)> {
        let deadline = Instant::now() + limit;
        loop {
            let view = self.view(sku).await?;
            if view.drained() {
                return Ok((view, true));
            }
            if Instant::now() >= deadline {
                return Ok((view, false));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

#[derive(Serialize)]
struct AdmissionClaims<'a> {
    sub: &'a str,
    exp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    sku: Option<&'a str>,
    /// `"queue"` on a visitor token (it joins a waiting room and buys nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'a str>,
}

/// Mints an admission token as the waiting room would (what `dropgate token` prints).
///
/// # Errors
/// The signing error (does not happen with a non-empty HMAC key).
pub fn mint(
    secret: &Secret,
    user: &str,
    sku: Option<&str>,
    ttl: Duration,
) -> Result<String, jsonwebtoken::errors::Error> {
    sign(
        secret,
        &AdmissionClaims {
            sub: user,
            exp: jsonwebtoken::get_current_timestamp() + ttl.as_secs(),
            sku,
            scope: None,
        },
    )
}

/// Mints a visitor token, as a shop's front end gives each visitor of a waiting room (what
/// `dropgate token --visitor` prints).
///
/// # Errors
/// As [`mint`].
pub fn mint_visitor(
    secret: &Secret,
    user: &str,
    ttl: Duration,
) -> Result<String, jsonwebtoken::errors::Error> {
    sign(
        secret,
        &AdmissionClaims {
            sub: user,
            exp: jsonwebtoken::get_current_timestamp() + ttl.as_secs(),
            sku: None,
            scope: Some("queue"),
        },
    )
}

fn sign(
    secret: &Secret,
    claims: &AdmissionClaims<'_>,
) -> Result<String, jsonwebtoken::errors::Error> {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.expose().as_bytes())?,
    )
}
