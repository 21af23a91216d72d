/* The relay in C: `mldserver connect HOST:PORT | unix:PATH`, the daemon's child process.

   The same program as relay.py (read its docstring for the contract: what it copies,
   when it exits, its one stderr line and exit status 2), built into the package as
   mldserver/ops/mldserver-relay when a C compiler is there at install time (setup.py).
   `mldserver connect` executes it when it exists, else `python -I -S relay.py`.

   Why it exists: the daemon starts one relay per shard, and a bare interpreter is
   about 3.5 MiB of private memory each; this is about 0.2 MiB, so at 32 shards the
   relays cost some 6 MiB instead of 110.

       $ mldserver connect 127.0.0.1:7070     # the daemon's executableName
       $ MLDSERVER_RELAY=python mldserver connect 127.0.0.1:7070   # relay.py instead

   Two directions, two threads, blocking I/O as in relay.py: daemon -> server with
   splice(2) (zero-copy from the daemon's pipe; plain reads and writes where the kernel
   refuses), server -> daemon with plain reads and writes. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)
#define READ_CHUNK (1 << 16)
#define DEFAULT_CONNECT_TIMEOUT 5.0
#define USAGE "usage: mldserver connect HOST:PORT | unix:PATH [--connect-timeout SECONDS]"

static char upstream_buf[READ_CHUNK];
static char downstream_buf[READ_CHUNK];
static int sockfd = -1;
static const char *resolve_error;  /* getaddrinfo's words for the last failed lookup */

struct target {
    int family;
    char host[256];
    char port[6];
    struct sockaddr_un unix_addr;
};

/* HOST:PORT, [V6]:PORT or unix:PATH -> 0, else -1 with `why` saying what is wrong
   (the same words as relay.parse_target). */
