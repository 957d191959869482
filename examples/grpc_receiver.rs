//! A tonic gRPC payment service whose calls take effect once per idempotency key.
//!
//! ```text
//! cargo run --example grpc_receiver
//! grpcurl -plaintext -import-path examples/proto -proto payments.proto \
//!     -H 'idempotency-key: ord_1001' -d '{"amount": 1999, "currency": "EUR"}' \
//!     127.0.0.1:50051 payments.Payments/Charge
//! ```
//!
//! Binds `127.0.0.1:50051`, or `BIND` (`BIND=127.0.0.1:0` picks a free port); the first line on
//! stdout is `listening on http://ADDR`.
//!
//! The whole server is wrapped with `Server::builder().layer(..)`, keyed by the
//! `idempotency-key` metadata entry (scoped per method path, so `Charge` and `ChargeBatch` keys
//! never collide). A retry of a charge that succeeded gets the original reply (same
//! `charge_id`, with `idempotent-replayed: true` in the response metadata); a retry of a charge
//! that failed (any status but `OK`) runs again. The layer answers with gRPC statuses:
//! `INVALID_ARGUMENT` (no or malformed key), `ABORTED` (the same key is still in flight: retry
//! later), `FAILED_PRECONDITION` (the key was used with a different request),
//! `RESOURCE_EXHAUSTED` (request over the body limit), `UNAVAILABLE` (store down).
//!
//! Replies are held until they end, then recorded and replayed. A reply larger than the
//! response buffer limit (64 KiB by default) flows on as it is produced and is recorded without
//! its messages: its duplicates get `ALREADY_EXISTS` (the call already took effect).
//!
//! Streaming methods go through the layer too: the request stream is read to its end (bounded
//! by the body limit) before the handler runs, and a response stream is held back until it
//! ends (up to the response buffer limit), so that it can be recorded and replayed. That suits
//! short, finite streams. To leave long-lived or bidirectional streams alone, wrap only the
//! unary methods:
//!
//! ```ignore
//! use tonic::service::Routes;
//! use tower::ServiceBuilder;
//!
//! let server = PaymentsServer::new(payments);
//! let charge = ServiceBuilder::new()
//!     .layer(idempotency(MemoryStore::new()))
//!     .service(server.clone());
//! let routes = Routes::new(server) // every method, unprotected ...
//!     .into_axum_router()
//!     .route_service("/payments.Payments/Charge", charge); // ... but Charge, protected
//! Server::builder()
//!     .add_routes(Routes::from(routes))
//!     .serve(addr)
//!     .await?;
//! ```
//!
//! Demo hooks, as request metadata, so retries and concurrent duplicates can be tried by hand:
//! `x-demo-delay-ms: N` sleeps N ms before each charge; `x-demo-fail: CODE` answers the gRPC
//! status `CODE` (a number, such as `13` for `INTERNAL`) instead of charging; on
//! `ChargeInstallments` it fails after the first installment, mid-stream.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::net::TcpListener;
use tonic::metadata::MetadataMap;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status, Streaming};
use tower_idempotency::key::HeaderKey;
use tower_idempotency::{IdempotencyLayer, IdempotencyStore, MemoryStore};

/// The code generated from `examples/proto/payments.proto` (committed: no build script).
#[allow(dead_code)]
#[path = "proto/payments.rs"]
pub mod payments;

use payments::payments_server::{Payments, PaymentsServer};
use payments::{ChargeBatchReply, ChargeReply, ChargeRequest, InstallmentsRequest};

/// The payment service: counts its calls and the charges it made.
#[derive(Clone, Default)]
pub struct PaymentsService {
    ledger: Arc<Ledger>,
}

#[derive(Default)]
struct Ledger {
    calls: AtomicU64,
    charges: AtomicU64,
}

impl PaymentsService {
    /// How many times a handler ran (failed attempts included).
    pub fn calls(&self) -> u64 {
        self.ledger.calls.load(Ordering::SeqCst)
    }

    /// How many charges were made: the side effect that must happen once per key.
    pub fn charges(&self) -> u64 {
        self.ledger.charges.load(Ordering::SeqCst)
    }

