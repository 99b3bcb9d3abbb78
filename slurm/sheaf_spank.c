/*
 * sheaf_spank.so: sheaf images and software pools in Slurm jobs (docs/slurm.md).
 *
 *   srun|sbatch|salloc --sheaf=IMAGE[:DEST][,IMAGE2[:DEST2]...]
 *   srun|sbatch|salloc --sheaf-pool=NAME/VERSION[,...]
 *
 * plugstack.conf:
 *   optional /usr/lib/sheaf/sheaf_spank.so sheaf=/usr/bin/sheaf \
 *       config=/etc/sheaf/config.toml pools=/shared/pools cache_dir=/local/sheaf-cache-%u \
 *       proxy=http://squid.site:3128 \
 *       mode=lazy timeout=300
 *
 * (mode=bcast bcast_dir=/var/lib/sheaf/bcast: a multi-node step's first node
 * reads each image file once and sbcast sends it to the step's nodes, which
 * mount their own copies.)
 *
 * On each node of a step, slurmstepd (root, before any task exists) forks one
 * holder process. The holder makes a mount namespace of its own (mounts below
 * it propagate to nobody: MS_SLAVE), puts a small tmpfs owned by the job's user
 * at each DEST, and, as the job's user, runs `sheaf mount --request -` with a
 * typed MountRequest (JSON, sheaf_mount::request) on its standard input for
 * each image: one serving process per image per node, which checks the site's
 * signature policy (SHEAF_CONFIG) before mounting. Every task then joins that
 * namespace (setns, in slurm_spank_task_init_privileged) and sees the images
 * read-only at DEST; no other process of the node does.
 *
 * The holder waits on a pipe from slurmstepd: when the step ends, is cancelled
 * or times out, slurm_spank_exit closes it (and when slurmstepd dies, the
 * kernel does), and the holder unmounts (`sheaf umount`, which waits for the
 * serving process), kills whatever is left below it (it is their subreaper)
 * and exits; the namespace goes with the last process in it.
 *
 * With scope=job the job's prolog starts the holder instead (setsid: it
 * outlives the prolog and belongs to no step), records it in state_dir, every
 * step's tasks join it, and the job's epilog ends it with SIGTERM.
 *
 * A failure (no such image, a signature the policy refuses, a bad option) is
 * one line on the task's standard error, "sheaf: error: ...", and the task
 * exits with status 125 (docs/slurm.md); nothing runs.
 *
 * slurmstepd is threaded: everything the children need is prepared before
 * fork, and the holder uses system calls and what glibc's fork makes safe in
 * the child (its malloc and stdio locks are reset there): formatting,
 * directory listing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include <slurm/spank.h>

SPANK_PLUGIN(sheaf, 1);


/* The exit status of a task whose images could not be mounted. */
#define SHEAF_FAILED 125
#define MAX_MOUNTS 32
#define MAX_MSG 1024
/* mode=bcast: how long a node waits for the first node's probe. */
#define PROBE_WAIT 30

struct mnt {
    char *source; /* as the user named it */
    char *dest;   /* absolute, normalised */
    char *stage;  /* DEST/.sheaf-mount: where sheaf mounts before the move */
    char *json;   /* the MountRequest (at stage) */
    char *copy;   /* mode=bcast: the node-local copy mounted instead of source */
    int sig;      /* mode=bcast: source has a detached SOURCE.sig to send too */
};

static char *opt_images, *opt_pools;
static char *cfg_proxy; /* the request's proxy list (it may hold credentials) */
static char *cfg_sheaf, *cfg_config, *cfg_cache_dir, *cfg_pools, *cfg_pool_mounts = "/sheaf/pools";
static int cfg_timeout = 300;
/* scope=job: one namespace and serving processes per job and node, made by
 * the job's prolog and shared by all its steps, ended by its epilog. */
static int cfg_job_scope;
static char *cfg_state_dir = "/run/sheaf-slurm";
/* mode=bcast: a multi-node step's first node reads each image on shared
 * storage once and Slurm's sbcast sends it to the step's nodes, into
 * bcast_dir/JOB.STEP (the user's, 0700, in a directory only root writes);
 * every node mounts its own copy, removed at the step's end. */
static int cfg_bcast;
static char *cfg_bcast_dir = "/var/lib/sheaf/bcast", *cfg_sbcast = "/usr/bin/sbcast";
static int bcast_fd = -1;   /* bcast_dir, opened as root-owned and checked */
static int step_fd = -1;    /* bcast_dir/JOB.STEP */
static char step_name[64];  /* JOB.STEP */
static char step_dir[PATH_MAX];
static char step_arg[64];   /* --jobid=JOB.STEP */
static uint32_t node_id;
static int nbcast;
static int holder_owned; /* this process started it (step scope) */
static struct mnt mnts[MAX_MOUNTS];
static int nmnts;
static char modulepath[8192];
static char failure[MAX_MSG]; /* set: every task prints it and fails */
static pid_t holder = -1;
static int ctl_fd = -1;

static int cb_images(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    free(opt_images);
    opt_images = strdup(arg ? arg : "");
    return 0;
}

static int cb_pools(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    free(opt_pools);
    opt_pools = strdup(arg ? arg : "");
    return 0;
}

/* Registered in slurm_spank_init: sbatch and salloc see only what is
 * registered there (the spank_options table reaches srun alone). */
