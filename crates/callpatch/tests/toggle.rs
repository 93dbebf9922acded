//! Toggling live call sites: every form, split and mode executes as it
//! should in each state, transitions are checked, and refusals are clean.

use callpatch::*;

/// Generated code: `xor eax,eax; <site>; ret` with the site at a chosen
/// split, calling (or jumping to) `mov eax,1; ret`. Returns 1 when active.
struct Code {
    map: memmap2::Mmap,
    site: *mut u8,
    operand: i32,
    form: Form,
}

impl Drop for Code {
    fn drop(&mut self) {
        wordpatch::forget_pages(self.map.as_ptr(), self.map.len());
    }
}

impl Code {
    fn new(form: Form, split: usize) -> Code {
        let mut m = memmap2::MmapOptions::new().len(8192).map_anon().unwrap();
        m.fill(0xCC);
        let site = if split == 0 { 512 + 8 } else { 512 - split };
        let target = 4096 + 100;
        m[target..target + 6].copy_from_slice(&[0xB8, 1, 0, 0, 0, 0xC3]);
        let slot = 2048;
        let base = m.as_ptr() as usize;
        m[slot..slot + 8].copy_from_slice(&((base + target) as u64).to_le_bytes());
        let operand = match form {
            Form::CallRipIndirect | Form::JmpRipIndirect => (slot as i64 - (site + 6) as i64) as i32,
            _ => (target as i64 - (site + 5) as i64) as i32,
        };
        m[site - 2..site].copy_from_slice(&[0x31, 0xC0]);
        m[site..site + form.len()].copy_from_slice(&form.on_bytes(operand)[..form.len()]);
        if !form.is_tail() {
            m[site + form.len()] = 0xC3;
        }
        let map = m.make_exec().unwrap();
        let site = map.as_ptr().wrapping_add(site) as *mut u8;
        Code {
            map,
            site,
            operand,
            form,
        }
    }

    fn run(&self) -> u32 {
        // SAFETY: `site - 2` starts the C-ABI function laid out in `new`.
        let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(self.site.sub(2)) };
        f()
    }

    fn call(&self) -> CallSite {
        // SAFETY: the generated site; this test owns its toggling.
        unsafe { CallSite::new(self.site, self.form, self.operand) }.unwrap()
    }
}

const FORMS: [Form; 4] = Form::ALL;

#[test]
fn every_form_split_and_mode_toggles() {
    for form in FORMS {
        for split in 0..form.len() {
            let c = Code::new(form, split);
            let call = c.call();
            assert_eq!(call.split(), split);
            for mode in [Mode::Paper, Mode::Flip] {
                let what = format!("{form:?} split {split} {mode:?}");
                assert_eq!(c.run(), 1, "{what}: active");
                call.deactivate(mode).unwrap();
                assert!(!call.is_active());
                let v = c.run();
                assert!(v != 1, "{what}: still calls after deactivate ({v:#x})");
                assert_eq!(call.current(), call.off(mode).unwrap(), "{what}");
                call.deactivate(mode).expect("deactivating twice is a no-op");
                call.activate().unwrap();
                assert_eq!(c.run(), 1, "{what}: reactivated");
                call.activate().expect("activating twice is a no-op");
                assert_eq!(call.current(), call.on());
            }
        }
    }
}

#[test]
fn flip_changes_one_byte_and_paper_follows_the_paper() {
    let c = Code::new(Form::CallRel32, 3);
    let call = c.call();
    assert_eq!(call.off(Mode::Flip).unwrap()[0], 0xB8);
    assert_eq!(&call.off(Mode::Flip).unwrap()[1..], &call.on()[1..]);
    assert_eq!(&call.off(Mode::Paper).unwrap()[..2], &[0xEB, 0x03]);
    let c1 = Code::new(Form::CallRel32, 1);
    let call1 = c1.call();
    let off = call1.off(Mode::Paper).unwrap();
    assert_eq!(off[0], 0xE8, "1|4 keeps the opcode and retargets the call");
    let rel = i32::from_le_bytes([off[1], off[2], off[3], off[4]]);
    let tramp = c1.site as i64 + 5 + rel as i64;
    // SAFETY: the trampoline page is mapped readable.
    assert_eq!(unsafe { *(tramp as *const u8) }, 0xC3);
}

