/*
 * slurmiso_fence: closes the GPU devices a job was not given, in the job's own device cgroup.
 *
 * Slurm's device constraint (task/cgroup, ConstrainDevices=yes) denies the gres.conf files a
 * job was not allocated. Two things it cannot know about are slurmiso's to close:
 *   - a MIG instance the prolog created for this job (mig-dynamic): the shard hands the job
 *     /dev/nvidiaN, and every other instance's capability devices on the node stay open;
 *   - a job slurmiso refused: Slurm still allocated it a GPU, and an environment variable the
 *     job can change is no fence.
 * The prolog (root) writes what to deny into <state_dir>/fence/<job id>: "deny" lines must be
 * applied or the task does not start; "narrow" lines (what Slurm's constraint already covers
 * in substance) are applied where the device cgroup can take them (always, on cgroup v2).
 *
 * cgroup v1 (the task has a v1 "devices" controller): slurm_spank_task_init_privileged, in
 * the task's process as root after Slurm has put it into its step's device cgroup, writes
 * each rule into the devices.deny of the task's own cgroup.
 * cgroup v2 (unified hierarchy, no v1 devices controller): slurm_spank_task_post_fork, in
 * slurmstepd as root after Slurm has put the task into step_<s>/user/task_<t> and attached
 * its own device programs, and before any task may exec, attaches a BPF device program built
 * from the rules to that cgroup, beside Slurm's (see slurmiso_bpf.h for how they compose).
 * Either way the task and everything it starts can never open those devices again.
 *
 * Fail closed: a job with no fence file is a job slurmiso never isolated, and gets every NVIDIA
 * device denied; a fence that cannot be applied (no device controller or BPF, a cgroup that is
 * not this job's, an unreadable or untrusted file) makes the task fail with the reason in the
 * job's stderr and slurmd's log. Nothing here reads a value the job's user controls.
 *
 * plugstack.conf:
 *   required /usr/lib/slurm/slurmiso_fence.so state_dir=/run/slurmiso [gpu_majors=195,...]
 * state_dir may contain %n (node name, for several slurmd on one host); gpu_majors are the
 * character majors denied for a job without a fence, beside every "nvidia*" major in
 * /proc/devices.
 *
 * Built with -DSLURMISO_FENCE_TEST, this file is a small program instead of a plugin (no
 * Slurm needed): tests/unit/test_fence_v2.py drives fence_v2() and fence_v1() through it.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "slurmiso_bpf.h"

#ifdef SLURMISO_FENCE_TEST
#define slurm_error(...) (fprintf(stderr, "error: " __VA_ARGS__), fputc('\n', stderr))
#define slurm_info(...) (fprintf(stderr, "info: " __VA_ARGS__), fputc('\n', stderr))
#else
#include <slurm/spank.h>

SPANK_PLUGIN(slurmiso_fence, 1);
#endif

#define MAX_RULES 8192
#define MAX_LINE 128
#define MAX_MAJORS 32

static char state_dir[512] = "/run/slurmiso";
static int extra_majors[MAX_MAJORS];
static int n_extra_majors;

static int parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "state_dir=", 10) == 0) {
			if (snprintf(state_dir, sizeof(state_dir), "%s", av[i] + 10) >=
			    (int)sizeof(state_dir)) {
				slurm_error("slurmiso_fence: state_dir too long");
				return -1;
			}
		} else if (strncmp(av[i], "gpu_majors=", 11) == 0) {
			char *s = av[i] + 11, *end;
			while (*s && n_extra_majors < MAX_MAJORS) {
				long m = strtol(s, &end, 10);
				if (end == s || m < 0 || m > 4095) {
					slurm_error("slurmiso_fence: bad gpu_majors '%s'", av[i]);
					return -1;
				}
				extra_majors[n_extra_majors++] = (int)m;
				s = (*end == ',') ? end + 1 : end;
			}
		} else {
			slurm_error("slurmiso_fence: unknown argument '%s'", av[i]);
			return -1;
		}
	}
	return 0;
}

/* state_dir with %n replaced by this slurmd's node name. */
static int fence_path(char *out, size_t len, uint32_t job_id)
{
	char dir[600];
	const char *node = getenv("SLURMD_NODENAME");
	char host[256];
	size_t o = 0;

	if (!node || !*node) {
		if (gethostname(host, sizeof(host)) != 0)
			return -1;
		host[sizeof(host) - 1] = '\0';
		char *dot = strchr(host, '.');
		if (dot)
			*dot = '\0';
		node = host;
	}
	for (const char *p = state_dir; *p && o + 1 < sizeof(dir); p++) {
		if (p[0] == '%' && p[1] == 'n') {
			int w = snprintf(dir + o, sizeof(dir) - o, "%s", node);
			if (w < 0 || (size_t)w >= sizeof(dir) - o)
				return -1;
			o += (size_t)w;
			p++;
		} else {
			dir[o++] = *p;
		}
	}
	dir[o] = '\0';
	int w = snprintf(out, len, "%s/fence/%u", dir, job_id);
	return (w < 0 || (size_t)w >= len) ? -1 : 0;
}

