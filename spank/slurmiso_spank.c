/*
 * slurmiso SPANK plugin: the job options --iso-class, --iso-mps-mem, --iso-mig-profile,
 * --iso-ckpt-dir and --iso-metrics, checked where the user types them (sbatch/salloc/srun
 * refuse a bad value with a message) and handed to the Prolog/Epilog through the job control
 * environment as SPANK_SLURMISO_CLASS, SPANK_SLURMISO_MPS_MEM, SPANK_SLURMISO_MIG_PROFILE,
 * SPANK_SLURMISO_CKPT_DIR and SPANK_SLURMISO_METRICS (slurmiso/slurm/jobenv.py reads them
 * and checks them again: a
 * client-side plugin is a convenience, never a security boundary).
 *
 * The checks are slurmiso_validate.h, with limits generated from slurmiso/submit/options.py
 * (slurmiso_limits.h): job_submit.lua and the Prolog apply the same rules, and a unit test runs
 * one hostile list through all three.
 *
 * plugstack.conf (arguments are optional allow-lists; `slurmiso gen plugstack` writes it):
 *   required /usr/lib/slurm/slurmiso.so classes=infer,train,debug mig_profiles=3g.40gb,4g.40gb
 *
 * No heap: the arguments and values live in fixed static buffers, so nothing can leak in the
 * long-lived slurmd/slurmstepd processes that load the plugin too.
 */
#include <stdio.h>
#include <string.h>

#include <slurm/spank.h>

#include "slurmiso_validate.h"

SPANK_PLUGIN(slurmiso, 1);

#define LIST_MAX 1024  /* a comma-separated allow-list from plugstack.conf */
#define VALUE_MAX (SLURMISO_DIR_MAX_LEN + 1) /* the longest value: a checkpoint directory */

enum { OPT_CLASS = SLURMISO_OPT_CLASS, OPT_MPS_MEM = SLURMISO_OPT_MPS_MEM,
       OPT_MIG_PROFILE = SLURMISO_OPT_MIG_PROFILE, OPT_CKPT_DIR = SLURMISO_OPT_CKPT_DIR,
       OPT_METRICS = SLURMISO_OPT_METRICS, OPT_COUNT = SLURMISO_OPT_COUNT };

/* Exported names: spank_job_control_setenv prefixes SPANK_, jobenv.py maps them back. */
static const char *const env_names[OPT_COUNT] = {
	"SLURMISO_CLASS", "SLURMISO_MPS_MEM", "SLURMISO_MIG_PROFILE", "SLURMISO_CKPT_DIR",
	"SLURMISO_METRICS",
};

static char allowed_classes[LIST_MAX];
static char allowed_profiles[LIST_MAX];
static char values[OPT_COUNT][VALUE_MAX];

static int check_option(int val, const char *optarg, int remote);

/* The value for a message: as typed if it is short printable ASCII, else a placeholder (a
 * hostile value may hold terminal escapes or be megabytes long). */
static const char *shown(const char *v, size_t n)
{
	size_t i;

	if (n > 64)
		return "<value not shown: too long>";
	for (i = 0; i < n; i++)
		if (v[i] < ' ' || v[i] > '~')
			return "<value not shown: control or non-ASCII bytes>";
	return v;
}

/* Why v (n bytes) was refused for option val, in the words job_submit.lua and the Prolog use. */
static void refuse(int val, const char *v, size_t n)
{
	const char *show = shown(v, n);

	switch (val) {
	case OPT_CLASS:
		slurm_error("slurmiso: --iso-class=%s is not a job class of this cluster "
			    "(allowed: %s)", show,
			    allowed_classes[0] ? allowed_classes
					       : "a letter, then letters, digits, _ or -");
		break;
	case OPT_MPS_MEM:
		slurm_error("slurmiso: --iso-mps-mem=%s is not a size (allowed: 1M to 1T as a "
			    "number with an optional K, M, G or T suffix, e.g. 8G, 8GiB, 512M)", show);
		break;
	case OPT_MIG_PROFILE:
		if (!slurmiso_valid_profile(v, n, NULL))
			slurm_error("slurmiso: --iso-mig-profile=%s is not a MIG profile name "
				    "(allowed: <1-7>g.<memory>gb[+me], e.g. 3g.40gb)", show);
		else
			slurm_error("slurmiso: --iso-mig-profile=%s is not a MIG profile of this "
				    "cluster's GPUs (allowed: %s)", show, allowed_profiles);
		break;
	case OPT_METRICS:
		slurm_error("slurmiso: --iso-metrics=%s is not PORT[/PATH] (allowed: a port of "
			    "%d to %d, then optionally a path of '/' and up to %d letters, digits, "
			    "/ _ . -; e.g. 8000 or 8000/metrics)", show, SLURMISO_METRICS_PORT_MIN,
			    SLURMISO_METRICS_PORT_MAX, SLURMISO_METRICS_PATH_MAX_LEN - 1);
		break;
	default:
		slurm_error("slurmiso: --iso-ckpt-dir=%s must be an absolute directory without "
			    "'..' components, of letters, digits and / . _ - + @ %% , = (e.g. "
			    "/scratch/$USER/ckpt)", show);
	}
}