static struct spank_option options[] = {
    {"sheaf", "IMAGE[:DEST][,...]",
     "Mount sheaf images read-only for the job's tasks at DEST (default /sheaf/NAME), "
     "in a mount namespace of the job's own (docs/slurm.md)",
     1, 0, cb_images},
    {"sheaf-pool", "NAME/VERSION[,...]",
     "Mount sheaf software pools for the job's tasks, their Lmod modules on MODULEPATH",
     1, 0, cb_pools},
    SPANK_OPTIONS_TABLE_END};

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    if (failure[0])
        return; /* the first reason is the one said */
    va_start(ap, fmt);
    vsnprintf(failure, sizeof failure, fmt, ap);
    va_end(ap);
    for (char *p = failure; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

/* plugstack.conf arguments: key=value. */
static int parse_args(int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        const char *a = av[i];
        if (!strncmp(a, "sheaf=", 6))
            cfg_sheaf = strdup(a + 6);
        else if (!strncmp(a, "config=", 7))
            cfg_config = strdup(a + 7);
        else if (!strncmp(a, "proxy=", 6))
            cfg_proxy = strdup(a + 6);
        else if (!strncmp(a, "cache_dir=", 10))
            cfg_cache_dir = strdup(a + 10);
        else if (!strncmp(a, "pools=", 6))
            cfg_pools = strdup(a + 6);
        else if (!strncmp(a, "pool_mounts=", 12))
            cfg_pool_mounts = strdup(a + 12);
        else if (!strncmp(a, "timeout=", 8))
            cfg_timeout = atoi(a + 8) > 0 ? atoi(a + 8) : 300;
        else if (!strcmp(a, "scope=job"))
            cfg_job_scope = 1;
        else if (!strcmp(a, "scope=step"))
            cfg_job_scope = 0;
        else if (!strncmp(a, "state_dir=", 10))
            cfg_state_dir = strdup(a + 10);
        else if (!strcmp(a, "mode=lazy"))
            cfg_bcast = 0;
        else if (!strcmp(a, "mode=bcast"))
            cfg_bcast = 1;
        else if (!strncmp(a, "bcast_dir=", 10))
            cfg_bcast_dir = strdup(a + 10);
        else if (!strncmp(a, "sbcast=", 7))
            cfg_sbcast = strdup(a + 7);
        else {
            slurm_error("sheaf: plugstack.conf: unknown argument %s", a);
            return -1;
        }
    }
    if (cfg_bcast && cfg_job_scope) {
        /* The prologs of a job run on its nodes at once, with no first
         * node to read for the others: say so rather than read lazily
         * behind the site's back. */
        slurm_error("sheaf: plugstack.conf: mode=bcast works with scope=step (each step's "
                    "first node reads the image and sbcast sends it to the step's nodes)");
        return -1;
    }
    if (cfg_bcast_dir[0] != '/') {
        slurm_error("sheaf: plugstack.conf: bcast_dir=%s: not an absolute path", cfg_bcast_dir);
        return -1;
    }
    return 0;
}

/* A JSON string literal of s appended to out (size n). */
static int json_str(char *out, size_t n, const char *s)
{
    size_t k = strlen(out);
    if (k + 2 >= n)
        return -1;
    out[k++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        const char *e = NULL;
        if (*p == '"')
            e = "\\\"";
        else if (*p == '\\')
            e = "\\\\";
        else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            e = esc;
        }
        size_t m = e ? strlen(e) : 1;
        if (k + m + 2 >= n)
            return -1;
        if (e)
            memcpy(out + k, e, m);
        else
            out[k] = (char)*p;
        k += m;
    }
    out[k++] = '"';
    out[k] = 0;
    return 0;
}

/* The system's own directories: no image goes there or below. */
static const char *const system_dirs[] = {"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32",
                                          "/lib64", "/libx32", "/proc", "/run", "/sbin",
                                          "/sys", "/usr", "/var", NULL};

/* DEST must be absolute, with no empty, "." or ".." component, and not "/"
 * or a system directory. */
