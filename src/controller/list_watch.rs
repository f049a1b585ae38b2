//! A watcher for collections of any size on any API server (client required): the first list comes
//! from the API server's watch cache (`resourceVersion=0`) and is read item by item as it streams
//! in, then a watch follows from the list's resourceVersion, and a watch that falls too far behind
//! (410 Gone) lists again.
//!
//! Why not kube's `watcher`: it pages its lists (`limit=500`), and without `resourceVersion=0`
//! (kube drops it when there is a limit) every page is a quorum read of etcd. With 100,000 AxTasks
//! that is 200 reads of 0.3–1 s each on a small API server, and a label-selected list (the AxDag
//! and AxCron children) scans every task in etcd to find a few, until it times out (504). Served
//! from the watch cache the same list is one response (4 s for 20,000 tasks, selectors applied
//! there); reading it whole would hold the response and every full object at once, so it is split
//! into items as the bytes arrive ([`ListSplitter`]) and each item goes on as soon as it is read.
//! Servers from 1.27 can stream the initial list as watch events; 1.20, which ax supports, cannot.
//!
//! The stream has the shape of kube's watcher (`Init`, `InitApply`…, `InitDone`, then `Apply` and
//! `Delete`), so kube's reflectors and controllers take it as is. Errors are yielded for the
//! record; the stream itself backs off and recovers.

use std::fmt::Debug;
use std::time::Duration;

use futures::io::AsyncBufReadExt;
use futures::{Stream, StreamExt};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::Request;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Events handed on before the consumer must catch up: a bound on what waits in memory.
const BUFFERED_EVENTS: usize = 1024;
/// How long a watch request stays open before it is renewed (kube's watcher uses the same).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// Watches every `K` matching `labels` (all when `None`); see the module doc. `read` turns one
/// item's JSON into a `K` (e.g. one that records why it cannot be read instead of failing).
/// `reduce` is applied to every object as soon as it is read, before it waits for the consumer:
/// what waits is what the consumer keeps, not [`BUFFERED_EVENTS`] whole objects (a restart lists
/// faster than the caches take it in).
pub fn watch<K, R>(
    client: Client,
    labels: Option<String>,
    read: fn(&[u8]) -> serde_json::Result<K>,
    reduce: R,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    R: Fn(&mut K) + Send + Sync + 'static,
{
    let (events, received) = mpsc::channel(BUFFERED_EVENTS);
    tokio::spawn(run(Api::<K>::all(client), labels, read, reduce, events));
    futures::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|event| (event, received))
    })
}

type Sender<K> = mpsc::Sender<Result<Event<K>, watcher::Error>>;

/// Lists and watches until nobody listens any more.
async fn run<K, R>(
    api: Api<K>,
    labels: Option<String>,
    read: fn(&[u8]) -> serde_json::Result<K>,
    reduce: R,
    events: Sender<K>,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    R: Fn(&mut K),
{
    let mut backoff = Backoff::default();
    loop {
        if events.send(Ok(Event::Init)).await.is_err() {
            return;
        }
        let listed = list(&api, labels.as_deref(), read, &reduce, &events).await;
        let mut version = match listed {
            Ok(Some(version)) => version,
            // Nobody listens any more.
            Ok(None) => return,
            Err(e) => {
                warn!(kind = %K::kind(&()), error = %e, "list failed; listing again");
                if events.send(Err(e)).await.is_err() {
                    return;
                }
                backoff.wait().await;
                continue;
            }
        };
        if events.send(Ok(Event::InitDone)).await.is_err() {
            return;
        }
        backoff.reset();
        // Watch from the list's version until the API server no longer has it (410 Gone).
        loop {
            match follow(&api, labels.as_deref(), &mut version, &reduce, &events).await {
                Followed::Closed => return,
                Followed::Ended => backoff.reset(),
                Followed::Gone => {
                    debug!(kind = %K::kind(&()), "watch too old; listing again");
                    break;
                }
                Followed::Failed(e) => {
                    if events.send(Err(e)).await.is_err() {
                        return;
                    }
                    backoff.wait().await;
                }
            }
        }
    }
}

/// How one watch request ended.
enum Followed {
    /// The consumer is gone.
    Closed,
    /// The request timed out or the connection closed: watch again from the last version.
    Ended,
    /// The last version is too old: list again.
    Gone,
    Failed(watcher::Error),
}

async fn follow<K>(
    api: &Api<K>,
    labels: Option<&str>,
    version: &mut String,
    reduce: &impl Fn(&mut K),
    events: &Sender<K>,
) -> Followed
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // Bookmarks (on by default) keep the version current while nothing of ours changes.
    let mut params = WatchParams::default().timeout(WATCH_TIMEOUT_SECONDS);
    if let Some(labels) = labels {
        params = params.labels(labels);
    }
    let stream = match api.watch(&params, version).await {
        Ok(stream) => stream,
        Err(kube::Error::Api(status)) if status.code == 410 => return Followed::Gone,
        Err(e) => return Followed::Failed(watcher::Error::WatchStartFailed(e)),
    };
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(WatchEvent::Added(mut object) | WatchEvent::Modified(mut object)) => {
                set_version(version, &object);
                reduce(&mut object);
                Event::Apply(object)
            }
            Ok(WatchEvent::Deleted(mut object)) => {
                set_version(version, &object);
                reduce(&mut object);
                Event::Delete(object)
            }
            Ok(WatchEvent::Bookmark(bookmark)) => {
                *version = bookmark.metadata.resource_version;
                continue;
            }
            Ok(WatchEvent::Error(status)) if status.code == 410 => return Followed::Gone,
            Ok(WatchEvent::Error(status)) => {
                return Followed::Failed(watcher::Error::WatchError(status));
            }
            Err(e) => return Followed::Failed(watcher::Error::WatchFailed(e)),
        };
        if events.send(Ok(event)).await.is_err() {
            return Followed::Closed;
        }
    }
    Followed::Ended
}

