/*
 * hd_emulator.c - a stand-in for OpenHaptics' libHD (HD API 3.x) so that pyOpenHaptics and our driver run end to
 * end without a Phantom/Touch device (tests, benchmarks, CI). Built by suturesim.haptics.emulator.build_emulator
 * into a directory holding "libHD.so"; put that directory first in LD_LIBRARY_PATH and CDLL("libHD.so") loads it.
 *
 * Only the C signatures and enum values of OpenHaptics are reproduced (pyOpenHaptics/hd_define.py); behaviour is
 * simplified and documented below. Configuration comes from environment variables, read once at the first call:
 *
 *   SUTURESIM_HD_EMU_SCRIPT   text file, one row per line "t_s x_mm y_mm z_mm buttons" or
 *                             "t_s x_mm y_mm z_mm buttons qw qx qy qz" ('#' starts a comment); every row of a file
 *                             has the width of its first row (a row of the other width is skipped, with a
 *                             message). Position: linear interpolation between rows, held before the first and
 *                             after the last row. Orientation (a quaternion in the device frame, normalised on
 *                             reading; identity for 5-field rows): slerp along the shorter arc, held likewise.
 *                             Buttons: those of the last row with t_row <= t (0 before the first row). t is
 *                             seconds since hdStartScheduler, sampled at each tick's deadline (k * 1 ms).
 *                             The script of "Default Device" (hdInitDevice(NULL)), and of every device when
 *                             SUTURESIM_HD_EMU_SCRIPTS is unset.
 *   SUTURESIM_HD_EMU_SCRIPTS  "name=path;name=path": one script per named device. When set, the emulated devices
 *                             are exactly these names and "Default Device"; hdInitDevice of any other name fails
 *                             with HD_COMM_CONFIG_ERROR (internal code -3), as OpenHaptics does for a name no
 *                             device is configured under. Unset: every name is accepted and follows SCRIPT.
 *   SUTURESIM_HD_EMU_LOG      binary event log, fixed 48-byte little-endian records (see log_record below).
 *   SUTURESIM_HD_EMU_FAULT    comma-separated: missing | nocal | stuck@T | error:CODE@T  (T in seconds).
 *   SUTURESIM_HD_EMU_MAX_CONTINUOUS_FORCE  HD_NOMINAL_MAX_CONTINUOUS_FORCE in N (default 0.88, a Touch's value).
 *   SUTURESIM_HD_EMU_MAX_STIFFNESS  HD_NOMINAL_MAX_STIFFNESS in N/mm (default 1.02, a Touch's z axis).
 *
 * Devices. At most MAX_DEVICES at once, each with its own stylus (pose, orientation, buttons) sampled from its own
 * script at every tick. As in OpenHaptics, the getters (hdGetDoublev, ...), hdSetDoublev, hdEnable/hdDisable and
 * errors act on the current device, one for the process: the last initialised, or the one hdMakeCurrentDevice
 * chose. hdBeginFrame(h) does not change it, so a callback serving one of several devices makes its device
 * current first. HD_CURRENT_GIMBAL_ANGLES and HD_CURRENT_JOINT_ANGLES are not emulated (HD_INVALID_ENUM): they
 * follow from a Touch's arm geometry, which the emulator does not model; HD_CURRENT_TRANSFORM carries the pose.
 *
 * Threading. One mutex (g_mu) guards the device/pose/error/callback state; the log has its own mutex, taken inside
 * g_mu and never the other way round. The scheduler thread never holds g_mu while it runs a callback: callbacks
 * call back into this library (hdBeginFrame, hdGetDoublev, ...), which takes g_mu, and a Python callback also
 * blocks on the GIL, which another thread may hold while it waits for g_mu in a libHD call.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------------ HD types */
typedef unsigned int HHD;
typedef unsigned int HDenum;
typedef unsigned int HDerror;
typedef unsigned int HDCallbackCode;
typedef unsigned long HDSchedulerHandle;
typedef unsigned long HDulong;
typedef unsigned short HDushort;
typedef unsigned char HDboolean;
typedef HDCallbackCode (*HDSchedulerCallback)(void *pUserData);

typedef struct {
    HDerror errorCode;
    int internalErrorCode;
    HHD hHD;
} HDErrorInfo;

#define HDAPI __attribute__((visibility("default")))

/* ------------------------------------------------------------------------------ enum values (hd_define.py) */
#define HD_CALLBACK_DONE 0u
#define HD_CALLBACK_CONTINUE 1u
#define HD_INVALID_HANDLE 0xFFFFFFFFu

#define HD_SUCCESS 0x0000u
#define HD_INVALID_ENUM 0x0100u
#define HD_INVALID_VALUE 0x0101u
#define HD_INVALID_OPERATION 0x0103u
#define HD_BAD_HANDLE 0x0104u
#define HD_WARM_MOTORS 0x0200u
#define HD_EXCEEDED_MAX_FORCE 0x0201u
#define HD_EXCEEDED_MAX_FORCE_IMPULSE 0x0202u
#define HD_EXCEEDED_MAX_VELOCITY 0x0203u
#define HD_FORCE_ERROR 0x0204u
#define HD_DEVICE_FAULT 0x0300u
#define HD_DEVICE_ALREADY_INITIATED 0x0301u
#define HD_COMM_ERROR 0x0302u
#define HD_COMM_CONFIG_ERROR 0x0303u
#define HD_TIMER_ERROR 0x0304u
#define HD_ILLEGAL_BEGIN 0x0400u
#define HD_ILLEGAL_END 0x0401u
#define HD_FRAME_ERROR 0x0402u
#define HD_INVALID_PRIORITY 0x0500u
#define HD_SCHEDULER_FULL 0x0501u
#define HD_INVALID_LICENSE 0x0600u

#define HD_CURRENT_BUTTONS 0x2000u
#define HD_CURRENT_POSITION 0x2050u
#define HD_CURRENT_VELOCITY 0x2051u
#define HD_CURRENT_TRANSFORM 0x2052u
#define HD_LAST_BUTTONS 0x2200u
#define HD_LAST_POSITION 0x2250u
#define HD_LAST_VELOCITY 0x2251u
#define HD_LAST_TRANSFORM 0x2252u
#define HD_VERSION 0x2500u
#define HD_DEVICE_MODEL_TYPE 0x2501u
#define HD_DEVICE_DRIVER_VERSION 0x2502u
#define HD_DEVICE_VENDOR 0x2503u
#define HD_DEVICE_SERIAL_NUMBER 0x2504u
#define HD_INPUT_DOF 0x2553u
#define HD_OUTPUT_DOF 0x2554u
#define HD_CALIBRATION_STYLE 0x2555u
#define HD_UPDATE_RATE 0x2600u
#define HD_INSTANTANEOUS_UPDATE_RATE 0x2601u
#define HD_NOMINAL_MAX_STIFFNESS 0x2602u
#define HD_NOMINAL_MAX_FORCE 0x2603u
#define HD_NOMINAL_MAX_CONTINUOUS_FORCE 0x2604u
#define HD_CURRENT_FORCE 0x2700u