static int good_dest(const char *d)
{
    if (d[0] != '/' || d[1] == 0 || strlen(d) >= PATH_MAX / 2)
        return 0;
    for (int i = 0; system_dirs[i]; i++) {
        size_t n = strlen(system_dirs[i]);
        if (!strncmp(d, system_dirs[i], n) && (d[n] == 0 || d[n] == '/'))
            return 0;
    }
    const char *p = d;
    while (*p) {
        p++; /* past '/' */
        const char *q = strchrnul(p, '/');
        size_t len = (size_t)(q - p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        p = q;
    }
    return 1;
}

/* m's MountRequest (JSON, sheaf_mount::request) for `image` at m's stage. */
static int request(struct mnt *m, const char *image)
{
    char json[PATH_MAX * 4] = "{\"version\":1,\"images\":[{\"source\":";
    if (json_str(json, sizeof json, image) < 0) {
        fail("%s: name too long", image);
        return -1;
    }
    /* A server not reached yet (restarting as the job starts) is waited
     * for, up to sheaf's --timeout, as one lost later is. */
    strcat(json, ",\"root\":null}],\"wait_for_server\":true,\"mountpoint\":");
    if (json_str(json, sizeof json, m->stage) < 0 || strlen(json) + 2 >= sizeof json) {
        fail("%s: name too long", m->dest);
        return -1;
    }
    /* Proxies travel in the request, never on a command line or in the
     * environment of the user's processes. */
    if (cfg_proxy) {
        if (strlen(json) + 12 >= sizeof json) {
            fail("%s: name too long", m->dest);
            return -1;
        }
        strcat(json, ",\"proxy\":");
        if (json_str(json, sizeof json, cfg_proxy) < 0 || strlen(json) + 2 >= sizeof json) {
            fail("plugstack.conf: proxy= too long");
            return -1;
        }
    }
    strcat(json, "}");
    free(m->json);
    m->json = strdup(json);
    return 0;
}

static int add_mount(const char *source, const char *dest)
{
    if (nmnts == MAX_MOUNTS) {
        fail("more than %d images", MAX_MOUNTS);
        return -1;
    }
    if (!good_dest(dest)) {
        fail("%s: the mount point must be an absolute path with no '.' or '..', outside the "
             "system's directories (/etc, /usr, /var, /run, ...)", dest);
        return -1;
    }
    for (int i = 0; i < nmnts; i++)
        if (!strcmp(mnts[i].dest, dest)) {
            fail("%s: two images at one mount point", dest);
            return -1;
        }
    char stage[PATH_MAX];
    snprintf(stage, sizeof stage, "%s/.sheaf-mount", dest);
    mnts[nmnts].source = strdup(source);
    mnts[nmnts].dest = strdup(dest);
    mnts[nmnts].stage = strdup(stage);
    if (request(&mnts[nmnts], source) < 0)
        return -1;
    nmnts++;
    return 0;
}

/* IMAGE[:DEST]: DEST follows the last ':' when it starts with one '/' (so
 * https://host:8080/x and https://host/x name no DEST). */
static int parse_images(const char *spec)
{
    char *s = strdup(spec), *save = NULL;
    for (char *e = strtok_r(s, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(e, ':'), dest[PATH_MAX];
        if (colon && colon[1] == '/' && colon[2] != '/') {
            *colon = 0;
            snprintf(dest, sizeof dest, "%s", colon + 1);
        } else {
            const char *base = strrchr(e, '/');
            base = base ? base + 1 : e;
            size_t len = strlen(base);
            if (len > 6 && !strcmp(base + len - 6, ".sheaf"))
                len -= 6;
            if (len == 0) {
                fail("%s: no name to mount it under: give one (--sheaf=IMAGE:/DEST)", e);
                free(s);
                return -1;
            }
            snprintf(dest, sizeof dest, "/sheaf/%.*s", (int)len, base);
        }
        if (!*e) {
            fail("--sheaf=%s: an empty image name", spec);
            free(s);
            return -1;
        }
        if (add_mount(e, dest) < 0) {
            free(s);
            return -1;
        }
    }
    free(s);
    return 0;
}

static int good_name_part(const char *p, size_t n)
{
    if (n == 0 || p[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(((p[i] | 32) >= 'a' && (p[i] | 32) <= 'z') || (p[i] >= '0' && p[i] <= '9') ||
              strchr("._+-", p[i])))
            return 0;
    return 1;
}

/* NAME/VERSION,...: each pool mounted at POOL_MOUNTS/NAME/VERSION, its
 * modulefiles directory on MODULEPATH. */
static int parse_pools(const char *spec)
{
    char *s = strdup(spec), *save = NULL;
    for (char *e = strtok_r(s, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        char *slash = strchr(e, '/');
        if (!slash || !good_name_part(e, (size_t)(slash - e)) ||
            !good_name_part(slash + 1, strlen(slash + 1))) {
            fail("--sheaf-pool=%s: not NAME/VERSION", e);
            free(s);
            return -1;
        }
        if (!cfg_pools) {
            fail("--sheaf-pool=%s: this site has no pool location (pools= in plugstack.conf)", e);
            free(s);
            return -1;
        }
        char source[PATH_MAX], dest[PATH_MAX];
        int url = strstr(cfg_pools, "://") != NULL;
        snprintf(source, sizeof source, "%s/%s%s", cfg_pools, e, url ? "" : ".sheaf");
        snprintf(dest, sizeof dest, "%s/%s", cfg_pool_mounts, e);
        if (add_mount(source, dest) < 0) {
            free(s);
            return -1;
        }
        size_t k = strlen(modulepath);
        snprintf(modulepath + k, sizeof modulepath - k, "%s%s/modulefiles", k ? ":" : "", dest);
    }
    free(s);
    return 0;
}

/* The plugstack.conf arguments, once (the prolog and epilog get them
 * without slurm_spank_init). */
static int plugin_args(int ac, char **av)
{
    static int done, rc;
    if (done)
        return rc;
    done = 1;
    rc = parse_args(ac, av);
    /* Without sheaf=: where `make install` (/usr/local) or the package (/usr)
     * put it. */
    if (!cfg_sheaf)
        cfg_sheaf = access("/usr/bin/sheaf", X_OK) == 0 ? "/usr/bin/sheaf" : "/usr/local/bin/sheaf";
    return rc;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    for (int i = 0; options[i].name; i++)
        if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS) {
            slurm_error("sheaf: cannot register --%s", options[i].name);
            return -1;
        }
    return plugin_args(ac, av);
}

/* ---- the holder (runs after fork: see the top of this file) ------------------ */

static volatile sig_atomic_t stop;
static time_t holder_deadline; /* the holder gives up (and says why) by then */
static void on_stop(int sig) { (void)sig; stop = 1; }

static void put(int fd, const char *a, const char *b)
{
    char line[MAX_MSG + 8];
    size_t k = 0;
    for (const char *p = a; *p && k < MAX_MSG; p++)
        line[k++] = *p;
    for (const char *p = b; p && *p && k < MAX_MSG; p++)
        line[k++] = (*p == '\n') ? ' ' : *p;
    line[k++] = '\n';
    ssize_t w = write(fd, line, k);
    (void)w;
}

struct job {
    uid_t uid;
    gid_t gid;
    int ngids;
    gid_t gids[NGROUPS_MAX > 256 ? 256 : NGROUPS_MAX];
    char *envp[10];
    char env[9][PATH_MAX + 32];
};

/* Run sheaf as the job's user with `input` on standard input; its first line
 * of standard error into msg. Returns its exit status (or -1). A program
 * still running at `until` (or, when `stoppable`, when the holder is told to
 * stop) is killed: a user's program (sbcast reading a file of theirs that
 * never answers) cannot keep the holder past its deadline. */
static int as_user_until(const struct job *j, char *const argv[], const char *input, char *msg,
                         size_t n, time_t until, int stoppable)
{
    int in[2], err[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
        return -1;
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        dup2(in[0], 0);
        dup2(err[1], 2);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        if (setgroups((size_t)j->ngids, j->gids) < 0 || setresgid(j->gid, j->gid, j->gid) < 0 ||
            setresuid(j->uid, j->uid, j->uid) < 0)
            _exit(126);
        if (chdir("/") < 0)
            _exit(126);
        signal(SIGPIPE, SIG_DFL);
        execve(argv[0], argv, j->envp);
        _exit(127);
    }
    close(in[0]);
    close(err[1]);
    if (input) {
        size_t len = strlen(input), off = 0;
        while (off < len) {
            ssize_t w = write(in[1], input + off, len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
    }
    close(in[1]);
    int st = 0;
    for (;;) {
        pid_t w = waitpid(p, &st, WNOHANG);
        if (w == p || (w < 0 && errno != EINTR))
            break;
        if ((stoppable && stop) || time(NULL) >= until) {
            kill(p, SIGKILL);
            while (waitpid(p, &st, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        usleep(10000);
    }
    /* The serving process may keep the pipe open: read what is there. */
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    ssize_t r = read(err[0], msg, n - 1);
    msg[r > 0 ? r : 0] = 0;
    char *nl = strchr(msg, '\n');
    if (nl)
        *nl = 0;
    close(err[0]);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127 && !msg[0]) {
        size_t k = 0;
        for (const char *q = argv[0]; *q && k + 32 < n; q++)
            msg[k++] = *q;
        msg[k] = 0;
        strncat(msg, ": cannot be run", n - k - 1);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* As the user, until the holder's deadline or its stop. */
static int as_user(const struct job *j, char *const argv[], const char *input, char *msg, size_t n)
{
    return as_user_until(j, argv, input, msg, n, holder_deadline, 1);
}

/* Kill and reap every child left (we are their subreaper). */
static void kill_children(void)
{
    char path[300], buf[512];
    pid_t me = getpid();
    DIR *d = opendir("/proc");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] < '0' || e->d_name[0] > '9')
                continue;
            snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t r = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (r <= 0)
                continue;
            buf[r] = 0;
            char *rp = strrchr(buf, ')');
            int ppid = 0;
            if (rp && sscanf(rp + 2, "%*c %d", &ppid) == 1 && ppid == me)
                kill(atoi(e->d_name), SIGKILL);
        }
        closedir(d);
    }
    while (waitpid(-1, NULL, WNOHANG) > 0 || (errno == EINTR))
        ;
    /* A child killed just now may need a moment to be reaped. */
    for (int i = 0; i < 50 && waitpid(-1, NULL, WNOHANG) >= 0; i++)
        usleep(10000);
}

/* snprintf that may cut the message short (a line says enough). */
static void say(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
}

/* Open NAME below dirfd as a directory, never through a symbolic link nor
 * into another file system (a FUSE mount of the user's in their directory:
 * root would wait on its server), where the kernel can say so (openat2,
 * Linux 5.6). */
static int open_below(int dirfd, const char *name)
{
#ifdef SYS_openat2
    struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                           .resolve = RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, dirfd, name, &how, sizeof how);
    if (fd >= 0 || (errno != ENOSYS && errno != EINVAL))
        return fd;
#endif
    return openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* Remove NAME below dirfd and everything in it (what the user put in a
 * directory of theirs), never following a link out of it. Each directory is
 * made root's, 0700, before it is listed, so a process of the user's still
 * holding it cannot add to it while it empties; `budget` bounds the
 * entries removed (what is left, the epilog's sweep tries again). */
static void remove_tree(int dirfd, const char *name, int depth, long *budget)
{
    int fd = open_below(dirfd, name);
    if (fd >= 0) {
        if (fchown(fd, 0, 0) < 0 || fchmod(fd, 0700) < 0) {
            /* Removed all the same, as far as root may. */
        }
        DIR *d = fdopendir(fd);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)) && --*budget > 0) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                    continue;
                if (unlinkat(fd, e->d_name, 0) < 0 && errno == EISDIR && depth < 64)
                    remove_tree(fd, e->d_name, depth + 1, budget);
            }
            closedir(d);
        } else
            close(fd);
    }
    if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno == ENOTDIR)
        unlinkat(dirfd, name, 0);
}

