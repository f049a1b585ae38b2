//! The task types and the (namespace, type) circuits the dispatcher knows: interned as ids when
//! first seen, and released with their last task, so memory follows the live pairs.

use std::collections::HashMap;
use std::hash::Hash;

use super::Dispatcher;
use crate::core::queue::breaker::Breaker;

/// Index into `Dispatcher::types`.
pub(super) type TypeId = usize;
/// Index into `Dispatcher::circuits`.
pub(super) type CircuitId = usize;

/// A task type, across namespaces: its limit and how many of its tasks hold a slot.
#[derive(Debug)]
pub(super) struct TypeState {
    pub(super) name: String,
    pub(super) limit: Option<u32>,
    pub(super) running: u32,
    /// Its circuits by namespace; the type is forgotten with the last of them.
    pub(super) circuits: HashMap<String, CircuitId>,
}

/// The tasks of one type in one namespace, and their breaker.
#[derive(Debug)]
pub(super) struct CircuitState {
    pub(super) namespace: String,
    pub(super) type_id: TypeId,
    pub(super) pending: usize,
    pub(super) running: u32,
    pub(super) breaker: Breaker,
}

impl<K: Clone + Eq + Hash + Ord> Dispatcher<K> {
    /// The circuit of (namespace, type), created (with its type) when new.
    pub(super) fn intern(&mut self, namespace: &str, task_type: &str) -> CircuitId {
        let type_id = self.intern_type(task_type);
        if let Some(id) = self.types[type_id].circuits.get(namespace) {
            return *id;
        }
        let state = CircuitState {
            namespace: namespace.to_string(),
            type_id,
            pending: 0,
            running: 0,
            breaker: Breaker::new(),
        };
        let id = match self.free_circuit_ids.pop() {
            Some(id) => {
                self.circuits[id] = state;
                id
            }
            None => {
                self.circuits.push(state);
                self.circuits.len() - 1
            }
        };
        self.types[type_id]
            .circuits
            .insert(namespace.to_string(), id);
        id
    }

    fn intern_type(&mut self, task_type: &str) -> TypeId {
        if let Some(id) = self.type_ids.get(task_type) {
            return *id;
        }
        let state = TypeState {
            name: task_type.to_string(),
            limit: self.config.type_limit_in(self.window, task_type),
            running: 0,
            circuits: HashMap::new(),
        };
        let id = match self.free_type_ids.pop() {
            Some(id) => {
                self.types[id] = state;
                id
            }
            None => {
                self.types.push(state);
                self.types.len() - 1
            }
        };
        self.type_ids.insert(task_type.to_string(), id);
        id
    }

    /// Drops a circuit that has no pending or running task and nothing in its breaker worth
    /// keeping, and its type with its last circuit, so that memory follows the live (namespace,
    /// type) pairs rather than every one ever seen.
    pub(super) fn release_circuit_if_unused(&mut self, circuit: CircuitId) {
        let state = &self.circuits[circuit];
        if state.pending > 0 || state.running > 0 || !state.breaker.is_forgettable() {
            return;
        }
        let type_id = state.type_id;
        let task_type = &mut self.types[type_id];
        task_type.circuits.remove(&state.namespace);
        self.free_circuit_ids.push(circuit);
        if task_type.circuits.is_empty() {
            self.type_ids.remove(&task_type.name);
            self.free_type_ids.push(type_id);
        }
    }
}