#define HD_FORCE_OUTPUT 0x4000u
#define HD_MAX_FORCE_CLAMPING 0x4001u
#define HD_FORCE_RAMPING 0x4002u
#define HD_SOFTWARE_FORCE_LIMIT 0x4003u
#define HD_ONE_FRAME_LIMIT 0x4004u

#define HD_CALIBRATION_OK 0x5000u
#define HD_CALIBRATION_NEEDS_UPDATE 0x5001u
#define HD_CALIBRATION_INKWELL (1u << 2)

#define HD_WAIT_CHECK_STATUS 0u
#define HD_WAIT_INFINITE 1u

/* ------------------------------------------------------------------------------------------- log records */
enum {
    LOG_FORCE = 1,      /* a,b,c force (N) applied at hdEndFrame, d device handle, code capability mask */
    LOG_POSE = 2,       /* a,b,c position (mm) at the start of a tick, d buttons, code device handle; t_ns = the
                         * tick's deadline */
    LOG_ENABLE = 3,     /* code capability enum, d device handle */
    LOG_DISABLE = 4,    /* code capability enum, d device handle */
    LOG_SCHED_START = 5,
    LOG_SCHED_STOP = 6,
    LOG_MOTORS_OFF = 7, /* a,b,c = 0, d device handle, code reason (MOTORS_OFF_*) */
    LOG_ERROR_PUSHED = 8, /* code error, a internalErrorCode, b 1 if dropped (stack full), d device handle */
    LOG_STUCK = 9,
    LOG_INIT = 10,      /* code handle or 0xFFFFFFFF on failure */
    LOG_ORIENT = 11     /* code device handle, a,b,c,d orientation (w, x, y, z) at the tick; only for a device
                         * whose script carries orientation; t_ns = the tick's deadline, after its LOG_POSE */
};
enum { MOTORS_OFF_DEVICE_DISABLED = 1, MOTORS_OFF_SCHEDULER_STOPPED = 2 };

/* ------------------------------------------------------------------------------------------------- limits */
#define MAX_DEVICES 2
#define MAX_CALLBACKS 64
#define MAX_ERRORS 32
#define MAX_ERROR_FAULTS 8
#define MAX_SCRIPTS 9 /* the default one and up to 8 named (SUTURESIM_HD_EMU_SCRIPTS) */
#define PERIOD_NS 1000000LL /* 1 kHz servo rate */
/* A tick that starts more than this late is not caught up: the missed ticks are skipped, so an overloaded host
 * sees a lower rate rather than a burst of back-to-back callbacks (which a real device would never deliver). */
#define RESYNC_NS (10 * PERIOD_NS)

/* ---------------------------------------------------------------------------------------------- the state */
typedef struct {
    double t, p[3], q[4]; /* q: unit quaternion (w, x, y, z), device frame */
    int buttons;
} row_t;

typedef struct {
    char *name; /* NULL for the default script */
    row_t *rows;
    size_t n_rows;
    int width;  /* fields per row: 5, or 9 with orientation; 0 before the first row */
} script_t;

typedef struct {
    HDerror code;
    double t;
    int fired;
} error_fault_t;

static struct {
    script_t scripts[MAX_SCRIPTS]; /* [0]: SUTURESIM_HD_EMU_SCRIPT; then SUTURESIM_HD_EMU_SCRIPTS in order */
    int n_scripts;
    int named;  /* SUTURESIM_HD_EMU_SCRIPTS was set: only its names and "Default Device" exist */
    int missing, nocal, stuck;
    double stuck_t;
    error_fault_t errs[MAX_ERROR_FAULTS];
    int n_errs;
    double max_cont_force;
    double max_stiffness;   /* N/mm, as OpenHaptics reports it */
    char *log_path;
} g_cfg;

typedef struct {
    int used;
    char name[256];
    unsigned caps; /* bit i <-> capability 0x4000 + i */
    int in_frame;
    double force[3]; /* force of the current (or, outside a frame, last) frame, N */
    const script_t *script;
    /* The stylus at the last tick and the one before (mm, mm/s, unit quaternion); prev_tick is the index of the
     * tick that produced pos, -1 before the device's first tick. */
    double pos[3], last_pos[3], vel[3], last_vel[3], q[4], last_q[4];
    int buttons, last_buttons;
    int64_t prev_tick;
} device_t;

typedef struct {
    HDSchedulerHandle h;
    HDSchedulerCallback cb;
    void *data;
    HDushort prio;
} callback_t;

typedef struct sync_req {
    HDSchedulerCallback cb;
    void *data;
    int done;
    struct sync_req *next;
} sync_req_t;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER; /* callback finished / sync done / scheduler stopped */
static pthread_mutex_t g_sched_mu = PTHREAD_MUTEX_INITIALIZER; /* serialises start/stop; never taken by ticks */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

static device_t g_dev[MAX_DEVICES];
static HHD g_current = HD_INVALID_HANDLE;

static double g_tick_t; /* script time (s) of the last tick, 0 before the first */

static HDErrorInfo g_err[MAX_ERRORS];
static int g_err_head, g_err_n;

static callback_t g_cbs[MAX_CALLBACKS];
static int g_ncbs;
static HDSchedulerHandle g_next_handle = 1;
static HDSchedulerHandle g_running_h; /* async callback executing on the scheduler thread, 0 if none */
static sync_req_t *g_sync_head, *g_sync_tail;

static pthread_t g_thread;
static int g_sched_running; /* guarded by g_mu (written under g_sched_mu too) */
/* Incremented by every hdStopScheduler; a scheduler thread runs while it equals the value it was started with, so
 * a thread that stopped itself from a callback and is still finishing its tick never runs on after a restart. */
static atomic_uint g_gen;
static int g_stuck;
static int64_t g_start_ns, g_tick_start_ns;
static _Thread_local int t_is_sched_thread;

static int g_log_fd = -1, g_log_failed;