#[test]
fn a_site_off_in_one_mode_is_refused_by_the_other() {
    let c = Code::new(Form::CallRel32, 0);
    let call = c.call();
    call.deactivate(Mode::Flip).unwrap();
    assert!(matches!(call.deactivate(Mode::Paper), Err(Error::Unexpected { .. })));
    call.activate().unwrap();
    call.deactivate(Mode::Paper).unwrap();
    call.activate().unwrap();
    assert_eq!(c.run(), 1);
}

#[test]
fn unexpected_bytes_are_refused_and_left_alone() {
    let c = Code::new(Form::CallRel32, 2);
    // Wrong operand: the site holds neither this on form nor its off forms.
    assert!(matches!(
        // SAFETY: the generated site; nothing is written on refusal.
        unsafe { CallSite::new(c.site, Form::CallRel32, c.operand + 1) },
        Err(Error::Unexpected { .. })
    ));
    // Not a call at all.
    // SAFETY: as above.
    let err = unsafe { CallSite::from_active(c.site.sub(2)) }.unwrap_err();
    assert!(matches!(err, Error::UnknownForm { .. }), "{err}");
    // Someone else rewrote the site behind our back: toggles refuse.
    let call = c.call();
    // SAFETY: page writable (made so by CallSite::new); a valid 5-byte NOP.
    unsafe { wordpatch::patch(c.site, &[0x0F, 0x1F, 0x44, 0x00, 0x00]) }.unwrap();
    assert!(matches!(call.deactivate(Mode::Flip), Err(Error::Unexpected { .. })));
    assert!(matches!(call.activate(), Err(Error::Unexpected { .. })));
    assert_eq!(call.current(), vec![0x0F, 0x1F, 0x44, 0x00, 0x00]);
    // Data is not code.
    let data = Box::new([0xE8u8, 0, 0, 0, 0, 0, 0, 0]);
    // SAFETY: refused before any write.
    let err = unsafe { CallSite::from_active(data.as_ptr() as *mut u8) }.unwrap_err();
    assert!(
        matches!(err, Error::Patch(wordpatch::Error::NotExecutable { .. })),
        "{err}"
    );
}

#[test]
fn free_functions() {
    for split in 0..5 {
        let c = Code::new(Form::CallRel32, split);
        for mode in [Mode::Paper, Mode::Flip] {
            // SAFETY: a call rel32 to a C-ABI function owned by this test.
            unsafe { deactivate_call_with(c.site, mode) }.unwrap();
            assert_ne!(c.run(), 1);
            // SAFETY: as above.
            unsafe { activate_call(c.site, c.operand) }.unwrap();
            assert_eq!(c.run(), 1);
        }
        // SAFETY: as above.
        unsafe { deactivate_call(c.site) }.unwrap();
        assert_ne!(c.run(), 1);
        // SAFETY: as above.
        unsafe { activate_call(c.site, c.operand) }.unwrap();
    }
    let c = Code::new(Form::JmpRel32, 0);
    assert!(matches!(
        // SAFETY: refused: a jmp is not a call rel32.
        unsafe { deactivate_call(c.site) },
        Err(Error::UnknownForm { .. })
    ));
}

#[test]
fn modes_parse_and_default() {
    assert_eq!("flip".parse::<Mode>(), Ok(Mode::Flip));
    let d = default_mode();
    set_default_mode(Mode::Flip);
    assert_eq!(default_mode(), Mode::Flip);
    set_default_mode(d);
}
