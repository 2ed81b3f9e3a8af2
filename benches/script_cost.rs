//! What `claim.lua` costs Redis per claim, measured in Redis itself: a private `redis-server`
//! runs fixed batches of claims sent through the real wrapper (`scripts::claim_invocation_at`),
//! one call in flight, as a SKU's lane sends them.
//!
//! Two kinds of figure (docs/performance.md, "The claim script's cost"):
//! - **Instructions** (exact, steady on a busy machine): the server runs under callgrind, and
//!   the instructions it executes are counted per claim, zeroed and dumped around each case
//!   (`callgrind_control`). Twice: inside `EVALSHA` only (`--toggle-collect=evalShaCommand`:
//!   the script, its arguments turned into Lua values, its commands, its reply turned back),
//!   and for the whole request (`readQueryFromClient`, which reads, parses and runs it, and
//!   the reply's write: what the event loop adds on top).
//! - **Microseconds** (wall time, drifts with the machine's load): the same cases on a
//!   server without valgrind, `INFO commandstats` per claim (`EVALSHA`, and each command the
//!   script calls, counted inside it again) and `used_cpu` per claim.
//!
//! ```text
//! cargo bench --bench script_cost                 # every case, both kinds (valgrind needed)
//! SCRIPT_COST_CALLGRIND=0 cargo bench --bench script_cost   # microseconds only
//! SCRIPT_COST_CALLS=400 cargo bench --bench script_cost     # calls per case (default 200)
//! SCRIPT_COST_KEEP=1 cargo bench --bench script_cost   # keep the dumps for callgrind_annotate
//! SCRIPT_COST_REDIS=/path/to/redis-server cargo bench --bench script_cost  # another build
//! SCRIPT_COST_MODES=script SCRIPT_COST_TIMED=0 SCRIPT_COST_JSON=out.json \
//!     cargo test --bench script_cost -- --bench   # CI's gate: EVALSHA only, as JSON
//! ```
//!
//! Cases (`<terms>/<claims per call>`; every claim of one unit, by the next of 5,000 buyers in a
//! cycle (as `ratio.sh`'s), under a per-user limit that never binds, so every claim wins; a
//! keyed claim's key is new): `plain/1`, `plain/19` (the mean batch of `ratio.sh` at 64 connections),
//! `plain/128`, `keyed/19` (each claim with an Idempotency-Key), `held/19` (a SKU that holds
//! its claims), and `reference/1`: the bare reference's script (`loadtest/src/bin/reference.lua`,
//! one `EVALSHA` a claim), the yardstick of `ratio.sh`. Under `cargo test --benches` (CI) each case runs twice without valgrind, to
//! check that it works. Needs `redis-server` on the PATH.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use uuid::Uuid;

use dropgate::ids;
use dropgate::keys::SkuKeys;
use dropgate::scripts::{self, ClaimInput, Decision, Floor, Terms};

const TOTAL: i64 = 1_000_000_000_000;
/// Buyers, cycled as `ratio.sh`'s are: the per-user counts hold this many fields.
const BUYERS: u64 = 5_000;
/// Calls before the counted ones: the call records' bucket past Redis's small-hash encoding
/// (512 fields: below it `HEXISTS` and `HSET` walk a listpack of call ids), as a SKU's bucket
/// is after a second of a sale.
const WARMUP_CALLS: usize = 600;

struct Case {
    name: &'static str,
    claims: usize,
    keyed: bool,
    hold_ms: i64,
    /// The bare reference's script instead of claim.lua: one claim a call.
    reference: bool,
}

/// The bare reference's script (`loadtest/src/bin/reference.rs`).
const REFERENCE_LUA: &str = include_str!("../loadtest/src/bin/reference.lua");

const fn case(name: &'static str, claims: usize, keyed: bool, hold_ms: i64) -> Case {
    Case {
        name,
        claims,
        keyed,
        hold_ms,
        reference: false,
    }
}

