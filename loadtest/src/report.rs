//! Makes goose's HTML report render its charts offline.
//!
//! goose 0.19 writes `<script src="https://cdn.jsdelivr.net/npm/echarts@5.2.2/dist/echarts.min.js">`
//! into the report's head, so its charts stay blank where that CDN cannot be reached. This
//! replaces that element with the same file, vendored from the npm package `echarts@5.2.2`
//! (see `vendor/README.md`). The whole build is needed: besides line charts with a time axis,
//! toolbox, legend and data zoom, the report's latency heatmap draws a `custom` series on a
//! log axis, which the smaller `echarts.common` and `echarts.simple` builds leave out.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use goose::config::{GooseConfiguration, RUN_FOLDER};

/// The version goose 0.19 references; a report naming another one is left alone.
pub const ECHARTS_VERSION: &str = "5.2.2";
const ECHARTS_JS: &str = include_str!("../vendor/echarts-5.2.2.min.js");
/// Marks a report already processed, so running twice changes nothing.
const INLINED_MARK: &str = "<!-- echarts inlined by dropgate-loadtest -->";

#[derive(Debug, PartialEq, Eq)]
pub enum InlineError {
    /// No `<script src=...echarts...>` and no mark of an earlier run.
    NoReference,
    /// The report wants another ECharts than the vendored one.
    OtherVersion(String),
}

impl std::fmt::Display for InlineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InlineError::NoReference => f.write_str("the report references no ECharts script"),
            InlineError::OtherVersion(src) => write!(
                f,
                "the report loads {src}, not ECharts {ECHARTS_VERSION}: vendor that version"
            ),
        }
    }
}

/// Replaces the report's ECharts `<script src>` element with the vendored script.
///
/// # Errors
/// [`InlineError`] when the report references no ECharts, or another version of it.
pub fn inline_charts(html: &str) -> Result<String, InlineError> {
    let Some((start, end, src)) = find_echarts_script(html) else {
        return if html.contains(INLINED_MARK) {
            Ok(html.to_string())
        } else {
            Err(InlineError::NoReference)
        };
    };
    if !src.contains(&format!("echarts@{ECHARTS_VERSION}/")) {
        return Err(InlineError::OtherVersion(src.to_string()));
    }
    let mut out = String::with_capacity(html.len() + ECHARTS_JS.len() + 256);
    out.push_str(&html[..start]);
    out.push_str(INLINED_MARK);
    out.push_str("\n    <script>/* Apache ECharts ");
    out.push_str(ECHARTS_VERSION);
    out.push_str(" (Apache-2.0), was ");
    out.push_str(src);
    out.push_str(" */\n");
    out.push_str(ECHARTS_JS);
    out.push_str("\n</script>");
    out.push_str(&html[end..]);
    Ok(out)
}

/// The byte range of the first `<script src="...echarts...">` `</script>` pair, and its src.
fn find_echarts_script(html: &str) -> Option<(usize, usize, &str)> {
    let mut from = 0;
    while let Some(rel) = html[from..].find("<script src=\"") {
        let start = from + rel;
        let src_start = start + "<script src=\"".len();
        let src_len = html[src_start..].find('"')?;
        let src = &html[src_start..src_start + src_len];
        let close = html[src_start + src_len..].find("</script>")?;
        let end = src_start + src_len + close + "</script>".len();
        if src.contains("echarts") {
            return Some((start, end, src));
        }
        from = end;
    }
    None
}

/// The HTML reports this run wrote: every `--report-file` ending in .html or .htm, and for a
/// `--report-file` given without a path, the `report.html` of the run's folder written since
/// `since` (goose picks the folder: `--output-dir`, or `goose-runs/<start time>`, with `-2`,
/// `-3`, ... when taken).
pub fn html_reports(config: &GooseConfiguration, since: SystemTime) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = config
        .report_file
        .iter()
        .filter(|f| *f != RUN_FOLDER)
        .map(PathBuf::from)
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm"))
        })
        .collect();
    if config.report_file.iter().any(|f| f == RUN_FOLDER) {
        let (parent, prefix) = match config.output_dir.as_deref().filter(|d| !d.is_empty()) {
            Some(dir) => {
                let dir = Path::new(dir);
                let parent = dir
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
                (parent.to_path_buf(), name)
            }
            None => (PathBuf::from("goose-runs"), None),
        };
        if let Some(found) = newest_run_report(&parent, prefix.as_deref(), since) {
            out.push(found);
        }
    }
    out
}

fn newest_run_report(parent: &Path, prefix: Option<&str>, since: SystemTime) -> Option<PathBuf> {
    std::fs::read_dir(parent)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            prefix.is_none_or(|p| name == p || name.starts_with(&format!("{p}-")))
        })
        .map(|e| e.path().join("report.html"))
        .filter_map(|p| {
            let modified = std::fs::metadata(&p).ok()?.modified().ok()?;
            (modified >= since).then_some((modified, p))
        })
        .max()
        .map(|(_, p)| p)
}

