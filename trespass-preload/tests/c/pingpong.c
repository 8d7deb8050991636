/*
 * pingpong.c - a TCP echo client and server that know nothing about RDMA.
 *
 * trespass-preload's tests and benchmarks run it, with and without the preload, to exercise the
 * socket calls ordinary programs make: blocking and nonblocking connect and accept4, fcntl
 * O_NONBLOCK and SOCK_NONBLOCK, read/write/writev, poll, select, edge-triggered epoll, shutdown,
 * getpeername/getsockname, TCP_NODELAY; and sockets that live on in a fork()ed child, in an
 * execv()ed program, or that one thread closes while another reads them. The udp-* and unix-*
 * modes use sockets that the preload must leave alone.
 *
 * pingpong server [--bind ADDR] --port P [--count N] [--epoll|--fork] [--port-file PATH]
 *                 [--backlog N] [--accept-after MS] [--sink] [--mixed]
 * pingpong client --host H --port P [--size S] [--iters N] [--poll|--select|--epoll]
 *                 [--short N | --stream SECONDS | --fork | --exec | --threads-close |
 *                  --threads-cancel | --connect-cancel | --edges | --send-exit BYTES [--mixed]]
 *                 [--connect-timeout MS] [--fcntl-dup] [--rcvtimeo MS]
 * pingpong client-fd --fd N [--size S] [--iters N]
 * pingpong udp-server [--bind ADDR] --port P [--count N] [--port-file PATH]
 * pingpong udp-client --host H --port P
 * pingpong unix-server --path PATH [--count N] [--epoll|--fork]
 * pingpong unix-client --path PATH [the client options but --host and --port]
 *
 * ADDR and H are numeric IPv4 or IPv6 addresses (ADDR defaults to 0.0.0.0). A server prints
 * "listening <port or path>" first; --port 0 picks a free port, which --port-file also writes
 * to PATH (by way of PATH.tmp). It echoes --count connections (default 1) one after the other,
 * or together with --epoll, then prints "served <N> connections, <B> bytes". The client makes
 * --iters round trips (default 1000) of --size bytes (default 64, at most 16 MiB), checks every
 * byte and prints "round_trips=N size=S seconds=T rtt_us=R per_second=P"; --short N makes N
 * connections of one round trip each; --stream SECONDS writes --size chunks (default 64 KiB)
 * for that long while reading the echo, then prints "streamed <bytes> bytes". --poll makes the
 * socket nonblocking with fcntl and waits in poll(); --select asks socket() for SOCK_NONBLOCK
 * and waits in select(); --epoll asks for SOCK_NONBLOCK and waits in a level-triggered epoll set
 * (the descriptor added at its first wait: right after EINPROGRESS when a connect is in
 * progress). A connect that fails prints "pingpong: connect: <why>" (exit 3), after EINPROGRESS
 * as from SO_ERROR. --connect-timeout MS bounds a connect in progress (waited for in poll()):
 * past it the client prints "connect timed out after MS ms" and exits 5. --fcntl-dup goes on with
 * a copy of the connected descriptor made by fcntl(F_DUPFD_CLOEXEC, 100), the original closed.
 * --rcvtimeo MS sets SO_RCVTIMEO to MS and TCP_NODELAY before connect, and prints both as the
 * connected socket reports them: "options rcvtimeo_ms=<MS> nodelay=<0|1>".
 * udp-client waits at most 5 s for the echo of one datagram. A server's
 * --backlog sets listen()'s backlog (default 128) and --accept-after MS makes it wait that long
 * after listening before its first accept, so that connections pile up beyond the backlog.
 * server --echo-delay MS waits MS milliseconds before writing each echo (of each read).
 * server --sink reads each connection to its end, checking every byte against the pattern
 * client --send-exit N writes (N bytes, then exit(0) at once: no shutdown, close or wait), and
 * echoes nothing; its "served" line counts the bytes. With --mixed (on either side) each
 * piece goes by the next of several calls in turn, in pieces of varying size: the client's
 * write, writev of two parts, send, send with MSG_MORE, sendfile from a memfd and a
 * nonblocking send; the server's read, recv, readv into two parts, recv after a MSG_PEEK of
 * the same bytes, and recv with MSG_WAITALL. A preload that carries some of these itself and
 * leaves others to the kernel must keep the bytes in order across them.
 *
 * client --edges walks the error paths of a connected socket that the server echoes, each as TCP
 * has it: a read with SO_RCVTIMEO at 5 ms and nothing to read fails with EAGAIN (within 2 s);
 * a blocking read in a second thread fails with EINTR when a SIGALRM sent to the process (a
 * timer's) interrupts it, its handler installed without SA_RESTART and the main thread blocking
 * SIGALRM, so that only the reader may take it (5 times; a signal some other thread took leaves
 * the read waiting: "edges: eintr <i>: the read went on", exit 1, after 3 s); then a round trip of
 * 64 bytes; after shutdown(SHUT_WR), send with MSG_NOSIGNAL and write with SIGPIPE ignored fail
 * with EPIPE; then the server's end reads as 0. It prints "edges rcvtimeo=EAGAIN eintr=5
 * epipe=EPIPE eof=0", or what differed ("edges: ...", exit 1).
 *
 * client --handoffs makes --iters rounds (at most 300) of 1000 bytes on a connected, blocking
 * socket, in turn: the echo seen readable by epoll_wait, one byte of it read, the rest waited
 * for in a second epoll set that watches the socket with EPOLLONESHOT (re-armed each time);
 * the echo seen readable by epoll_wait, none of it read, then waited for in the one-shot
 * set; the echo seen readable by poll(), then peeked at with recv(MSG_PEEK | MSG_DONTWAIT)
 * (waiting in poll() between tries) until the peek sees all of it; an epoll_wait with no
 * timeout before the message is written (which finds nothing), then blocking reads of the
 * echo (SO_RCVTIMEO 5 s: one that times out prints "a blocking read after epoll_wait saw
 * nothing within 5 s", exit 1). The rest of each echo is
 * read with select() waits. Every wait is bounded by 5 s: one that ends with nothing prints
 * "handoffs: <round>: <what> saw nothing within 5 s" (exit 1). A preload that reports bytes
 * from somewhere other than the socket must still let every later wait, read and peek see
 * them (a one-shot registration is one such a preload may leave to the kernel). It prints
 * "handoffs=<N>"; every echoed byte is checked.
 *
 * server --fork (not with --epoll) forks a child per connection: the child closes the listening
 * socket, echoes the connection as the plain server does and exits 0 (1 on any error); the parent
 * closes its copy and accepts the next. After --count connections it waits for every child, fails
 * with "child <pid> failed" (exit 1) if one did not exit 0, and prints "served <N> connections
 * (forked)".
 *
 * client --fork connects, then forks: the child makes the round trips (the "round_trips=" line,
 * then shutdown, EOF check and close); the parent closes its copy at once, waits, prints "child
 * exited <status>" and exits with that status (128 + the signal if one killed the child).
 * client --exec connects, then forks a child that execv()s /proc/self/exe as "client-fd --fd
 * <N> --size S --iters I" on the connected descriptor (FD_CLOEXEC cleared); the parent does as
 * with --fork. client-fd makes the round trips on the already connected descriptor N: no
 * connect, TCP_NODELAY only tried, poll() if N is nonblocking. client --threads-close connects
 * and starts a thread that blocks in read(); 300 ms later the main thread calls
 * shutdown(SHUT_RDWR) and close(); the read must return within 5 s: the client then prints
 * "reader returned <r>" (and the error if r is -1) and exits 0, or prints "reader stuck" and
 * exits 1. client --threads-cancel connects and, 20 times, starts a thread that blocks in
 * read() and cancels it (pthread_cancel) after 0, 2, ..., 38 ms; each must end cancelled
 * within 5 s ("reader <i> stuck" or "... returned instead of being cancelled", exit 1); then
 * it prints "readers cancelled 20". client --connect-cancel starts a thread that makes a
 * blocking connect() to --host and --port and cancels it after 100 ms: it must end within
 * 5 s ("connect stuck", exit 1); then it prints "connect cancelled" (or "connect returned
 * first" when the connect failed before the cancel). --fork, --exec, --threads-close and --threads-cancel
 * exclude each other and --short, --stream and --send-exit; --threads-close and
 * --threads-cancel take none of --size, --iters, --poll, --select.
 *
 * For leak checks, servers print "open_fds_after_first=<N>" and "rss_kib_after_first=<K>" once
 * their first connection is closed (a --fork server: once it closed its copy), and
 * "open_fds=<N>" and "rss_kib=<K>" right after the "served" line, before they close the
 * listening (and epoll) socket, so that both counts see the same sockets. A client prints
 * "open_fds=<N>" and "rss_kib=<K>" when it has closed everything at the end (with --fork or
 * --exec, the parent only; client-fd does not), and --short also "open_fds_after_first=<N>"
 * and "rss_kib_after_first=<K>" once its first connection is closed. N counts the entries of
 * /proc/self/fd, K is VmRSS from /proc/self/status. Each is a line of its own.
 *
 * Results go to stdout, line-buffered; errors are one line on stderr starting "pingpong: ".
 * Exit status: 0 success, 1 wrong or missing echo data, 2 usage error, 3 system call failed,
 * 4 the peer went away during --stream (stdout: "peer gone: <reason>"), 5 --connect-timeout ran
 * out.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BUF_SIZE (64 * 1024)
#define MAX_SIZE (16 * 1024 * 1024)
/* Bytes a blocking client keeps in flight: writing all of a large message before reading
 * would deadlock once its echo fills every buffer on the way back. */
