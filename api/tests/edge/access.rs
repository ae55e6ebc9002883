//! Who may call and what they see: the bearer token, the Host and Origin
//! checks, /healthz, an API key while Redis is down, another owner's task.

use super::*;

#[tokio::test]
async fn mcp_requires_the_bearer_token_and_healthz_does_not() {
    let stack = Stack::start(Options::default()).await;
    let http = reqwest::Client::new();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let post = |auth: Option<&'static str>| {
        let mut req = http
            .post(format!("{}/mcp", stack.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        req.send()
    };
    for auth in [
        None,
        Some("Bearer wrong-token-wrong-token-wrong-token-xx"),
        Some("Basic dXNlcjpwYXNz"),
        Some("Bearer "),
    ] {
        let resp = post(auth).await.expect("request");
        assert_eq!(resp.status(), 401, "auth {auth:?}");
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(
            challenge.starts_with("Bearer"),
            "auth {auth:?}: {challenge:?}"
        );
    }
    // The scheme is case-insensitive (RFC 7235): a lowercase "bearer" with the
    // right token gets through.
    let lower = http
        .post(format!("{}/mcp", stack.url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("bearer {TOKEN}"))
        .body(body)
        .send()
        .await
        .expect("request");
    assert_eq!(lower.status(), 200);
    // The real client with a wrong token cannot even initialize.
    assert!(
        mcp_client(&stack.url, "wrong-token-wrong-token-wrong-token-xx")
            .await
            .is_err()
    );

    let health = http
        .get(format!("{}/healthz", stack.url))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    // By default no browser origin is trusted, however well-known.
    let resp = http
        .post(format!("{}/mcp", stack.url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("origin", "https://claude.ai")
        .body(body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 403);
    let text = resp.text().await.unwrap_or_default();
    assert!(text.contains("ALLOWED_ORIGINS is empty"), "{text}");
    stack.shutdown().await;
}

#[tokio::test]
async fn the_host_header_is_checked_on_mcp() {
    let stack = Stack::start(Options::default()).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/mcp", stack.url))
        .header("host", "evil.example")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 403);
    stack.shutdown().await;
}

/// `/healthz` is public: while Redis is down it says "unavailable" and nothing
/// of Redis's error; the reason is in the api's log, once however often it is
/// asked. `/metrics` (the admin's) still answers, so the scrape records it.
#[tokio::test]
async fn healthz_says_unavailable_without_redis_s_error_and_logs_the_reason_once() {
    let mut redis = Redis::start().await;
    let health_addr = format!("127.0.0.1:{}", testkit::free_port());
    let api = ApiProcess::start(&redis.url(), &[("HEALTH_ADDR", &health_addr)]).await;
    let url = format!("{}/healthz", api.url);
    let details = format!("http://{health_addr}/healthz");
    let resp = reqwest::get(&url).await.expect("healthz");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap_or_default(), "ok\n");
    let resp = reqwest::get(&details).await.expect("healthz details");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap_or_default(), "ok\n");
    redis.stop();
    for _ in 0..5 {
        let resp = reqwest::get(&url).await.expect("healthz");
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.text().await.unwrap_or_default(), "unavailable\n");
    }
    // The loopback listener (HEALTH_ADDR) says why; it serves nothing else.
    let resp = reqwest::get(&details).await.expect("healthz details");
    assert_eq!(resp.status(), 503);
    let why = resp.text().await.unwrap_or_default();
    assert!(
        why.starts_with("unavailable: ") && why.contains("Redis"),
        "{why}"
    );
    let other = reqwest::get(format!("http://{health_addr}/metrics")).await;
    assert_eq!(other.map(|r| r.status().as_u16()).ok(), Some(404));
    let lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("/healthz answered 503"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let logged = wait_until(
        "the reason in the log",
        std::time::Duration::from_secs(10),
        || {
            let found = lines(&api.log());
            async move { (!found.is_empty()).then_some(found) }
        },
    )
    .await;
    assert_eq!(logged.len(), 1, "one line for five failures: {logged:?}");
    assert!(logged[0].contains("Redis"), "{logged:?}");
    let metrics = reqwest::Client::new()
        .get(format!("{}/metrics", api.url))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), 200);
    assert!(
        metrics
            .text()
            .await
            .unwrap_or_default()
            .contains("script_runner_redis_up 0\n")
    );
}

