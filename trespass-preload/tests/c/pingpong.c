/*
 * pingpong.c - a TCP echo client and server that know nothing about RDMA.
 *
 * trespass-preload's tests and benchmarks run it, with and without the preload, to exercise the
 * socket calls ordinary programs make: blocking and nonblocking connect and accept4, fcntl
 * O_NONBLOCK and SOCK_NONBLOCK, read/write/writev, poll, select, edge-triggered epoll, shutdown,
 * getpeername/getsockname, TCP_NODELAY. The udp-* and unix-* modes use sockets that the preload
 * must leave alone.
 *
 * pingpong server [--bind ADDR] --port P [--count N] [--epoll] [--port-file PATH]
 * pingpong client --host H --port P [--size S] [--iters N] [--poll|--select] [--short N]
 *                 [--stream SECONDS]
 * pingpong udp-server [--bind ADDR] --port P [--count N] [--port-file PATH]
 * pingpong udp-client --host H --port P
 * pingpong unix-server --path PATH [--count N] [--epoll]
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
 * and waits in select(). udp-client waits at most 5 s for the echo of one datagram.
 *
 * Results go to stdout, line-buffered; errors are one line on stderr starting "pingpong: ".
 * Exit status: 0 success, 1 wrong or missing echo data, 2 usage error, 3 system call failed,
 * 4 the peer went away during --stream (stdout: "peer gone: <reason>").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define BUF_SIZE (64 * 1024)
#define MAX_SIZE (16 * 1024 * 1024)
/* Bytes a blocking client keeps in flight: writing all of a large message before reading
 * would deadlock once its echo fills every buffer on the way back. */
#define WINDOW (256 * 1024)

enum { SERVER = 1, CLIENT = 2, UDP_SERVER = 4, UDP_CLIENT = 8, UNIX_SERVER = 16, UNIX_CLIENT = 32 };
#define INET_MODES (SERVER | CLIENT | UDP_SERVER | UDP_CLIENT)
#define STREAM_SERVERS (SERVER | UNIX_SERVER)
#define STREAM_CLIENTS (CLIENT | UNIX_CLIENT)

enum io_mode { IO_BLOCK, IO_POLL, IO_SELECT };

enum { OPT_BIND, OPT_PORT, OPT_HOST, OPT_PATH, OPT_COUNT, OPT_EPOLL, OPT_PORT_FILE, OPT_SIZE,
       OPT_ITERS, OPT_POLL, OPT_SELECT, OPT_SHORT, OPT_STREAM };
#define SEEN(o, opt) ((o)->seen & (1u << (opt)))

struct opts {
	unsigned mode, seen; /* seen: a bit per OPT_* given */
	const char *bind, *host, *path, *port_file;
	unsigned port;
	unsigned long long count, iters, shorts;
	size_t size;
	enum io_mode io;
	double stream; /* seconds; 0: off */
};

struct target {
	struct sockaddr_storage addr;
	socklen_t len;
};

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

/* A system call failed: report it with errno and exit 3. */
__attribute__((noreturn)) static void die(const char *what) {
	fail(3, "%s: %s", what, strerror(errno));
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
					     "unix-server", "unix-client" };
	static const struct { const char *name; int id, has_arg; unsigned modes; } options[] = {
		{ "--bind", OPT_BIND, 1, SERVER | UDP_SERVER },
		{ "--port", OPT_PORT, 1, INET_MODES },
		{ "--host", OPT_HOST, 1, CLIENT | UDP_CLIENT },
		{ "--path", OPT_PATH, 1, UNIX_SERVER | UNIX_CLIENT },
		{ "--count", OPT_COUNT, 1, STREAM_SERVERS | UDP_SERVER },
		{ "--epoll", OPT_EPOLL, 0, STREAM_SERVERS },
		{ "--port-file", OPT_PORT_FILE, 1, STREAM_SERVERS | UDP_SERVER },
		{ "--size", OPT_SIZE, 1, STREAM_CLIENTS },
		{ "--iters", OPT_ITERS, 1, STREAM_CLIENTS },
		{ "--poll", OPT_POLL, 0, STREAM_CLIENTS },
		{ "--select", OPT_SELECT, 0, STREAM_CLIENTS },
		{ "--short", OPT_SHORT, 1, STREAM_CLIENTS },
		{ "--stream", OPT_STREAM, 1, STREAM_CLIENTS },
	};
	const size_t n_options = sizeof options / sizeof options[0];

	*o = (struct opts){ .bind = "0.0.0.0", .count = 1, .iters = 1000, .size = 64 };
	for (size_t m = 0; argc >= 2 && m < sizeof modes / sizeof modes[0]; m++)
		if (!strcmp(argv[1], modes[m])) o->mode = 1u << m;
	if (!o->mode)
		fail(2, "%s mode (server, client, udp-server, udp-client, unix-server or "
		     "unix-client)", argc < 2 ? "missing" : "unknown");

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
		case OPT_SHORT: o->shorts = parse_num("--short", val, 1, 1000000000); break;
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
	if (SEEN(o, OPT_POLL) && SEEN(o, OPT_SELECT))
		fail(2, "--poll and --select exclude each other");
	if (o->shorts && o->stream > 0) fail(2, "--short and --stream exclude each other");
	if ((o->shorts || o->stream > 0) && SEEN(o, OPT_ITERS))
		fail(2, "--iters does not apply to --short or --stream");
	if (o->stream > 0 && !SEEN(o, OPT_SIZE)) o->size = BUF_SIZE;
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
static void wait_fd(int fd, short events, enum io_mode io) {
	int r;
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
	if (socktype == SOCK_STREAM && listen(fd, 128) < 0) die("listen");

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

/* Serves count connections one after the other; returns the bytes echoed. */
static unsigned long long serve_blocking(int lfd, unsigned long long count) {
	char *buf = xmalloc(BUF_SIZE);
	unsigned long long bytes = 0;
	for (unsigned long long done = 0; done < count;) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof ss;
		int fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC);
		if (fd < 0 && (errno == EINTR || errno == ECONNABORTED)) continue;
		if (fd < 0) die("accept4");
		greet(fd, "accepted");
		for (;;) {
			ssize_t n = read(fd, buf, BUF_SIZE);
			if (n < 0 && errno == EINTR) continue;
			if (n < 0) die("read");
			if (n == 0) break;
			for (ssize_t off = 0, w; off < n; off += w)
				if ((w = write(fd, buf + off, (size_t)(n - off))) < 0) {
					if (errno != EINTR) die("write");
					w = 0;
				}
			bytes += (unsigned long long)n;
		}
		shutdown_wr(fd);
		close(fd);
		done++;
	}
	free(buf);
	return bytes;
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

