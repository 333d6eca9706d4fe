/*
 * slurmiso option validation, header-only and free of Slurm headers so a test can compile it
 * alone (tests/unit/test_option_validator.py runs the same hostile list through this, the
 * generated job_submit.lua and the Prolog's slurmiso/submit/options.py).
 *
 * Every check works on (bytes, length): a value with a NUL inside is refused, never cut short.
 * The limits come from slurmiso_limits.h, generated from the Python definition.
 */
#ifndef SLURMISO_VALIDATE_H
#define SLURMISO_VALIDATE_H

#include <stddef.h>
#include <string.h>

#include "slurmiso_limits.h"

enum { SLURMISO_OPT_CLASS, SLURMISO_OPT_MPS_MEM, SLURMISO_OPT_MIG_PROFILE,
       SLURMISO_OPT_CKPT_DIR, SLURMISO_OPT_METRICS, SLURMISO_OPT_COUNT };

/* Whether byte c is one of the characters of set (the NUL byte never is). */
static inline int slurmiso_in_set(char c, const char *set)
{
	return c != '\0' && strchr(set, c) != NULL;
}

static inline int slurmiso_is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Whether word (n bytes) is one of the comma-separated entries of list. */
static inline int slurmiso_in_list(const char *list, const char *word, size_t n)
{
	const char *p = list;

	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len == n && strncmp(p, word, n) == 0)
			return 1;
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}

/* MiB of a size, rounded up, into *mib; 0 if the form is wrong. Integer arithmetic only. */
static inline int slurmiso_size_mib(const char *s, size_t n, unsigned long long *mib)
{
	static const unsigned long long kib[] = SLURMISO_SIZE_UNITS_KIB;
	unsigned long long whole = 0, frac = 0, unit = kib[1];
	size_t i = 0, digits, fdigits = 0;
	const char *u;

	if (n == 0 || n > SLURMISO_SIZE_MAX_LEN)
		return 0;
	while (i < n && slurmiso_is_digit(s[i]))
		whole = whole * 10 + (unsigned long long)(s[i++] - '0');
	digits = i;
	if (digits == 0 || digits > SLURMISO_SIZE_MAX_INT_DIGITS)
		return 0;
	if (i < n && s[i] == '.') {
		i++;
		while (i < n && slurmiso_is_digit(s[i])) {
			if (++fdigits > SLURMISO_SIZE_MAX_FRAC_DIGITS)
				return 0;
			frac = frac * 10 + (unsigned long long)(s[i++] - '0');
		}
		if (fdigits == 0)
			return 0;
		while (fdigits++ < 3)
			frac *= 10;
	}
	if (i < n && s[i] != '\0' && (u = strchr(SLURMISO_SIZE_UNITS, s[i])) != NULL) {
		unit = kib[u - SLURMISO_SIZE_UNITS];
		i++;
	}
	if (!(i == n || (n - i == 1 && s[i] == 'B') ||
	      (n - i == 2 && s[i] == 'i' && s[i + 1] == 'B')))
		return 0;
	*mib = ((whole * 1000 + frac) * unit + 1000 * 1024 - 1) / (1000 * 1024);
	return 1;
}

static inline int slurmiso_valid_class(const char *s, size_t n, const char *allowed)
{
	size_t i;

	if (n == 0 || n > SLURMISO_CLASS_MAX_LEN || !slurmiso_in_set(s[0], SLURMISO_CLASS_FIRST))
		return 0;
	for (i = 0; i < n; i++)
		if (!slurmiso_in_set(s[i], SLURMISO_CLASS_CHARS))
			return 0;
	return !allowed || !allowed[0] || slurmiso_in_list(allowed, s, n);
}

static inline int slurmiso_valid_profile(const char *s, size_t n, const char *allowed)
{
	size_t i = 3;

	if (n < 6 || n > SLURMISO_PROFILE_MAX_LEN || s[0] < '1' || s[0] > '7' || s[1] != 'g' ||
	    s[2] != '.')
		return 0;
	while (i < n && slurmiso_is_digit(s[i]))
		i++;
	if (i == 3 || i - 3 > SLURMISO_PROFILE_MAX_MEM_DIGITS)
		return 0;
	if (!((n - i == 2 && memcmp(s + i, "gb", 2) == 0) ||
	      (n - i == 5 && memcmp(s + i, "gb+me", 5) == 0)))
		return 0;
	return !allowed || !allowed[0] || slurmiso_in_list(allowed, s, n);
}

static inline int slurmiso_valid_dir(const char *s, size_t n)
{
	size_t i;

	if (n == 0 || n > SLURMISO_DIR_MAX_LEN || s[0] != '/')
		return 0;
	for (i = 0; i < n; i++) {
		if (!slurmiso_in_set(s[i], SLURMISO_DIR_CHARS))
			return 0;
		/* a ".." component: preceded by '/', followed by '/' or the end */
		if (s[i] == '/' && i + 2 < n && s[i + 1] == '.' && s[i + 2] == '.' &&
		    (i + 3 == n || s[i + 3] == '/'))
			return 0;
	}
	return 1;
}

/* PORT[/PATH]: a port of 4-5 digits without a leading zero in range, then nothing or a path
 * of '/' and up to SLURMISO_METRICS_PATH_MAX_LEN - 1 more allowed characters. */
static inline int slurmiso_valid_metrics(const char *s, size_t n)
{
	size_t i = 0, j;
	unsigned long port = 0;

	while (i < n && slurmiso_is_digit(s[i]))
		port = port * 10 + (unsigned long)(s[i++] - '0');
	if (i < 4 || i > 5 || s[0] == '0' || port < SLURMISO_METRICS_PORT_MIN ||
	    port > SLURMISO_METRICS_PORT_MAX)
		return 0;
	if (i == n)
		return 1;
	if (s[i] != '/' || n - i > SLURMISO_METRICS_PATH_MAX_LEN)
		return 0;
	for (j = i; j < n; j++)
		if (!slurmiso_in_set(s[j], SLURMISO_METRICS_PATH_CHARS))
			return 0;
	return 1;
}

/* 1 if option opt may take value v (n bytes), else 0. allowed_* may be NULL or "". */
static inline int slurmiso_option_ok(int opt, const char *v, size_t n,
				     const char *allowed_classes, const char *allowed_profiles)
{
	unsigned long long mib;

	switch (opt) {
	case SLURMISO_OPT_CLASS:
		return slurmiso_valid_class(v, n, allowed_classes);
	case SLURMISO_OPT_MPS_MEM:
		return slurmiso_size_mib(v, n, &mib) && mib >= SLURMISO_SIZE_MIN_MIB &&
		       mib <= SLURMISO_SIZE_MAX_MIB;
	case SLURMISO_OPT_MIG_PROFILE:
		return slurmiso_valid_profile(v, n, allowed_profiles);
	case SLURMISO_OPT_CKPT_DIR:
		return slurmiso_valid_dir(v, n);
	case SLURMISO_OPT_METRICS:
		return slurmiso_valid_metrics(v, n);
	}
	return 0;
}

#endif