#define WINDOW (256 * 1024)

enum { SERVER = 1, CLIENT = 2, UDP_SERVER = 4, UDP_CLIENT = 8, UNIX_SERVER = 16, UNIX_CLIENT = 32,
       CLIENT_FD = 64 };
#define INET_MODES (SERVER | CLIENT | UDP_SERVER | UDP_CLIENT)
#define STREAM_SERVERS (SERVER | UNIX_SERVER)
#define STREAM_CLIENTS (CLIENT | UNIX_CLIENT)

enum io_mode { IO_BLOCK, IO_POLL, IO_SELECT, IO_EPOLL };

enum { OPT_BIND, OPT_PORT, OPT_HOST, OPT_PATH, OPT_COUNT, OPT_EPOLL, OPT_PORT_FILE, OPT_SIZE,
       OPT_ITERS, OPT_POLL, OPT_SELECT, OPT_SHORT, OPT_STREAM, OPT_FORK, OPT_EXEC,
       OPT_THREADS_CLOSE, OPT_FD, OPT_BACKLOG, OPT_ACCEPT_AFTER, OPT_SINK, OPT_SEND_EXIT,
       OPT_CONNECT_TIMEOUT, OPT_FCNTL_DUP, OPT_RCVTIMEO, OPT_MIXED, OPT_THREADS_CANCEL, OPT_CONNECT_CANCEL,
       OPT_EDGES, OPT_HANDOFFS, OPT_ECHO_DELAY };
#define SEEN(o, opt) ((o)->seen & (1u << (opt)))

struct opts {
	unsigned mode, seen; /* seen: a bit per OPT_* given */
	const char *bind, *host, *path, *port_file;
	unsigned port;
	int fd;      /* client-fd's --fd */
	int backlog; /* --backlog; 0: 128 */
	unsigned long long send_exit; /* --send-exit: bytes to write before exiting at once */
	unsigned long long accept_after_ms; /* --accept-after: wait before the first accept */
	unsigned long long echo_delay_ms; /* --echo-delay: wait before each echo */
	int connect_timeout_ms; /* --connect-timeout: bound on a connect in progress; 0: none */
	int rcvtimeo_ms; /* --rcvtimeo: SO_RCVTIMEO and TCP_NODELAY set before connect; 0: not */
	char *argv0; /* for --exec */
	unsigned long long count, iters, shorts;
	size_t size;
	enum io_mode io;
	double stream; /* seconds; 0: off */
};

struct target {
	struct sockaddr_storage addr;
	socklen_t len;
};

/* The exit status of die(); a server --fork child exits 1 on any error. */
static int die_status = 3;

__attribute__((format(printf, 2, 3), noreturn))
static void fail(int status, const char *fmt, ...) {
	va_list ap;
	fflush(stdout);
	fputs("pingpong: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(status);
}

/* A system call failed: report it with errno and exit 3 (die_status). */
__attribute__((noreturn)) static void die(const char *what) {
	fail(die_status, "%s: %s", what, strerror(errno));
}

__attribute__((noreturn)) static void peer_gone(const char *why) {
	printf("peer gone: %s\n", why);
	exit(4);
}

static int again(int err) {
	return err == EINTR || err == EAGAIN || err == EWOULDBLOCK;
}

static void *xmalloc(size_t n) {
	void *p = malloc(n);
	if (!p) die("malloc");
	return p;
}

static double now(void) {
	struct timespec ts;
	if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0) die("clock_gettime");
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000 };
	while (nanosleep(&ts, &ts) < 0)
		if (errno != EINTR) die("nanosleep");
}

/* The entries of /proc/self/fd, less the directory's own descriptor. */
static long count_open_fds(void) {
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	long n = 0;
	if (!d) die("opendir /proc/self/fd");
	int self = dirfd(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && atoi(e->d_name) != self) n++;
	closedir(d);
	return n;
}

/* VmRSS from /proc/self/status in KiB; -1 if it has none. */
static long rss_kib(void) {
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	long kib = -1;
	if (!f) die("open /proc/self/status");
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
	fclose(f);
	return kib;
}

/* "open_fds<suffix>=N" and "rss_kib<suffix>=K", a line each. */
static void report_resources(const char *suffix) {
	long fds = count_open_fds();
	printf("open_fds%s=%ld\nrss_kib%s=%ld\n", suffix, fds, suffix, rss_kib());
}

/* Waits for child pid; returns its exit status, or 128 + the signal that killed it. */
static int wait_child(pid_t pid) {
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR) die("waitpid");
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static unsigned long long parse_num(const char *opt, const char *s, unsigned long long min,
				    unsigned long long max) {
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (*s < '0' || *s > '9' || errno || *end || v < min || v > max)
		fail(2, "%s: expected a number from %llu to %llu, got '%s'", opt, min, max, s);
	return v;
}

