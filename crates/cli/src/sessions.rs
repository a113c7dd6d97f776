//! `warden sessions`: the sessions stored in a data directory, and
//! `warden sessions --repair`, which salvages a damaged database.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use warden_core::{RecordStatus, SessionRecord, SessionStore};
use warden_store::{SalvageError, SledStore};

use crate::exit::{CliError, Exit};
use crate::paths;

/// Arguments of `warden sessions`.
#[derive(Debug, clap::Args)]
pub(crate) struct SessionsArgs {
    /// The data directory. Default WARDEN_DATA_DIR, else the user's data
    /// directory (~/.local/share/warden).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Print a JSON array (one object per session) instead of a table.
    #[arg(long)]
    json: bool,
    /// Salvage a damaged session database: copy every readable record into
    /// a new database, keep the damaged one as sessions.db.damaged-TIMESTAMP,
    /// put the new one in its place, and list what could not be read.
    /// Exits 0 when every record was salvaged, 1 otherwise.
    #[arg(long, conflicts_with = "json")]
    repair: bool,
    /// Ask a running `warden serve` node at URL instead of opening the
    /// store (which that node holds).
    #[arg(long, value_name = "URL", conflicts_with = "repair")]
    server: Option<String>,
    /// The node's token file (with --server). Default WARDEN_TOKEN, else
    /// DATA_DIR/token.
    #[arg(long, value_name = "FILE", requires = "server")]
    token_file: Option<PathBuf>,
}

/// Runs `warden sessions`.
pub(crate) async fn run(args: SessionsArgs) -> Result<Exit, CliError> {
    if let Some(server) = &args.server {
        let client = crate::client::Client::new(server, args.token_file, args.data_dir)?;
        return client.sessions(args.json).await;
    }
    let dir = paths::data_dir(args.data_dir)?;
    if args.repair {
        return tokio::task::spawn_blocking(move || repair(&dir))
            .await
            .map_err(|e| CliError::failure(format!("repair task: {e}")))?;
    }
    let store = paths::open_existing_store(&dir).map_err(|mut e| {
        if !e.message.contains("in use") {
            e.message
                .push_str("; `warden sessions --repair` salvages what is readable");
        }
        e
    })?;
    let records = match store {
        Some(store) => store.list().await?,
        None => Vec::new(),
    };
    let mut corrupt = 0;
    for record in &records {
        if let Err(e) = record {
            corrupt += 1;
            eprintln!("warden: skipped a record: {e}");
        }
    }
    report_turn_log_damage(&dir);
    let mut records: Vec<&SessionRecord> = records.iter().filter_map(|r| r.as_ref().ok()).collect();
    records.sort_by_key(|r| std::cmp::Reverse(r.last_active_ms));
    if args.json {
        let list: Vec<_> = records.iter().map(|r| to_json(r)).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).map_err(|e| CliError::failure(e.to_string()))?
        );
    } else if records.is_empty() {
        eprintln!("no sessions stored in {}", dir.display());
    } else {
        print_table(&records);
    }
    Ok(if corrupt > 0 { Exit::Failure } else { Exit::Ok })
}

/// `--repair`: salvage `DIR/sessions.db` into a new database, move the old
/// one aside (never deleted) and the new one into place.
fn repair(dir: &Path) -> Result<Exit, CliError> {
    let db = dir.join(paths::DATABASE);
    if !db.exists() {
        eprintln!(
            "no session database in {}; nothing to repair",
            dir.display()
        );
        return Ok(Exit::Ok);
    }
    let base = file_timestamp(SystemTime::now());
    let named = |stamp: &str| {
        (
            dir.join(format!("{}.repaired-{stamp}", paths::DATABASE)),
            dir.join(format!("{}.damaged-{stamp}", paths::DATABASE)),
        )
    };
    // A second repair within the same second gets `-2`, `-3`, ...
    let (mut new, mut aside) = named(&base);
    let mut n = 1;
    while new.exists() || aside.exists() {
        n += 1;
        (new, aside) = named(&format!("{base}-{n}"));
    }
    let report = SledStore::salvage(&db, &new).map_err(|e| match e {
        SalvageError::Locked { .. } => CliError::failure(format!(
            "the session database {} is in use by another warden process; stop it and repair again",
            db.display()
        )),
        other => CliError::failure(format!("cannot repair: {other}; nothing was changed")),
    })?;
    std::fs::rename(&db, &aside).map_err(|e| {
        CliError::failure(format!(
            "cannot move {} aside: {e}; the salvaged records are in {}",
            db.display(),
            new.display()
        ))
    })?;
    if let Err(e) = std::fs::rename(&new, &db) {
        let back = std::fs::rename(&aside, &db);
        return Err(CliError::failure(format!(
            "cannot move {} into place: {e}; {}; the salvaged records are in {}",
            new.display(),
            match back {
                Ok(()) => "the damaged database is back where it was".to_owned(),
                Err(b) => format!("the damaged database is {} ({b})", aside.display()),
            },
            new.display()
        )));
    }
    for recovery in &report.recoveries {
        eprintln!("warden: {recovery}");
    }
    report_turn_log_damage(dir);
    for key in &report.kept_newer {
        eprintln!("warden: kept {key:?} as is: written by a newer warden");
    }
    for unreadable in &report.unreadable {
        match &unreadable.key {
            Some(key) => eprintln!("warden: unreadable {key:?}: {}", unreadable.reason),
            None => eprintln!("warden: unreadable: {}", unreadable.reason),
        }
    }
    println!(
        "salvaged {} record(s) into {}, {} kept from a newer warden, {} unreadable; the old database is kept as {}",
        report.salvaged.len(),
        db.display(),
        report.kept_newer.len(),
        report.unreadable.len(),
        aside.display()
    );
    Ok(if report.is_complete() {
        Exit::Ok
    } else {
        Exit::Failure
    })
}