/* remove_tree with the budget one step's directory gets. */
static void remove_step_dir(int dirfd, const char *name)
{
    long budget = 1000000;
    remove_tree(dirfd, name, 0, &budget);
}

/* mode=bcast, the step's first node: write `text` to NAME.src in the step's
 * directory (the user's: a new file, never through a link) for sbcast to
 * send as NAME. */
static int marker(const struct job *j, const char *name, const char *text)
{
    char src[80];
    snprintf(src, sizeof src, "%s.src", name);
    unlinkat(step_fd, src, 0);
    int fd = openat(step_fd, src, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n && fchown(fd, j->uid, j->gid) == 0;
    close(fd);
    return ok ? 0 : -1;
}

/* sbcast SRC to DEST on every node of the step, as the user. On failure msg
 * says why, in one line: "[SUBJECT: ]sbcast to the step's nodes: WHY". */
static int sbcast(const struct job *j, const char *subject, const char *src, const char *dest,
                  char *msg, size_t n)
{
    char *argv[] = {cfg_sbcast, "--force", step_arg, (char *)src, (char *)dest, NULL};
    char why[MAX_MSG];
    int rc = as_user(j, argv, NULL, why, sizeof why);
    if (rc != 0) {
        const char *w = why;
        if (!strncmp(w, "sbcast: error: ", 15))
            w += 15;
        say(msg, n, "%s%ssbcast to the step's nodes: %s", subject ? subject : "",
            subject ? ": " : "", w[0] ? w : "failed");
    }
    return rc;
}

/* The step's first node sends each image (and its detached signature) to
 * the step's nodes, then a marker saying OK or why not. Returns 0 or -1
 * with msg set. */
static int send_copies(const struct job *j, time_t deadline, char *msg, size_t n)
{
    char src[PATH_MAX + 16], dest[PATH_MAX + 16];
    int rc = 0;
    /* Every node makes its directory as its step starts: until all have,
     * a tiny probe is refused somewhere; nothing of the image is read
     * before it passes. */
    snprintf(src, sizeof src, "%s/probe.src", step_dir);
    snprintf(dest, sizeof dest, "%s/probe", step_dir);
    if (marker(j, "probe", "sheaf\n") < 0) {
        say(msg, n, "%s: %s", src, strerror(errno));
        return -1;
    }
    while (sbcast(j, NULL, src, dest, msg, n) != 0) {
        if (stop || time(NULL) >= deadline) {
            rc = -1;
            break;
        }
        usleep(100000);
    }
    for (int i = 0; rc == 0 && i < nmnts; i++) {
        if (!mnts[i].copy)
            continue;
        if (sbcast(j, mnts[i].source, mnts[i].source, mnts[i].copy, msg, n) != 0) {
            rc = -1;
            break;
        }
        if (mnts[i].sig) {
            snprintf(src, sizeof src, "%s.sig", mnts[i].source);
            snprintf(dest, sizeof dest, "%s.sig", mnts[i].copy);
            if (sbcast(j, src, src, dest, msg, n) != 0) {
                rc = -1;
                break;
            }
        }
    }
    /* The others wait for this marker: OK, or E and the reason. */
    char text[MAX_MSG + 8], why[MAX_MSG];
    snprintf(text, sizeof text, "%s%s\n", rc == 0 ? "OK" : "E", rc == 0 ? "" : msg);
    snprintf(src, sizeof src, "%s/done.src", step_dir);
    snprintf(dest, sizeof dest, "%s/done", step_dir);
    if (marker(j, "done", text) < 0 || sbcast(j, NULL, src, dest, why, sizeof why) != 0) {
        if (rc == 0)
            say(msg, n, "%s", why);
        return -1;
    }
    return rc;
}

/* Every node: wait for the first node's marker. Returns 0 (the copies are
 * here) or -1 with msg set. */
static int wait_copies(const struct job *j, time_t deadline, char *msg, size_t n)
{
    char text[MAX_MSG + 8];
    /* The probe comes within seconds of the step's start when sbcast works
     * at all; when it does not, the first node's tasks say why and the
     * others do not wait out the whole timeout. */
    time_t probe_deadline = time(NULL) + PROBE_WAIT;
    int probed = 0;
    for (;;) {
        if (!probed && faccessat(step_fd, "probe", F_OK, AT_SYMLINK_NOFOLLOW) == 0)
            probed = 1;
        if (!probed && time(NULL) >= probe_deadline && time(NULL) < deadline) {
            say(msg, n, "nothing came from the step's first node within %d s: sbcast from it "
                "failed (its tasks say why)", PROBE_WAIT);
            return -1;
        }
        /* Root reads it only as what sbcast makes: a plain file of the
         * user's with one link (never a FIFO to block on, nor a link to a
         * file the user may not read). */
        int fd = openat(step_fd, "done", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != j->uid ||
                        st.st_nlink != 1)) {
            close(fd);
            say(msg, n, "%s/done: not a file sbcast made: refused", step_dir);
            return -1;
        }
        if (fd >= 0) {
            ssize_t r = read(fd, text, sizeof text - 1);
            close(fd);
            text[r > 0 ? r : 0] = 0;
            char *nl = strchr(text, '\n');
            if (nl) {
                *nl = 0;
                if (!strcmp(text, "OK"))
                    return 0;
                say(msg, n, "%s", text[0] == 'E' ? text + 1 : text);
                return -1;
            }
        }
        if (stop || time(NULL) >= deadline) {
            say(msg, n, "the images from the step's first node did not arrive within %d s "
                     "(mode=bcast, timeout= in plugstack.conf)", cfg_timeout);
            return -1;
        }
        usleep(50000);
    }
}