const CASES: &[Case] = &[
    case("plain/1", 1, false, 0),
    case("plain/19", 19, false, 0),
    case("plain/128", 128, false, 0),
    case("keyed/19", 19, true, 0),
    case("held/19", 19, false, 600_000),
    Case {
        name: "reference/1",
        claims: 1,
        keyed: false,
        hold_ms: 0,
        reference: true,
    },
];

/// How the server is watched.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Instructions inside `EVALSHA` only.
    Script,
    /// Instructions of the whole request: read, parse, run, reply.
    Request,
    /// `INFO commandstats` and `used_cpu`, no valgrind.
    Time,
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let calls: usize = if bench {
        env_num("SCRIPT_COST_CALLS", 200)
    } else {
        2
    };
    let callgrind = bench && std::env::var("SCRIPT_COST_CALLGRIND").map_or(true, |v| v != "0");
    // CI's gate (benches/baselines/README.md) counts only inside EVALSHA and skips the wall
    // times: callgrind's two passes and the timed one take three minutes, one pass about one.
    let modes = std::env::var("SCRIPT_COST_MODES").unwrap_or_else(|_| "script,request".into());
    let timed = std::env::var("SCRIPT_COST_TIMED").map_or(true, |v| v != "0");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut rows: Vec<(&str, Option<f64>, Option<f64>, String)> = CASES
        .iter()
        .map(|c| (c.name, None, None, String::new()))
        .collect();
    if callgrind {
        for (mode, col) in [(Mode::Script, "script"), (Mode::Request, "request")] {
            if !modes.split(',').any(|m| m.trim() == col) {
                continue;
            }
            let server = Server::start(mode);
            for (i, case) in CASES.iter().enumerate() {
                let n = rt.block_on(server.instructions(case, calls));
                if mode == Mode::Script {
                    rows[i].1 = Some(n);
                } else {
                    rows[i].2 = Some(n);
                }
            }
        }
    }
    if timed || !callgrind {
        let server = Server::start(Mode::Time);
        for (i, case) in CASES.iter().enumerate() {
            rows[i].3 = rt.block_on(server.timed(case, calls * 10));
        }
    }
    println!(
        "claim.lua per claim ({calls} calls a case under callgrind, {} timed):",
        calls * 10
    );
    println!(
        "{:<10} {:>16} {:>16}  microseconds (INFO commandstats, used_cpu)",
        "case", "instr in EVALSHA", "instr request"
    );
    for (name, script, request, timed) in &rows {
        let f = |v: &Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        println!("{name:<10} {:>16} {:>16}  {timed}", f(script), f(request));
    }
    if let Some(path) = std::env::var_os("SCRIPT_COST_JSON") {
        write_json(Path::new(&path), calls, &rows);
    }
}