static void parse_args(int argc, char **argv, struct opts *o) {
	static const char *const modes[] = { "server", "client", "udp-server", "udp-client",
					     "unix-server", "unix-client", "client-fd" };
	static const struct { const char *name; int id, has_arg; unsigned modes; } options[] = {
		{ "--bind", OPT_BIND, 1, SERVER | UDP_SERVER },
		{ "--port", OPT_PORT, 1, INET_MODES },
		{ "--host", OPT_HOST, 1, CLIENT | UDP_CLIENT },
		{ "--path", OPT_PATH, 1, UNIX_SERVER | UNIX_CLIENT },
		{ "--count", OPT_COUNT, 1, STREAM_SERVERS | UDP_SERVER },
		{ "--epoll", OPT_EPOLL, 0, STREAM_SERVERS | STREAM_CLIENTS },
		{ "--fork", OPT_FORK, 0, STREAM_SERVERS | STREAM_CLIENTS },
		{ "--port-file", OPT_PORT_FILE, 1, STREAM_SERVERS | UDP_SERVER },
		{ "--size", OPT_SIZE, 1, STREAM_CLIENTS | CLIENT_FD },
		{ "--iters", OPT_ITERS, 1, STREAM_CLIENTS | CLIENT_FD },
		{ "--poll", OPT_POLL, 0, STREAM_CLIENTS },
		{ "--select", OPT_SELECT, 0, STREAM_CLIENTS },
		{ "--short", OPT_SHORT, 1, STREAM_CLIENTS },
		{ "--stream", OPT_STREAM, 1, STREAM_CLIENTS },
		{ "--exec", OPT_EXEC, 0, STREAM_CLIENTS },
		{ "--threads-close", OPT_THREADS_CLOSE, 0, STREAM_CLIENTS },
		{ "--threads-cancel", OPT_THREADS_CANCEL, 0, CLIENT },
		{ "--connect-cancel", OPT_CONNECT_CANCEL, 0, CLIENT },
		{ "--edges", OPT_EDGES, 0, CLIENT },
		{ "--handoffs", OPT_HANDOFFS, 0, CLIENT },
		{ "--fd", OPT_FD, 1, CLIENT_FD },
		{ "--backlog", OPT_BACKLOG, 1, STREAM_SERVERS },
		{ "--accept-after", OPT_ACCEPT_AFTER, 1, STREAM_SERVERS },
		{ "--echo-delay", OPT_ECHO_DELAY, 1, SERVER },
		{ "--sink", OPT_SINK, 0, SERVER },
		{ "--send-exit", OPT_SEND_EXIT, 1, CLIENT },
		{ "--connect-timeout", OPT_CONNECT_TIMEOUT, 1, CLIENT },
		{ "--fcntl-dup", OPT_FCNTL_DUP, 0, CLIENT },
		{ "--rcvtimeo", OPT_RCVTIMEO, 1, CLIENT },
		{ "--mixed", OPT_MIXED, 0, SERVER | CLIENT },
	};
	const size_t n_options = sizeof options / sizeof options[0];

	*o = (struct opts){ .bind = "0.0.0.0", .count = 1, .iters = 1000, .size = 64,
			    .argv0 = argc >= 1 ? argv[0] : "pingpong" };
	for (size_t m = 0; argc >= 2 && m < sizeof modes / sizeof modes[0]; m++)
		if (!strcmp(argv[1], modes[m])) o->mode = 1u << m;
	if (!o->mode)
		fail(2, "%s mode (server, client, client-fd, udp-server, udp-client, "
		     "unix-server or unix-client)", argc < 2 ? "missing" : "unknown");

	for (int i = 2; i < argc; i++) {
		const char *val = NULL;
		size_t k = 0;
		while (k < n_options && strcmp(argv[i], options[k].name)) k++;
		if (k == n_options) fail(2, "unknown option '%s'", argv[i]);
		if (!(options[k].modes & o->mode))
			fail(2, "%s does not apply to %s", argv[i], argv[1]);
		if (options[k].has_arg && i + 1 >= argc) fail(2, "%s needs a value", argv[i]);
		if (options[k].has_arg) val = argv[++i];
		o->seen |= 1u << options[k].id;
		switch (options[k].id) {
		case OPT_BIND: o->bind = val; break;
		case OPT_PORT: o->port = (unsigned)parse_num("--port", val, 0, 65535); break;
		case OPT_HOST: o->host = val; break;
		case OPT_PATH: o->path = val; break;
		case OPT_COUNT: o->count = parse_num("--count", val, 1, 1000000000); break;
		case OPT_PORT_FILE: o->port_file = val; break;
		case OPT_SIZE: o->size = (size_t)parse_num("--size", val, 1, MAX_SIZE); break;
		case OPT_ITERS: o->iters = parse_num("--iters", val, 1, 1000000000000ULL); break;
		case OPT_POLL: o->io = IO_POLL; break;
		case OPT_SELECT: o->io = IO_SELECT; break;
		case OPT_EPOLL: if (o->mode & STREAM_CLIENTS) o->io = IO_EPOLL; break;
		case OPT_SHORT: o->shorts = parse_num("--short", val, 1, 1000000000); break;
		case OPT_FD: o->fd = (int)parse_num("--fd", val, 0, 1 << 30); break;
		case OPT_SEND_EXIT: o->send_exit = parse_num("--send-exit", val, 1, 1ULL << 40); break;
		case OPT_MIXED: break;
		case OPT_THREADS_CANCEL: break;
		case OPT_CONNECT_CANCEL: break;
		case OPT_RCVTIMEO: o->rcvtimeo_ms = (int)parse_num("--rcvtimeo", val, 1, 3600000); break;
		case OPT_CONNECT_TIMEOUT:
			o->connect_timeout_ms = (int)parse_num("--connect-timeout", val, 1, 3600000);
			break;
		case OPT_BACKLOG: o->backlog = (int)parse_num("--backlog", val, 1, 65535); break;
		case OPT_ACCEPT_AFTER:
			o->accept_after_ms = parse_num("--accept-after", val, 0, 3600000);
			break;
		case OPT_ECHO_DELAY:
			o->echo_delay_ms = parse_num("--echo-delay", val, 0, 60000);
			break;
		case OPT_STREAM: {
			char *end;
			errno = 0;
			o->stream = strtod(val, &end);
			if (errno || end == val || *end || !(o->stream > 0 && o->stream <= 86400))
				fail(2, "--stream: expected seconds (up to 86400), got '%s'", val);
			break;
		}
		}
	}

	if ((o->mode & INET_MODES) && !SEEN(o, OPT_PORT)) fail(2, "%s needs --port", argv[1]);
	if ((o->mode & (CLIENT | UDP_CLIENT)) && (!o->host || !o->port))
		fail(2, "%s needs --host and a --port other than 0", argv[1]);
	if ((o->mode & (UNIX_SERVER | UNIX_CLIENT)) && !o->path)
		fail(2, "%s needs --path", argv[1]);
	if (!!SEEN(o, OPT_POLL) + !!SEEN(o, OPT_SELECT) + !!((o->mode & STREAM_CLIENTS) && SEEN(o, OPT_EPOLL)) > 1)
		fail(2, "--poll, --select and --epoll exclude each other");
	if (o->shorts && o->stream > 0) fail(2, "--short and --stream exclude each other");
	if ((o->shorts || o->stream > 0) && SEEN(o, OPT_ITERS))
		fail(2, "--iters does not apply to --short or --stream");
	if (o->stream > 0 && !SEEN(o, OPT_SIZE)) o->size = BUF_SIZE;
	if (o->mode == CLIENT_FD && !SEEN(o, OPT_FD)) fail(2, "client-fd needs --fd");
	if (o->mode == CLIENT && SEEN(o, OPT_MIXED) && !o->send_exit)
		fail(2, "a client's --mixed applies to --send-exit");
	if (SEEN(o, OPT_FORK) && SEEN(o, OPT_EPOLL))
		fail(2, "--fork and --epoll exclude each other");

	int spawns = !!SEEN(o, OPT_FORK) + !!SEEN(o, OPT_EXEC) + !!SEEN(o, OPT_THREADS_CLOSE) +
		     !!SEEN(o, OPT_THREADS_CANCEL);
	if (spawns > 1)
		fail(2, "--fork, --exec, --threads-close and --threads-cancel exclude each other");
	if (spawns && (o->shorts || o->stream > 0 || o->send_exit))
		fail(2, "--fork, --exec, --threads-close and --threads-cancel exclude --short, "
			"--stream and --send-exit");
	if ((SEEN(o, OPT_THREADS_CLOSE) || SEEN(o, OPT_THREADS_CANCEL)) &&
	    (SEEN(o, OPT_SIZE) || SEEN(o, OPT_ITERS) || SEEN(o, OPT_POLL) || SEEN(o, OPT_SELECT) ||
	     SEEN(o, OPT_EPOLL)))
		fail(2, "--size, --iters, --poll, --select and --epoll do not apply to "
			"--threads-close or --threads-cancel");
}

/* A numeric address and port to a socket address; a bad address is a usage error. */
static void resolve(const char *host, unsigned port, int socktype, struct target *t) {
	struct addrinfo hints = { .ai_socktype = socktype,
				  .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV }, *res;
	char serv[16];
	snprintf(serv, sizeof serv, "%u", port);
	int rc = getaddrinfo(host, serv, &hints, &res);
	if (rc) fail(2, "bad address '%s': %s", host, gai_strerror(rc));
	memcpy(&t->addr, res->ai_addr, res->ai_addrlen);
	t->len = res->ai_addrlen;
	freeaddrinfo(res);
}

static void unix_target(const char *path, struct target *t) {
	struct sockaddr_un *un = (struct sockaddr_un *)&t->addr;
	if (strlen(path) >= sizeof un->sun_path)
		fail(2, "--path is longer than %zu bytes", sizeof un->sun_path - 1);
	memset(t, 0, sizeof *t);
	un->sun_family = AF_UNIX;
	strcpy(un->sun_path, path);
	t->len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
}

/* "1.2.3.4:80", "[::1]:80", a Unix path or "(unnamed)". */
static void fmt_addr(const struct sockaddr_storage *ss, socklen_t len, char *out, size_t outlen) {
	char host[NI_MAXHOST], serv[NI_MAXSERV];
	if (ss->ss_family == AF_UNIX) {
		const struct sockaddr_un *un = (const struct sockaddr_un *)ss;
		size_t off = offsetof(struct sockaddr_un, sun_path);
		if (len <= off || un->sun_path[0] == '\0') snprintf(out, outlen, "(unnamed)");
		else snprintf(out, outlen, "%.*s", (int)(len - off), un->sun_path);
		return;
	}
	int rc = getnameinfo((const struct sockaddr *)ss, len, host, sizeof host, serv, sizeof serv,
			     NI_NUMERICHOST | NI_NUMERICSERV);
	if (rc) fail(3, "getnameinfo: %s", gai_strerror(rc));
	if (ss->ss_family == AF_INET6) snprintf(out, outlen, "[%s]:%s", host, serv);
	else snprintf(out, outlen, "%s:%s", host, serv);
}

/* Prints "<verb> <peer> local <local>" unless verb is NULL, and sets TCP_NODELAY on TCP. */
static void greet(int fd, const char *verb) {
	struct sockaddr_storage peer, local;
	socklen_t plen = sizeof peer, llen = sizeof local;
	char p[NI_MAXHOST + 128], l[NI_MAXHOST + 128];
	int one = 1;
	if (getpeername(fd, (struct sockaddr *)&peer, &plen) < 0) die("getpeername");
	if (getsockname(fd, (struct sockaddr *)&local, &llen) < 0) die("getsockname");
	if (verb) {
		fmt_addr(&peer, plen, p, sizeof p);
		fmt_addr(&local, llen, l, sizeof l);
		printf("%s %s local %s\n", verb, p, l);
	}
	if (local.ss_family != AF_UNIX &&
	    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
		die("setsockopt TCP_NODELAY");
}

static void set_nonblocking(int fd) {
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) die("fcntl O_NONBLOCK");
}

static void shutdown_wr(int fd) {
	/* ENOTCONN: the peer reset the connection already; there is nothing left to end. */
	if (shutdown(fd, SHUT_WR) < 0 && errno != ENOTCONN) die("shutdown");
}

/* Waits, with no time limit, until fd is ready for events (POLLIN, POLLOUT). */
/* --epoll's set (level-triggered), made on first use; the descriptor it last watched. A
 * descriptor is added at its first wait, which for a connect in progress is right after
 * EINPROGRESS: the set watches the file the descriptor had then. */