/* ---------------------------------------------------------------------------------------------- utilities */
static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_until_ns(int64_t t) {
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000LL), .tv_nsec = (long)(t % 1000000000LL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_f64(unsigned char *p, double d) {
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    put_u64(p, v);
}

/* One 48-byte record: u32 kind, u32 code, i64 t_ns (CLOCK_MONOTONIC), f64 a, b, c, d; little-endian whatever the
 * host. Each record is a single write(2) on an O_APPEND descriptor, no user-space buffer: a SIGKILLed process has
 * handed every finished record to the kernel, so the file only ever holds whole records. */
static void log_record(uint32_t kind, uint32_t code, int64_t t_ns, double a, double b, double c, double d) {
    if (!g_cfg.log_path) return;
    unsigned char buf[48];
    put_u32(buf, kind);
    put_u32(buf + 4, code);
    put_u64(buf + 8, (uint64_t)t_ns);
    put_f64(buf + 16, a);
    put_f64(buf + 24, b);
    put_f64(buf + 32, c);
    put_f64(buf + 40, d);
    pthread_mutex_lock(&g_log_mu);
    if (g_log_fd < 0 && !g_log_failed) {
        g_log_fd = open(g_cfg.log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
        if (g_log_fd < 0) {
            g_log_failed = 1; /* say it once, not 2000 times a second */
            fprintf(stderr, "suturesim hd emulator: cannot open log %s: %s\n", g_cfg.log_path, strerror(errno));
        }
    }
    if (g_log_fd >= 0) {
        size_t off = 0;
        while (off < sizeof buf) {
            ssize_t n = write(g_log_fd, buf + off, sizeof buf - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break; /* disk full etc.: drop the record rather than block the servo loop */
            off += (size_t)n;
        }
    }
    pthread_mutex_unlock(&g_log_mu);
}

static void log_now(uint32_t kind, uint32_t code, double a, double b, double c, double d) {
    log_record(kind, code, now_ns(), a, b, c, d);
}

/* ------------------------------------------------------------------------------------------ configuration */
static void trim(char **s) {
    while (**s == ' ' || **s == '\t') (*s)++;
    char *e = *s + strlen(*s);
    while (e > *s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = '\0';
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* One script row: 5 fields (identity orientation) or 9 (with a quaternion, normalised here). Returns the number of
 * fields, 0 for a malformed row (a reason in *why). */
static int parse_row(const char *s, row_t *r, const char **why) {
    int c5 = -1, c9 = -1;
    double q[4] = {1.0, 0.0, 0.0, 0.0};
    int n = sscanf(s, "%lf %lf %lf %lf %d%n %lf %lf %lf %lf%n", &r->t, &r->p[0], &r->p[1], &r->p[2], &r->buttons,
                   &c5, &q[0], &q[1], &q[2], &q[3], &c9);
    *why = "expected 't_s x_mm y_mm z_mm buttons [qw qx qy qz]'";
    /* the button mask is an integer: "1.5" must not read as 1 followed by a field 0.5 */
    if (n < 5 || c5 < 0 || (s[c5] != '\0' && s[c5] != ' ' && s[c5] != '\t')) return 0;
    int width;
    if (n == 5 && s[c5 + strspn(s + c5, " \t")] == '\0')
        width = 5;
    else if (n == 9 && c9 >= 0 && s[c9] == '\0')
        width = 9;
    else
        return 0;
    if (!isfinite(r->t) || !isfinite(r->p[0]) || !isfinite(r->p[1]) || !isfinite(r->p[2])) {
        *why = "non-finite value";
        return 0;
    }
    double norm = sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
    if (!isfinite(norm) || !(norm > 1e-12)) {
        *why = "the quaternion must be finite and non-zero";
        return 0;
    }
    for (int i = 0; i < 4; i++) r->q[i] = q[i] / norm;
    return width;
}

static void load_script(const char *path, script_t *sc) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "suturesim hd emulator: cannot open script %s: %s\n", path, strerror(errno));
        return;
    }
    char *line = NULL;
    size_t cap = 0, n_cap = 0;
    long lineno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *s = line;
        trim(&s);
        if (!*s) continue;
        row_t r;
        const char *why;
        int width = parse_row(s, &r, &why);
        if (width == 0) {
            fprintf(stderr, "suturesim hd emulator: %s:%ld: %s, skipped\n", path, lineno, why);
            continue;
        }
        if (sc->width && width != sc->width) {
            fprintf(stderr, "suturesim hd emulator: %s:%ld: %d fields, but the script's rows have %d, skipped\n",
                    path, lineno, width, sc->width);
            continue;
        }
        if (sc->n_rows == n_cap) {
            n_cap = n_cap ? 2 * n_cap : 64;
            row_t *grown = realloc(sc->rows, n_cap * sizeof *grown);
            if (!grown) break;
            sc->rows = grown;
        }
        sc->width = width;
        /* Insertion keeps the rows sorted by t and stable for equal t (a step is written as two rows at the same
         * time); a script is normally written sorted, so this is linear. */
        size_t i = sc->n_rows++;
        while (i > 0 && sc->rows[i - 1].t > r.t) {
            sc->rows[i] = sc->rows[i - 1];
            i--;
        }
        sc->rows[i] = r;
    }
    free(line);
    fclose(f);
    /* q and -q are the same orientation: each row takes the sign nearer the row before, so the reported
     * quaternion runs on continuously from a segment's end into the hold after it. */
    for (size_t i = 1; i < sc->n_rows; i++) {
        double *a = sc->rows[i - 1].q, *b = sc->rows[i].q;
        if (a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3] < 0.0)
            for (int j = 0; j < 4; j++) b[j] = -b[j];
    }
}

/* SUTURESIM_HD_EMU_SCRIPTS: "name=path;name=path". A name listed twice keeps its first script. */
static void parse_scripts(const char *spec) {
    char *copy = strdup(spec), *save = NULL;
    if (!copy) return;
    g_cfg.named = 1;
    for (char *tok = strtok_r(copy, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        trim(&tok);
        if (!*tok) continue;
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || !eq[1]) {
            fprintf(stderr, "suturesim hd emulator: SUTURESIM_HD_EMU_SCRIPTS entry '%s' ignored "
                            "(expected name=path)\n", tok);
            continue;
        }
        *eq = '\0';
        char *name = tok, *path = eq + 1;
        trim(&name);
        trim(&path);
        int dup = 0;
        for (int i = 1; i < g_cfg.n_scripts; i++) dup |= strcmp(g_cfg.scripts[i].name, name) == 0;
        if (dup || g_cfg.n_scripts == MAX_SCRIPTS) {
            fprintf(stderr, "suturesim hd emulator: script for '%s' ignored (%s)\n", name,
                    dup ? "listed before" : "too many devices");
            continue;
        }
        script_t *sc = &g_cfg.scripts[g_cfg.n_scripts++];
        sc->name = strdup(name);
        if (!sc->name) {
            g_cfg.n_scripts--;
            continue;
        }
        load_script(path, sc);
    }
    free(copy);
}

/* The script of the device called `name`; NULL when no device is configured under that name. */
static const script_t *script_for(const char *name) {
    for (int i = 1; i < g_cfg.n_scripts; i++)
        if (strcmp(g_cfg.scripts[i].name, name) == 0) return &g_cfg.scripts[i];
    if (!g_cfg.named || strcmp(name, "Default Device") == 0) return &g_cfg.scripts[0];
    return NULL;
}

