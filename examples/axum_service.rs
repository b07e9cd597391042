//! An HTTP service whose handler locks on a path parameter.
//!
//! `POST /orders/{id}/ship` ships an order at most once at a time across every
//! replica. A second request for the same order while the first runs gets
//! `409 Conflict` at once (`wait = "0s"`); a Redis outage gets
//! `503 Service Unavailable`.
//!
//! ```sh
//! cargo run --example axum_service            # serves, sends a few requests, prints the answers
//! cargo run --example axum_service -- --serve # keeps serving on 127.0.0.1:3000
//! ```

mod support;

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use distlock::{distributed_lock, LockError, LockManager};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone)]
struct AppState {
    locks: LockManager,
}

/// Errors of the API, and how each maps to HTTP.
#[derive(Debug)]
enum ApiError {
    /// Someone else holds the order's lock: try again later.
    Busy(String),
    /// The lock service failed, or the lease was lost mid-way.
    Unavailable(String),
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Timeout { .. } => ApiError::Busy(e.to_string()),
            // Lost: the work may have overlapped another holder's; Backend,
            // Connect, NotConfigured: Redis is not usable right now.
            other => ApiError::Unavailable(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Busy(msg) => (StatusCode::CONFLICT, msg).into_response(),
            ApiError::Unavailable(msg) => {
                (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")], msg).into_response()
            }
        }
    }
}

async fn ship_handler(
    State(state): State<AppState>,
    Path(order_id): Path<u64>,
) -> Result<String, ApiError> {
    ship(&state, order_id).await
}

#[distributed_lock(key = "order:{order_id}", lease = "10s", wait = "0s", manager = state.locks)]
async fn ship(state: &AppState, order_id: u64) -> Result<String, ApiError> {
    tokio::time::sleep(Duration::from_millis(300)).await; // talk to the carrier
    Ok(format!("order {order_id} shipped\n"))
}

fn app(state: AppState) -> Router {
    Router::new()
        .route("/orders/{order_id}/ship", post(ship_handler))
        .with_state(state)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve_forever = std::env::args().any(|a| a == "--serve");
    let (url, _server) = support::redis_url();
    let locks = LockManager::builder(&url)
        .key_prefix(format!("{}locks:", support::PREFIX))
        .build()
        .await?;
    let addr = if serve_forever {
        "127.0.0.1:3000"
    } else {
        "127.0.0.1:0"
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app(AppState { locks })).await });

    if serve_forever {
        println!("listening on http://{addr}; try: curl -X POST http://{addr}/orders/42/ship");
        server.await??;
        return Ok(());
    }

    // Three requests for order 42 at once, one for order 7.
    let requests = [42, 42, 42, 7].map(|id| tokio::spawn(post_ship(addr, id)));
    let mut answers = Vec::new();
    for r in requests {
        answers.push(r.await??);
    }
    for (id, status, body) in &answers {
        println!("POST /orders/{id}/ship -> {status}  {}", body.trim());
    }
    server.abort();
    let shipped_42 = answers
        .iter()
        .filter(|(id, s, _)| *id == 42 && *s == 200)
        .count();
    let busy_42 = answers
        .iter()
        .filter(|(id, s, _)| *id == 42 && *s == 409)
        .count();
    if shipped_42 == 1 && busy_42 == 2 {
        println!("\nOrder 42 shipped once; the concurrent requests got 409 Conflict.");
        Ok(())
    } else {
        Err("unexpected answers".into())
    }
}

/// A minimal HTTP/1.1 client, to keep the example's dependencies to axum alone.
async fn post_ship(
    addr: std::net::SocketAddr,
    id: u64,
) -> Result<(u64, u16, String), std::io::Error> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "POST /orders/{id}/ship HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    Ok((id, status, body))
}