    fn charge(&self, request: &ChargeRequest) -> ChargeReply {
        let n = self.ledger.charges.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::info!(
            charge = n,
            amount = request.amount,
            currency = %request.currency,
            "charged"
        );
        ChargeReply {
            charge_id: format!("ch_{n:06}"),
            amount: request.amount,
        }
    }
}

/// `x-demo-delay-ms`: how long to sleep before each charge.
fn demo_delay(metadata: &MetadataMap) -> Duration {
    let ms = metadata
        .get("x-demo-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or(0);
    Duration::from_millis(ms.min(60_000))
}

/// `x-demo-fail`: the status code to answer instead of charging (not a number: `INTERNAL`).
fn demo_failure(metadata: &MetadataMap) -> Option<Status> {
    let value = metadata.get("x-demo-fail")?.to_str().ok()?;
    let code = value.parse::<i32>().map_or(Code::Internal, Code::from_i32);
    (code != Code::Ok).then(|| Status::new(code, "x-demo-fail was set"))
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<ChargeReply, Status>> + Send>>;

#[tonic::async_trait]
impl Payments for PaymentsService {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.ledger.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(demo_delay(request.metadata())).await;
        if let Some(status) = demo_failure(request.metadata()) {
            return Err(status);
        }
        Ok(Response::new(self.charge(request.get_ref())))
    }

    async fn charge_batch(
        &self,
        request: Request<Streaming<ChargeRequest>>,
    ) -> Result<Response<ChargeBatchReply>, Status> {
        self.ledger.calls.fetch_add(1, Ordering::SeqCst);
        let delay = demo_delay(request.metadata());
        let failure = demo_failure(request.metadata());
        let mut stream = request.into_inner();
        let mut batch = Vec::new();
        while let Some(charge) = stream.message().await? {
            batch.push(charge);
        }
        tokio::time::sleep(delay).await;
        if let Some(status) = failure {
            return Err(status);
        }
        let charge_ids = batch.iter().map(|c| self.charge(c).charge_id).collect();
        Ok(Response::new(ChargeBatchReply { charge_ids }))
    }

    type ChargeInstallmentsStream = ReplyStream;

    async fn charge_installments(
        &self,
        request: Request<InstallmentsRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        self.ledger.calls.fetch_add(1, Ordering::SeqCst);
        let delay = demo_delay(request.metadata());
        let failure = demo_failure(request.metadata());
        let InstallmentsRequest {
            charge,
            installments,
        } = request.into_inner();
        let charge = charge.ok_or_else(|| Status::invalid_argument("charge is required"))?;
        if !(1..=12).contains(&installments) {
            return Err(Status::invalid_argument("installments must be 1 to 12"));
        }
        let part = ChargeRequest {
            amount: charge.amount / i64::from(installments),
            ..charge
        };
        let service = self.clone();
        let replies = futures_util::stream::iter(1..=installments).then(move |i| {
            let (service, part, failure) = (service.clone(), part.clone(), failure.clone());
            async move {
                tokio::time::sleep(delay).await;
                match failure {
                    Some(status) if i > 1 => Err(status),
                    _ => Ok(service.charge(&part)),
                }
            }
        });
        // tonic ends the response at the first error, with its status in the trailers.
        Ok(Response::new(Box::pin(replies) as ReplyStream))
    }
}

/// The idempotency layer of the service: the key is the `idempotency-key` metadata entry.
pub fn idempotency<St: IdempotencyStore>(store: St) -> IdempotencyLayer<St> {
    IdempotencyLayer::new(store)
        .namespace("payments")
        .key(HeaderKey::new("idempotency-key").unwrap())
        // Longer than any charge takes: a duplicate is told ABORTED (retry later) meanwhile.
        .lease(Duration::from_secs(30))
}

/// Serves `payments` on `listener`, every method behind `idempotency`.
pub async fn serve<St: 'static>(
    listener: TcpListener,
    payments: PaymentsService,
    idempotency: IdempotencyLayer<St>,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(idempotency)
        .add_service(PaymentsServer::new(payments))
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_idempotency=debug".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let bind: SocketAddr = std::env::var("BIND")
        .unwrap_or_else(|_| "127.0.0.1:50051".to_owned())
        .parse()?;
    let listener = TcpListener::bind(bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(
        listener,
        PaymentsService::default(),
        idempotency(MemoryStore::new()),
    )
    .await?;
    Ok(())
}
