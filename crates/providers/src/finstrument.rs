//! The `-finstrument-functions` provider: recognising the hook call sites.
//!
//! gcc and clang call `__cyg_profile_func_enter(this_fn, call_site)` at
//! function entry and `__cyg_profile_func_exit` at exit. The forms seen in
//! real code, all recognised here:
//!
//! | form | bytes | emitted by |
//! | --- | --- | --- |
//! | [`SiteForm::Call`] | `E8 rel32` to the hook | static link, `-Wl,-Bsymbolic` |
//! | [`SiteForm::CallPlt`] | `E8 rel32` to a PLT stub | the default (PIE and non-PIE) |
//! | [`SiteForm::CallGot`] | `FF 15 disp32`, GOT slot | `-fno-plt` |
//! | [`SiteForm::TailJmp`] / [`SiteForm::TailJmpPlt`] | `E9 rel32` | exit hooks at `-O2` |
//! | [`SiteForm::TailJmpGot`] | `FF 25 disp32` | exit hooks at `-O2 -fno-plt` |
//!
//! A call site is found from the hook's return address: the instruction
//! must decode to exactly the call that ends there, and its target must
//! resolve to the hook (directly, through a PLT stub whose GOT slot holds the
//! hook, or through a GOT slot). A tail-jumped exit hook returns to the
//! instrumented function's *caller*, so its return address does not locate
//! the site; [`tail_sites`] finds those by decoding the function body. PLT
//! stubs are recognised in their lazy (`FF 25`), IBT (`endbr64; bnd jmp`)
//! and `.plt.got` forms.

use crate::decode::{decode_one, Step, Stream};
use crate::memory::Memory;
use callpatch::Form;
use iced_x86::{Code, FlowControl, Instruction, Mnemonic, OpKind, Register};

/// Which hook a site calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookKind {
    /// `__cyg_profile_func_enter`.
    Enter,
    /// `__cyg_profile_func_exit`.
    Exit,
}

/// Addresses of the two hooks in the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hooks {
    /// `__cyg_profile_func_enter`.
    pub enter: u64,
    /// `__cyg_profile_func_exit`.
    pub exit: u64,
}

impl Hooks {
    /// The address of the hook of `kind`.
    pub fn of(&self, kind: HookKind) -> u64 {
        match kind {
            HookKind::Enter => self.enter,
            HookKind::Exit => self.exit,
        }
    }
}

/// How a recognised site reaches its hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiteForm {
    /// `call rel32` straight to the hook.
    Call,
    /// `call rel32` to a PLT stub.
    CallPlt,
    /// `call [rip+disp32]` through a GOT slot.
    CallGot,
    /// `jmp rel32` straight to the exit hook (a tail call).
    TailJmp,
    /// `jmp rel32` to a PLT stub of the exit hook.
    TailJmpPlt,
    /// `jmp [rip+disp32]` through a GOT slot.
    TailJmpGot,
    /// A `-fpatchable-function-entry` NOP sled ([`crate::patchable`]),
    /// switched on as a `call rel32` to a trampoline.
    Sled,
}

impl SiteForm {
    /// The callpatch form that toggles it.
    pub fn call_form(self) -> Form {
        match self {
            SiteForm::Call | SiteForm::CallPlt | SiteForm::Sled => Form::CallRel32,
            SiteForm::CallGot => Form::CallRipIndirect,
            SiteForm::TailJmp | SiteForm::TailJmpPlt => Form::JmpRel32,
            SiteForm::TailJmpGot => Form::JmpRipIndirect,
        }
    }

    /// True for the tail-jump forms.
    pub fn is_tail(self) -> bool {
        self.call_form().is_tail()
    }

    /// A short name: `call`, `plt`, `got`, `tail`, `tail-plt`, `tail-got`,
    /// `sled`.
    pub fn name(self) -> &'static str {
        match self {
            SiteForm::Call => "call",
            SiteForm::CallPlt => "plt",
            SiteForm::CallGot => "got",
            SiteForm::TailJmp => "tail",
            SiteForm::TailJmpPlt => "tail-plt",
            SiteForm::TailJmpGot => "tail-got",
            SiteForm::Sled => "sled",
        }
    }
}