fn set_version<K: Resource>(version: &mut String, object: &K) {
    if let Some(v) = object.resource_version().filter(|v| !v.is_empty()) {
        *version = v;
    }
}

/// Lists from the watch cache, handing each item on as `InitApply` as soon as it is read. Returns
/// the list's resourceVersion, or `None` when the consumer is gone.
async fn list<K>(
    api: &Api<K>,
    labels: Option<&str>,
    read: fn(&[u8]) -> serde_json::Result<K>,
    reduce: &impl Fn(&mut K),
    events: &Sender<K>,
) -> Result<Option<String>, watcher::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let failed = watcher::Error::InitialListFailed;
    let mut params = ListParams::default().match_any();
    if let Some(labels) = labels {
        params = params.labels(labels);
    }
    let request = Request::new(api.resource_url())
        .list(&params)
        .map_err(|e| failed(kube::Error::BuildRequest(e)))?;
    let client: Client = api.clone().into_client();
    let mut body = client.request_stream(request).await.map_err(failed)?;
    let mut splitter = ListSplitter::default();
    let mut version = None;
    loop {
        let chunk = body
            .fill_buf()
            .await
            .map_err(|e| failed(kube::Error::ReadEvents(e)))?;
        if chunk.is_empty() {
            break;
        }
        let mut parts = Vec::new();
        splitter
            .feed(chunk, |part| parts.push(part))
            .map_err(|e| failed(kube::Error::SerdeError(serde::de::Error::custom(e))))?;
        let read_len = chunk.len();
        body.consume_unpin(read_len);
        for part in parts {
            match part {
                Part::Metadata(bytes) => {
                    let meta: kube::api::ListMeta = serde_json::from_slice(&bytes)
                        .map_err(|e| failed(kube::Error::SerdeError(e)))?;
                    version = meta.resource_version.filter(|v| !v.is_empty());
                }
                Part::Item(bytes) => {
                    let mut object =
                        read(&bytes).map_err(|e| failed(kube::Error::SerdeError(e)))?;
                    reduce(&mut object);
                    if events.send(Ok(Event::InitApply(object))).await.is_err() {
                        return Ok(None);
                    }
                }
            }
        }
    }
    splitter
        .finish()
        .map_err(|e| failed(kube::Error::SerdeError(serde::de::Error::custom(e))))?;
    version.map(Some).ok_or(watcher::Error::NoResourceVersion)
}

/// Exponential back-off between failed requests: 0.5 s doubling to 30 s.
#[derive(Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    async fn wait(&mut self) {
        let delay = Duration::from_millis(500) * 2u32.saturating_pow(self.failures.min(6));
        self.failures += 1;
        tokio::time::sleep(delay.min(Duration::from_secs(30))).await;
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// One part of a list response, as [`ListSplitter`] finds it.
#[derive(Debug, PartialEq, Eq)]
pub enum Part {
    /// The list's `metadata` object.
    Metadata(Vec<u8>),
    /// One element of `items`, whole.
    Item(Vec<u8>),
}

/// Splits a Kubernetes list response — a JSON object with `metadata` and an `items` array — into
/// its metadata and its items as its bytes arrive, holding no more than the item being read. It
/// follows strings (and their escapes) and nesting; it does not check the JSON otherwise: each part
/// is parsed by serde afterwards, which does.
#[derive(Debug, Default)]
pub struct ListSplitter {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// Inside the top-level object, where the next string is a key.
    expect_key: bool,
    reading_key: bool,
    /// The top-level key whose value is being read.
    key: Vec<u8>,
    /// The metadata or item being read, from its opening brace.
    part: Vec<u8>,
    capturing: bool,
}

