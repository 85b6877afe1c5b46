//! What `seckill serve` refuses at start, and what it never prints: the
//! binary itself, run with a crafted environment.

use std::process::{Command, Output};

use crate::support::test_database_url;

/// Runs `seckill` with `args` and only the variables of `env` (plus `PATH`),
/// so no stray `SECKILL_*` of the caller's environment counts.
fn seckill(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "error")
        .envs(env.iter().copied())
        .output()
        .expect("seckill runs")
}

fn refused(env: &[(&str, &str)]) -> String {
    let output = seckill(&["serve", "--addr", "127.0.0.1:0"], env);
    assert!(!output.status.success(), "seckill started with {env:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_service_refuses_to_start_without_an_admin_token_of_32_bytes() {
    let missing = refused(&[]);
    assert!(missing.contains("SECKILL_ADMIN_TOKEN is not set"), "{missing}");
    let short = refused(&[("SECKILL_ADMIN_TOKEN", "0123456789abcdef")]);
    assert!(short.contains("16 bytes long, shorter than 32"), "{short}");
    assert!(!short.contains("0123456789abcdef"), "the error shows the token: {short}");
}

#[test]
fn development_mode_is_refused_on_an_address_other_than_loopback() {
    let output = seckill(&["serve", "--addr", "0.0.0.0:0"], &[("SECKILL_DEV", "1")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("loopback"), "{stderr}");
}

#[test]
fn the_admin_token_is_read_from_the_file_named_by_seckill_admin_token_file() {
    let dir = std::env::temp_dir().join(format!("seckill-token-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "short-secret\n").unwrap();
    let path = file.to_str().unwrap();
    // Read (its length is checked, without the newline) and never shown.
    let short = refused(&[("SECKILL_ADMIN_TOKEN_FILE", path)]);
    assert!(short.contains("12 bytes long"), "{short}");
    assert!(!short.contains("short-secret"), "{short}");
    let both = refused(&[("SECKILL_ADMIN_TOKEN_FILE", path), ("SECKILL_ADMIN_TOKEN", "x")]);
    assert!(both.contains("not both"), "{both}");
    let absent = dir.join("absent");
    let unreadable = refused(&[("SECKILL_ADMIN_TOKEN_FILE", absent.to_str().unwrap())]);
    assert!(unreadable.contains("reading SECKILL_ADMIN_TOKEN_FILE"), "{unreadable}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_values_are_refused_with_the_setting_named() {
    let max = u64::MAX.to_string();
    for (name, value, expected) in [
        ("SECKILL_SOLD_OUT_FLAG_TTL_MS", max.as_str(), "--sold-out-flag-ttl-ms"),
        ("SECKILL_REDIS_PREFIX", "{all}", "--redis-prefix"),
        ("SECKILL_AMQP_PREFIX", &"q".repeat(300), "--amqp-prefix"),
        ("SECKILL_DB_POOL_SIZE", "0", "--db-pool-size"),
    ] {
        let stderr = refused(&[(name, value), ("SECKILL_DEV", "1")]);
        assert!(stderr.contains(expected), "{name}={value}: {stderr}");
    }
}

#[test]
fn secrets_are_never_printed_by_help_or_start_up_errors() {
    let database = test_database_url();
    let secret_urls = [
        ("DATABASE_URL", "postgres://postgres:db-s3cret@127.0.0.1:1/seckill"),
        ("REDIS_URL", "redis://:redis-s3cret@127.0.0.1:1"),
        ("AMQP_URL", "amqp://guest:amqp-s3cret@127.0.0.1:1/%2f"),
        (
            "SECKILL_LOCK_REDLOCK_URLS",
            "redis://:redlock-s3cret@127.0.0.1:1,not a url:redlock-s3cret@",
        ),
        ("SECKILL_ADMIN_TOKEN", "admin-s3cret-admin-s3cret-admin-s3cret"),
        ("SECKILL_BUYER_JWT_KEY", "buyer-s3cret-buyer-s3cret-buyer-s3cret"),
    ];
    let help = seckill(&["serve", "--help"], &secret_urls);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("SECKILL_LOCK_REDLOCK_URLS"), "{help}");
    for secret in ["s3cret", "guest:guest"] {
        assert!(!help.contains(secret), "--help prints {secret}: {help}");
    }
    // A malformed Redlock URL stops the start; its error names the setting
    // and hides the password.
    let redlock = [
        ("DATABASE_URL", database.as_str()),
        ("SECKILL_ADMIN_TOKEN", "admin-s3cret-admin-s3cret-admin-s3cret"),
        ("SECKILL_BUYER_JWT_KEY", "buyer-s3cret-buyer-s3cret-buyer-s3cret"),
        (
            "SECKILL_LOCK_REDLOCK_URLS",
            "redis://:redlock-s3cret@127.0.0.1:1,ftp://x:redlock-s3cret@host",
        ),
        ("SECKILL_QUEUE_CONSUME", "false"),
    ];
    let stderr = refused(&redlock);
    assert!(stderr.contains("SECKILL_LOCK_REDLOCK_URLS"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

const ADMIN: (&str, &str) = ("SECKILL_ADMIN_TOKEN", "admin-token-admin-token-admin-token");

#[test]
fn the_service_refuses_to_start_without_a_buyer_token_key_unless_buyer_auth_is_off() {
    let missing = refused(&[ADMIN]);
    assert!(missing.contains("no buyer token key"), "{missing}");
    assert!(missing.contains("SECKILL_BUYER_AUTH=off"), "the way out is named: {missing}");
    let on = refused(&[ADMIN, ("SECKILL_BUYER_AUTH", "on"), ("SECKILL_DEV", "1")]);
    assert!(on.contains("SECKILL_BUYER_AUTH=on needs a buyer token key"), "{on}");
    let short = refused(&[ADMIN, ("SECKILL_BUYER_JWT_KEY", "buyer-s3cret")]);
    assert!(short.contains("12 bytes long") && !short.contains("buyer-s3cret"), "{short}");
    let both = refused(&[
        ADMIN,
        ("SECKILL_BUYER_JWT_KEY", "buyer-s3cret"),
        ("SECKILL_BUYER_JWT_PUBLIC_KEY_FILE", "/nonexistent"),
    ]);
    assert!(both.contains("not several"), "{both}");
    let bad = refused(&[ADMIN, ("SECKILL_BUYER_AUTH", "maybe")]);
    assert!(bad.contains("--buyer-auth"), "{bad}");
}

#[test]
fn a_renamed_variable_stops_the_start_and_names_its_replacement() {
    for (old, new) in [
        ("SECKILL_BATCH_MAX", "SECKILL_SQL_BATCHED_BATCH_MAX"),
        ("SECKILL_QUEUE_BATCH_SIZE", "SECKILL_QUEUE_BATCH_MAX"),
        ("REDLOCK_URLS", "SECKILL_LOCK_REDLOCK_URLS"),
    ] {
        let stderr = refused(&[(old, "7"), ("SECKILL_DEV", "1")]);
        assert!(stderr.contains(old) && stderr.contains(new), "{old}: {stderr}");
    }
}

#[test]
fn serve_help_groups_the_settings_by_owner() {
    let help = seckill(&["serve", "--help"], &[]);
    let help = String::from_utf8_lossy(&help.stdout);
    for heading in [
        "Instance:",
        "HTTP server:",
        "Authentication:",
        "Backing servers:",
        "Order lifecycle:",
        "Strategies:",
        "Strategy queue:",
        "Strategy redis-decr:",
        "Strategy sql/batched:",
        "Strategies lock/*:",
    ] {
        assert!(help.contains(&format!("\n{heading}\n")), "no {heading} in: {help}");
    }
    assert!(help.contains("--queue-batch-max") && !help.contains("--batch-max "), "{help}");
}