static void parse_faults(const char *spec) {
    char *copy = strdup(spec), *save = NULL;
    if (!copy) return;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        trim(&tok);
        if (!*tok) continue;
        if (strcmp(tok, "missing") == 0) {
            g_cfg.missing = 1;
        } else if (strcmp(tok, "nocal") == 0) {
            g_cfg.nocal = 1;
        } else if (strncmp(tok, "stuck@", 6) == 0 && parse_double(tok + 6, &g_cfg.stuck_t)) {
            g_cfg.stuck = 1;
        } else if (strncmp(tok, "error:", 6) == 0 && strchr(tok, '@') && g_cfg.n_errs < MAX_ERROR_FAULTS) {
            char *at = strchr(tok, '@');
            *at = '\0';
            const char *code_s = tok + 6;
            int hex = code_s[0] == '0' && (code_s[1] == 'x' || code_s[1] == 'X');
            char *end;
            errno = 0;
            unsigned long code = strtoul(code_s, &end, hex ? 16 : 10);
            double t;
            if (end == code_s || *end != '\0' || errno || code > 0xFFFFFFFFul || !parse_double(at + 1, &t)) {
                *at = '@';
                fprintf(stderr, "suturesim hd emulator: bad fault '%s' ignored\n", tok);
                continue;
            }
            g_cfg.errs[g_cfg.n_errs++] = (error_fault_t){.code = (HDerror)code, .t = t, .fired = 0};
        } else {
            fprintf(stderr, "suturesim hd emulator: unknown fault '%s' ignored "
                            "(missing, nocal, stuck@T, error:CODE@T)\n", tok);
        }
    }
    free(copy);
}

static void load_config(void) {
    g_cfg.max_cont_force = 0.88;
    g_cfg.max_stiffness = 1.02;   /* a Touch's stiffest-axis-limited value (z), N/mm */
    g_cfg.n_scripts = 1;          /* [0], the default script: no rows (at rest at the origin) unless set */
    const char *s = getenv("SUTURESIM_HD_EMU_SCRIPT");
    if (s && *s) load_script(s, &g_cfg.scripts[0]);
    s = getenv("SUTURESIM_HD_EMU_SCRIPTS");
    if (s && *s) parse_scripts(s);
    s = getenv("SUTURESIM_HD_EMU_FAULT");
    if (s && *s) parse_faults(s);
    s = getenv("SUTURESIM_HD_EMU_MAX_CONTINUOUS_FORCE");
    if (s && *s && !parse_double(s, &g_cfg.max_cont_force))
        fprintf(stderr, "suturesim hd emulator: bad SUTURESIM_HD_EMU_MAX_CONTINUOUS_FORCE '%s', using 0.88\n", s);
    s = getenv("SUTURESIM_HD_EMU_MAX_STIFFNESS");
    if (s && *s && !parse_double(s, &g_cfg.max_stiffness))
        fprintf(stderr, "suturesim hd emulator: bad SUTURESIM_HD_EMU_MAX_STIFFNESS '%s', using 1.02\n", s);
    s = getenv("SUTURESIM_HD_EMU_LOG");
    if (s && *s) g_cfg.log_path = strdup(s);
}

static void ensure_config(void) { pthread_once(&g_once, load_config); }

/* ------------------------------------------------------------------------------------------------ script */
/* Spherical linear interpolation from unit quaternion a (s = 0) to b (s = 1) along the shorter arc (b and -b are
 * the same rotation). The angle between them is taken as 2 atan2(|a - b|, |a + b|), accurate for any angle, and
 * nearly equal ones are interpolated linearly (then normalised), where slerp's weights would divide 0 by 0. */
static void slerp(const double a[4], const double b_in[4], double s, double out[4]) {
    double b[4], dot = 0.0, dm = 0.0, dp = 0.0;
    for (int i = 0; i < 4; i++) dot += a[i] * b_in[i];
    for (int i = 0; i < 4; i++) {
        b[i] = dot < 0.0 ? -b_in[i] : b_in[i];
        dm += (a[i] - b[i]) * (a[i] - b[i]);
        dp += (a[i] + b[i]) * (a[i] + b[i]);
    }
    double theta = 2.0 * atan2(sqrt(dm), sqrt(dp)), st = sin(theta), wa, wb;
    if (st < 1e-9) {
        wa = 1.0 - s;
        wb = s;
    } else {
        wa = sin((1.0 - s) * theta) / st;
        wb = sin(s * theta) / st;
    }
    double n = 0.0;
    for (int i = 0; i < 4; i++) {
        out[i] = wa * a[i] + wb * b[i];
        n += out[i] * out[i];
    }
    n = sqrt(n);
    for (int i = 0; i < 4; i++) out[i] /= n;
}

static void script_eval(const script_t *sc, double t, double p[3], double q[4], int *buttons) {
    size_t n = sc->n_rows;
    const row_t *r = sc->rows;
    if (n == 0) {
        p[0] = p[1] = p[2] = 0.0;
        q[0] = 1.0;
        q[1] = q[2] = q[3] = 0.0;
        *buttons = 0;
        return;
    }
    /* k = number of rows with t_row <= t (upper bound); the row in force is k - 1. */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r[mid].t <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t k = lo;
    if (k == 0) {
        memcpy(p, r[0].p, 3 * sizeof(double));
        memcpy(q, r[0].q, 4 * sizeof(double));
        *buttons = 0;
    } else if (k == n) {
        memcpy(p, r[n - 1].p, 3 * sizeof(double));
        memcpy(q, r[n - 1].q, 4 * sizeof(double));
        *buttons = r[n - 1].buttons;
    } else {
        /* r[k-1].t <= t < r[k].t, so the denominator is > 0 even across steps (equal-time rows). */
        const row_t *a = &r[k - 1], *b = &r[k];
        double s = (t - a->t) / (b->t - a->t);
        for (int i = 0; i < 3; i++) p[i] = a->p[i] + s * (b->p[i] - a->p[i]);
        slerp(a->q, b->q, s, q);
        *buttons = a->buttons;
    }
}

/* -------------------------------------------------------------------------------------------- error stack */
static void push_error_locked(HDerror code, int internal) {
    int dropped = g_err_n == MAX_ERRORS; /* keep the oldest: the first error is the one that explains the rest */
    if (!dropped) {
        g_err[(g_err_head + g_err_n) % MAX_ERRORS] =
            (HDErrorInfo){.errorCode = code, .internalErrorCode = internal, .hHD = g_current};
        g_err_n++;
    }
    log_now(LOG_ERROR_PUSHED, code, internal, dropped, 0.0, (double)g_current);
}

static void push_error(HDerror code, int internal) {
    pthread_mutex_lock(&g_mu);
    push_error_locked(code, internal);
    pthread_mutex_unlock(&g_mu);
}

static device_t *device_locked(HHD h) { return h < MAX_DEVICES && g_dev[h].used ? &g_dev[h] : NULL; }

static int cap_bit(HDenum cap) {
    return cap >= HD_FORCE_OUTPUT && cap <= HD_ONE_FRAME_LIMIT ? (int)(cap - HD_FORCE_OUTPUT) : -1;
}

