/*
 * The sandbox's cgroup v2 mode on a HYBRID host: what /proc/<pid>/cgroup would say on a pure
 * cgroup v2 host, for the sandbox's Slurm daemons only (LD_PRELOAD on slurmdbd, slurmctld and
 * slurmd, inherited by slurmstepd). Development tool; never installed on a cluster.
 *
 * Why: on a hybrid host (cgroup v1 controllers bound to v1 hierarchies, a cgroup2 hierarchy
 * beside them) the sandbox gives its daemons a mount namespace whose /sys/fs/cgroup is the
 * cgroup2 hierarchy alone, so they see the unified hierarchy only, as on a pure v2 host. But
 * /proc/<pid>/cgroup is the kernel's list of every hierarchy the process is in, whatever is
 * mounted: it still starts with the v1 lines ("9:name=systemd:/", ...) and ends with the
 * unified one ("0::/..."). Slurm's cgroup/v2 plugin refuses that outright
 * (src/plugins/cgroup/v2/cgroup_v2.c, _get_proc_cg_path: "Hybrid mode is not supported",
 * fatal when the file does not start with '0', 24.11 and 26.05 alike).
 *
 * This library drops the v1 lines from that one file when a process of the daemon reads it
 * (open/openat/fopen of /proc/self|thread-self|<pid>[/task/<tid>]/cgroup): it hands back a
 * memfd holding only the "0::" line. Nothing else changes: the cgroup2 hierarchy, the cgroups
 * Slurm makes in it, the BPF device programs it and slurmiso_fence.so attach, and the kernel's
 * checks of every open are the real ones. The v1 hierarchies still exist on such a host; the
 * daemons' processes sit in the root cgroup of each (the v1 devices root allows everything),
 * so a device open is decided by the cgroup2 BPF programs alone. On a pure v2 host the file
 * already has only the "0::" line and the sandbox does not load this library.
 *
 * Jobs never see it: slurmstepd builds each task's environment from the job's, and slurmd
 * builds the Prolog's and Epilog's; neither carries LD_PRELOAD over.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* "/proc/self/cgroup", "/proc/thread-self/cgroup", "/proc/<n>/cgroup",
 * "/proc/<n>/task/<n>/cgroup" */
static int is_proc_cgroup(const char *p)
{
	if (!p || strncmp(p, "/proc/", 6) != 0)
		return 0;
	p += 6;
	if (strncmp(p, "self/", 5) == 0)
		p += 5;
	else if (strncmp(p, "thread-self/", 12) == 0)
		p += 12;
	else {
		if (!isdigit((unsigned char)*p))
			return 0;
		while (isdigit((unsigned char)*p))
			p++;
		if (*p++ != '/')
			return 0;
		if (strncmp(p, "task/", 5) == 0) {
			p += 5;
			if (!isdigit((unsigned char)*p))
				return 0;
			while (isdigit((unsigned char)*p))
				p++;
			if (*p++ != '/')
				return 0;
		}
	}
	return strcmp(p, "cgroup") == 0;
}

typedef int (*openat_fn)(int, const char *, int, ...);

/* The unified line of the real file, in a memfd; -1 (errno set) when the file cannot be read. */
static int unified_only(int dirfd, const char *path)
{
	static openat_fn real_openat;
	char buf[16384];
	size_t len = 0;
	ssize_t n;

	if (!real_openat)
		real_openat = (openat_fn)dlsym(RTLD_NEXT, "openat");
	int fd = real_openat(dirfd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while (len < sizeof(buf) - 1 && (n = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = '\0';
	int out = memfd_create("slurmiso-unified-cgroup", MFD_CLOEXEC);
	if (out < 0)
		return -1;
	for (char *line = buf, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			next++;
		size_t l = next ? (size_t)(next - line) : strlen(line);
		if (strncmp(line, "0::", 3) == 0 && write(out, line, l) != (ssize_t)l) {
			close(out);
			return -1;
		}
	}
	lseek(out, 0, SEEK_SET);
	return out;
}

#define OPEN_BODY(real_name, dirfd, path, flags)                                          \
	do {                                                                              \
		mode_t mode = 0;                                                          \
		if ((flags) & (O_CREAT | O_TMPFILE)) {                                    \
			va_list ap;                                                       \
			va_start(ap, flags);                                              \
			mode = (mode_t)va_arg(ap, int);                                   \
			va_end(ap);                                                       \
		}                                                                         \
		if (!((flags) & (O_WRONLY | O_RDWR)) && is_proc_cgroup(path))             \
			return unified_only(dirfd, path);                                 \
		static openat_fn real;                                                    \
		if (!real)                                                                \
			real = (openat_fn)dlsym(RTLD_NEXT, real_name);                    \
		return real(dirfd, path, flags, mode);                                    \
	} while (0)

typedef int (*open_fn)(const char *, int, ...);

#define OPEN_PLAIN(real_name, path, flags)                                                \
	do {                                                                              \
		mode_t mode = 0;                                                          \
		if ((flags) & (O_CREAT | O_TMPFILE)) {                                    \
			va_list ap;                                                       \
			va_start(ap, flags);                                              \
			mode = (mode_t)va_arg(ap, int);                                   \
			va_end(ap);                                                       \
		}                                                                         \
		if (!((flags) & (O_WRONLY | O_RDWR)) && is_proc_cgroup(path))             \
			return unified_only(AT_FDCWD, path);                              \
		static open_fn real;                                                      \
		if (!real)                                                                \
			real = (open_fn)dlsym(RTLD_NEXT, real_name);                      \
		return real(path, flags, mode);                                           \
	} while (0)

int open(const char *path, int flags, ...) { OPEN_PLAIN("open", path, flags); }
int open64(const char *path, int flags, ...) { OPEN_PLAIN("open64", path, flags); }
int openat(int dirfd, const char *path, int flags, ...) { OPEN_BODY("openat", dirfd, path, flags); }
int openat64(int dirfd, const char *path, int flags, ...)
{
	OPEN_BODY("openat64", dirfd, path, flags);
}

int __open_2(const char *path, int flags)
{
	if (!(flags & (O_WRONLY | O_RDWR)) && is_proc_cgroup(path))
		return unified_only(AT_FDCWD, path);
	static int (*real)(const char *, int);
	if (!real)
		real = (int (*)(const char *, int))dlsym(RTLD_NEXT, "__open_2");
	return real(path, flags);
}

int __open64_2(const char *path, int flags)
{
	if (!(flags & (O_WRONLY | O_RDWR)) && is_proc_cgroup(path))
		return unified_only(AT_FDCWD, path);
	static int (*real)(const char *, int);
	if (!real)
		real = (int (*)(const char *, int))dlsym(RTLD_NEXT, "__open64_2");
	return real(path, flags);
}

typedef FILE *(*fopen_fn)(const char *, const char *);

static FILE *fopen_common(const char *name, const char *path, const char *mode)
{
	if (mode && mode[0] == 'r' && !strchr(mode, '+') && is_proc_cgroup(path)) {
		int fd = unified_only(AT_FDCWD, path);
		return fd < 0 ? NULL : fdopen(fd, "r");
	}
	fopen_fn real = (fopen_fn)dlsym(RTLD_NEXT, name);
	return real(path, mode);
}

FILE *fopen(const char *path, const char *mode) { return fopen_common("fopen", path, mode); }
FILE *fopen64(const char *path, const char *mode) { return fopen_common("fopen64", path, mode); }