/// A recognised hook site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookSite {
    /// Address of the call or jmp instruction.
    pub addr: u64,
    /// Which hook it reaches.
    pub kind: HookKind,
    /// How.
    pub form: SiteForm,
    /// The rel32 or disp32 operand of the active instruction.
    pub operand: i32,
}

impl HookSite {
    /// Instruction length.
    pub fn len(&self) -> usize {
        self.form.call_form().len()
    }

    /// Never true: an instruction has bytes.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Address after the instruction (a call site's return address).
    pub fn end(&self) -> u64 {
        self.addr + self.len() as u64
    }
}

/// Why a return address did not lead to a recognised call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unrecognised {
    /// The bytes before it are not readable.
    Unreadable,
    /// No `call rel32` or `call [rip+disp32]` ends there.
    NoCall,
    /// A call ends there, but its target does not resolve to the hook.
    NotTheHook {
        /// Where the call goes (the slot's value for an indirect call).
        target: u64,
    },
}

/// How a branch target reaches `hook`, if it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Direct,
    Plt,
}

/// The GOT slot a PLT stub at `stub` jumps through.
fn plt_slot<M: Memory + ?Sized>(mem: &M, stub: u64) -> Option<u64> {
    let mut i = decode_one(mem, stub, 16)?;
    if i.code() == Code::Endbr64 {
        i = decode_one(mem, i.next_ip(), 16)?;
    }
    // `jmp [rip+disp32]`, with or without the `bnd` prefix.
    (i.code() == Code::Jmp_rm64 && i.op0_kind() == OpKind::Memory && i.is_ip_rel_memory_operand())
        .then(|| i.ip_rel_memory_address())
}

fn resolve<M: Memory + ?Sized>(mem: &M, target: u64, hook: u64) -> Option<Via> {
    if target == hook {
        return Some(Via::Direct);
    }
    let slot = plt_slot(mem, target)?;
    (mem.read_u64(slot)? == hook).then_some(Via::Plt)
}

/// The call site whose return address is `ret`, if it is a call to the hook
/// of `kind`.
pub fn call_site_at<M: Memory + ?Sized>(
    mem: &M,
    hooks: &Hooks,
    kind: HookKind,
    ret: u64,
) -> Result<HookSite, Unrecognised> {
    let hook = hooks.of(kind);
    let mut seen_call = None;
    // `call rel32` (5 bytes) and `call [rip+disp32]` (6): decode each
    // candidate and require that it is exactly that call, ending at `ret`.
    for len in [5u64, 6] {
        let Some(at) = ret.checked_sub(len) else { continue };
        let mut b = [0u8; 6];
        if !mem.read(at, &mut b[..len as usize]) {
            continue;
        }
        let Some(i) = decode_one(mem, at, len as usize) else {
            continue;
        };
        if i.next_ip() != ret || !matches!(i.flow_control(), FlowControl::Call | FlowControl::IndirectCall) {
            continue;
        }
        match i.code() {
            Code::Call_rel32_64 => {
                let target = i.near_branch_target();
                let operand = i32::from_le_bytes([b[1], b[2], b[3], b[4]]);
                match resolve(mem, target, hook) {
                    Some(via) => {
                        let form = if via == Via::Direct {
                            SiteForm::Call
                        } else {
                            SiteForm::CallPlt
                        };
                        return Ok(HookSite {
                            addr: at,
                            kind,
                            form,
                            operand,
                        });
                    }
                    None => seen_call = Some(target),
                }
            }
            Code::Call_rm64 if i.is_ip_rel_memory_operand() && b[0] == 0xFF && b[1] == 0x15 => {
                let slot = i.ip_rel_memory_address();
                let target = mem.read_u64(slot).ok_or(Unrecognised::Unreadable)?;
                if target == hook {
                    return Ok(HookSite {
                        addr: at,
                        kind,
                        form: SiteForm::CallGot,
                        operand: i32::from_le_bytes([b[2], b[3], b[4], b[5]]),
                    });
                }
                seen_call = Some(target);
            }
            _ => {}
        }
    }
    let mut probe = [0u8; 1];
    if !mem.read(ret.wrapping_sub(1), &mut probe) {
        return Err(Unrecognised::Unreadable);
    }
    Err(match seen_call {
        Some(target) => Unrecognised::NotTheHook { target },
        None => Unrecognised::NoCall,
    })
}

