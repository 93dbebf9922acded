//! The real programs, how each is built, and the work each run does.
//!
//! Builds per program and compiler: the plain build (`-O2`) and the
//! instrumented one (gcc `-O2 -finstrument-functions`; clang `-O2
//! -finstrument-functions-after-inlining`, which puts hooks only in
//! functions that survive inlining; and `-O2 -fpatchable-function-entry=5`
//! with either, the sled provider's builds). Workloads are deterministic and their
//! output is compared across every configuration.

use crate::error::{EvalError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A C compiler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Compiler {
    /// gcc.
    Gcc,
    /// clang.
    Clang,
    /// gcc with `-fpatchable-function-entry=5` (the sled provider).
    GccSled,
    /// clang with `-fpatchable-function-entry=5`.
    ClangSled,
    /// gcc with `-pg -mfentry` (the `-pg` provider; named, never a default).
    GccPg,
    /// clang with `-pg` (`call mcount` after the prologue; named, never a
    /// default).
    ClangPg,
    /// clang with `-fxray-instrument -fxray-instruction-threshold=1` (the
    /// XRay provider; named, never a default).
    ClangXray,
}

impl Compiler {
    /// Every build kind.
    pub const ALL: [Compiler; 4] = [Compiler::Gcc, Compiler::Clang, Compiler::GccSled, Compiler::ClangSled];
    /// Every build kind `--compilers` can name: [`Compiler::ALL`] and the
    /// `-pg` builds.
    pub const NAMED: [Compiler; 7] = [
        Compiler::Gcc,
        Compiler::Clang,
        Compiler::GccSled,
        Compiler::ClangSled,
        Compiler::GccPg,
        Compiler::ClangPg,
        Compiler::ClangXray,
    ];

    /// The command.
    pub fn command(self) -> &'static str {
        match self {
            Compiler::Gcc | Compiler::GccSled | Compiler::GccPg => "gcc",
            Compiler::Clang | Compiler::ClangSled | Compiler::ClangPg | Compiler::ClangXray => "clang",
        }
    }

    /// Its name on the command line and in file names: `gcc`, `clang`,
    /// `gcc-sled`, `clang-sled`, `gcc-pg`, `clang-pg`, `clang-xray`.
    pub fn name(self) -> &'static str {
        match self {
            Compiler::Gcc => "gcc",
            Compiler::Clang => "clang",
            Compiler::GccSled => "gcc-sled",
            Compiler::ClangSled => "clang-sled",
            Compiler::GccPg => "gcc-pg",
            Compiler::ClangPg => "clang-pg",
            Compiler::ClangXray => "clang-xray",
        }
    }

    /// The flags of an instrumented build, as one string.
    pub fn instrument_flag(self) -> &'static str {
        match self {
            Compiler::Gcc => "-finstrument-functions",
            Compiler::Clang => "-finstrument-functions-after-inlining",
            Compiler::GccSled | Compiler::ClangSled => "-fpatchable-function-entry=5",
            Compiler::GccPg => "-pg -mfentry",
            Compiler::ClangPg => "-pg",
            Compiler::ClangXray => "-fxray-instrument -fxray-instruction-threshold=1",
        }
    }

    /// The flags of an instrumented build, one argument each.
    pub fn instrument_flags(self) -> impl Iterator<Item = &'static str> {
        self.instrument_flag().split(' ')
    }

    /// Whether it is installed.
    pub fn available(self) -> bool {
        Command::new(self.command())
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

/// The compilers of `wanted` that are installed; each missing one is named
/// on stderr with what is left out (`what`).
pub fn installed(wanted: &[Compiler], what: &str) -> Vec<Compiler> {
    wanted
        .iter()
        .copied()
        .filter(|c| {
            let ok = c.available();
            if !ok {
                eprintln!("{} not found: {what}", c.command());
            }
            ok
        })
        .collect()
}

/// The programs a comma-separated `list` names (the option `opt` took it).
pub fn programs_named(list: &str, opt: &str) -> Result<Vec<Program>> {
    named(list, opt, &ALL_PROGRAMS, Program::name)
}

/// The builds a comma-separated `list` names (the option `opt` took it).
pub fn compilers_named(list: &str, opt: &str) -> Result<Vec<Compiler>> {
    named(list, opt, &Compiler::NAMED, Compiler::name)
}

/// The items of `all` a comma-separated `list` names by `name`; an unknown
/// one is a usage error that lists the choices.
pub fn named<T: Copy>(list: &str, opt: &str, all: &[T], name: fn(T) -> &'static str) -> Result<Vec<T>> {
    list.split(',')
        .map(|x| {
            all.iter().copied().find(|&t| name(t) == x).ok_or_else(|| {
                let choices: Vec<&str> = all.iter().map(|&t| name(t)).collect();
                EvalError::Usage(format!("{opt}: `{x}` is not one of {}", choices.join(", ")))
            })
        })
        .collect()
}

/// Creates the scratch directory `dir` and returns its absolute path.
pub fn work_dir(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(EvalError::io(dir))?;
    dir.canonicalize().map_err(EvalError::io(dir))
}

/// One of the programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Program {
    /// bzip2 1.0.8 compressing 24 MB of generated text at -9.
    Bzip2,
    /// QuickJS's `qjs` running `programs/workload.js`.
    Quickjs,
    /// SQLite (amalgamation) running `programs/workload.sql` in memory.
    Sqlite,
    /// Lua 5.4's interpreter core running `programs/workload.lua`: deep
    /// recursion, and C calling back into Lua.
    Lua,
    /// libzstd's multi-threaded compressor: 32 MB of generated text with
    /// four worker threads (more threads than this machine's CPUs, on two).
    Zstd,
    /// fastinst's bundled example (`crates/cli/examples/c/demo.c`):
    /// four threads serving requests, with known call counts.
    Demo,
}