static int epoll_set = -1, epoll_watched = -1;

static void wait_fd(int fd, short events, enum io_mode io) {
	int r;
	if (io == IO_EPOLL) {
		struct epoll_event ev = { .events = (events & POLLIN ? EPOLLIN : 0) |
						    (events & POLLOUT ? EPOLLOUT : 0) };
		ev.data.fd = fd;
		if (epoll_set < 0 && (epoll_set = epoll_create1(EPOLL_CLOEXEC)) < 0)
			die("epoll_create1");
		if (fd != epoll_watched) {
			if (epoll_ctl(epoll_set, EPOLL_CTL_ADD, fd, &ev) < 0 &&
			    (errno != EEXIST || epoll_ctl(epoll_set, EPOLL_CTL_MOD, fd, &ev) < 0))
				die("epoll_ctl ADD");
			epoll_watched = fd;
		} else if (epoll_ctl(epoll_set, EPOLL_CTL_MOD, fd, &ev) < 0 &&
			   /* A new socket under a closed one's number (--short). */
			   (errno != ENOENT || epoll_ctl(epoll_set, EPOLL_CTL_ADD, fd, &ev) < 0)) {
			die("epoll_ctl MOD");
		}
		do r = epoll_wait(epoll_set, &ev, 1, -1);
		while (r < 0 && errno == EINTR);
		if (r < 0) die("epoll_wait");
		return;
	}
	do {
		if (io == IO_SELECT) {
			fd_set rd, wr;
			FD_ZERO(&rd);
			FD_ZERO(&wr);
			if (events & POLLIN) FD_SET(fd, &rd);
			if (events & POLLOUT) FD_SET(fd, &wr);
			r = select(fd + 1, &rd, &wr, NULL, NULL);
		} else {
			struct pollfd p = { .fd = fd, .events = events };
			r = poll(&p, 1, -1);
		}
	} while (r < 0 && errno == EINTR);
	if (r < 0) die(io == IO_SELECT ? "select" : "poll");
}

/* ---- servers ---- */

static void write_port_file(const char *path, unsigned port) {
	char tmp[4096];
	FILE *f;
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
		fail(2, "--port-file is too long");
	if (!(f = fopen(tmp, "w"))) die("open port file");
	if (fprintf(f, "%u\n", port) < 0 || fclose(f) != 0) die("write port file");
	if (rename(tmp, path) < 0) die("rename port file");
}

/* Creates and binds the server socket (listening if SOCK_STREAM), then announces it. */
static int open_server(const struct opts *o, int socktype) {
	struct target t;
	int fd, one = 1;
	if (o->mode == UNIX_SERVER) {
		unix_target(o->path, &t);
		if (unlink(o->path) < 0 && errno != ENOENT) die("unlink");
	} else {
		resolve(o->bind, o->port, socktype, &t);
	}
	if ((fd = socket(t.addr.ss_family, socktype | SOCK_CLOEXEC, 0)) < 0) die("socket");
	if (t.addr.ss_family != AF_UNIX &&
	    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
		die("setsockopt SO_REUSEADDR");
	if (bind(fd, (struct sockaddr *)&t.addr, t.len) < 0) die("bind");
	if (socktype == SOCK_STREAM && listen(fd, o->backlog ? o->backlog : 128) < 0) die("listen");

	if (o->mode == UNIX_SERVER) {
		if (o->port_file) write_port_file(o->port_file, 0);
		printf("listening %s\n", o->path);
	} else {
		socklen_t len = sizeof t.addr;
		if (getsockname(fd, (struct sockaddr *)&t.addr, &len) < 0) die("getsockname");
		unsigned port = ntohs(t.addr.ss_family == AF_INET6
				      ? ((struct sockaddr_in6 *)&t.addr)->sin6_port
				      : ((struct sockaddr_in *)&t.addr)->sin_port);
		if (o->port_file) write_port_file(o->port_file, port);
		printf("listening %u\n", port);
	}
	fflush(stdout);
	return fd;
}

/* Accepts a connection (blocking) and greets it; -1 if accept4 should be retried. */
static int accept_one(int lfd) {
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC);
	if (fd < 0 && (errno == EINTR || errno == ECONNABORTED)) return -1;
	if (fd < 0) die("accept4");
	greet(fd, "accepted");
	return fd;
}

/* Echoes fd to EOF with buf (BUF_SIZE bytes), then shutdown(SHUT_WR) and close; returns the
 * bytes echoed. */
/* --sink: the server checks and counts what it reads and echoes nothing. */
static int sink_mode;
/* server --echo-delay: milliseconds to wait before each echo. */
static long echo_delay_ms;
/* --mixed: each read or write is the next of several calls in turn. */
static int mixed_mode;

/* A piece size for --mixed's turn k: from 1 byte to max, spread. */
static size_t mixed_size(unsigned long long k, size_t max) {
	size_t n = (size_t)((k * 2654435761ULL) >> 7) % max + 1;
	return (k % 7 == 0) ? max : n;
}

/* Reads up to len bytes of fd into buf by --mixed's turn k; as read(2). */
static ssize_t mixed_read(int fd, char *buf, size_t len, unsigned long long k) {
	len = mixed_size(k, len);
	switch (k % 5) {
	case 0: return read(fd, buf, len);
	case 1: return recv(fd, buf, len, 0);
	case 2: {
		struct iovec iov[2] = { { buf, len / 2 }, { buf + len / 2, len - len / 2 } };
		return readv(fd, iov, 2);
	}
	case 3: {
		/* Peeked bytes are the ones the next call returns. */
		char peek[64];
		size_t p = len < sizeof peek ? len : sizeof peek;
		ssize_t n = recv(fd, peek, p, MSG_PEEK);
		if (n <= 0) return n;
		ssize_t m = recv(fd, buf, (size_t)n, 0);
		if (m > 0 && memcmp(peek, buf, (size_t)m) != 0)
			fail(1, "MSG_PEEK saw other bytes than the read after it");
		return m;
	}
	default: return recv(fd, buf, len < 512 ? len : 512, MSG_WAITALL);
	}
}

/* Writes len bytes of buf (or fewer) to fd by --mixed's turn k; as write(2). mem is a memfd
 * that sendfile's turn copies the bytes through. */
static ssize_t mixed_write(int fd, int mem, const char *buf, size_t len, unsigned long long k) {
	switch (k % 6) {
	case 0: return write(fd, buf, len);
	case 1: {
		struct iovec iov[2] = { { (void *)buf, len / 2 }, { (void *)(buf + len / 2), len - len / 2 } };
		return writev(fd, iov, 2);
	}
	case 2: return send(fd, buf, len, 0);
	case 3: return send(fd, buf, len, MSG_MORE);
	case 4: {
		if (ftruncate(mem, 0) < 0) die("ftruncate");
		if (pwrite(mem, buf, len, 0) != (ssize_t)len) die("pwrite");
		off_t from = 0;
		return sendfile(fd, mem, &from, len);
	}
	default: {
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) die("fcntl O_NONBLOCK");
		ssize_t w = send(fd, buf, len, 0);
		int e = errno;
		if (fcntl(fd, F_SETFL, fl) < 0) die("fcntl");
		errno = e;
		return w;
	}
	}
}

/* The byte at offset off of what --send-exit writes and --sink expects. */
static unsigned char sink_byte(unsigned long long off) {
	return (unsigned char)((off * 2654435761ULL) >> 13);
}

static unsigned long long echo_conn(int fd, char *buf) {
	unsigned long long bytes = 0;
	for (;;) {
		static unsigned long long turn;
		ssize_t n = mixed_mode ? mixed_read(fd, buf, BUF_SIZE, turn++) : read(fd, buf, BUF_SIZE);
		if (n < 0 && errno == EINTR) continue;
		if (n < 0) die("read");
		if (n == 0) break;
		if (sink_mode) {
			for (ssize_t i = 0; i < n; i++)
				if ((unsigned char)buf[i] != sink_byte(bytes + (unsigned long long)i))
					fail(1, "mismatch at offset %llu", bytes + (unsigned long long)i);
			bytes += (unsigned long long)n;
			continue;
		}
		if (echo_delay_ms) sleep_ms(echo_delay_ms);
		for (ssize_t off = 0, w; off < n; off += w)
			if ((w = write(fd, buf + off, (size_t)(n - off))) < 0) {
				if (errno != EINTR) die("write");
				w = 0;
			}
		bytes += (unsigned long long)n;
	}
	shutdown_wr(fd);
	close(fd);
	return bytes;
}

/* Serves count connections one after the other; returns the bytes echoed. */
static unsigned long long serve_blocking(int lfd, unsigned long long count) {
	char *buf = xmalloc(BUF_SIZE);
	unsigned long long bytes = 0;
	for (unsigned long long done = 0; done < count;) {
		int fd = accept_one(lfd);
		if (fd < 0) continue;
		bytes += echo_conn(fd, buf);
		if (++done == 1) report_resources("_after_first");
	}
	free(buf);
	return bytes;
}