/* The tmpfs root at each DEST, by descriptor (-1: not mounted). */
static int dest_fd[MAX_MOUNTS];

static void fd_path(char *out, size_t n, int fd)
{
    snprintf(out, n, "/proc/self/fd/%d", fd);
}

static void teardown(const struct job *j, int done)
{
    char msg[MAX_MSG], path[64];
    for (int i = done - 1; i >= 0; i--) {
        char *argv[] = {cfg_sheaf, "umount", mnts[i].dest, NULL};
        as_user_until(j, argv, NULL, msg, sizeof msg, time(NULL) + 30, 0);
    }
    /* What is left (a serving process that would not end, the tmpfs), by
     * descriptor: never a mount a path the user controls leads to. */
    for (int i = nmnts - 1; i >= 0; i--)
        if (dest_fd[i] >= 0) {
            fd_path(path, sizeof path, dest_fd[i]);
            umount2(path, MNT_DETACH);
        }
    kill_children();
    if (step_fd >= 0)
        remove_step_dir(bcast_fd, step_name);
}

/* DEST, walked from "/" one name at a time by descriptor, never through a
 * symbolic link (O_NOFOLLOW with O_DIRECTORY refuses one), so no path the
 * user swaps under us leads root elsewhere; a missing directory is made
 * (root's, 0755: it may stay on the node, see docs) only in a directory of
 * root's or the job user's. */
static int open_dest(const struct job *j, const char *dest)
{
    int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const char *p = dest;
    while (fd >= 0 && *p) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *q = strchrnul(p, '/');
        char name[NAME_MAX + 1];
        if ((size_t)(q - p) > NAME_MAX) {
            close(fd);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(name, p, (size_t)(q - p));
        name[q - p] = 0;
        int next = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT) {
            struct stat st;
            if (fstat(fd, &st) < 0 || (st.st_uid != 0 && st.st_uid != j->uid)) {
                close(fd);
                errno = EACCES;
                return -1;
            }
            if (mkdirat(fd, name, 0755) == 0 || errno == EEXIST)
                next = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        int e = errno;
        close(fd);
        errno = e;
        fd = next;
        p = q;
    }
    return fd;
}

/* A tmpfs of the user's at DEST (mounted on the directory open_dest found,
 * by descriptor) with DEST/.sheaf-mount in it, the user's: where sheaf
 * mounts (fusermount3 mounts only on a directory of the user's) before the
 * mount moves onto DEST. Sets dest_fd[i] to the tmpfs's root. */
