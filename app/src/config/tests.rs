//! Tests of the configuration: parsing, the checks at start, the retired
//! variables, and the README's table against the command line.

use clap::Parser as _;

use super::*;

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    config: Config,
}

fn parse(args: &[&str]) -> Result<Config, clap::Error> {
    Cli::try_parse_from(std::iter::once("seckill").chain(args.iter().copied()))
        .map(|cli| cli.config)
}

fn with_token(token: Option<&str>, dev: bool, addr: &str) -> Config {
    let mut config = parse(&["--addr", addr]).expect("valid");
    config.auth.admin_token = token.map(str::to_owned);
    config.auth.dev = dev;
    // The admin token's tests: buyer authentication explicitly off.
    config.auth.buyer_auth = Some(BuyerAuthMode::Off);
    config
}

#[test]
fn the_service_refuses_a_missing_or_short_admin_token_outside_development_mode() {
    let long = "x".repeat(MIN_ADMIN_TOKEN_BYTES);
    assert!(with_token(Some(&long), false, "0.0.0.0:8080").check().is_ok());
    let missing = with_token(None, false, "127.0.0.1:8080").check().unwrap_err();
    assert!(missing.to_string().contains("SECKILL_ADMIN_TOKEN is not set"), "{missing}");
    let short = &long[1..];
    let error = with_token(Some(short), false, "127.0.0.1:8080").check().unwrap_err();
    assert!(error.to_string().contains("31 bytes long"), "{error}");
    assert!(!error.to_string().contains(short), "the message shows the token: {error}");
}

#[test]
fn development_mode_accepts_no_token_on_loopback_only() {
    assert!(with_token(None, true, "127.0.0.1:8080").check().is_ok());
    assert!(with_token(Some("short"), true, "[::1]:8080").check().is_ok());
    let long = "x".repeat(MIN_ADMIN_TOKEN_BYTES);
    for config in
        [with_token(None, true, "0.0.0.0:8080"), with_token(Some(&long), true, "10.1.2.3:80")]
    {
        let error = config.check().unwrap_err();
        assert!(error.to_string().contains("loopback"), "{error}");
    }
}

fn with_buyer(mode: Option<BuyerAuthMode>, key: Option<&str>, dev: bool) -> Config {
    let mut config = with_token(None, dev, "127.0.0.1:8080");
    config.auth.buyer_auth = mode;
    config.auth.buyer_key = key.map(|key| BuyerKey::Secret(key.to_owned()));
    config
}

#[test]
fn buyer_auth_is_on_with_a_key_and_off_only_when_asked_or_in_development_mode() {
    use BuyerAuthMode::{Off, On};
    let key = "k".repeat(32);
    let on = |config: Config| config.auth.buyer_verifier().unwrap().is_some();
    assert!(on(with_buyer(None, Some(&key), false)), "a key turns it on");
    assert!(on(with_buyer(None, Some(&key), true)), "in development mode too");
    assert!(on(with_buyer(Some(On), Some(&key), false)));
    assert!(!on(with_buyer(Some(Off), Some(&key), false)), "off is off whatever the key");
    assert!(!on(with_buyer(Some(Off), None, false)));
    assert!(!on(with_buyer(None, None, true)), "development mode without a key");
}

#[test]
fn buyer_auth_without_a_key_or_with_a_short_one_refuses_to_start() {
    use BuyerAuthMode::On;
    let unset = with_buyer(None, None, false).auth.buyer_verifier().unwrap_err().to_string();
    assert!(unset.contains("SECKILL_BUYER_AUTH=off"), "{unset}");
    let on = with_buyer(Some(On), None, true).auth.buyer_verifier().unwrap_err().to_string();
    assert!(on.contains("SECKILL_BUYER_AUTH=on needs a buyer token key"), "{on}");
    let short = with_buyer(None, Some("short-buyer-key"), false);
    let error = short.auth.buyer_verifier().unwrap_err().to_string();
    assert!(error.contains("15 bytes long") && !error.contains("short-buyer-key"), "{error}");
    let mut pem = short;
    pem.auth.buyer_key = Some(BuyerKey::PublicPem(b"junk".to_vec()));
    assert!(pem.auth.buyer_verifier().unwrap_err().to_string().contains("PEM"));
}

