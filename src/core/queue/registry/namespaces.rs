//! The namespaces a queue admits (its `namespaceSelector`), and the moves of waiting tasks into
//! or out of its dispatcher when a namespace's labels or the selector change.

use std::collections::BTreeMap;

use super::{Availability, Place, QueueEntry, Registry, TaskKey};
use crate::core::selector::SelectorExt;

impl QueueEntry {
    /// Whether tasks of a namespace with these labels (`None`: not seen yet) may be dispatched
    /// from this queue. Only a spec in force selects: tasks of a missing or never valid queue wait
    /// for that reason. A selector admits no namespace whose labels are unknown, even one that
    /// would select no labels (`NotIn`, `DoesNotExist`): its real labels may exclude it.
    pub(super) fn admits(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let selector = &self.dispatcher.config().namespace_selector;
        self.availability != Availability::Active
            || selector.selects_all()
            || labels.is_some_and(|labels| selector.matches(labels))
    }
}

impl Registry {
    /// The labels of namespace `name` as the Namespace watcher sees them (`None`: deleted). Tasks of
    /// it that wait move into or out of their queue's dispatcher as its selector now says; tasks
    /// holding a slot keep it. Returns how many moved. Costs one range over the namespace's tasks,
    /// and nothing when the labels did not change.
    pub fn namespace_labels(
        &mut self,
        name: &str,
        labels: Option<BTreeMap<String, String>>,
    ) -> usize {
        if self.namespaces.get(name) == labels.as_ref() {
            return 0;
        }
        match labels {
            Some(labels) => self.namespaces.insert(name.to_string(), labels),
            None => self.namespaces.remove(name),
        };
        let start = (name.to_string(), String::new());
        let keys: Vec<TaskKey> = self
            .tasks
            .range(start..)
            .take_while(|(key, _)| key.0 == name)
            .filter(|(_, task)| !task.place.is_holding())
            .map(|(key, _)| key.clone())
            .collect();
        self.resync(keys)
    }

    /// Namespaces whose labels the registry holds, by name.
    pub fn known_namespaces(&self) -> Vec<String> {
        self.namespaces.keys().cloned().collect()
    }

    /// Moves each waiting task of `keys` into or out of its queue's dispatcher, as the queue
    /// admits its namespace now. Returns how many moved.
    fn resync(&mut self, keys: Vec<TaskKey>) -> usize {
        let mut moved = 0;
        for key in keys {
            let Some(task) = self.tasks.get(&key) else {
                continue;
            };
            let queue = task.queue.clone();
            let labels = self.namespaces.get(&key.0);
            let Some(entry) = self.queues.get_mut(&*queue) else {
                continue;
            };
            let place = match (&task.place, entry.admits(labels)) {
                (Place::Waiting, false) => match entry.dispatcher.take_pending(&key) {
                    Some(pending) => Place::Forbidden(Box::new(pending)),
                    None => continue,
                },
                (Place::Forbidden(pending), true) => {
                    entry.dispatcher.upsert(key.clone(), (**pending).clone());
                    Place::Waiting
                }
                _ => continue,
            };
            self.place(&key, &queue, place);
            moved += 1;
        }
        moved
    }

    /// Re-applies the selector of `queue` to its waiting tasks: one pass over the tasks, made only
    /// when the selector changed or came into or out of force.
    pub(super) fn resync_queue(&mut self, queue: &str) -> usize {
        let keys: Vec<TaskKey> = self
            .tasks
            .iter()
            .filter(|(_, task)| *task.queue == *queue && !task.place.is_holding())
            .map(|(key, _)| key.clone())
            .collect();
        self.resync(keys)
    }
}