/* -------------------------------------------------------------------------------------------- devices */
HDAPI HHD hdInitDevice(const char *name) {
    ensure_config();
    if (!name) name = "Default Device"; /* HD_DEFAULT_DEVICE is NULL in the C API */
    pthread_mutex_lock(&g_mu);
    HHD h = HD_INVALID_HANDLE;
    const script_t *script = script_for(name);
    if (g_cfg.missing) {
        push_error_locked(HD_COMM_CONFIG_ERROR, -1);
    } else if (!script) {
        push_error_locked(HD_COMM_CONFIG_ERROR, -3); /* no device configured under that name */
    } else {
        int dup = 0, slot = -1;
        for (int i = 0; i < MAX_DEVICES; i++) {
            if (g_dev[i].used && strncmp(g_dev[i].name, name, sizeof g_dev[i].name - 1) == 0) dup = 1;
            if (!g_dev[i].used && slot < 0) slot = i;
        }
        if (dup) {
            push_error_locked(HD_DEVICE_ALREADY_INITIATED, 0);
        } else if (slot < 0) {
            push_error_locked(HD_COMM_CONFIG_ERROR, -2); /* a third device: nothing is configured under that name */
        } else {
            device_t *d = &g_dev[slot];
            memset(d, 0, sizeof *d);
            d->used = 1;
            snprintf(d->name, sizeof d->name, "%s", name);
            /* The stylus sits where its script is now (its start, before the scheduler runs); its first tick
             * reports zero velocity. */
            d->script = script;
            script_eval(script, g_tick_t, d->pos, d->q, &d->buttons);
            memcpy(d->last_pos, d->pos, sizeof d->pos);
            memcpy(d->last_q, d->q, sizeof d->q);
            d->last_buttons = d->buttons;
            d->prev_tick = -1;
            /* Every capability starts disabled so that the FORCE records' mask shows exactly what the driver
             * enabled (OpenHaptics' own defaults differ per capability and are not reproduced). */
            h = (HHD)slot;
            g_current = h;
        }
    }
    log_now(LOG_INIT, h, 0, 0, 0, 0);
    pthread_mutex_unlock(&g_mu);
    return h;
}

HDAPI void hdDisableDevice(HHD h) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    device_t *d = device_locked(h);
    if (!d) {
        push_error_locked(HD_BAD_HANDLE, 0);
    } else {
        d->used = 0;
        d->in_frame = 0;
        d->force[0] = d->force[1] = d->force[2] = 0.0;
        log_now(LOG_MOTORS_OFF, MOTORS_OFF_DEVICE_DISABLED, 0, 0, 0, (double)h);
        if (g_current == h) {
            g_current = HD_INVALID_HANDLE;
            for (HHD i = 0; i < MAX_DEVICES; i++)
                if (g_dev[i].used) {
                    g_current = i;
                    break;
                }
        }
    }
    pthread_mutex_unlock(&g_mu);
}

HDAPI HHD hdGetCurrentDevice(void) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    HHD h = g_current;
    pthread_mutex_unlock(&g_mu);
    return h;
}

HDAPI void hdMakeCurrentDevice(HHD h) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    if (device_locked(h))
        g_current = h;
    else
        push_error_locked(HD_BAD_HANDLE, 0);
    pthread_mutex_unlock(&g_mu);
}

static void set_cap(HDenum cap, int on) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    int bit = cap_bit(cap);
    device_t *d = device_locked(g_current);
    if (bit < 0) {
        push_error_locked(HD_INVALID_ENUM, 0);
    } else if (!d) {
        push_error_locked(HD_BAD_HANDLE, 0);
    } else {
        if (on)
            d->caps |= 1u << bit;
        else
            d->caps &= ~(1u << bit);
        log_now(on ? LOG_ENABLE : LOG_DISABLE, cap, 0, 0, 0, (double)g_current);
    }
    pthread_mutex_unlock(&g_mu);
}

HDAPI void hdEnable(HDenum cap) { set_cap(cap, 1); }
HDAPI void hdDisable(HDenum cap) { set_cap(cap, 0); }

HDAPI HDboolean hdIsEnabled(HDenum cap) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    int bit = cap_bit(cap);
    device_t *d = device_locked(g_current);
    HDboolean on = 0;
    if (bit < 0)
        push_error_locked(HD_INVALID_ENUM, 0);
    else if (!d)
        push_error_locked(HD_BAD_HANDLE, 0);
    else
        on = (d->caps >> bit) & 1u;
    pthread_mutex_unlock(&g_mu);
    return on;
}

/* ----------------------------------------------------------------------------------------------- frames */
HDAPI void hdBeginFrame(HHD h) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    device_t *d = device_locked(h);
    if (!d) {
        push_error_locked(HD_BAD_HANDLE, 0);
    } else if (d->in_frame) {
        push_error_locked(HD_ILLEGAL_BEGIN, 0);
    } else {
        d->in_frame = 1;
        /* A frame that sets no force commands zero: a stale force is never re-applied by a callback that
         * forgot (or failed) to set one. */
        d->force[0] = d->force[1] = d->force[2] = 0.0;
    }
    pthread_mutex_unlock(&g_mu);
}

HDAPI void hdEndFrame(HHD h) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    device_t *d = device_locked(h);
    if (!d) {
        push_error_locked(HD_BAD_HANDLE, 0);
    } else if (!d->in_frame) {
        push_error_locked(HD_ILLEGAL_END, 0);
    } else {
        d->in_frame = 0;
        /* The commanded force is logged as set (NaN included): whether real motors would output it depends on the
         * capability mask in `code`, which the reader interprets. */
        log_now(LOG_FORCE, d->caps, d->force[0], d->force[1], d->force[2], (double)h);
    }
    pthread_mutex_unlock(&g_mu);
}

/* ------------------------------------------------------------------------------------------- parameters */
static void transform_of(const double p[3], const double q[4], double m[16]) {
    /* Column-major 4x4 like OpenHaptics (hduMatrix): element 4 j + i is row i of column j; the rotation R of the
     * unit quaternion q in the upper 3x3 (the stylus frame's axes in device coordinates, as columns), the
     * translation in elements 12..14. */
    const double w = q[0], x = q[1], y = q[2], z = q[3];
    const double r[3][3] = {
        {1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y)},
        {2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x)},
        {2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)},
    };
    memset(m, 0, 16 * sizeof(double));
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 3; i++) m[4 * j + i] = r[i][j];
    m[15] = 1.0;
    m[12] = p[0];
    m[13] = p[1];
    m[14] = p[2];
}

