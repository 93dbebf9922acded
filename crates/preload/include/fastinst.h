/* fastinst.h: the C API of libfastinst.so (rapid-toggling probes).
 *
 * Link with -lfastinst, or load the library with LD_PRELOAD and call these
 * from a client library named by FASTINST_CLIENT (its
 * `int fastinst_client_init(void)` runs when the runtime starts).
 *
 * Status codes: functions returning int return 0 (or a count) on success
 * and one of the negative FASTINST_E* codes on failure;
 * fastinst_strerror() describes them. No function ever aborts the process
 * on a bad argument.
 */
#ifndef FASTINST_H
#define FASTINST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FASTINST_OK 0
#define FASTINST_ENOPROBE (-1)    /* no probe with this id */
#define FASTINST_EUNLOADED (-2)   /* the probe's library was dlclose'd */
#define FASTINST_ENOFUNCTION (-3) /* no discovered probe of this function */
#define FASTINST_EINVAL (-4)      /* NULL handler/callback, bad name */
#define FASTINST_ECALLBACKS (-5)  /* more than 16 discovery callbacks */
#define FASTINST_EPATCH (-6)      /* the code could not be patched */
#define FASTINST_EINTERNAL (-7)   /* internal error (a caught panic) */

#define FASTINST_ENTRY 0
#define FASTINST_EXIT 1
#define FASTINST_POINT 2  /* a point probe of Rust code (fastinst::probe!) */

/* How a site reaches its hook. An unrecognised site is never patched: it
 * stays on, and deactivating its probe only drops its calls. */
#define FASTINST_FORM_UNRECOGNISED 0
#define FASTINST_FORM_CALL 1     /* call rel32 to the hook */
#define FASTINST_FORM_PLT 2      /* call rel32 to a PLT stub */
#define FASTINST_FORM_GOT 3      /* call [rip+GOT] (-fno-plt) */
#define FASTINST_FORM_TAIL 4     /* jmp rel32 to the exit hook */
#define FASTINST_FORM_TAIL_PLT 5 /* jmp rel32 to its PLT stub */
#define FASTINST_FORM_TAIL_GOT 6 /* jmp [rip+GOT] */
#define FASTINST_FORM_SLED 7     /* -fpatchable-function-entry NOP sled */

typedef uint32_t fastinst_probe_id;

typedef struct fastinst_probe_meta {
    fastinst_probe_id id;
    uint8_t kind;          /* FASTINST_ENTRY, FASTINST_EXIT or FASTINST_POINT */
    uint8_t form;          /* FASTINST_FORM_* */
    uint8_t split;         /* bytes before the cache-line boundary, 0 if none */
    uint8_t site_len;      /* 5 or 6; 0 if unrecognised */
    uint8_t provider;      /* 0: -finstrument-functions, 1: -fpatchable-function-entry, 2: -pg (mcount, __fentry__, -mnop-mcount), 3: Rust points, 4: XRay sleds */
    uint8_t arg_rewritten; /* 1 if this_fn's load now passes the id */
    uint8_t inlined;       /* 1 if the site is in a copy of the function inlined
                            * into another function (gcc -finstrument-functions
                            * keeps their hooks); 0 in its own code, clones
                            * (f.constprop.0, f.isra.0, f.part.0) and f.cold */
    uint8_t reserved[1];
    const void *function;      /* the instrumented function */
    const char *function_name; /* demangled, never freed, "" if unknown */
    const void *site;          /* the call/jmp instruction, NULL if unrecognised */
} fastinst_probe_meta;

/* A probe handler: runs on the thread that executed the probe, with the
 * probe's id. A handler that calls instrumented code does not recurse:
 * probes hit on a thread already inside a handler are dropped. */
typedef void (*fastinst_handler)(fastinst_probe_id id);

/* Called once per probe. Registration replays the probes found so far;
 * later probes are reported by the thread that first runs them, with the
 * discovery lock held: the callback may activate/deactivate probes but must
 * not register callbacks. */
typedef void (*fastinst_discovery_fn)(const fastinst_probe_meta *meta, void *user);

int fastinst_on_discovery(fastinst_discovery_fn cb, void *user);

/* Activate: the site calls the hook and the hook calls `handler`.
 * On an active probe this only swaps the handler (a data store). */
int fastinst_activate(fastinst_probe_id id, fastinst_handler handler);
/* Deactivate with the current strategy. */
int fastinst_deactivate(fastinst_probe_id id);
/* 1 active, 0 inactive, or an error code. */
int fastinst_is_active(fastinst_probe_id id);

/* All discovered probes of a function; return how many. */
int fastinst_activate_function(const void *function, fastinst_handler handler);
int fastinst_deactivate_function(const void *function);

/* "flip" (default), "paper", "word-sync", "word-async". */
int fastinst_set_strategy(const char *name);
const char *fastinst_strategy(void);

/* Hook calls that reached a probe while it was inactive (the discovering
 * call if a callback deactivated it, calls in flight at the switch, every
 * call of an unrecognised site), or an error code. */
int64_t fastinst_inactive_hits(fastinst_probe_id id);

/* Set `size = sizeof(fastinst_stats)` before fastinst_get_stats: it fills
 * that many bytes at most and sets `size` to how many it filled, so fields
 * added at the end later do not break programs built with this header.
 * A size under 8 is FASTINST_EINVAL. */
typedef struct fastinst_stats {
    uint64_t size;                 /* in: sizeof(fastinst_stats); out: bytes filled */
    uint64_t probes;               /* discovered */
    uint64_t unrecognised;         /* sites never patched (always on) */
    uint64_t arg_rewritten;        /* this_fn loads that pass the id */
    uint64_t tail_ambiguous;       /* tail exits reported as the first of several */
    uint64_t dropped_nested;       /* calls dropped by the recursion guard */
    uint64_t dropped_in_discovery; /* calls dropped while discovering */
    uint64_t discoveries;          /* discovery runs */
    uint64_t discovery_ticks;      /* TSC ticks spent in them */
    uint64_t refused_full;         /* probes refused: tables full */
    uint64_t modules_ticks;        /* TSC ticks reading symbols at start-up */
    uint64_t sled_load_ticks;      /* TSC ticks registering patchable entries */
    uint64_t sled_functions;       /* functions with sled probes (2 probes each) */
    uint64_t sled_exits;           /* sled exits delivered (return-address substitution) */
    uint64_t sled_shadow_full;     /* sled calls unwatched: shadow stack full */
    uint64_t sled_abandoned;       /* shadow entries dropped (longjmp, exceptions) */
    uint64_t sled_restored;        /* return addresses put back before unwinding */
} fastinst_stats;
int fastinst_get_stats(fastinst_stats *out);

uint32_t fastinst_probe_count(void);
int fastinst_probe_info(fastinst_probe_id id, fastinst_probe_meta *out);
const char *fastinst_strerror(int code);

/* Used by `fastinst attach PID` (docs/attach.md), which calls it inside the
 * target after dlopen: starts the runtime from the settings file CONFIG.
 * Returns 0; 1 the file is unreadable, 2 the runtime was started already,
 * 3 the control socket could not be made, 4 the file names no socket,
 * -1 a NULL or non-UTF-8 path. Not for programs to call. */
int fastinst_attach_start(const char *config);

#ifdef __cplusplus
}
#endif

#endif /* FASTINST_H */