/*
 * The v1 devices cgroup directory this task must be fenced in, only if it is this job's.
 * Slurm puts a task into <step>/task_<id> (batch steps) or does so later (srun steps, in
 * task/cgroup's post_set_affinity, which then writes devices.allow for the task's GRES there).
 * A deny written into the *step* cgroup would make that later allow fail (its parent denies
 * it) and the launch with it; so the fence always goes into the task's own cgroup, made here
 * when Slurm has not made it yet, and the task moves itself in. A later allow of one GPU
 * minor leaves a "c 195:*" deny in place (cgroup v1 removes only identical exceptions).
 */
static int own_devices_cgroup(char *out, size_t len, uint32_t job_id, int task_id)
{
	FILE *fh = fopen("/proc/self/cgroup", "re");
	char line[1024], path[900] = "";
	char want[64], dir[1000];

	if (!fh)
		return -1;
	while (fgets(line, sizeof(line), fh)) {
		char *c1 = strchr(line, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c2 = '\0';
		char *ctl = c1 + 1, *tok, *save = NULL;
		int is_devices = 0;
		for (tok = strtok_r(ctl, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
			if (strcmp(tok, "devices") == 0)
				is_devices = 1;
		if (is_devices) {
			snprintf(path, sizeof(path), "%s", c2 + 1);
			path[strcspn(path, "\n")] = '\0';
			break;
		}
	}
	fclose(fh);
	if (!path[0])
		return -1; /* no v1 devices controller */
	snprintf(want, sizeof(want), "/job_%u/", job_id);
	if (!strstr(path, want))
		return -2; /* not in this job's cgroup: ConstrainDevices is off */
	const char *base = strrchr(path, '/');
	if (base && strncmp(base, "/task_", 6) == 0) {
		snprintf(dir, sizeof(dir), "/sys/fs/cgroup/devices%s", path);
	} else {
		char procs[1100], pid[32];
		snprintf(dir, sizeof(dir), "/sys/fs/cgroup/devices%s/task_%d", path, task_id);
		if (mkdir(dir, 0755) != 0 && errno != EEXIST)
			return -3;
		snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
		int fd = open(procs, O_WRONLY | O_CLOEXEC);
		int n = snprintf(pid, sizeof(pid), "%d", (int)getpid());
		if (fd < 0 || write(fd, pid, (size_t)n) != n) {
			if (fd >= 0)
				close(fd);
			return -3;
		}
		close(fd);
	}
	int w = snprintf(out, len, "%s/devices.deny", dir);
	return (w < 0 || (size_t)w >= len) ? -1 : 0;
}

/* "c 195:3", "c 237:*": type, major, minor or '*'; anything else is rejected. */
static int valid_rule(const char *r)
{
	if ((r[0] != 'c' && r[0] != 'b') || r[1] != ' ')
		return 0;
	const char *p = r + 2;
	if (!isdigit((unsigned char)*p))
		return 0;
	while (isdigit((unsigned char)*p))
		p++;
	if (*p++ != ':')
		return 0;
	if (*p == '*')
		return p[1] == '\0';
	if (!isdigit((unsigned char)*p))
		return 0;
	while (isdigit((unsigned char)*p))
		p++;
	return *p == '\0';
}

static int deny(int fd, const char *rule)
{
	char buf[MAX_LINE + 8];
	int n = snprintf(buf, sizeof(buf), "%s rwm", rule);
	if (write(fd, buf, (size_t)n) != n) {
		slurm_error("slurmiso_fence: cannot deny '%s': %s", rule, strerror(errno));
		return -1;
	}
	return 0;
}

/* Every NVIDIA character major: gpu_majors, then each "nvidia*" of /proc/devices. */
static int nvidia_majors(int *out, int max)
{
	char line[256];
	FILE *fh = fopen("/proc/devices", "r");
	int in_char = 0, n = 0;

	for (int i = 0; i < n_extra_majors && n < max; i++)
		out[n++] = extra_majors[i];
	if (!fh)
		return n;
	while (fgets(line, sizeof(line), fh) && n < max) {
		int major;
		char name[128];
		if (strncmp(line, "Character devices:", 18) == 0) {
			in_char = 1;
			continue;
		}
		if (strncmp(line, "Block devices:", 14) == 0)
			in_char = 0;
		if (in_char && sscanf(line, "%d %127s", &major, name) == 2 &&
		    strncmp(name, "nvidia", 6) == 0)
			out[n++] = major;
	}
	fclose(fh);
	return n;
}

/* No fence: deny every NVIDIA character major (from /proc/devices and gpu_majors). */
static int deny_all_gpus(int fd)
{
	char rule[64];
	int majors[MAX_MAJORS * 2], n = nvidia_majors(majors, MAX_MAJORS * 2), rc = 0;

	for (int i = 0; i < n; i++) {
		snprintf(rule, sizeof(rule), "c %d:*", majors[i]);
		rc |= deny(fd, rule);
	}
	return rc;
}

/*
 * cgroup v1: the task (this process) denies the rules in its own devices cgroup. Unchanged
 * since the v1 fence was proved in the sandbox (tests/integration/test_fences.py).
 */
static int fence_v1(uint32_t job_id, int task_id, const char *fpath)
{
	char cgpath[1200], line[MAX_LINE + 2];
	struct stat st;
	int rules = 0, rc = 0;

	int cg = own_devices_cgroup(cgpath, sizeof(cgpath), job_id, task_id);

	FILE *fh = fopen(fpath, "re");
	if (!fh && errno != ENOENT) {
		slurm_error("slurmiso_fence: job %u: cannot read %s: %s", job_id, fpath,
			    strerror(errno));
		return -1;
	}
	if (fh && (fstat(fileno(fh), &st) != 0 || st.st_uid != 0 || (st.st_mode & 022) ||
		   !S_ISREG(st.st_mode))) {
		fclose(fh);
		slurm_error("slurmiso_fence: job %u: %s is not a root-owned file: refusing the task",
			    job_id, fpath);
		return -1;
	}
	if (cg != 0) {
		/* Without the job's device cgroup nothing can be fenced: fine only for an empty
		 * fence (Slurm's constraint alone is the isolation), fatal otherwise. */
		int needed = 1;
		if (fh) {
			needed = 0; /* "narrow" lines are only applied where they can be */
			while (fgets(line, sizeof(line), fh))
				if (strncmp(line, "deny ", 5) == 0)
					needed = 1;
			fclose(fh);
		}
		if (!needed)
			return 0;
		slurm_error("slurmiso_fence: job %u: %s; the job's GPU fence cannot be applied, so "
			    "the task does not start (set ConstrainDevices=yes, see slurmiso's "
			    "docs/security.md)",
			    job_id,
			    cg == -2   ? "the task is not in this job's devices cgroup"
			    : cg == -3 ? "cannot make or enter the task's devices cgroup"
				       : "no cgroup v1 devices controller");
		return -1;
	}
	int fd = open(cgpath, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		if (fh)
			fclose(fh);
		slurm_error("slurmiso_fence: job %u: cannot open %s: %s", job_id, cgpath,
			    strerror(errno));
		return -1;
	}
	if (!fh) {
		char dir[720];
		snprintf(dir, sizeof(dir), "%s", fpath);
		*strrchr(dir, '/') = '\0'; /* .../fence */
		*strrchr(dir, '/') = '\0'; /* the node's state dir */
		if (stat(dir, &st) != 0) { /* slurmiso does not manage this node */
			close(fd);
			return 0;
		}
		rc = deny_all_gpus(fd);
		close(fd);
		slurm_info("slurmiso_fence: job %u has no slurmiso record on this node: every GPU "
			   "device denied", job_id);
		return rc ? -1 : 0;
	}
	while (fgets(line, sizeof(line), fh)) {
		size_t n = strcspn(line, "\n");
		if (line[n] != '\n' && !feof(fh)) {
			slurm_error("slurmiso_fence: job %u: overlong line in %s", job_id, fpath);
			rc = -1;
			break;
		}
		line[n] = '\0';
		if (line[0] == '#' || line[0] == '\0')
			continue;
		const char *rule = NULL;
		if (strncmp(line, "deny ", 5) == 0)
			rule = line + 5;
		else if (strncmp(line, "narrow ", 7) == 0)
			rule = line + 7;
		if (!rule || !valid_rule(rule) || ++rules > MAX_RULES) {
			slurm_error("slurmiso_fence: job %u: bad line in %s: '%s'", job_id, fpath,
				    line);
			rc = -1;
			break;
		}
		if (deny(fd, rule) != 0) {
			rc = -1;
			break;
		}
	}
	fclose(fh);
	close(fd);
	return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------ cgroup v2 */

/* Does process pid (0: this one) have a cgroup v1 "devices" controller? */
static int has_v1_devices(pid_t pid)
{
	char path[64], line[1024];
	int found = 0;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/cgroup");
	FILE *fh = fopen(path, "re");
	if (!fh)
		return 0;
	while (!found && fgets(line, sizeof(line), fh)) {
		char *c1 = strchr(line, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c2 = '\0';
		char *save = NULL;
		for (char *tok = strtok_r(c1 + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
			if (strcmp(tok, "devices") == 0)
				found = 1;
	}
	fclose(fh);
	return found;
}

/* Where the unified (cgroup2) hierarchy is mounted: /sys/fs/cgroup on a pure v2 host,
 * /sys/fs/cgroup/unified on a hybrid one. */
static int cgroup2_mount(char *out, size_t len)
{
	char line[4096];
	FILE *fh = fopen("/proc/self/mountinfo", "re");
	int rc = -1;

	if (!fh)
		return -1;
	while (rc != 0 && fgets(line, sizeof(line), fh)) {
		char *sep = strstr(line, " - ");
		char mnt[1024];
		if (!sep || strncmp(sep + 3, "cgroup2 ", 8) != 0)
			continue;
		/* id parent major:minor root mountpoint ... */
		if (sscanf(line, "%*s %*s %*s %*s %1023s", mnt) == 1 &&
		    snprintf(out, len, "%s", mnt) < (int)len)
			rc = 0;
	}
	fclose(fh);
	return rc;
}

/* The "0::" (unified) cgroup path of process pid (0: this one), "" if none. */
static int unified_path(pid_t pid, char *out, size_t len)
{
	char path[64], line[1024];

	out[0] = '\0';
	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/cgroup");
	FILE *fh = fopen(path, "re");
	if (!fh)
		return -1;
	while (fgets(line, sizeof(line), fh))
		if (strncmp(line, "0::", 3) == 0) {
			snprintf(out, len, "%s", line + 3);
			out[strcspn(out, "\n")] = '\0';
			break;
		}
	fclose(fh);
	return out[0] ? 0 : -1;
}

/* A SLUID as Slurm 26.05 prints it (src/common/sluid.c, print_sluid): "s" and 13 digits of
 * Crockford's base32, upper case. */
static int is_sluid(const char *s, size_t n)
{
	static const char cb32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
	if (n != 14 || s[0] != 's')
		return 0;
	for (size_t i = 1; i < n; i++)
		if (!s[i] || !strchr(cb32, s[i]))
			return 0;
	return 1;
}

/*
 * The job directory of a cgroup v2 path, ".../<job dir>/step_...": its offset and length in
 * cg (-1: none). Slurm's cgroup/v2 plugin names it job_<id> (up to 25.11, and from 26.05 with
 * CgroupJobIdPaths=yes) or by the job's SLUID (26.05's default, cgroup_p_step_create).
 */
static int job_dir_of(const char *cg, size_t *len)
{
	const char *step = strstr(cg, "/step_");
	if (!step || step == cg)
		return -1;
	const char *start = step;
	while (start > cg && start[-1] != '/')
		start--;
	if (start == step)
		return -1;
	*len = (size_t)(step - start);
	return (int)(start - cg);
}

/* Process whose own cgroup names this job's directory: slurmstepd itself (Slurm moved it into
 * <job dir>/step_<s>/slurm before any task forks); the test program names one (stepd=PID). */
static pid_t stepd_pid;

/*
 * Whether cgroup path cg is in job job_id's directory: named job_<job_id>, or a SLUID that is
 * the job directory of this step's slurmstepd too (same path up to it), since nothing else
 * tells a SLUID's job id here (SPANK has no SLUID item in 26.05).
 */
static int is_this_jobs(const char *cg, uint32_t job_id)
{
	char want[32], stepd[1024];
	size_t n = 0, m = 0;
	int off = job_dir_of(cg, &n);

	if (off < 0)
		return 0;
	snprintf(want, sizeof(want), "job_%u", job_id);
	if (n == strlen(want) && strncmp(cg + off, want, n) == 0)
		return 1;
	if (!is_sluid(cg + off, n) || unified_path(stepd_pid, stepd, sizeof(stepd)) != 0)
		return 0;
	int soff = job_dir_of(stepd, &m);
	return soff == off && m == n && strncmp(stepd, cg, (size_t)off + n) == 0;
}

/*
 * The task's own v2 cgroup directory, only if it is this job's. Under Slurm's cgroup/v2 the
 * task is in <scope>/<job dir>/step_<s>/user/task_<t> (or task_special) when task_post_fork
 * runs (the job dir is job_<j>, or the job's SLUID on 26.05: see is_this_jobs); anywhere
 * else under the job it is moved into a new leaf task_<t> of its current
 * cgroup (a leaf, so v2's "no internal processes" rule holds: its parent kept no
 * controller enabled, or the task could not have been there). Returns 0, -2 (not this
 * job's cgroup), -3 (cannot make or enter the leaf) or -1 (no unified hierarchy).
 */
static int task_v2_cgroup(char *out, size_t len, const char *mount, pid_t pid,
			  uint32_t job_id, uint32_t task_id)
{
	char cg[1024];

	if (unified_path(pid, cg, sizeof(cg)) != 0)
		return -1;
	if (!is_this_jobs(cg, job_id) || strstr(cg, "/../") || strstr(cg, "(deleted)"))
		return -2;
	const char *base = strrchr(cg, '/');
	int w;
	if (base && strncmp(base, "/task_", 6) == 0) {
		w = snprintf(out, len, "%s%s", mount, cg);
		return (w < 0 || (size_t)w >= len) ? -3 : 0;
	}
	char procs[1500], spid[32];
	w = snprintf(out, len, "%s%s/task_%u", mount, cg, task_id);
	if (w < 0 || (size_t)w >= len || (mkdir(out, 0755) != 0 && errno != EEXIST))
		return -3;
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", out);
	int fd = open(procs, O_WRONLY | O_CLOEXEC);
	int n = snprintf(spid, sizeof(spid), "%d", (int)pid);
	if (fd < 0 || write(fd, spid, (size_t)n) != n) {
		if (fd >= 0)
			close(fd);
		return -3;
	}
	close(fd);
	return 0;
}

/*
 * The job's rules as the v2 program needs them: every "deny" and "narrow" line; for a job
 * without a fence file on a node slurmiso manages, every NVIDIA major. Returns the number of
 * rules (0: nothing to fence) or -1 (refuse the task; the reason is logged); *needed is set
 * when a rule must be applied (any but "narrow" ones).
 */
static int read_rules_v2(uint32_t job_id, const char *fpath, struct fence_rule *out, int max,
			 int *needed)
{
	char line[MAX_LINE + 2];
	struct stat st;
	int n = 0;
	FILE *fh = fopen(fpath, "re");

	if (!fh && errno != ENOENT) {
		slurm_error("slurmiso_fence: job %u: cannot read %s: %s: the task does not "
			    "start", job_id, fpath, strerror(errno));
		return -1;
	}
	if (!fh) {
		char dir[720];
		int majors[MAX_MAJORS * 2], nm;
		snprintf(dir, sizeof(dir), "%s", fpath);
		*strrchr(dir, '/') = '\0'; /* .../fence */
		*strrchr(dir, '/') = '\0'; /* the node's state dir */
		if (stat(dir, &st) != 0)   /* slurmiso does not manage this node */
			return 0;
		nm = nvidia_majors(majors, MAX_MAJORS * 2);
		*needed = 1;
		for (int i = 0; i < nm && n < max; i++)
			out[n++] = (struct fence_rule){BPF_DEVCG_DEV_CHAR, (uint32_t)majors[i], -1};
		slurm_info("slurmiso_fence: job %u has no slurmiso record on this node: every GPU "
			   "device denied", job_id);
		return n;
	}
	if (fstat(fileno(fh), &st) != 0 || st.st_uid != 0 || (st.st_mode & 022) ||
	    !S_ISREG(st.st_mode)) {
		fclose(fh);
		slurm_error("slurmiso_fence: job %u: %s is not a root-owned file: the task does "
			    "not start",
			    job_id, fpath);
		return -1;
	}
	while (fgets(line, sizeof(line), fh)) {
		size_t len = strcspn(line, "\n");
		if (line[len] != '\n' && !feof(fh)) {
			slurm_error("slurmiso_fence: job %u: overlong line in %s: the task does not "
				    "start", job_id, fpath);
			n = -1;
			break;
		}
		line[len] = '\0';
		if (line[0] == '#' || line[0] == '\0')
			continue;
		const char *rule = NULL;
		if (strncmp(line, "deny ", 5) == 0) {
			rule = line + 5;
			*needed = 1;
		} else if (strncmp(line, "narrow ", 7) == 0) {
			rule = line + 7;
		}
		if (!rule || !valid_rule(rule) || n >= max || fence_parse_rule(rule, &out[n]) != 0) {
			slurm_error("slurmiso_fence: job %u: bad line in %s: '%s': the task does not "
				    "start", job_id, fpath, line);
			n = -1;
			break;
		}
		n++;
	}
	fclose(fh);
	return n;
}

/*
 * cgroup v2: fence task pid (global task id task_id) of job job_id with the rules of fpath,
 * by a BPF device program on the task's own cgroup, composed with Slurm's. 0 or -1 (refuse).
 */
static int fence_v2(uint32_t job_id, uint32_t task_id, pid_t pid, const char *fpath)
{
	static struct fence_rule rules[MAX_RULES];
	char mount[256], cgdir[1400], err[1600];
	struct bpf_insn *prog = NULL;
	int needed = 0, cg = -1, rc = -1;
	int n = read_rules_v2(job_id, fpath, rules, MAX_RULES, &needed);

	if (n <= 0)
		return n; /* nothing to fence (Slurm's constraint is the whole fence), or refused */
	if (cgroup2_mount(mount, sizeof(mount)) == 0)
		cg = task_v2_cgroup(cgdir, sizeof(cgdir), mount, pid, job_id, task_id);
	if (cg != 0 && !needed)
		return 0; /* only "narrow" lines: applied where they can be, as on v1 */
	if (cg != 0) {
		slurm_error("slurmiso_fence: job %u task %u: %s; the job's GPU fence cannot be "
			    "applied, so the task does not start (set ConstrainDevices=yes, see "
			    "slurmiso's docs/security.md)", job_id, task_id,
			    cg == -2   ? "the task is not in this job's cgroup"
			    : cg == -3 ? "cannot make or enter the task's cgroup"
				       : "no cgroup v1 devices controller and no cgroup v2 hierarchy");
		return -1;
	}
	int max = 8 + n * 7;
	int fd = -1;
	prog = calloc((size_t)max, sizeof(*prog));
	int ni = prog ? fence_build_prog(rules, n, prog, max) : -1;
	if (ni < 0) {
		slurm_error("slurmiso_fence: job %u task %u: cannot build the device program of %d "
			    "rule(s): the task does not start", job_id, task_id, n);
		goto out;
	}
	fd = fence_prog_load(prog, ni, "Apache-2.0");
	if (fd < 0) {
		slurm_error("slurmiso_fence: job %u task %u: the kernel refused the BPF device "
			    "program (%s; needs CONFIG_CGROUP_BPF and root): the task does not start",
			    job_id, task_id, strerror(errno));
		goto out;
	}
	if (fence_attach(cgdir, fd, pid, err, sizeof(err)) != 0) {
		slurm_error("slurmiso_fence: job %u task %u: %s: the task does not start", job_id,
			    task_id, err);
		goto out;
	}
	rc = 0;
out:
	if (fd >= 0)
		close(fd); /* the cgroup holds the program now */
	free(prog);
	return rc;
}

#ifndef SLURMISO_FENCE_TEST
/* ------------------------------------------------------------------------ SPANK hooks */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	(void)sp;
	return parse_args(ac, av) == 0 ? ESPANK_SUCCESS : ESPANK_BAD_ARG;
}

/* In the task, as root, before it becomes the user: the v1 fence. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0;
	int task_id = 0;
	char fpath[700], mount[256];

	(void)ac;
	(void)av;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS || job_id == 0) {
		slurm_error("slurmiso_fence: no job id: refusing the task");
		return -1;
	}
	if (fence_path(fpath, sizeof(fpath), job_id) != 0) {
		slurm_error("slurmiso_fence: job %u: fence path too long", job_id);
		return -1;
	}
	/* no v1 devices controller but a unified hierarchy: slurm_spank_task_post_fork
	 * fences the task, once Slurm has put it into its v2 cgroup */
	if (!has_v1_devices(0) && cgroup2_mount(mount, sizeof(mount)) == 0)
		return 0;
	if (spank_get_item(sp, S_TASK_ID, &task_id) != ESPANK_SUCCESS)
		task_id = 0;
	return fence_v1(job_id, task_id, fpath);
}

/* In slurmstepd, as root, after Slurm put task N into its cgroup, before any task execs
 * (a failure here fails the step; the waiting tasks never exec): the v2 fence. */
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0, task_id = 0;
	pid_t pid = 0;
	char fpath[700];

	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return 0;
	/* the extern step's container process (PrologFlags=Contain) comes here as task -1:
	 * no task, as for the v1 fence (docs/security.md: what it does not cover) */
	if (spank_get_item(sp, S_TASK_PID, &pid) == ESPANK_NOT_TASK)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS || job_id == 0 ||
	    spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || pid <= 0 ||
	    spank_get_item(sp, S_TASK_GLOBAL_ID, &task_id) != ESPANK_SUCCESS) {
		slurm_error("slurmiso_fence: no job id, task pid or task id: refusing the task");
		return -1;
	}
	if (has_v1_devices(pid))
		return 0; /* fenced by slurm_spank_task_init_privileged */
	if (fence_path(fpath, sizeof(fpath), job_id) != 0) {
		slurm_error("slurmiso_fence: job %u: fence path too long", job_id);
		return -1;
	}
	return fence_v2(job_id, task_id, pid, fpath);
}

#else
/* ------------------------------------------------------------------------ test program */
/*
 *   fence_test v2 JOB TASK PID [stepd=SPID] [state_dir=D] [gpu_majors=M,...]
 *                    fence PID as task_post_fork; SPID stands in for slurmstepd (whose own
 *                    cgroup names a SLUID job directory as this job's)
 *   fence_test v1 JOB TASK CGDIR PROG [ARG...] [-- state_dir=D ...]
 *                    enter v1 devices cgroup CGDIR, fence as task_init_privileged, exec PROG
 *   fence_test attach CGDIR none|override|multi RULE...   attach a plain deny program, as
 *                    Slurm's ebpf.c does (a stand-in for Slurm's job/step/task programs)
 *   fence_test query CGDIR       own flags, own program ids, effective program ids
 *   fence_test load LICENSE|-    load a one-rule program (license "-": none); print errno
 *   fence_test dispatch PID      which fence the plugin gives PID: v1 or v2
 */
static int enter_cgroup(const char *dir)
{
	char procs[1200], pid[32];
	snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
	int fd = open(procs, O_WRONLY | O_CLOEXEC);
	int n = snprintf(pid, sizeof(pid), "%d", (int)getpid());
	int ok = fd >= 0 && write(fd, pid, (size_t)n) == n;
	if (fd >= 0)
		close(fd);
	return ok ? 0 : -1;
}

static int rules_from_args(int ac, char **av, struct fence_rule *out)
{
	int n = 0;
	for (int i = 0; i < ac; i++)
		if (!valid_rule(av[i]) || fence_parse_rule(av[i], &out[n++]) != 0)
			return -1;
	return n;
}

int main(int ac, char **av)
{
	static struct fence_rule rules[MAX_RULES];
	struct bpf_insn prog[4096];
	char fpath[700];

	if (ac >= 5 && strcmp(av[1], "v2") == 0) {
		if (ac >= 6 && strncmp(av[5], "stepd=", 6) == 0) {
			stepd_pid = (pid_t)atoi(av[5] + 6);
			for (int i = 5; i + 1 < ac; i++)
				av[i] = av[i + 1];
			ac--;
		}
		if (parse_args(ac - 5, av + 5) != 0 ||
		    fence_path(fpath, sizeof(fpath), (uint32_t)atol(av[2])) != 0)
			return 2;
		return fence_v2((uint32_t)atol(av[2]), (uint32_t)atol(av[3]), (pid_t)atoi(av[4]),
				fpath) == 0 ? 0 : 1;
	}
	if (ac >= 6 && strcmp(av[1], "v1") == 0) {
		int sep = ac;
		for (int i = 5; i < ac; i++)
			if (strcmp(av[i], "--") == 0)
				sep = i;
		if (parse_args(ac - sep - (sep < ac), av + sep + 1) != 0 ||
		    fence_path(fpath, sizeof(fpath), (uint32_t)atol(av[2])) != 0)
			return 2;
		if (enter_cgroup(av[4]) != 0) {
			perror("enter v1 cgroup");
			return 2;
		}
		if (fence_v1((uint32_t)atol(av[2]), atoi(av[3]), fpath) != 0)
			return 1;
		av[sep] = NULL;
		execv(av[5], av + 5);
		perror("execv");
		return 2;
	}
	if (ac >= 4 && strcmp(av[1], "attach") == 0) {
		uint32_t flags = strcmp(av[3], "multi") == 0	  ? BPF_F_ALLOW_MULTI
				 : strcmp(av[3], "override") == 0 ? BPF_F_ALLOW_OVERRIDE
								  : 0;
		int n = rules_from_args(ac - 4, av + 4, rules);
		int ni = n > 0 ? fence_build_prog(rules, n, prog, 4096) : -1;
		int fd = ni > 0 ? fence_prog_load(prog, ni, "Apache-2.0") : -1;
		int cg = open(av[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0 || cg < 0 || fence_attach_raw(cg, fd, flags) != 0) {
			printf("attach failed: %s\n", strerror(errno));
			return 1;
		}
		printf("attached %u\n", fence_prog_id(fd));
		return 0;
	}
	if (ac == 3 && strcmp(av[1], "query") == 0) {
		uint32_t own[FENCE_MAX_PROGS], eff[FENCE_MAX_PROGS], flags = 0;
		int cg = open(av[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		int n_own = cg >= 0 ? fence_query(cg, 0, &flags, own, FENCE_MAX_PROGS) : -1;
		int n_eff = cg >= 0 ? fence_query(cg, 1, NULL, eff, FENCE_MAX_PROGS) : -1;
		if (n_own < 0 || n_eff < 0) {
			printf("query failed: %s\n", strerror(errno));
			return 1;
		}
		printf("flags %u\nown", flags);
		for (int i = 0; i < n_own; i++)
			printf(" %u", own[i]);
		printf("\neffective");
		for (int i = 0; i < n_eff; i++)
			printf(" %u", eff[i]);
		printf("\n");
		return 0;
	}
	if (ac == 3 && strcmp(av[1], "dispatch") == 0) {
		printf("%s\n", has_v1_devices((pid_t)atoi(av[2])) ? "v1" : "v2");
		return 0;
	}
	if (ac == 3 && strcmp(av[1], "load") == 0) {
		struct fence_rule r = {BPF_DEVCG_DEV_CHAR, 195, 0};
		int ni = fence_build_prog(&r, 1, prog, 4096);
		int fd = fence_prog_load(prog, ni, strcmp(av[2], "-") == 0 ? NULL : av[2]);
		printf("%s %d insns\n", fd >= 0 ? "loaded" : strerror(errno), ni);
		return fd >= 0 ? 0 : 1;
	}
	fprintf(stderr, "usage: see the comment above main() in slurmiso_fence.c\n");
	return 2;
}
#endif