/* Value(s) of a gettable parameter as doubles; returns the count, 0 for an unknown enum. Caller holds g_mu. */
static int query_locked(HDenum e, const device_t *d, double out[16]) {
    switch (e) {
    case HD_CURRENT_POSITION: memcpy(out, d->pos, sizeof d->pos); return 3;
    case HD_LAST_POSITION: memcpy(out, d->last_pos, sizeof d->last_pos); return 3;
    case HD_CURRENT_VELOCITY: memcpy(out, d->vel, sizeof d->vel); return 3;
    case HD_LAST_VELOCITY: memcpy(out, d->last_vel, sizeof d->last_vel); return 3;
    case HD_CURRENT_TRANSFORM: transform_of(d->pos, d->q, out); return 16;
    case HD_LAST_TRANSFORM: transform_of(d->last_pos, d->last_q, out); return 16;
    case HD_CURRENT_BUTTONS: out[0] = d->buttons; return 1;
    case HD_LAST_BUTTONS: out[0] = d->last_buttons; return 1;
    case HD_CURRENT_FORCE: memcpy(out, d->force, sizeof d->force); return 3;
    case HD_NOMINAL_MAX_CONTINUOUS_FORCE: out[0] = g_cfg.max_cont_force; return 1;
    case HD_NOMINAL_MAX_FORCE: out[0] = 3.3; return 1;
    case HD_NOMINAL_MAX_STIFFNESS: out[0] = g_cfg.max_stiffness; return 1;
    case HD_UPDATE_RATE:
    case HD_INSTANTANEOUS_UPDATE_RATE: out[0] = 1000.0; return 1;
    case HD_CALIBRATION_STYLE: out[0] = HD_CALIBRATION_INKWELL; return 1;
    case HD_INPUT_DOF: out[0] = 6; return 1;
    case HD_OUTPUT_DOF: out[0] = 3; return 1;
    default: return 0;
    }
}

/* Shared body of hdGet{Double,Integer,Float}v: fills out[] and returns the count, or 0 after pushing an error. */
static int get_params(HDenum e, void *dst, double out[16]) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    int n = 0;
    const device_t *d = device_locked(g_current);
    if (!dst)
        push_error_locked(HD_INVALID_VALUE, 0);
    else if (!d)
        push_error_locked(HD_BAD_HANDLE, 0);
    else if ((n = query_locked(e, d, out)) == 0)
        push_error_locked(HD_INVALID_ENUM, 0);
    pthread_mutex_unlock(&g_mu);
    return n;
}

HDAPI void hdGetDoublev(HDenum e, double *v) {
    double out[16];
    int n = get_params(e, v, out);
    for (int i = 0; i < n; i++) v[i] = out[i];
}

HDAPI void hdGetFloatv(HDenum e, float *v) {
    double out[16];
    int n = get_params(e, v, out);
    for (int i = 0; i < n; i++) v[i] = (float)out[i];
}

/* Round to nearest, saturating; NaN (a NaN force set by the
 * caller) gives 0, because converting an out-of-range double to int is undefined behaviour in C. */
static int to_int(double x) {
    if (!(x == x)) return 0;
    if (x >= 2147483647.0) return 2147483647;
    if (x <= -2147483648.0) return -2147483647 - 1;
    return (int)(x < 0 ? x - 0.5 : x + 0.5);
}

HDAPI void hdGetIntegerv(HDenum e, int *v) {
    double out[16];
    int n = get_params(e, v, out);
    for (int i = 0; i < n; i++) v[i] = to_int(out[i]);
}

static void set_force(HDenum e, const double f[3], int valid_ptr) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    device_t *d = device_locked(g_current);
    if (e != HD_CURRENT_FORCE)
        push_error_locked(HD_INVALID_ENUM, 0);
    else if (!valid_ptr)
        push_error_locked(HD_INVALID_VALUE, 0);
    else if (!d)
        push_error_locked(HD_BAD_HANDLE, 0);
    else
        memcpy(d->force, f, 3 * sizeof(double)); /* outside a frame this is overwritten by the next begin */
    pthread_mutex_unlock(&g_mu);
}

HDAPI void hdSetDoublev(HDenum e, const double *v) {
    double f[3] = {0, 0, 0};
    if (v && e == HD_CURRENT_FORCE) memcpy(f, v, sizeof f);
    set_force(e, f, v != NULL);
}

HDAPI void hdSetFloatv(HDenum e, const float *v) {
    double f[3] = {0, 0, 0};
    if (v && e == HD_CURRENT_FORCE)
        for (int i = 0; i < 3; i++) f[i] = v[i];
    set_force(e, f, v != NULL);
}

/* ------------------------------------------------------------------------------------------------ errors */
HDAPI HDErrorInfo hdGetError(void) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    HDErrorInfo e = {.errorCode = HD_SUCCESS, .internalErrorCode = 0, .hHD = g_current};
    if (g_err_n > 0) {
        e = g_err[g_err_head];
        g_err_head = (g_err_head + 1) % MAX_ERRORS;
        g_err_n--;
    }
    pthread_mutex_unlock(&g_mu);
    return e;
}

HDAPI const char *hdGetErrorString(HDerror code) {
    switch (code) {
    case HD_SUCCESS: return "No error";
    case HD_INVALID_ENUM: return "Invalid enumeration";
    case HD_INVALID_VALUE: return "Invalid value";
    case HD_INVALID_OPERATION: return "Invalid operation";
    case HD_BAD_HANDLE: return "Invalid device handle";
    case HD_WARM_MOTORS: return "Motors are too warm";
    case HD_EXCEEDED_MAX_FORCE: return "Exceeded maximum force";
    case HD_EXCEEDED_MAX_FORCE_IMPULSE: return "Exceeded maximum force impulse";
    case HD_EXCEEDED_MAX_VELOCITY: return "Exceeded maximum velocity";
    case HD_FORCE_ERROR: return "Force error";
    case HD_DEVICE_FAULT: return "Device fault";
    case HD_DEVICE_ALREADY_INITIATED: return "Device already initiated";
    case HD_COMM_ERROR: return "Communication error";
    case HD_COMM_CONFIG_ERROR: return "Communication configuration error (no such device)";
    case HD_TIMER_ERROR: return "Timer error";
    case HD_ILLEGAL_BEGIN: return "Illegal begin frame";
    case HD_ILLEGAL_END: return "Illegal end frame";
    case HD_FRAME_ERROR: return "Frame error";
    case HD_INVALID_PRIORITY: return "Invalid scheduler priority";
    case HD_SCHEDULER_FULL: return "Scheduler full";
    case HD_INVALID_LICENSE: return "Invalid license";
    default: return "Unknown error";
    }
}

HDAPI const char *hdGetString(HDenum e) {
    ensure_config();
    switch (e) {
    case HD_DEVICE_MODEL_TYPE: return "suturesim emulator";
    case HD_DEVICE_VENDOR: return "suturesim";
    case HD_DEVICE_SERIAL_NUMBER: return "EMU-0001";
    case HD_DEVICE_DRIVER_VERSION: return "emulator";
    case HD_VERSION: return "3.4.0";
    default:
        push_error(HD_INVALID_ENUM, 0);
        return ""; /* not NULL: a binding that decodes the result unconditionally must not crash */
    }
}