/* Serves count connections concurrently with edge-triggered epoll; returns the bytes echoed. */
static unsigned long long serve_epoll(int lfd, unsigned long long count) {
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
				if (conn_service(ep, evs[i].data.ptr, &bytes)) finished++;
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
	close(ep);
	return bytes;
}

static void run_server(const struct opts *o) {
	int lfd = open_server(o, SOCK_STREAM);
	unsigned long long bytes = SEEN(o, OPT_EPOLL) ? serve_epoll(lfd, o->count)
						       : serve_blocking(lfd, o->count);
	printf("served %llu connections, %llu bytes\n", o->count, bytes);
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

static int client_connect(const struct target *t, enum io_mode io) {
	/* --select asks socket() for a nonblocking socket, --poll uses fcntl. */
	int fd = socket(t->addr.ss_family,
			SOCK_STREAM | SOCK_CLOEXEC | (io == IO_SELECT ? SOCK_NONBLOCK : 0), 0), err;
	socklen_t len = sizeof err;
	if (fd < 0) die("socket");
	if (io == IO_SELECT && fd >= FD_SETSIZE)
		fail(3, "descriptor %d is too large for select", fd);
	if (io == IO_POLL) set_nonblocking(fd);
	if (connect(fd, (const struct sockaddr *)&t->addr, t->len) == 0) return fd;
	if (io == IO_BLOCK || errno != EINPROGRESS) die("connect");
	wait_fd(fd, POLLOUT, io);
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
	exit(0);
}

static void run_client(const struct opts *o) {
	struct target t;
	int fd;
	if (o->mode == UNIX_CLIENT) unix_target(o->path, &t);
	else resolve(o->host, o->port, SOCK_STREAM, &t);
	if (o->stream > 0) {
		fd = client_connect(&t, o->io);
		greet(fd, "connected");
		run_stream(fd, o);
	}

	size_t words = (o->size + 7) / 8;
	uint64_t *base = xmalloc(words * 8), *msg = xmalloc(words * 8);
	char *in = xmalloc(o->size);
	for (size_t w = 0; w < words; w++) base[w] = mix(~(uint64_t)w);
	double start = now();
	if (o->shorts) {
		for (unsigned long long i = 0; i < o->shorts; i++) {
			fd = client_connect(&t, o->io);
			greet(fd, NULL);
			fill(msg, base, o->size, i);
			round_trip(fd, o->io, (const char *)msg, in, o->size);
			check(in, (const char *)msg, o->size, i);
			finish(fd, o->io);
		}
		printf("short_connections=%llu seconds=%.6f\n", o->shorts, now() - start);
	} else {
		fd = client_connect(&t, o->io);
		greet(fd, "connected");
		start = now();
		for (unsigned long long i = 0; i < o->iters; i++) {
			fill(msg, base, o->size, i);
			round_trip(fd, o->io, (const char *)msg, in, o->size);
			check(in, (const char *)msg, o->size, i);
		}
		double secs = now() - start;
		printf("round_trips=%llu size=%zu seconds=%.6f rtt_us=%.3f per_second=%.1f\n",
		       o->iters, o->size, secs, secs * 1e6 / (double)o->iters,
		       secs > 0 ? (double)o->iters / secs : 0.0);
		finish(fd, o->io);
	}
	free(base);
	free(msg);
	free(in);
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
	else if (o.mode == UDP_SERVER) run_udp_server(&o);
	else run_udp_client(&o);
	return 0;
}
