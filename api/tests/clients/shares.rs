//! Each client's share of the caps (MAX_CONNECTIONS_PER_CLIENT,
//! MAX_REQUESTS_PER_CLIENT, MAX_BODY_BYTES_PER_CLIENT): one client past its share
//! gets 429, logged, while others are served; its places come back.

use std::time::Duration;

use testkit::process::ApiProcess;
use testkit::*;
use tokio::net::TcpStream;

use crate::wire::*;

#[tokio::test]
async fn one_address_past_its_connection_share_gets_429_while_others_are_served() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(
        &redis.url(),
        &[
            ("MAX_CONNECTIONS_PER_CLIENT", "4"),
            ("REQUEST_HEADER_TIMEOUT_SECONDS", "60"),
        ],
    )
    .await;
    let (greedy, other) = (loopback(2), loopback(3));
    // Connections are accepted in order, so the 5th finds the 4 counted.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from(greedy, api.addr).await.expect("connect"));
    }
    let answer = exchange_from(greedy, api.addr, &tools_list("")).await;
    assert_client_refused(&answer, "MAX_CONNECTIONS_PER_CLIENT");
    wait_logged(&api, "MAX_CONNECTIONS_PER_CLIENT", greedy).await;
    assert!(
        mcp_client_from(&api.url, TOKEN, greedy).await.is_err(),
        "served past its share"
    );
    // The global cap (1,024) is far away: everyone else is served at once.
    a_real_client_is_served_from(&api.url, other).await;
    a_real_client_is_served(&api.url).await;
    drop(held);
    wait_until(
        "the address to be served again",
        Duration::from_secs(10),
        || async {
            mcp_client_from(&api.url, TOKEN, greedy)
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    a_real_client_is_served_from(&api.url, greedy).await;
}

#[tokio::test]
async fn one_client_past_its_requests_in_flight_gets_429_while_others_are_served() {
    let redis = Redis::start().await;
    let api = ApiProcess::start(&redis.url(), &[("MAX_REQUESTS_PER_CLIENT", "2")]).await;
    let (greedy, other) = (loopback(4), loopback(5));
    let (held, refused) = hold_until_refused(greedy, api.addr, 2, "", &tools_list("")).await;
    let [first, second]: [TcpStream; 2] = held.try_into().expect("two held");
    assert_client_refused(&refused, "MAX_REQUESTS_PER_CLIENT");
    wait_logged(&api, "MAX_REQUESTS_PER_CLIENT", greedy).await;
    // Unauthenticated requests count too: a flood of 401s is still a flood.
    let unauthenticated = format!("{}{{}}", head(false, "Content-Length: 2\r\n"));
    let answer = exchange_from(greedy, api.addr, unauthenticated.as_bytes()).await;
    assert_client_refused(&answer, "MAX_REQUESTS_PER_CLIENT");
    a_real_client_is_served_from(&api.url, other).await;
    // /healthz is never refused: load balancers and probes must see the truth.
    let health = exchange_from(
        greedy,
        api.addr,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&health), Some(200));
    // The held requests are served when they finish, and free their places.
    assert_eq!(status_of(&finish_held(first).await), Some(200));
    let answer = exchange_from(greedy, api.addr, &tools_list("")).await;
    assert_served(&answer);
    assert_eq!(status_of(&finish_held(second).await), Some(200));
    a_real_client_is_served_from(&api.url, greedy).await;
}

#[tokio::test]
async fn one_client_past_its_share_of_bodies_in_flight_gets_429_while_others_are_served() {
    let redis = Redis::start().await;
    let (api, limit) = api_with_body_budget(&redis, "MAX_BODY_BYTES_PER_CLIENT").await;
    let (greedy, other) = (loopback(6), loopback(7));
    // As with the budget for all clients, but both bodies from one client.
    let (refused, served) = two_bodies_one_refused(api.addr, limit, [greedy, greedy]).await;
    assert_client_refused(&refused, "MAX_BODY_BYTES_PER_CLIENT");
    wait_logged(&api, "MAX_BODY_BYTES_PER_CLIENT", greedy).await;
    // Another client sends a body as large while the first's is still held.
    let size = limit * 2 / 3;
    let request = format!(
        "{}{}",
        head(true, &format!("Content-Length: {size}\r\n")),
        padded_tools_list(size)
    );
    assert_served(&exchange_from(other, api.addr, request.as_bytes()).await);
    finish_body(served).await;
    // Both bodies' bytes came back to the client's share: it can send one as
    // large again (with any of them left over, this would be refused).
    assert_served(&exchange_from(greedy, api.addr, request.as_bytes()).await);
    a_real_client_is_served_from(&api.url, greedy).await;
}
