//! The straightforward way to build what pollbox does, as a yardstick for
//! `benches/side-by-side/run.sh`: axum + tokio + serde_json, the box table a
//! `RwLock<HashMap<String, BoxState>>`, every poll rendering its JSON with serde_json,
//! every ingest parsing the whole body into a `serde_json::Value`.
//!
//! It speaks just enough of pollbox's HTTP surface for `pollbox load` to drive it and
//! validate its answers: `GET /v1/boxes/{key}` (200 with `ETag`, 304 on a matching
//! `If-None-Match`, 404), `POST /v1/boxes/{key}` (one message), `POST /v1/ingest` (one
//! object or an array of them, for `--preseed`) and `GET /count` (number of boxes, so
//! the memory benchmark can check that every key exists). The reducers are the default
//! config's: `v` = last `/value`, `sum` = sum of `/value`, `n` = count, `by` = last
//! `/player` (at most 16 bytes).
//!
//! Not part of the pollbox workspace on purpose: it has its own `Cargo.lock`, and
//! nothing in pollbox depends on it.
//!
//! Usage: `axum-baseline --listen 127.0.0.1:8090 --threads 1` (or
//! `AXUM_BASELINE_THREADS`); `--threads` is tokio's `worker_threads`, default 1.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::Router;
use serde::Serialize;
use serde_json::Value;

/// The longest `by` string the default config accepts.
const MAX_PLAYER_BYTES: usize = 16;
const MAX_KEY_BYTES: usize = 128;

/// One box, as a straightforward server would keep it.
#[derive(Debug, Default)]
struct BoxState {
    ver: u64,
    v: Option<i64>,
    sum: Option<i64>,
    n: u64,
    by: Option<String>,
}

/// The JSON a poll answers, in pollbox's field order.
#[derive(Serialize)]
struct Payload<'a> {
    k: &'a str,
    ver: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    v: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sum: Option<i64>,
    n: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    by: Option<&'a str>,
}

type Table = Arc<RwLock<HashMap<String, BoxState>>>;

fn render(key: &str, state: &BoxState) -> Vec<u8> {
    let payload = Payload {
        k: key,
        ver: state.ver,
        v: state.v,
        sum: state.sum,
        n: state.n,
        by: state.by.as_deref(),
    };
    // Serializing a plain struct of numbers and strings into a Vec cannot fail.
    serde_json::to_vec(&payload).unwrap_or_default()
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    json(
        status,
        serde_json::to_vec(&serde_json::json!({ "error": message })).unwrap_or_default(),
    )
}

async fn poll(State(table): State<Table>, Path(key): Path<String>, headers: HeaderMap) -> Response {
    let (ver, body) = {
        let table = match table.read() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        match table.get(&key) {
            Some(state) => (state.ver, render(&key, state)),
            None => return error(StatusCode::NOT_FOUND, "no such box"),
        }
    };
    let etag = format!("\"{ver}\"");
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes())
    {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::ETAG, etag),
        ],
        body,
    )
        .into_response()
}

/// Why a message was refused; nothing of it was applied.
fn check_message(message: &Value) -> Result<(Option<i64>, Option<&str>), &'static str> {
    let Some(object) = message.as_object() else {
        return Err("message is not an object");
    };
    let value = match object.get("value") {
        None => None,
        Some(v) => Some(v.as_i64().ok_or("value: not an i64")?),
    };
    let player = match object.get("player") {
        None => None,
        Some(p) => {
            let p = p.as_str().ok_or("player: not a string")?;
            if p.len() > MAX_PLAYER_BYTES {
                return Err("player: longer than 16 bytes");
            }
            Some(p)
        }
    };
    Ok((value, player))
}

/// Applies one checked message to box `key`; returns the new payload.
fn apply(
    table: &mut HashMap<String, BoxState>,
    key: &str,
    value: Option<i64>,
    player: Option<&str>,
) -> Result<Vec<u8>, &'static str> {
    let sum = match (value, table.get(key).and_then(|s| s.sum)) {
        (Some(v), Some(s)) => Some(s.checked_add(v).ok_or("sum: overflow")?),
        (Some(v), None) => Some(v),
        (None, s) => s,
    };
    let state = table.entry(key.to_string()).or_default();
    state.ver += 1;
    state.n += 1;
    if value.is_some() {
        state.v = value;
    }
    state.sum = sum;
    if let Some(p) = player {
        state.by = Some(p.to_string());
    }
    Ok(render(key, state))
}