/* Serves count connections, each in a child process of its own; fails if a child does. */
static void serve_forked(int lfd, unsigned long long count) {
	unsigned long long running = 0;
	pid_t failed = 0;
	for (unsigned long long done = 0; done < count;) {
		int fd = accept_one(lfd), st;
		if (fd < 0) continue;
		fflush(stdout);
		pid_t pid = fork();
		if (pid < 0) die("fork");
		if (pid == 0) {
			die_status = 1;
			close(lfd);
			echo_conn(fd, xmalloc(BUF_SIZE));
			_exit(0);
		}
		running++;
		if (close(fd) < 0) die("close");
		if (++done == 1) report_resources("_after_first");
		/* Reap the children that are done already, so that they do not pile up. */
		while (running && (pid = waitpid(-1, &st, WNOHANG)) > 0) {
			running--;
			if (!failed && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) failed = pid;
		}
	}
	for (; running; running--) {
		int st;
		pid_t pid;
		while ((pid = waitpid(-1, &st, 0)) < 0)
			if (errno != EINTR) die("waitpid");
		if (!failed && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) failed = pid;
	}
	if (failed) fail(1, "child %d failed", (int)failed);
}

struct conn {
	int fd;
	int eof;         /* the peer has finished sending */
	int want_out;    /* EPOLLOUT is among the registered events */
	size_t off, len; /* buf[off..len) was read but is not echoed yet */
	char buf[BUF_SIZE];
};

/* Moves what data it can (edge-triggered: up to EAGAIN); returns 1 once c is finished.
 * Simple rather than fair: a peer that never stops sending keeps the others waiting. */
static int conn_service(int ep, struct conn *c, unsigned long long *bytes) {
	for (;;) {
		ssize_t n;
		if (c->off < c->len) {
			n = write(c->fd, c->buf + c->off, c->len - c->off);
			if (n < 0 && !again(errno)) die("write");
			if (n < 0 && errno != EINTR)
				break; /* EAGAIN: wait for EPOLLOUT */
			c->off += n > 0 ? (size_t)n : 0;
			continue;
		}
		if (c->eof) break;
		n = read(c->fd, c->buf, BUF_SIZE);
		if (n < 0 && !again(errno)) die("read");
		if (n < 0 && errno != EINTR)
			break; /* EAGAIN: wait for EPOLLIN */
		if (n < 0) continue;
		c->eof = n == 0;
		c->off = 0;
		c->len = (size_t)n;
		*bytes += (unsigned long long)n;
	}

	if (c->eof && c->off == c->len) {
		shutdown_wr(c->fd);
		close(c->fd);
		free(c);
		return 1;
	}
	if (c->want_out != (c->off < c->len)) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = c };
		c->want_out = c->off < c->len;
		if (c->want_out) ev.events |= EPOLLOUT;
		if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl MOD");
	}
	return 0;
}

/* Serves count connections concurrently with edge-triggered epoll; returns the bytes echoed
 * and, in *epfd, the epoll descriptor, for the caller to close. */
static unsigned long long serve_epoll(int lfd, unsigned long long count, int *epfd) {
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET, .data.ptr = NULL }, evs[64];
	unsigned long long accepted = 0, finished = 0, bytes = 0;
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0) die("epoll_create1");
	set_nonblocking(lfd);
	if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0) die("epoll_ctl ADD");

	while (finished < count) {
		int n = epoll_wait(ep, evs, (int)(sizeof evs / sizeof evs[0]), -1);
		if (n < 0 && errno != EINTR) die("epoll_wait");
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr) {
				if (conn_service(ep, evs[i].data.ptr, &bytes) && ++finished == 1)
					report_resources("_after_first");
				continue;
			}
			/* The listener: accept up to EAGAIN, but no more than count connections. */
			while (accepted < count) {
				struct sockaddr_storage ss;
				socklen_t len = sizeof ss;
				int fd = accept4(lfd, (struct sockaddr *)&ss, &len,
						 SOCK_NONBLOCK | SOCK_CLOEXEC);
				if (fd < 0 && (errno == EINTR || errno == ECONNABORTED)) continue;
				if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
				if (fd < 0) die("accept4");
				greet(fd, "accepted");
				struct conn *c = xmalloc(sizeof *c);
				*c = (struct conn){ .fd = fd };
				ev.data.ptr = c;
				if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl ADD");
				accepted++;
			}
		}
	}
	*epfd = ep;
	return bytes;
}

static void run_server(const struct opts *o) {
	int lfd = open_server(o, SOCK_STREAM), ep = -1;
	sink_mode = SEEN(o, OPT_SINK) != 0;
	echo_delay_ms = (long)o->echo_delay_ms;
	mixed_mode = SEEN(o, OPT_MIXED) != 0;
	if (o->accept_after_ms) {
		/* Connections pile up in the backlog (and beyond it) meanwhile. */
		struct timespec ts = { (time_t)(o->accept_after_ms / 1000),
				       (long)(o->accept_after_ms % 1000) * 1000000L };
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
	}
	if (SEEN(o, OPT_FORK)) {
		serve_forked(lfd, o->count);
		printf("served %llu connections (forked)\n", o->count);
	} else {
		unsigned long long bytes = SEEN(o, OPT_EPOLL) ? serve_epoll(lfd, o->count, &ep)
							       : serve_blocking(lfd, o->count);
		printf("served %llu connections, %llu bytes\n", o->count, bytes);
	}
	/* Before closing the listener and epoll: the _after_first counts had them too. */
	report_resources("");
	if (ep >= 0) close(ep);
	close(lfd);
	if (o->mode == UNIX_SERVER) unlink(o->path);
}

/* ---- clients ---- */

static uint64_t mix(uint64_t x) { /* splitmix64 */
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* The message of iteration iter: a per-offset pattern XORed with a per-iteration key. */
static void fill(uint64_t *msg, const uint64_t *base, size_t size, unsigned long long iter) {
	uint64_t key = mix(iter);
	for (size_t w = 0; w < (size + 7) / 8; w++) msg[w] = base[w] ^ key;
}

static void check(const char *got, const char *want, size_t size, unsigned long long iter) {
	if (memcmp(got, want, size) == 0) return;
	for (size_t off = 0; off < size; off++)
		if (got[off] != want[off])
			fail(1, "mismatch at iteration %llu offset %zu", iter, off);
}

/* --rcvtimeo: options a program sets before connect. */
static int rcvtimeo_ms;

static int client_connect(const struct target *t, enum io_mode io, int timeout_ms) {
	/* --select and --epoll ask socket() for a nonblocking socket, --poll uses fcntl. */
	int fd = socket(t->addr.ss_family,
			SOCK_STREAM | SOCK_CLOEXEC |
			(io == IO_SELECT || io == IO_EPOLL ? SOCK_NONBLOCK : 0), 0), err;
	socklen_t len = sizeof err;
	if (fd < 0) die("socket");
	if (io == IO_SELECT && fd >= FD_SETSIZE)
		fail(3, "descriptor %d is too large for select", fd);
	if (io == IO_POLL) set_nonblocking(fd);
	if (rcvtimeo_ms) {
		struct timeval tv = { .tv_sec = rcvtimeo_ms / 1000, .tv_usec = rcvtimeo_ms % 1000 * 1000 };
		int one = 1;
		if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0)
			die("setsockopt SO_RCVTIMEO");
		if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
			die("setsockopt TCP_NODELAY");
	}
	if (connect(fd, (const struct sockaddr *)&t->addr, t->len) == 0) return fd;
	if (io == IO_BLOCK || errno != EINPROGRESS) die("connect");
	if (timeout_ms) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int r;
		do r = poll(&p, 1, timeout_ms);
		while (r < 0 && errno == EINTR);
		if (r < 0) die("poll");
		if (r == 0) {
			printf("connect timed out after %d ms\n", timeout_ms);
			exit(5);
		}
	} else {
		wait_fd(fd, POLLOUT, io);
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) die("getsockopt SO_ERROR");
	if ((errno = err) != 0) die("connect");
	return fd;
}

/* One writev of msg[*sent..end), split where the header half ends; 0 if nothing was written. */
static int send_some(int fd, const char *msg, size_t head, size_t *sent, size_t end) {
	struct iovec iov[2];
	int cnt = 0;
	if (*sent < head) /* the header half */
		iov[cnt++] = (struct iovec){ (char *)msg + *sent, (end < head ? end : head) - *sent };
	if (end > head) {
		size_t from = *sent > head ? *sent : head;
		iov[cnt++] = (struct iovec){ (char *)msg + from, end - from };
	}
	ssize_t n = writev(fd, iov, cnt);
	if (n < 0 && again(errno)) return 0;
	if (n < 0) die("writev");
	*sent += (size_t)n;
	return 1;
}

