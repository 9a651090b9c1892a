//! Removing every key of a dkey or of an object (punches).

use super::{decode_tail, Directory, Entry, Key, ObjectId, Removed};

impl Directory {
    /// Removes every akey of a dkey: `(akey, entry)` pairs.
    pub fn remove_dkey(&mut self, obj: ObjectId, dkey: &[u8]) -> Vec<(Box<[u8]>, Entry)> {
        let mut out: Vec<(Box<[u8]>, Entry)> = Vec::new();
        self.walk(&Key::new(obj, dkey, &[]), |o, d, a, tail| {
            let same = o == obj && d == dkey;
            if same {
                out.push((a.into(), decode_tail(tail)));
            }
            same
        });
        for (a, _) in &out {
            self.remove(obj, dkey, a);
        }
        out
    }

    /// Removes a whole object: `(dkey, akey, entry)` triples.
    pub fn remove_object(&mut self, obj: ObjectId) -> Vec<Removed> {
        let mut out: Vec<Removed> = Vec::new();
        self.walk(&Key::new(obj, &[], &[]), |o, d, a, tail| {
            if o == obj {
                out.push((d.into(), a.into(), decode_tail(tail)));
            }
            o == obj
        });
        for (d, a, _) in &out {
            self.remove(obj, d, a);
        }
        out
    }
}