async fn ingest_one(State(table): State<Table>, Path(key): Path<String>, body: Bytes) -> Response {
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid json: {e}")),
    };
    let (value, player) = match check_message(&message) {
        Ok(fields) => fields,
        Err(reason) => return error(StatusCode::UNPROCESSABLE_ENTITY, reason),
    };
    let mut table = match table.write() {
        Ok(t) => t,
        Err(poisoned) => poisoned.into_inner(),
    };
    match apply(&mut table, &key, value, player) {
        Ok(payload) => json(StatusCode::OK, payload),
        Err(reason) => error(StatusCode::UNPROCESSABLE_ENTITY, reason),
    }
}

async fn ingest_batch(State(table): State<Table>, body: Bytes) -> Response {
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid json: {e}")),
    };
    let messages = match parsed {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => return error(StatusCode::BAD_REQUEST, "not an object or array of objects"),
    };
    let mut table = match table.write() {
        Ok(t) => t,
        Err(poisoned) => poisoned.into_inner(),
    };
    let (mut accepted, mut rejected) = (0u64, 0u64);
    let mut errors = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let outcome = check_message(message).and_then(|(value, player)| {
            let key = message
                .get("key")
                .and_then(Value::as_str)
                .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_BYTES)
                .ok_or("missing key")?;
            apply(&mut table, key, value, player)
        });
        match outcome {
            Ok(_) => accepted += 1,
            Err(reason) => {
                rejected += 1;
                if errors.len() < 16 {
                    errors.push(serde_json::json!({ "i": i, "error": reason }));
                }
            }
        }
    }
    let answer =
        serde_json::json!({ "accepted": accepted, "rejected": rejected, "errors": errors });
    json(
        StatusCode::OK,
        serde_json::to_vec(&answer).unwrap_or_default(),
    )
}

async fn count(State(table): State<Table>) -> String {
    let n = match table.read() {
        Ok(t) => t.len(),
        Err(poisoned) => poisoned.into_inner().len(),
    };
    format!("{n}\n")
}

struct Args {
    listen: SocketAddr,
    threads: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut listen: SocketAddr = "127.0.0.1:8090".parse().map_err(|_| "default address")?;
    let mut threads: usize = match std::env::var("AXUM_BASELINE_THREADS") {
        Ok(t) => t
            .parse()
            .map_err(|_| format!("AXUM_BASELINE_THREADS: bad number {t:?}"))?,
        Err(_) => 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                listen = value
                    .parse()
                    .map_err(|_| format!("bad address {value:?}"))?
            }
            "--threads" => threads = value.parse().map_err(|_| format!("bad number {value:?}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(Args { listen, threads })
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("axum-baseline: {e}\nusage: axum-baseline [--listen ADDR] [--threads N]");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("axum-baseline: tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    let result: std::io::Result<()> = runtime.block_on(async move {
        let table: Table = Arc::default();
        let app = Router::new()
            .route("/v1/boxes/{key}", get(poll).post(ingest_one))
            .route("/v1/ingest", axum::routing::post(ingest_batch))
            .route("/count", get(count))
            .with_state(table);
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        let addr = listener.local_addr()?;
        // pollbox and nginx both set TCP_NODELAY; axum::serve does not by default, and
        // without it Nagle holds back pipelined answers: the comparison would then be
        // about a socket option, not about the server.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                eprintln!("axum-baseline: TCP_NODELAY: {e}");
            }
        });
        eprintln!(
            "axum-baseline: listening on http://{addr} with {} worker thread(s)",
            args.threads
        );
        axum::serve(listener, app).await
    });
    if let Err(e) = result {
        eprintln!("axum-baseline: {e}");
        std::process::exit(1);
    }
}
