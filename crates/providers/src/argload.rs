//! Optimised argument passing (paper §7): rewrite the load of `this_fn`.
//!
//! Before each hook call the compiler loads `this_fn` into `rdi`. If that
//! load is rewritten, same length and same instruction boundaries, to load a
//! [tagged](crate::tag) probe id instead, the hook indexes an array instead
//! of hashing its return address. The forms rewritten:
//!
//! | emitted | example | rewritten to |
//! | --- | --- | --- |
//! | `lea r64,[rip+f]` (7 bytes) | gcc/clang PIE | `mov r64, simm32` (sign tag) |
//! | `mov r32, imm32` (5/6 bytes) | gcc/clang non-PIE | same, low tag |
//! | `mov r64, simm32` (7 bytes) | `-mcmodel=kernel`-like | same, sign tag |
//! | `mov r64, imm64` (10 bytes) | clang `-O0` non-PIE | the imm64 only, if it lies in one cache line |
//!
//! where `r64` is `rdi`, or a caller-saved register copied into `rdi` by a
//! `mov rdi, r64` (gcc `-O0`). The search walks back from the site over
//! straight-line code only (no branch, call or patched instruction in
//! between), refuses if the loaded register is read by anything else on the
//! way, and refuses callee-saved registers (gcc and clang at `-O2` often keep
//! `this_fn` in `rbx`/`r12`..`r15` for both hooks: a rewrite there would
//! change a value that lives on). A caller-saved register is dead after the
//! call (or tail jump) by the ABI, so nothing else can see the tag. Where no
//! rewrite is safe, the hook falls back to the address lookup.

use crate::decode::{Step, Stream};
use crate::finstrument::is_caller_saved;
use crate::memory::Memory;
use crate::tag;
use iced_x86::{Code, FlowControl, Instruction, InstructionInfoFactory, OpAccess, OpKind, Register};

/// How many instructions before the site the search looks at.
pub const WINDOW: usize = 16;

/// What kind of tag a rewrite loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagForm {
    /// [`tag::sign`].
    Sign,
    /// [`tag::low`] (a zero-extending `mov r32, imm32`).
    Low,
}

/// A found rewrite: patch `len` bytes at `addr` from `old` to
/// [`new_bytes`](Self::new_bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgRewrite {
    /// The loading instruction.
    pub insn: u64,
    /// Its length.
    pub insn_len: usize,
    /// First byte the patch writes (the instruction, or its imm64).
    pub addr: u64,
    /// How many bytes it writes (<= 8).
    pub len: usize,
    /// The bytes there now.
    pub old: [u8; 8],
    /// The tag encoding it needs.
    pub form: TagForm,
    shape: Shape,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Replace with REX.W C7 /0 imm32 for the register.
    MovSimm32(Register),
    /// Keep the opcode bytes, replace the trailing imm32.
    Imm32Tail,
    /// Replace the whole imm64.
    Imm64,
}

/// Why no rewrite was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRewrite {
    /// The linear decode from the function start did not land on the site.
    Desync,
    /// A branch, call, patched or unknown instruction before the load.
    NotStraightLine,
    /// The value reaches `rdi` from a callee-saved register.
    CalleeSaved,
    /// The loaded register is read by something else too.
    SharedValue,
    /// The load is not one of the rewritable forms.
    UnknownLoad,
    /// An imm64 that straddles a cache line.
    Straddles,
}

impl ArgRewrite {
    /// The bytes to write for the tag `value` (first [`len`](Self::len) valid).
    pub fn new_bytes(&self, value: u64) -> [u8; 8] {
        let mut b = self.old;
        match self.shape {
            Shape::MovSimm32(r) => {
                let n = r.number() as u8; // 0..15 for a 64-bit GPR
                b[0] = 0x48 | (n >> 3);
                b[1] = 0xC7;
                b[2] = 0xC0 | (n & 7);
                b[3..7].copy_from_slice(&(value as u32).to_le_bytes());
            }
            Shape::Imm32Tail => {
                let o = self.len - 4;
                b[o..self.len].copy_from_slice(&(value as u32).to_le_bytes());
            }
            Shape::Imm64 => b = value.to_le_bytes(),
        }
        b
    }

    /// The tag value for probe `id`, or `None` if this form cannot carry it.
    pub fn tag_for(&self, id: u32, low_limit: u64) -> Option<u64> {
        match self.form {
            TagForm::Sign => (id <= tag::MAX_SIGN_ID).then(|| tag::sign(id)),
            TagForm::Low => tag::low(id, low_limit),
        }
    }
}