static struct spank_option options[] = {
	{ "iso-class", "NAME",
	  "slurmiso job class (what the cluster allows; see `slurmiso --help`)",
	  1, OPT_CLASS, check_option },
	{ "iso-mps-mem", "SIZE",
	  "slurmiso: lower the MPS pinned GPU memory limit, e.g. 8G",
	  1, OPT_MPS_MEM, check_option },
	{ "iso-mig-profile", "PROFILE",
	  "slurmiso: MIG profile for mig-dynamic GPUs, e.g. 3g.40gb",
	  1, OPT_MIG_PROFILE, check_option },
	{ "iso-ckpt-dir", "DIR",
	  "slurmiso: absolute directory for the job's checkpoints",
	  1, OPT_CKPT_DIR, check_option },
	{ "iso-metrics", "PORT[/PATH]",
	  "slurmiso: the job's Prometheus endpoint on 127.0.0.1 (latency for the monitor)",
	  1, OPT_METRICS, check_option },
};

static int check_option(int val, const char *optarg, int remote)
{
	const char *name;
	size_t n;

	(void)remote;
	if (val < 0 || val >= OPT_COUNT)
		return -1;
	name = options[val].name;
	if (!optarg || !*optarg) {
		slurm_error("slurmiso: --%s needs a value", name);
		return -1;
	}
	n = strlen(optarg);
	if (n >= VALUE_MAX ||
	    !slurmiso_option_ok(val, optarg, n, allowed_classes, allowed_profiles)) {
		refuse(val, optarg, n);
		return -1;
	}
	memcpy(values[val], optarg, n + 1);
	return 0;
}

static int copy_arg(char *dst, const char *arg, const char *key)
{
	size_t klen = strlen(key);

	if (strncmp(arg, key, klen) != 0)
		return 0;
	if (strlen(arg + klen) >= LIST_MAX) {
		slurm_error("slurmiso: plugstack.conf argument %s is longer than %d characters",
			    key, LIST_MAX - 1);
		return -1;
	}
	strcpy(dst, arg + klen);
	return 1;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		int rc = copy_arg(allowed_classes, av[i], "classes=");

		if (rc == 0)
			rc = copy_arg(allowed_profiles, av[i], "mig_profiles=");
		if (rc < 0)
			return -1;
		if (rc == 0)
			slurm_error("slurmiso: unknown plugstack.conf argument '%s' (allowed: "
				    "classes=A,B,... mig_profiles=P,Q,...)", av[i]);
	}
	/* Registered in every context: sbatch (allocator) needs it, and so do srun and
	 * slurmstepd, which pass the options on. */
	for (i = 0; i < OPT_COUNT; i++) {
		spank_err_t rc = spank_option_register(sp, &options[i]);

		if (rc != ESPANK_SUCCESS) {
			slurm_error("slurmiso: cannot register --%s: %s", options[i].name,
				    spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

/* After option parsing, where the job is created (sbatch, salloc, srun without a job):
 * export the validated values for the Prolog and Epilog. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	int i;

	(void)ac;
	(void)av;
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR)
		return 0;
	for (i = 0; i < OPT_COUNT; i++) {
		spank_err_t rc;

		if (!values[i][0])
			continue;
		rc = spank_job_control_setenv(sp, env_names[i], values[i], 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("slurmiso: cannot pass --%s to the job: %s", options[i].name,
				    spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}
