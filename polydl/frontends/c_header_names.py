"""Names the C headers of generated code declare (math.h, stddef.h, stdint.h, stdlib.h,
immintrin.h, omp.h, libxsmm.h, with the macros gcc predefines in gnu11 mode), as listed by
`cc -std=gnu11 -fopenmp -dM -E` and `cc -E` on glibc 2.36 / gcc 12 / LIBXSMM 1.17.

Names with a leading `_`, those in `c_names.RESERVED`, and the `libxsmm_`, `LIBXSMM_`, `omp_`,
`PRI*`, `SCN*` families are refused by prefix (see `c_names.py`) and are not repeated here.
tests/frontends/test_names.py checks the list against the local toolchain.

Also what polydl's own stand-in headers (`c_include/`) provide, read from the headers
themselves, and the hint an undeclared name or an unknown function gets from it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from polydl.frontends.c_preprocess import STAND_IN_HEADERS

# A macro breaks every use of its name, whatever the scope.
MACROS: frozenset[str] = frozenset(
    """
    AIO_PRIO_DELTA_MAX BC_BASE_MAX BC_DIM_MAX BC_SCALE_MAX BC_STRING_MAX BIG_ENDIAN BUFSIZ
    BYTE_ORDER CHARCLASS_NAME_MAX CHAR_BIT CHAR_MAX CHAR_MIN CLOCKS_PER_SEC CLOCK_BOOTTIME
    CLOCK_BOOTTIME_ALARM CLOCK_MONOTONIC CLOCK_MONOTONIC_COARSE CLOCK_MONOTONIC_RAW
    CLOCK_PROCESS_CPUTIME_ID CLOCK_REALTIME CLOCK_REALTIME_ALARM CLOCK_REALTIME_COARSE CLOCK_TAI
    CLOCK_THREAD_CPUTIME_ID COLL_WEIGHTS_MAX DBL_DECIMAL_DIG DBL_DIG DBL_EPSILON DBL_HAS_SUBNORM
    DBL_MANT_DIG DBL_MAX DBL_MAX_10_EXP DBL_MAX_EXP DBL_MIN DBL_MIN_10_EXP DBL_MIN_EXP
    DBL_TRUE_MIN DECIMAL_DIG DELAYTIMER_MAX EOF EXIT_FAILURE EXIT_SUCCESS EXPR_NEST_MAX FD_CLR
    FD_ISSET FD_SET FD_SETSIZE FD_ZERO FILENAME_MAX FLT_DECIMAL_DIG FLT_DIG FLT_EPSILON
    FLT_EVAL_METHOD FLT_HAS_SUBNORM FLT_MANT_DIG FLT_MAX FLT_MAX_10_EXP FLT_MAX_EXP FLT_MIN
    FLT_MIN_10_EXP FLT_MIN_EXP FLT_RADIX FLT_ROUNDS FLT_TRUE_MIN FOPEN_MAX FP_FAST_FMA
    FP_FAST_FMAF FP_ILOGB0 FP_ILOGBNAN FP_INFINITE FP_NAN FP_NORMAL FP_SUBNORMAL FP_ZERO F_LOCK
    F_OK F_TEST F_TLOCK F_ULOCK HOST_NAME_MAX HUGE_VAL HUGE_VALF HUGE_VALL INFINITY INT16_C
    INT16_MAX INT16_MIN INT32_C INT32_MAX INT32_MIN INT64_C INT64_MAX INT64_MIN INT8_C INT8_MAX
    INT8_MIN INTMAX_C INTMAX_MAX INTMAX_MIN INTPTR_MAX INTPTR_MIN INT_FAST16_MAX INT_FAST16_MIN
    INT_FAST32_MAX INT_FAST32_MIN INT_FAST64_MAX INT_FAST64_MIN INT_FAST8_MAX INT_FAST8_MIN
    INT_LEAST16_MAX INT_LEAST16_MIN INT_LEAST32_MAX INT_LEAST32_MIN INT_LEAST64_MAX
    INT_LEAST64_MIN INT_LEAST8_MAX INT_LEAST8_MIN INT_MAX INT_MIN LDBL_DECIMAL_DIG LDBL_DIG
    LDBL_EPSILON LDBL_HAS_SUBNORM LDBL_MANT_DIG LDBL_MAX LDBL_MAX_10_EXP LDBL_MAX_EXP LDBL_MIN
    LDBL_MIN_10_EXP LDBL_MIN_EXP LDBL_TRUE_MIN LIBXSNN_DNN_MASK_SIGN_F32 LINE_MAX LITTLE_ENDIAN
    LIXSMMM_DNN_RES_DFP16 LLONG_MAX LLONG_MIN LOGIN_NAME_MAX LONG_MAX LONG_MIN L_INCR L_SET
    L_XTND L_ctermid L_tmpnam MATH_ERREXCEPT MATH_ERRNO MAX_CANON MAX_INPUT MB_CUR_MAX
    MB_LEN_MAX MQ_PRIO_MAX M_1_PI M_2_PI M_2_SQRTPI M_E M_LN10 M_LN2 M_LOG10E M_LOG2E M_PI
    M_PI_2 M_PI_4 M_SQRT1_2 M_SQRT2 NAME_MAX NAN NFDBITS NGROUPS_MAX NULL PATH_MAX PDP_ENDIAN
    PIPE_BUF PTHREAD_BARRIER_SERIAL_THREAD PTHREAD_CANCELED PTHREAD_CANCEL_ASYNCHRONOUS
    PTHREAD_CANCEL_DEFERRED PTHREAD_CANCEL_DISABLE PTHREAD_CANCEL_ENABLE
    PTHREAD_COND_INITIALIZER PTHREAD_CREATE_DETACHED PTHREAD_CREATE_JOINABLE
    PTHREAD_DESTRUCTOR_ITERATIONS PTHREAD_EXPLICIT_SCHED PTHREAD_INHERIT_SCHED PTHREAD_KEYS_MAX
    PTHREAD_MUTEX_INITIALIZER PTHREAD_ONCE_INIT PTHREAD_PROCESS_PRIVATE PTHREAD_PROCESS_SHARED
    PTHREAD_RWLOCK_INITIALIZER PTHREAD_SCOPE_PROCESS PTHREAD_SCOPE_SYSTEM PTHREAD_STACK_MIN
    PTRDIFF_MAX PTRDIFF_MIN P_tmpdir RAND_MAX RE_DUP_MAX RTSIG_MAX R_OK SCHAR_MAX SCHAR_MIN
    SCHED_FIFO SCHED_OTHER SCHED_RR SEEK_CUR SEEK_END SEEK_SET SEM_VALUE_MAX SHRT_MAX SHRT_MIN
    SIG_ATOMIC_MAX SIG_ATOMIC_MIN SIZE_MAX SSIZE_MAX STDERR_FILENO STDIN_FILENO STDOUT_FILENO
    TIMER_ABSTIME TIME_UTC TMP_MAX TTY_NAME_MAX UCHAR_MAX UINT16_C UINT16_MAX UINT32_C
    UINT32_MAX UINT64_C UINT64_MAX UINT8_C UINT8_MAX UINTMAX_C UINTMAX_MAX UINTPTR_MAX
    UINT_FAST16_MAX UINT_FAST32_MAX UINT_FAST64_MAX UINT_FAST8_MAX UINT_LEAST16_MAX
    UINT_LEAST32_MAX UINT_LEAST64_MAX UINT_LEAST8_MAX UINT_MAX ULLONG_MAX ULONG_MAX USHRT_MAX
    WCHAR_MAX WCHAR_MIN WCONTINUED WEXITED WEXITSTATUS WIFCONTINUED WIFEXITED WIFSIGNALED
    WIFSTOPPED WINT_MAX WINT_MIN WNOHANG WNOWAIT WSTOPPED WSTOPSIG WTERMSIG WUNTRACED W_OK
    XATTR_LIST_MAX XATTR_NAME_MAX XATTR_SIZE_MAX X_OK alloca assert be16toh be32toh be64toh
    fpclassify htobe16 htobe32 htobe64 htole16 htole32 htole64 isfinite isgreater isgreaterequal
    isinf isless islessequal islessgreater isnan isnormal isunordered le16toh le32toh le64toh
    linux math_errhandling offsetof pthread_cleanup_pop pthread_cleanup_push sched_priority
    signbit static_assert stderr stdin stdout unix
    """.split()
)

# A typedef name cannot name a variable in the same scope as the type.
TYPES: frozenset[str] = frozenset(
    """
    FILE blkcnt_t blksize_t caddr_t clock_t clockid_t cpu_set_t daddr_t dev_t div_t double_t
    fd_mask fd_set float_t fpos_t fsblkcnt_t fsfilcnt_t fsid_t gid_t id_t imaxdiv_t ino_t
    int16_t int32_t int64_t int8_t int_fast16_t int_fast32_t int_fast64_t int_fast8_t
    int_least16_t int_least32_t int_least64_t int_least8_t intmax_t intptr_t key_t ldiv_t
    lldiv_t locale_t loff_t max_align_t mode_t nlink_t off_t pid_t pthread_attr_t
    pthread_barrier_t pthread_barrierattr_t pthread_cond_t pthread_condattr_t pthread_key_t
    pthread_mutex_t pthread_mutexattr_t pthread_once_t pthread_rwlock_t pthread_rwlockattr_t
    pthread_spinlock_t pthread_t ptrdiff_t quad_t sigset_t size_t socklen_t ssize_t suseconds_t
    time_t timer_t u_char u_int u_int16_t u_int32_t u_int64_t u_int8_t u_long u_quad_t u_short
    uid_t uint uint16_t uint32_t uint64_t uint8_t uint_fast16_t uint_fast32_t uint_fast64_t
    uint_fast8_t uint_least16_t uint_least32_t uint_least64_t uint_least8_t uintmax_t uintptr_t
    ulong useconds_t ushort va_list wchar_t
    """.split()
)

# Functions at file scope: only the kernel's own name can clash with them.
FUNCTIONS: frozenset[str] = frozenset(
    """
    a64l abort abs access acct acos acosf acosh acoshf acoshl acosl alarm aligned_alloc
    arc4random arc4random_buf arc4random_uniform asctime asctime_r asin asinf asinh asinhf
    asinhl asinl at_quick_exit atan atan2 atan2f atan2l atanf atanh atanhf atanhl atanl atexit
    atof atoi atol atoll bcmp bcopy brk bsearch bzero calloc cbrt cbrtf cbrtl ceil ceilf ceill
    chdir chown chroot clearenv clearerr clearerr_unlocked clock clock_getcpuclockid
    clock_getres clock_gettime clock_nanosleep clock_settime close closefrom confstr copysign
    copysignf copysignl cos cosf cosh coshf coshl cosl crypt ctermid ctime ctime_r daemon
    difftime div dprintf drand48 drand48_r drem dremf dreml dup dup2 dysize ecvt ecvt_r
    endusershell erand48 erand48_r erf erfc erfcf erfcl erff erfl execl execle execlp execv
    execve execvp exit exp exp2 exp2f exp2l expf expl explicit_bzero expm1 expm1f expm1l fabs
    fabsf fabsl faccessat fchdir fchown fchownat fclose fcvt fcvt_r fdatasync fdim fdimf fdiml
    fdopen feof feof_unlocked ferror ferror_unlocked fexecve fflush fflush_unlocked ffs ffsl
    ffsll fgetc fgetc_unlocked fgetpos fgets fileno fileno_unlocked finite finitef finitel
    flockfile floor floorf floorl fma fmaf fmal fmax fmaxf fmaxl fmemopen fmin fminf fminl fmod
    fmodf fmodl fopen fork fpathconf fprintf fputc fputc_unlocked fputs fread fread_unlocked
    free freopen frexp frexpf frexpl fscanf fseek fseeko fsetpos fsync ftell ftello ftruncate
    ftrylockfile funlockfile fwrite fwrite_unlocked gamma gammaf gammal gcvt getc getc_unlocked
    getchar getchar_unlocked getcwd getdelim getdomainname getdtablesize getegid getentropy
    getenv geteuid getgid getgroups gethostid gethostname getline getloadavg getlogin getlogin_r
    getopt getpagesize getpass getpgid getpgrp getpid getppid getsid getsubopt getuid
    getusershell getw getwd gmtime gmtime_r hypot hypotf hypotl ilogb ilogbf ilogbl imaxabs
    imaxdiv index initstate initstate_r isatty isinff isinfl isnanf isnanl j0 j0f j0l j1 j1f j1l
    jn jnf jnl jrand48 jrand48_r l64a labs lchown lcong48 lcong48_r ldexp ldexpf ldexpl ldiv
    lgamma lgamma_r lgammaf lgammaf_r lgammal lgammal_r link linkat llabs lldiv llrint llrintf
    llrintl llround llroundf llroundl localtime localtime_r lockf log log10 log10f log10l log1p
    log1pf log1pl log2 log2f log2l logb logbf logbl logf logl lrand48 lrand48_r lrint lrintf
    lrintl lround lroundf lroundl lseek malloc mblen mbstowcs mbtowc memccpy memchr memcmp
    memcpy memmove memset mkdtemp mkstemp mkstemps mktemp mktime modf modff modfl mrand48
    mrand48_r nan nanf nanl nanosleep nearbyint nearbyintf nearbyintl nextafter nextafterf
    nextafterl nexttoward nexttowardf nexttowardl nice nrand48 nrand48_r on_exit open_memstream
    pathconf pause pclose perror pipe popen posix_memalign pow powf powl pread printf profil
    pselect pthread_atfork pthread_attr_destroy pthread_attr_getdetachstate
    pthread_attr_getguardsize pthread_attr_getinheritsched pthread_attr_getschedparam
    pthread_attr_getschedpolicy pthread_attr_getscope pthread_attr_getstack
    pthread_attr_getstackaddr pthread_attr_getstacksize pthread_attr_init
    pthread_attr_setdetachstate pthread_attr_setguardsize pthread_attr_setinheritsched
    pthread_attr_setschedparam pthread_attr_setschedpolicy pthread_attr_setscope
    pthread_attr_setstack pthread_attr_setstackaddr pthread_attr_setstacksize
    pthread_barrier_destroy pthread_barrier_init pthread_barrier_wait
    pthread_barrierattr_destroy pthread_barrierattr_getpshared pthread_barrierattr_init
    pthread_barrierattr_setpshared pthread_cancel pthread_cond_broadcast pthread_cond_destroy
    pthread_cond_init pthread_cond_signal pthread_cond_timedwait pthread_cond_wait
    pthread_condattr_destroy pthread_condattr_getclock pthread_condattr_getpshared
    pthread_condattr_init pthread_condattr_setclock pthread_condattr_setpshared pthread_create
    pthread_detach pthread_equal pthread_exit pthread_getcpuclockid pthread_getschedparam
    pthread_getspecific pthread_join pthread_key_create pthread_key_delete
    pthread_mutex_consistent pthread_mutex_destroy pthread_mutex_getprioceiling
    pthread_mutex_init pthread_mutex_lock pthread_mutex_setprioceiling pthread_mutex_timedlock
    pthread_mutex_trylock pthread_mutex_unlock pthread_mutexattr_destroy
    pthread_mutexattr_getprioceiling pthread_mutexattr_getprotocol pthread_mutexattr_getpshared
    pthread_mutexattr_getrobust pthread_mutexattr_gettype pthread_mutexattr_init
    pthread_mutexattr_setprioceiling pthread_mutexattr_setprotocol pthread_mutexattr_setpshared
    pthread_mutexattr_setrobust pthread_mutexattr_settype pthread_once pthread_rwlock_destroy
    pthread_rwlock_init pthread_rwlock_rdlock pthread_rwlock_timedrdlock
    pthread_rwlock_timedwrlock pthread_rwlock_tryrdlock pthread_rwlock_trywrlock
    pthread_rwlock_unlock pthread_rwlock_wrlock pthread_rwlockattr_destroy
    pthread_rwlockattr_getkind_np pthread_rwlockattr_getpshared pthread_rwlockattr_init
    pthread_rwlockattr_setkind_np pthread_rwlockattr_setpshared pthread_self
    pthread_setcancelstate pthread_setcanceltype pthread_setschedparam pthread_setschedprio
    pthread_setspecific pthread_spin_destroy pthread_spin_init pthread_spin_lock
    pthread_spin_trylock pthread_spin_unlock pthread_testcancel putc putc_unlocked putchar
    putchar_unlocked putenv puts putw pwrite qecvt qecvt_r qfcvt qfcvt_r qgcvt qsort quick_exit
    rand rand_r random random_r read readlink readlinkat realloc reallocarray realpath remainder
    remainderf remainderl remove remquo remquof remquol rename renameat revoke rewind rindex
    rint rintf rintl rmdir round roundf roundl rpmatch sbrk scalb scalbf scalbl scalbln scalblnf
    scalblnl scalbn scalbnf scalbnl scanf sched_get_priority_max sched_get_priority_min
    sched_getparam sched_getscheduler sched_rr_get_interval sched_setparam sched_setscheduler
    sched_yield seed48 seed48_r select setbuf setbuffer setdomainname setegid setenv seteuid
    setgid sethostid sethostname setlinebuf setlogin setpgid setpgrp setregid setreuid setsid
    setstate setstate_r setuid setusershell setvbuf significand significandf significandl sin
    sinf sinh sinhf sinhl sinl sleep snprintf sprintf sqrt sqrtf sqrtl srand srand48 srand48_r
    srandom srandom_r sscanf stpcpy stpncpy strcasecmp strcasecmp_l strcat strchr strcmp strcoll
    strcoll_l strcpy strcspn strdup strerror strerror_l strerror_r strftime strftime_l strlen
    strncasecmp strncasecmp_l strncat strncmp strncpy strndup strnlen strpbrk strrchr strsep
    strsignal strspn strstr strtod strtof strtoimax strtok strtok_r strtol strtold strtoll
    strtoq strtoul strtoull strtoumax strtouq strxfrm strxfrm_l symlink symlinkat sync syscall
    sysconf system tan tanf tanh tanhf tanhl tanl tcgetpgrp tcsetpgrp tempnam tgamma tgammaf
    tgammal time timegm timelocal timer_create timer_delete timer_getoverrun timer_gettime
    timer_settime timespec_get tmpfile tmpnam tmpnam_r trunc truncate truncf truncl ttyname
    ttyname_r ttyslot tzset ualarm ungetc unlink unlinkat unsetenv usleep valloc vdprintf vfork
    vfprintf vfscanf vhangup visibility vprintf vscanf vsnprintf vsprintf vsscanf wcstoimax
    wcstombs wcstoumax wctomb write y0 y0f y0l y1 y1f y1l yn ynf ynl
    """.split()
)


# ----------------------------------------------------------------------------- polydl's own headers

_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z]\w*)", re.MULTILINE)
_PROTOTYPE = re.compile(r"^[ \t]*(?:float|double)[ \t]+([a-z]\w*)[ \t]*\(", re.MULTILINE)
# Prefixes of the C library's numeric macros: a name with one is taken for a macro the user
# expected a header to define.
_LIBRARY_PREFIXES = ("M_", "FLT_", "DBL_", "LDBL_", "HUGE_", "MAXFLOAT")


@dataclass(frozen=True)
class StandIn:
    """What one of polydl's stand-in headers defines (macros, include guards left out) and
    declares (the math functions, float and double forms)."""

    header: str  # "math.h"
    macros: tuple[str, ...]
    functions: tuple[str, ...]


@functools.cache
def stand_ins() -> dict[str, StandIn]:
    """polydl's stand-in headers by name, read from `c_include/`."""
    out = {}
    for path in sorted(STAND_IN_HEADERS.glob("*.h")):
        text = path.read_text(encoding="utf-8")
        macros = tuple(m for m in _DEFINE.findall(text) if not m.startswith("POLYDL_"))
        out[path.name] = StandIn(path.name, macros, tuple(_PROTOTYPE.findall(text)))
    return out