/// An rmcp client that sends `Origin: origin` with every request, as a browser
/// would.
async fn client_from_origin(
    url: &str,
    origin: &str,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    let headers = [(
        reqwest::header::ORIGIN,
        reqwest::header::HeaderValue::from_str(origin).expect("an origin"),
    )];
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{url}/mcp"))
            .auth_header(TOKEN)
            .custom_headers(headers.into_iter().collect()),
    );
    ().serve(transport).await
}

/// The Streamable HTTP transport's Origin rule: a foreign `Origin` gets 403
/// with a JSON-RPC error naming it and `ALLOWED_ORIGINS`, on `/mcp` and
/// `/metrics`, with or without a token (the origin is checked first); an
/// allowed origin and no `Origin` at all are served.
#[tokio::test]
async fn a_foreign_origin_gets_403_and_an_allowed_one_or_none_is_served() {
    let stack = Stack::start(Options {
        extra_env: vec![("ALLOWED_ORIGINS", "https://claude.ai".into())],
        ..Options::default()
    })
    .await;
    let http = reqwest::Client::new();
    let post = |origin: Option<&'static str>, token: Option<&'static str>| {
        let mut req = http
            .post(format!("{}/mcp", stack.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        req.send()
    };
    let evil = "https://evil.example.com";
    for token in [Some(TOKEN), None] {
        let resp = post(Some(evil), token).await.expect("request");
        assert_eq!(resp.status(), 403, "token {token:?}");
        let body: Value = resp.json().await.expect("a JSON-RPC error");
        assert_eq!(
            (&body["jsonrpc"], &body["id"]),
            (&json!("2.0"), &Value::Null)
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(evil) && message.contains("ALLOWED_ORIGINS"),
            "{message}"
        );
    }
    let metrics = http
        .get(format!("{}/metrics", stack.url))
        .header("origin", evil)
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), 403);
    let resp = post(Some("https://claude.ai"), Some(TOKEN))
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let resp = post(Some("https://claude.ai"), None)
        .await
        .expect("request");
    assert_eq!(
        resp.status(),
        401,
        "an allowed origin still needs the token"
    );

    // The real client: refused from a foreign origin, served from the allowed
    // one and without any Origin.
    assert!(client_from_origin(&stack.url, evil).await.is_err());
    let allowed = client_from_origin(&stack.url, "https://claude.ai")
        .await
        .expect("served from an allowed origin");
    run(&allowed, "python3.13", "true", json!({})).await;
    let plain = stack.client().await;
    assert!(!plain.list_all_tools().await.expect("tools").is_empty());
    stack.shutdown().await;
}

