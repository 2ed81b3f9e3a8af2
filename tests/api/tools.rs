//! System tools some tests drive (promtool, chromium), installed from Debian's packages when
//! missing, so `cargo test` passes on a fresh machine of this kind. A test that needs a tool
//! fails when it cannot be had; it never skips. (The same `require` as main's
//! tests/api/tools.rs of the `cli` branch: at a merge, keep that one.)

use std::process::Command;

/// The path of `binary`, installing Debian's `package` first when it is not on the PATH.
/// Concurrent callers install once (apt's own lock would make the second one fail).
///
/// # Panics
/// When the tool is missing and cannot be installed (no apt-get, no network to the mirror).
pub fn require(binary: &'static str, package: &str) -> std::path::PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = which(binary) {
        return path.into();
    }
    eprintln!("{binary} is missing; installing the Debian package {package}");
    // The packages' own services are never started (prometheus would start one): a
    // policy-rc.d that refuses service starts, for the length of the install.
    let policy = std::path::Path::new("/usr/sbin/policy-rc.d");
    let own_policy = !policy.exists()
        && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok()
        && Command::new("chmod")
            .args(["+x", "/usr/sbin/policy-rc.d"])
            .status()
            .is_ok_and(|s| s.success());
    let installed = Command::new("sh")
        .args([
            "-c",
            &format!(
                "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
                 apt-get install -y -qq --no-install-recommends {package}"
            ),
        ])
        .output();
    if own_policy {
        let _ = std::fs::remove_file(policy);
    }
    match (installed, which(binary)) {
        (_, Some(path)) => path.into(),
        (Ok(out), None) => panic!(
            "{binary} is not installed and `apt-get install {package}` did not install it:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        (Err(e), None) => panic!("{binary} is not installed and apt-get could not run: {e}"),
    }
}

fn which(binary: &str) -> Option<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/usr/bin"])
        .map(|dir| format!("{dir}/{binary}"))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()));
    found
}