#[test]
fn prefixes_are_names_without_braces_or_spaces_of_at_most_64_characters() {
    for good in ["seckill", "test-1f.a_B", &"a".repeat(64)] {
        assert!(parse(&["--redis-prefix", good, "--amqp-prefix", good]).is_ok(), "{good}");
    }
    for bad in ["", "{sale}", "a b", "é", &"a".repeat(65), "x:y"] {
        assert!(parse(&["--redis-prefix", bad]).is_err(), "{bad:?}");
        assert!(parse(&["--amqp-prefix", bad]).is_err(), "{bad:?}");
    }
}

#[test]
fn durations_and_sizes_out_of_range_are_refused() {
    let max = u64::MAX.to_string();
    for flag in [
        "--sold-out-flag-ttl-ms",
        "--lock-wait-ms",
        "--lock-hold-ms",
        "--db-acquire-timeout-ms",
        "--redis-decr-reconcile-grace-ms",
        "--redis-decr-reconcile-interval-ms",
        "--request-timeout-ms",
        "--header-timeout-ms",
        "--idle-timeout-ms",
        "--queue-batch-window-ms",
    ] {
        let error =
            parse(&[flag, &max]).err().unwrap_or_else(|| panic!("{flag} accepted u64::MAX"));
        assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation, "{flag}");
    }
    for (flag, value) in
        [("--db-pool-size", "0"), ("--queue-max-length", "0"), ("--sold-out-flag-ttl-ms", "0")]
    {
        assert!(parse(&[flag, value]).is_err(), "{flag} {value}");
    }
    assert!(
        parse(&["--redis-decr-reconcile-interval-ms", "0"]).is_ok(),
        "0 turns reconciliation off"
    );
}

#[test]
fn trusted_proxies_are_addresses_or_blocks_and_none_by_default() {
    assert!(parse(&[]).unwrap().auth.trusted_proxies.is_empty());
    let config = parse(&["--trusted-proxies", "10.0.0.5, 10.1.0.0/24,fd00::/8"]).unwrap();
    let nets: Vec<String> = config.auth.trusted_proxies.iter().map(ToString::to_string).collect();
    assert_eq!(nets, ["10.0.0.5/32", "10.1.0.0/24", "fd00::/8"]);
    for bad in ["lb", "10.0.0.0/33", "10.0.0.5:8080", ""] {
        assert!(parse(&["--trusted-proxies", bad]).is_err(), "{bad:?}");
    }
}

#[test]
fn a_url_in_an_error_message_has_no_password() {
    assert_eq!(redacted("redis://:s3cret@node-1:6380"), "redis://***@node-1:6380");
    assert_eq!(redacted("amqp://user:pw@host:5672/%2f"), "amqp://***@host:5672/%2f");
    assert_eq!(redacted("redis://node-1:6380"), "redis://node-1:6380");
    assert_eq!(redacted("no-scheme@host"), "no-scheme@host");
}

/// Every variable of `seckill serve` that has a flag, with its default
/// (several defaults joined by `,`), hidden flags (test-only) left out.
fn flag_variables() -> Vec<(String, Option<String>, clap::Arg)> {
    let mut command = Config::command();
    command.build();
    command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter_map(|arg| {
            let env = arg.get_env()?.to_str().expect("variable names are UTF-8").to_owned();
            let defaults: Vec<String> =
                arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            let default = (!defaults.is_empty()).then(|| defaults.join(","));
            Some((env, default, arg.clone()))
        })
        .collect()
}

