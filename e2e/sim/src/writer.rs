//! Every API write of the simulator goes through one bounded, retrying gate, so thousands of pods
//! finishing at once queue here instead of flooding the API server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const MAX_ATTEMPTS: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The object no longer exists (404): nothing left to write.
    #[error("object is gone")]
    Gone,
    #[error("{what}: giving up after {attempts} attempt(s): {source}")]
    Failed {
        what: String,
        attempts: u32,
        #[source]
        source: kube::Error,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Gone,
    Retry,
    Fatal,
}

pub fn classify(error: &kube::Error) -> ErrorClass {
    match error {
        kube::Error::Api(status) => match status.code {
            404 => ErrorClass::Gone,
            // 409: a conflict or a failed precondition; 429: throttled; 5xx: server trouble.
            409 | 429 | 500..=599 => ErrorClass::Retry,
            _ => ErrorClass::Fatal,
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            ErrorClass::Retry
        }
        _ => ErrorClass::Fatal,
    }
}

fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
        .min(MAX_BACKOFF)
}

#[derive(Clone)]
pub struct ApiWriter {
    permits: Arc<Semaphore>,
}

impl ApiWriter {
    pub fn new(concurrency: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
        }
    }

    /// Runs `request` with at most `concurrency` requests in flight across the process, retrying
    /// conflicts and transient failures with exponential backoff (no permit is held while waiting).
    pub async fn write<T, F, Fut>(&self, what: &str, mut request: F) -> Result<T, WriteError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = {
                // The semaphore is never closed, so acquiring only fails if that changes; then run unbounded.
                let _permit = self.permits.acquire().await.ok();
                request().await
            };
            let error = match result {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            match classify(&error) {
                ErrorClass::Gone => return Err(WriteError::Gone),
                ErrorClass::Retry if attempt < MAX_ATTEMPTS => {
                    tracing::debug!(what, attempt, %error, "retrying API write");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                ErrorClass::Retry | ErrorClass::Fatal => {
                    return Err(WriteError::Failed {
                        what: what.to_owned(),
                        attempts: attempt,
                        source: error,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("test", "Test").with_code(code),
        ))
    }

    #[test]
    fn classifies_api_errors() {
        assert_eq!(classify(&api_error(404)), ErrorClass::Gone);
        for code in [409, 429, 500, 503, 504] {
            assert_eq!(classify(&api_error(code)), ErrorClass::Retry, "{code}");
        }
        for code in [400, 403, 422] {
            assert_eq!(classify(&api_error(code)), ErrorClass::Fatal, "{code}");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(800));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_errors_then_succeeds() {
        let calls = AtomicU32::new(0);
        let result = ApiWriter::new(2)
            .write("test", || {
                let call = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if call < 3 {
                        Err(api_error(409))
                    } else {
                        Ok(call)
                    }
                }
            })
            .await;
        assert_eq!(result.ok(), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_on_gone_and_on_fatal_errors() {
        let writer = ApiWriter::new(1);
        let gone = writer
            .write("test", || async { Err::<(), _>(api_error(404)) })
            .await;
        assert!(matches!(gone, Err(WriteError::Gone)));
        let calls = AtomicU32::new(0);
        let fatal = writer
            .write("test", || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(api_error(422)) }
            })
            .await;
        assert!(matches!(fatal, Err(WriteError::Failed { attempts: 1, .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_attempts() {
        let calls = AtomicU32::new(0);
        let result = ApiWriter::new(1)
            .write("test", || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(api_error(503)) }
            })
            .await;
        assert!(matches!(
            result,
            Err(WriteError::Failed {
                attempts: MAX_ATTEMPTS,
                ..
            })
        ));
        assert_eq!(calls.load(Ordering::SeqCst), MAX_ATTEMPTS);
    }
}
