//! Real services a fault test can break: a private redis-server, a private PostgreSQL, and the
//! gateway as a child process (so it can be SIGKILLed).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::helpers::*;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn scratch_dir(kind: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("dropgate-{kind}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A redis-server of the test's own, with an fsync-always append-only file so that a SIGKILL
/// and restart keeps its data (unless the test wipes the directory).
pub struct PrivateRedis {
    pub port: u16,
    dir: PathBuf,
    child: Option<std::process::Child>,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        let mut r = PrivateRedis {
            port: free_port(),
            dir: scratch_dir("redis"),
            child: None,
        };
        r.restart().await;
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn restart(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        let url = self.url();
        wait_for(Duration::from_secs(10), || {
            let url = url.clone();
            async move {
                let Ok(c) = redis::Client::open(url) else {
                    return false;
                };
                match c.get_multiplexed_async_connection().await {
                    Ok(mut con) => redis::cmd("PING")
                        .query_async::<String>(&mut con)
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
    }

    /// Freezes every client of this Redis for `ms` (CLIENT PAUSE ... ALL): calls queue, then run.
    pub async fn pause(&self, ms: u64) {
        pause_redis(&self.url(), ms).await;
    }

    /// Makes this Redis a replica of `master` and waits until its link is up.
    pub async fn replicate(&self, master: &PrivateRedis) {
        let mut con = redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port)
            .query_async(&mut con)
            .await
            .unwrap();
        wait_for(Duration::from_secs(20), || {
            let mut con = con.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                info.contains("master_link_status:up")
            }
        })
        .await;
    }

    /// Sends the process `signal` (`STOP`: it answers nothing and acknowledges nothing, its
    /// connections stay open; `CONT`: it goes on).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill is available")
            .success();
        assert!(ok, "kill -{signal} {pid}");
    }

    /// SIGKILL: no shutdown, no save.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Copies the data directory as it is now: an older snapshot to come back from later.
    pub fn snapshot(&self) -> PathBuf {
        let copy = scratch_dir("redis-snapshot");
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", self.dir.display()))
            .arg(&copy)
            .status()
            .expect("cp is available")
            .success();
        assert!(ok, "copying the Redis data directory");
        copy
    }

    /// Replaces the data directory with `snapshot` (call while killed): the next restart comes
    /// back with the older data, as after a restore from an old RDB or a lost AOF tail.
    pub fn roll_back_to(&self, snapshot: &std::path::Path) {
        self.wipe();
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", snapshot.display()))
            .arg(&self.dir)
            .status()
            .expect("cp is available")
            .success();
        assert!(ok, "restoring the Redis data directory");
    }

    /// Forgets everything, as a Redis without persistence does on restart.
    pub fn wipe(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).unwrap();
    }
}

