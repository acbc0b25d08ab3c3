/* Power-loss shim for crates/pollbox/tests/power_loss.rs (LD_PRELOAD).
 *
 * Records what a power cut would keep of the files in one directory
 * (POWERLOSS_DIR, the write-ahead file's), in a side log (POWERLOSS_LOG)
 * the test reads after it kills the server:
 *
 *   synced<TAB>path<TAB>len   fsync/fdatasync of a file returned: its first
 *                             `len` bytes (its size before the sync) are
 *                             durable (the WAL only appends)
 *   dir<TAB>path<TAB>a/b/c    fsync of the directory returned: these names
 *                             are durable (names made later may vanish)
 *   gone<TAB>path<TAB>grave   unlink(path): the file is moved to `grave`
 *                             (POWERLOSS_GRAVE) instead, so a power cut
 *                             before the next directory sync can bring it
 *                             back
 *
 * Each line is written before the sync returns to the server, so a line is
 * there for every sync an acknowledgement followed. Writes themselves are
 * not copied: after SIGKILL the page cache still holds every byte written,
 * and the test reads the unsynced tail from the file itself.
 *
 * POWERLOSS_LAG=1: a lying disk for the broken-build test: each sync is
 * recorded as covering only what the previous sync of that fd covered.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static const char *dir, *logp, *grave;
static size_t dirlen;
static int lag;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long graves;
#define FDS 4096
static long long prev_len[FDS];
static ino_t prev_ino[FDS];

__attribute__((constructor)) static void init(void) {
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
    dir = getenv("POWERLOSS_DIR");
    logp = getenv("POWERLOSS_LOG");
    grave = getenv("POWERLOSS_GRAVE");
    lag = getenv("POWERLOSS_LAG") != NULL;
    if (!dir || !logp)
        dir = NULL;
    else
        dirlen = strlen(dir);
    for (int i = 0; i < FDS; i++)
        prev_len[i] = -1;
}

static int ours(const char *path) {
    return dir && strncmp(path, dir, dirlen) == 0 &&
           (path[dirlen] == '/' || path[dirlen] == 0);
}

static void log_line(const char *s) {
    int fd = open(logp, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        abort();
    size_t n = strlen(s);
    if (write(fd, s, n) != (ssize_t)n)
        abort();
    close(fd);
}

static int synced(int fd, int (*real)(int)) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return real(fd);
    path[n] = 0;
    struct stat st;
    if (!ours(path) || fstat(fd, &st) != 0)
        return real(fd);
    int rc = real(fd);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&mu);
    if (S_ISDIR(st.st_mode)) {
        size_t cap = 4096, len = 0;
        char *line = malloc(cap);
        len = snprintf(line, cap, "dir\t%s\t", path);
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            size_t m = strlen(e->d_name);
            if (len + m + 3 > cap)
                line = realloc(line, cap = 2 * (cap + m));
            memcpy(line + len, e->d_name, m);
            len += m;
            line[len++] = '/';
        }
        if (d)
            closedir(d);
        line[len++] = '\n';
        line[len] = 0;
        log_line(line);
        free(line);
    } else if (S_ISREG(st.st_mode)) {
        long long durable = st.st_size;
        if (lag && fd < FDS) {
            durable = prev_ino[fd] == st.st_ino ? prev_len[fd] : -1;
            prev_len[fd] = st.st_size;
            prev_ino[fd] = st.st_ino;
        }
        if (durable >= 0) {
            char line[PATH_MAX + 64];
            snprintf(line, sizeof line, "synced\t%s\t%lld\n", path, durable);
            log_line(line);
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int fsync(int fd) { return synced(fd, real_fsync); }
int fdatasync(int fd) { return synced(fd, real_fdatasync); }

static int buried(const char *path) {
    struct stat st;
    if (!grave || path[0] != '/' || !ours(path) || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    pthread_mutex_lock(&mu);
    char to[PATH_MAX], line[2 * PATH_MAX + 16];
    snprintf(to, sizeof to, "%s/%d-%lu", grave, (int)getpid(), graves++);
    int rc = rename(path, to);
    if (rc == 0) {
        snprintf(line, sizeof line, "gone\t%s\t%s\n", path, to);
        log_line(line);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int unlink(const char *path) {
    int rc = buried(path);
    return rc == 0 ? 0 : real_unlink(path);
}

int unlinkat(int dirfd, const char *path, int flags) {
    if (!(flags & AT_REMOVEDIR) && buried(path) == 0)
        return 0;
    return real_unlinkat(dirfd, path, flags);
}
