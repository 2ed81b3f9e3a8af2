// sqlx::migrate! embeds migrations/ at compile time; without this, a new migration alone does
// not rebuild the crate, and the binary ships without it.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