/* One read into buf[*got..end); 0 if nothing was read. */
static int recv_some(int fd, char *buf, size_t *got, size_t end) {
	ssize_t n = read(fd, buf + *got, end - *got);
	if (n < 0 && again(errno)) return 0;
	if (n < 0) die("read");
	if (n == 0) fail(1, "unexpected end of stream");
	*got += (size_t)n;
	return 1;
}

/* Sends msg and reads its echo into in. */
static void round_trip(int fd, enum io_mode io, const char *msg, char *in, size_t size) {
	size_t head = size / 2, sent = 0, got = 0;
	while (got < size) {
		if (io == IO_BLOCK) {
			size_t limit = size - got < WINDOW ? size : got + WINDOW;
			if (sent < limit) send_some(fd, msg, head, &sent, limit);
			else recv_some(fd, in, &got, sent);
			continue;
		}
		int progress = sent < size ? send_some(fd, msg, head, &sent, size) : 0;
		progress |= recv_some(fd, in, &got, size);
		if (!progress) wait_fd(fd, sent < size ? POLLIN | POLLOUT : POLLIN, io);
	}
}

/* shutdown(SHUT_WR), then expect EOF and nothing before it, then close. */
static void finish(int fd, enum io_mode io) {
	char c;
	ssize_t n;
	shutdown_wr(fd);
	while ((n = read(fd, &c, 1)) != 0) {
		if (n > 0) fail(1, "data after end");
		if (!again(errno)) die("read");
		if (errno != EINTR) wait_fd(fd, POLLIN, io);
	}
	close(fd);
}

/* Writes size-byte chunks for o->stream seconds while reading the echo; never returns. */
__attribute__((noreturn)) static void run_stream(int fd, const struct opts *o) {
	char *out = xmalloc(o->size), *in = xmalloc(BUF_SIZE);
	unsigned long long sent = 0, got = 0;
	double deadline = now() + o->stream;
	size_t woff = 0;
	int writing = 1;
	for (size_t i = 0; i < o->size; i++) out[i] = (char)(i * 7 + 1);
	set_nonblocking(fd);
	for (;;) {
		int progress = 0;
		ssize_t n;
		if (writing && now() >= deadline) {
			writing = 0;
			if (shutdown(fd, SHUT_WR) < 0) peer_gone(strerror(errno));
		}
		if (writing) {
			if ((n = write(fd, out + woff, o->size - woff)) < 0 && !again(errno))
				peer_gone(strerror(errno));
			if (n > 0) {
				sent += (unsigned long long)n;
				woff = (woff + (size_t)n) % o->size;
				progress = 1;
			}
		}
		if ((n = read(fd, in, BUF_SIZE)) < 0 && !again(errno)) peer_gone(strerror(errno));
		if (n == 0 && (writing || got < sent)) peer_gone("end of stream");
		if (n == 0)
			break; /* the echo of everything, then EOF after our shutdown */
		if (n > 0) {
			got += (unsigned long long)n;
			progress = 1;
		}
		if (!progress) {
			struct pollfd p = { .fd = fd, .events = POLLIN | (writing ? POLLOUT : 0) };
			double left = deadline - now();
			int timeout = !writing ? -1 : left <= 0 ? 0 : (int)(left * 1000) + 1;
			if (poll(&p, 1, timeout) < 0 && errno != EINTR) die("poll");
		}
	}
	if (got != sent) fail(1, "echo returned %llu of %llu bytes", got, sent);
	printf("streamed %llu bytes\n", sent);
	close(fd);
	free(out);
	free(in);
	report_resources("");
	exit(0);
}

/* The round trips' messages: base is the per-offset pattern, msg and in hold one message. */
struct bufs {
	uint64_t *base, *msg;
	char *in;
};

static void bufs_init(struct bufs *b, size_t size) {
	size_t words = (size + 7) / 8;
	b->base = xmalloc(words * 8);
	b->msg = xmalloc(words * 8);
	b->in = xmalloc(size);
	for (size_t w = 0; w < words; w++) b->base[w] = mix(~(uint64_t)w);
}

static void bufs_free(struct bufs *b) {
	free(b->base);
	free(b->msg);
	free(b->in);
}

/* iters round trips of size bytes on fd, the "round_trips=" line, then finish(). */
static void round_trips(int fd, enum io_mode io, size_t size, unsigned long long iters) {
	struct bufs b;
	bufs_init(&b, size);
	double start = now();
	for (unsigned long long i = 0; i < iters; i++) {
		fill(b.msg, b.base, size, i);
		round_trip(fd, io, (const char *)b.msg, b.in, size);
		check(b.in, (const char *)b.msg, size, i);
	}
	double secs = now() - start;
	printf("round_trips=%llu size=%zu seconds=%.6f rtt_us=%.3f per_second=%.1f\n",
	       iters, size, secs, secs * 1e6 / (double)iters,
	       secs > 0 ? (double)iters / secs : 0.0);
	finish(fd, io);
	bufs_free(&b);
}

/* --fork and --exec: a child takes over the connected fd, the parent closes its copy, waits,
 * and exits with the child's status. */
__attribute__((noreturn)) static void run_child_client(int fd, const struct opts *o) {
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) die("fork");
	if (pid == 0 && SEEN(o, OPT_FORK)) {
		round_trips(fd, o->io, o->size, o->iters);
		exit(0);
	}
	if (pid == 0) {
		char fdarg[16], size[32], iters[32];
		char *args[] = { o->argv0, "client-fd", "--fd", fdarg, "--size", size,
				 "--iters", iters, NULL };
		int flags = fcntl(fd, F_GETFD);
		if (flags < 0) die("fcntl F_GETFD");
		if ((flags & FD_CLOEXEC) && fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0)
			die("fcntl F_SETFD");
		snprintf(fdarg, sizeof fdarg, "%d", fd);
		snprintf(size, sizeof size, "%zu", o->size);
		snprintf(iters, sizeof iters, "%llu", o->iters);
		execv("/proc/self/exe", args);
		die("execv /proc/self/exe");
	}
	if (close(fd) < 0) die("close");
	int status = wait_child(pid);
	printf("child exited %d\n", status);
	report_resources("");
	exit(status);
}

struct reader {
	int fd, err, done; /* done: set (atomically) once read() returned */
	ssize_t r;
};

