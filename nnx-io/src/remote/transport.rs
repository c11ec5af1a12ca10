//! The HTTP client every store gets: `object_store`'s own (reqwest), with the body of an
//! error answer cut short before `object_store` reads it whole into its message, so that a
//! server cannot make nnx buffer an endless error page or reserve what its `Content-Length`
//! claims.

use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpResponseBody, HttpService, ReqwestConnector,
};

/// The most of an error answer's body kept: enough for any store's error document.
pub(crate) const MAX_ERROR_BODY_BYTES: usize = 16 << 10;

/// Connects stores through [`BoundedService`].
#[derive(Debug, Default)]
pub(crate) struct BoundedConnector;

impl HttpConnector for BoundedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(BoundedService { inner }))
    }
}

/// Sends requests through `inner`; answers other than success come back with at most
/// [`MAX_ERROR_BODY_BYTES`] of their body. Successful answers are left as they are: their
/// bodies are streamed, and checked against what was asked, by the readers.
#[derive(Debug)]
struct BoundedService {
    inner: HttpClient,
}

impl HttpService for BoundedService {
    // The form `#[async_trait]` gives the trait's `async fn call`.
    fn call<'service, 'future>(
        &'service self,
        request: HttpRequest,
    ) -> Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'future>>
    where
        'service: 'future,
        Self: 'future,
    {
        Box::pin(async move {
            let response = self.inner.execute(request).await?;
            if response.status().is_success() {
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            Ok(HttpResponse::from_parts(parts, HttpResponseBody::from(cut_short(body).await)))
        })
    }
}

/// The first [`MAX_ERROR_BODY_BYTES`] of `body` (what arrived of them, if it fails first).
async fn cut_short(body: HttpResponseBody) -> Vec<u8> {
    let mut stream = body.bytes_stream();
    let mut kept = Vec::new();
    while kept.len() < MAX_ERROR_BODY_BYTES {
        let Some(Ok(chunk)) = stream.next().await else { break };
        let room = MAX_ERROR_BODY_BYTES - kept.len();
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_are_cut_short() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let long = HttpResponseBody::from(vec![b'x'; 3 * MAX_ERROR_BODY_BYTES]);
        assert_eq!(runtime.block_on(cut_short(long)).len(), MAX_ERROR_BODY_BYTES);
        let short = HttpResponseBody::from(b"not found".to_vec());
        assert_eq!(runtime.block_on(cut_short(short)), b"not found");
    }
}