/// Marks the verdict section, so a report processed twice carries one.
const VERDICT_START: &str = "<!-- dropgate-loadtest verdict -->";
const VERDICT_END: &str = "<!-- /dropgate-loadtest verdict -->";

/// The invariants' verdict as an HTML section: PASS or FAIL, then each scenario and what
/// failed in it.
pub fn verdict_html(verdicts: &[(&str, Vec<String>)]) -> String {
    // Text and attribute safe: `'` and `"` too, whatever a failure line says.
    let esc = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
            .replace('\'', "&#39;")
    };
    let pass = verdicts.iter().all(|(_, f)| f.is_empty());
    let mut out = format!(
        "{VERDICT_START}<section id=\"dropgate-invariants\" style=\"margin:1em;padding:0.6em 1em;\
         border:3px solid {c};font-family:sans-serif\"><h2 style=\"color:{c};margin:0 0 0.3em\">\
         dropgate invariants: {word}</h2><ul>",
        c = if pass { "#2da44e" } else { "#cf222e" },
        word = if pass { "PASS" } else { "FAIL" },
    );
    for (name, failures) in verdicts {
        if failures.is_empty() {
            out.push_str(&format!(
                "<li><b>{}</b>: every invariant held</li>",
                esc(name)
            ));
        } else {
            out.push_str(&format!(
                "<li><b>{}</b>: {} failed<ul>",
                esc(name),
                failures.len()
            ));
            for f in failures {
                out.push_str(&format!("<li>{}</li>", esc(f)));
            }
            out.push_str("</ul></li>");
        }
    }
    out.push_str("</ul></section>");
    out.push_str(VERDICT_END);
    out
}

/// Puts `section` at the top of the report's body, replacing one an earlier run put there.
pub fn with_verdict(html: &str, section: &str) -> String {
    if let (Some(a), Some(b)) = (html.find(VERDICT_START), html.find(VERDICT_END)) {
        if a < b {
            return format!("{}{section}{}", &html[..a], &html[b + VERDICT_END.len()..]);
        }
    }
    match body_content_start(html) {
        Some(at) => format!("{}{section}{}", &html[..at], &html[at..]),
        None => format!("{section}{html}"),
    }
}

/// Where the real `<body>` element's content starts: the first `<body` tag outside comments,
/// `<script>` and `<style>` elements (the inlined ECharts holds the string `<body` in its code).
fn body_content_start(html: &str) -> Option<usize> {
    let lower = html.to_ascii_lowercase();
    let mut at = 0;
    while let Some(rel) = lower[at..].find('<') {
        let tag = at + rel;
        let rest = &lower[tag..];
        let skip_to = |close: &str| lower[tag..].find(close).map(|i| tag + i + close.len());
        if rest.starts_with("<!--") {
            at = skip_to("-->")?;
        } else if rest.starts_with("<script") || rest.starts_with("<style") {
            let close = if rest.starts_with("<script") {
                "</script"
            } else {
                "</style"
            };
            at = skip_to(close)?;
        } else if rest.starts_with("<body")
            && rest[5..].starts_with(|c: char| c == '>' || c.is_ascii_whitespace())
        {
            return rest.find('>').map(|j| tag + j + 1);
        } else {
            at = tag + 1;
        }
    }
    None
}

