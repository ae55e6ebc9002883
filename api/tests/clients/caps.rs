//! The caps on all clients together: past the connection cap clients get 503,
//! and bodies past the in-flight byte budget get 503 until it frees.

use std::time::Duration;

use testkit::process::ApiProcess;
use testkit::*;

use crate::wire::*;

#[tokio::test]
async fn past_the_connection_cap_clients_get_503_and_freed_slots_serve_again() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(
        &redis.url(),
        &[
            ("MAX_CONNECTIONS", "16"),
            ("REQUEST_HEADER_TIMEOUT_SECONDS", "60"),
        ],
    )
    .await;
    // Sixteen connections that each hold a slot, so the 17th finds none free.
    let held = hold_served_connections(api.addr, 16).await;
    let answer = exchange(api.addr, head(false, "Content-Length: 0\r\n").as_bytes()).await;
    assert_eq!(
        status_of(&answer),
        Some(503),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(header_of(&answer, "retry-after").as_deref(), Some("1"));
    assert_eq!(json_body_of(&answer)["error"]["code"], -32000);
    assert!(
        mcp_client(&api.url, TOKEN).await.is_err(),
        "served past the cap"
    );
    drop(held);
    // The slots free as the api sees the connections close.
    wait_until(
        "a client to be served again",
        Duration::from_secs(10),
        || async { mcp_client(&api.url, TOKEN).await.ok().map(|_| ()) },
    )
    .await;
    a_real_client_is_served(&api.url).await;
}

#[tokio::test]
async fn bodies_past_the_in_flight_budget_get_503_until_it_frees() {
    let redis = Redis::start().await;
    let (api, limit) = api_with_body_budget(&redis, "MAX_BODY_BYTES_IN_FLIGHT").await;
    // Two clients (two addresses, so neither passes its own share).
    let (refused, served) =
        two_bodies_one_refused(api.addr, limit, [loopback(2), loopback(3)]).await;
    assert_refused(&refused, 503, "MAX_BODY_BYTES_IN_FLIGHT");
    finish_body(served).await;
    let (status, _) = post(&api.url, TOOLS_LIST).await;
    assert_eq!(status, 200);
    a_real_client_is_served(&api.url).await;
}