static void *reader_main(void *arg) {
	struct reader *rd = arg;
	char c;
	ssize_t r;
	while ((r = read(rd->fd, &c, 1)) < 0 && errno == EINTR) {}
	rd->r = r;
	rd->err = errno;
	__atomic_store_n(&rd->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* --threads-close: close fd while another thread is blocked reading it. */
__attribute__((noreturn)) static void run_threads_close(int fd) {
	struct reader rd = { .fd = fd };
	pthread_t th;
	int rc = pthread_create(&th, NULL, reader_main, &rd);
	if (rc) {
		errno = rc;
		die("pthread_create");
	}
	sleep_ms(300);
	if (shutdown(fd, SHUT_RDWR) < 0 && errno != ENOTCONN) die("shutdown");
	if (close(fd) < 0) die("close");
	for (double deadline = now() + 5.0; !__atomic_load_n(&rd.done, __ATOMIC_ACQUIRE);) {
		if (now() >= deadline) {
			printf("reader stuck\n");
			exit(1);
		}
		sleep_ms(10);
	}
	if ((rc = pthread_join(th, NULL))) {
		errno = rc;
		die("pthread_join");
	}
	if (rd.r < 0) printf("reader returned %zd (%s)\n", rd.r, strerror(rd.err));
	else printf("reader returned %zd\n", rd.r);
	report_resources("");
	exit(0);
}

/* --threads-cancel's reader: blocks in read() on a connection nobody writes to. */
static void *cancelled_reader_main(void *arg) {
	int fd = *(int *)arg;
	char b[64];
	for (;;)
		if (read(fd, b, sizeof b) <= 0) return NULL;
}

/* Starts a thread running body(arg), cancels it after ms milliseconds and joins it, waiting at
 * most 5 s; returns 0 (its result in *res) or ETIMEDOUT. */
static int cancel_after(void *(*body)(void *), void *arg, long ms, void **res) {
	pthread_t th;
	int rc = pthread_create(&th, NULL, body, arg);
	if (rc) {
		errno = rc;
		die("pthread_create");
	}
	sleep_ms(ms);
	if ((rc = pthread_cancel(th))) {
		errno = rc;
		die("pthread_cancel");
	}
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	rc = pthread_timedjoin_np(th, res, &until);
	if (rc && rc != ETIMEDOUT) {
		errno = rc;
		die("pthread_timedjoin_np");
	}
	return rc;
}

/* --threads-cancel: 20 threads in turn block in read() on fd and are cancelled (after 0 to
 * 38 ms), as programs end their worker threads (iperf3 does). */
__attribute__((noreturn)) static void run_threads_cancel(int fd) {
	for (int i = 0; i < 20; i++) {
		void *res;
		if (cancel_after(cancelled_reader_main, &fd, 2 * i, &res)) {
			printf("reader %d stuck\n", i);
			exit(1);
		}
		if (res != PTHREAD_CANCELED) {
			printf("reader %d returned instead of being cancelled\n", i);
			exit(1);
		}
	}
	printf("readers cancelled 20\n");
	report_resources("");
	exit(0);
}

/* --connect-cancel's thread: a blocking connect to the target. */
static void *cancelled_connect_main(void *arg) {
	const struct target *t = arg;
	int fd = socket(t->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) die("socket");
	connect(fd, (const struct sockaddr *)&t->addr, t->len);
	return NULL;
}

/* --connect-cancel: a thread blocks in connect() to a host that answers nothing and is
 * cancelled after 100 ms; it must end cancelled within 5 s. */
__attribute__((noreturn)) static void run_connect_cancel(const struct target *t) {
	void *res;
	if (cancel_after(cancelled_connect_main, (void *)t, 100, &res)) {
		printf("connect stuck\n");
		exit(1);
	}
	printf(res == PTHREAD_CANCELED ? "connect cancelled\n" : "connect returned first\n");
	exit(0);
}

/* --edges' reader: one blocking read, with SIGALRM unblocked in this thread only. */
struct edge_read {
	int fd;
	ssize_t r;
	int err;
	volatile int done;
};

static void on_alarm(int sig) { (void)sig; }

static void *edge_reader_main(void *arg) {
	struct edge_read *x = arg;
	sigset_t alrm;
	char c;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
	x->r = read(x->fd, &c, 1);
	x->err = errno;
	x->done = 1;
	return NULL;
}

static const char *errno_name(int e) {
	switch (e) {
	case EAGAIN: return "EAGAIN";
	case EINTR: return "EINTR";
	case EPIPE: return "EPIPE";
	case ECONNRESET: return "ECONNRESET";
	case ENOTCONN: return "ENOTCONN";
	default: return strerror(e);
	}
}

/* --edges: see the header comment. */
__attribute__((noreturn)) static void run_edges(int fd) {
	char c, msg[64], in[64];
	struct timeval tv = { 0, 5000 }, none = { 0, 0 };
	sigset_t alrm;
	struct sigaction sa;
	ssize_t r;
	int e;

	/* 1. SO_RCVTIMEO: nothing comes, the read gives up. */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0) die("setsockopt SO_RCVTIMEO");
	double start = now();
	r = read(fd, &c, 1);
	e = errno;
	double took = now() - start;
	if (r >= 0 || e != EAGAIN) {
		printf("edges: the read with a 5 ms SO_RCVTIMEO returned %zd (%s), not EAGAIN\n", r,
		       r < 0 ? errno_name(e) : "no error");
		exit(1);
	}
	if (took > 2.0) {
		printf("edges: the read with a 5 ms SO_RCVTIMEO took %.3f s\n", took);
		exit(1);
	}
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none) < 0)
		die("setsockopt SO_RCVTIMEO 0");

	/* 2. EINTR in a reader thread: only it accepts SIGALRM. */
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	if (pthread_sigmask(SIG_BLOCK, &alrm, NULL)) die("pthread_sigmask");
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: the read must fail with EINTR */
	if (sigaction(SIGALRM, &sa, NULL) < 0) die("sigaction");
	for (int i = 0; i < 5; i++) {
		struct edge_read x = { fd, 0, 0, 0 };
		struct itimerval it = { { 0, 0 }, { 0, 100000 } };
		pthread_t t;
		if (pthread_create(&t, NULL, edge_reader_main, &x)) die("pthread_create");
		if (setitimer(ITIMER_REAL, &it, NULL) < 0) die("setitimer");
		for (int waited = 0; !x.done && waited < 3000; waited += 10) sleep_ms(10);
		if (!x.done) {
			printf("edges: eintr %d: the read went on (the signal went to another thread)\n", i);
			fflush(stdout);
			_exit(1);
		}
		pthread_join(t, NULL);
		if (x.r >= 0 || x.err != EINTR) {
			printf("edges: eintr %d: the interrupted read returned %zd (%s), not EINTR\n", i, x.r,
			       x.r < 0 ? errno_name(x.err) : "no error");
			exit(1);
		}
	}

	/* 3. The connection still works. */
	for (size_t i = 0; i < sizeof msg; i++) msg[i] = (char)(i * 7 + 1);
	round_trip(fd, IO_BLOCK, msg, in, sizeof msg);
	if (memcmp(in, msg, sizeof msg)) {
		printf("edges: the round trip after the interruptions came back changed\n");
		exit(1);
	}

	/* 4. Writing after shutting the write side down. */
	shutdown_wr(fd);
	r = send(fd, "x", 1, MSG_NOSIGNAL);
	e = errno;
	if (r >= 0 || e != EPIPE) {
		printf("edges: send after shutdown(SHUT_WR) returned %zd (%s), not EPIPE\n", r,
		       r < 0 ? errno_name(e) : "no error");
		exit(1);
	}
	signal(SIGPIPE, SIG_IGN);
	r = write(fd, "x", 1);
	e = errno;
	if (r >= 0 || e != EPIPE) {
		printf("edges: write after shutdown(SHUT_WR) returned %zd (%s), not EPIPE\n", r,
		       r < 0 ? errno_name(e) : "no error");
		exit(1);
	}

	/* 5. The server saw the end, and ends too. */
	r = read(fd, &c, 1);
	if (r != 0) {
		printf("edges: the read after the server's end returned %zd (%s), not 0\n", r,
		       r < 0 ? errno_name(errno) : "a byte");
		exit(1);
	}
	printf("edges rcvtimeo=EAGAIN eintr=5 epipe=EPIPE eof=0\n");
	if (close(fd) < 0) die("close");
	exit(0);
}

/* Waits at most 5 s in poll() (io IO_POLL), select() (IO_SELECT) or a one-descriptor epoll
 * set (IO_EPOLL, the set `ep`) for fd to be readable; exits 1 if it is not. */
static void handoff_wait(int fd, int ep, enum io_mode io, unsigned long long round,
			 const char *what) {
	int r;
	do {
		if (io == IO_EPOLL) {
			struct epoll_event ev;
			r = epoll_wait(ep, &ev, 1, 5000);
		} else if (io == IO_SELECT) {
			fd_set rd;
			struct timeval tv = { 5, 0 };
			FD_ZERO(&rd);
			FD_SET(fd, &rd);
			r = select(fd + 1, &rd, NULL, NULL, &tv);
		} else {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			r = poll(&p, 1, 5000);
		}
	} while (r < 0 && errno == EINTR);
	if (r < 0) die("handoffs: wait");
	if (r == 0) {
		printf("handoffs: %llu: %s saw nothing within 5 s\n", round, what);
		fflush(stdout);
		exit(1);
	}
}

/* handoff_wait in the one-shot set `ep`, re-armed first. */
static void handoff_oneshot(int fd, int ep, unsigned long long round, const char *what) {
	struct epoll_event ev = { .events = EPOLLIN | EPOLLONESHOT };
	ev.data.fd = fd;
	if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) < 0) die("epoll_ctl MOD");
	handoff_wait(fd, ep, IO_EPOLL, round, what);
}

/* Reads what is there now (MSG_DONTWAIT) into buf[*got..size]; 0 when nothing was. */
static size_t handoff_take(int fd, char *buf, size_t *got, size_t size, int flags) {
	ssize_t n = recv(fd, buf + *got, size - *got, flags | MSG_DONTWAIT);
	if (n < 0 && again(errno)) return 0;
	if (n < 0) die("handoffs: recv");
	if (n == 0) fail(1, "handoffs: the server ended the connection");
	if (!(flags & MSG_PEEK)) *got += (size_t)n;
	return (size_t)n;
}

