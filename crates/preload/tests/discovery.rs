//! Discovery of 20,000 probes in a generated program (as in the paper's
//! evaluation): all are found, none is unrecognised, the output is
//! unchanged, and the cost per probe is reported.

mod common;
use common::*;
use std::fmt::Write;

const FUNCTIONS: usize = 10_000;

#[test]
fn discovers_20000_probes() {
    let dir = scratch("discovery");
    let mut c = String::from("#include <stdio.h>\n");
    for i in 0..FUNCTIONS {
        writeln!(
            c,
            "__attribute__((noinline)) int f{i}(int x) {{ return x * {} + {i}; }}",
            i % 7 + 1
        )
        .unwrap();
    }
    c.push_str("typedef int (*fn)(int);\nstatic fn table[] = {\n");
    for i in 0..FUNCTIONS {
        write!(c, "f{i},").unwrap();
    }
    c.push_str("};\nint main(void) {\n  long s = 0;\n  for (unsigned i = 0; i < sizeof table / sizeof *table; i++) s += table[i](i);\n  printf(\"%ld\\n\", s);\n  return 0;\n}\n");
    let src = dir.join("gen.c");
    std::fs::write(&src, c).unwrap();
    let plain = dir.join("plain");
    let inst = dir.join("inst");
    build("gcc", &[&src], &["-O1"], &plain);
    build("gcc", &[&src], &["-O1", "-finstrument-functions"], &inst);
    let want = ok_stdout(&run(&plain, &[], &dir, false, &[]), "plain");
    for strategy in ["flip", "paper", "word-sync"] {
        let o = run(
            &inst,
            &[],
            &dir,
            true,
            &[
                ("FASTINST_TOOL", "off"),
                ("FASTINST_LOG", "info"),
                ("FASTINST_STRATEGY", strategy),
            ],
        );
        assert_eq!(ok_stdout(&o, "generated"), want);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let line = err
            .lines()
            .find(|l| l.contains(" probes ("))
            .unwrap_or_else(|| panic!("{err}"));
        let n: usize = line
            .split("info: ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(n >= 2 * FUNCTIONS, "{line}");
        assert!(line.contains("(0 unrecognised"), "{line}");
        let init = err
            .lines()
            .find(|l| l.contains("modules and symbols read"))
            .unwrap_or("");
        println!("{strategy}: {line}\n  {init}");
        let (total, parts) = init_line(&err);
        assert_eq!(total, parts.iter().sum::<u64>(), "init total is its parts");
        assert!(
            parts[0] > 0 && parts[2] > 0,
            "modules and discovery take time: {parts:?}"
        );
    }
}

/// The runtime's `init total T ticks (modules M, sleds S, discovery D)`
/// exit line, as (T, [M, S, D]).
fn init_line(stderr: &str) -> (u64, [u64; 3]) {
    let line = stderr
        .lines()
        .find(|l| l.contains("init total "))
        .unwrap_or_else(|| panic!("no init line in {stderr}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    // fastinst[pid]: info: init total T ticks (modules M, sleds S, discovery D)
    let n = nums.len();
    (nums[n - 4], [nums[n - 3], nums[n - 2], nums[n - 1]])
}

/// The straddler wait is settled in the preload's constructor, before the
/// tool starts a thread: with SyncCore that registers for membarrier, which
/// waits out an RCU grace period once the process has a second thread.
/// Settled lazily, it came after the profiler's sampler had started and
/// cost the profiled run 8-17 ms of start-up that the floor did not pay.
#[test]
fn the_straddler_wait_is_settled_before_the_tool_starts_threads() {
    let dir = scratch("wait-first");
    let src = dir.join("small.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n__attribute__((noinline)) int f(int x) { return x + 1; }\nint main(void) { printf(\"%d\\n\", f(41)); return 0; }\n",
    )
    .unwrap();
    let inst = dir.join("inst");
    build("gcc", &[&src], &["-O1", "-finstrument-functions"], &inst);
    let o = run(
        &inst,
        &[],
        &dir,
        true,
        &[
            ("FASTINST_TOOL", "profile"),
            ("FASTINST_LOG", "debug"),
            ("FASTINST_OUT", dir.to_str().unwrap()),
        ],
    );
    assert_eq!(ok_stdout(&o, "small").trim(), "42");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let at = |what: &str| {
        err.lines()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no `{what}` in {err}"))
    };
    assert!(at("straddler wait") < at("started: tool Profile"), "{err}");
}