static int parse_target(const char *s, struct target *t, char *why, size_t why_size) {
    memset(t, 0, sizeof *t);
    if (strncmp(s, "unix:", 5) == 0) {
        const char *path = s + 5;
        if (!*path || strlen(path) >= sizeof t->unix_addr.sun_path) {
            snprintf(why, why_size, *path ? "socket path too long: %s" : "expected unix:PATH, got '%s'",
                     *path ? path : s);
            return -1;
        }
        t->family = AF_UNIX;
        t->unix_addr.sun_family = AF_UNIX;
        strcpy(t->unix_addr.sun_path, path);
        return 0;
    }
    const char *colon = strrchr(s, ':');
    const char *port = colon ? colon + 1 : "";
    int digits = *port != 0;
    for (const char *p = port; *p; p++)
        digits = digits && *p >= '0' && *p <= '9';
    if (!colon || !digits || colon == s) {
        snprintf(why, why_size, "expected HOST:PORT or unix:PATH, got '%s'", s);
        return -1;
    }
    long n = strlen(port) > 5 ? 100000 : strtol(port, NULL, 10);
    if (n < 1 || n > 65535) {
        snprintf(why, why_size, "port %s is out of range: use 1 to 65535", port);
        return -1;
    }
    const char *start = s, *end = colon;
    while (start < end && (*start == '[' || *start == ']')) start++;
    while (end > start && (end[-1] == '[' || end[-1] == ']')) end--;
    if ((size_t)(end - start) >= sizeof t->host) {
        snprintf(why, why_size, "host name too long");
        return -1;
    }
    memcpy(t->host, start, end - start);
    snprintf(t->port, sizeof t->port, "%ld", n);
    t->family = memchr(start, ':', end - start) ? AF_INET6 : AF_INET;
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void set_send_timeout(int fd, double seconds) {
    struct timeval tv = {(time_t)seconds, (suseconds_t)((seconds - (time_t)seconds) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* One attempt, bounded by `timeout` seconds: the connected socket, or -1 with errno. */
static int connect_once(const struct target *t, double timeout) {
    if (t->family == AF_UNIX) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        set_send_timeout(fd, timeout);
        if (connect(fd, (const struct sockaddr *)&t->unix_addr, sizeof t->unix_addr) == 0) return fd;
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    struct addrinfo hints = {0}, *found = NULL;
    hints.ai_family = t->family;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(t->host, t->port, &hints, &found);
    if (rc != 0) {
        resolve_error = rc == EAI_SYSTEM ? NULL : gai_strerror(rc);
        errno = rc == EAI_SYSTEM ? errno : 0;
        return -1;
    }
    resolve_error = NULL;
    int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        set_send_timeout(fd, timeout);
        if (connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            freeaddrinfo(found);
            return fd;
        }
        int saved = errno;
        close(fd);
        errno = saved;
    }
    freeaddrinfo(found);
    return -1;
}

/* A connected socket, retried until `timeout` (back-off 20 ms doubling to 0.5 s), or
   -1 with `why` set from the last attempt's error. */
static int connect_retrying(const struct target *t, double timeout, char *why, size_t why_size) {
    double deadline = now() + timeout, delay = 0.02;
    for (;;) {
        double left = deadline - now();
        int fd = connect_once(t, left > 0.05 ? left : 0.05);
        if (fd >= 0) {
            set_send_timeout(fd, 0);  /* blocking again: the copies wait as long as they must */
            return fd;
        }
        int err = errno;
        left = deadline - now();
        if (left <= 0) {
            snprintf(why, why_size, "%s", resolve_error ? resolve_error
                     : err == EINPROGRESS || err == EAGAIN || err == ETIMEDOUT ? "timed out" : strerror(err));
            return -1;
        }
        double pause = delay < left ? delay : left;
        struct timespec ts = {(time_t)pause, (long)((pause - (time_t)pause) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        delay = delay * 2 < 0.5 ? delay * 2 : 0.5;
    }
}

/* Copy src to dst until EOF (0) or an error (its errno; EPIPE for a write of 0),
   with plain reads and writes, adding the bytes read to *moved. */
static int copy_plain(int src, int dst, char *buf, long long *moved) {
    for (;;) {
        ssize_t n = read(src, buf, READ_CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) return 0;
        if (n < 0) return errno;
        *moved += n;
        for (ssize_t done = 0; done < n;) {
            ssize_t w = write(dst, buf + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return w < 0 ? errno : EPIPE;
            done += w;
        }
    }
}

/* The one stderr line of a copy that ended by an error (the daemon logs it). */
static void ended(const char *copy, int err) {
    if (err) fprintf(stderr, "mldserver connect: the %s copy failed: %s\n", copy, strerror(err));
}

/* Daemon -> server: splice(2) from the daemon's pipe; a splice that fails moved
   nothing, and the rest goes by plain copies, which wait where splice may fail (memory
   under pressure, a kernel that refuses it). Then half-close so the server sees EOF
   and sends its last bytes. */
static int stdin_ended;  /* the daemon closed our stdin: a server's EOF is expected */

static void *upstream(void *unused) {
    (void)unused;
    long long moved = 0;
    int err = 0;
    for (;;) {
        ssize_t n = splice(0, NULL, sockfd, NULL, CHUNK, SPLICE_F_MOVE);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) err = copy_plain(0, sockfd, upstream_buf, &moved);
        break;
    }
    if (err) ended("daemon-to-server", err);
    else __atomic_store_n(&stdin_ended, 1, __ATOMIC_SEQ_CST);
    shutdown(sockfd, SHUT_WR);
    return NULL;
}

/* Let the daemon's pipe hold a whole 1 MiB chunk (the default is 64 KiB). */
static void grow_pipe(int fd) {
    FILE *f = fopen("/proc/sys/fs/pipe-max-size", "r");
    long size = 0;
    if (!f) return;
    if (fscanf(f, "%ld", &size) == 1 && size > 0) fcntl(fd, F_SETPIPE_SZ, size < CHUNK ? size : CHUNK);
    fclose(f);
}

int main(int argc, char **argv) {
    signal(SIGINT, SIG_IGN);   /* the daemon shuts its children down, not a Ctrl-C */
    signal(SIGPIPE, SIG_IGN);  /* a closed peer is an error return, then exit */
    const char *timeout_text = getenv("MLDSERVER_CONNECT_TIMEOUT");
    char default_timeout[32];
    if (!timeout_text) {
        snprintf(default_timeout, sizeof default_timeout, "%g", DEFAULT_CONNECT_TIMEOUT);
        timeout_text = default_timeout;
    }
    const char *args[argc > 0 ? argc : 1];
    int nargs = 0, seen_timeout = 0;
    for (int i = 1; i < argc; i++) {
        if (!seen_timeout && strcmp(argv[i], "--connect-timeout") == 0) {
            seen_timeout = 1;
            timeout_text = i + 1 < argc ? argv[++i] : "";
            continue;
        }
        args[nargs++] = argv[i];
    }
    if (nargs > 0 && (strcmp(args[0], "-h") == 0 || strcmp(args[0], "--help") == 0)) {
        printf("%s\n\nThe relay the daemon launches once per shard (executableName): it joins its stdin and "
               "stdout to the server's shard port. --connect-timeout (or MLDSERVER_CONNECT_TIMEOUT): seconds "
               "to keep trying to reach the server (default %g).\n", USAGE, DEFAULT_CONNECT_TIMEOUT);
        return 0;
    }
    if (nargs != 1) {
        fprintf(stderr, "%s\n", USAGE);
        return 2;
    }
    char *end = NULL;
    double timeout = strtod(timeout_text, &end);
    while (end && (*end == ' ' || *end == '\t' || *end == '\n')) end++;
    if (end == timeout_text || *end || !(timeout > 0) || isinf(timeout)) {
        fprintf(stderr, "mldserver connect: the connect time-out must be a positive number of seconds, got '%s' "
                        "(--connect-timeout or MLDSERVER_CONNECT_TIMEOUT); %s\n", timeout_text, USAGE);
        return 2;
    }
    struct target target;
    char why[512];
    if (parse_target(args[0], &target, why, sizeof why) != 0) {
        fprintf(stderr, "mldserver connect: bad target '%s': %s; fix executableName\n", args[0], why);
        return 2;
    }
    sockfd = connect_retrying(&target, timeout, why, sizeof why);
    if (sockfd < 0) {
        fprintf(stderr, "mldserver connect: cannot reach the mldserver server at %s within %g s (%s); "
                        "start it with `mldserver serve` or fix executableName\n", args[0], timeout, why);
        return 2;
    }
    grow_pipe(0);
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    int rc = pthread_create(&thread, &attr, upstream, NULL);
    if (rc != 0) {
        fprintf(stderr, "mldserver connect: cannot start the daemon-to-server copy: %s\n", strerror(rc));
        return 2;
    }
    long long received = 0;
    int err = copy_plain(sockfd, 1, downstream_buf, &received);  /* until the server closes */
    /* A server that closes with the daemon's first bytes unread resets the connection. */
    if ((!err || err == ECONNRESET) && !received && !__atomic_load_n(&stdin_ended, __ATOMIC_SEQ_CST)) {
        fprintf(stderr, "mldserver connect: the mldserver server at %s closed the connection before answering: "
                        "it refused this shard (shutting down: its log says shard_refused; or out of file handles: its "
                        "open_files_limit); the daemon starts the shard again\n", args[0]);
        _exit(2);
    }
    ended("server-to-daemon", err);
    _exit(0);                               /* without waiting for the daemon-to-server copy */
}