/// An API key is looked up in Redis on every request: while Redis is down the
/// key cannot be checked, which is 503 (try again), never the 401 of a revoked
/// key; a token that is no key is still 401 and the admin token still passes.
/// And `/metrics` is the admin's.
#[tokio::test]
async fn an_api_key_is_503_not_401_while_redis_is_down_and_metrics_are_the_admins() {
    let mut stack = Stack::start(Options::default()).await;
    let mut conn = stack
        .redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let record = shared::apikey::ApiKeyRecord {
        name: "ci".into(),
        scopes: shared::apikey::Scopes::ALL,
        limits: shared::apikey::Limits::default(),
        allow_hosts: None,
        created_at: None,
        last_used_at: None,
    };
    let keys = shared::Keys::new(stack.prefix.clone());
    let key = store::apikeys::create(&mut conn, &keys, &record)
        .await
        .expect("create");
    let http = reqwest::Client::new();
    let post = |token: String| {
        http.post(format!("{}/mcp", stack.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {token}"))
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
            .send()
    };
    let with_key = post(key.expose().to_owned()).await.expect("request");
    assert_eq!(with_key.status(), 200);
    let metrics = |token: String| {
        http.get(format!("{}/metrics", stack.url))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    let resp = metrics(key.expose().to_owned()).await.expect("metrics");
    assert_eq!(resp.status(), 403, "/metrics is not an API key's");

    stack.redis.stop();
    let resp = post(key.expose().to_owned()).await.expect("request");
    assert_eq!(resp.status(), 503);
    let text = resp.text().await.unwrap_or_default();
    assert_eq!(text, KEY_UNCHECKED);
    let port = stack.redis.port.to_string();
    for leak in ["redis", "127.0.0.1", &port, "refused"] {
        assert!(!text.to_lowercase().contains(leak), "{leak:?} in {text:?}");
    }
    let resp = post("srk_not-a-key".into()).await.expect("request");
    assert_eq!(
        resp.status(),
        503,
        "any key-shaped token needs Redis to be told apart"
    );
    let resp = post("wrong-token-wrong-token-wrong-token-xx".into())
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let resp = post(TOKEN.into()).await.expect("request");
    assert_eq!(resp.status(), 200, "the admin token needs no Redis");
    stack.shutdown().await;
}

/// The body of the 503 of a key that could not be checked, whatever the cause.
const KEY_UNCHECKED: &str =
    "the API key could not be checked just now (the key store did not answer); try again shortly\n";

/// A key Redis cannot check because it refuses the api's user (a command
/// taken from it, then its login: the password changed under it) is 503 too,
/// and the answer says nothing of Redis: not `NOPERM` or `WRONGPASS` (which the
/// redis crate reports as "Password authentication failed"), not the ACL user,
/// not the address. The detail is in the log, one line for a burst.
#[tokio::test]
async fn a_key_redis_cannot_check_gets_a_fixed_503_and_the_log_gets_the_detail_once() {
    let redis = Redis::start().await;
    let user = "sr-api-login";
    let mut admin = redis.conn().await;
    let acl = |args: &[&str]| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg(args);
        cmd
    };
    let () = acl(&["on", ">first-password", "~*", "&*", "+@all"])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://{user}:first-password@127.0.0.1:{}", redis.port);
    let health_addr = format!("127.0.0.1:{}", testkit::free_port());
    let api = ApiProcess::start(&url, &[("HEALTH_ADDR", &health_addr)]).await;
    let http = reqwest::Client::new();
    let post = || {
        http.post(format!("{}/mcp", api.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", "Bearer srk_not-a-key")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
            .send()
    };
    let resp = post().await.expect("request");
    assert_eq!(resp.status(), 401, "Redis answers: no such key");
    let port = redis.port.to_string();
    let leaks = [
        user,
        "noperm",
        "hgetall",
        "wrongpass",
        "authentication",
        "redis",
        "127.0.0.1",
        &port,
        "password",
    ];
    let five_fixed_503s = || async {
        for _ in 0..5 {
            let resp = post().await.expect("request");
            assert_eq!(resp.status(), 503);
            let retry = resp.headers().get("retry-after").cloned();
            assert_eq!(retry.as_ref().map(|v| v.as_bytes()), Some(b"5".as_slice()));
            let body = resp.text().await.unwrap_or_default();
            assert_eq!(body, KEY_UNCHECKED);
            for leak in &leaks {
                assert!(!body.to_lowercase().contains(leak), "{leak:?} in {body:?}");
            }
        }
    };
    let lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("its API key could not be looked up"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };

    // The lookup's command is taken from the api's user: NOPERM.
    let () = acl(&["-hgetall"])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    five_fixed_503s().await;
    let logged = lines(&api.log());
    assert_eq!(logged.len(), 1, "one line for five refusals: {logged:?}");
    assert!(
        logged[0].to_lowercase().contains("noperm") && logged[0].contains("hgetall"),
        "the log has the detail: {logged:?}"
    );

    // Redis refuses the api's login: its password changes and its connections
    // are closed, so the api logs in again, and is told WRONGPASS (HEALTH_ADDR,
    // on a pool of its own, says when).
    let () = acl(&["+hgetall", "resetpass", ">second-password"])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let _: u64 = redis::cmd("CLIENT")
        .arg(&["KILL", "USER", user])
        .query_async(&mut admin)
        .await
        .expect("CLIENT KILL");
    let details = format!("http://{health_addr}/healthz");
    wait_until(
        "HEALTH_ADDR to say Redis refuses the login",
        std::time::Duration::from_secs(10),
        || {
            let sent = http.get(&details).send();
            async move {
                let why = sent.await.ok()?.text().await.ok()?;
                why.contains("AuthenticationFailed").then_some(())
            }
        },
    )
    .await;
    // The first may meet a connection Redis closed (broken pipe); the others
    // log in again.
    five_fixed_503s().await;
    let logged = lines(&api.log());
    assert_eq!(logged.len(), 1, "one line within 10 s: {logged:?}");
}

/// `METRICS_TOKEN` reads `/metrics` and nothing else: on `/mcp` it gets the
/// 401 an unknown token gets, byte for byte (with OAuth off and on); a wrong
/// token gets 401 on `/metrics`, and the admin token still reads it.
#[tokio::test]
async fn the_metrics_token_reads_metrics_and_is_an_unknown_token_anywhere_else() {
    const METRICS: &str = "metrics-token-0123456789abcdef0123456789";
    const UNKNOWN: &str = "unknown-token-0123456789abcdef0123456789";
    let oauth = [
        ("OAUTH_ISSUER", "http://127.0.0.1:9/oauth".to_owned()),
        ("OAUTH_RESOURCE", "http://127.0.0.1:9/mcp".to_owned()),
    ];
    for oauth_on in [false, true] {
        let mut extra_env = vec![("METRICS_TOKEN", METRICS.to_owned())];
        if oauth_on {
            extra_env.extend(oauth.clone());
        }
        let stack = Stack::start(Options {
            extra_env,
            ..Options::default()
        })
        .await;
        let http = reqwest::Client::new();
        let metrics = |token: &str| {
            http.get(format!("{}/metrics", stack.url))
                .header("authorization", format!("Bearer {token}"))
                .send()
        };
        let resp = metrics(METRICS).await.expect("metrics");
        assert_eq!(resp.status(), 200, "oauth {oauth_on}");
        let text = resp.text().await.unwrap_or_default();
        assert!(text.contains("script_runner_redis_up 1\n"), "{text}");
        let admin = metrics(TOKEN).await.map(|r| r.status().as_u16()).ok();
        assert_eq!(admin, Some(200), "the admin token reads the metrics too");
        let wrong = metrics(UNKNOWN).await.expect("metrics");
        assert_eq!(wrong.status(), 401, "oauth {oauth_on}");

        // On /mcp: the answer of an unknown token, status, challenge and body.
        let answer = |token: &'static str| {
            let sent = http
                .post(format!("{}/mcp", stack.url))
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("authorization", format!("Bearer {token}"))
                .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
                .send();
            async move {
                let resp = sent.await.expect("request");
                let status = resp.status().as_u16();
                let challenge = resp.headers().get("www-authenticate").cloned();
                (status, challenge, resp.text().await.unwrap_or_default())
            }
        };
        let (with_metrics, with_unknown) = (answer(METRICS).await, answer(UNKNOWN).await);
        assert_eq!(with_metrics.0, 401, "oauth {oauth_on}");
        assert_eq!(with_metrics, with_unknown, "oauth {oauth_on}");
        stack.shutdown().await;
    }
}

/// GET calls Redis has served so far (`INFO commandstats`).
async fn gets_served(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_get:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

/// get_task_files on another owner's task never reads its zip (which may be
/// megabytes): the owner is read first, so a foreign id costs what an unknown
/// one does. The owner's own read gets the zip.
#[tokio::test]
async fn another_owners_files_are_never_read() {
    let redis = Redis::start().await;
    let keys = shared::Keys::new("sr");
    let target = store::redis_pool::RedisTarget::url(&redis.url()).expect("url");
    let store = script_runner_api::db::Store::new(&target, keys.clone(), None).expect("store");
    let mut c = redis.conn().await;
    let id = "6f1c2a52-8d0e-4c3b-9a51-0d6a2f7e9b10";
    let () = c
        .hset_multiple(
            keys.task(id),
            &[("state", "succeeded"), ("owner", "alice"), ("files", "{}")],
        )
        .await
        .expect("hset");
    let () = c
        .set(keys.task_files(id), b"PK zip".as_slice())
        .await
        .expect("set");
    let before = gets_served(&mut c).await;
    let foreign = store
        .files(id, |owner| owner == Some(&shared::Owner::Key("bob".into())))
        .await
        .expect("read");
    assert!(foreign.is_none());
    assert_eq!(
        gets_served(&mut c).await,
        before,
        "bob's read fetched alice's zip"
    );
    let own = store
        .files(id, |owner| {
            owner == Some(&shared::Owner::Key("alice".into()))
        })
        .await
        .expect("read")
        .expect("alice sees her task");
    assert_eq!(own.2.as_deref(), Some(b"PK zip".as_slice()));
    assert_eq!(gets_served(&mut c).await, before + 1);
}
