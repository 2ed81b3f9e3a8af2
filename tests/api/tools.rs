//! The system tools some tests drive (headless Chromium, nats-server, iproute2, python3,
//! promtool, faketime): a test that needs one calls [`require`], which installs the Debian
//! package once when the command is missing, so `cargo test --workspace` passes by itself
//! on a fresh machine of this kind. A tool that cannot be installed fails the test, saying
//! what to install; nothing is skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{LazyLock, Mutex};

/// Commands already found or installed in this run, so each package is installed once even
/// when many tests ask for it at the same time.
static FOUND: LazyLock<Mutex<HashMap<&'static str, PathBuf>>> = LazyLock::new(Default::default);

/// Debian puts daemons in /usr/sbin, which a non-login PATH may lack.
const EXTRA_DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// The path of `command`, installing Debian's `package` first when it is missing.
///
/// # Panics
/// When the command is missing and `apt-get install -y <package>` cannot provide it (not
/// root, no network, no such package): the message says what to install by hand.
pub fn require(command: &'static str, package: &str) -> PathBuf {
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = found.get(command) {
        return p.clone();
    }
    let path = match which(command) {
        Some(p) => p,
        None => {
            eprintln!("{command} is missing: installing the Debian package {package}");
            let log = install(package);
            which(command).unwrap_or_else(|| {
                panic!(
                    "{command} is not installed and `apt-get install -y {package}` did not \
                     provide it; install it (as root: apt-get update && apt-get install -y \
                     {package}) and run the tests again.\n{log}"
                )
            })
        }
    };
    found.insert(command, path.clone());
    path
}

fn which(command: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(command))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `apt-get install` (after an `apt-get update`, which a fresh machine needs), waiting for
/// another install's lock rather than failing on it. A package's own service is never
/// started (policy-rc.d refuses starts while it runs): a test starts the servers it needs.
/// Returns what apt-get said, for the panic of a failed install.
fn install(package: &str) -> String {
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let own_policy = !policy.exists()
        && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok()
        && Command::new("chmod")
            .args(["+x", "/usr/sbin/policy-rc.d"])
            .status()
            .is_ok_and(|s| s.success());
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "-q"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
    };
    let mut log = String::new();
    for step in [
        &["update"][..],
        &["install", "-y", "--no-install-recommends", package][..],
    ] {
        match apt(step) {
            Ok(out) => {
                log.push_str(&String::from_utf8_lossy(&out.stdout));
                log.push_str(&String::from_utf8_lossy(&out.stderr));
                if !out.status.success() {
                    break;
                }
            }
            Err(e) => {
                log.push_str(&format!("apt-get could not run: {e}"));
                break;
            }
        }
    }
    if own_policy {
        let _ = std::fs::remove_file(policy);
    }
    // The tail says why; the whole of an install is long.
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

#[test]
fn a_present_tool_is_found_without_installing() {
    let sh = require("sh", "dash");
    assert!(sh.ends_with("sh"), "{}", sh.display());
}
