//! The tonic receiver of `examples/grpc_receiver.rs`, served on loopback and driven by a real
//! tonic client over HTTP/2.
//!
//! The tests include the example's source (`#[path]`), so the service, the layer's
//! configuration and the server they exercise are the example's own; one test also runs the
//! built example binary.
//!
//! # Streaming calls
//!
//! With the layer around a whole tonic server (`Server::builder().layer(..)`), streaming methods
//! are protected like unary ones, at the price of buffering:
//! - client streaming: the request stream is read to its end (bounded by the body limit:
//!   `RESOURCE_EXHAUSTED` past it) before the handler runs; the key comes from the metadata
//!   and the fingerprint covers every message, so a duplicate batch gets the original reply and
//!   a different batch under the same key gets `FAILED_PRECONDITION`;
//! - server streaming: the response stream is held back until it ends, then recorded with its
//!   trailers and replayed whole to duplicates; a stream that ends with an error status is
//!   released, so its retry runs again. Past the response buffer limit (64 KiB by default) the
//!   stream flows on, and is recorded without its messages: duplicates then get
//!   `ALREADY_EXISTS` (the same holds for a unary reply that large);
//! - bidirectional streams whose client waits for replies before closing its side would wait
//!   forever for the layer to finish reading: do not put them behind the layer.
//!
//! To leave streaming methods alone, wrap only the unary methods (per-method routes): tested
//! below by `per_method_wrapping_leaves_streams_alone`.

use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Status};
use tower_idempotency::{IdempotencyLayer, MemoryStore};

use crate::harness;

#[allow(dead_code)]
#[path = "../../examples/grpc_receiver.rs"]
mod receiver;

use receiver::PaymentsService;
use receiver::payments::payments_client::PaymentsClient;
use receiver::payments::payments_server::PaymentsServer;
use receiver::payments::{ChargeReply, ChargeRequest, InstallmentsRequest};

/// Serves the example's service behind `layer` on `127.0.0.1:0`; returns a connected client.
async fn start(layer: IdempotencyLayer<MemoryStore>) -> (PaymentsClient<Channel>, PaymentsService) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let payments = PaymentsService::default();
    tokio::spawn(receiver::serve(listener, payments.clone(), layer));
    (connect(&format!("http://{addr}")).await, payments)
}

async fn connect(url: &str) -> PaymentsClient<Channel> {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    PaymentsClient::new(channel)
}

fn layer() -> IdempotencyLayer<MemoryStore> {
    receiver::idempotency(MemoryStore::new())
}

fn charge(amount: i64) -> ChargeRequest {
    ChargeRequest {
        amount,
        currency: "EUR".to_owned(),
        customer: "cus_7".to_owned(),
        description: "order 1001".to_owned(),
    }
}