/// The tail jumps to the exit hook in the function at `[start, end)`, in
/// address order. Decoding stops at the first invalid byte (data in code),
/// so a function body that does not decode yields what was found before it.
pub fn tail_sites<M: Memory + ?Sized>(mem: &M, hooks: &Hooks, start: u64, end: u64) -> Vec<HookSite> {
    let mut out = Vec::new();
    for step in Stream::new(mem, start, end) {
        let Step::Insn(i) = step else { continue };
        if let Some(site) = tail_site(mem, hooks, &i) {
            out.push(site);
        }
    }
    out
}

fn tail_site<M: Memory + ?Sized>(mem: &M, hooks: &Hooks, i: &Instruction) -> Option<HookSite> {
    if i.mnemonic() != Mnemonic::Jmp {
        return None;
    }
    let mut b = [0u8; 6];
    match i.code() {
        Code::Jmp_rel32_64 if i.len() == 5 => {
            mem.read(i.ip(), &mut b[..5]).then_some(())?;
            let via = resolve(mem, i.near_branch_target(), hooks.exit)?;
            Some(HookSite {
                addr: i.ip(),
                kind: HookKind::Exit,
                form: if via == Via::Direct {
                    SiteForm::TailJmp
                } else {
                    SiteForm::TailJmpPlt
                },
                operand: i32::from_le_bytes([b[1], b[2], b[3], b[4]]),
            })
        }
        Code::Jmp_rm64 if i.len() == 6 && i.is_ip_rel_memory_operand() => {
            mem.read(i.ip(), &mut b).then_some(())?;
            if b[0] != 0xFF || b[1] != 0x25 || mem.read_u64(i.ip_rel_memory_address())? != hooks.exit {
                return None;
            }
            Some(HookSite {
                addr: i.ip(),
                kind: HookKind::Exit,
                form: SiteForm::TailJmpGot,
                operand: i32::from_le_bytes([b[2], b[3], b[4], b[5]]),
            })
        }
        _ => None,
    }
}