HDAPI HDenum hdCheckCalibration(void) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    HDenum r = g_cfg.nocal ? HD_CALIBRATION_NEEDS_UPDATE : HD_CALIBRATION_OK;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Not in the brief's list but part of the same API: lets a driver's "calibration needs update" path complete. */
HDAPI void hdUpdateCalibration(HDenum style) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    if (style != HD_CALIBRATION_INKWELL)
        push_error_locked(HD_INVALID_VALUE, 0);
    else
        g_cfg.nocal = 0;
    pthread_mutex_unlock(&g_mu);
}

/* --------------------------------------------------------------------------------------------- scheduler */
static int cb_index_locked(HDSchedulerHandle h) {
    for (int i = 0; i < g_ncbs; i++)
        if (g_cbs[i].h == h) return i;
    return -1;
}

static void cb_remove_locked(HDSchedulerHandle h) {
    int i = cb_index_locked(h);
    if (i < 0) return;
    memmove(&g_cbs[i], &g_cbs[i + 1], (size_t)(g_ncbs - i - 1) * sizeof g_cbs[0]);
    g_ncbs--;
}

/* Device h's stylus at tick k (script time t): the previous sample becomes the LAST_* one, velocity by finite
 * difference over the ticks between them. Logged at the tick's deadline, not the wake-up time, so the logged pose
 * is exactly script(t_ns - start). */
static void sample_stylus_locked(HHD h, int64_t k, double t, int64_t deadline) {
    device_t *d = &g_dev[h];
    memcpy(d->last_pos, d->pos, sizeof d->pos);
    memcpy(d->last_vel, d->vel, sizeof d->vel);
    memcpy(d->last_q, d->q, sizeof d->q);
    d->last_buttons = d->buttons;
    script_eval(d->script, t, d->pos, d->q, &d->buttons);
    if (d->prev_tick >= 0 && k > d->prev_tick) {
        double dt = (double)(k - d->prev_tick) * (PERIOD_NS * 1e-9);
        for (int i = 0; i < 3; i++) d->vel[i] = (d->pos[i] - d->last_pos[i]) / dt;
    } else {
        d->vel[0] = d->vel[1] = d->vel[2] = 0.0;
    }
    d->prev_tick = k;
    log_record(LOG_POSE, h, deadline, d->pos[0], d->pos[1], d->pos[2], d->buttons);
    if (d->script->width == 9) log_record(LOG_ORIENT, h, deadline, d->q[0], d->q[1], d->q[2], d->q[3]);
}

/* One servo tick: every device's stylus, injected faults, asynchronous callbacks by priority, then pending synchronous ones. */
static void run_tick(int64_t k, int64_t deadline) {
    /* Computed as (t_ns - start_ns) / 1e9 so that a reader of the log reproduces t bit for bit. */
    double t = (double)(k * PERIOD_NS) / 1e9;
    callback_t snap[MAX_CALLBACKS];
    int nsnap;

    pthread_mutex_lock(&g_mu);
    if (g_stuck) {
        pthread_mutex_unlock(&g_mu);
        return;
    }
    if (g_cfg.stuck && t >= g_cfg.stuck_t) {
        /* Emulates a servo thread hung in the driver: from here on nothing is updated or called. */
        g_stuck = 1;
        log_now(LOG_STUCK, 0, t, 0, 0, 0);
        pthread_mutex_unlock(&g_mu);
        return;
    }
    g_tick_start_ns = now_ns();
    g_tick_t = t;
    for (HHD h = 0; h < MAX_DEVICES; h++)
        if (g_dev[h].used) sample_stylus_locked(h, k, t, deadline);
    for (int i = 0; i < g_cfg.n_errs; i++)
        if (!g_cfg.errs[i].fired && t >= g_cfg.errs[i].t) {
            g_cfg.errs[i].fired = 1;
            push_error_locked(g_cfg.errs[i].code, 0);
        }
    nsnap = g_ncbs;
    memcpy(snap, g_cbs, (size_t)nsnap * sizeof snap[0]);
    pthread_mutex_unlock(&g_mu);

    for (int i = 0; i < nsnap; i++) {
        pthread_mutex_lock(&g_mu);
        int live = cb_index_locked(snap[i].h) >= 0; /* unscheduled by an earlier callback of this tick? */
        if (live) g_running_h = snap[i].h;
        pthread_mutex_unlock(&g_mu);
        if (!live) continue;
        HDCallbackCode rc = snap[i].cb(snap[i].data);
        pthread_mutex_lock(&g_mu);
        g_running_h = 0;
        if (rc == HD_CALLBACK_DONE) cb_remove_locked(snap[i].h);
        pthread_cond_broadcast(&g_cv); /* hdUnschedule / hdWaitForCompletion may be waiting for this one */
        pthread_mutex_unlock(&g_mu);
    }

    /* Synchronous requests live on their callers' stacks until `done`; only this thread (and hdStopScheduler after
     * joining it) removes them, so walking the list between unlocked calls is safe. */
    pthread_mutex_lock(&g_mu);
    sync_req_t *prev = NULL, *r = g_sync_head;
    while (r) {
        pthread_mutex_unlock(&g_mu);
        HDCallbackCode rc = r->cb(r->data);
        pthread_mutex_lock(&g_mu);
        sync_req_t *next = r->next;
        if (rc == HD_CALLBACK_DONE) {
            if (prev)
                prev->next = next;
            else
                g_sync_head = next;
            if (g_sync_tail == r) g_sync_tail = prev;
            r->done = 1;
            pthread_cond_broadcast(&g_cv);
        } else {
            prev = r;
        }
        r = next;
    }
    pthread_mutex_unlock(&g_mu);
}

static void *scheduler_main(void *arg) {
    const unsigned gen = (unsigned)(uintptr_t)arg;
    t_is_sched_thread = 1;
    pthread_mutex_lock(&g_mu);
    int64_t start = g_start_ns;
    pthread_mutex_unlock(&g_mu);
    int64_t k = 0;
    while (atomic_load(&g_gen) == gen) {
        int64_t deadline = start + k * PERIOD_NS;
        sleep_until_ns(deadline);
        if (atomic_load(&g_gen) != gen) break;
        int64_t late = now_ns() - deadline;
        if (late > RESYNC_NS) {
            k += late / PERIOD_NS;
            deadline = start + k * PERIOD_NS;
        }
        run_tick(k, deadline);
        k++;
    }
    return NULL;
}

