//! The HTTP client the S3 blob store speaks through: hyper-util's pooled client
//! over hyper-rustls with ring (the provider redis already uses) and the system's
//! roots (or `SSL_CERT_FILE`), plain HTTP allowed for an `http://` endpoint.
//!
//! `object_store` would bring reqwest with rustls and aws-lc-rs for this
//! (its `aws` feature); a second provider in the process makes rustls's default
//! ambiguous, so it takes this connector instead (`with_http_connector`). Its
//! own timeouts and retries still apply around each call.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector as Plain;
use hyper_util::rt::TokioExecutor;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest,
    HttpRequestBody, HttpResponse, HttpResponseBody, HttpService,
};

type Https = hyper_rustls::HttpsConnector<Plain>;

/// How long a request may wait for its response's headers.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
#[error("no response within {RESPONSE_TIMEOUT:?}")]
struct TimedOut;

/// Makes the client `object_store` calls S3 with.
#[derive(Debug, Default)]
pub struct RustlsConnector;

impl HttpConnector for RustlsConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let mut plain = Plain::new();
        plain.enforce_http(false);
        plain.set_connect_timeout(Some(Duration::from_secs(10)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: Box::new(e),
            })?
            .https_or_http()
            .enable_http1()
            .wrap_connector(plain);
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(HttpClient::new(Service(client)))
    }
}

#[derive(Debug)]
struct Service(Client<Https, HttpRequestBody>);

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        // A server that accepts and then stalls must not hold a save (and its
        // workspace) forever: the headers come within this, the body is under
        // the save's own deadline.
        let response = tokio::time::timeout(RESPONSE_TIMEOUT, self.0.request(req))
            .await
            .map_err(|_| HttpError::new(HttpErrorKind::Timeout, TimedOut))?
            .map_err(|e| {
                let kind = if e.is_connect() {
                    HttpErrorKind::Connect
                } else {
                    HttpErrorKind::Request
                };
                HttpError::new(kind, e)
            })?;
        let (parts, body) = response.into_parts();
        let body = body.map_err(|e| HttpError::new(HttpErrorKind::Interrupted, e));
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}