#[test]
fn every_setting_follows_the_naming_scheme_and_has_a_heading() {
    const UNPREFIXED: [&str; 3] = ["DATABASE_URL", "REDIS_URL", "AMQP_URL"];
    // The one finer unit, and why: its module says (sql/batched's window).
    const MICROSECONDS: [&str; 1] = ["SECKILL_SQL_BATCHED_BATCH_WINDOW_US"];
    let variables = flag_variables();
    let mut seen = std::collections::HashSet::new();
    for (env, _, arg) in &variables {
        assert!(seen.insert(env.clone()), "{env} is read twice");
        assert!(env.starts_with("SECKILL_") || UNPREFIXED.contains(&env.as_str()), "{env}");
        let flag = env.strip_prefix("SECKILL_").unwrap_or(env).to_lowercase().replace('_', "-");
        assert_eq!(arg.get_long(), Some(flag.as_str()), "the flag of {env}");
        assert!(arg.get_help_heading().is_some(), "{env} has no heading in --help");
        let duration = ["TIMEOUT", "TTL", "INTERVAL", "WINDOW", "RETENTION", "AFTER", "GRACE"]
            .iter()
            .any(|word| env.contains(word));
        if duration {
            let unit_ok = env.ends_with("_MS") || MICROSECONDS.contains(&env.as_str());
            assert!(unit_ok, "{env}: durations are in milliseconds, `_MS`");
        }
        let finer = env.ends_with("_S") || env.ends_with("_US");
        assert!(!finer || MICROSECONDS.contains(&env.as_str()), "{env}: milliseconds, `_MS`");
    }
}

#[test]
fn a_retired_variable_names_its_replacement_and_stops_the_start() {
    let current: Vec<String> = flag_variables().into_iter().map(|(env, ..)| env).collect();
    for retired in RETIRED {
        assert!(!current.contains(&retired.name.to_owned()), "{} is still read", retired.name);
        assert!(current.contains(&retired.replaced_by.to_owned()), "{}", retired.replaced_by);
        let error = refuse_retired(|name| name == retired.name).unwrap_err().to_string();
        assert!(error.contains(retired.name) && error.contains(retired.replaced_by), "{error}");
    }
    assert!(refuse_retired(|_| false).is_ok());
    assert!(refuse_retired(|name| current.iter().any(|env| env == name)).is_ok());
    let two = refuse_retired(|name| name == "REDLOCK_URLS" || name == "SECKILL_BATCH_MAX");
    let two = two.unwrap_err().to_string();
    assert!(two.contains("SECKILL_LOCK_REDLOCK_URLS") && two.contains("SECKILL_SQL_BATCHED"));
    let unit = refuse_retired(|name| name == "SECKILL_LOCK_INTERVALS_RETENTION_S").unwrap_err();
    assert!(unit.to_string().contains("milliseconds"), "{unit}");
}

/// The rows of the README's first table under `## Configuration`: the
/// variables of each row's first cell, and its default cell.
fn readme_rows() -> Vec<(Vec<String>, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = &readme[readme.find("\n## Configuration\n").expect("a configuration section")..];
    let table = section.lines().skip_while(|line| !line.starts_with("| variable |"));
    let rows = table.skip(2).take_while(|line| line.starts_with('|'));
    rows.map(|row| {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        let names = cells[0].split(',').map(|name| name.trim().trim_matches('`').to_owned());
        (names.collect(), cells[1].to_owned())
    })
    .collect()
}

#[test]
fn the_readme_lists_exactly_the_settings_with_their_defaults() {
    let rows = readme_rows();
    let mut listed: Vec<String> = rows.iter().flat_map(|(names, _)| names.clone()).collect();
    let default_of = |env: &str| {
        let row = rows.iter().find(|(names, _)| names.iter().any(|name| name == env));
        row.map(|(_, default)| default.clone())
    };
    let mut expected: Vec<String> = ENV_ONLY.iter().map(|env| (*env).to_owned()).collect();
    for (env, default, _) in flag_variables() {
        let cell = default_of(&env).unwrap_or_else(|| panic!("README: no row for {env}"));
        match default {
            Some(default) => assert!(
                cell.starts_with(&format!("`{default}`")),
                "README: {env} defaults to `{default}`, the table says {cell}"
            ),
            None => assert!(!cell.starts_with('`'), "README: {env} has no default: {cell}"),
        }
        expected.push(env);
    }
    for env in ENV_ONLY {
        let cell = default_of(env).unwrap_or_else(|| panic!("README: no row for {env}"));
        assert!(!cell.starts_with('`') || *env == "RUST_LOG", "README: {env}: {cell}");
    }
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected, "README.md's configuration table against `seckill serve`");
}
