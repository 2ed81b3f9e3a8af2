//! The waiting page's look and hand-over, as a shop sets them in the queue's settings
//! (`queue.page`, stored in `skus.queue_page`; docs/waiting-room.md "The page"), and the
//! page rendered with them in the visitor's language.

use serde::{Deserialize, Serialize};

/// `queue.page` of a declare. Every field is optional; each is checked before it is stored,
/// because the page puts them in HTML, CSS and a redirect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageSettings {
    /// Where an admitted visitor is sent, the admission token in the URL's fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_name: Option<String>,
    /// Accent colour, `#rgb` or `#rrggbb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colour: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<String>,
    /// A `data:image/...;base64,` URI: the page loads nothing from another host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logo: Option<String>,
}

const MAX_URL: usize = 2048;
const MAX_NAME: usize = 80;
const MAX_LOGO: usize = 12 * 1024;
const LOGO_TYPES: &[&str] = &["png", "jpeg", "gif", "webp", "svg+xml"];

impl PageSettings {
    /// # Errors
    /// What is wrong with the first field that is, for a 400.
    pub fn check(&self) -> Result<(), String> {
        if let Some(u) = &self.return_url {
            let ok = u.len() <= MAX_URL
                && (u.starts_with("https://") || u.starts_with("http://"))
                && u.len() > "https://".len()
                && !u.contains(char::is_whitespace)
                && !u.contains(['"', '<', '>', '\\', '#']);
            if !ok {
                return Err(format!(
                    "queue.page.return_url must be an absolute http(s) URL of at most {MAX_URL} characters, without a fragment (the admission token goes there)"
                ));
            }
        }
        if let Some(n) = &self.site_name {
            if n.trim().is_empty()
                || n.chars().count() > MAX_NAME
                || n.chars().any(char::is_control)
                || n.contains("{{")
            {
                return Err(format!(
                    "queue.page.site_name must be 1..={MAX_NAME} printable characters"
                ));
            }
        }
        for (field, c) in [("colour", &self.colour), ("background", &self.background)] {
            if let Some(c) = c {
                let hex = c.strip_prefix('#').unwrap_or("");
                if !(matches!(hex.len(), 3 | 6) && hex.chars().all(|x| x.is_ascii_hexdigit())) {
                    return Err(format!("queue.page.{field} must be #rgb or #rrggbb"));
                }
            }
        }
        if let Some(l) = &self.logo {
            let ok = l.len() <= MAX_LOGO
                && l.strip_prefix("data:image/").is_some_and(|rest| {
                    rest.split_once(";base64,").is_some_and(|(kind, data)| {
                        LOGO_TYPES.contains(&kind)
                            && !data.is_empty()
                            && data
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
                    })
                });
            if !ok {
                return Err(format!(
                    "queue.page.logo must be a data:image/(png|jpeg|gif|webp|svg+xml);base64 URI of at most {MAX_LOGO} bytes (the page loads nothing from another host)"
                ));
            }
        }
        Ok(())
    }
}

/// The languages the page speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    En,
    De,
}

impl Lang {
    /// The visitor's language from `Accept-Language`: the supported one of the highest
    /// weight, English when none is.
    pub fn from_header(header: Option<&str>) -> Lang {
        let mut best = (0.0_f32, Lang::En);
        for part in header.unwrap_or("").split(',') {
            let mut bits = part.split(';');
            let tag = bits.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = bits
                .find_map(|b| {
                    b.trim()
                        .strip_prefix("q=")
                        .and_then(|v| v.parse::<f32>().ok())
                })
                .unwrap_or(1.0);
            let lang = match tag.split('-').next().unwrap_or("") {
                "de" => Lang::De,
                "en" => Lang::En,
                _ => continue,
            };
            if q > best.0 {
                best = (q, lang);
            }
        }
        best.1
    }

    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::De => "de",
        }
    }

    /// The page's words, as the JSON its script reads.
    fn words(self) -> serde_json::Value {
        match self {
            Lang::En => serde_json::json!({
                "title": "Waiting room",
                "joining": "Joining…",
                "prequeue": "You are in the pre-queue",
                "waiting": "You are in line",
                "admitted": "It is your turn",
                "sold_out": "Sold out",
                "expired": "Your turn has passed",
                "closed": "The sale has closed",
                "drawn_at": "The order is drawn at {time}, in {left}",
                "position": "Position {position} of {waiting}",
                "eta": "About {left} to go",
                "valid_until": "Your admission token (valid until {time}): ",
                "handing_over": "Taking you to {site}…",
                "sold_out_text": "Every unit is taken. You may join the waitlist for units that come back.",
                "expired_text": "Your admission was not used in time.",
                "unavailable": "The waiting room is unavailable right now; your place is kept. Retrying.",
                "connection": "Connection lost; retrying.",
                "no_token": "No visitor token",
                "no_token_text": "Open this page from the shop's link (it carries your visitor token).",
                "the_shop": "the shop"
            }),
            Lang::De => serde_json::json!({
                "title": "Warteraum",
                "joining": "Anmeldung…",
                "prequeue": "Sie sind in der Vorwarteschlange",
                "waiting": "Sie sind in der Warteschlange",
                "admitted": "Sie sind an der Reihe",
                "sold_out": "Ausverkauft",
                "expired": "Ihre Zeit ist abgelaufen",
                "closed": "Der Verkauf ist beendet",
                "drawn_at": "Die Reihenfolge wird um {time} ausgelost, in {left}",
                "position": "Platz {position} von {waiting}",
                "eta": "Noch etwa {left}",
                "valid_until": "Ihr Einlass-Token (gültig bis {time}): ",
                "handing_over": "Sie werden zu {site} weitergeleitet…",
                "sold_out_text": "Alle Einheiten sind vergeben. Sie können sich auf die Warteliste für zurückkommende Einheiten setzen.",
                "expired_text": "Ihr Einlass wurde nicht rechtzeitig genutzt.",
                "unavailable": "Der Warteraum ist gerade nicht erreichbar; Ihr Platz bleibt erhalten. Neuer Versuch läuft.",
                "connection": "Verbindung unterbrochen; neuer Versuch läuft.",
                "no_token": "Kein Besucher-Token",
                "no_token_text": "Öffnen Sie diese Seite über den Link des Shops (er enthält Ihr Besucher-Token).",
                "the_shop": "den Shop"
            }),
        }
    }
}