/// The instruction counts as the gate reads them (`tools/benchgate`): per case, the count
/// inside EVALSHA and for the whole request, each present only when measured.
fn write_json(path: &Path, calls: usize, rows: &[(&str, Option<f64>, Option<f64>, String)]) {
    let cases: serde_json::Map<String, serde_json::Value> = rows
        .iter()
        .map(|(name, script, request, _)| {
            let mut m = serde_json::Map::new();
            if let Some(v) = script {
                m.insert("evalsha".into(), (v.round() as u64).into());
            }
            if let Some(v) = request {
                m.insert("request".into(), (v.round() as u64).into());
            }
            (name.to_string(), m.into())
        })
        .collect();
    let version = Command::new(redis_server())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let doc = serde_json::json!({
        "bench": "script_cost",
        "unit": "instructions per claim",
        "calls": calls,
        "redis": version,
        "cases": cases,
    });
    let text = serde_json::to_string_pretty(&doc).expect("json") + "\n";
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// `SCRIPT_COST_REDIS`, or `redis-server` on the PATH (a build with symbols names Lua's own
/// functions in the dumps).
fn redis_server() -> String {
    std::env::var("SCRIPT_COST_REDIS").unwrap_or_else(|_| "redis-server".to_string())
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A private redis-server on a free loopback port, stopped when dropped.
struct Server {
    child: Child,
    port: u16,
    /// Where callgrind writes its dumps (a fresh directory), when under callgrind.
    dumps: Option<PathBuf>,
}

impl Server {
    fn start(mode: Mode) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let redis_args = [
            "--port".to_string(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
        ];
        let (mut cmd, dumps) = if mode == Mode::Time {
            let mut cmd = Command::new(redis_server());
            cmd.args(&redis_args);
            (cmd, None)
        } else {
            let dir = std::env::temp_dir().join(format!("script-cost-{}", Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir).expect("dump directory");
            let mut cmd = Command::new("valgrind");
            cmd.arg("--tool=callgrind")
                .arg("--collect-atstart=no")
                .arg(format!("--callgrind-out-file={}/cg.%p", dir.display()));
            // A toggle turns collection on at a function's entry and off at its exit: the
            // two are not nested (the first runs inside the read of a request).
            let toggles: &[&str] = match mode {
                Mode::Script => &["evalShaCommand"],
                _ => &[
                    "readQueryFromClient",
                    "handleClientsWithPendingWritesUsingThreads",
                ],
            };
            for t in toggles {
                cmd.arg(format!("--toggle-collect={t}"));
            }
            cmd.arg(redis_server()).args(&redis_args);
            (cmd, Some(dir))
        };
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (and valgrind, for instruction counts) must be on the PATH");
        let server = Server { child, port, dumps };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let client = self.client();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(mut con) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "redis-server on port {} did not answer within 60 s",
            self.port
        );
    }

    fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).expect("redis url")
    }

    async fn connect(&self) -> MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the private redis-server")
    }

    /// A fresh SKU for `case`, warmed up (script loaded, hashes and stream created).
    async fn ready(
        &self,
        con: &mut MultiplexedConnection,
        case: &Case,
        users: &mut u64,
    ) -> SkuKeys {
        let keys = SkuKeys::new("cost", &format!("sku-{}", Uuid::new_v4().simple()));
        let terms = Terms {
            hold_ms: case.hold_ms,
            ..Terms::limit(i32::MAX)
        };
        // Every script, as a gateway loads them at start: the Lua heap the collector walks.
        scripts::load_all(con).await.expect("load the scripts");
        if case.reference {
            // The reference's stock is a plain key; its counts, a hash as claim.lua's.
            let _: () = redis::cmd("SET")
                .arg(keys.state())
                .arg(TOTAL)
                .query_async(con)
                .await
                .expect("SET the reference's stock");
        } else {
            scripts::declare_sku(con, &keys, true, TOTAL, &terms, &Uuid::nil())
                .await
                .expect("declare the SKU");
        }
        // Every buyer has a count already, as after the first seconds of a sale.
        for chunk in (0..BUYERS).collect::<Vec<_>>().chunks(1000) {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(keys.users());
            for u in chunk {
                cmd.arg(buyer(*u)).arg(0);
            }
            let _: i64 = cmd.query_async(con).await.expect("HSET users");
        }
        for _ in 0..WARMUP_CALLS {
            call(con, &keys, case, users).await;
        }
        keys
    }

    /// Instructions per claim over `calls` calls of `case`.
    async fn instructions(&self, case: &Case, calls: usize) -> f64 {
        let mut con = self.connect().await;
        let mut users = 0;
        let keys = self.ready(&mut con, case, &mut users).await;
        self.control("-z");
        for _ in 0..calls {
            call(&mut con, &keys, case, &mut users).await;
        }
        let total = self.control_dump();
        total as f64 / (calls * case.claims) as f64
    }

    fn control(&self, what: &str) {
        let ok = Command::new("callgrind_control")
            .arg(what)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .status()
            .expect("callgrind_control (valgrind) on the PATH")
            .success();
        assert!(ok, "callgrind_control {what} failed");
    }

    /// Dumps the counts since the last zero and returns their total.
    fn control_dump(&self) -> u64 {
        let dir = self.dumps.as_ref().expect("under callgrind");
        let before = dumps_in(dir).len();
        self.control("-d");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let files = dumps_in(dir);
            if files.len() > before {
                let newest = files.last().expect("a dump");
                if let Some(n) = totals(newest) {
                    return n;
                }
            }
            assert!(Instant::now() < deadline, "no callgrind dump appeared");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `INFO commandstats` and `used_cpu` per claim over `calls` calls of `case`.
    async fn timed(&self, case: &Case, calls: usize) -> String {
        let mut con = self.connect().await;
        let mut users = 0;
        let keys = self.ready(&mut con, case, &mut users).await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut con)
            .await
            .expect("CONFIG RESETSTAT");
        let cpu0 = used_cpu(&mut con).await;
        for _ in 0..calls {
            call(&mut con, &keys, case, &mut users).await;
        }
        let cpu = used_cpu(&mut con).await - cpu0;
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .expect("INFO commandstats");
        let claims = (calls * case.claims) as f64;
        let mut parts = vec![format!("used_cpu {:.3}", cpu * 1e6 / claims)];
        for line in stats.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if matches!(name, "info" | "config") {
                continue;
            }
            let usec: f64 = field(rest, "usec").unwrap_or(0.0);
            parts.push(format!("{name} {:.3}", usec / claims));
        }
        parts.join(", ")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.dumps {
            if std::env::var_os("SCRIPT_COST_KEEP").is_some() {
                eprintln!(
                    "callgrind dumps kept in {} (one per case, in order)",
                    dir.display()
                );
            } else {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

fn buyer(n: u64) -> String {
    format!("buyer-{:07}", n % BUYERS)
}

/// One call of `case` by the next buyers of the cycle; every claim must win.
async fn call(con: &mut MultiplexedConnection, keys: &SkuKeys, case: &Case, users: &mut u64) {
    if case.reference {
        *users += 1;
        let remaining: i64 = redis::Script::new(REFERENCE_LUA)
            .key(keys.state())
            .key(keys.users())
            .arg(buyer(*users))
            .arg(1)
            .arg(i64::from(i32::MAX))
            .invoke_async(con)
            .await
            .expect("reference call");
        assert!(remaining >= 0, "a reference claim did not win: {remaining}");
        return;
    }
    let claims: Vec<ClaimInput> = (0..case.claims)
        .map(|_| {
            *users += 1;
            ClaimInput {
                user: buyer(*users),
                quantity: 1,
                idempotency_key: case.keyed.then(|| format!("key-{:07}", *users)),
            }
        })
        .collect();
    let call = ids::mint_call(1);
    let inv = scripts::claim_invocation_at(
        keys,
        &call,
        &claims,
        dropgate::clock::now_ms(),
        Floor::seq(0),
    )
    .expect("a call of 1 to 128 claims");
    let reply: Value = inv.invoke_async(con).await.expect("claim.lua call");
    let decisions = scripts::parse_claim_reply(reply, &claims).expect("claim reply");
    for d in &decisions {
        assert!(
            matches!(d, Decision::Won { .. }),
            "a bench claim did not win: {d:?}"
        );
    }
}

async fn used_cpu(con: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(con)
        .await
        .expect("INFO cpu");
    ["used_cpu_sys", "used_cpu_user"]
        .iter()
        .map(|k| {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}:")))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum()
}

/// `usec=123` out of `calls=1,usec=123,usec_per_call=...`.
fn field(stats: &str, name: &str) -> Option<f64> {
    stats
        .split(',')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn dumps_in(dir: &Path) -> Vec<PathBuf> {
    // cg.<pid>.<n>, by dump number n (cg.<pid> alone is written only at exit).
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| {
                let path = e.ok()?.path();
                let name = path.file_name()?.to_str()?.to_string();
                let n = name.split('.').nth(2)?.parse().ok()?;
                Some((n, path))
            })
            .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

/// The `totals:` line of a complete dump.
fn totals(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|v| v.trim().parse().ok())
}