fn access_reads(a: OpAccess) -> bool {
    matches!(
        a,
        OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

fn access_writes(a: OpAccess) -> bool {
    matches!(
        a,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

fn uses(f: &mut InstructionInfoFactory, i: &Instruction, r: Register) -> (bool, bool) {
    let info = f.info(i);
    let (mut rd, mut wr) = (false, false);
    for u in info.used_registers() {
        if u.register().full_register() == r {
            rd |= access_reads(u.access());
            wr |= access_writes(u.access());
        }
    }
    for m in info.used_memory() {
        rd |= m.base().full_register() == r || m.index().full_register() == r;
    }
    (rd, wr)
}

/// Finds the load of `this_fn` that feeds the hook call or tail jump at
/// `site`, in the function starting at `func_start` (a known instruction
/// boundary at or before `site`).
pub fn find<M: Memory + ?Sized>(mem: &M, func_start: u64, site: u64, this_fn: u64) -> Result<ArgRewrite, NoRewrite> {
    let mut window: Vec<Step> = Vec::with_capacity(WINDOW);
    let mut stream = Stream::new(mem, func_start, site);
    for s in stream.by_ref() {
        if window.len() == WINDOW {
            window.remove(0);
        }
        window.push(s);
    }
    if stream.failed() || stream.ip() != site {
        return Err(NoRewrite::Desync);
    }
    let mut f = InstructionInfoFactory::new();
    let mut want = Register::RDI;
    // Instructions between the load of `want` and the site, for the check
    // that a copied-from register is not read again before the call.
    let mut after: Vec<&Instruction> = Vec::new();
    for s in window.iter().rev() {
        let Step::Insn(i) = s else {
            return Err(NoRewrite::NotStraightLine);
        };
        if i.flow_control() != FlowControl::Next {
            return Err(NoRewrite::NotStraightLine);
        }
        let (reads, writes) = uses(&mut f, i, want);
        if !writes {
            if reads {
                return Err(NoRewrite::SharedValue);
            }
            after.push(i);
            continue;
        }
        // `mov rdi, r64` from another register: follow it once.
        if want == Register::RDI
            && matches!(i.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
            && i.op0_kind() == OpKind::Register
            && i.op1_kind() == OpKind::Register
        {
            let src = i.op1_register();
            if !is_caller_saved(src) {
                return Err(NoRewrite::CalleeSaved);
            }
            if src == Register::RSP || after.iter().any(|j| uses(&mut f, j, src).0) {
                return Err(NoRewrite::SharedValue);
            }
            want = src;
            after.push(i);
            continue;
        }
        return rewrite_of(mem, i, want, this_fn);
    }
    Err(NoRewrite::NotStraightLine)
}

fn rewrite_of<M: Memory + ?Sized>(
    mem: &M,
    i: &Instruction,
    r: Register,
    this_fn: u64,
) -> Result<ArgRewrite, NoRewrite> {
    let mut old = [0u8; 8];
    let n = i.len().min(8);
    if !mem.read(i.ip(), &mut old[..n]) {
        return Err(NoRewrite::UnknownLoad);
    }
    let base = ArgRewrite {
        insn: i.ip(),
        insn_len: i.len(),
        addr: i.ip(),
        len: i.len(),
        old,
        form: TagForm::Sign,
        shape: Shape::Imm32Tail,
    };
    let reg_dst = i.op0_kind() == OpKind::Register && i.op0_register().full_register() == r;
    if !reg_dst {
        return Err(NoRewrite::UnknownLoad);
    }
    match i.code() {
        Code::Lea_r64_m if i.is_ip_rel_memory_operand() && i.len() == 7 => {
            if i.ip_rel_memory_address() != this_fn {
                return Err(NoRewrite::UnknownLoad);
            }
            Ok(ArgRewrite {
                shape: Shape::MovSimm32(r),
                ..base
            })
        }
        Code::Mov_r32_imm32 if i.immediate(1) == this_fn && (i.len() == 5 || i.len() == 6) => Ok(ArgRewrite {
            form: TagForm::Low,
            ..base
        }),
        Code::Mov_rm64_imm32 if i.len() == 7 && i.immediate(1) == this_fn => Ok(base),
        Code::Mov_r64_imm64 if i.len() == 10 && i.immediate(1) == this_fn => {
            let at = i.ip() + 2;
            if at / 64 != (at + 7) / 64 {
                return Err(NoRewrite::Straddles);
            }
            let mut old = [0u8; 8];
            if !mem.read(at, &mut old) {
                return Err(NoRewrite::UnknownLoad);
            }
            Ok(ArgRewrite {
                addr: at,
                len: 8,
                old,
                shape: Shape::Imm64,
                ..base
            })
        }
        _ => Err(NoRewrite::UnknownLoad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_one;
    use crate::memory::Image;

    const F: u64 = 0x40_0000;
    const CALL: [u8; 5] = [0xE8, 0, 0, 0, 0];

    fn setup(body: &[u8]) -> (Image, u64) {
        let mut code = body.to_vec();
        let site = F + code.len() as u64;
        code.extend(CALL);
        code.resize(256, 0x90);
        (Image::new().with(F, code), site)
    }

    fn lea(reg_bits: u8, rex: u8, at: u64, target: u64) -> Vec<u8> {
        let mut v = vec![rex, 0x8D, 0x05 | (reg_bits << 3)];
        v.extend(((target as i64 - (at + 7) as i64) as i32).to_le_bytes());
        v
    }

    fn check_loads(img: &Image, rw: &ArgRewrite, value: u64, reg: Register) {
        let mut m = img.clone();
        m.write(rw.addr, &rw.new_bytes(value)[..rw.len]);
        let i = decode_one(&m, rw.insn, 15).unwrap();
        assert_eq!(i.len(), rw.insn_len, "same length");
        assert_eq!(i.op0_register().full_register(), reg);
        let loaded = match i.code() {
            Code::Mov_r32_imm32 => i.immediate(1) as u32 as u64,
            _ => i.immediate(1),
        };
        assert_eq!(loaded, value);
    }

    #[test]
    fn clang_pie_lea_rdi() {
        // lea rdi,[rip+F]; mov rsi, r14; call
        let mut b = lea(7, 0x48, F, F);
        b.extend([0x4C, 0x89, 0xF6]);
        let (img, site) = setup(&b);
        let rw = find(&img, F, site, F).unwrap();
        assert_eq!((rw.insn, rw.len, rw.form), (F, 7, TagForm::Sign));
        check_loads(&img, &rw, tag::sign(42), Register::RDI);
    }

    #[test]
    fn gcc_o0_lea_rax_then_mov_rdi_rax() {
        // mov rsi, rax; lea rax,[rip+F]; mov rdi, rax; call
        let mut b = vec![0x48, 0x89, 0xC6];
        b.extend(lea(0, 0x48, F + 3, F));
        b.extend([0x48, 0x89, 0xC7]);
        let (img, site) = setup(&b);
        let rw = find(&img, F, site, F).unwrap();
        assert_eq!(rw.insn, F + 3);
        check_loads(&img, &rw, tag::sign(7), Register::RAX);
    }

    #[test]
    fn non_pie_mov_edi_imm32_and_r8d() {
        // mov edi, F; mov rsi, [rsp+8]; call
        let mut b = vec![0xBF];
        b.extend((F as u32).to_le_bytes());
        b.extend([0x48, 0x8B, 0x74, 0x24, 0x08]);
        let (img, site) = setup(&b);
        let rw = find(&img, F, site, F).unwrap();
        assert_eq!(rw.form, TagForm::Low);
        check_loads(&img, &rw, tag::low(3, 65536).unwrap(), Register::RDI);
        // mov r8d, F; mov rdi, r8; call
        let mut b = vec![0x41, 0xB8];
        b.extend((F as u32).to_le_bytes());
        b.extend([0x4C, 0x89, 0xC7]);
        let (img, site) = setup(&b);
        let rw = find(&img, F, site, F).unwrap();
        assert_eq!((rw.len, rw.form), (6, TagForm::Low));
        check_loads(&img, &rw, 9, Register::R8);
    }

    #[test]
    fn clang_o0_movabs_in_one_line_only() {
        // movabs rdi, F at F+0 (imm at F+2..F+10: in line)
        let mut b = vec![0x48, 0xBF];
        b.extend(F.to_le_bytes());
        let (img, site) = setup(&b);
        let rw = find(&img, F, site, F).unwrap();
        assert_eq!((rw.addr, rw.len), (F + 2, 8));
        check_loads(&img, &rw, tag::sign(5), Register::RDI);
        // The same at F+60: the imm64 straddles.
        let mut b = vec![0x90; 60];
        b.extend([0x48, 0xBF]);
        b.extend(F.to_le_bytes());
        let (img, site) = setup(&b);
        assert_eq!(find(&img, F, site, F), Err(NoRewrite::Straddles));
    }

    #[test]
    fn refuses_unsafe_shapes() {
        // gcc -O2: lea rbx,[rip+F]; ...; mov rdi, rbx; call
        let mut b = lea(3, 0x48, F, F);
        b.extend([0x48, 0x89, 0xDF]);
        let (img, site) = setup(&b);
        assert_eq!(find(&img, F, site, F), Err(NoRewrite::CalleeSaved));
        // lea rdi,[rip+F]; mov rsi, rdi; call: the value is read elsewhere.
        let mut b = lea(7, 0x48, F, F);
        b.extend([0x48, 0x89, 0xFE]);
        let (img, site) = setup(&b);
        assert_eq!(find(&img, F, site, F), Err(NoRewrite::SharedValue));
        // lea rax; mov rdi, rax; mov rsi, rax; call: rax read again.
        let mut b = lea(0, 0x48, F, F);
        b.extend([0x48, 0x89, 0xC7, 0x48, 0x89, 0xC6]);
        let (img, site) = setup(&b);
        assert_eq!(find(&img, F, site, F), Err(NoRewrite::SharedValue));
        // lea rdi,[rip+F]; jne +0; call: not straight-line.
        let mut b = lea(7, 0x48, F, F);
        b.extend([0x75, 0x00]);
        let (img, site) = setup(&b);
        assert_eq!(find(&img, F, site, F), Err(NoRewrite::NotStraightLine));
        // lea rdi of another function.
        let b = lea(7, 0x48, F, F + 0x100);
        let (img, site) = setup(&b);
        assert_eq!(find(&img, F, site, F), Err(NoRewrite::UnknownLoad));
        // A site the linear decode does not land on.
        let (img, site) = setup(&[0x48, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(find(&img, F, site - 3, F), Err(NoRewrite::Desync));
    }
}