static int make_dest(const struct job *j, int i, const char *opts)
{
    char path[64];
    int d = open_dest(j, mnts[i].dest);
    if (d < 0)
        return -1;
    struct stat under;
    fd_path(path, sizeof path, d);
    if (fstat(d, &under) < 0 || mount("sheaf-slurm", path, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
        int e = errno;
        close(d);
        errno = e;
        return -1;
    }
    close(d);
    /* The tmpfs's root: DEST walked again crosses into it. Anything else
     * (the user swapped a directory meanwhile) is refused: a new file
     * system, a tmpfs, the user's. */
    int t = open_dest(j, mnts[i].dest);
    struct stat st;
    struct statfs sf;
    if (t < 0)
        return -1;
    dest_fd[i] = t;
    if (fstat(t, &st) < 0 || fstatfs(t, &sf) < 0 || sf.f_type != TMPFS_MAGIC ||
        st.st_dev == under.st_dev || st.st_uid != j->uid) {
        errno = EXDEV;
        return -1;
    }
    int s = -1;
    if (mkdirat(t, ".sheaf-mount", 0755) < 0 ||
        (s = openat(t, ".sheaf-mount", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fchown(s, j->uid, j->gid) < 0) {
        int e = errno;
        if (s >= 0)
            close(s);
        errno = e;
        return -1;
    }
    close(s);
    return 0;
}

/* The mount sheaf made at DEST/.sheaf-mount moved onto the tmpfs at DEST,
 * both by descriptor. */
static int move_to_dest(int i)
{
    char from[64], to[64];
    int m = openat(dest_fd[i], ".sheaf-mount", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (m < 0)
        return -1;
    fd_path(from, sizeof from, m);
    fd_path(to, sizeof to, dest_fd[i]);
    int rc = mount(from, to, NULL, MS_MOVE, NULL);
    int e = errno;
    close(m);
    errno = e;
    return rc;
}

static void holder_main(struct job *j, int status, int ctl)
{
    char msg[MAX_MSG], opts[64];
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL); /* waitpid must see our children's status */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* Nothing of slurmstepd's (its sockets, its pipes to srun) stays open
     * in the holder or the serving processes. */
    int fds[4] = {status, ctl, bcast_fd, step_fd};
    for (int k = 0; k < 4; k++)
        if (fds[k] >= 0 && ((fds[k] = fcntl(fds[k], F_DUPFD_CLOEXEC, 100)) < 0 || dup2(fds[k], 3 + k) < 0)) {
            put(status, "Edup2: ", strerror(errno));
            _exit(1);
        }
    status = 3;
    ctl = 4;
    bcast_fd = bcast_fd >= 0 ? 5 : -1;
    step_fd = step_fd >= 0 ? 6 : -1;
    for (int k = 3; k < 7; k++)
        fcntl(k, F_SETFD, FD_CLOEXEC);
    close_range(7, ~0U, 0);
    /* Nor the standard streams (the prolog's may be a pipe someone reads
     * to its end). */
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (null > 4)
            close(null);
    }
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
        put(status, "Ea private mount namespace: ", strerror(errno));
        _exit(1);
    }
    snprintf(opts, sizeof opts, "size=64k,mode=0755,uid=%u,gid=%u", (unsigned)j->uid, (unsigned)j->gid);
    for (int i = 0; i < nmnts; i++)
        dest_fd[i] = -1;
    for (int i = 0; i < nmnts; i++) {
        /* sheaf mounts on a directory of the user's (fusermount3's rule)
         * that is not a mount point (sheaf's): DEST/.sheaf-mount on a tmpfs
         * of the user's at DEST; then the mount moves onto DEST. */
        if (make_dest(j, i, opts) < 0) {
            char why[PATH_MAX + 128];
            snprintf(why, sizeof why, "E%s: %s (a directory, no symbolic link on the way)",
                     mnts[i].dest, strerror(errno));
            put(status, why, "");
            teardown(j, 0);
            _exit(1);
        }
    }
    if (nbcast) {
        int rc = node_id == 0 ? send_copies(j, holder_deadline, msg, sizeof msg)
                              : wait_copies(j, holder_deadline, msg, sizeof msg);
        if (rc < 0) {
            put(status, "E", msg);
            teardown(j, 0);
            _exit(1);
        }
    }
    for (int i = 0; i < nmnts; i++) {
        char *argv[] = {cfg_sheaf, "mount", "--request", "-", NULL};
        int rc = as_user(j, argv, mnts[i].json, msg, sizeof msg);
        if (rc != 0 || stop) {
            const char *m = msg;
            char shown[MAX_MSG + PATH_MAX];
            if (!strncmp(m, "sheaf: error: ", 14))
                m += 14;
            else if (!strncmp(m, "sheaf: ", 7))
                m += 7;
            /* A node's copy is named as the user named the image. */
            size_t c = mnts[i].copy ? strlen(mnts[i].copy) : 0;
            if (c && !strncmp(m, mnts[i].copy, c)) {
                snprintf(shown, sizeof shown, "%s%s", mnts[i].source, m + c);
                m = shown;
            }
            put(status, "E", m[0] ? m : "sheaf mount failed");
            teardown(j, i);
            _exit(1);
        }
        if (move_to_dest(i) < 0) {
            put(status, "Emoving the mount onto ", mnts[i].dest);
            teardown(j, i + 1);
            _exit(1);
        }
    }
    put(status, "OK", "");
    close(status);
    /* Until slurmstepd closes the pipe (the step's end, or its death) or a
     * signal says stop; in job scope, until the epilog's SIGTERM. */
    char c;
    while (!stop) {
        if (cfg_job_scope) {
            pause();
            continue;
        }
        ssize_t r = read(ctl, &c, 1);
        if (r == 0 || (r < 0 && errno != EINTR))
            break;
    }
    teardown(j, nmnts);
    _exit(0);
}

/* ---- slurmstepd ----------------------------------------------------------- */

/* bcast_dir, opened: root's, written by root alone, never reached through a
 * symbolic link (another user may have made one there first). -1 if not. */
static int open_bcast_dir(void)
{
    struct stat st;
    int fd = open(cfg_bcast_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_uid != 0 || (st.st_mode & 022))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* mode=bcast, in slurmstepd as root before the holder exists: which images
 * travel (regular files, in a step of more than one node), this node's
 * directory for them (bcast_dir/JOB.STEP, the user's, 0700) and each
 * request naming the node's copy. */
static int prepare_bcast(spank_t sp, const struct job *j)
{
    uint32_t job = 0, step = 0, nnodes = 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_NODEID, &node_id) != ESPANK_SUCCESS) {
        fail("mode=bcast: cannot learn the step's id and nodes");
        return -1;
    }
    if (nnodes < 2)
        return 0; /* one node reads what it needs, lazily */
    /* Which images are files, and which have a detached signature: looked
     * at with the user's file-system identity (this thread's alone), so
     * root's view of files the user may not see tells them nothing. */
    struct stat st;
    int travels[MAX_MOUNTS] = {0}, sig[MAX_MOUNTS] = {0};
    setfsgid(j->gid);
    setfsuid(j->uid);
    for (int i = 0; i < nmnts; i++) {
        char path[PATH_MAX + 8];
        travels[i] = !strstr(mnts[i].source, "://") && stat(mnts[i].source, &st) == 0 &&
                     S_ISREG(st.st_mode);
        snprintf(path, sizeof path, "%s.sig", mnts[i].source);
        sig[i] = travels[i] && stat(path, &st) == 0 && S_ISREG(st.st_mode);
        nbcast += travels[i];
    }
    setfsuid(0);
    setfsgid(0);
    if (!nbcast)
        return 0; /* URLs go through the node cache and the site's proxies */
    /* bcast_dir and its parent are made if missing (/var/lib/sheaf on a
     * new node). */
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", cfg_bcast_dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        if (mkdir(parent, 0755) < 0 && errno != EEXIST) {
            fail("bcast_dir %s: %s", cfg_bcast_dir, strerror(errno));
            return -1;
        }
    }
    if (mkdir(cfg_bcast_dir, 0711) < 0 && errno != EEXIST) {
        fail("bcast_dir %s: %s", cfg_bcast_dir, strerror(errno));
        return -1;
    }
    if ((bcast_fd = open_bcast_dir()) < 0) {
        fail("bcast_dir %s: not a directory of root's that only root may write: refused",
             cfg_bcast_dir);
        return -1;
    }
    snprintf(step_name, sizeof step_name, "%u.%u", (unsigned)job, (unsigned)step);
    snprintf(step_arg, sizeof step_arg, "--jobid=%u.%u", (unsigned)job, (unsigned)step);
    snprintf(step_dir, sizeof step_dir, "%s/%s", cfg_bcast_dir, step_name);
    remove_step_dir(bcast_fd, step_name); /* a killed step's, if any */
    if (mkdirat(bcast_fd, step_name, 0700) < 0 ||
        (step_fd = openat(bcast_fd, step_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fchown(step_fd, j->uid, j->gid) < 0) {
        fail("%s: %s", step_dir, strerror(errno));
        return -1;
    }
    /* Named by the image's place in the option: a node that judged an
     * image otherwise never mounts another image's copy. */
    for (int i = 0; i < nmnts; i++) {
        if (!travels[i])
            continue;
        char copy[PATH_MAX + 32];
        snprintf(copy, sizeof copy, "%s/%d.sheaf", step_dir, i);
        mnts[i].copy = strdup(copy);
        mnts[i].sig = sig[i];
        if (request(&mnts[i], copy) < 0)
            return -1;
    }
    return 0;
}

static int start_holder(spank_t sp)
{
    static struct job j;
    int n = 0;
    gid_t *gids = NULL;
    if (spank_get_item(sp, S_JOB_UID, &j.uid) != ESPANK_SUCCESS) {
        fail("cannot learn the job's user");
        return -1;
    }
    struct passwd *pw = getpwuid(j.uid);
    if (spank_get_item(sp, S_JOB_GID, &j.gid) != ESPANK_SUCCESS) {
        /* The prolog has no group: the user's own. */
        if (!pw) {
            fail("uid %u: no such user on this node", (unsigned)j.uid);
            return -1;
        }
        j.gid = pw->pw_gid;
    }
    if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &n) == ESPANK_SUCCESS && gids) {
        if (n > (int)(sizeof j.gids / sizeof j.gids[0]))
            n = (int)(sizeof j.gids / sizeof j.gids[0]);
        memcpy(j.gids, gids, (size_t)n * sizeof(gid_t));
        j.ngids = n;
    } else if (pw) {
        n = (int)(sizeof j.gids / sizeof j.gids[0]);
        if (getgrouplist(pw->pw_name, j.gid, j.gids, &n) < 0)
            n = 0;
        j.ngids = n;
    }
    int e = 0;
    snprintf(j.env[e++], sizeof j.env[0], "PATH=/usr/local/bin:/usr/bin:/bin");
    snprintf(j.env[e++], sizeof j.env[0], "HOME=%s", pw ? pw->pw_dir : "/");
    snprintf(j.env[e++], sizeof j.env[0], "USER=%s", pw ? pw->pw_name : "");
    snprintf(j.env[e++], sizeof j.env[0], "LOGNAME=%s", pw ? pw->pw_name : "");
    /* The site's policy, never the user's: SHEAF_CONFIG is set (or not) here. */
    if (cfg_config)
        snprintf(j.env[e++], sizeof j.env[0], "SHEAF_CONFIG=%s", cfg_config);
    /* The node cache: cache_dir= with %u the job's uid (one per user: a
     * cache is trusted by whoever reads through it). */
    if (cfg_cache_dir) {
        char dir[PATH_MAX] = "";
        size_t k = 0;
        for (const char *p = cfg_cache_dir; *p && k < sizeof dir - 16; p++) {
            if (p[0] == '%' && p[1] == 'u') {
                k += (size_t)snprintf(dir + k, sizeof dir - k, "%u", (unsigned)j.uid);
                p++;
            } else
                dir[k++] = *p;
        }
        dir[k] = 0;
        snprintf(j.env[e++], sizeof j.env[0], "SHEAF_CACHE_DIR=%s", dir);
    }
    /* sbcast finds the cluster as slurmstepd did. */
    const char *conf = getenv("SLURM_CONF");
    if (cfg_bcast && conf)
        snprintf(j.env[e++], sizeof j.env[0], "SLURM_CONF=%s", conf);
    for (int i = 0; i < e; i++)
        j.envp[i] = j.env[i];
    j.envp[e] = NULL;
    if (cfg_bcast && !cfg_job_scope && prepare_bcast(sp, &j) < 0)
        return -1;

    int st[2], ctl[2];
    if (pipe2(st, O_CLOEXEC) < 0 || pipe2(ctl, O_CLOEXEC) < 0) {
        fail("pipe: %s", strerror(errno));
        return -1;
    }
    holder_deadline = time(NULL) + (cfg_timeout > 4 ? cfg_timeout - 2 : cfg_timeout);
    pid_t p = fork();
    if (p < 0) {
        fail("fork: %s", strerror(errno));
        return -1;
    }
    if (p == 0) {
        close(st[0]);
        close(ctl[1]);
        if (cfg_job_scope)
            setsid(); /* outlives the prolog, in no step */
        holder_main(&j, st[1], ctl[0]);
        _exit(1);
    }
    close(st[1]);
    close(ctl[0]);
    /* Its first line: OK, or E and why. */
    char line[MAX_MSG + 8];
    size_t k = 0;
    time_t deadline = time(NULL) + cfg_timeout;
    while (k < sizeof line - 1) {
        struct pollfd pf = {st[0], POLLIN, 0};
        int left = (int)(deadline - time(NULL));
        if (left <= 0)
            break;
        int r = poll(&pf, 1, left * 1000);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        ssize_t m = read(st[0], line + k, 1);
        if (m <= 0)
            break;
        if (line[k] == '\n')
            break;
        k++;
    }
    line[k] = 0;
    close(st[0]);
    if (!strcmp(line, "OK")) {
        holder = p;
        holder_owned = 1;
        ctl_fd = ctl[1];
        return 0;
    }
    close(ctl[1]);
    kill(p, SIGTERM);
    for (int i = 0; i < 300 && waitpid(p, NULL, WNOHANG) == 0; i++)
        usleep(100000);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    if (line[0] == 'E')
        fail("%s", line + 1);
    else
        fail("the images were not mounted within %d s (timeout= in plugstack.conf)", cfg_timeout);
    return -1;
}