/// The page for `sku` with the shop's settings (none: the plain page) in `lang`.
pub fn render(sku: &str, page: Option<&PageSettings>, lang: Lang) -> String {
    let default = PageSettings::default();
    let p = page.unwrap_or(&default);
    let config = serde_json::json!({
        "return_url": p.return_url,
        "site_name": p.site_name,
        "lang": lang.code(),
        "words": lang.words(),
    });
    // Inside a <script> element: no `</script>` may appear, whatever a setting holds.
    let config = config.to_string().replace('<', "\\u003c");
    let logo = p.logo.as_deref().map_or(String::new(), |l| {
        format!(r#"<img id="logo" src="{l}" alt="" height="40">"#)
    });
    include_str!("page.html")
        .replace("{{LANG}}", lang.code())
        .replace("{{COLOUR}}", p.colour.as_deref().unwrap_or("#2a7"))
        .replace("{{BACKGROUND}}", p.background.as_deref().unwrap_or("#fff"))
        .replace("{{SITE}}", &escape(p.site_name.as_deref().unwrap_or("")))
        .replace("{{LOGO}}", &logo)
        .replace("{{CONFIG}}", &config)
        .replace("{{SKU}}", sku)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_language_is_the_supported_one_of_the_highest_weight() {
        assert_eq!(Lang::from_header(None), Lang::En);
        assert_eq!(Lang::from_header(Some("de-DE,de;q=0.9,en;q=0.8")), Lang::De);
        assert_eq!(
            Lang::from_header(Some("fr-FR, en;q=0.5, de;q=0.7")),
            Lang::De
        );
        assert_eq!(Lang::from_header(Some("fr-FR")), Lang::En);
    }

    #[test]
    fn settings_that_would_break_the_page_are_refused() {
        let bad = [
            PageSettings {
                return_url: Some("javascript:alert(1)".into()),
                ..Default::default()
            },
            PageSettings {
                return_url: Some("https://x/\"><script>".into()),
                ..Default::default()
            },
            PageSettings {
                colour: Some("red; background: url(x)".into()),
                ..Default::default()
            },
            PageSettings {
                site_name: Some(String::new()),
                ..Default::default()
            },
            PageSettings {
                logo: Some("https://cdn.example/logo.png".into()),
                ..Default::default()
            },
            PageSettings {
                logo: Some("data:image/png;base64,\"onerror=".into()),
                ..Default::default()
            },
        ];
        for b in bad {
            assert!(b.check().is_err(), "{b:?}");
        }
        let good = PageSettings {
            return_url: Some("https://shop.example/checkout?x=1".into()),
            site_name: Some("Shop </script> & Co".into()),
            colour: Some("#0a7".into()),
            background: Some("#fafafa".into()),
            logo: Some("data:image/png;base64,iVBORw0KGgo=".into()),
        };
        assert!(good.check().is_ok());
        let html = render("drop-1", Some(&good), Lang::De);
        assert!(
            !html.contains("Shop </script>"),
            "escaped in HTML and in the script's JSON"
        );
        assert!(html.contains("Shop &lt;/script&gt; &amp; Co"));
        assert!(html.contains(r#"<html lang="de">"#));
    }
}