HDAPI void hdStartScheduler(void) {
    ensure_config();
    pthread_mutex_lock(&g_sched_mu);
    pthread_mutex_lock(&g_mu);
    int running = g_sched_running;
    pthread_mutex_unlock(&g_mu);
    if (!running) {
        pthread_mutex_lock(&g_mu);
        g_start_ns = now_ns();
        g_tick_start_ns = 0;
        g_stuck = 0;
        g_tick_t = 0.0;
        for (HHD i = 0; i < MAX_DEVICES; i++) g_dev[i].prev_tick = -1;
        const unsigned gen = atomic_load(&g_gen);
        log_record(LOG_SCHED_START, 0, g_start_ns, 0, 0, 0, 0);
        g_sched_running = 1;
        pthread_mutex_unlock(&g_mu);
        int err = pthread_create(&g_thread, NULL, scheduler_main, (void *)(uintptr_t)gen);
        if (err != 0) {
            pthread_mutex_lock(&g_mu);
            g_sched_running = 0;
            push_error_locked(HD_TIMER_ERROR, err);
            pthread_mutex_unlock(&g_mu);
        }
    }
    pthread_mutex_unlock(&g_sched_mu);
}

HDAPI void hdStopScheduler(void) {
    ensure_config();
    if (t_is_sched_thread) {
        /* Called from a callback: the thread cannot join itself. It finishes this tick and exits; detach it so
         * its resources are reclaimed, and do the rest of the stop now. g_sched_mu is not taken: a concurrent
         * hdStopScheduler on another thread may hold it while joining this very thread. */
        pthread_mutex_lock(&g_mu);
        int was_running = g_sched_running;
        g_sched_running = 0;
        pthread_mutex_unlock(&g_mu);
        if (!was_running) return;
        atomic_fetch_add(&g_gen, 1);
        pthread_detach(pthread_self());
    } else {
        pthread_mutex_lock(&g_sched_mu);
        pthread_mutex_lock(&g_mu);
        int running = g_sched_running;
        pthread_mutex_unlock(&g_mu);
        if (!running) {
            pthread_mutex_unlock(&g_sched_mu);
            return;
        }
        atomic_fetch_add(&g_gen, 1);
        pthread_join(g_thread, NULL); /* g_mu is not held: the last tick's callbacks may need it */
        pthread_mutex_lock(&g_mu);
        g_sched_running = 0;
        pthread_mutex_unlock(&g_mu);
        pthread_mutex_unlock(&g_sched_mu);
    }
    pthread_mutex_lock(&g_mu);
    /* Asynchronous callbacks stay scheduled (OpenHaptics programs call hdUnschedule after hdStopScheduler), but
     * blocked hdScheduleSynchronous callers would wait forever: release them, their callback not completed. */
    for (sync_req_t *r = g_sync_head, *next; r; r = next) {
        next = r->next;
        r->done = 1;
    }
    g_sync_head = g_sync_tail = NULL;
    pthread_cond_broadcast(&g_cv);
    log_now(LOG_SCHED_STOP, 0, 0, 0, 0, 0);
    for (HHD i = 0; i < MAX_DEVICES; i++)
        if (g_dev[i].used) {
            g_dev[i].force[0] = g_dev[i].force[1] = g_dev[i].force[2] = 0.0;
            log_now(LOG_MOTORS_OFF, MOTORS_OFF_SCHEDULER_STOPPED, 0, 0, 0, (double)i);
        }
    pthread_mutex_unlock(&g_mu);
}

HDAPI HDSchedulerHandle hdScheduleAsynchronous(HDSchedulerCallback cb, void *data, HDushort prio) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    HDSchedulerHandle h = 0;
    if (!cb) {
        push_error_locked(HD_INVALID_VALUE, 0);
    } else if (g_ncbs == MAX_CALLBACKS) {
        push_error_locked(HD_SCHEDULER_FULL, 0);
    } else {
        /* Higher priority first; equal priorities in scheduling order. */
        int i = g_ncbs;
        while (i > 0 && g_cbs[i - 1].prio < prio) {
            g_cbs[i] = g_cbs[i - 1];
            i--;
        }
        h = g_next_handle++;
        g_cbs[i] = (callback_t){.h = h, .cb = cb, .data = data, .prio = prio};
        g_ncbs++;
    }
    pthread_mutex_unlock(&g_mu);
    return h;
}

HDAPI void hdScheduleSynchronous(HDSchedulerCallback cb, void *data, HDushort prio) {
    (void)prio; /* synchronous requests run after the tick's asynchronous callbacks, in arrival order */
    ensure_config();
    if (!cb) {
        push_error(HD_INVALID_VALUE, 0);
        return;
    }
    pthread_mutex_lock(&g_mu);
    if (!g_sched_running || t_is_sched_thread) {
        /* No scheduler (or called from inside a callback, which would otherwise wait for itself): run it here,
         * once per millisecond, until it is done. */
        pthread_mutex_unlock(&g_mu);
        int64_t next = now_ns();
        while (cb(data) != HD_CALLBACK_DONE) {
            next += PERIOD_NS;
            sleep_until_ns(next);
        }
        return;
    }
    sync_req_t req = {.cb = cb, .data = data, .done = 0, .next = NULL};
    if (g_sync_tail)
        g_sync_tail->next = &req;
    else
        g_sync_head = &req;
    g_sync_tail = &req;
    while (!req.done) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

HDAPI void hdUnschedule(HDSchedulerHandle h) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    if (cb_index_locked(h) < 0) {
        push_error_locked(HD_INVALID_OPERATION, 0);
    } else {
        cb_remove_locked(h);
        /* After hdUnschedule returns the callback is neither running nor will run again, so the caller may free
         * what it uses (a Python callback object, say). Not when called from a callback: it would wait forever. */
        while (!t_is_sched_thread && g_running_h == h) pthread_cond_wait(&g_cv, &g_mu);
    }
    pthread_mutex_unlock(&g_mu);
}

HDAPI HDboolean hdWaitForCompletion(HDSchedulerHandle h, HDenum param) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    HDboolean r;
    if (param == HD_WAIT_CHECK_STATUS) {
        r = cb_index_locked(h) >= 0; /* still scheduled */
    } else if (param == HD_WAIT_INFINITE) {
        /* true once the callback has completed; false when it never can (the scheduler is not running, or this
         * is the scheduler thread itself). */
        for (;;) {
            if (cb_index_locked(h) < 0) {
                r = 1;
                break;
            }
            if (!g_sched_running || t_is_sched_thread) {
                r = 0;
                break;
            }
            pthread_cond_wait(&g_cv, &g_mu);
        }
    } else {
        push_error_locked(HD_INVALID_ENUM, 0);
        r = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Seconds since the start of the current servo tick (OpenHaptics' meaning: a duty-cycle probe); 0 when the
 * scheduler is not running. */
HDAPI double hdGetSchedulerTimeStamp(void) {
    ensure_config();
    pthread_mutex_lock(&g_mu);
    double s = g_sched_running && g_tick_start_ns ? (double)(now_ns() - g_tick_start_ns) * 1e-9 : 0.0;
    pthread_mutex_unlock(&g_mu);
    return s;
}
