/*
 * slurmiso_bpf.h: the cgroup v2 half of slurmiso_fence.c: a BPF_PROG_TYPE_CGROUP_DEVICE
 * program built by hand from the fence's rules, and its attachment to a task's cgroup so
 * that it runs *together with* Slurm's own device program.
 *
 * The program: for a device access (struct bpf_cgroup_dev_ctx) it returns 0 (deny, the open
 * fails with EPERM) when (type, major, minor) matches a rule, 1 otherwise. Rules are grouped
 * by (type, major); a group's minors become ranges, so "every cap of the node but two" is a
 * handful of instructions. No helper is called, so the program needs no GPL license.
 *
 * Composition (kernel/bpf/cgroup.c): a cgroup's effective device programs are its own, then
 * those of its ancestors *attached with BPF_F_ALLOW_MULTI*; an ancestor's program attached
 * with BPF_F_ALLOW_OVERRIDE or with no flag yields to any program below it. Slurm's
 * cgroup/v2 plugin (ebpf.c, load_ebpf_prog) attaches its job and step programs with
 * BPF_F_ALLOW_OVERRIDE and its per-task program (task_<id>, for GRES binding) with no flag.
 * So a program of ours attached under Slurm's, even with BPF_F_ALLOW_MULTI, would silently
 * *replace* Slurm's device constraint for the task; and one attached with MULTI beside
 * Slurm's task program is refused (EPERM). fence_attach() therefore re-attaches, with
 * BPF_F_ALLOW_MULTI, every program that is effective on the task's cgroup (the very program
 * objects, by id), then its own, and checks the result: the task runs Slurm's programs and
 * ours, and the kernel denies when any of them denies. Where the cgroup holds Slurm's task
 * program (no flag), that program is first detached (a MULTI list cannot join a single one):
 * only done while the cgroup holds nothing but the task, which has not exec'd yet.
 */
#ifndef SLURMISO_BPF_H
#define SLURMISO_BPF_H

#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FENCE_MAX_PROGS 64 /* effective programs on one cgroup we are ready to re-attach */

struct fence_rule {
	uint32_t type;  /* BPF_DEVCG_DEV_CHAR or BPF_DEVCG_DEV_BLOCK */
	uint32_t major;
	int64_t minor;  /* -1: every minor */
};

/* "c 195:3", "b 8:*" (already checked by valid_rule) -> rule; majors < 4096, minors < 2^20. */
static int fence_parse_rule(const char *r, struct fence_rule *out)
{
	char *end;
	unsigned long major = strtoul(r + 2, &end, 10);

	if (*end != ':' || major > 4095)
		return -1;
	out->type = (r[0] == 'b') ? BPF_DEVCG_DEV_BLOCK : BPF_DEVCG_DEV_CHAR;
	out->major = (uint32_t)major;
	if (end[1] == '*') {
		out->minor = -1;
		return 0;
	}
	unsigned long minor = strtoul(end + 1, &end, 10);
	if (*end != '\0' || minor > 0xFFFFF)
		return -1;
	out->minor = (int64_t)minor;
	return 0;
}

static int fence_rule_cmp(const void *a, const void *b)
{
	const struct fence_rule *x = a, *y = b;
	if (x->type != y->type)
		return x->type < y->type ? -1 : 1;
	if (x->major != y->major)
		return x->major < y->major ? -1 : 1;
	return (x->minor > y->minor) - (x->minor < y->minor);
}

static struct bpf_insn fence_insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off,
				  int32_t imm)
{
	struct bpf_insn i;
	memset(&i, 0, sizeof(i));
	i.code = code;
	i.dst_reg = dst;
	i.src_reg = src;
	i.off = off;
	i.imm = imm;
	return i;
}

#define F_LDX_W(dst, off) fence_insn(BPF_LDX | BPF_W | BPF_MEM, dst, BPF_REG_1, off, 0)
#define F_AND32(dst, imm) fence_insn(BPF_ALU | BPF_AND | BPF_K, dst, 0, 0, imm)
#define F_JMP(op, dst, imm, off) fence_insn(BPF_JMP | (op) | BPF_K, dst, 0, off, imm)
#define F_JA(off) fence_insn(BPF_JMP | BPF_JA, 0, 0, off, 0)
#define F_RET(v) fence_insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, v), \
		 fence_insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)

/*
 * The deny program for n rules (sorted and grouped here; rules is reordered), written into
 * out (room for max instructions). Returns the instruction count, -1 when it does not fit.
 *   r2 = ctx->access_type & 0xffff (device type); r4 = ctx->major; r5 = ctx->minor
 *   per (type, major): if (r2 == type && r4 == major && r5 in a range) return 0;
 *   return 1;
 */