/// Tells, on stderr, of every damaged turn log `warden serve` found in
/// `dir`'s database (see `SledStore::turn_log_damage`): the file kept
/// aside, what was skipped, the turns it cost.
fn report_turn_log_damage(dir: &Path) {
    let found = match SledStore::turn_log_damage(&dir.join(paths::DATABASE)) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("warden: cannot read the turn logs' damage reports: {e}");
            return;
        }
    };
    for d in found {
        let when = timestamp(d.found_ms);
        eprintln!(
            "warden: damaged turn log {} (found {when}): {} bytes skipped, {} intact records kept; {} turn(s) ended with {}{}{}",
            d.file.display(),
            d.skipped_bytes,
            d.intact_records,
            d.turns_ended.len(),
            warden_store::TURN_LOG_DAMAGED,
            list(&d.turns_ended),
            if d.turns_missing_events.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} turn(s) miss events{}",
                    d.turns_missing_events.len(),
                    list(&d.turns_missing_events)
                )
            },
        );
    }
}

/// `: a, b, c` (or nothing for none).
fn list(ids: &[String]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(": {}", ids.join(", "))
    }
}

/// `20261203T093210Z`: an RFC 3339 UTC time without the separators, safe
/// in a file name.
fn file_timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect()
}

fn status(record: &SessionRecord) -> String {
    match &record.status {
        RecordStatus::New => "new".into(),
        RecordStatus::Active => "active".into(),
        RecordStatus::Idle => "idle".into(),
        RecordStatus::Failed { reason } => format!("failed: {reason}"),
        _ => "unknown".into(),
    }
}

fn timestamp(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn to_json(r: &SessionRecord) -> serde_json::Value {
    json!({
        "key": r.key,
        "workspace": r.workspace,
        "agent_session_id": r.agent_session_id,
        "past_session_ids": r.past_session_ids,
        "status": status(r),
        "context_percent": r.usage.map(|u| u.context_percent),
        "context_tokens": r.usage.map(|u| u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens),
        "context_window": r.usage.map(|u| u.context_window),
        "model": r.model,
        "last_active": timestamp(r.last_active_ms),
        "last_active_ms": r.last_active_ms,
        "created_at": timestamp(r.created_at_ms),
        "restarts": r.restart_count,
        "pending_messages": r.pending.len(),
    })
}

fn print_table(records: &[&SessionRecord]) {
    let header = [
        "KEY",
        "WORKSPACE",
        "AGENT SESSION",
        "STATUS",
        "CTX",
        "LAST ACTIVE",
        "RESTARTS",
        "PENDING",
    ];
    let rows: Vec<[String; 8]> = records
        .iter()
        .map(|r| {
            [
                r.key.clone(),
                match &r.workspace {
                    // Workspace sessions are keyed by their path.
                    Some(w) if w.to_string_lossy() == r.key => "= key".into(),
                    Some(w) => w.display().to_string(),
                    None => "-".into(),
                },
                r.agent_session_id.clone().unwrap_or_else(|| "-".into()),
                status(r),
                r.usage
                    .map(|u| format!("{}%", u.context_percent))
                    .unwrap_or_else(|| "-".into()),
                timestamp(r.last_active_ms),
                r.restart_count.to_string(),
                r.pending.len().to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
}
