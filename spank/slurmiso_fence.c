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
 * in substance) are applied where a v1 devices cgroup can take them. This plugin runs in
 * slurmstepd as root for every task (slurm_spank_task_init_privileged), after Slurm has put the
 * task into its step's device cgroup, and writes each rule into that cgroup's devices.deny, so
 * the task and everything it starts can never open those devices again (a cgroup only narrows).
 *
 * Fail closed: a job with no fence file is a job slurmiso never isolated, and gets every NVIDIA
 * device denied; a fence that cannot be applied (no v1 devices controller, a cgroup that is not
 * this job's, an unreadable or untrusted file) makes the task fail with the reason in the job's
 * stderr and slurmd's log. Nothing here reads a value the job's user controls.
 *
 * plugstack.conf:
 *   required /usr/lib/slurm/slurmiso_fence.so state_dir=/run/slurmiso [gpu_majors=195,...]
 * state_dir may contain %n (node name, for several slurmd on one host); gpu_majors are the
 * character majors denied for a job without a fence, beside every "nvidia*" major in
 * /proc/devices.
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

#include <slurm/spank.h>

SPANK_PLUGIN(slurmiso_fence, 1);

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

/* No fence: deny every NVIDIA character major (from /proc/devices and gpu_majors). */
static int deny_all_gpus(int fd)
{
	char line[256], rule[64];
	FILE *fh = fopen("/proc/devices", "r");
	int in_char = 0, rc = 0;

	for (int i = 0; i < n_extra_majors; i++) {
		snprintf(rule, sizeof(rule), "c %d:*", extra_majors[i]);
		rc |= deny(fd, rule);
	}
	if (!fh)
		return rc;
	while (fgets(line, sizeof(line), fh)) {
		int major;
		char name[128];
		if (strncmp(line, "Character devices:", 18) == 0) {
			in_char = 1;
			continue;
		}
		if (strncmp(line, "Block devices:", 14) == 0)
			in_char = 0;
		if (in_char && sscanf(line, "%d %127s", &major, name) == 2 &&
		    strncmp(name, "nvidia", 6) == 0) {
			snprintf(rule, sizeof(rule), "c %d:*", major);
			rc |= deny(fd, rule);
		}
	}
	fclose(fh);
	return rc;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	(void)sp;
	return parse_args(ac, av) == 0 ? ESPANK_SUCCESS : ESPANK_BAD_ARG;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0;
	int task_id = 0;
	char fpath[700], cgpath[1200], line[MAX_LINE + 2];
	struct stat st;
	int rules = 0, rc = 0;

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
	if (spank_get_item(sp, S_TASK_ID, &task_id) != ESPANK_SUCCESS)
		task_id = 0;
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
			    "the task does not start (set ConstrainDevices=yes and "
			    "CgroupPlugin=cgroup/v1, see slurmiso's docs/security.md)",
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
