//! The inode table of a mount: kernel inode numbers ↔ namespace entries.
//!
//! The namespace names an entry by (directory object, name); the kernel by a
//! 64-bit inode. Inode 1 is the root. An inode stays valid while the kernel
//! holds lookups on it (`forget` drops them).

use std::collections::HashMap;

pub const ROOT_INO: u64 = 1;

/// Where an inode's entry lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Directory object holding the entry (for the root: the root itself).
    pub parent: u128,
    pub name: String,
    /// The entry's own object (directory entries or file chunks).
    pub object: u128,
    lookups: u64,
}

/// Inode numbers by object, and nodes by inode.
#[derive(Debug, Default)]
pub struct Inodes {
    nodes: HashMap<u64, Node>,
    by_object: HashMap<u128, u64>,
    next: u64,
}

impl Inodes {
    pub fn new(root_object: u128) -> Self {
        let mut t = Self {
            nodes: HashMap::new(),
            by_object: HashMap::new(),
            next: ROOT_INO + 1,
        };
        t.nodes.insert(
            ROOT_INO,
            Node {
                parent: root_object,
                name: String::new(),
                object: root_object,
                lookups: 1,
            },
        );
        t.by_object.insert(root_object, ROOT_INO);
        t
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    /// The inode of `object` now named `name` in `parent`; counts a lookup.
    pub fn remember(&mut self, parent: u128, name: &str, object: u128) -> u64 {
        if let Some(&ino) = self.by_object.get(&object) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.parent = parent;
                n.name = name.to_string();
                n.lookups += 1;
                return ino;
            }
        }
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(
            ino,
            Node {
                parent,
                name: name.to_string(),
                object,
                lookups: 1,
            },
        );
        self.by_object.insert(object, ino);
        ino
    }

    /// Records a rename of the entry behind `object`.
    pub fn moved(&mut self, object: u128, parent: u128, name: &str) {
        if let Some(n) = self
            .by_object
            .get(&object)
            .and_then(|i| self.nodes.get_mut(i))
        {
            n.parent = parent;
            n.name = name.to_string();
        }
    }

    /// Drops `count` lookups; the inode goes when none are left.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if ino == ROOT_INO {
            return;
        }
        let gone = match self.nodes.get_mut(&ino) {
            Some(n) => {
                n.lookups = n.lookups.saturating_sub(count);
                n.lookups == 0
            }
            None => false,
        };
        if gone {
            if let Some(n) = self.nodes.remove(&ino) {
                self.by_object.remove(&n.object);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remember_rename_forget() {
        let mut t = Inodes::new(1);
        let a = t.remember(1, "a", 10);
        assert_eq!(t.remember(1, "a", 10), a, "same object, same inode");
        t.moved(10, 5, "b");
        assert_eq!(t.get(a).map(|n| n.name.as_str()), Some("b"));
        t.forget(a, 1);
        assert!(t.get(a).is_some(), "one lookup left");
        t.forget(a, 1);
        assert!(t.get(a).is_none());
        t.forget(ROOT_INO, 10);
        assert!(t.get(ROOT_INO).is_some(), "root is never forgotten");
    }
}