def is_stand_in(file: str) -> bool:
    """Whether a position's file is one of polydl's stand-in headers."""
    return Path(file).parent == STAND_IN_HEADERS


def defining_header(name: str) -> str | None:
    """The stand-in header that defines the macro `name`, or None."""
    return next((h.header for h in stand_ins().values() if name in h.macros), None)


def math_functions_listed() -> str:
    """The math functions polydl's <math.h> declares, for a message."""
    declared = {f for h in stand_ins().values() for f in h.functions}
    floats = [f for f in sorted(declared) if f.endswith("f") and f[:-1] in declared]
    return f"{', '.join(floats)} (each also in its double form without 'f')"


def macros_listed() -> str:
    """The macros polydl's stand-in headers define, for a message."""
    headers = sorted(stand_ins().values(), key=lambda h: (h.header != "math.h", h.header))
    return "; ".join(f"<{h.header}> defines {', '.join(h.macros)}" for h in headers if h.macros)


def undeclared_hint(name: str, files: Iterable[str]) -> str | None:
    """Why `name` may be undeclared where the user expected a C header to declare it: the
    stand-in header that defines it was not included (`files`: those the spec read), or polydl's
    stand-ins do not have it. None for a name no header is expected to declare."""
    included = {Path(f).name for f in files if is_stand_in(f)}
    header = defining_header(name)
    if header is not None and header not in included:
        return f"it is defined in <{header}> (polydl's own stand-in): add #include <{header}>"
    if name in MACROS or name in FUNCTIONS or name in TYPES or name.startswith(_LIBRARY_PREFIXES):
        return ("polydl's headers are its own stand-ins, not the C library's, and do not "
                f"define it; {macros_listed()}")
    return None
