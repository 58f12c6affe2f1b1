//! A config file's keys as the flags they stand for: each key is a `serve`
//! flag's id, its value checked by that flag's own parser, and skipped
//! where the command line (or the flag's variable) gave the flag.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::Args;

use super::{CliError, ServeArgs};
use crate::config::agents::ConfigFile;

/// Read config file `path`: its tables, and the flags its other keys stand
/// for where `given` has none.
pub(super) fn read_file(
    path: &std::path::Path,
    given: &clap::ArgMatches,
) -> Result<(ConfigFile, Vec<OsString>), CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::Invalid(format!("cannot read config file `{}`: {e}", path.display()))
    })?;
    let mut file = ConfigFile::parse(&text)
        .map_err(|e| CliError::Invalid(format!("config file `{}`: {e}", path.display())))?;
    // Where the journal lives is one choice: a store given on the command
    // line (or by its variable) replaces the file's whole choice.
    if store_given(given) {
        file.cluster = None;
    }
    if explicit(given, "lease_secs") {
        if let Some(c) = file.cluster.as_mut() {
            c.lease_secs = None;
        }
    }
    let extra = file_flags(&text, given)
        .map_err(|e| CliError::Invalid(format!("config file `{}`, {e}", path.display())))?;
    Ok((file, extra))
}

/// The keys that choose where the journal lives.
const STORE_KEYS: [&str; 3] = ["data_dir", "in_memory", "cluster"];

/// Whether flag `id` was given on the command line or by its variable.
fn explicit(given: &clap::ArgMatches, id: &str) -> bool {
    matches!(
        given.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// Whether the command line (or a variable) chose where the journal lives.
fn store_given(given: &clap::ArgMatches) -> bool {
    STORE_KEYS.iter().any(|k| explicit(given, k))
}

/// The flags a config file's keys stand for, for the keys whose flag was
/// not given (on the command line or by its environment variable).
fn file_flags(text: &str, given: &clap::ArgMatches) -> Result<Vec<OsString>, String> {
    let keys: BTreeMap<String, toml::Spanned<toml::Value>> =
        toml::from_str(text).map_err(|e| e.to_string())?;
    let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
    let mut flags = Vec::new();
    for (key, value) in keys {
        let line = text[..value.span().start].matches('\n').count() + 1;
        let value = value.into_inner();
        match (key.as_str(), &value) {
            // The tables (`[[agents]]`, `[cluster]`, `[notify]`), read by
            // `ConfigFile`.
            ("agents" | "cluster" | "notify", _) => continue,
            ("config", _) => {
                return Err(format!(
                    "line {line}: `config`: a config file cannot name another"
                ))
            }
            _ => {}
        }
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_id().as_str() == key && a.get_long().is_some())
        else {
            let known = cmd.get_arguments().map(|a| a.get_id().as_str());
            let hint = closest(&key, known)
                .map(|k| format!("; did you mean `{k}`?"))
                .unwrap_or_default();
            return Err(format!(
                "line {line}: unknown key `{key}`{hint} (the keys are the `serve` flags' names with `_` for `-`: `tandem serve --help`)"
            ));
        };
        let explicit = explicit(given, &key)
            || (STORE_KEYS.contains(&key.as_str()) && store_given(given))
            // The secret's own variable wins over a file naming a secret file.
            || (key == "auth_secret_file"
                && std::env::var_os(crate::auth::SECRET_ENV).is_some_and(|v| !v.is_empty()));
        let long = format!("--{}", arg.get_long().unwrap_or_default());
        let switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        let many = matches!(arg.get_action(), clap::ArgAction::Append);
        let wrong = |want: &str| format!("line {line}: `{key}` takes {want}, not {}", kind(&value));
        let values: Vec<String> = match (&value, switch, many) {
            (toml::Value::Boolean(b), true, _) => {
                if *b && !explicit {
                    flags.push(OsString::from(&long));
                }
                continue;
            }
            (_, true, _) => return Err(wrong("true or false")),
            (toml::Value::Array(items), _, true) => items
                .iter()
                .map(|v| scalar(v).ok_or_else(|| wrong("an array of strings or numbers")))
                .collect::<Result<_, _>>()?,
            (_, _, true) => return Err(wrong("an array")),
            (v, _, false) => vec![scalar(v).ok_or_else(|| wrong("a string or a number"))?],
        };
        for v in values {
            // Checked by the flag's own parser, so the message names the key.
            let flag = OsString::from(format!("{long}={v}"));
            let checked = match cmd
                .clone()
                .try_get_matches_from([OsString::from("serve"), flag])
            {
                // The value is fine; a flag it needs is another key's job.
                Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => Ok(()),
                r => r.map(|_| ()),
            };
            checked.map_err(|e| {
                let text = e.to_string();
                let mut lines = text.lines();
                let why = lines
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ");
                let values = lines
                    .find(|l| l.contains("possible values"))
                    .map(|l| format!(" {}", l.trim()))
                    .unwrap_or_default();
                format!("line {line}: `{key}`: {why}{values}")
            })?;
            if !explicit {
                flags.push(OsString::from(format!("{long}={v}")));
            }
        }
    }
    Ok(flags)
}

/// The known key nearest to a mistyped one (at most 3 edits away).
fn closest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let here = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != *cb))
                    .min(row[j] + 1)
                    .min(here + 1);
                prev = here;
            }
        }
        row[b.len()]
    }
    known
        .map(|k| (distance(key, k), k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

/// A scalar TOML value as a flag's text.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

/// What kind of TOML value `v` is, for messages.
fn kind(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}