/// All programs, in table order.
pub const PROGRAMS: [Program; 3] = [Program::Bzip2, Program::Quickjs, Program::Sqlite];

/// Every program, those of the accuracy harness too.
pub const ALL_PROGRAMS: [Program; 6] = [
    Program::Bzip2,
    Program::Quickjs,
    Program::Sqlite,
    Program::Lua,
    Program::Zstd,
    Program::Demo,
];

/// The accuracy harness's programs: the upstream ones.
pub const UPSTREAM_PROGRAMS: [Program; 5] = [
    Program::Bzip2,
    Program::Quickjs,
    Program::Sqlite,
    Program::Lua,
    Program::Zstd,
];

fn here(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("programs").join(name)
}

impl Program {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Program::Bzip2 => "bzip2",
            Program::Quickjs => "quickjs",
            Program::Lua => "lua",
            Program::Zstd => "zstd",
            Program::Demo => "demo",
            Program::Sqlite => "sqlite",
        }
    }

    /// What it is and where it comes from.
    pub fn describe(self) -> &'static str {
        match self {
            Program::Bzip2 => "bzip2 1.0.8 (crate bzip2-sys 0.1.13): `bzip2 -c -9` of 24 MB of generated text",
            Program::Lua => {
                "Lua 5.4.9 (crate lua-src 551.1.0): a 20-line host runs workload.lua (recursion, sort with a Lua comparator, gsub callbacks, metamethods, coroutines)"
            }
            Program::Demo => "fastinst's bundled example: four threads serve 200,000 requests",
            Program::Zstd => {
                "zstd 1.5.7 (crate zstd-sys 2.1.3): a 60-line host compresses 32 MB of generated text at level 9 with 4 worker threads, then checks the round trip"
            }
            Program::Quickjs => {
                "QuickJS 2021-03-27 (crate libquickjs-sys 0.10.0): `qjs workload.js` (GC-heavy objects, strings, regex, JSON, sort, recursion)"
            }
            Program::Sqlite => {
                "SQLite 3 amalgamation (crate libsqlite3-sys 0.39.1): a 50-line host runs workload.sql in memory (400k-row inserts, indexes, joins, aggregates, updates)"
            }
        }
    }

    /// The crate that carries its sources.
    pub fn crate_name(self) -> &'static str {
        match self {
            Program::Bzip2 => "bzip2-sys",
            Program::Quickjs => "libquickjs-sys",
            Program::Lua => "lua-src",
            Program::Zstd => "zstd-sys",
            // In this repository.
            Program::Demo => "",
            Program::Sqlite => "libsqlite3-sys",
        }
    }

    /// Compiler arguments (sources, defines, libraries) given the crate's
    /// directory.
    fn compile_args(self, root: &Path) -> Vec<String> {
        let p = |d: &Path, f: &str| d.join(f).display().to_string();
        let c_files = |d: &Path, skip: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .map(|rd| {
                    rd.filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|f| f.extension().is_some_and(|x| x == "c"))
                        .filter(|f| !f.file_name().is_some_and(|n| skip.iter().any(|s| n == *s)))
                        .map(|f| f.display().to_string())
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        };
        match self {
            Program::Demo => {
                let _ = root;
                vec![
                    Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../cli/examples/c/demo.c")
                        .display()
                        .to_string(),
                    "-pthread".into(),
                ]
            }
            Program::Lua => {
                let d = root.join("lua-5.4.9");
                let mut v = vec![format!("-I{}", d.display()), "-DLUA_USE_POSIX".into()];
                v.extend(c_files(&d, &["lua.c", "luac.c"]));
                v.push(here("lua_host.c").display().to_string());
                v.push("-lm".into());
                v
            }
            Program::Zstd => {
                let d = root.join("zstd/lib");
                let mut v = vec![
                    "-DZSTD_MULTITHREAD".to_string(),
                    "-DZSTD_DISABLE_ASM".into(),
                    format!("-I{}", d.display()),
                    format!("-I{}", d.join("common").display()),
                ];
                for sub in ["common", "compress", "decompress"] {
                    v.extend(c_files(&d.join(sub), &[]));
                }
                v.push(here("zstd_host.c").display().to_string());
                v.push("-lpthread".into());
                v
            }
            Program::Bzip2 => {
                let d = root.join("bzip2-1.0.8");
                let mut v = vec!["-D_FILE_OFFSET_BITS=64".to_string()];
                for f in [
                    "blocksort",
                    "huffman",
                    "crctable",
                    "randtable",
                    "compress",
                    "decompress",
                    "bzlib",
                    "bzip2",
                ] {
                    v.push(p(&d, &format!("{f}.c")));
                }
                v
            }
            Program::Quickjs => {
                let d = root.join("embed/quickjs");
                let mut v: Vec<String> = ["-D_GNU_SOURCE", "-DCONFIG_BIGNUM", "-DCONFIG_VERSION=\"2021-03-27\""]
                    .map(String::from)
                    .into();
                v.push(format!("-I{}", d.display()));
                for f in [
                    "qjs",
                    "quickjs",
                    "libregexp",
                    "libunicode",
                    "cutils",
                    "quickjs-libc",
                    "libbf",
                ] {
                    v.push(p(&d, &format!("{f}.c")));
                }
                v.push(here("qjs_repl_stub.c").display().to_string());
                v.extend(["-lm", "-ldl", "-lpthread"].map(String::from));
                v
            }
            Program::Sqlite => {
                let d = root.join("sqlite3");
                vec![
                    "-DSQLITE_THREADSAFE=0".into(),
                    "-DSQLITE_OMIT_LOAD_EXTENSION".into(),
                    format!("-I{}", d.display()),
                    p(&d, "sqlite3.c"),
                    here("sqlite_host.c").display().to_string(),
                    "-lm".into(),
                ]
            }
        }
    }

    /// The arguments of one run, creating its input under `work` if needed.
    pub fn workload(self, work: &Path) -> Result<Vec<String>> {
        self.workload_repeated(work, 1)
    }

    /// The arguments of a run that does the workload `times` times over
    /// (at least once), creating its input under `work` if needed: bzip2
    /// compresses `times` x 24 MB, QuickJS runs `workload.js` in a loop,
    /// SQLite runs `workload.sql` again on empty tables. Longer runs show
    /// whether a cost is fixed per run (start-up, reports at exit) or
    /// grows with the run.
    pub fn workload_repeated(self, work: &Path, times: usize) -> Result<Vec<String>> {
        let times = times.max(1);
        let suffix = if times == 1 {
            String::new()
        } else {
            format!("-x{times}")
        };
        if self == Program::Zstd {
            return Ok(vec![(32 * times).to_string(), "4".into()]);
        }
        if self == Program::Demo {
            return Ok(Vec::new());
        }
        let Some(script) = self.script() else {
            let input = work.join(format!("bzip2-input{suffix}.txt"));
            // Generated from a fixed seed, so a file already there is this text.
            if !input.exists() {
                write_atomically(&input, &generated_text((24 << 20) * times))?;
            }
            return Ok(vec!["-c".into(), "-9".into(), input.display().to_string()]);
        };
        if times == 1 {
            return Ok(vec![here(script).display().to_string()]);
        }
        let source = here(script);
        let text = std::fs::read_to_string(&source).map_err(EvalError::io(&source))?;
        // Written every time: a copy left from an older script would be stale.
        let path = work.join(script.replace('.', &format!("{suffix}.")));
        write_atomically(&path, self.repeated_script(&text, times).as_bytes())?;
        Ok(vec![path.display().to_string()])
    }

    /// The workload script under `programs/`; bzip2's input is generated.
    fn script(self) -> Option<&'static str> {
        match self {
            Program::Bzip2 | Program::Zstd | Program::Demo => None,
            Program::Quickjs => Some("workload.js"),
            Program::Lua => Some("workload.lua"),
            Program::Sqlite => Some("workload.sql"),
        }
    }

    /// `text`, a workload script, made to run `times` times in one process.
    fn repeated_script(self, text: &str, times: usize) -> String {
        match self {
            // A block scope per pass: its `let`s and functions are new each time.
            Program::Quickjs => format!("for (let pass = 0; pass < {times}; pass++) {{\n{text}\n}}\n"),
            Program::Lua => format!("for pass = 1, {times} do\n{text}\nend\n"),
            // Each pass creates the tables, so the one before drops them.
            _ => format!("{text}\nDROP TABLE item;\nDROP TABLE grp;\n").repeat(times),
        }
    }
}

