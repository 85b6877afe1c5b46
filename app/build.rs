//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the
//! `migrations/` directory at compile time, and cargo does not watch it alone.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