static int fence_build_prog(struct fence_rule *rules, int n, struct bpf_insn *out, int max)
{
	int k = 0;

#define EMIT(...)                                                                          \
	do {                                                                               \
		struct bpf_insn tmp_[] = {__VA_ARGS__};                                    \
		if (k + (int)(sizeof(tmp_) / sizeof(tmp_[0])) > max)                       \
			return -1;                                                         \
		memcpy(out + k, tmp_, sizeof(tmp_));                                       \
		k += (int)(sizeof(tmp_) / sizeof(tmp_[0]));                                \
	} while (0)

	qsort(rules, (size_t)n, sizeof(*rules), fence_rule_cmp);
	EMIT(F_LDX_W(BPF_REG_2, 0), F_AND32(BPF_REG_2, 0xFFFF), F_LDX_W(BPF_REG_4, 4),
	     F_LDX_W(BPF_REG_5, 8));
	for (int g = 0; g < n;) {
		int e = g, wild = 0, r = 0;
		while (e < n && rules[e].type == rules[g].type && rules[e].major == rules[g].major) {
			wild |= rules[e].minor < 0;
			e++;
		}
		if (wild) {
			EMIT(F_JMP(BPF_JNE, BPF_REG_2, (int32_t)rules[g].type, 3),
			     F_JMP(BPF_JNE, BPF_REG_4, (int32_t)rules[g].major, 2), F_RET(0));
			g = e;
			continue;
		}
		/* count the range instructions first: one for a single minor, two for a range */
		for (int i = g; i < e;) {
			int j = i;
			while (j + 1 < e && rules[j + 1].minor <= rules[j].minor + 1)
				j++;
			r += (rules[j].minor == rules[i].minor) ? 1 : 2;
			i = j + 1;
		}
		if (1 + r + 3 > 32767)
			return -1;
		EMIT(F_JMP(BPF_JNE, BPF_REG_2, (int32_t)rules[g].type, (int16_t)(1 + r + 3)),
		     F_JMP(BPF_JNE, BPF_REG_4, (int32_t)rules[g].major, (int16_t)(r + 3)));
		int deny_at = k + r + 1; /* index of "r0 = 0" below */
		for (int i = g; i < e;) {
			int j = i;
			while (j + 1 < e && rules[j + 1].minor <= rules[j].minor + 1)
				j++;
			if (rules[j].minor == rules[i].minor) {
				EMIT(F_JMP(BPF_JEQ, BPF_REG_5, (int32_t)rules[i].minor,
					   (int16_t)(deny_at - k - 1)));
			} else {
				EMIT(F_JMP(BPF_JLT, BPF_REG_5, (int32_t)rules[i].minor, 1));
				EMIT(F_JMP(BPF_JLE, BPF_REG_5, (int32_t)rules[j].minor,
					   (int16_t)(deny_at - k - 1)));
			}
			i = j + 1;
		}
		EMIT(F_JA(2), F_RET(0));
		g = e;
	}
	EMIT(F_RET(1));
#undef EMIT
	return k;
}

static long fence_bpf(int cmd, union bpf_attr *attr)
{
	return syscall(__NR_bpf, cmd, attr, sizeof(*attr));
}

/* Load the program; returns its fd, or -1 with errno. license may be NULL (no string). */
static int fence_prog_load(const struct bpf_insn *insns, int n, const char *license)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
	a.insns = (uint64_t)(uintptr_t)insns;
	a.insn_cnt = (uint32_t)n;
	a.license = (uint64_t)(uintptr_t)license;
	snprintf(a.prog_name, sizeof(a.prog_name), "slurmiso_fence");
	return (int)fence_bpf(BPF_PROG_LOAD, &a);
}

/* Program ids on a cgroup (own, or effective); *flags gets the cgroup's own attach flags. */
static int fence_query(int cgfd, int effective, uint32_t *flags, uint32_t *ids, int max)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.query.target_fd = (uint32_t)cgfd;
	a.query.attach_type = BPF_CGROUP_DEVICE;
	a.query.query_flags = effective ? BPF_F_QUERY_EFFECTIVE : 0;
	a.query.prog_ids = (uint64_t)(uintptr_t)ids;
	a.query.prog_cnt = (uint32_t)max;
	if (fence_bpf(BPF_PROG_QUERY, &a) != 0)
		return -1;
	if (flags)
		*flags = a.query.attach_flags;
	return (int)a.query.prog_cnt;
}

static int fence_prog_fd(uint32_t id)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.prog_id = id;
	return (int)fence_bpf(BPF_PROG_GET_FD_BY_ID, &a);
}

static uint32_t fence_prog_id(int fd)
{
	struct bpf_prog_info info;
	union bpf_attr a;
	memset(&info, 0, sizeof(info));
	memset(&a, 0, sizeof(a));
	a.info.bpf_fd = (uint32_t)fd;
	a.info.info_len = sizeof(info);
	a.info.info = (uint64_t)(uintptr_t)&info;
	return fence_bpf(BPF_OBJ_GET_INFO_BY_FD, &a) == 0 ? info.id : 0;
}

static int fence_attach_raw(int cgfd, int progfd, uint32_t flags)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.target_fd = (uint32_t)cgfd;
	a.attach_bpf_fd = (uint32_t)progfd;
	a.attach_type = BPF_CGROUP_DEVICE;
	a.attach_flags = flags;
	return (int)fence_bpf(BPF_PROG_ATTACH, &a);
}