/// Writes the verdict into one report file and inlines ECharts, in place.
///
/// # Errors
/// A sentence naming the file and what went wrong.
pub fn finish_file(path: &Path, verdicts: &[(&str, Vec<String>)]) -> Result<(), String> {
    let html = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let out = inline_charts(&html).map_err(|e| format!("{}: {e}", path.display()))?;
    let out = with_verdict(&out, &verdict_html(verdicts));
    if out != html {
        std::fs::write(path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"<head><style></style>
    <script src="https://cdn.jsdelivr.net/npm/echarts@5.2.2/dist/echarts.min.js"></script>
</head><body><script type="text/javascript">var c = echarts.init(d);</script></body>"#;

    #[test]
    fn the_cdn_script_is_replaced_by_the_vendored_one() {
        let out = inline_charts(REPORT).unwrap();
        assert!(!out.contains("<script src="));
        assert!(out.contains(ECHARTS_JS));
        assert!(out.ends_with("var c = echarts.init(d);</script></body>"));
    }

    #[test]
    fn inlining_twice_changes_nothing() {
        let once = inline_charts(REPORT).unwrap();
        assert_eq!(inline_charts(&once).unwrap(), once);
    }

    #[test]
    fn another_version_or_no_reference_is_refused() {
        let other = REPORT.replace("5.2.2", "5.4.0");
        assert!(matches!(
            inline_charts(&other),
            Err(InlineError::OtherVersion(_))
        ));
        assert_eq!(
            inline_charts("<html></html>"),
            Err(InlineError::NoReference)
        );
    }

    #[test]
    fn the_report_shows_the_verdict_at_its_top_once() {
        let fail = vec![
            ("hot_sku_drop", vec![]),
            (
                "retry_storm",
                vec!["lt-1-retry: not sold out (3 of 10 left) <&>".to_string()],
            ),
        ];
        let once = with_verdict(REPORT, &verdict_html(&fail));
        let body = once.find("<body>").unwrap();
        let verdict = once.find("dropgate invariants: FAIL").unwrap();
        assert!(verdict > body && verdict < once.find("var c =").unwrap());
        assert!(once.contains("<b>hot_sku_drop</b>: every invariant held"));
        assert!(once.contains("not sold out (3 of 10 left) &lt;&amp;&gt;"));
        let pass = vec![("hot_sku_drop", vec![])];
        let twice = with_verdict(&once, &verdict_html(&pass));
        assert_eq!(twice.matches("dropgate invariants:").count(), 1);
        assert!(twice.contains("dropgate invariants: PASS"));
    }

    #[test]
    fn an_apostrophe_or_quote_in_a_failure_is_escaped() {
        let v = vec![(
            "queue_drop",
            vec!["buyer's token \"x\" refused".to_string()],
        )];
        let html = verdict_html(&v);
        assert!(html.contains("buyer&#39;s token &quot;x&quot; refused"));
        assert!(!html.contains("buyer's"));
    }

    #[test]
    fn a_body_string_inside_a_script_or_comment_is_not_the_body() {
        let html = "<html><head><!-- <body> --><script>var s = '<body>';</script>\
                    <style>p:before{content:'<body>'}</style></head><body class=x><p>r</p></body>";
        let out = with_verdict(html, "[V]");
        assert!(out.contains("<body class=x>[V]<p>r</p>"), "{out}");
        assert_eq!(out.matches("[V]").count(), 1);
    }

    /// A report goose itself wrote (a one-second run whose only request is a custom one, so
    /// no server is needed), inlined and given the verdict as the run's end does.
    #[test]
    fn a_real_goose_report_shows_the_verdict_right_after_its_body_tag() {
        let dir = std::env::temp_dir().join(format!("lt-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.html");
        goose_report(&path);
        let verdicts = vec![("hot_sku_drop", vec!["the buyer's count: 2 > 1".to_string()])];
        finish_file(&path, &verdicts).unwrap();
        let html = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        // The inlined ECharts holds `<body` in its code: the first match is not the tag.
        let first_body = html.find("<body").unwrap();
        let verdict = html.find(VERDICT_START).unwrap();
        let real_body = body_content_start(&html).unwrap();
        assert!(
            first_body < real_body,
            "the inlined script's `<body` comes first"
        );
        assert_eq!(verdict, real_body, "the verdict opens the body");
        let before = &html[..verdict].to_ascii_lowercase();
        assert_eq!(
            before.matches("<script").count(),
            before.matches("</script>").count(),
            "the verdict is outside every script"
        );
        assert!(html.contains("dropgate invariants: FAIL"));
        assert!(html.contains("the buyer&#39;s count: 2 &gt; 1"));
    }

    fn goose_report(path: &Path) {
        use goose::prelude::*;
        async fn noop(user: &mut GooseUser) -> TransactionResult {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            user.record_custom_request("CUSTOM", "noop", 1, true, None, None)
                .await
        }
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            GooseAttack::initialize_with_config(GooseConfiguration::default())
                .unwrap()
                .register_scenario(scenario!("report").register_transaction(transaction!(noop)))
                .set_default(GooseDefault::Host, "http://127.0.0.1:9")
                .unwrap()
                .set_default(GooseDefault::Users, 1)
                .unwrap()
                .set_default(GooseDefault::IncreaseRate, "1")
                .unwrap()
                .set_default(GooseDefault::RunTime, 1)
                .unwrap()
                .set_default(GooseDefault::NoTelnet, true)
                .unwrap()
                .set_default(GooseDefault::Quiet, 1)
                .unwrap()
                .set_default(GooseDefault::ReportFile, path.to_str().unwrap())
                .unwrap()
                .execute()
                .await
                .unwrap();
        });
    }

    #[test]
    fn the_vendored_script_cannot_end_its_script_element_early() {
        let lower = ECHARTS_JS.to_ascii_lowercase();
        assert!(!lower.contains("</script"));
        assert!(!lower.contains("<!--"));
        assert!(ECHARTS_JS.contains("echarts"));
    }
}