impl ListSplitter {
    /// Reads `bytes`, handing on every part completed in them.
    pub fn feed(&mut self, bytes: &[u8], mut found: impl FnMut(Part)) -> Result<(), String> {
        for &b in bytes {
            if self.capturing {
                self.part.push(b);
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    self.reading_key = false;
                    continue;
                }
                if self.reading_key {
                    self.key.push(b);
                }
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 && self.expect_key {
                        self.expect_key = false;
                        self.reading_key = true;
                        self.key.clear();
                    }
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    let starts = match (self.depth, self.key.as_slice(), b) {
                        (1, _, b'{') => {
                            self.expect_key = true;
                            false
                        }
                        (1, _, _) => return Err("a list response is a JSON object".into()),
                        (2, b"metadata", b'{') => true,
                        (3, b"items", b'{') => true,
                        _ => false,
                    };
                    if starts && !self.capturing {
                        self.capturing = true;
                        self.part.clear();
                        self.part.push(b);
                    }
                }
                b'}' | b']' => {
                    self.depth = self
                        .depth
                        .checked_sub(1)
                        .ok_or("unbalanced brackets in a list response")?;
                    let ends = match (self.depth, self.key.as_slice()) {
                        (1, b"metadata") => Some(Part::Metadata as fn(Vec<u8>) -> Part),
                        (2, b"items") => Some(Part::Item as fn(Vec<u8>) -> Part),
                        _ => None,
                    };
                    if let Some(part) = ends.filter(|_| self.capturing) {
                        self.capturing = false;
                        found(part(std::mem::take(&mut self.part)));
                    }
                }
                b',' if self.depth == 1 => self.expect_key = true,
                _ => {}
            }
        }
        Ok(())
    }

    /// Checks that the response ended where a list ends.
    pub fn finish(&self) -> Result<(), String> {
        if self.depth == 0 && !self.in_string {
            Ok(())
        } else {
            Err("the list response ended early".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The parts of `text` fed in chunks of `chunk` bytes, the metadata first (serde_json writes
    /// keys in alphabetical order, `items` before `metadata`; the API server the other way round).
    fn split(text: &[u8], chunk: usize) -> Vec<Part> {
        let mut splitter = ListSplitter::default();
        let mut parts = Vec::new();
        for piece in text.chunks(chunk.max(1)) {
            splitter.feed(piece, |p| parts.push(p)).expect("splits");
        }
        splitter.finish().expect("complete");
        parts.sort_by_key(|p| !matches!(p, Part::Metadata(_)));
        parts
    }

    #[test]
    fn a_list_splits_into_its_metadata_and_items_whatever_the_chunks() {
        let list = json!({
            "kind": "AxTaskList", "apiVersion": "ax.dev/v1alpha1",
            "metadata": {"resourceVersion": "42", "continue": "x{"},
            "items": [
                {"metadata": {"name": "a"}, "spec": {"payload": {"s": "} ] \\\" {[", "n": [1, {"x": []}]}}},
                {"metadata": {"name": "b"}, "status": {}},
            ],
        });
        let text = serde_json::to_vec(&list).unwrap();
        for chunk in [1, 2, 7, 64, text.len()] {
            let parts = split(&text, chunk);
            assert_eq!(parts.len(), 3, "chunk {chunk}");
            let Part::Metadata(meta) = &parts[0] else {
                panic!("metadata first")
            };
            let meta: serde_json::Value = serde_json::from_slice(meta).unwrap();
            assert_eq!(meta["resourceVersion"], "42");
            for (part, expected) in parts[1..].iter().zip(list["items"].as_array().unwrap()) {
                let Part::Item(item) = part else {
                    panic!("an item")
                };
                let item: serde_json::Value = serde_json::from_slice(item).unwrap();
                assert_eq!(&item, expected);
            }
        }
    }

    #[test]
    fn an_empty_list_has_no_items_and_a_cut_one_is_an_error() {
        let text = br#"{"kind":"List","metadata":{"resourceVersion":"1"},"items":[]}"#;
        assert_eq!(split(text, 5).len(), 1);
        let mut splitter = ListSplitter::default();
        splitter.feed(&text[..30], |_| {}).unwrap();
        assert!(splitter.finish().is_err());
        assert!(ListSplitter::default().feed(b"[1]", |_| {}).is_err());
    }

    proptest! {
        #[test]
        fn any_items_come_out_whole(
            names in prop::collection::vec("[a-z\"\\\\{}\\[\\], ]{0,12}", 0..20),
            chunk in 1usize..50,
        ) {
            let items: Vec<serde_json::Value> = names
                .iter()
                .map(|n| json!({"metadata": {"name": n}, "spec": {"list": [n, {"k": n}]}}))
                .collect();
            let list = json!({"metadata": {"resourceVersion": "7"}, "items": items});
            let text = serde_json::to_vec(&list).unwrap();
            let parts = split(&text, chunk);
            prop_assert_eq!(parts.len(), items.len() + 1);
            for (part, expected) in parts[1..].iter().zip(&items) {
                let Part::Item(item) = part else { panic!("an item") };
                let item: serde_json::Value = serde_json::from_slice(item).unwrap();
                prop_assert_eq!(&item, expected);
            }
        }
    }
}