/// Writes `path` through a temporary file, so that an interrupted write is
/// never taken for the input.
fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(EvalError::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(EvalError::io(path))
}

/// `len` bytes of word-like text from a fixed seed: compressible like prose,
/// the same on every machine.
pub fn generated_text(len: usize) -> Vec<u8> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let letters = b"etaoinshrdlucmfwypvbgkjqxz";
    let vocab: Vec<Vec<u8>> = (0..4000)
        .map(|_| {
            let n = 2 + (next() % 8) as usize;
            // Skewed towards frequent letters, as in English.
            (0..n)
                .map(|_| letters[((next() % 26) * (next() % 26) / 25) as usize])
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        // Zipf-like word choice: small indices far more often.
        let r = (next() % 4000) as usize;
        let w = &vocab[r * r / 4000];
        out.extend_from_slice(w);
        out.push(if next() % 13 == 0 { b'\n' } else { b' ' });
    }
    out.truncate(len);
    out
}

/// A built binary.
#[derive(Clone, Debug)]
pub struct Binary {
    /// The program.
    pub program: Program,
    /// Built by.
    pub compiler: Compiler,
    /// With hooks.
    pub instrumented: bool,
    /// Where.
    pub path: PathBuf,
}

/// Builds every (program, compiler, instrumented) binary under `work/bin`,
/// two compilations at a time; a binary whose recorded command line is
/// unchanged is reused.
pub fn build_all(
    work: &Path,
    sources: &HashMap<String, PathBuf>,
    programs: &[Program],
    compilers: &[Compiler],
) -> Result<Vec<Binary>> {
    build(work, sources, programs, compilers, &[false, true])
}

