/* trtspec's argv shim: keeps secrets off tritonserver's command line (docs/security.md).

   Triton 2.51 reads restricted-API keys only from its arguments (--http-restricted-api=APIS:KEY=VALUE,
   --grpc-restricted-protocol=...), and /proc/<pid>/cmdline shows every process's arguments to every
   local user. The launcher therefore writes each such argument as a placeholder

       --http-restricted-api=@trtspec@model-repository,...:trtspec-admin-key={TRTSPEC_LAUNCH_SECRET}

   and preloads this library (LD_PRELOAD). glibc calls an ELF constructor with (argc, argv, envp),
   the same argv array main() later gets: for each argument holding "=@trtspec@", the pointer in that
   array is replaced by a heap copy without the marker and with every {NAME} replaced by the value of
   the environment variable NAME. main() parses the real values; /proc/<pid>/cmdline still reads the
   original strings on the stack, which hold only the placeholder.

   Fail-closed: an unreplaced placeholder is not a valid restricted-API rule ("@trtspec@model-repository"
   is no API), so a tritonserver started without this library refuses to start; a variable that is
   unset or empty stops the process here (exit 78). Only a process whose argv[0] is tritonserver is
   touched (mpirun, the python stubs and the probes may carry the same LD_PRELOAD).

   Build: gcc -shared -fPIC -O2 -o libtrtspec_argv.so argv_secrets.c (trtspec.triton.access.argv_shim). */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MARK "=@trtspec@"
#define EX_CONFIG 78

static void fail(const char *what, const char *name) {
    fprintf(stderr, "trtspec argv shim: %s%s; refusing to start tritonserver with a placeholder secret\n", what,
            name ? name : "");
    _exit(EX_CONFIG);
}

/* length of NAME when p is "{NAME}" with NAME of [A-Z][A-Z0-9_]* (at most 127 characters), else 0 */
static size_t name_at(const char *p) {
    if (p[0] != '{' || !(p[1] >= 'A' && p[1] <= 'Z')) return 0;
    size_t n = 1;
    while ((p[1 + n] >= 'A' && p[1 + n] <= 'Z') || (p[1 + n] >= '0' && p[1 + n] <= '9') || p[1 + n] == '_') n++;
    return p[1 + n] == '}' && n < 128 ? n : 0;
}

static const char *value_of(const char *p, size_t n) {
    char name[128];
    memcpy(name, p + 1, n);
    name[n] = '\0';
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') fail("the environment has no value for ", name);
    return v;
}

/* arg with MARK dropped and each {NAME} replaced by getenv(NAME); NULL when arg has no MARK */
static char *fill(const char *arg) {
    const char *mark = strstr(arg, MARK);
    if (mark == NULL) return NULL;
    size_t head = (size_t)(mark - arg) + 1; /* keep "--flag=" */
    const char *rest = mark + strlen(MARK);
    size_t cap = head + strlen(rest) + 1, n;
    for (const char *p = rest; *p; p++) /* room for the values */
        if ((n = name_at(p)) != 0) cap += strlen(value_of(p, n));
    char *out = malloc(cap);
    if (out == NULL) fail("out of memory", NULL);
    memcpy(out, arg, head);
    char *o = out + head;
    for (const char *p = rest; *p;) {
        if ((n = name_at(p)) != 0) {
            const char *v = value_of(p, n);
            size_t vl = strlen(v);
            memcpy(o, v, vl);
            o += vl;
            p += n + 2;
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
}

__attribute__((constructor)) static void trtspec_fill_argv(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc < 1 || argv == NULL || argv[0] == NULL) return;
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (strcmp(base, "tritonserver") != 0) return;
    for (int i = 1; i < argc && argv[i] != NULL; i++) {
        char *filled = fill(argv[i]);
        if (filled != NULL) argv[i] = filled; /* the array main() gets; the stack string stays */
    }
}