/// Whether `r` is the 64-bit form of a register a call clobbers.
pub(crate) fn is_caller_saved(r: Register) -> bool {
    matches!(
        r,
        Register::RAX
            | Register::RCX
            | Register::RDX
            | Register::RSI
            | Register::RDI
            | Register::R8
            | Register::R9
            | Register::R10
            | Register::R11
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Image;

    const HOOKS: Hooks = Hooks {
        enter: 0x50_1000,
        exit: 0x50_2000,
    };

    fn rel(from_end: u64, to: u64) -> [u8; 4] {
        ((to as i64 - from_end as i64) as i32).to_le_bytes()
    }

    /// Code at 0x40_0000, a PLT stub pair at 0x40_1000 (lazy and IBT forms),
    /// a GOT at 0x40_2000 holding the hooks.
    fn image() -> Image {
        let mut got = vec![0u8; 32];
        got[..8].copy_from_slice(&HOOKS.enter.to_le_bytes());
        got[8..16].copy_from_slice(&HOOKS.exit.to_le_bytes());
        got[16..24].copy_from_slice(&0x1234u64.to_le_bytes());
        let mut plt = vec![0xCCu8; 64];
        // 0x40_1000: jmp [rip+disp] -> GOT[0]
        plt[0..2].copy_from_slice(&[0xFF, 0x25]);
        plt[2..6].copy_from_slice(&rel(0x40_1006, 0x40_2000));
        // 0x40_1010: endbr64; bnd jmp [rip+disp] -> GOT[1]
        plt[16..20].copy_from_slice(&[0xF3, 0x0F, 0x1E, 0xFA]);
        plt[20..23].copy_from_slice(&[0xF2, 0xFF, 0x25]);
        plt[23..27].copy_from_slice(&rel(0x40_101B, 0x40_2008));
        // 0x40_1020: jmp [rip+disp] -> GOT[2] (not a hook)
        plt[32..34].copy_from_slice(&[0xFF, 0x25]);
        plt[34..38].copy_from_slice(&rel(0x40_1026, 0x40_2010));
        Image::new()
            .with(0x40_0000, vec![0x90u8; 256])
            .with(0x40_1000, plt)
            .with(0x40_2000, got)
    }

    #[test]
    fn recognises_direct_plt_and_got_calls() {
        let mut m = image();
        // direct call at 0x40_0010
        let mut c = vec![0xE8];
        c.extend(rel(0x40_0015, HOOKS.enter));
        m.write(0x40_0010, &c);
        let s = call_site_at(&m, &HOOKS, HookKind::Enter, 0x40_0015).unwrap();
        assert_eq!((s.addr, s.form, s.len()), (0x40_0010, SiteForm::Call, 5));
        // PLT (lazy form) call at 0x40_0020
        let mut c = vec![0xE8];
        c.extend(rel(0x40_0025, 0x40_1000));
        m.write(0x40_0020, &c);
        let s = call_site_at(&m, &HOOKS, HookKind::Enter, 0x40_0025).unwrap();
        assert_eq!(s.form, SiteForm::CallPlt);
        // ... but it is not the exit hook.
        assert_eq!(
            call_site_at(&m, &HOOKS, HookKind::Exit, 0x40_0025),
            Err(Unrecognised::NotTheHook { target: 0x40_1000 })
        );
        // IBT PLT stub for the exit hook
        let mut c = vec![0xE8];
        c.extend(rel(0x40_0035, 0x40_1010));
        m.write(0x40_0030, &c);
        assert_eq!(
            call_site_at(&m, &HOOKS, HookKind::Exit, 0x40_0035).unwrap().form,
            SiteForm::CallPlt
        );
        // call [rip+GOT] at 0x40_0040
        let mut c = vec![0xFF, 0x15];
        c.extend(rel(0x40_0046, 0x40_2008));
        m.write(0x40_0040, &c);
        let s = call_site_at(&m, &HOOKS, HookKind::Exit, 0x40_0046).unwrap();
        assert_eq!((s.addr, s.form, s.len()), (0x40_0040, SiteForm::CallGot, 6));
        assert_eq!(s.form.call_form(), Form::CallRipIndirect);
    }

    #[test]
    fn refuses_what_is_not_a_hook_call() {
        let mut m = image();
        // Only NOPs before: no call.
        assert_eq!(
            call_site_at(&m, &HOOKS, HookKind::Enter, 0x40_0080),
            Err(Unrecognised::NoCall)
        );
        // call to a PLT stub of something else.
        let mut c = vec![0xE8];
        c.extend(rel(0x40_0055, 0x40_1020));
        m.write(0x40_0050, &c);
        assert!(matches!(
            call_site_at(&m, &HOOKS, HookKind::Enter, 0x40_0055),
            Err(Unrecognised::NotTheHook { .. })
        ));
        // `call rax` (FF D0) preceded by bytes that look like an E8: the
        // E8 candidate does not end at the return address's call.
        let mut c = vec![0xE8, 0x00, 0x00];
        c.extend([0xFF, 0xD0]);
        m.write(0x40_0060, &c);
        assert!(call_site_at(&m, &HOOKS, HookKind::Enter, 0x40_0065).is_err());
        // Unreadable.
        assert_eq!(
            call_site_at(&m, &HOOKS, HookKind::Enter, 0x10_0000),
            Err(Unrecognised::Unreadable)
        );
    }

    #[test]
    fn finds_tail_jumps_in_a_body() {
        let mut m = image();
        // push rbx; ...; pop rbx; jmp exit@plt; ... ; jmp [rip+GOT exit]; jmp enter (not exit)
        let mut body = vec![0x53, 0x5B, 0xE9];
        body.extend(rel(0x40_0007, 0x40_1010));
        body.extend([0xFF, 0x25]);
        body.extend(rel(0x40_000D, 0x40_2008));
        body.push(0xE9);
        body.extend(rel(0x40_0012, HOOKS.exit));
        body.push(0xE9);
        body.extend(rel(0x40_0017, HOOKS.enter));
        m.write(0x40_0000, &body);
        let t = tail_sites(&m, &HOOKS, 0x40_0000, 0x40_0017);
        let got: Vec<(u64, SiteForm)> = t.iter().map(|s| (s.addr, s.form)).collect();
        assert_eq!(
            got,
            vec![
                (0x40_0002, SiteForm::TailJmpPlt),
                (0x40_0007, SiteForm::TailJmpGot),
                (0x40_000D, SiteForm::TailJmp)
            ]
        );
        assert!(t.iter().all(|s| s.kind == HookKind::Exit && s.form.is_tail()));
    }
}