/* ---- job scope: the prolog makes, the steps join, the epilog ends --------- */

static int state_path(spank_t sp, char *out, size_t n)
{
    uint32_t job = 0;
    char host[256] = "";
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
        return -1;
    gethostname(host, sizeof host - 1);
    snprintf(out, n, "%s/%u.%s", cfg_state_dir, (unsigned)job, host);
    return 0;
}

static unsigned long ns_inode(pid_t p)
{
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)p);
    return stat(path, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

/* The options as the prolog sees them (their callbacks do not run there). */
static void prolog_options(spank_t sp)
{
    char *v = NULL;
    if (spank_option_getopt(sp, &options[0], &v) == ESPANK_SUCCESS && v)
        cb_images(0, v, 1);
    v = NULL;
    if (spank_option_getopt(sp, &options[1], &v) == ESPANK_SUCCESS && v)
        cb_pools(0, v, 1);
}

/* Never fails (a failed prolog drains the node): what went wrong is kept
 * for the job's tasks to say. */
int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
    char path[PATH_MAX], line[MAX_MSG + 64];
    if (plugin_args(ac, av) < 0 || !cfg_job_scope)
        return 0;
    prolog_options(sp);
    if (!opt_images && !opt_pools)
        return 0;
    if (state_path(sp, path, sizeof path) < 0)
        return 0;
    if ((!opt_images || parse_images(opt_images) == 0) && (!opt_pools || parse_pools(opt_pools) == 0))
        start_holder(sp);
    if (failure[0])
        snprintf(line, sizeof line, "E %s\n", failure);
    else
        snprintf(line, sizeof line, "OK %d %lu\n", (int)holder, ns_inode(holder));
    mkdir(cfg_state_dir, 0700);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, line, strlen(line)) < 0)
        slurm_error("sheaf: %s: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (ctl_fd >= 0)
        close(ctl_fd); /* the holder waits for the epilog, not for us */
    return 0;
}

