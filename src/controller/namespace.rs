//! The Namespace watcher (metadata only, client required): keeps the registry's copy of every
//! namespace's labels current, so an AxQueue's `namespaceSelector` applies as soon as a namespace is
//! labelled or unlabelled. Which tasks move is decided in `core::queue::registry`.

use std::collections::{BTreeMap, HashSet};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use tracing::{debug, info};

use super::Ctx;

/// Applies every Namespace event to the registry; tasks it lets in are dispatched at once.
pub async fn watch(
    ctx: Ctx,
    events: impl Stream<Item = Result<watcher::Event<PartialObjectMeta<Namespace>>, watcher::Error>>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let moved = match event {
            Ok(watcher::Event::Apply(ns) | watcher::Event::InitApply(ns)) => ctx
                .queues
                .lock()
                .namespace_labels(&ns.name_any(), Some(labels_of(&ns))),
            Ok(watcher::Event::Delete(ns)) => {
                ctx.queues.lock().namespace_labels(&ns.name_any(), None)
            }
            Ok(watcher::Event::InitDone) => sync_from_store(&ctx),
            Ok(watcher::Event::Init) => 0,
            Err(e) => {
                debug!(error = %e, "Namespace watch");
                0
            }
        };
        if moved > 0 {
            info!(
                moved,
                "namespace labels changed: waiting tasks re-checked against namespaceSelectors"
            );
            ctx.dispatch_wanted.notify_one();
        }
    }
}

/// Brings the registry in line with the Namespace cache (after a re-list, namespaces deleted while
/// the watch was down). Returns how many tasks moved.
pub fn sync_from_store(ctx: &Ctx) -> usize {
    let namespaces = ctx.namespaces.state();
    let present: HashSet<String> = namespaces.iter().map(|ns| ns.name_any()).collect();
    let mut registry = ctx.queues.lock();
    let mut moved = 0;
    for ns in &namespaces {
        moved += registry.namespace_labels(&ns.name_any(), Some(labels_of(ns)));
    }
    for name in registry.known_namespaces() {
        if !present.contains(&name) {
            moved += registry.namespace_labels(&name, None);
        }
    }
    moved
}

fn labels_of(ns: &PartialObjectMeta<Namespace>) -> BTreeMap<String, String> {
    ns.metadata.labels.clone().unwrap_or_default()
}
