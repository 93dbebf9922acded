//! The modules' ELF files, each read once however many times an attach or
//! a detach looks at it.
//!
//! Why: the sled sites, the hook slots and the code to compare all come
//! from the same files, and each used to read them again (three reads of
//! every probed module at each attach, while the target's threads keep
//! the CPUs busy and the attach waits).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Files read so far, by path; `None` for one that could not be read.
#[derive(Default)]
pub struct Files {
    read: HashMap<PathBuf, Option<Vec<u8>>>,
}

impl Files {
    /// No file read yet.
    pub fn new() -> Files {
        Files::default()
    }

    /// The bytes of the file at `path`, read at the first call for it;
    /// `None` if it cannot be read.
    pub fn get(&mut self, path: &Path) -> Option<&[u8]> {
        self.read
            .entry(path.to_path_buf())
            .or_insert_with(|| std::fs::read(path).ok())
            .as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_once_and_a_missing_one_is_none() {
        let dir = std::env::temp_dir().join(format!("fastinst-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a");
        std::fs::write(&f, b"first").unwrap();
        let mut files = Files::new();
        assert_eq!(files.get(&f), Some(&b"first"[..]));
        // Changed on disk: the attach keeps what it read first.
        std::fs::write(&f, b"second").unwrap();
        assert_eq!(files.get(&f), Some(&b"first"[..]));
        assert_eq!(files.get(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