/// [`build_all`]'s instrumented binaries alone, for what needs no plain
/// build (attaching to the instrumented one, whose unattached run is the
/// reference).
pub fn build_instrumented(
    work: &Path,
    sources: &HashMap<String, PathBuf>,
    programs: &[Program],
    compilers: &[Compiler],
) -> Result<Vec<Binary>> {
    build(work, sources, programs, compilers, &[true])
}

/// The binaries of `programs` × `compilers` × `kinds` (instrumented or
/// not), two compilations at a time.
fn build(
    work: &Path,
    sources: &HashMap<String, PathBuf>,
    programs: &[Program],
    compilers: &[Compiler],
    kinds: &[bool],
) -> Result<Vec<Binary>> {
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).map_err(EvalError::io(&bin))?;
    let mut jobs = Vec::new();
    for &program in programs {
        let none = PathBuf::new();
        let root = sources.get(program.crate_name()).unwrap_or(&none);
        for &compiler in compilers {
            for &instrumented in kinds {
                // Plain builds depend on the compiler only.
                let path = bin.join(if instrumented {
                    format!("{}-{}-inst", program.name(), compiler.name())
                } else {
                    format!("{}-{}-plain", program.name(), compiler.command())
                });
                let shared = jobs.iter().any(|(b, _): &(Binary, Vec<String>)| b.path == path);
                let mut args = vec!["-O2".to_string()];
                if instrumented {
                    args.extend(compiler.instrument_flags().map(String::from));
                }
                args.extend(program.compile_args(root));
                args.extend(["-o".to_string(), path.display().to_string()]);
                jobs.push((
                    Binary {
                        program,
                        compiler,
                        instrumented,
                        path,
                    },
                    if shared { Vec::new() } else { args },
                ));
            }
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((b, args)) = jobs.get(i) else { break };
                if args.is_empty() {
                    continue; // the same plain binary as an earlier job
                }
                if let Err(e) = build_one(b, args) {
                    errors.lock().unwrap().push(e);
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().unwrap().into_iter().next() {
        return Err(e);
    }
    Ok(jobs.into_iter().map(|(b, _)| b).collect())
}

fn build_one(b: &Binary, args: &[String]) -> Result<()> {
    let stamp = b.path.with_extension("cmd");
    let line = format!("{} {}", b.compiler.command(), args.join(" "));
    if b.path.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == line) {
        return Ok(());
    }
    eprintln!("building {}", b.path.display());
    let out = Command::new(b.compiler.command())
        .args(args)
        .output()
        .map_err(|e| EvalError::Tool(format!("{}: {e}", b.compiler.command())))?;
    if !out.status.success() {
        return Err(EvalError::Tool(format!(
            "{line}\nfailed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::write(&stamp, line).map_err(EvalError::io(&stamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_name_programs_and_builds_and_refuse_others_with_the_choices() {
        assert_eq!(
            programs_named("sqlite,bzip2", "--programs").expect("known"),
            [Program::Sqlite, Program::Bzip2]
        );
        assert_eq!(
            compilers_named("clang-sled", "--compilers").expect("known"),
            [Compiler::ClangSled]
        );
        let e = compilers_named("gcc,icc", "--compilers").expect_err("icc is not a build");
        assert_eq!(
            e.to_string(),
            "--compilers: `icc` is not one of gcc, clang, gcc-sled, clang-sled, gcc-pg, clang-pg, clang-xray"
        );
    }

    #[test]
    fn generated_text_is_deterministic_and_wordy() {
        let a = generated_text(1 << 16);
        assert_eq!(a, generated_text(1 << 16));
        assert_eq!(a.len(), 1 << 16);
        let spaces = a.iter().filter(|&&c| c == b' ' || c == b'\n').count();
        assert!(spaces > a.len() / 12 && spaces < a.len() / 2, "{spaces}");
    }

    #[test]
    fn repeated_workloads_run_every_pass() {
        let dir = std::env::temp_dir().join(format!("fastinst-repeat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            Program::Quickjs.workload_repeated(&dir, 1).unwrap(),
            Program::Quickjs.workload(&dir).unwrap()
        );
        let js = &Program::Quickjs.workload_repeated(&dir, 3).unwrap()[0];
        let js = std::fs::read_to_string(js).unwrap();
        assert!(js.starts_with("for (let pass = 0; pass < 3; pass++) {\n"), "{js:.60}");
        assert!(js.contains("print(\"fib\", fib(29));") && js.trim_end().ends_with('}'));
        let sql = &Program::Sqlite.workload_repeated(&dir, 3).unwrap()[0];
        let sql = std::fs::read_to_string(sql).unwrap();
        assert_eq!(sql.matches("CREATE TABLE item").count(), 3);
        assert_eq!(sql.matches("DROP TABLE item;").count(), 3);
        assert!(sql.trim_end().ends_with("DROP TABLE grp;"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn workload_files_exist() {
        for f in ["workload.js", "workload.sql", "sqlite_host.c", "qjs_repl_stub.c"] {
            assert!(here(f).is_file(), "{f}");
        }
    }
}