/* mode=bcast: the job's copies on this node that a step killed before its
 * end left (a step's own end removes its copies). */
static void sweep_copies(spank_t sp)
{
    uint32_t job = 0;
    char prefix[32];
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
        return;
    int fd = open_bcast_dir();
    if (fd < 0)
        return;
    snprintf(prefix, sizeof prefix, "%u.", (unsigned)job);
    int lfd = dup(fd);
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (!strncmp(e->d_name, prefix, strlen(prefix)))
                remove_step_dir(fd, e->d_name);
        closedir(d);
    }
    close(fd);
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
    char path[PATH_MAX], line[MAX_MSG + 64] = "";
    if (plugin_args(ac, av) < 0)
        return 0;
    if (cfg_bcast)
        sweep_copies(sp);
    if (!cfg_job_scope || state_path(sp, path, sizeof path) < 0)
        return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t r = read(fd, line, sizeof line - 1);
    close(fd);
    line[r > 0 ? r : 0] = 0;
    int pid = 0;
    unsigned long ino = 0;
    if (sscanf(line, "OK %d %lu", &pid, &ino) == 2 && pid > 0 && ns_inode(pid) == ino) {
        kill(pid, SIGTERM);
        int i;
        for (i = 0; i < 600 && ns_inode(pid) == ino; i++)
            usleep(50000);
        if (ns_inode(pid) == ino)
            kill(pid, SIGKILL);
    }
    unlink(path);
    return 0;
}

/* A step in job scope joins what the prolog made on this node. */
static void join_job(spank_t sp)
{
    char path[PATH_MAX], line[MAX_MSG + 64] = "";
    if (state_path(sp, path, sizeof path) < 0) {
        fail("cannot learn the job's id");
        return;
    }
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        fail("%s: the job's mounts were not made on this node (%s)", path, strerror(errno));
        return;
    }
    ssize_t r = read(fd, line, sizeof line - 1);
    close(fd);
    line[r > 0 ? r : 0] = 0;
    char *nl = strchr(line, '\n');
    if (nl)
        *nl = 0;
    int pid = 0;
    unsigned long ino = 0;
    if (!strncmp(line, "E ", 2))
        fail("%s", line + 2);
    else if (sscanf(line, "OK %d %lu", &pid, &ino) == 2 && pid > 0 && ns_inode(pid) == ino)
        holder = pid;
    else
        fail("the job's mounts on this node are gone");
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    if (!opt_images && !opt_pools)
        return 0;
    if ((opt_images && parse_images(opt_images) < 0) || (opt_pools && parse_pools(opt_pools) < 0)) {
        /* Locally (srun, sbatch) a bad option is refused before the job is
         * submitted. */
        if (!spank_remote(sp)) {
            slurm_error("sheaf: %s", failure);
            return -1;
        }
        return 0; /* each task says it and fails */
    }
    if (!spank_remote(sp))
        return 0;
    if (cfg_job_scope)
        join_job(sp);
    else
        start_holder(sp);
    if (!failure[0] && modulepath[0]) {
        char old[8192] = "";
        char val[16384];
        if (spank_getenv(sp, "MODULEPATH", old, sizeof old) != ESPANK_SUCCESS)
            old[0] = 0;
        snprintf(val, sizeof val, "%s%s%s", modulepath, old[0] ? ":" : "", old);
        spank_setenv(sp, "MODULEPATH", val, 1);
    }
    return 0;
}

/* In each task, as root, before it becomes the user: join the namespace. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void)sp; (void)ac; (void)av;
    if (holder <= 0)
        return 0;
    /* What the user mounted is the user's: no program the task runs may
     * gain privileges from files it chose (setuid, file capabilities), as
     * in Apptainer. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
        dprintf(2, "sheaf: error: no_new_privs: %s\n", strerror(errno));
        _exit(SHEAF_FAILED);
    }
    char cwd[PATH_MAX], path[64];
    int have_cwd = getcwd(cwd, sizeof cwd) != NULL;
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)holder);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNS) < 0) {
        dprintf(2, "sheaf: error: joining the job's mount namespace: %s\n", strerror(errno));
        _exit(SHEAF_FAILED);
    }
    close(fd);
    if (have_cwd && chdir(cwd) < 0) {
        /* The task's own chdir comes later and says what is wrong. */
    }
    return 0;
}

/* In each task, as the user, just before exec: a failure is said here, on
 * the task's standard error, and the task exits (slurmstepd has handed the
 * task over by now: an exit in the privileged callback makes it say more). */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)sp; (void)ac; (void)av;
    if (failure[0]) {
        dprintf(2, "sheaf: error: %s\n", failure);
        _exit(SHEAF_FAILED);
    }
    return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    if (!spank_remote(sp) || holder <= 0 || !holder_owned)
        return 0;
    close(ctl_fd);
    ctl_fd = -1;
    /* sheaf umount waits for each serving process; then the holder exits. */
    int i;
    for (i = 0; i < 600 && waitpid(holder, NULL, WNOHANG) == 0; i++)
        usleep(50000);
    if (i == 600) {
        kill(holder, SIGKILL);
        waitpid(holder, NULL, 0);
    }
    holder = -1;
    return 0;
}
