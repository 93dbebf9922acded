//! The `-finstrument-functions` hook bindings of a process's modules: the
//! GOT slots through which their code calls `__cyg_profile_func_enter` and
//! `__cyg_profile_func_exit`.
//!
//! In a process started without the runtime those calls are bound to the
//! C library's own functions, which do nothing. An attach points each slot
//! at the runtime's hook of the same name, and a detach puts back what the
//! slot held. A slot is read from the module's dynamic relocations: a
//! `JUMP_SLOT` (a call through the PLT) or a `GLOB_DAT` (a `-fno-plt` call
//! through the GOT).

use crate::error::{AttachError, Result};
use crate::files::Files;
use crate::maps::Module;
use crate::sleds::load_bias;

pub use providers::hookslots::{Slot, HOOKS};

/// The hook slots of the ELF file `bytes`, mapped with its offset 0 at
/// `base`.
pub fn of_file(bytes: &[u8], base: u64) -> Result<Vec<Slot>> {
    let elf = crate::headers::parse(bytes).map_err(|e| AttachError::Other(format!("ELF: {e}")))?;
    let Some(bias) = load_bias(&elf, base) else {
        return Ok(Vec::new());
    };
    Ok(providers::hookslots::of_elf(&elf, bias))
}

/// The hook slots of every module (the runtime's own library aside).
pub fn of_modules(modules: &[Module], files: &mut Files) -> Result<Vec<Slot>> {
    let mut out = Vec::new();
    for m in modules {
        if m.path.file_name().is_some_and(|n| n == crate::LIBRARY_NAME) {
            continue;
        }
        let Some(bytes) = files.get(&m.path) else { continue };
        out.extend(of_file(bytes, m.base)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_no_hook_slot() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(exe).unwrap();
        assert!(of_file(&bytes, 0x5555_0000_0000).unwrap().is_empty());
    }
}