static int fence_detach_raw(int cgfd, int progfd)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.target_fd = (uint32_t)cgfd;
	a.attach_bpf_fd = (uint32_t)progfd;
	a.attach_type = BPF_CGROUP_DEVICE;
	return (int)fence_bpf(BPF_PROG_DETACH, &a);
}

static int fence_has_id(const uint32_t *ids, int n, uint32_t id)
{
	for (int i = 0; i < n; i++)
		if (ids[i] == id)
			return 1;
	return 0;
}

/* Does cgroup.procs of cgdir list exactly one process, pid? */
static int fence_only_pid(const char *cgdir, pid_t pid)
{
	char path[1500], line[64];
	int count = 0, found = 0;
	snprintf(path, sizeof(path), "%s/cgroup.procs", cgdir);
	FILE *fh = fopen(path, "re");
	if (!fh)
		return 0;
	while (fgets(line, sizeof(line), fh)) {
		count++;
		found |= atoi(line) == (int)pid;
	}
	fclose(fh);
	return count == 1 && found;
}

/*
 * Attach progfd to cgdir so that it runs with every program already effective there (see
 * the top of this file). pid is the task's only process (needed when Slurm's task program
 * must be detached and re-attached). On failure returns -1 with a reason in err; the cgroup
 * may then have lost a program, and the caller must not let the task run.
 */
static int fence_attach(const char *cgdir, int progfd, pid_t pid, char *err, size_t errlen)
{
	uint32_t own[FENCE_MAX_PROGS], eff[FENCE_MAX_PROGS], after[FENCE_MAX_PROGS];
	uint32_t own_flags = 0, ours = fence_prog_id(progfd);
	int fds[FENCE_MAX_PROGS];
	int rc = -1, n_own, n_eff = 0, n_after;
	int cgfd = open(cgdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (cgfd < 0) {
		snprintf(err, errlen, "cannot open %s: %s", cgdir, strerror(errno));
		return -1;
	}
	n_own = fence_query(cgfd, 0, &own_flags, own, FENCE_MAX_PROGS);
	if (n_own >= 0)
		n_eff = fence_query(cgfd, 1, NULL, eff, FENCE_MAX_PROGS);
	if (n_own < 0 || n_eff < 0 || !ours) {
		snprintf(err, errlen, "cannot query the device programs of %s: %s", cgdir,
			 strerror(errno));
		n_eff = 0;
		goto out;
	}
	/* hold every effective program before anything is detached (a detached program that
	 * nothing else holds is freed, and could not be attached again) */
	for (int i = 0; i < n_eff; i++)
		fds[i] = -1;
	for (int i = 0; i < n_eff; i++)
		if ((fds[i] = fence_prog_fd(eff[i])) < 0) {
			snprintf(err, errlen, "cannot get device program %u of %s: %s", eff[i],
				 cgdir, strerror(errno));
			goto out;
		}
	if (n_own > 0 && !(own_flags & BPF_F_ALLOW_MULTI)) {
		/* Slurm's task program (no flag): only a MULTI list can hold two programs */
		if (!fence_only_pid(cgdir, pid)) {
			snprintf(err, errlen, "%s holds a device program and other processes than "
				 "the task", cgdir);
			goto out;
		}
		for (int i = 0; i < n_eff; i++)
			if (fence_has_id(own, n_own, eff[i]) && fence_detach_raw(cgfd, fds[i]) != 0) {
				snprintf(err, errlen, "cannot detach program %u from %s: %s",
					 eff[i], cgdir, strerror(errno));
				goto out;
			}
		n_own = 0;
	}
	for (int i = 0; i < n_eff; i++) {
		if (n_own > 0 && fence_has_id(own, n_own, eff[i]))
			continue; /* already a MULTI program of this cgroup */
		if (fence_attach_raw(cgfd, fds[i], BPF_F_ALLOW_MULTI) != 0) {
			snprintf(err, errlen, "cannot re-attach device program %u to %s: %s", eff[i],
				 cgdir, strerror(errno));
			goto out;
		}
	}
	if (fence_attach_raw(cgfd, progfd, BPF_F_ALLOW_MULTI) != 0) {
		snprintf(err, errlen, "cannot attach the fence to %s: %s", cgdir, strerror(errno));
		goto out;
	}
	n_after = fence_query(cgfd, 1, NULL, after, FENCE_MAX_PROGS);
	if (n_after < 0 || !fence_has_id(after, n_after, ours)) {
		snprintf(err, errlen, "the fence is not effective on %s after attaching it", cgdir);
		goto out;
	}
	for (int i = 0; i < n_eff; i++)
		if (!fence_has_id(after, n_after, eff[i])) {
			snprintf(err, errlen, "device program %u is no longer effective on %s",
				 eff[i], cgdir);
			goto out;
		}
	rc = 0;
out:
	for (int i = 0; i < n_eff; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	close(cgfd);
	return rc;
}

#endif