/// CLIENT PAUSE `ms` ALL on the Redis at `url`. A connection opened while an earlier pause
/// is still in force may itself wait or time out: the pause then simply does not happen.
pub async fn pause_redis(url: &str, ms: u64) {
    let paused = async {
        let mut admin = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(ms)
            .arg("ALL")
            .query_async::<()>(&mut admin)
            .await
    };
    if let Err(e) = paused.await {
        eprintln!("CLIENT PAUSE {ms} not sent: {e}");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL cluster of the test's own, run as the `postgres` user (initdb refuses root).
pub struct PrivatePostgres {
    pub port: u16,
    dir: PathBuf,
}

fn as_postgres(args: &[&str]) -> std::process::Output {
    std::process::Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .args(args)
        .output()
        .expect("runuser is available")
}

impl PrivatePostgres {
    pub async fn start() -> Self {
        let dir = scratch_dir("pg");
        let status = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success());
        let data = dir.join("data");
        let out = as_postgres(&[
            &format!("{PG_BIN}/initdb"),
            "-D",
            data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]);
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pg = PrivatePostgres {
            port: free_port(),
            dir,
        };
        pg.up().await;
        pg
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The URL of `db` through the server's unix socket (trust auth, as over loopback): a
    /// client in another network namespace reaches it through the shared filesystem.
    pub fn socket_url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@localhost:{}/{db}?host={}",
            self.port,
            self.dir.display()
        )
    }

    pub async fn up(&self) {
        let data = self.dir.join("data");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let out = as_postgres(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            data.to_str().unwrap(),
            "-o",
            &opts,
            "-l",
            self.dir.join("log").to_str().unwrap(),
            "-w",
            "start",
        ]);
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Immediate stop: connections drop at once, as in a crash.
    pub fn down(&self) {
        let data = self.dir.join("data");
        let out = as_postgres(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            data.to_str().unwrap(),
            "-m",
            "immediate",
            "-w",
            "stop",
        ]);
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = as_postgres(&[
            &format!("{PG_BIN}/pg_ctl"),
            "-D",
            data.to_str().unwrap(),
            "-m",
            "immediate",
            "stop",
        ]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The real `dropgate serve` binary as a child process.
pub struct GatewayProcess {
    pub base: String,
    child: Child,
    /// Every line the gateway wrote (stdout and stderr), for tests of what it logs.
    log: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl GatewayProcess {
    pub async fn start(iso: &Isolation, redis_url: &str, env: &[(&str, &str)]) -> Self {
        match Self::try_start(iso, redis_url, env).await {
            Ok(g) => g,
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts the gateway; `Err` when it exits before listening (a start under faults may).
    pub async fn try_start(
        iso: &Isolation,
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        Self::try_start_in(&[], iso, redis_url, env).await
    }

    /// As [`GatewayProcess::start`], the binary run by `wrapper` (e.g. `ip netns exec <ns>`,
    /// which execs it, so the child is the gateway itself and a kill reaches it).
    pub async fn start_in(
        wrapper: &[&str],
        iso: &Isolation,
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> Self {
        match Self::try_start_in(wrapper, iso, redis_url, env).await {
            Ok(g) => g,
            Err(e) => panic!("{e}"),
        }
    }

    async fn try_start_in(
        wrapper: &[&str],
        iso: &Isolation,
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let binary = env!("CARGO_BIN_EXE_dropgate");
        let mut cmd = match wrapper.split_first() {
            None => Command::new(binary),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(binary);
                c
            }
        };
        cmd.arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .env("DROPGATE_LISTEN", "127.0.0.1:0")
            .env("REDIS_URL", redis_url)
            .env("DATABASE_URL", &iso.database_url)
            .env("DROPGATE_KEY_PREFIX", &iso.prefix)
            .env("DROPGATE_ADMISSION_SECRET", SECRET)
            .env("DROPGATE_ADMIN_TOKEN", ADMIN)
            .env("DROPGATE_REDIS_TIMEOUT_MS", "2000")
            .env("DROPGATE_JOURNAL_CLAIM_IDLE_MS", "1000")
            .env("DROPGATE_REPROCESS_BACKOFF_MS", "50")
            // The log is on stderr (stdout carries only a command's output).
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("the dropgate binary starts");
        // The log is read to the end (a full pipe would block the gateway's logging) and kept
        // for `log_lines`; DROPGATE_TEST_ECHO=1 also shows it, for debugging a failed run.
        let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (lines_tx, mut lines_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let echo = std::env::var("DROPGATE_TEST_ECHO").is_ok_and(|v| v == "1");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        {
            let log = log.clone();
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    if echo {
                        eprintln!("[gateway] {line}");
                    }
                    log.lock().push(line.clone());
                    let _ = lines_tx.send(line);
                }
            });
        }
        let addr = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines_rx.recv().await {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    return rest
                        .split_whitespace()
                        .next()
                        .and_then(|a| a.parse::<SocketAddr>().ok());
                }
            }
            None
        })
        .await
        .map_err(|_| "the gateway did not log its address within 60 s".to_string())?
        .ok_or_else(|| {
            let before = log.lock().join("\n");
            format!("the gateway exited before listening: {before}")
        })?;
        Ok(GatewayProcess {
            base: format!("http://{addr}"),
            child,
            log,
        })
    }

    /// The lines the gateway logged so far (its stderr).
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().clone()
    }

    pub async fn sigkill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM, then the exit status (bounded).
    pub async fn sigterm(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().expect("still running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::timeout(within, self.child.wait())
            .await
            .expect("the gateway exits within the bound")
            .unwrap()
    }
}

/// A nats-server of the test's own with JetStream, its store in a scratch directory that
/// survives a stop and restart (so the stream and its duplicate window come back).
pub struct PrivateNats {
    pub port: u16,
    dir: PathBuf,
    child: Option<std::process::Child>,
}

impl PrivateNats {
    pub async fn start() -> Self {
        let mut n = PrivateNats {
            port: free_port(),
            dir: scratch_dir("nats"),
            child: None,
        };
        n.restart().await;
        n
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub async fn restart(&mut self) {
        let child = std::process::Command::new(crate::tools::require("nats-server", "nats-server"))
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-sd")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is installed (apt-get install nats-server)");
        self.child = Some(child);
        let url = self.url();
        // Up means JetStream answers, not only the port.
        wait_for(Duration::from_secs(20), || {
            let url = url.clone();
            async move {
                use async_nats::jetstream::context::GetStreamErrorKind;
                let Ok(c) = async_nats::connect(url).await else {
                    return false;
                };
                // JetStream's own "stream not found" is an answer: it is up.
                match async_nats::jetstream::new(c).get_stream("up").await {
                    Ok(_) => true,
                    Err(e) => matches!(e.kind(), GetStreamErrorKind::JetStream(_)),
                }
            }
        })
        .await;
    }

    /// SIGKILL: the server is gone at once, as in a crash or a partition.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A JetStream context on this server.
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(async_nats::connect(self.url()).await.unwrap())
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