/* --handoffs: see the header comment. */
static void run_handoffs(int fd, unsigned long long rounds) {
	enum { SIZE = 1000 };
	char msg[SIZE], in[SIZE];
	struct epoll_event ev = { .events = EPOLLIN };
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0) die("epoll_create1");
	ev.data.fd = fd;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl ADD");
	int once = epoll_create1(EPOLL_CLOEXEC);
	if (once < 0) die("epoll_create1");
	ev.events = EPOLLIN | EPOLLONESHOT;
	if (epoll_ctl(once, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl ADD");
	struct timeval bound = { 5, 0 };
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound) < 0)
		die("setsockopt SO_RCVTIMEO");
	if (rounds > 300) rounds = 300;
	for (unsigned long long i = 0; i < rounds; i++) {
		size_t got = 0;
		for (size_t k = 0; k < SIZE; k++) msg[k] = (char)mix(i * SIZE + k);
		if (i % 4 == 3) {
			/* An epoll_wait that finds nothing yet, before the write. */
			int r;
			do r = epoll_wait(ep, &ev, 1, 0);
			while (r < 0 && errno == EINTR);
			if (r < 0) die("handoffs: epoll_wait");
		}
		for (size_t off = 0; off < SIZE;) {
			ssize_t w = write(fd, msg + off, SIZE - off);
			if (w < 0 && errno == EINTR) continue;
			if (w < 0) die("handoffs: write");
			off += (size_t)w;
		}
		switch (i % 4) {
		case 0: /* epoll, one byte, then the one-shot set for the rest */
			handoff_wait(fd, ep, IO_EPOLL, i, "epoll_wait");
			while (!handoff_take(fd, in, &got, 1, 0))
				handoff_wait(fd, ep, IO_EPOLL, i, "epoll_wait");
			/* The rest (or what comes of it) must wake the one-shot set. */
			handoff_oneshot(fd, once, i, "a one-shot epoll_wait after a one-byte read");
			break;
		case 1: /* epoll, nothing read, then the one-shot set */
			handoff_wait(fd, ep, IO_EPOLL, i, "epoll_wait");
			handoff_oneshot(fd, once, i, "a one-shot epoll_wait after epoll_wait");
			break;
		case 3: /* blocking reads (SO_RCVTIMEO 5 s) after the empty epoll_wait */
			while (got < SIZE) {
				ssize_t n = read(fd, in + got, SIZE - got);
				if (n < 0 && errno == EINTR) continue;
				if (n < 0 && again(errno)) {
					printf("handoffs: %llu: a blocking read after epoll_wait saw "
					       "nothing within 5 s\n", i);
					fflush(stdout);
					exit(1);
				}
				if (n < 0) die("handoffs: read");
				if (n == 0) fail(1, "handoffs: the server ended the connection");
				got += (size_t)n;
			}
			break;
		case 2: { /* poll, then peeks until all of it shows */
			size_t seen = 0;
			double deadline = now() + 5.0;
			handoff_wait(fd, ep, IO_POLL, i, "poll");
			while ((seen = handoff_take(fd, in, &got, SIZE, MSG_PEEK)) < SIZE) {
				if (now() > deadline) {
					printf("handoffs: %llu: MSG_PEEK saw %zu of %d bytes within 5 s\n",
					       i, seen, SIZE);
					fflush(stdout);
					exit(1);
				}
				handoff_wait(fd, ep, IO_POLL, i, "poll before a peek");
			}
			break;
		}
		}
		while (got < SIZE)
			if (!handoff_take(fd, in, &got, SIZE, 0))
				handoff_wait(fd, ep, IO_SELECT, i, "select");
		check(in, msg, SIZE, i);
	}
	if (close(ep) < 0 || close(once) < 0) die("close");
	printf("handoffs=%llu\n", rounds);
}

static void run_client(const struct opts *o) {
	struct target t;
	int fd;
	if (o->mode == UNIX_CLIENT) unix_target(o->path, &t);
	else resolve(o->host, o->port, SOCK_STREAM, &t);
	if (SEEN(o, OPT_CONNECT_CANCEL)) run_connect_cancel(&t);
	if (o->shorts) {
		struct bufs b;
		bufs_init(&b, o->size);
		double start = now();
		for (unsigned long long i = 0; i < o->shorts; i++) {
			fd = client_connect(&t, o->io, o->connect_timeout_ms);
			greet(fd, NULL);
			fill(b.msg, b.base, o->size, i);
			round_trip(fd, o->io, (const char *)b.msg, b.in, o->size);
			check(b.in, (const char *)b.msg, o->size, i);
			finish(fd, o->io);
			if (i == 0) report_resources("_after_first");
		}
		printf("short_connections=%llu seconds=%.6f\n", o->shorts, now() - start);
		bufs_free(&b);
		report_resources("");
		return;
	}

	rcvtimeo_ms = o->rcvtimeo_ms;
	fd = client_connect(&t, o->io, o->connect_timeout_ms);
	if (rcvtimeo_ms) {
		struct timeval tv;
		int nodelay = 0;
		socklen_t tl = sizeof tv, nl = sizeof nodelay;
		if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &tl) < 0) die("getsockopt SO_RCVTIMEO");
		if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &nl) < 0)
			die("getsockopt TCP_NODELAY");
		printf("options rcvtimeo_ms=%ld nodelay=%d\n",
		       (long)tv.tv_sec * 1000 + (long)tv.tv_usec / 1000, nodelay);
	}
	if (SEEN(o, OPT_FCNTL_DUP)) {
		/* The connection goes on on a copy made with fcntl, numbered from 100. */
		int copy = fcntl(fd, F_DUPFD_CLOEXEC, 100);
		if (copy < 0) die("fcntl F_DUPFD_CLOEXEC");
		if (close(fd) < 0) die("close");
		fd = copy;
	}
	greet(fd, "connected");
	if (o->send_exit) {
		/* Writes and exits at once: no shutdown, no close, no waiting for the peer. What
		 * the kernel (or a preload) still holds must reach the peer all the same. */
		char *buf = xmalloc(BUF_SIZE);
		unsigned long long sent = 0, turn = 0;
		int mixed = SEEN(o, OPT_MIXED) != 0;
		int mem = mixed ? memfd_create("pingpong-mixed", 0) : -1;
		if (mixed && mem < 0) die("memfd_create");
		while (sent < o->send_exit) {
			size_t n = mixed ? mixed_size(turn, BUF_SIZE) : BUF_SIZE;
			if (o->send_exit - sent < n) n = (size_t)(o->send_exit - sent);
			for (size_t i = 0; i < n; i++) buf[i] = (char)sink_byte(sent + i);
			for (size_t off = 0; off < n;) {
				ssize_t w;
				if (mixed) w = mixed_write(fd, mem, buf + off, n - off, turn++);
				else w = write(fd, buf + off, n - off);
				if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
				if (w < 0) die("write");
				off += (size_t)w;
			}
			sent += n;
		}
		printf("sent %llu bytes\n", sent);
		fflush(stdout);
		exit(0);
	}
	if (o->stream > 0) run_stream(fd, o);
	if (SEEN(o, OPT_FORK) || SEEN(o, OPT_EXEC)) run_child_client(fd, o);
	if (SEEN(o, OPT_THREADS_CLOSE)) run_threads_close(fd);
	if (SEEN(o, OPT_THREADS_CANCEL)) run_threads_cancel(fd);
	if (SEEN(o, OPT_EDGES)) run_edges(fd);
	if (SEEN(o, OPT_HANDOFFS)) run_handoffs(fd, o->iters);
	round_trips(fd, o->io, o->size, o->iters);
	report_resources("");
}

/* client-fd: the round trips on an inherited, connected descriptor. */
static void run_client_fd(const struct opts *o) {
	int one = 1, flags = fcntl(o->fd, F_GETFL);
	if (flags < 0) die("fcntl F_GETFL on --fd");
	setsockopt(o->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* may fail: no matter */
	round_trips(o->fd, flags & O_NONBLOCK ? IO_POLL : IO_BLOCK, o->size, o->iters);
}

/* ---- UDP ---- */

static void run_udp_server(const struct opts *o) {
	int fd = open_server(o, SOCK_DGRAM);
	unsigned long long bytes = 0;
	char buf[BUF_SIZE];
	for (unsigned long long done = 0; done < o->count;) {
		struct sockaddr_storage from;
		socklen_t len = sizeof from;
		ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
		if (n < 0 && errno == EINTR) continue;
		if (n < 0) die("recvfrom");
		if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, len) < 0) die("sendto");
		bytes += (unsigned long long)n;
		done++;
	}
	printf("served %llu datagrams, %llu bytes\n", o->count, bytes);
	close(fd);
}

static void run_udp_client(const struct opts *o) {
	char msg[32], back[64];
	struct target t;
	ssize_t n;
	resolve(o->host, o->port, SOCK_DGRAM, &t);
	int fd = socket(t.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) die("socket");
	for (size_t i = 0; i < sizeof msg; i++) msg[i] = (char)mix(i);
	if (sendto(fd, msg, sizeof msg, 0, (struct sockaddr *)&t.addr, t.len) < 0) die("sendto");
	double deadline = now() + 5.0;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		double left = deadline - now();
		int r = poll(&p, 1, left <= 0 ? 0 : (int)(left * 1000) + 1);
		if (r < 0 && errno == EINTR) continue;
		if (r < 0) die("poll");
		if (r == 0) {
			errno = ETIMEDOUT;
			die("waiting 5 s for the udp echo");
		}
		if ((n = recv(fd, back, sizeof back, 0)) >= 0) break;
		if (!again(errno)) die("recv");
	}
	if (n != (ssize_t)sizeof msg || memcmp(back, msg, sizeof msg) != 0)
		fail(1, "udp echo differs (%zd bytes)", n);
	printf("udp ok\n");
	close(fd);
}

int main(int argc, char **argv) {
	struct opts o;
	setvbuf(stdout, NULL, _IOLBF, 0); /* each line reaches a test's pipe at once */
	signal(SIGPIPE, SIG_IGN);
	parse_args(argc, argv, &o);
	if (o.mode & STREAM_SERVERS) run_server(&o);
	else if (o.mode & STREAM_CLIENTS) run_client(&o);
	else if (o.mode == CLIENT_FD) run_client_fd(&o);
	else if (o.mode == UDP_SERVER) run_udp_server(&o);
	else run_udp_client(&o);
	return 0;
}
