//! The resource list: the engine's coordinator slots and every node's
//! execution streams, what each stream holds, and the coordinators' requests
//! for streams not yet granted.

use std::collections::{HashMap, VecDeque};

use super::NodeId;

#[derive(Debug)]
pub(super) struct Node {
    pub name: String,
    pub alive: bool,
    /// Grants each stream can still take.
    pub free: Vec<u32>,
    /// job -> grants held per stream.
    leases: HashMap<u128, Vec<u32>>,
}

#[derive(Debug)]
pub(super) struct Resources {
    pub depth: u32,
    /// The engine's coordinator slots: the job each one runs.
    slots: Vec<Option<u128>>,
    pub nodes: HashMap<NodeId, Node>,
    pub node_order: Vec<NodeId>,
    /// Streams asked for and not yet granted, per job.
    wanted: HashMap<u128, u32>,
    /// Jobs with a request, served round robin.
    requests: VecDeque<u128>,
    /// Jobs that must not run on a node (the engine's own streams cannot
    /// reach a job's store in another engine).
    keep_off: HashMap<u128, NodeId>,
}

impl Resources {
    pub fn new(coordinator_slots: u32, depth: u32) -> Self {
        Self {
            depth: depth.max(1),
            slots: vec![None; coordinator_slots.max(1) as usize],
            nodes: HashMap::new(),
            node_order: Vec::new(),
            wanted: HashMap::new(),
            requests: VecDeque::new(),
            keep_off: HashMap::new(),
        }
    }

    /// No stream of `node` is granted to `job`.
    pub fn keep_off(&mut self, job: u128, node: NodeId) {
        self.keep_off.insert(job, node);
    }

    pub fn offer(&mut self, node: NodeId, name: String, xstreams: u32) {
        let free = vec![self.depth; xstreams.max(1) as usize];
        let leases = HashMap::new();
        let alive = true;
        self.nodes.insert(
            node,
            Node {
                name,
                alive,
                free,
                leases,
            },
        );
        self.node_order.retain(|&n| n != node);
        self.node_order.push(node);
    }

    /// How many coordinator slots the engine offers.
    #[cfg(test)]
    pub fn slots(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Grants `job` a free coordinator slot, if one is.
    pub fn grant_slot(&mut self, job: u128) -> Option<u32> {
        let slot = self.slots.iter().position(Option::is_none)?;
        self.slots[slot] = Some(job);
        Some(slot as u32)
    }

    /// `job`'s coordinator now wants `count` streams in all (replaces its
    /// earlier request).
    pub fn request(&mut self, job: u128, count: u32) {
        if count == 0 {
            self.wanted.remove(&job);
            return;
        }
        if self.wanted.insert(job, count).is_none() {
            self.requests.push_back(job);
        }
    }

    /// The alive stream with the most free grants, not on `avoid`.
    fn best_stream(&self, avoid: Option<NodeId>) -> Option<(NodeId, u32)> {
        let mut best: Option<(NodeId, u32, u32)> = None;
        for &id in &self.node_order {
            let node = &self.nodes[&id];
            if !node.alive || avoid == Some(id) {
                continue;
            }
            for (x, &f) in node.free.iter().enumerate() {
                if f > 0 && best.is_none_or(|(_, _, bf)| f > bf) {
                    best = Some((id, x as u32, f));
                }
            }
        }
        best.map(|(n, x, _)| (n, x))
    }

    /// Grants free streams to the requests, one at a time round robin over
    /// jobs; returns the streams granted to each job, in grant order.
    pub fn serve(&mut self) -> Vec<(u128, Vec<(NodeId, u32)>)> {
        let mut out: Vec<(u128, Vec<(NodeId, u32)>)> = Vec::new();
        // Jobs passed over in a row: none of them can use a free stream.
        let mut passed = 0;
        while let Some(&job) = self.requests.front() {
            if !self.wanted.contains_key(&job) {
                self.requests.pop_front();
                continue;
            }
            let avoid = self.keep_off.get(&job).copied();
            let Some((node_id, x)) = self.best_stream(avoid) else {
                passed += 1;
                if avoid.is_none() || passed >= self.requests.len() {
                    break;
                }
                self.requests.rotate_left(1);
                continue;
            };
            passed = 0;
            let left = self.wanted.get_mut(&job).map_or(0, |left| {
                *left -= 1;
                *left
            });
            if left == 0 {
                self.wanted.remove(&job);
                self.requests.pop_front();
            } else if self.requests.len() > 1 {
                self.requests.rotate_left(1);
            }
            if let Some(node) = self.nodes.get_mut(&node_id) {
                node.free[x as usize] -= 1;
                let width = node.free.len();
                node.leases.entry(job).or_insert_with(|| vec![0; width])[x as usize] += 1;
            }
            match out.iter_mut().find(|(j, _)| *j == job) {
                Some((_, v)) => v.push((node_id, x)),
                None => out.push((job, vec![(node_id, x)])),
            }
        }
        out
    }

    /// Stream `x` of `node` finished a task of `job`: one grant is free again.
    pub fn release(&mut self, node: NodeId, job: u128, x: u32) {
        let Some(n) = self.nodes.get_mut(&node) else {
            return;
        };
        let Some(held) = n.leases.get_mut(&job) else {
            return;
        };
        if let Some(h) = held.get_mut(x as usize).filter(|h| **h > 0) {
            *h -= 1;
            n.free[x as usize] += 1;
        }
    }

    /// `job` ended: its slot and every grant it held are free; returns the
    /// alive nodes among `nodes` that held grants (to be told to drop them).
    pub fn release_job(&mut self, job: u128, nodes: &[NodeId]) -> Vec<NodeId> {
        for s in self.slots.iter_mut().filter(|s| **s == Some(job)) {
            *s = None;
        }
        self.wanted.remove(&job);
        self.keep_off.remove(&job);
        let mut revoked = Vec::new();
        for id in nodes {
            let Some(node) = self.nodes.get_mut(id) else {
                continue;
            };
            let Some(held) = node.leases.remove(&job) else {
                continue;
            };
            let mut any = false;
            for (f, h) in node.free.iter_mut().zip(held) {
                *f += h;
                any |= h > 0;
            }
            if node.alive && any {
                revoked.push(*id);
            }
        }
        revoked
    }

    /// `node` is gone: its streams leave the list. Returns the jobs that
    /// held grants there, in id order.
    pub fn node_lost(&mut self, node_id: NodeId) -> Vec<u128> {
        let Some(node) = self.nodes.get_mut(&node_id) else {
            return Vec::new();
        };
        node.alive = false;
        node.free.iter_mut().for_each(|f| *f = 0);
        self.node_order.retain(|&n| n != node_id);
        let mut jobs: Vec<u128> = node
            .leases
            .drain()
            .filter(|(_, held)| held.iter().any(|&h| h > 0))
            .map(|(j, _)| j)
            .collect();
        jobs.sort_unstable();
        jobs
    }

    /// Free grants over all alive streams.
    pub fn free_grants(&self) -> u32 {
        self.nodes
            .values()
            .filter(|n| n.alive)
            .flat_map(|n| n.free.iter())
            .sum()
    }
}