/// A request with the `idempotency-key` metadata entry (when `key` is set) and demo hooks.
fn with_key<T>(message: T, key: Option<&str>, hooks: &[(&'static str, &str)]) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    for (name, value) in hooks {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    request
}

fn replayed<T>(response: &tonic::Response<T>) -> bool {
    response
        .metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[tokio::test]
async fn duplicate_charge_gets_the_original_reply() {
    let (mut client, payments) = start(layer()).await;

    let first = client
        .charge(with_key(charge(1999), Some("ord_1001"), &[]))
        .await
        .unwrap();
    assert!(!replayed(&first));
    let first = first.into_inner();
    assert!(first.charge_id.starts_with("ch_"), "{first:?}");

    for _ in 0..2 {
        let again = client
            .charge(with_key(charge(1999), Some("ord_1001"), &[]))
            .await
            .unwrap();
        assert!(replayed(&again), "{:?}", again.metadata());
        assert_eq!(again.into_inner(), first);
    }
    assert_eq!((payments.calls(), payments.charges()), (1, 1));

    // Another key is another charge.
    let other = client
        .charge(with_key(charge(1999), Some("ord_1002"), &[]))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(other.charge_id, first.charge_id);
    assert_eq!(payments.charges(), 2);
}

#[tokio::test]
async fn failed_call_is_not_recorded_and_its_retry_runs() {
    let (mut client, payments) = start(layer()).await;

    let status = client
        .charge(with_key(
            charge(500),
            Some("ord_2001"),
            &[("x-demo-fail", "13")],
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(status.message(), "x-demo-fail was set");
    assert_eq!((payments.calls(), payments.charges()), (1, 0));

    // Other non-OK codes count as failures too.
    let status = client
        .charge(with_key(
            charge(500),
            Some("ord_2001"),
            &[("x-demo-fail", "14")],
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(payments.calls(), 2);

    let retry = client
        .charge(with_key(charge(500), Some("ord_2001"), &[]))
        .await
        .unwrap();
    assert!(!replayed(&retry));
    assert_eq!((payments.calls(), payments.charges()), (3, 1));

    let duplicate = client
        .charge(with_key(charge(500), Some("ord_2001"), &[]))
        .await
        .unwrap();
    assert!(replayed(&duplicate));
    assert_eq!(duplicate.into_inner(), retry.into_inner());
    assert_eq!(payments.calls(), 3);
}

#[tokio::test]
async fn concurrent_duplicates_run_once_and_the_others_are_aborted() {
    let (client, payments) = start(layer()).await;

    // Four at once, racing for the claim; the winner's handler holds it for 2 s, by which time
    // the other three (sent together with it, over one connection) have long reached the
    // layer.
    let calls = (0..4).map(|_| {
        let mut client = client.clone();
        tokio::spawn(async move {
            client
                .charge(with_key(
                    charge(4200),
                    Some("ord_3001"),
                    &[("x-demo-delay-ms", "2000")],
                ))
                .await
        })
    });
    let results: Vec<Result<tonic::Response<ChargeReply>, Status>> =
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();

    let ok: Vec<ChargeReply> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|r| r.get_ref().clone()))
        .collect();
    assert_eq!(ok.len(), 1, "{results:?}");
    for status in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        assert!(status.message().contains("retry"), "{status:?}");
        assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
    }
    assert_eq!((payments.calls(), payments.charges()), (1, 1));

    // Once the first has finished, a retry gets its reply.
    let retry = client
        .clone()
        .charge(with_key(charge(4200), Some("ord_3001"), &[]))
        .await
        .unwrap();
    assert!(replayed(&retry));
    assert_eq!(retry.into_inner(), ok[0]);
    assert_eq!(payments.calls(), 1);
}

#[tokio::test]
async fn call_cancelled_by_its_deadline_is_released() {
    let (mut client, payments) = start(layer()).await;

    // The client gives up after 1 s (grpc-timeout): time enough for the call to reach the
    // handler (counted in `calls`) on a loaded machine. The handler would take 3 s. tonic's
    // server-side deadline (outside the layer) drops the call, handler and claim included,
    // before it charges.
    let sent = Instant::now();
    let mut request = with_key(
        charge(700),
        Some("ord_3501"),
        &[("x-demo-delay-ms", "3000")],
    );
    request.set_timeout(Duration::from_millis(1000));
    let status = client.charge(request).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );

    // The release may run in the background: until then a retry is told ABORTED. (Were the
    // abandoned call still running, the retry would be ABORTED until it charged, then get its
    // reply replayed.)
    let started = Instant::now();
    let reply = loop {
        match client
            .charge(with_key(charge(700), Some("ord_3501"), &[]))
            .await
        {
            Err(status) if status.code() == Code::Aborted && started.elapsed().as_secs() < 5 => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert!(!replayed(&reply));
    assert_eq!((payments.calls(), payments.charges()), (2, 1));

    // The abandoned attempt never charges: it started within its 1 s deadline, so it would
    // have charged about 4 s after the send at the latest; wait past that.
    tokio::time::sleep(Duration::from_millis(4500).saturating_sub(sent.elapsed())).await;
    assert_eq!(payments.charges(), 1);
}

#[tokio::test]
async fn oversized_request_is_resource_exhausted() {
    let (mut client, payments) = start(layer().body_limit(1024)).await;
    let big = ChargeRequest {
        description: "x".repeat(4096),
        ..charge(100)
    };
    let status = client
        .charge(with_key(big, Some("ord_4001"), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("1024 bytes"), "{status:?}");
    assert_eq!(payments.calls(), 0);

    // The connection is still usable, and a small request goes through.
    client
        .charge(with_key(charge(100), Some("ord_4001"), &[]))
        .await
        .unwrap();
    assert_eq!(payments.calls(), 1);
}

#[tokio::test]
async fn missing_or_malformed_key_is_invalid_argument() {
    let (mut client, payments) = start(layer()).await;

    let status = client
        .charge(with_key(charge(100), None, &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "the request carries no idempotency key; it was expected in the idempotency-key header"
    );

    let long = "k".repeat(300);
    let status = client
        .charge(with_key(charge(100), Some(&long), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("300 bytes"), "{status:?}");

    assert_eq!(payments.calls(), 0);
}

#[tokio::test]
async fn key_reused_with_another_message_is_failed_precondition() {
    let (mut client, payments) = start(layer()).await;

    client
        .charge(with_key(charge(1000), Some("ord_5001"), &[]))
        .await
        .unwrap();
    let status = client
        .charge(with_key(charge(2000), Some("ord_5001"), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("different"), "{status:?}");
    assert_eq!((payments.calls(), payments.charges()), (1, 1));
}

#[tokio::test]
async fn keys_are_scoped_per_method() {
    let (mut client, payments) = start(layer()).await;

    client
        .charge(with_key(charge(1000), Some("ord_6001"), &[]))
        .await
        .unwrap();
    // The same key on another method is another key (the scope is the method path).
    let batch = client
        .charge_batch(with_key(
            futures_util::stream::iter(vec![charge(1000)]),
            Some("ord_6001"),
            &[],
        ))
        .await
        .unwrap();
    assert!(!replayed(&batch));
    assert_eq!(payments.calls(), 2);
}

#[tokio::test]
async fn client_streaming_is_read_whole_then_keyed_like_unary() {
    let (mut client, payments) = start(layer().body_limit(4096)).await;
    let batch = || futures_util::stream::iter(vec![charge(100), charge(200), charge(300)]);

    let first = client
        .charge_batch(with_key(batch(), Some("batch_1"), &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.charge_ids.len(), 3);

    let again = client
        .charge_batch(with_key(batch(), Some("batch_1"), &[]))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(again.into_inner(), first);
    assert_eq!((payments.calls(), payments.charges()), (1, 3));

    // The fingerprint covers every message of the stream.
    let other = futures_util::stream::iter(vec![charge(100), charge(200)]);
    let status = client
        .charge_batch(with_key(other, Some("batch_1"), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);

    // The body limit applies to the whole stream, not to each message.
    let many = futures_util::stream::iter(vec![charge(1); 500]);
    let status = client
        .charge_batch(with_key(many, Some("batch_2"), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(payments.calls(), 1);
}

async fn installments(
    client: &mut PaymentsClient<Channel>,
    key: &str,
    hooks: &[(&'static str, &str)],
) -> (Duration, bool, Vec<Result<ChargeReply, Status>>) {
    let request = InstallmentsRequest {
        charge: Some(charge(3000)),
        installments: 3,
    };
    let started = Instant::now();
    let response = client
        .charge_installments(with_key(request, Some(key), hooks))
        .await
        .unwrap();
    let replayed = replayed(&response);
    let mut stream = response.into_inner();
    let mut items = Vec::new();
    let mut first_after = None;
    loop {
        match stream.message().await {
            Ok(Some(reply)) => {
                first_after.get_or_insert_with(|| started.elapsed());
                items.push(Ok(reply));
            }
            Ok(None) => break,
            Err(status) => {
                items.push(Err(status));
                break;
            }
        }
    }
    (
        first_after.unwrap_or_else(|| started.elapsed()),
        replayed,
        items,
    )
}

#[tokio::test]
async fn server_streaming_is_held_back_recorded_and_replayed() {
    let (mut client, payments) = start(layer()).await;

    // Three installments, 150 ms apart: the first message only arrives once the stream (and
    // so the record) is complete.
    let (first_after, was_replayed, first) =
        installments(&mut client, "inst_1", &[("x-demo-delay-ms", "150")]).await;
    assert!(!was_replayed);
    assert!(first_after >= Duration::from_millis(450), "{first_after:?}");
    let ids: Vec<String> = first.into_iter().map(|r| r.unwrap().charge_id).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!((payments.calls(), payments.charges()), (1, 3));

    let (_, was_replayed, again) = installments(&mut client, "inst_1", &[]).await;
    assert!(was_replayed);
    let again: Vec<String> = again.into_iter().map(|r| r.unwrap().charge_id).collect();
    assert_eq!(again, ids);
    assert_eq!(payments.calls(), 1);
}

#[tokio::test]
async fn server_stream_ending_in_an_error_is_released() {
    let (mut client, payments) = start(layer()).await;

    let (_, _, items) = installments(&mut client, "inst_2", &[("x-demo-fail", "13")]).await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(items[0].is_ok());
    assert_eq!(items[1].as_ref().unwrap_err().code(), Code::Internal);
    assert_eq!((payments.calls(), payments.charges()), (1, 1));

    let (_, was_replayed, items) = installments(&mut client, "inst_2", &[]).await;
    assert!(!was_replayed);
    assert!(items.iter().all(Result::is_ok) && items.len() == 3);
    assert_eq!((payments.calls(), payments.charges()), (2, 4));
}

/// Serves `routes` (no server-wide layer) on `127.0.0.1:0`; returns a connected client.
async fn serve_routes(routes: tonic::service::Routes) -> PaymentsClient<Channel> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .add_routes(routes)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    connect(&format!("http://{addr}")).await
}

#[tokio::test]
async fn per_service_wrapping_protects_every_method_of_that_service() {
    use tonic::service::Routes;
    use tower::ServiceBuilder;

    let payments = PaymentsService::default();
    let protected = ServiceBuilder::new()
        .layer(layer())
        .service(PaymentsServer::new(payments.clone()));
    let routes = Routes::default()
        .into_axum_router()
        .route_service("/payments.Payments/{*method}", protected);
    let mut client = serve_routes(Routes::from(routes)).await;

    let first = client
        .charge(with_key(charge(100), Some("ord_7101"), &[]))
        .await
        .unwrap()
        .into_inner();
    let again = client
        .charge(with_key(charge(100), Some("ord_7101"), &[]))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(again.into_inner(), first);
    let (_, _, items) = installments(&mut client, "inst_7101", &[]).await;
    assert_eq!(items.len(), 3);
    let (_, was_replayed, _) = installments(&mut client, "inst_7101", &[]).await;
    assert!(was_replayed);
    assert_eq!(payments.calls(), 2);
}

#[tokio::test]
async fn per_method_wrapping_leaves_streams_alone() {
    use tonic::service::Routes;
    use tower::ServiceBuilder;

    let payments = PaymentsService::default();
    let server = PaymentsServer::new(payments.clone());
    let charge_only = ServiceBuilder::new().layer(layer()).service(server.clone());
    let routes = Routes::new(server)
        .into_axum_router()
        .route_service("/payments.Payments/Charge", charge_only);

    let mut client = serve_routes(Routes::from(routes)).await;

    // Charge is protected.
    let first = client
        .charge(with_key(charge(100), Some("ord_7001"), &[]))
        .await
        .unwrap()
        .into_inner();
    let again = client
        .charge(with_key(charge(100), Some("ord_7001"), &[]))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(again.into_inner(), first);
    let status = client
        .charge(with_key(charge(100), None, &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(payments.calls(), 1);

    // The server stream flows as it is produced, and is not protected: it runs every time.
    // Three installments, 500 ms apart: the whole stream takes at least 1.5 s, so a first
    // message within that time was not held back until the stream ended (it comes after about
    // 500 ms; 1 s to spare).
    let delay = Duration::from_millis(500);
    let hooks = [("x-demo-delay-ms", "500")];
    let (first_after, _, items) = installments(&mut client, "inst_3", &hooks).await;
    assert!(first_after < 3 * delay, "{first_after:?}");
    assert_eq!(items.len(), 3);
    let (_, was_replayed, _) = installments(&mut client, "inst_3", &hooks).await;
    assert!(!was_replayed);
    assert_eq!(payments.calls(), 3);
}

/// The built example binary (`cargo test` builds examples), driven over loopback.
#[tokio::test]
async fn example_binary_replays_a_duplicate_charge() {
    let example = harness::start_example("grpc_receiver", &[]);
    let url = example.base.clone();

    let mut client = connect(&url).await;
    let first = client
        .charge(with_key(charge(1999), Some("ord_9001"), &[]))
        .await
        .unwrap();
    assert!(!replayed(&first));
    let again = client
        .charge(with_key(charge(1999), Some("ord_9001"), &[]))
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(again.into_inner(), first.into_inner());
}

#[tokio::test]
async fn duplicate_of_a_reply_too_large_to_keep_is_already_exists() {
    // Replies past the response buffer limit are streamed to the client and recorded without
    // the reply: a duplicate cannot get the reply, and is told the call already succeeded.
    let (mut client, payments) = start(layer().response_buffer_limit(8)).await;

    let first = client
        .charge(with_key(charge(100), Some("ord_8001"), &[]))
        .await
        .unwrap();
    assert!(!replayed(&first));
    let status = client
        .charge(with_key(charge(100), Some("ord_8001"), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert!(status.message().contains("already succeeded"), "{status:?}");
    assert_eq!(
        status.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );

    let (_, _, items) = installments(&mut client, "inst_8", &[]).await;
    assert!(items.iter().all(Result::is_ok) && items.len() == 3);
    // A trailers-only status: the call itself fails, rather than yield an empty stream.
    let request = InstallmentsRequest {
        charge: Some(charge(3000)),
        installments: 3,
    };
    let status = client
        .charge_installments(with_key(request, Some("inst_8"), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert_eq!(payments.calls(), 2);
}
